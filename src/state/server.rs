//! What the session keeps about the server connection it is linked to. It lives with the
//! server connection (in the pool between clients), so the next client's session knows
//! which settings and statements that server already has.

use super::settings::Settings;
use crate::stmt::ServerStmts;

/// The transaction status a ReadyForQuery reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TxStatus {
    /// 'I': not in a transaction block.
    #[default]
    Idle,
    /// 'T': in a transaction block.
    InBlock,
    /// 'E': in a failed transaction block (queries are rejected until it ends).
    Failed,
}

impl TxStatus {
    /// The status byte of a ReadyForQuery; anything unknown counts as failed, the
    /// conservative reading (the connection is not reused, no retry is attempted).
    pub(crate) fn from_byte(b: u8) -> TxStatus {
        match b {
            b'I' => TxStatus::Idle,
            b'T' => TxStatus::InBlock,
            _ => TxStatus::Failed,
        }
    }

    /// The byte a ReadyForQuery carries for this status.
    pub(crate) fn as_byte(self) -> u8 {
        match self {
            TxStatus::Idle => b'I',
            TxStatus::InBlock => b'T',
            TxStatus::Failed => b'E',
        }
    }
}

/// What the session keeps about the server it is linked to; lives with the server connection.
#[derive(Debug, Default)]
pub struct ServerState {
    /// The settings currently in effect on the server.
    pub(crate) settings: Settings,
    /// Last transaction status the server reported.
    pub(crate) tx_status: TxStatus,
    /// Statements prepared on it.
    pub(crate) stmts: ServerStmts,
    /// A cancel signal may be pending on the backend: a statement of its last user ran
    /// about as long as a statement or lock timeout (`state::timers`), or was cancelled,
    /// or a cancel request was forwarded to it. The next user's session absorbs it with a
    /// statement of its own before anything of the client's runs there.
    pub(crate) cancel_risk: bool,
}
