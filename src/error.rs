//! Errors a client can see: every one carries a SQLSTATE and becomes a PostgreSQL
//! ErrorResponse. Owns the SQLSTATE table; knows nothing of sockets or sessions.

use bytes::BytesMut;
use std::borrow::Cow;
use std::fmt;

/// A five-character SQLSTATE code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SqlState(pub &'static str);

macro_rules! sqlstates {
    ($($(#[$doc:meta])* $name:ident = $code:literal;)*) => {
        impl SqlState {
            $($(#[$doc])* pub const $name: SqlState = SqlState($code);)*
        }
    };
}

sqlstates! {
    /// 08P01: the frontend/backend protocol was broken.
    PROTOCOL_VIOLATION = "08P01";
    /// 08006: a server connection failed.
    CONNECTION_FAILURE = "08006";
    /// XX000: internal error (what parsnip kept of a client's state does not add up).
    INTERNAL_ERROR = "XX000";
    /// 53200: out of memory (the pooler's budget for buffered messages is spent).
    OUT_OF_MEMORY = "53200";
    /// 53400: configuration limit exceeded (a listener's notification queue is full).
    CONFIGURATION_LIMIT_EXCEEDED = "53400";
    /// 25P02: in failed SQL transaction (commands ignored until its end).
    IN_FAILED_SQL_TRANSACTION = "25P02";
    /// 53300: too many client connections.
    TOO_MANY_CONNECTIONS = "53300";
    /// 57P03: the pooler cannot accept connections now (shutting down).
    CANNOT_CONNECT_NOW = "57P03";
    /// 57P01: administrator shutdown.
    ADMIN_SHUTDOWN = "57P01";
    /// 57014: query canceled (also used for the pool wait timeout).
    QUERY_CANCELED = "57014";
    /// 28P01: wrong password.
    INVALID_PASSWORD = "28P01";
    /// 28000: authentication could not be carried out.
    INVALID_AUTHORIZATION_SPECIFICATION = "28000";
    /// 3D000: unknown database.
    UNDEFINED_DATABASE = "3D000";
    /// 0A000: feature not supported.
    FEATURE_NOT_SUPPORTED = "0A000";
    /// 26000: unknown prepared statement.
    UNDEFINED_PSTATEMENT = "26000";
    /// 42P05: prepared statement already exists.
    DUPLICATE_PSTATEMENT = "42P05";
    /// 25P03: idle-in-transaction timeout.
    IDLE_IN_TRANSACTION_SESSION_TIMEOUT = "25P03";
    /// 25P04: transaction timeout (PostgreSQL 17's `transaction_timeout`).
    TRANSACTION_TIMEOUT = "25P04";
    /// 57P05: idle session timeout.
    IDLE_SESSION_TIMEOUT = "57P05";
    /// 54000: program limit exceeded (message too large, cache caps).
    PROGRAM_LIMIT_EXCEEDED = "54000";
    /// 42601: syntax error.
    SYNTAX_ERROR = "42601";
    /// 42501: insufficient privilege (a stats user running an admin command).
    INSUFFICIENT_PRIVILEGE = "42501";
    /// 55000: object not in prerequisite state (a DISABLEd database).
    OBJECT_NOT_IN_PREREQUISITE_STATE = "55000";
    /// F0000: configuration file error (RELOAD).
    CONFIG_FILE_ERROR = "F0000";
    /// 22023: invalid parameter value (the console's SET).
    INVALID_PARAMETER_VALUE = "22023";
    /// 55P02: a setting that cannot change at run time (the console's SET).
    CANT_CHANGE_RUNTIME_PARAM = "55P02";
    /// 42704: undefined object (an unknown database, client or setting on the console).
    UNDEFINED_OBJECT = "42704";
}

/// ErrorResponse severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Severity {
    /// The statement failed; the session goes on.
    Error,
    /// The session ends after this message.
    Fatal,
}

/// An error as a client will see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// ERROR or FATAL.
    pub(crate) severity: Severity,
    /// SQLSTATE.
    pub(crate) code: SqlState,
    /// Primary message, worded as PostgreSQL words it where PostgreSQL has the case.
    pub(crate) message: Cow<'static, str>,
    /// The routine field (`R`), for errors drivers recognize by it (0A000's
    /// RevalidateCachedQuery).
    pub(crate) routine: Option<&'static str>,
    /// The detail field (`D`), where PostgreSQL gives one.
    pub(crate) detail: Option<Cow<'static, str>>,
}

impl Error {
    /// A FATAL error: the connection is closed after it is sent.
    pub(crate) fn fatal(code: SqlState, message: impl Into<Cow<'static, str>>) -> Error {
        Error { severity: Severity::Fatal, code, message: message.into(), routine: None, detail: None }
    }

    /// A statement-level ERROR.
    pub(crate) fn new(code: SqlState, message: impl Into<Cow<'static, str>>) -> Error {
        Error { severity: Severity::Error, code, message: message.into(), routine: None, detail: None }
    }

    /// 08P01 FATAL.
    pub(crate) fn protocol(message: impl Into<Cow<'static, str>>) -> Error {
        Error::fatal(SqlState::PROTOCOL_VIOLATION, message)
    }

    /// The same error with a detail field.
    pub(crate) fn with_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Error {
        self.detail = Some(detail.into());
        self
    }

    /// Appends this error as an ErrorResponse message.
    pub(crate) fn write_to(&self, buf: &mut BytesMut) {
        let sev = match self.severity {
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
        };
        let Some(detail) = &self.detail else {
            crate::protocol::backend::error_response_routine(buf, sev, self.code.0, &self.message, self.routine);
            return;
        };
        let text = |s: &'_ str| Cow::Owned(s.as_bytes().to_vec());
        let mut fields =
            vec![(b'S', text(sev)), (b'V', text(sev)), (b'C', text(self.code.0)), (b'M', text(&self.message))];
        fields.push((b'D', text(detail)));
        if let Some(r) = self.routine {
            fields.push((b'R', text(r)));
        }
        crate::protocol::backend::error_response_fields(buf, fields);
    }

    /// This error as a standalone ErrorResponse.
    pub(crate) fn to_bytes(&self) -> BytesMut {
        let mut b = BytesMut::with_capacity(64 + self.message.len());
        self.write_to(&mut b);
        b
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code.0)
    }
}

impl std::error::Error for Error {}
