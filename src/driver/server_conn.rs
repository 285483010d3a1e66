//! Opening a server connection: connect, StartupMessage, authenticate as the pool's user
//! (cleartext, md5 or SCRAM-SHA-256, from a password, an md5 secret or SCRAM keys; over TLS
//! SCRAM-SHA-256-PLUS when the server offers it, as libpq's `channel_binding` says), and
//! collect the ParameterStatus and BackendKeyData the server sends before ReadyForQuery.

use super::server_auth::{Binding, auth_reply};
use super::stream::Stream;
use crate::auth::{Credentials, ScramClient};
use crate::config::ChannelBinding;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, frontend, split_frame, startup, tags};
use crate::state::settings::tracked_name;
use crate::state::{ServerState, TxStatus};
use bytes::{Buf, BytesMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where and as whom a pool connects.
#[derive(Clone, Debug)]
pub struct ServerTarget {
    /// Host name/IP, or a unix socket directory (starts with '/'): the one a connect goes
    /// to (`driver::hosts` sets it to each of `hosts` in turn).
    pub host: String,
    /// Port of `host`.
    pub port: u16,
    /// Every host of the database, with its port, in the order configured.
    pub(crate) hosts: Arc<[(String, u16)]>,
    /// Which of them new connections may go to.
    pub(crate) attrs: crate::config::TargetSessionAttrs,
    /// In which order they are tried.
    pub(crate) balance: crate::config::LoadBalanceHosts,
    /// Database name on the server.
    pub dbname: String,
    /// User name on the server.
    pub user: String,
    /// TLS to the server (never over a unix socket, as libpq).
    pub(crate) tls: Arc<crate::driver::tls_config::ServerTls>,
    /// Startup parameters beyond user and database: the database entry's
    /// (`DatabaseConfig::default_params`), so its clients start with them.
    pub(crate) params: Vec<(String, String)>,
}

impl ServerTarget {
    /// The same servers, database, user and target_session_attrs (TLS settings and the
    /// hosts' order aside: new connections take the new ones, open ones are fine as they
    /// are).
    pub(crate) fn same_place(&self, o: &ServerTarget) -> bool {
        (&self.hosts, &self.dbname, &self.user, self.attrs) == (&o.hosts, &o.dbname, &o.user, o.attrs)
    }

    /// The same target, connecting to `hosts[i]`.
    pub(crate) fn at(&self, i: usize) -> ServerTarget {
        let mut t = self.clone();
        if let Some((h, p)) = self.hosts.get(i) {
            (t.host, t.port) = (h.clone(), *p);
        }
        t
    }

    /// A target reached without TLS.
    pub fn plain(host: &str, port: u16, dbname: &str, user: &str) -> ServerTarget {
        ServerTarget {
            host: host.into(),
            port,
            hosts: Arc::from([(host.to_owned(), port)]),
            attrs: Default::default(),
            balance: Default::default(),
            dbname: dbname.into(),
            user: user.into(),
            tls: Arc::new(crate::driver::tls_config::ServerTls {
                mode: crate::config::ServerTlsMode::Disable,
                config: None,
                channel_binding: ChannelBinding::Prefer,
            }),
            params: Vec::new(),
        }
    }
}

/// Where to send a CancelRequest for one server connection.
#[derive(Debug)]
pub struct CancelTarget {
    /// Host or socket directory.
    pub(crate) host: String,
    /// Port.
    pub(crate) port: u16,
    /// Backend pid.
    pub pid: i32,
    /// Backend secret key.
    pub(crate) key: Vec<u8>,
    /// Cancel requests forwarded to this backend and not yet finished. PostgreSQL cancels
    /// whatever the backend runs when the signal lands: while one is in flight the
    /// connection must not serve another client, or that client's query is cancelled.
    pub in_flight: std::sync::atomic::AtomicU32,
    /// Woken when `in_flight` drops to zero.
    pub settled: tokio::sync::Notify,
    /// A cancel request was forwarded to this backend since it was last given back: its
    /// signal may have landed after the query ended, and then cancels the next statement
    /// there (`ServerState::cancel_risk`).
    pub(crate) signalled: std::sync::atomic::AtomicBool,
    /// Other clients' batches are queued behind the one running (`driver::pipe`): a
    /// cancel must then signal the backend once only (`cancel::send`).
    pub(crate) behind: std::sync::atomic::AtomicBool,
    /// The server signals a backend once per CancelRequest (PostgreSQL 18 on; before, it
    /// signals the process and then its process group).
    pub(crate) signals_once: bool,
    /// What `SHOW SERVERS` shows of it.
    pub(crate) info: super::census::ServerInfo,
}

impl CancelTarget {
    /// Waits until no forwarded cancel request is in flight; false after `limit`.
    pub(crate) async fn wait_settled(&self, limit: Duration) -> bool {
        use std::sync::atomic::Ordering;
        let wait = async {
            loop {
                let n = self.settled.notified();
                if self.in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                n.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

/// An open, authenticated server connection.
#[derive(Debug)]
pub struct ServerConn {
    /// The socket.
    pub(crate) stream: Stream,
    /// Bytes read and not yet handled.
    pub(crate) rbuf: BytesMut,
    /// What the session layer keeps about it.
    pub(crate) state: ServerState,
    /// Every ParameterStatus received at startup.
    pub params: Vec<(String, String)>,
    /// How to cancel its queries.
    pub cancel: Arc<CancelTarget>,
    /// When it was opened.
    pub(crate) created: Instant,
    /// When it last went back to the pool.
    pub(crate) last_used: Instant,
    /// The batch in flight that may be pipelined behind: when it was written, and what
    /// its duration is recorded on.
    pub(crate) timing: Option<(Instant, crate::session::Timed)>,
    /// When bytes last came off the socket (`relay::read_available`): a batch's replies
    /// were in by then, however long its session took to get to them (what the batch's
    /// duration ends at, `timing`).
    pub(crate) read_at: Instant,
    /// Bytes of a large frame still to come that go straight to the client (or are
    /// dropped) as they arrive, not buffered whole (`Session::stream_server_frame`).
    pub(crate) streaming: usize,
    /// The budget taken for a large frame being read whole into `rbuf` (`driver::budget`).
    pub(crate) held: Option<crate::driver::budget::Reservation>,
    /// The worker thread whose event loop watches its socket (`pool::home`).
    pub(crate) home: u16,
}

/// Why a server connection could not be opened.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// Network failure or timeout (a retry may help).
    Io(String),
    /// The server answered with an ErrorResponse (frame bytes); pass it to the client.
    Server(Vec<u8>),
    /// Authentication could not be done with the credentials we have.
    Auth(String),
    /// TLS was required and could not be had (refused, or the certificate failed its check).
    Tls(String),
    /// None of several hosts could be had, or none has the role asked for: what each said.
    NoHost(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(m) | ConnectError::Auth(m) | ConnectError::Tls(m) | ConnectError::NoHost(m) => {
                f.write_str(m)
            }
            ConnectError::Server(frame) => write!(f, "{}", backend::ErrorText(frame.get(5..).unwrap_or_default())),
        }
    }
}

impl ConnectError {
    /// The error a client sees.
    pub(crate) fn to_error(&self) -> Error {
        match self {
            ConnectError::Io(m) => {
                Error::fatal(SqlState::CONNECTION_FAILURE, format!("could not connect to server: {m}"))
            }
            ConnectError::Server(frame) => {
                let b = frame.get(5..).unwrap_or_default();
                let code = backend::error_field(b, b'C').and_then(|c| std::str::from_utf8(c).ok()).unwrap_or("08006");
                let msg =
                    backend::error_field(b, b'M').map(|m| String::from_utf8_lossy(m).into_owned()).unwrap_or_default();
                let code = crate::error::SqlState(leak_code(code));
                Error::fatal(code, msg)
            }
            ConnectError::Auth(m) => Error::fatal(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, m.clone()),
            ConnectError::Tls(m) => {
                Error::fatal(SqlState::CONNECTION_FAILURE, format!("could not connect to server: {m}"))
            }
            ConnectError::NoHost(m) => Error::fatal(SqlState::CONNECTION_FAILURE, m.clone()),
        }
    }
}

/// SQLSTATEs we pass through are a small closed set in practice; map to a static str.
fn leak_code(code: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "22023", "42704", "55P02", "3D000", "28P01", "28000", "53300", "57P03", "42501", "08006", "08004", "0A000",
        "57P01",
    ];
    KNOWN.iter().copied().find(|k| *k == code).unwrap_or("08006")
}

async fn open(target: &ServerTarget) -> std::io::Result<Stream> {
    if target.host.starts_with('/') {
        let path = format!("{}/.s.PGSQL.{}", target.host, target.port);
        Ok(Stream::Unix(tokio::net::UnixStream::connect(path).await?))
    } else {
        let s = tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await?;
        s.set_nodelay(true)?;
        Ok(Stream::Tcp(s))
    }
}

/// Asks the server for TLS (SSLRequest) and, when it agrees, runs the handshake. A server
/// that refuses gets plaintext unless the sslmode requires TLS.
async fn start_tls(
    mut stream: Stream,
    cfg: Arc<rustls::ClientConfig>,
    target: &ServerTarget,
) -> Result<Stream, ConnectError> {
    let io = |e: std::io::Error| ConnectError::Io(format!("{}:{}: {e}", target.host, target.port));
    stream.write_all(&startup::SSL_REQUEST_BYTES).await.map_err(io)?;
    let mut answer = BytesMut::with_capacity(64);
    if stream.read_buf(&mut answer).await.map_err(io)? == 0 {
        return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    match answer[0] {
        b'S' if answer.len() == 1 => {
            let name = crate::driver::tls_config::server_name(&target.host).map_err(ConnectError::Tls)?;
            let tls = crate::driver::tls::connect(stream, cfg, name)
                .await
                .map_err(|e| ConnectError::Tls(format!("{}:{}: TLS: {e}", target.host, target.port)))?;
            Ok(Stream::Tls(Box::new(tls)))
        }
        // Bytes after 'S' came before the handshake: nobody can tell who sent them.
        b'S' => Err(ConnectError::Io(format!(
            "{}:{}: received unencrypted data after SSL response",
            target.host, target.port
        ))),
        b'N' if target.tls.mode.required() => Err(ConnectError::Tls(format!(
            "{}:{}: server does not support SSL, but SSL was required",
            target.host, target.port
        ))),
        b'N' => Ok(stream),
        _ => Err(ConnectError::Io(format!("{}:{}: invalid answer to SSLRequest", target.host, target.port))),
    }
}

/// Opens and authenticates one server connection within `timeout`.
pub(crate) async fn connect(
    target: &ServerTarget,
    creds: &Credentials,
    timeout: Duration,
) -> Result<ServerConn, ConnectError> {
    match tokio::time::timeout(timeout, connect_inner(target, creds)).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Io(format!("timeout after {} ms", timeout.as_millis()))),
    }
}

async fn connect_inner(target: &ServerTarget, creds: &Credentials) -> Result<ServerConn, ConnectError> {
    let io = |e: std::io::Error| ConnectError::Io(format!("{}:{}: {e}", target.host, target.port));
    let mut stream = open(target).await.map_err(io)?;
    if !matches!(stream, Stream::Unix(_))
        && let Some(tls) = &target.tls.config
    {
        stream = start_tls(stream, tls.clone(), target).await?;
    }
    let mut out = BytesMut::with_capacity(256);
    let mut params = vec![("user", target.user.as_str()), ("database", target.dbname.as_str())];
    params.extend(target.params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    startup::startup_message(&mut out, &params);
    stream.write_all(&out).await.map_err(io)?;
    out.clear();
    let mut rbuf = BytesMut::with_capacity(4096);
    let binding = Binding {
        mode: target.tls.channel_binding,
        tls: matches!(stream, Stream::Tls(_)),
        end_point: match &stream {
            Stream::Tls(t) => t.peer_end_point(),
            _ => None,
        },
    };
    let mut scram: Option<ScramClient> = None;
    let mut params = Vec::new();
    let mut state = ServerState::default();
    let mut cancel = (0, Vec::new());
    loop {
        let frame = read_frame(&mut stream, &mut rbuf).await.map_err(io)?;
        let b = body(&frame);
        match frame[0] {
            tags::AUTHENTICATION => {
                let code = backend::read_i32(b).unwrap_or(-1);
                let reply = auth_reply(code, &b[4.min(b.len())..], target, creds, &binding, &mut scram)?;
                if let Some(reply) = reply {
                    stream.write_all(&reply).await.map_err(io)?;
                }
            }
            tags::PARAMETER_STATUS => {
                if let Some((k, v)) = backend::parameter_status_fields(b) {
                    if let Some(name) = tracked_name(k) {
                        state.settings.set_reported(name, v);
                    }
                    params.push((k.to_owned(), v.to_owned()));
                }
            }
            tags::BACKEND_KEY_DATA => {
                if b.len() >= 8 {
                    cancel = (backend::read_i32(b).unwrap_or(0), b[4..].to_vec());
                }
            }
            tags::ERROR_RESPONSE => return Err(ConnectError::Server(frame.to_vec())),
            tags::NOTICE_RESPONSE | tags::NEGOTIATE_PROTOCOL_VERSION => {}
            tags::READY_FOR_QUERY => break,
            t => {
                return Err(ConnectError::Io(format!("unexpected message {:?} during server login", t as char)));
            }
        }
    }
    state.tx_status = TxStatus::Idle;
    let major = params.iter().find(|(k, _)| k == "server_version").map_or(0, |(_, v)| major_version(v));
    let now = Instant::now();
    let info = super::census::ServerInfo::new(super::census::Endpoints::of(&stream));
    Ok(ServerConn {
        stream,
        rbuf,
        state,
        params,
        cancel: Arc::new(CancelTarget {
            host: target.host.clone(),
            port: target.port,
            pid: cancel.0,
            key: cancel.1,
            in_flight: Default::default(),
            settled: Default::default(),
            signalled: Default::default(),
            behind: Default::default(),
            signals_once: major >= 18,
            info,
        }),
        created: now,
        last_used: now,
        timing: None,
        read_at: now,
        streaming: 0,
        held: None,
        home: crate::pool::home::here(),
    })
}

/// The major version in a `server_version` value ("15.4 (Debian …)", "18.6"); 0 if none.
fn major_version(v: &str) -> u32 {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    v[..digits].parse().unwrap_or(0)
}

/// Reads one whole frame (login phase only; servers are trusted up to 1 GiB).
pub(crate) async fn read_frame(stream: &mut Stream, rbuf: &mut BytesMut) -> std::io::Result<BytesMut> {
    loop {
        match split_frame(rbuf, 1 << 30) {
            Ok(Some(n)) => return Ok(rbuf.split_to(n)),
            Ok(None) => {}
            Err(e) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()));
            }
        }
        rbuf.reserve(4096);
        if stream.read_buf(rbuf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

impl ServerConn {
    /// False if the server closed the connection or sent something while idle (e.g. a
    /// FATAL on shutdown), as far as can be told without blocking.
    pub(crate) fn is_healthy(&mut self) -> bool {
        if !self.rbuf.is_empty() || self.streaming != 0 {
            return false;
        }
        self.rbuf.reserve(64);
        matches!(self.stream.try_read_buf(&mut self.rbuf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// What it sent while idle (read by `is_healthy`) says its server is going down
    /// (`backend::says_going_down`). The last frame may be read only in part: the SQLSTATE
    /// comes early in it.
    pub(crate) fn says_going_down(&self) -> bool {
        let mut rest = &self.rbuf[..];
        while let [tag, a, b, c, d, ..] = *rest {
            let end = (1 + u32::from_be_bytes([a, b, c, d]) as usize).min(rest.len()).max(5);
            if matches!(tag, tags::ERROR_RESPONSE | tags::NOTICE_RESPONSE) && backend::says_going_down(&rest[5..end]) {
                return true;
            }
            rest = &rest[end..];
        }
        false
    }

    /// Whether the server closed the connection (end of stream, or a reset), as far as can
    /// be told without blocking; what it sent before is read and dropped with it.
    pub(crate) fn peer_closed(&mut self) -> bool {
        for _ in 0..4 {
            self.rbuf.clear();
            self.rbuf.reserve(4096);
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
            }
        }
        false
    }

    /// Says goodbye (Terminate) and closes the connection, without waiting long.
    pub(crate) async fn terminate(mut self: Box<Self>) {
        let mut out = BytesMut::with_capacity(5);
        frontend::terminate(&mut out);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.stream.write_all(&out)).await;
    }

    /// Consumes the bytes of whole frames at the start of `rbuf` (after handling).
    pub(crate) fn consume(&mut self, n: usize) {
        self.rbuf.advance(n);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn major_version_of_server_version_values() {
        assert_eq!(super::major_version("15.14 (Debian 15.14-0+deb12u1)"), 15);
        assert_eq!(super::major_version("18.6"), 18);
        assert_eq!(super::major_version("9.6.24"), 9);
        assert_eq!(super::major_version("devel"), 0);
        assert_eq!(super::major_version(""), 0);
    }
}
