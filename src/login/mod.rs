//! The login phase of a client connection as a sans-IO state machine: the startup packet
//! (SSLRequest answered 'S' when TLS is configured, else 'N', as is GSSENCRequest; a
//! direct TLS ClientHello recognized; CancelRequest handed to the driver; a packet of an
//! impossible length closed without a word, as PostgreSQL closes it),
//! protocol version negotiation, refusals (`Refusal`: said after the SSL answer and the
//! startup packet), the database lookup, authentication (`auth_type`, or under `hba` the
//! method of the client's pg_hba.conf line, see `auth::hba`, with `cert` and `peer`: trust,
//! cleartext, md5, SCRAM-SHA-256, and SCRAM-SHA-256-PLUS on TLS; users parsnip does not
//! know asked as known ones are, see `auth`; `ldap` and `pam`: a cleartext password the
//! driver checks outside, refused with PostgreSQL's words, 28000, when it fails — console
//! logins under a global `ldap` or `pam` keep to their configured secrets, as under
//! `scram-sha-256`) and the welcome (AuthenticationOk, ParameterStatus, BackendKeyData,
//! ReadyForQuery).
//!
//! The driver feeds it the client's bytes (`handle_bytes`) and the answers to what it asks
//! for (`Step::NeedSecret` → `handle_secret`; `Step::CheckPassword` → an LDAP bind or a
//! PAM conversation → `handle_password_verdict`; `Step::Authenticated` → the pool's server
//! defaults and a cancel key → `welcome`; `Step::StartTls` → a handshake, then
//! `handle_tls_started` with the channel-binding hash of the certificate that handshake
//! showed), and writes `to_client`. Randomness (the md5
//! salt, the SCRAM nonce, the key of made-up SCRAM salts) is injected (`Entropy`), so tests
//! run without sockets or luck.
//!
//! Owns: what is said to a client before its session starts. Must not touch sockets,
//! pools or the clock: the driver does the IO, the timeout, the secret lookups and the
//! external password checks.

mod auth;
#[cfg(test)]
mod tests;

use crate::auth::{Credentials, Secret};
use crate::config::{AuthType, Config, DatabaseConfig};
use crate::error::{Error, SqlState};
use crate::protocol::backend;
use crate::protocol::startup::{StartupError, StartupPacket, parse_startup};
use crate::state::Settings;
use crate::state::settings::{startup_settings, tracked_name};
use bytes::{BufMut, BytesMut};
use std::sync::Arc;

/// The database name that reaches the admin console (unless a database of that name is
/// configured).
pub(crate) const ADMIN_DB: &str = "parsnip";

/// PgBouncer's name for its console, answered too, so tools written for PgBouncer (exporters,
/// monitoring agents) reach parsnip's unchanged.
pub(crate) const PGBOUNCER_ADMIN_DB: &str = "pgbouncer";

/// What the driver must do next.
#[derive(Debug)]
pub(crate) enum Step {
    /// Write `to_client`, read more from the client, and call `handle_bytes`.
    NeedBytes,
    /// The connection is a CancelRequest: forward it; the connection then ends.
    Cancel {
        /// The pid the client was given.
        pid: i32,
        /// Its secret key.
        key: Vec<u8>,
    },
    /// Look up the secret of `Login::user` with auth_query (`Login::target`), then call
    /// `handle_secret`.
    NeedSecret,
    /// Check the cleartext password the client gave with `checker` (an LDAP bind, PAM),
    /// then call `handle_password_verdict`.
    CheckPassword {
        /// How.
        checker: Checker,
        /// The user name of the startup packet.
        user: String,
        /// The password (not empty).
        password: Cleartext,
    },
    /// The client is authenticated (AuthenticationOk is in `to_client`): with `creds`, get
    /// the pool and its server defaults, then call `welcome` and write `to_client`.
    Authenticated(Credentials),
    /// A console user is logged in: write `to_client` and serve the console.
    Console {
        /// A `stats_users` user that is not an admin: SHOW commands only.
        read_only: bool,
    },
    /// Close the connection, after writing the error if there is one (`to_client` is
    /// dropped: PostgreSQL sends nothing else either).
    Close(Option<Error>),
    /// Write `to_client` (an 'S', unless `direct`), then run a TLS handshake: with `direct`,
    /// the buffered bytes are its start (PostgreSQL 17's `sslnegotiation=direct`). Then
    /// call `handle_tls_started`.
    StartTls {
        /// The client opened with a TLS ClientHello instead of an SSLRequest.
        direct: bool,
    },
}

/// Who checks a password parsnip cannot check itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Checker {
    /// Binding to an LDAP server with these options.
    Ldap(Arc<crate::auth::ldap::LdapOptions>),
    /// PAM, with this service.
    Pam {
        /// The service name (`auth_pam_service`, or an hba line's `pamservice=`).
        service: String,
    },
}

/// A cleartext password, kept out of `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Cleartext(pub(crate) Vec<u8>);

impl std::fmt::Debug for Cleartext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cleartext(..)")
    }
}

/// What the login knows of the connection it runs on.
#[derive(Clone, Debug)]
pub(crate) struct Transport {
    /// TLS can be offered (a certificate is configured).
    pub(crate) tls: bool,
    /// `client_tls_sslmode`.
    pub(crate) mode: crate::config::ClientTlsMode,
    /// A unix-domain socket (exempt from `require`, as in PgBouncer).
    pub(crate) unix: bool,
    /// The client's address, for the `require` refusal ("[local]" on a unix socket; may be
    /// left empty when the mode is not `require`).
    pub(crate) peer: String,
    /// The client's IP address, for `auth_type = "hba"` (None: a unix socket, or not asked
    /// for under another auth_type).
    pub(crate) addr: Option<std::net::IpAddr>,
    /// On a unix socket, the name of the operating-system user at the other end (hba's
    /// `peer`; None: unknown, or not asked for).
    pub(crate) os_user: Option<String>,
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            tls: false,
            mode: crate::config::ClientTlsMode::Disable,
            unix: false,
            peer: String::new(),
            addr: None,
            os_user: None,
        }
    }
}

/// The randomness one login draws.
#[derive(Clone, Debug)]
pub(crate) struct Entropy {
    /// The salt of an md5 challenge.
    pub(crate) md5_salt: [u8; 4],
    /// The server part of a SCRAM nonce (printable ASCII, no ',').
    pub(crate) scram_nonce: String,
    /// The key of the SCRAM salts parsnip makes up (`auth::derived_salt`: for plain
    /// passwords and for users it does not know): drawn once per process, the same for all
    /// its logins, so a user name's salt is the same at every login.
    pub(crate) salt_key: [u8; 32],
}

/// See `Entropy::salt_key`.
static SALT_KEY: std::sync::LazyLock<[u8; 32]> = std::sync::LazyLock::new(rand::random);

impl Entropy {
    /// Fresh random values (and the process's salt key).
    pub(crate) fn random() -> Entropy {
        Entropy { md5_salt: rand::random(), scram_nonce: crate::auth::ScramClient::random_nonce(), salt_key: *SALT_KEY }
    }
}

/// Why every login of a connection is refused, as PostgreSQL refuses it: once its
/// SSLRequest or GSSENCRequest is answered (and TLS started) and its startup packet read,
/// so that the client reads the reason; a CancelRequest is still handed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The pooler is stopping: 57P03.
    ShuttingDown,
    /// `max_client_conn` clients are connected: 53300.
    TooManyClients,
}

/// Where a login goes once authenticated.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The database's configuration entry.
    pub(crate) db_cfg: DatabaseConfig,
    /// The database name on the server.
    pub(crate) server_db: String,
    /// The admin console rather than a database.
    pub(crate) console: bool,
}

/// Where the exchange stands.
enum Phase {
    /// Waiting for the startup packet.
    Startup,
    /// Waiting for `handle_secret`.
    AwaitSecret,
    /// Waiting for `handle_password_verdict` on this password.
    AwaitVerdict(Cleartext),
    /// Waiting for a password message (the method and secret it is checked with).
    Password(auth::Pending),
    /// Done: nothing more is fed.
    Done,
}

/// One client's login. See the module doc.
pub(crate) struct Login {
    cfg: Arc<Config>,
    refusal: Option<Refusal>,
    entropy: Entropy,
    phase: Phase,
    transport: Transport,
    /// The connection is encrypted.
    encrypted: bool,
    /// The `tls-server-end-point` hash of the certificate the client was shown (None:
    /// plaintext, or a certificate without a usable hash): SCRAM-SHA-256-PLUS is offered
    /// with it.
    end_point: Option<Vec<u8>>,
    /// How this client is asked to authenticate: `auth_type`, or under hba the method of
    /// its line (set when authentication starts).
    method: AuthType,
    /// Let in under `method` Trust by an hba `cert` or `peer` line: who the client is was
    /// checked, but that makes it no console admin (only `trust` does, with no
    /// `admin_users`).
    identified: bool,
    /// The common name of the certificate the client showed and parsnip verified (hba's
    /// `cert`).
    cert_name: Option<String>,
    /// Who checks the password under `method` ldap or pam (set when authentication starts).
    checker: Option<Checker>,
    /// Bytes to write to the client.
    pub(crate) to_client: BytesMut,
    /// The user name of the startup packet.
    pub(crate) user: String,
    /// The database name the client asked for.
    pub(crate) db: String,
    /// The startup packet's parameters, in order.
    pub(crate) params: Vec<(String, String)>,
    /// Where the login goes (known once the startup packet is read).
    pub(crate) target: Option<Target>,
}

impl Login {
    /// A login under `cfg`; with a `refusal`, refused as PostgreSQL refuses it.
    pub(crate) fn new(cfg: Arc<Config>, refusal: Option<Refusal>, entropy: Entropy) -> Login {
        Login {
            method: cfg.auth_type,
            identified: false,
            cfg,
            refusal,
            entropy,
            phase: Phase::Startup,
            transport: Transport::default(),
            encrypted: false,
            end_point: None,
            cert_name: None,
            checker: None,
            to_client: BytesMut::with_capacity(512),
            user: String::new(),
            db: String::new(),
            params: Vec::new(),
            target: None,
        }
    }

    /// The connection this login runs on (default: plaintext TCP, no TLS to offer).
    pub(crate) fn with_transport(mut self, transport: Transport) -> Login {
        self.transport = transport;
        self
    }

    /// The common name of the verified certificate the client showed in its handshake
    /// (after `handle_tls_started`), for hba's `cert`.
    pub(crate) fn set_cert_name(&mut self, name: Option<String>) {
        self.cert_name = name;
    }

    /// TLS can be started now (offered, and not started already).
    fn tls_offered(&self) -> bool {
        self.transport.tls && !self.encrypted && self.transport.mode != crate::config::ClientTlsMode::Disable
    }

    /// The handshake `Step::StartTls` asked for is done; `alpn`: the protocol it agreed;
    /// `end_point`: the `tls-server-end-point` hash of the certificate it showed (see
    /// `auth::tls_server_end_point`; None when it has none, then PLUS is not offered).
    pub(crate) fn handle_tls_started(&mut self, direct: bool, alpn: Option<&[u8]>, end_point: Option<Vec<u8>>) -> Step {
        self.encrypted = true;
        self.end_point = end_point;
        if direct && alpn != Some(crate::protocol::startup::ALPN) {
            return self.close(Error::protocol(
                "received direct SSL connection request without ALPN protocol negotiation extension",
            ));
        }
        Step::NeedBytes
    }

    /// The client's bytes so far (`buf`, consumed as far as they are used).
    pub(crate) fn handle_bytes(&mut self, buf: &mut BytesMut) -> Step {
        match self.phase {
            Phase::Startup => self.on_startup_bytes(buf),
            Phase::Password(_) => self.on_auth_bytes(buf),
            // Nothing is read meanwhile.
            Phase::AwaitSecret | Phase::AwaitVerdict(_) | Phase::Done => Step::NeedBytes,
        }
    }

    fn on_startup_bytes(&mut self, buf: &mut BytesMut) -> Step {
        loop {
            // A TLS handshake record (0x16) where a packet length's first byte should be:
            // PostgreSQL 17's direct TLS.
            if buf.first() == Some(&0x16) && self.tls_offered() {
                return Step::StartTls { direct: true };
            }
            let packet = match parse_startup(buf) {
                Ok(Some((p, n))) => {
                    let _ = buf.split_to(n);
                    p
                }
                Ok(None) => return Step::NeedBytes,
                Err(StartupError::BadLength(n)) => {
                    // PostgreSQL logs it and closes without a word: a client that sent
                    // Terminate before any startup packet, a port scanner, HTTP.
                    tracing::info!(length = n, "invalid length of startup packet");
                    return self.close_quietly();
                }
                Err(e) => return self.close(protocol_err(e)),
            };
            match packet {
                StartupPacket::Ssl if self.encrypted => {
                    return self.close(Error::protocol("SSLRequest on a connection already encrypted"));
                }
                StartupPacket::Ssl if self.tls_offered() => {
                    if !buf.is_empty() {
                        // Bytes sent before the handshake could be anyone's (CVE-2021-23214).
                        return self.close(Error::protocol("received unencrypted data after SSL request"));
                    }
                    self.to_client.put_u8(b'S');
                    return Step::StartTls { direct: false };
                }
                // No encryption: the client goes on in plaintext or gives up.
                StartupPacket::Ssl | StartupPacket::GssEnc => self.to_client.put_u8(b'N'),
                StartupPacket::Cancel { pid, key } => {
                    self.phase = Phase::Done;
                    return Step::Cancel { pid, key };
                }
                StartupPacket::Startup { minor, params } => return self.on_startup(minor, params),
            }
        }
    }

    fn on_startup(&mut self, minor: u16, params: Vec<(String, String)>) -> Step {
        let unknown: Vec<&str> =
            params.iter().filter(|(k, _)| k.starts_with("_pq_.")).map(|(k, _)| k.as_str()).collect();
        if minor > 0 || !unknown.is_empty() {
            backend::negotiate_protocol_version(&mut self.to_client, 0, &unknown);
        }
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let Some(user) = get("user").filter(|u| !u.is_empty()) else {
            return self.close(Error::fatal(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                "no PostgreSQL user name specified in startup packet",
            ));
        };
        let db = get("database").filter(|d| !d.is_empty()).unwrap_or_else(|| user.clone());
        if get("replication").is_some_and(|r| r != "false" && r != "0" && r != "off") {
            return self.close(Error::fatal(
                SqlState::FEATURE_NOT_SUPPORTED,
                "replication connections are not supported by parsnip",
            ));
        }
        // PostgreSQL refuses here, before looking at who may log in where.
        match self.refusal {
            Some(Refusal::ShuttingDown) => {
                return self.close(Error::fatal(SqlState::CANNOT_CONNECT_NOW, "the pooler is shutting down"));
            }
            Some(Refusal::TooManyClients) => {
                return self.close(Error::fatal(SqlState::TOO_MANY_CONNECTIONS, "sorry, too many clients already"));
            }
            None => {}
        }
        if self.transport.mode.required() && !self.encrypted && !self.transport.unix {
            // PostgreSQL's wording for a client that no hostssl line lets in.
            return self.close(Error::fatal(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                format!(
                    "no pg_hba.conf entry for host \"{}\", user \"{user}\", database \"{db}\", no encryption",
                    self.transport.peer
                ),
            ));
        }
        let cfg = self.cfg.clone();
        let target = if (db == ADMIN_DB || db == PGBOUNCER_ADMIN_DB) && !cfg.databases.contains_key(&db) {
            let db_cfg = cfg.database("postgres").map(|(d, _)| d.clone()).unwrap_or_default();
            Target { db_cfg, server_db: "postgres".into(), console: true }
        } else {
            let Some((db_cfg, server_db)) = cfg.database(&db) else {
                return self
                    .close(Error::fatal(SqlState::UNDEFINED_DATABASE, format!("database \"{db}\" does not exist")));
            };
            Target { db_cfg: db_cfg.clone(), server_db, console: false }
        };
        self.user = user;
        self.db = db;
        self.params = params;
        self.target = Some(target);
        self.start_auth()
    }

    /// The answer to `Step::NeedSecret`: the user's secret, or None for an unknown user.
    pub(crate) fn handle_secret(&mut self, secret: Option<Secret>) -> Step {
        if !matches!(self.phase, Phase::AwaitSecret) {
            return Step::NeedBytes;
        }
        self.begin_password(secret)
    }

    /// The client's settings for its session: the server's defaults (`defaults`), then
    /// what its startup packet set. True when the server must normalize them (PostgreSQL
    /// reports normalized values, e.g. DateStyle "ISO" as "ISO, MDY"): the driver applies
    /// them on a server connection and reads the values back.
    pub(crate) fn client_settings(&self, defaults: &Settings) -> (Settings, bool) {
        let mut settings = defaults.clone();
        let (reported, extras) = startup_settings(&self.params);
        for (name, value) in &reported {
            settings.set_reported(name, value);
        }
        for (name, sql) in extras {
            settings.set_extra(name, sql);
        }
        let normalize =
            reported.iter().any(|(n, v)| *n != "application_name" && defaults.reported(n) != Some(v.as_str()));
        (settings, normalize)
    }

    /// The end of a client login: the server's parameters (`server_params`, with the
    /// client's own values for the tracked ones in `settings`), the cancel key, and
    /// ReadyForQuery.
    pub(crate) fn welcome(&mut self, server_params: &[(String, String)], settings: &Settings, pid: i32, key: i32) {
        for (k, v) in server_params {
            let v = tracked_name(k).and_then(|n| settings.reported(n)).unwrap_or(v);
            backend::parameter_status(&mut self.to_client, k, v);
        }
        backend::backend_key_data(&mut self.to_client, pid, key);
        backend::ready_for_query(&mut self.to_client, b'I');
        self.phase = Phase::Done;
    }

    /// Authentication succeeded with `creds`.
    fn authenticated(&mut self, creds: Credentials) -> Step {
        self.phase = Phase::Done;
        if self.target.as_ref().is_some_and(|t| t.console) {
            return self.console_welcome();
        }
        backend::auth_ok(&mut self.to_client);
        Step::Authenticated(creds)
    }

    /// The console: the user must be an admin (any user under trust with no admin_users),
    /// or a stats user (SHOW only).
    fn console_welcome(&mut self) -> Step {
        let cfg = &self.cfg;
        let admin = cfg.admin_users.contains(&self.user)
            || (cfg.admin_users.is_empty() && self.method == AuthType::Trust && !self.identified)
            || cfg.auth_type == AuthType::Any;
        let read_only = !admin && cfg.stats_users.contains(&self.user);
        if !admin && !read_only {
            let user = self.user.clone();
            return self.close(Error::fatal(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                format!("user \"{user}\" is not allowed to use the parsnip console (admin_users, stats_users)"),
            ));
        }
        let out = &mut self.to_client;
        backend::auth_ok(out);
        backend::parameter_status(out, "server_version", "15.0 (parsnip console)");
        backend::parameter_status(out, "client_encoding", "UTF8");
        backend::parameter_status(out, "server_encoding", "UTF8");
        backend::parameter_status(out, "DateStyle", "ISO, MDY");
        backend::parameter_status(out, "integer_datetimes", "on");
        backend::parameter_status(out, "standard_conforming_strings", "on");
        backend::backend_key_data(out, 0, 0);
        backend::ready_for_query(out, b'I');
        Step::Console { read_only }
    }

    /// Ends the login with `err` (what was queued for the client is dropped).
    fn close(&mut self, err: Error) -> Step {
        self.phase = Phase::Done;
        self.to_client.clear();
        Step::Close(Some(err))
    }

    /// Ends the login without a word to the client (what was queued is dropped).
    fn close_quietly(&mut self) -> Step {
        self.phase = Phase::Done;
        self.to_client.clear();
        Step::Close(None)
    }
}

fn protocol_err(e: StartupError) -> Error {
    match e {
        StartupError::BadLength(_) => Error::protocol("invalid length of startup packet"),
        StartupError::UnsupportedProtocol(v) => Error::fatal(
            SqlState::FEATURE_NOT_SUPPORTED,
            format!("unsupported frontend protocol {}.{}: server supports 3.0 to 3.0", v >> 16, v & 0xffff),
        ),
        StartupError::Malformed(m) => Error::protocol(m),
    }
}
