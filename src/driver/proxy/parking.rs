//! The session of one client, parked while the client is idle (`Session::park`): the
//! client's task then holds only what its session keeps, and the blank session goes back to
//! this thread's free list (`bufpool`) for the next client that becomes active. A client is
//! unparked the first time its session is needed again. The thread's free lists are sized
//! by how many of its clients are unparked (`bufpool::busy`).

use crate::driver::bufpool;
use crate::session::{Parked, Session};

/// A client's session: active (boxed) or parked. Counted in its thread's busy clients
/// while active (`bufpool::busy`), until parked or dropped.
pub(super) struct Sess(State);

/// (One enum, not two options: the word it saves in every idle client's task holds the
/// large-frame state, `inflow`.)
enum State {
    Active(Box<Session>),
    Parked(Parked),
    /// Only while switching between the two.
    Switching,
}

impl Drop for Sess {
    fn drop(&mut self) {
        if matches!(self.0, State::Active(_)) {
            bufpool::busy(false);
        }
    }
}

impl Sess {
    pub(super) fn new(s: Session) -> Sess {
        bufpool::busy(true);
        Sess(State::Active(Box::new(s)))
    }

    /// The session, unparked if it was parked.
    #[inline(always)]
    pub(super) fn get(&mut self) -> &mut Session {
        if !matches!(self.0, State::Active(_)) {
            self.0 = State::Active(unpark(std::mem::replace(&mut self.0, State::Switching)));
            bufpool::busy(true);
        }
        match &mut self.0 {
            State::Active(s) => s,
            _ => unreachable!("set just above"),
        }
    }

    /// Whether the session is pinned to its server connection (`Session::is_pinned`); a
    /// parked one never is.
    #[inline]
    pub(super) fn is_pinned(&self) -> bool {
        matches!(&self.0, State::Active(s) if s.is_pinned())
    }

    /// Writes the session's queued notifications if the client may get them now
    /// (`Session::deliver_notifications`). A parked session has none queued (it is parked
    /// only with nothing to write, and notifications for an idle client go out at once).
    #[inline]
    pub(super) fn deliver_notifications(&mut self) {
        if let State::Active(s) = &mut self.0 {
            s.deliver_notifications();
        }
    }

    /// Parks the session if it is at rest (see `Session::park`); otherwise it stays active.
    pub(super) fn park(&mut self) {
        let State::Active(s) = &mut self.0 else { return };
        let Some(p) = s.park() else { return };
        if let State::Active(s) = std::mem::replace(&mut self.0, State::Parked(p)) {
            bufpool::give_session(s);
            bufpool::busy(false);
        }
    }
}

/// The blank session the client's parked state goes into (kept out of line: `get` runs
/// dozens of times per transaction, this once).
#[inline(never)]
fn unpark(parked: State) -> Box<Session> {
    let State::Parked(p) = parked else {
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
