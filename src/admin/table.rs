//! One result set as the console sends it: typed columns (PgBouncer's types: text, int4,
//! int8, numeric) and text values, and timestamps written as PgBouncer writes them.

use crate::protocol::backend;
use bytes::BytesMut;

/// A column's type, as PgBouncer declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    /// text
    Text,
    /// int4
    Int4,
    /// int8
    Int8,
    /// numeric (PgBouncer's unsigned 64-bit counters)
    Numeric,
}

impl Ty {
    fn oid_and_len(self) -> (u32, i16) {
        match self {
            Ty::Text => (25, -1),
            Ty::Int4 => (23, 4),
            Ty::Int8 => (20, 8),
            Ty::Numeric => (1700, -1),
        }
    }
}

/// Column names and types, and rows of text values (None: NULL).
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) columns: Vec<(&'static str, Ty)>,
    pub(crate) rows: Vec<Vec<Option<String>>>,
}

impl Table {
    /// An empty table with these columns.
    pub(crate) fn new(columns: &[(&'static str, Ty)]) -> Table {
        Table { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// Adds a row (as many values as columns).
    pub(crate) fn push(&mut self, row: Vec<Option<String>>) {
        debug_assert_eq!(row.len(), self.columns.len(), "{:?}", self.columns);
        self.rows.push(row);
    }

    /// A row of `fill` but for the named `values`.
    pub(crate) fn row_with(&self, fill: Option<String>, values: &[(&str, Option<String>)]) -> Vec<Option<String>> {
        let mut row = vec![fill; self.columns.len()];
        for (name, v) in values {
            match self.columns.iter().position(|(n, _)| n == name) {
                Some(i) => row[i].clone_from(v),
                None => debug_assert!(false, "no column {name}"),
            }
        }
        row
    }

    /// Adds `row_with(fill, values)`.
    pub(crate) fn push_with(&mut self, fill: Option<String>, values: &[(&str, Option<String>)]) {
        let row = self.row_with(fill, values);
        self.rows.push(row);
    }

    /// RowDescription, DataRows and `SHOW`'s CommandComplete.
    pub(crate) fn write(&self, out: &mut BytesMut) {
        let cols: Vec<(&str, u32, i16)> = self
            .columns
            .iter()
            .map(|(n, t)| {
                let (oid, len) = t.oid_and_len();
                (*n, oid, len)
            })
            .collect();
        backend::row_description_typed(out, &cols);
        for r in &self.rows {
            let vals: Vec<Option<&str>> = r.iter().map(Option::as_deref).collect();
            backend::data_row_text(out, &vals);
        }
        backend::command_complete(out, "SHOW");
    }

    /// The value of `column` in row `row` (tests).
    #[cfg(test)]
    pub(crate) fn get(&self, row: usize, column: &str) -> Option<&str> {
        let i = self.columns.iter().position(|(n, _)| *n == column)?;
        self.rows.get(row)?.get(i)?.as_deref()
    }
}

/// A text value.
pub(crate) fn t(s: impl Into<String>) -> Option<String> {
    Some(s.into())
}

/// A number.
pub(crate) fn n(v: impl std::fmt::Display) -> Option<String> {
    Some(v.to_string())
}

/// A time as PgBouncer shows it: "YYYY-MM-DD HH:MM:SS UTC" from microseconds since the epoch.
pub(crate) fn timestamp(unix_us: u64) -> Option<String> {
    let secs = unix_us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    Some(format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60))
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_calendar_times() {
        assert_eq!(timestamp(0).as_deref(), Some("1970-01-01 00:00:00 UTC"));
        // 2000-02-29 12:34:56 UTC, a leap day.
        assert_eq!(timestamp(951_827_696_000_000).as_deref(), Some("2000-02-29 12:34:56 UTC"));
        assert_eq!(timestamp(1_795_564_800_000_000).as_deref(), Some("2026-11-25 00:00:00 UTC"));
    }
}
