//! The login phase's IO: moves bytes for the sans-IO `crate::login::Login` and does what it
//! asks for (a CancelRequest forwarded to a server or a peer, a secret looked up with
//! auth_query, a password checked by LDAP (`driver::ldap`) or PAM (`driver::pam`), the pool
//! and its server defaults, the client's startup settings normalized on a server).

use super::Shared;
use super::servers::{self, ServerConnector, ServerPool};
use super::stream::Stream;
use crate::auth::{Credentials, Secret};
use crate::config::DatabaseConfig;
use crate::driver::server_conn::{self, ServerTarget};
use crate::error::{Error, SqlState};
use crate::login::{Checker, Entropy, Login, Refusal, Step, Transport};
use crate::pool::{Pool, PoolKey, PoolPurpose};
use crate::state::settings::{self, Settings};
use bytes::BytesMut;
use std::sync::Arc;

/// A logged-in client, ready for its session.
pub(crate) struct LoggedIn {
    /// The pool serving it.
    pub(crate) pool: Arc<ServerPool>,
    /// Settings it expects on every server.
    pub(crate) settings: std::sync::Arc<Settings>,
    /// The pid it was given in BackendKeyData (its cancel key).
    pub(crate) pid: i32,
    /// Its user name.
    pub(crate) user: String,
    /// Its database name.
    pub(crate) db: String,
    /// Session mode: the server connection bound at login, whose backend pid the client
    /// was given (None: bound at its first query, with a pid of parsnip's own).
    pub(crate) server: Option<Box<super::server_conn::ServerConn>>,
}

/// How login ended without a session.
pub(crate) enum LoginEnd {
    /// An admin console user logged in (AuthenticationOk sent); serve the console.
    Admin {
        /// A stats user: SHOW only.
        read_only: bool,
        /// Who, for `SHOW CLIENTS`: user, console database name, application_name.
        who: Box<(String, String, String)>,
    },
    /// The connection was a CancelRequest, now handled.
    Cancel,
    /// The client must be closed; `Some` error is sent first.
    Close(Option<Error>),
}

impl From<Error> for LoginEnd {
    fn from(e: Error) -> Self {
        LoginEnd::Close(Some(e))
    }
}

/// How long before the login's timeout an LDAP or PAM check is given up (at most half of
/// what is left), so that the client is refused with 28000 rather than timed out.
const CHECK_MARGIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Reads more client bytes into `buf`. The client gone: the login ends quietly.
async fn read_more(stream: &mut Stream, buf: &mut BytesMut) -> Result<(), LoginEnd> {
    buf.reserve(1024);
    match stream.read_buf(buf).await {
        Ok(0) | Err(_) => Err(LoginEnd::Close(None)),
        Ok(_) => Ok(()),
    }
}

async fn send(stream: &mut Stream, out: &mut BytesMut) -> Result<(), LoginEnd> {
    if out.is_empty() {
        return Ok(());
    }
    let r = stream.write_all(out).await;
    out.clear();
    r.map_err(|_| LoginEnd::Close(None))
}

/// Runs the login phase: the sans-IO `Login` decides, this moves its bytes and performs
/// what it asks for. `buf` keeps bytes the client sent beyond the login. With a `refusal`,
/// a startup is refused (after the SSL answer), a CancelRequest handled.
pub(crate) async fn login(
    stream: &mut Stream,
    shared: &Shared,
    buf: &mut BytesMut,
    refusal: Option<Refusal>,
) -> Result<LoggedIn, LoginEnd> {
    let started = std::time::Instant::now();
    let (mode, hba, login_timeout) = {
        let cfg = shared.cfg.load();
        (cfg.client_tls_mode(), cfg.auth_type == crate::config::AuthType::Hba, cfg.client_login_timeout())
    };
    let transport = Transport {
        tls: shared.tls_clients.load().is_some(),
        mode,
        unix: stream.is_unix(),
        // Only a refusal under `require` names it: no getpeername per login otherwise.
        peer: if mode.required() { stream.peer_host() } else { String::new() },
        // Only hba's lines look at them.
        addr: if hba { stream.peer_ip() } else { None },
        os_user: if hba && stream.is_unix() { stream.peer_os_user() } else { None },
    };
    // A connection accepted before the listener closed is served unless clients are being
    // closed (SIGTERM): under `SHUTDOWN WAIT_FOR_CLIENTS` (an online restart) it logs in.
    let stopping = shared.stopping.load(std::sync::atomic::Ordering::SeqCst).then_some(Refusal::ShuttingDown);
    let mut m = Login::new(shared.cfg.load_full(), stopping.or(refusal), Entropy::random()).with_transport(transport);
    let mut step = m.handle_bytes(buf);
    let creds = loop {
        step = match step {
            Step::NeedBytes => {
                send(stream, &mut m.to_client).await?;
                read_more(stream, buf).await?;
                m.handle_bytes(buf)
            }
            Step::Cancel { pid, key } => {
                shared.cancel_request(pid, &key).await;
                return Err(LoginEnd::Cancel);
            }
            Step::NeedSecret => {
                let Some(target) = m.target.clone() else { return Err(LoginEnd::Close(None)) };
                let secret = shared.lookup_secret(&m.user, &target.db_cfg, &target.server_db).await?;
                m.handle_secret(secret)
            }
            Step::CheckPassword { checker, user, password } => {
                // Within the login's timeout (`client::log_in`, started with this
                // function), and ended a little before it, so that a server that does
                // not answer still gets the client its 28000 rather than the timeout.
                let left = login_timeout.saturating_sub(started.elapsed());
                let budget = left.saturating_sub(CHECK_MARGIN.min(left / 2));
                let check = async {
                    match checker {
                        Checker::Ldap(opts) => {
                            let ca_file = shared.cfg.load().auth_ldap_tls_ca_file.clone();
                            super::ldap::check(&opts, &user, &password.0, budget, ca_file.as_deref()).await
                        }
                        Checker::Pam { service } => {
                            let dir = shared.cfg.load().auth_pam_config_dir.clone();
                            let rhost = stream.peer_ip().map(|ip| ip.to_canonical().to_string());
                            super::pam::check(service, dir, user.clone(), password.0, rhost).await
                        }
                    }
                };
                let ok = tokio::time::timeout(budget, check).await.unwrap_or_else(|_| {
                    tracing::warn!(user, "password check failed: no answer within {budget:?} (client_login_timeout)");
                    false
                });
                m.handle_password_verdict(ok)
            }
            Step::Console { read_only } => {
                send(stream, &mut m.to_client).await?;
                let app = m.params.iter().find(|(k, _)| k == "application_name").map(|(_, v)| v.clone());
                let who = Box::new((m.user.clone(), m.db.clone(), app.unwrap_or_default()));
                return Err(LoginEnd::Admin { read_only, who });
            }
            Step::StartTls { direct } => {
                send(stream, &mut m.to_client).await?;
                // The configuration and its certificate's hash from one load: a reload
                // meanwhile cannot give this login another certificate's hash.
                let Some(tls_cfg) = shared.tls_clients.load_full() else { return Err(LoginEnd::Close(None)) };
                let initial = std::mem::take(buf);
                let plain = std::mem::replace(stream, Stream::Closed);
                let tls = match super::tls::accept(plain, tls_cfg.config.clone(), &initial).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(error = %e, "client TLS handshake failed");
                        return Err(LoginEnd::Close(None));
                    }
                };
                let alpn = tls.alpn();
                let cert_name = tls.peer_common_name();
                *stream = Stream::Tls(Box::new(tls));
                let step = m.handle_tls_started(direct, alpn.as_deref(), tls_cfg.end_point.clone());
                m.set_cert_name(cert_name);
                step
            }
            Step::Close(err) => return Err(LoginEnd::Close(err)),
            Step::Authenticated(creds) => break creds,
        };
    };
    let Some(target) = m.target.clone() else { return Err(LoginEnd::Close(None)) };
    if shared.is_disabled(&m.db) {
        return Err(LoginEnd::Close(Some(Error::fatal(
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("database \"{}\" is not currently accepting connections", m.db),
        ))));
    }
    let pool = shared.pool(&m.db, &m.user, &target.db_cfg, &target.server_db, creds, PoolPurpose::Clients);
    let seat = Seat::take(&pool)?;
    let defaults = match pool.defaults().await {
        Ok(d) => d,
        Err(mut e) => {
            e.severity = crate::error::Severity::Fatal;
            return Err(e.into());
        }
    };
    let (mut settings, normalize_them) = m.client_settings(&defaults.settings);
    if normalize_them {
        normalize(&pool, &mut settings).await?;
    }
    let server = if pool.mode == crate::config::PoolMode::Session { bind_at_login(&pool).await } else { None };
    let (pid, key) = shared.cancels.register_as(server.as_ref().map(|s| s.cancel.pid));
    m.welcome(&defaults.params, &settings, pid, key);
    if let Err(e) = send(stream, &mut m.to_client).await {
        if let Some(s) = server {
            servers::release(&pool, s, true);
        }
        shared.cancels.unregister(pid);
        return Err(e);
    }
    let settings = pool.intern_settings(settings);
    seat.keep();
    Ok(LoggedIn { pool, settings, pid, user: std::mem::take(&mut m.user), db: std::mem::take(&mut m.db), server })
}

/// A client counted in its database's and its user's client counts (`Pool::seat_client`)
/// while it logs in: counted out again if the login fails, kept once it succeeds (the
/// client's task counts it out when it leaves: `Proxy::leave_limits`).
struct Seat<'a>(&'a ServerPool);

impl<'a> Seat<'a> {
    /// Counts the client in, or refuses it as PgBouncer does beyond
    /// `max_db_client_connections` or `max_user_client_connections` (FATAL, 08P01, its
    /// message). Unlike PgBouncer, only once the client has authenticated: a client that
    /// cannot log in neither counts nor learns of the limit.
    fn take(pool: &'a ServerPool) -> Result<Seat<'a>, Error> {
        pool.seat_client().map(|()| Seat(pool)).map_err(|key| {
            tracing::debug!(db = %pool.key.db, user = %pool.key.user, "client refused: {key}");
            Error::fatal(SqlState::PROTOCOL_VIOLATION, format!("client connections exceeded ({key})"))
        })
    }

    /// The login succeeded: the client stays counted.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.0.unseat_client();
    }
}

/// Session mode: a server connection for the client's whole session, taken at login when
/// one is idle or a slot is free, so the client is given its backend's real pid
/// (`pg_backend_pid()`, `pg_terminate_backend`, `pg_stat_activity` and NOTIFY's sender
/// agree with it, as directly). When the pool is full the client logs in anyway and waits
/// at its first query, as in PgBouncer (with a pid of parsnip's own).
async fn bind_at_login(pool: &Arc<ServerPool>) -> Option<Box<super::server_conn::ServerConn>> {
    match pool.checkout() {
        crate::pool::Checkout::Ready(c) => Some(c),
        crate::pool::Checkout::Slow => pool.acquire().await.ok(),
        crate::pool::Checkout::Queued(q) => {
            servers::abandon(pool, q);
            None
        }
    }
}

/// Applies the client's reported startup parameters on a server to learn their normalized
/// values (and to refuse invalid ones as PostgreSQL does at startup).
async fn normalize(pool: &ServerPool, settings: &mut Settings) -> Result<(), LoginEnd> {
    let mut conn = pool.acquire().await.map_err(|mut e| {
        e.severity = crate::error::Severity::Fatal;
        e
    })?;
    let sql = settings.reported_diff_sql(&conn.state.settings);
    let res = conn.run_checked(&sql, pool_timeout(pool)).await;
    match res {
        Ok(()) => {
            let names: Vec<&'static str> = settings.reported.iter().map(|(n, _)| *n).collect();
            for n in names {
                if let Some(v) = conn.state.settings.reported(n).map(str::to_owned) {
                    settings.set_reported(n, &v);
                }
            }
            pool.release_now(conn, true);
            Ok(())
        }
        Err(frame) => {
            let ok = conn.run_checked("ROLLBACK", pool_timeout(pool)).await.is_ok();
            pool.release_now(conn, ok);
            let mut e = match frame {
                Some(f) => server_conn::ConnectError::Server(f).to_error(),
                None => Error::fatal(
                    SqlState::CONNECTION_FAILURE,
                    "server connection failed while applying startup parameters",
                ),
            };
            e.severity = crate::error::Severity::Fatal;
            Err(e.into())
        }
    }
}

fn pool_timeout(pool: &ServerPool) -> std::time::Duration {
    pool.connect_timeout()
}

/// Where a pool of (`db_cfg`, `user`) connects, and the credentials the configuration
/// forces (a database with a `user`: its password, or that user's); None: the client's.
pub(super) fn server_side(
    cfg: &crate::config::Config,
    db_cfg: &DatabaseConfig,
    server_db: &str,
    user: &str,
    tls: Arc<super::tls_config::ServerTls>,
) -> (ServerTarget, Option<Credentials>) {
    let server_user = db_cfg.user.clone().unwrap_or_else(|| user.to_owned());
    let forced = db_cfg.user.as_ref().map(|_| {
        db_cfg
            .password
            .clone()
            .or_else(|| cfg.users.get(&server_user).and_then(|u| u.password.clone()))
            .map(Credentials::Password)
            .unwrap_or_default()
    });
    let hosts: Arc<[(String, u16)]> = db_cfg.host.endpoints_or_skip(db_cfg.port).into();
    let (host, port) = hosts.first().cloned().unwrap_or_default();
    let target = ServerTarget {
        host,
        port,
        hosts,
        attrs: db_cfg.target_session_attrs,
        balance: db_cfg.load_balance_hosts,
        dbname: server_db.to_owned(),
        user: server_user,
        tls,
        params: db_cfg.default_params(),
    };
    (target, forced)
}

impl Shared {
    /// The pool for (db, user), created on first use.
    pub(crate) fn pool(
        &self,
        db: &str,
        user: &str,
        db_cfg: &DatabaseConfig,
        server_db: &str,
        creds: Credentials,
        purpose: PoolPurpose,
    ) -> Arc<ServerPool> {
        let key = PoolKey { db: db.to_owned(), user: user.to_owned(), purpose };
        let cfg = self.cfg.load_full();
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.get(&key) {
            p.connector().offer_credentials(&creds);
            if let Some(split) = p.connector().split() {
                split.reads.connector().offer_credentials(&creds);
            }
            return p.clone();
        }
        let (target, forced) = server_side(&cfg, db_cfg, server_db, user, self.tls_servers.load_full());
        let creds = forced.unwrap_or(creds);
        // Its server connections count against its database's and its server user's
        // limits (an auth_query pool's do not: logins must not wait behind clients).
        let caps = match purpose {
            PoolPurpose::AuthQuery => Vec::new(),
            _ => vec![self.caps.db(db, cfg.db_limits(db)), self.caps.user(&target.user, cfg.user_limits(&target.user))],
        };
        let client_caps = match purpose {
            PoolPurpose::AuthQuery => Vec::new(),
            _ => vec![self.caps.db(db, cfg.db_limits(db)), self.caps.user(user, cfg.user_limits(user))],
        };
        let (target_reads, creds_reads) = (target.clone(), creds.clone());
        let connector = ServerConnector::new(key.clone(), target, creds, self.cfg.clone())
            .with_census(self.census.clone())
            .with_host_memory(self.hosts.clone());
        let pool = Arc::new(
            Pool::new(
                key.clone(),
                cfg.pool_mode_for(db_cfg, user),
                cfg.pool_size_for(db_cfg, user),
                connector,
                self.cfg.clone(),
            )
            .with_pauses(self.pauses.clone())
            .with_caps(caps)
            .with_client_caps(client_caps),
        );
        pool.set_reserve(cfg.reserve_pool_size_for(db_cfg, user));
        crate::pool::limit::Caps::enroll(member(&pool), pool.caps());
        if purpose == PoolPurpose::Clients && db_cfg.read_write_split && pool.mode != crate::config::PoolMode::Session {
            let reads = self.read_pool(&pool, db_cfg, target_reads, creds_reads);
            pools.insert(reads.key.clone(), reads);
        }
        pools.insert(key, pool.clone());
        pool
    }

    /// The read pool of clients pool `primary` (`driver::split`): the same servers as
    /// standbys only, the same credentials, size and statement cache.
    fn read_pool(
        &self,
        primary: &Arc<ServerPool>,
        db_cfg: &DatabaseConfig,
        mut target: ServerTarget,
        creds: Credentials,
    ) -> Arc<ServerPool> {
        let key = PoolKey { purpose: PoolPurpose::Reads, ..primary.key.clone() };
        target.attrs = crate::config::TargetSessionAttrs::Standby;
        let connector = ServerConnector::new(key.clone(), target, creds, self.cfg.clone())
            .with_census(self.census.clone())
            .with_host_memory(self.hosts.clone());
        let mut reads = Pool::new(key, primary.mode, primary.size(), connector, self.cfg.clone())
            .with_pauses(self.pauses.clone())
            .with_caps(primary.caps().to_vec())
            .with_client_caps(primary.client_caps().to_vec());
        reads.stmts = primary.stmts.clone();
        let reads = Arc::new(reads);
        reads.set_reserve(primary.reserve());
        crate::pool::limit::Caps::enroll(member(&reads), reads.caps());
        reads.connector().set_primary(primary);
        primary.connector().set_split(Arc::new(super::split::Split::new(reads.clone(), db_cfg)));
        reads
    }

    /// Looks a user's secret up with auth_query through auth_user. None: unknown user.
    async fn lookup_secret(
        &self,
        user: &str,
        db_cfg: &DatabaseConfig,
        server_db: &str,
    ) -> Result<Option<Secret>, Error> {
        let cfg = self.cfg.load_full();
        let Some((query, auth_user, auth_dbname)) = cfg.auth_lookup(db_cfg) else {
            return Ok(None);
        };
        let auth_db = auth_dbname.unwrap_or(server_db).to_owned();
        let creds = match cfg.users.get(auth_user).and_then(|u| u.password.as_deref()).map(Secret::parse) {
            Some(Secret::Plain(p)) => Credentials::Password(p),
            Some(Secret::Md5(m)) => Credentials::Md5Secret(m),
            _ => db_cfg.password.clone().map(Credentials::Password).unwrap_or_default(),
        };
        let pool = self.pool(&auth_db, auth_user, db_cfg, &auth_db, creds, PoolPurpose::AuthQuery);
        let mut conn = pool.acquire().await.map_err(|mut e| {
            e.severity = crate::error::Severity::Fatal;
            e
        })?;
        let sql = query.replace("$1", &settings::quote_literal(user));
        let rows = conn.query_rows(&sql, cfg.server_connect_timeout()).await;
        servers::release(&pool, conn, rows.is_ok());
        let rows = rows.map_err(|m| {
            Error::fatal(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, format!("auth_query failed: {m}"))
        })?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().nth(1).flatten()).map(|s| Secret::parse(&s)))
    }
}

/// A pool as a member of the caps it counts in.
fn member(pool: &Arc<ServerPool>) -> std::sync::Weak<dyn crate::pool::limit::Member> {
    let weak: std::sync::Weak<dyn crate::pool::limit::Member> = Arc::downgrade(pool) as _;
    weak
}
