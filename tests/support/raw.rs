//! A hand-rolled v3 protocol client for protocol-level tests.

#![allow(dead_code)]

use super::*;
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One backend message.
#[derive(Clone, Debug)]
pub struct Frame {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl Frame {
    /// The fields of an ErrorResponse ('E') or NoticeResponse ('N').
    pub fn fields(&self) -> Option<PgError> {
        if self.tag != b'E' && self.tag != b'N' {
            return None;
        }
        Some(PgError::parse(&self.body))
    }
}

/// A parsed ErrorResponse.
#[derive(Clone, Debug, Default)]
pub struct PgError {
    pub fields: HashMap<u8, String>,
}

impl PgError {
    fn parse(body: &[u8]) -> PgError {
        let mut fields = HashMap::new();
        let mut rest = body;
        while let Some((&t, r)) = rest.split_first() {
            if t == 0 {
                break;
            }
            let end = r.iter().position(|&b| b == 0).unwrap_or(r.len());
            fields.insert(t, String::from_utf8_lossy(&r[..end]).into_owned());
            rest = r.get(end + 1..).unwrap_or(&[]);
        }
        PgError { fields }
    }

    pub fn code(&self) -> &str {
        self.fields.get(&b'C').map(String::as_str).unwrap_or("")
    }

    pub fn severity(&self) -> &str {
        self.fields.get(&b'V').or_else(|| self.fields.get(&b'S')).map(String::as_str).unwrap_or("")
    }

    pub fn message(&self) -> &str {
        self.fields.get(&b'M').map(String::as_str).unwrap_or("")
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code(), self.severity(), self.message())
    }
}

/// How a read sequence ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// ReadyForQuery with this status byte.
    Ready(u8),
    /// The peer closed the connection (or reset it).
    Closed,
}

/// A raw v3 protocol connection.
pub struct Raw {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// ParameterStatus values received.
    pub params: HashMap<String, String>,
    /// BackendKeyData (pid, key), if received.
    pub key: Option<(i32, i32)>,
    /// Authentication request codes received (0 = ok, 3 = cleartext, 5 = md5, 10 = SASL, ...).
    pub auth_requests: Vec<i32>,
}

/// `tag + len + body`.
pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(body.len() + 5);
    m.push(tag);
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// A v3.0 StartupMessage with these parameters.
pub fn startup_packet(params: &[(&str, &str)]) -> Vec<u8> {
    startup_packet_version(196608, params)
}

/// A StartupMessage with an arbitrary protocol code.
pub fn startup_packet_version(code: u32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    m.extend_from_slice(&body);
    m
}

/// A simple Query message.
pub fn query_msg(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    msg(b'Q', &body)
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

impl Raw {
    /// Connects to 127.0.0.1:`port`.
    pub async fn tcp(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
        stream.set_nodelay(true).ok();
        Raw { stream, buf: Vec::new(), params: HashMap::new(), key: None, auth_requests: Vec::new() }
    }

    /// Connects to 127.0.0.1:`port` from `source` (any 127.x.y.z address: the whole of
    /// 127/8 is the loopback), so the server sees that client address.
    pub async fn tcp_from(source: &str, port: u16) -> Raw {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        let src: std::net::IpAddr = source.parse().expect("an IPv4 address");
        socket.bind((src, 0).into()).unwrap_or_else(|e| panic!("binding {source}: {e}"));
        let stream = socket
            .connect(([127, 0, 0, 1], port).into())
            .await
            .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port} from {source}: {e}"));
        stream.set_nodelay(true).ok();
        Raw { stream, buf: Vec::new(), params: HashMap::new(), key: None, auth_requests: Vec::new() }
    }

    /// Writes bytes; Err if the peer is gone.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    }

    /// One byte (the answer to SSLRequest); None on EOF.
    pub async fn read_byte(&mut self) -> Option<u8> {
        if !self.fill(1).await {
            return None;
        }
        Some(self.buf.remove(0))
    }

    /// The next message; None once the peer has closed (or reset) the connection.
    pub async fn read_frame(&mut self) -> Option<Frame> {
        if !self.fill(5).await {
            return None;
        }
        let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
        assert!(
            (4..=64 << 20).contains(&len),
            "implausible backend message length {len} (tag {:?})",
            self.buf[0] as char
        );
        if !self.fill(1 + len).await {
            return None;
        }
        let body = self.buf[5..1 + len].to_vec();
        let tag = self.buf[0];
        self.buf.drain(..1 + len);
        match tag {
            b'S' => {
                let parts: Vec<&[u8]> = body.split(|&b| b == 0).collect();
                if parts.len() >= 2 {
                    self.params.insert(
                        String::from_utf8_lossy(parts[0]).into_owned(),
                        String::from_utf8_lossy(parts[1]).into_owned(),
                    );
                }
            }
            b'K' if body.len() >= 8 => {
                self.key = Some((
                    i32::from_be_bytes(body[0..4].try_into().unwrap()),
                    i32::from_be_bytes(body[4..8].try_into().unwrap()),
                ));
            }
            _ => {}
        }
        Some(Frame { tag, body })
    }

    /// Reads frames until ReadyForQuery or the end of the connection.
    pub async fn read_until_ready(&mut self) -> (Vec<Frame>, End) {
        let mut frames = Vec::new();
        loop {
            match self.read_frame().await {
                None => return (frames, End::Closed),
                Some(f) if f.tag == b'Z' => {
                    let status = f.body.first().copied().unwrap_or(0);
                    frames.push(f);
                    return (frames, End::Ready(status));
                }
                Some(f) => frames.push(f),
            }
        }
    }

    /// Reads frames until the peer closes; panics if that takes longer than `dur`.
    pub async fn read_until_closed(&mut self, dur: Duration) -> Vec<Frame> {
        let mut frames = Vec::new();
        let r = within(dur, async {
            while let Some(f) = self.read_frame().await {
                frames.push(f);
            }
        })
        .await;
        if r.is_err() {
            panic!("connection not closed within {dur:?}; frames so far: {}", summarize(&frames));
        }
        frames
    }

    /// Expects an ErrorResponse followed by the connection closing (within `dur`); returns it.
    pub async fn expect_error_and_close(&mut self, dur: Duration, context: &str) -> PgError {
        let frames = within(dur, async {
            let mut frames = Vec::new();
            while let Some(f) = self.read_frame().await {
                frames.push(f);
            }
            frames
        })
        .await
        .unwrap_or_else(|e| panic!("{context}: connection not closed: {e}"));
        frames.iter().find(|f| f.tag == b'E').and_then(Frame::fields).unwrap_or_else(|| {
            panic!("{context}: connection closed without an ErrorResponse; got {}", summarize(&frames))
        })
    }

    /// Sends a StartupMessage and authenticates (cleartext, md5 or SCRAM-SHA-256 as asked)
    /// until ReadyForQuery. Err with the server's error.
    pub async fn startup(&mut self, params: &[(&str, &str)], password: Option<&str>) -> Result<(), PgError> {
        let user = params.iter().find(|(k, _)| *k == "user").map(|(_, v)| *v).unwrap_or("");
        self.send(&startup_packet(params)).await.map_err(|e| io_err(&e.to_string()))?;
        let mut scram: Option<ScramState> = None;
        loop {
            let Some(f) = self.read_frame().await else {
                return Err(io_err("connection closed during startup"));
            };
            match f.tag {
                b'E' => return Err(f.fields().unwrap()),
                b'Z' => return Ok(()),
                b'R' => {
                    let code = i32::from_be_bytes(f.body[0..4].try_into().unwrap());
                    self.auth_requests.push(code);
                    let pw = || password.ok_or_else(|| io_err("password requested but none given"));
                    match code {
                        0 => {}
                        3 => {
                            let m = msg(b'p', &cstr(pw()?));
                            self.send(&m).await.map_err(|e| io_err(&e.to_string()))?;
                        }
                        5 => {
                            let salt = &f.body[4..8];
                            let m = msg(b'p', &cstr(&md5_response(user, pw()?, salt)));
                            self.send(&m).await.map_err(|e| io_err(&e.to_string()))?;
                        }
                        10 => {
                            let mechs = String::from_utf8_lossy(&f.body[4..]).into_owned();
                            if !mechs.split('\0').any(|m| m == "SCRAM-SHA-256") {
                                return Err(io_err(&format!("no SCRAM-SHA-256 in {mechs:?}")));
                            }
                            let state = ScramState::new(pw()?);
                            let first = state.client_first();
                            let mut body = cstr("SCRAM-SHA-256");
                            body.extend_from_slice(&(first.len() as i32).to_be_bytes());
                            body.extend_from_slice(first.as_bytes());
                            self.send(&msg(b'p', &body)).await.map_err(|e| io_err(&e.to_string()))?;
                            scram = Some(state);
                        }
                        11 => {
                            let state = scram.as_mut().ok_or_else(|| io_err("SASLContinue without SASL"))?;
                            let fin = state.client_final(&String::from_utf8_lossy(&f.body[4..]))?;
                            self.send(&msg(b'p', fin.as_bytes())).await.map_err(|e| io_err(&e.to_string()))?;
                        }
                        12 => {
                            let state = scram.as_ref().ok_or_else(|| io_err("SASLFinal without SASL"))?;
                            state.verify_server(&String::from_utf8_lossy(&f.body[4..]))?;
                        }
                        other => return Err(io_err(&format!("unsupported auth request {other}"))),
                    }
                }
                _ => {}
            }
        }
    }

    /// Runs a simple query; rows as text (NULL = None) of the last result set, or the error.
    /// Reads until ReadyForQuery (an error frame followed by close is returned as the error).
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, PgError> {
        self.send(&query_msg(sql)).await.map_err(|e| io_err(&format!("sending query: {e}")))?;
        let (frames, end) = self.read_until_ready().await;
        if let Some(e) = frames.iter().find(|f| f.tag == b'E') {
            return Err(e.fields().unwrap());
        }
        if end == End::Closed {
            return Err(io_err(&format!("connection closed before ReadyForQuery; got {}", summarize(&frames))));
        }
        let mut rows = Vec::new();
        for f in frames {
            match f.tag {
                b'T' => rows.clear(),
                b'D' => rows.push(parse_data_row(&f.body)),
                _ => {}
            }
        }
        Ok(rows)
    }

    /// First column of the first row.
    pub async fn scalar(&mut self, sql: &str) -> Result<Option<String>, PgError> {
        let rows = self.simple_query(sql).await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next()).flatten())
    }
}

fn parse_data_row(body: &[u8]) -> Vec<Option<String>> {
    let n = i16::from_be_bytes(body[0..2].try_into().unwrap()) as usize;
    let mut pos = 2;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes(body[pos..pos + 4].try_into().unwrap());
        pos += 4;
        if len < 0 {
            out.push(None);
        } else {
            let len = len as usize;
            out.push(Some(String::from_utf8_lossy(&body[pos..pos + len]).into_owned()));
            pos += len;
        }
    }
    out
}

/// A short description of frames, for failure messages.
pub fn summarize(frames: &[Frame]) -> String {
    let parts: Vec<String> = frames
        .iter()
        .map(|f| match f.fields() {
            Some(e) => format!("{}[{e}]", f.tag as char),
            None => format!("{}", f.tag as char),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

pub(crate) fn io_err(text: &str) -> PgError {
    let mut fields = HashMap::new();
    fields.insert(b'C', "(client)".to_string());
    fields.insert(b'M', text.to_string());
    PgError { fields }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
