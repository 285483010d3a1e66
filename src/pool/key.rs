//! What identifies a pool.

/// What a pool's connections are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolPurpose {
    /// Serving clients of (db, user).
    Clients,
    /// Running `auth_query` for logins to `db`, as `auth_user`; no client is served by it.
    AuthQuery,
    /// Serving the plain reads of (db, user)'s clients on standbys (`read_write_split`):
    /// next to, and sharing the statement cache of, the `Clients` pool.
    Reads,
}

/// Identifies a pool: the database name clients use, the client user name, and what the
/// pool is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    /// Database name as the client gave it.
    pub(crate) db: String,
    /// Client user name.
    pub(crate) user: String,
    /// Clients' pool, or the auth_query pool of that database.
    pub(crate) purpose: PoolPurpose,
}

impl PoolKey {
    /// The pool serving clients of (db, user).
    pub fn clients(db: &str, user: &str) -> PoolKey {
        PoolKey { db: db.to_owned(), user: user.to_owned(), purpose: PoolPurpose::Clients }
    }
}
