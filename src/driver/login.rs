//! The login phase of a client connection: startup packet (SSL and GSSENC refused, cancel
//! requests dispatched), protocol negotiation, database lookup, password authentication
//! (trust, cleartext, md5, SCRAM-SHA-256; secrets from the config or via auth_query), then
//! AuthenticationOk, ParameterStatus, BackendKeyData and ReadyForQuery.

use super::Shared;
use super::servers::{self, ServerConnector, ServerPool};
use super::stream::Stream;
use crate::auth::{self, ScramServer, Secret};
use crate::config::{AuthType, DatabaseConfig};
use crate::driver::server_conn::{self, Credentials, ServerTarget};
use crate::error::{Error, SqlState};
use crate::pool::{Pool, PoolKey, PoolPurpose};
use crate::protocol::startup::{StartupError, StartupPacket, parse_startup};
use crate::protocol::{backend, body, frontend, split_frame, tags};
use crate::state::settings::{self, Settings};
use bytes::BytesMut;
use std::sync::Arc;

/// A logged-in client, ready for its session.
pub struct LoggedIn {
    /// The pool serving it.
    pub pool: Arc<ServerPool>,
    /// Settings it expects on every server.
    pub settings: std::sync::Arc<Settings>,
    /// The pid it was given in BackendKeyData (its cancel key).
    pub pid: i32,
    /// Its user name.
    pub user: String,
    /// Its database name.
    pub db: String,
}

/// How login ended without a session.
pub enum LoginEnd {
    /// An admin console user logged in (AuthenticationOk sent); serve the console.
    Admin,
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

fn protocol_err(e: StartupError) -> Error {
    match e {
        StartupError::BadLength(n) => Error::protocol(format!("invalid length of startup packet: {n}")),
        StartupError::UnsupportedProtocol(v) => Error::fatal(
            SqlState::FEATURE_NOT_SUPPORTED,
            format!("unsupported frontend protocol {}.{}: server supports 3.0 to 3.0", v >> 16, v & 0xffff),
        ),
        StartupError::Malformed(m) => Error::protocol(m),
    }
}

async fn read_startup(stream: &mut Stream, buf: &mut BytesMut) -> Result<StartupPacket, LoginEnd> {
    loop {
        if let Some((p, n)) = parse_startup(buf).map_err(protocol_err)? {
            let _ = buf.split_to(n);
            return Ok(p);
        }
        buf.reserve(1024);
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(LoginEnd::Close(None)),
            Ok(_) => {}
        }
    }
}

/// Reads one frame of at most 10000 bytes during authentication.
async fn read_auth_frame(stream: &mut Stream, buf: &mut BytesMut) -> Result<BytesMut, LoginEnd> {
    loop {
        match split_frame(buf, 10_000) {
            Ok(Some(n)) => return Ok(buf.split_to(n)),
            Ok(None) => {}
            Err(e) => return Err(Error::protocol(e.to_string()).into()),
        }
        buf.reserve(1024);
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(LoginEnd::Close(None)),
            Ok(_) => {}
        }
    }
}

async fn send(stream: &mut Stream, out: &mut BytesMut) -> Result<(), LoginEnd> {
    let r = stream.write_all(out).await;
    out.clear();
    r.map_err(|_| LoginEnd::Close(None))
}

fn wrong_password(user: &str) -> Error {
    Error::fatal(SqlState::INVALID_PASSWORD, format!("password authentication failed for user \"{user}\""))
}

/// Runs the login phase. `buf` keeps bytes the client sent beyond it.
pub async fn login(stream: &mut Stream, shared: &Shared, buf: &mut BytesMut) -> Result<LoggedIn, LoginEnd> {
    let (minor, params) = loop {
        match read_startup(stream, buf).await? {
            StartupPacket::Ssl | StartupPacket::GssEnc => {
                send(stream, &mut BytesMut::from(&b"N"[..])).await?;
            }
            StartupPacket::Cancel { pid, key } => {
                shared.cancels.cancel(pid, &key).await;
                return Err(LoginEnd::Cancel);
            }
            StartupPacket::Startup { minor, params } => break (minor, params),
        }
    };
    let mut out = BytesMut::with_capacity(512);
    let unknown: Vec<&str> = params.iter().filter(|(k, _)| k.starts_with("_pq_.")).map(|(k, _)| k.as_str()).collect();
    if minor > 0 || !unknown.is_empty() {
        backend::negotiate_protocol_version(&mut out, 0, &unknown);
    }
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let Some(user) = get("user").filter(|u| !u.is_empty()) else {
        return Err(Error::fatal(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            "no PostgreSQL user name specified in startup packet",
        )
        .into());
    };
    let db = get("database").filter(|d| !d.is_empty()).unwrap_or_else(|| user.clone());
    if get("replication").is_some_and(|r| r != "false" && r != "0" && r != "off") {
        return Err(Error::fatal(
            SqlState::FEATURE_NOT_SUPPORTED,
            "replication connections are not supported by parsnip",
        )
        .into());
    }
    if *shared.shutdown.borrow() {
        return Err(Error::fatal(SqlState::CANNOT_CONNECT_NOW, "the pooler is shutting down").into());
    }
    let cfg = shared.cfg.clone();
    if db == crate::admin::ADMIN_DB && !cfg.databases.contains_key(&db) {
        return admin_login(stream, shared, buf, &mut out, &user).await;
    }
    let Some((db_cfg, server_db)) = cfg.database(&db) else {
        return Err(Error::fatal(SqlState::UNDEFINED_DATABASE, format!("database \"{db}\" does not exist")).into());
    };
    let creds = authenticate(stream, shared, buf, &mut out, &user, db_cfg, &server_db).await?;
    backend::auth_ok(&mut out);
    let pool = shared.pool(&db, &user, db_cfg, &server_db, creds, PoolPurpose::Clients);
    let defaults = match pool.defaults().await {
        Ok(d) => d,
        Err(mut e) => {
            e.severity = crate::error::Severity::Fatal;
            return Err(e.into());
        }
    };
    let mut settings = defaults.settings.clone();
    let (reported, extras) = settings::startup_settings(&params);
    for (name, value) in &reported {
        settings.set_reported(name, value);
    }
    for (name, sql) in extras {
        settings.set_extra(name, sql);
    }
    // PostgreSQL reports normalized values (DateStyle "ISO" is "ISO, MDY"): learn them once
    // from a server rather than report what the client wrote.
    if reported.iter().any(|(n, v)| *n != "application_name" && defaults.settings.reported(n) != Some(v.as_str())) {
        normalize(&pool, &mut settings).await?;
    }
    for (k, v) in &defaults.params {
        let v = settings::tracked_name(k).and_then(|n| settings.reported(n)).unwrap_or(v);
        backend::parameter_status(&mut out, k, v);
    }
    let (pid, key) = shared.cancels.register();
    backend::backend_key_data(&mut out, pid, key);
    backend::ready_for_query(&mut out, b'I');
    send(stream, &mut out).await?;
    let settings = pool.intern_settings(settings);
    Ok(LoggedIn { pool, settings, pid, user, db })
}

/// The console: authenticate as usual, then require the user to be an admin.
async fn admin_login(
    stream: &mut Stream,
    shared: &Shared,
    buf: &mut BytesMut,
    out: &mut BytesMut,
    user: &str,
) -> Result<LoggedIn, LoginEnd> {
    let cfg = &shared.cfg;
    let allowed =
        cfg.admin_users.iter().any(|u| u == user) || (cfg.admin_users.is_empty() && cfg.auth_type == AuthType::Trust);
    let db_cfg = cfg.database("postgres").map(|(d, _)| d.clone()).unwrap_or_default();
    authenticate(stream, shared, buf, out, user, &db_cfg, "postgres").await?;
    if !allowed {
        return Err(Error::fatal(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            format!("user \"{user}\" is not allowed to use the parsnip console (admin_users)"),
        )
        .into());
    }
    backend::auth_ok(out);
    backend::parameter_status(out, "server_version", "15.0 (parsnip console)");
    backend::parameter_status(out, "client_encoding", "UTF8");
    backend::parameter_status(out, "server_encoding", "UTF8");
    backend::parameter_status(out, "DateStyle", "ISO, MDY");
    backend::parameter_status(out, "integer_datetimes", "on");
    backend::parameter_status(out, "standard_conforming_strings", "on");
    backend::backend_key_data(out, 0, 0);
    backend::ready_for_query(out, b'I');
    send(stream, out).await?;
    Err(LoginEnd::Admin)
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

/// Checks the client's password per auth_type; returns what we learnt for server logins.
#[allow(clippy::too_many_arguments)]
async fn authenticate(
    stream: &mut Stream,
    shared: &Shared,
    buf: &mut BytesMut,
    out: &mut BytesMut,
    user: &str,
    db_cfg: &DatabaseConfig,
    server_db: &str,
) -> Result<Credentials, LoginEnd> {
    let cfg = &shared.cfg;
    let configured = cfg.users.get(user).and_then(|u| u.password.as_deref()).map(Secret::parse);
    let from_secret = |s: &Option<Secret>| match s {
        Some(Secret::Plain(p)) => Credentials::Password(p.clone()),
        Some(Secret::Md5(m)) => Credentials::Md5Secret(m.clone()),
        _ => db_cfg.password.clone().map(Credentials::Password).unwrap_or_default(),
    };
    if cfg.auth_type == AuthType::Trust {
        return Ok(from_secret(&configured));
    }
    let secret = match configured {
        Some(s) => Some(s),
        None => shared.lookup_secret(user, db_cfg, server_db).await?,
    };
    let Some(secret) = secret else {
        // Answer as PostgreSQL does for an unknown role: ask, then refuse the same way.
        backend::auth_cleartext(out);
        send(stream, out).await?;
        let _ = read_auth_frame(stream, buf).await?;
        return Err(wrong_password(user).into());
    };
    let method = match (cfg.auth_type, &secret) {
        (AuthType::Password, _) => AuthType::Password,
        (AuthType::Md5, Secret::Scram(_)) => AuthType::ScramSha256,
        (AuthType::ScramSha256, Secret::Md5(_)) => AuthType::Md5,
        (m, _) => m,
    };
    match method {
        AuthType::Password => {
            backend::auth_cleartext(out);
            send(stream, out).await?;
            let f = read_password(stream, buf).await?;
            let pw = body(&f).strip_suffix(&[0]).unwrap_or(body(&f));
            if !auth::verify_cleartext(&secret, user, pw) {
                return Err(wrong_password(user).into());
            }
            Ok(Credentials::Password(String::from_utf8_lossy(pw).into_owned()))
        }
        AuthType::Md5 => {
            let salt: [u8; 4] = rand::random();
            backend::auth_md5(out, salt);
            send(stream, out).await?;
            let f = read_password(stream, buf).await?;
            let resp = body(&f).strip_suffix(&[0]).unwrap_or(body(&f));
            if !auth::verify_md5(&secret, user, salt, resp) {
                return Err(wrong_password(user).into());
            }
            Ok(from_secret(&Some(secret)))
        }
        _ => scram_exchange(stream, buf, out, user, &secret).await.map(|keys| match (&secret, keys) {
            (Secret::Scram(s), Some(client_key)) => Credentials::ScramKeys { client_key, server_key: s.server_key },
            _ => from_secret(&Some(secret.clone())),
        }),
    }
}

async fn read_password(stream: &mut Stream, buf: &mut BytesMut) -> Result<BytesMut, LoginEnd> {
    let f = read_auth_frame(stream, buf).await?;
    if f[0] != tags::PASSWORD {
        return Err(Error::protocol(format!("expected password response, got message type {}", f[0])).into());
    }
    Ok(f)
}

async fn scram_exchange(
    stream: &mut Stream,
    buf: &mut BytesMut,
    out: &mut BytesMut,
    user: &str,
    secret: &Secret,
) -> Result<Option<[u8; 32]>, LoginEnd> {
    let Some(mut server) = ScramServer::with_random_nonce(secret) else {
        return Err(wrong_password(user).into());
    };
    backend::auth_sasl(out, auth::SCRAM_SHA_256);
    send(stream, out).await?;
    let f = read_password(stream, buf).await?;
    let Some((mech, data)) = frontend::sasl_initial_fields(body(&f)) else {
        return Err(Error::protocol("malformed SASLInitialResponse message").into());
    };
    if mech != auth::SCRAM_SHA_256.as_bytes() {
        return Err(Error::protocol("client selected an invalid SASL authentication mechanism").into());
    }
    let first =
        server.handle_client_first(data).map_err(|e| Error::protocol(format!("malformed SCRAM message: {e}")))?;
    backend::auth_sasl_continue(out, &first);
    send(stream, out).await?;
    let f = read_password(stream, buf).await?;
    let fin = match server.handle_client_final(body(&f)) {
        Ok(m) => m,
        Err(auth::AuthError::WrongPassword) => return Err(wrong_password(user).into()),
        Err(e) => return Err(Error::protocol(format!("malformed SCRAM message: {e}")).into()),
    };
    backend::auth_sasl_final(out, &fin);
    Ok(server.client_key())
}

impl Shared {
    /// The pool for (db, user), created on first use.
    pub fn pool(
        &self,
        db: &str,
        user: &str,
        db_cfg: &DatabaseConfig,
        server_db: &str,
        creds: Credentials,
        purpose: PoolPurpose,
    ) -> Arc<ServerPool> {
        let key = PoolKey { db: db.to_owned(), user: user.to_owned(), purpose };
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.get(&key) {
            p.connector().offer_credentials(&creds);
            return p.clone();
        }
        let server_user = db_cfg.user.clone().unwrap_or_else(|| user.to_owned());
        let creds = if db_cfg.user.is_some() {
            db_cfg
                .password
                .clone()
                .or_else(|| self.cfg.users.get(&server_user).and_then(|u| u.password.clone()))
                .map(Credentials::Password)
                .unwrap_or_default()
        } else {
            creds
        };
        let target = ServerTarget {
            host: db_cfg.host.clone(),
            port: db_cfg.port,
            dbname: server_db.to_owned(),
            user: server_user,
        };
        let connector = ServerConnector::new(key.clone(), target, creds, self.cfg.clone());
        let pool = Arc::new(Pool::new(
            key.clone(),
            self.cfg.pool_mode_for(db_cfg, user),
            self.cfg.pool_size_for(db_cfg, user),
            connector,
            self.cfg.clone(),
        ));
        pools.insert(key, pool.clone());
        pool
    }

    /// Looks a user's secret up with auth_query through auth_user. None: unknown user.
    async fn lookup_secret(
        &self,
        user: &str,
        db_cfg: &DatabaseConfig,
        server_db: &str,
    ) -> Result<Option<Secret>, Error> {
        let (Some(query), Some(auth_user)) = (&self.cfg.auth_query, &self.cfg.auth_user) else {
            return Ok(None);
        };
        let auth_db = self.cfg.auth_dbname.clone().unwrap_or_else(|| server_db.to_owned());
        let creds = match self.cfg.users.get(auth_user).and_then(|u| u.password.as_deref()).map(Secret::parse) {
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
        let rows = conn.query_rows(&sql, self.cfg.server_connect_timeout()).await;
        servers::release(&pool, conn, rows.is_ok());
        let rows = rows.map_err(|m| {
            Error::fatal(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, format!("auth_query failed: {m}"))
        })?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().nth(1).flatten()).map(|s| Secret::parse(&s)))
    }
}
