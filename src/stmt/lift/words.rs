//! The words `stmt::lift` decides by: keywords of PostgreSQL's grammar that open, end or
//! mark the places where a number is a constant of the grammar rather than a value.

/// Words after which a parenthesized group holds constants PostgreSQL's grammar requires as
/// such: type modifiers (`numeric(10, 2)`, `varchar(8)`, `nchar(2)`, `interval second(3)`)
/// and the precision of `CURRENT_TIME(3)` and its kin (a parameter there is a syntax error).
pub(super) const CONSTANT_GROUP_WORDS: [&[u8]; 22] = [
    b"numeric",
    b"decimal",
    b"dec",
    b"varchar",
    b"char",
    b"character",
    b"nchar",
    b"bpchar",
    b"varying",
    b"bit",
    b"varbit",
    b"float",
    b"time",
    b"timetz",
    b"timestamp",
    b"timestamptz",
    b"interval",
    b"second",
    b"current_time",
    b"current_timestamp",
    b"localtime",
    b"localtimestamp",
];

/// Reserved words that end an `ORDER BY` / `GROUP BY` list (none can be a column's name).
pub(super) const LIST_END: [&[u8]; 12] = [
    b"limit",
    b"offset",
    b"fetch",
    b"having",
    b"window",
    b"union",
    b"intersect",
    b"except",
    b"for",
    b"returning",
    b"select",
    b"from",
];

/// Words that end a type name or alias after `::` or `AS`: reserved words and words that
/// cannot name a type, so no type name holds one.
pub(super) const TYPE_END: [&[u8]; 24] = [
    b"from",
    b"select",
    b"values",
    b"where",
    b"and",
    b"or",
    b"in",
    b"on",
    b"using",
    b"group",
    b"order",
    b"having",
    b"limit",
    b"offset",
    b"fetch",
    b"for",
    b"union",
    b"intersect",
    b"except",
    b"window",
    b"then",
    b"else",
    b"when",
    b"between",
];

/// What may follow `AS (` (or `AS [NOT] MATERIALIZED (`) in a query or a window definition;
/// after any other `AS (` comes a column definition list (`AS (a numeric(10, 2))`).
pub(super) const AS_GROUP_OPENS: [&[u8]; 13] = [
    b"select",
    b"values",
    b"insert",
    b"update",
    b"delete",
    b"with",
    b"table",
    b"merge",
    b"partition",
    b"order",
    b"rows",
    b"range",
    b"groups",
];

/// Words that, between a `)` and a `(`, are not a table alias opening a column list
/// (`f(…) t(a mytype(3))`): keywords that may stand there.
pub(super) const NOT_ALIAS: [&[u8]; 35] = [
    b"union",
    b"intersect",
    b"except",
    b"all",
    b"any",
    b"some",
    b"in",
    b"as",
    b"over",
    b"filter",
    b"by",
    b"values",
    b"select",
    b"on",
    b"using",
    b"join",
    b"lateral",
    b"and",
    b"or",
    b"not",
    b"exists",
    b"from",
    b"where",
    b"having",
    b"limit",
    b"offset",
    b"fetch",
    b"for",
    b"then",
    b"else",
    b"when",
    b"between",
    b"like",
    b"ilike",
    b"repeatable",
];

/// Statements whose literals may be lifted.
pub(super) const DATA: [&[u8]; 6] = [b"select", b"insert", b"update", b"delete", b"values", b"with"];
