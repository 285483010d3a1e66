//! Why a client is pinned to its server connection under transaction pooling: the reasons,
//! as bits of one byte, with the names the console and the metrics show. Pure data; the
//! session decides when a reason begins and ends (`session::pins`).

/// A set of pin reasons (bits of `PinReasons::*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PinReasons(pub(crate) u8);

impl PinReasons {
    /// A session advisory lock (`pg_advisory_lock` and its `_shared`/`try` forms).
    pub(crate) const ADVISORY_LOCK: u8 = 1;
    /// A cursor declared `WITH HOLD`.
    pub(crate) const HOLD_CURSOR: u8 = 2;
    /// A temporary table (or other object in the session's temporary schema).
    pub(crate) const TEMP_TABLE: u8 = 4;
    /// A `LISTEN` run on the server (one parsnip does not answer itself).
    pub(crate) const LISTEN: u8 = 8;
    /// A SQL-level `PREPARE` run on the server while the statement cache is off.
    pub(crate) const PREPARED: u8 = 16;
    /// parsnip's own question to the server of what remains failed: pinned until it is
    /// answered.
    pub(crate) const UNVERIFIED: u8 = 32;

    /// Each reason's bit and name, in the order they are shown.
    pub(crate) const NAMES: [(u8, &'static str); 6] = [
        (Self::ADVISORY_LOCK, "advisory_lock"),
        (Self::HOLD_CURSOR, "cursor_with_hold"),
        (Self::TEMP_TABLE, "temp_table"),
        (Self::LISTEN, "listen"),
        (Self::PREPARED, "prepared_statement"),
        (Self::UNVERIFIED, "unverified"),
    ];

    /// No reason.
    #[cfg(test)]
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The reasons' names, comma-separated ("" for none).
    pub(crate) fn names(self) -> String {
        let mut out = String::new();
        for (bit, name) in Self::NAMES {
            if self.0 & bit != 0 {
                if !out.is_empty() {
                    out.push(',');
                }
                out.push_str(name);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::PinReasons;

    #[test]
    fn names_in_order() {
        assert_eq!(PinReasons(0).names(), "");
        assert_eq!(PinReasons(PinReasons::TEMP_TABLE | PinReasons::ADVISORY_LOCK).names(), "advisory_lock,temp_table");
    }
}
