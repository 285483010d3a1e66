//! TLS on a client or server socket: rustls's sans-IO connection driven by the same
//! readiness calls as a plain socket, so the proxy loop polls, then reads or writes without
//! blocking whether a socket is encrypted or not (`stream::Stream::Tls`).
//!
//! Owns: the handshakes (accepting a client's, opening a server's) and moving ciphertext
//! between a socket and rustls. Must not touch the protocol: what goes in and out of it is
//! PostgreSQL's bytes, which the callers handle as on a plain socket.

use super::stream::Stream;
use rustls::Connection;
use std::io::{self, Read, Write};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};

/// Plaintext bytes accepted per write: one TLS record's worth (16 KiB) times four, so a
/// large reply is encrypted and sent in a few calls rather than buffered whole.
const WRITE_CHUNK: usize = 64 * 1024;

/// An encrypted socket. The rustls state sits behind a mutex only so the stream can be
/// used through `&self` like a plain socket; one task uses it at a time (uncontended).
#[derive(Debug)]
pub(crate) struct TlsStream {
    sock: Stream,
    state: Mutex<TlsState>,
}

#[derive(Debug)]
struct TlsState {
    conn: Connection,
    /// Plaintext decrypted and not yet read.
    plain: usize,
    /// Plaintext bytes taken by the last write whose ciphertext is not all on the socket
    /// yet: reported written once it is (the caller offers the same bytes again meanwhile).
    unflushed: usize,
    /// The peer ended the stream (close_notify or the socket's end).
    closed: bool,
}

/// Reads from a socket without blocking (`WouldBlock` when it has nothing).
struct SockIo<'a>(&'a Stream);

impl Read for SockIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.plain_try_read(buf)
    }
}

impl Write for SockIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TlsStream {
    fn lock(&self) -> MutexGuard<'_, TlsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The negotiated ALPN protocol.
    pub(crate) fn alpn(&self) -> Option<Vec<u8>> {
        self.lock().conn.alpn_protocol().map(<[u8]>::to_vec)
    }

    /// The `tls-server-end-point` channel-binding hash of the peer's certificate (a server's:
    /// the first certificate it showed); None without one or with an unusable algorithm.
    pub(crate) fn peer_end_point(&self) -> Option<Vec<u8>> {
        let g = self.lock();
        let cert = g.conn.peer_certificates()?.first()?;
        crate::auth::tls_server_end_point(cert)
    }

    /// The common name of the certificate the peer showed (a client's: verified by the
    /// handshake against `client_tls_ca_file`); None without one.
    pub(crate) fn peer_common_name(&self) -> Option<String> {
        let g = self.lock();
        super::tls_config::common_name(g.conn.peer_certificates()?.first()?)
    }

    /// Protocol version and cipher suite, as `SHOW CLIENTS` shows them.
    pub(crate) fn description(&self) -> String {
        let g = self.lock();
        let version = g.conn.protocol_version().and_then(|v| v.as_str()).unwrap_or("TLS");
        let suite = g.conn.negotiated_cipher_suite().and_then(|s| s.suite().as_str()).unwrap_or("");
        format!("{version}/{suite}")
    }

    /// The underlying socket.
    pub(crate) fn socket(&self) -> &Stream {
        &self.sock
    }

    /// The socket under the encryption, to move it (`Stream::rehome`).
    pub(crate) fn socket_mut(&mut self) -> &mut Stream {
        &mut self.sock
    }

    /// Ready to read: plaintext is waiting, the peer closed, or the socket has bytes.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        {
            let g = self.lock();
            if g.plain > 0 || g.closed {
                return Poll::Ready(Ok(()));
            }
        }
        self.sock.poll_read_ready(cx)
    }

    /// Decrypts what is available into `buf` without blocking (0: end of stream).
    pub(crate) fn try_read_buf(&self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
        if buf.capacity() == buf.len() {
            buf.reserve(4096);
        }
        let mut g = self.lock();
        loop {
            if g.plain > 0 {
                let start = buf.len();
                let want = (buf.capacity() - start).min(g.plain);
                buf.resize(start + want, 0);
                let n = match g.conn.reader().read(&mut buf[start..]) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => {
                        buf.truncate(start);
                        return Err(e);
                    }
                };
                buf.truncate(start + n);
                g.plain -= n.min(g.plain);
                if n > 0 {
                    return Ok(n);
                }
            }
            if g.closed {
                return Ok(0);
            }
            g.read_records(&self.sock)?;
        }
    }

    /// Encrypts and writes without blocking. `Ok(n)` once the ciphertext of `n` bytes is on
    /// the socket; `WouldBlock` while some of it is not (then offer the same bytes again).
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut g = self.lock();
        let st = &mut *g;
        flush_tls(st, &self.sock)?;
        if st.unflushed > 0 {
            return Ok(std::mem::take(&mut st.unflushed));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let n = st.conn.writer().write(&buf[..buf.len().min(WRITE_CHUNK)])?;
        match flush_tls(st, &self.sock) {
            Ok(()) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                st.unflushed = n;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

impl TlsState {
    /// Reads what ciphertext the socket has (`WouldBlock`: none; a read that finds nothing
    /// clears the socket's readiness) and decrypts it: `plain` and `closed` say what came.
    /// Whatever the records called for (an alert, a key update) is sent now if the socket
    /// takes it, else with the next write; a record that breaks the connection gets its
    /// alert out before the error.
    fn read_records(&mut self, sock: &Stream) -> io::Result<()> {
        let got = self.conn.read_tls(&mut SockIo(sock))?;
        let io_state = self.conn.process_new_packets();
        let _ = flush_tls(self, sock);
        let io_state = io_state.map_err(tls_err)?;
        self.plain = io_state.plaintext_bytes_to_read();
        self.closed |= got == 0 || io_state.peer_has_closed();
        Ok(())
    }
}

/// Writes the pending ciphertext; `WouldBlock` when the socket takes no more now.
fn flush_tls(st: &mut TlsState, sock: &Stream) -> io::Result<()> {
    while st.conn.wants_write() {
        if st.conn.write_tls(&mut SockIo(sock))? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// Runs a handshake to its end on `sock`; `initial`: bytes of it already read (a direct
/// TLS ClientHello).
async fn handshake(sock: Stream, mut conn: Connection, mut initial: &[u8]) -> io::Result<TlsStream> {
    while !initial.is_empty() {
        conn.read_tls(&mut initial)?;
        conn.process_new_packets().map_err(tls_err)?;
    }
    let mut st = TlsState { conn, plain: 0, unflushed: 0, closed: false };
    loop {
        match flush_tls(&mut st, &sock) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::future::poll_fn(|cx| sock.poll_write_ready(cx)).await?;
                continue;
            }
            Err(e) => return Err(e),
        }
        if !st.conn.is_handshaking() {
            break;
        }
        std::future::poll_fn(|cx| sock.poll_read_ready(cx)).await?;
        match st.read_records(&sock) {
            // A peer may finish the handshake, send its request and close in one flight (a
            // CancelRequest over TLS): the handshake is done, the plaintext waits to be read.
            Ok(()) if st.closed && st.conn.is_handshaking() => return Err(io::ErrorKind::UnexpectedEof.into()),
            // Nothing more to write to a peer that has gone (a session ticket would only fail).
            Ok(()) if st.closed => break,
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
    }
    Ok(TlsStream { sock, state: Mutex::new(st) })
}

/// Accepts a client's TLS handshake.
pub(crate) async fn accept(
    sock: Stream,
    cfg: std::sync::Arc<rustls::ServerConfig>,
    initial: &[u8],
) -> io::Result<TlsStream> {
    let conn = rustls::ServerConnection::new(cfg).map_err(tls_err)?;
    handshake(sock, Connection::Server(conn), initial).await
}

/// Opens TLS to a server named `name`.
pub(crate) async fn connect(
    sock: Stream,
    cfg: std::sync::Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
) -> io::Result<TlsStream> {
    let conn = rustls::ClientConnection::new(cfg, name).map_err(tls_err)?;
    handshake(sock, Connection::Client(conn), &[]).await
}
