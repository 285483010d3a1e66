//! The session of one client, parked while the client is idle (`Session::park`): the
//! client's task then holds only what its session keeps, and the blank session goes back to
//! this thread's free list (`bufpool`) for the next client that becomes active. A client is
//! unparked the first time its session is needed again.

use crate::driver::bufpool;
use crate::session::{Parked, Session};

/// A client's session: active (boxed) or parked. Exactly one of the two is set.
pub(super) struct Sess {
    active: Option<Box<Session>>,
    parked: Option<Parked>,
}

impl Sess {
    pub(super) fn new(s: Session) -> Sess {
        Sess { active: Some(Box::new(s)), parked: None }
    }

    /// The session, unparked if it was parked.
    #[inline(always)]
    pub(super) fn get(&mut self) -> &mut Session {
        let Sess { active, parked } = self;
        active.get_or_insert_with(|| unpark(parked))
    }

    /// Parks the session if it is at rest (see `Session::park`); otherwise it stays active.
    pub(super) fn park(&mut self) {
        let Some(s) = self.active.as_mut() else { return };
        let Some(p) = s.park() else { return };
        self.parked = Some(p);
        if let Some(s) = self.active.take() {
            bufpool::give_session(s);
        }
    }
}

/// The blank session the client's parked state goes into (kept out of line: `get` runs
/// dozens of times per transaction, this once).
#[inline(never)]
fn unpark(parked: &mut Option<Parked>) -> Box<Session> {
    let Some(p) = parked.take() else {
        // Not reached (one of the two is always set): a session that closes at once.
        tracing::error!("a client's session was lost: closing it");
        let mut s = Session::new(crate::config::PoolMode::Transaction, std::sync::Arc::default(), 0, None);
        s.fail(crate::error::Error::protocol("internal error: session lost"));
        return Box::new(s);
    };
    match bufpool::take_session() {
        Some(mut s) => {
            s.unpark(p);
            s
        }
        None => Box::new(Session::unparked(p)),
    }
}
