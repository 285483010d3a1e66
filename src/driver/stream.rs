//! A TCP or unix-domain socket, plain or encrypted (`driver::tls`), behind one type, with
//! the readiness-based calls the proxy loop uses (wait, then read or write without
//! blocking).

use bytes::BytesMut;
use std::io;
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};

use super::tls::TlsStream;

/// The name of user `uid` (getpwuid_r), None when it has none.
fn user_name(uid: u32) -> Option<String> {
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to a live local of the size given; the result's strings
    // point into `buf`, read before it is dropped.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded: pw_name is a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// A connected socket.
#[derive(Debug)]
pub(crate) enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// Unix domain socket.
    Unix(UnixStream),
    /// TLS over one of the above.
    Tls(Box<TlsStream>),
    /// Nothing: a stream moved out (into TLS) leaves this behind for a moment.
    Closed,
}

/// Runs `$e` on the plain socket; `$tls` for TLS; NotConnected when closed.
macro_rules! each {
    ($self:expr, $s:ident => $e:expr, $t:ident => $tls:expr) => {
        match $self {
            Stream::Tcp($s) => $e,
            Stream::Unix($s) => $e,
            Stream::Tls($t) => $tls,
            Stream::Closed => Err(io::ErrorKind::NotConnected.into()),
        }
    };
}

impl Stream {
    /// Polls for read readiness. Keeps one waker per socket (the owner's), so waiting costs
    /// no future and no entry in the socket's waiter list.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
            Stream::Tls(t) => t.poll_read_ready(cx),
            Stream::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
    /// Polls for write readiness (see `poll_read_ready`).
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_write_ready(cx),
            Stream::Unix(s) => s.poll_write_ready(cx),
            Stream::Tls(t) => t.socket().poll_write_ready(cx),
            Stream::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
    /// Reads from the socket itself (ciphertext under TLS) without blocking.
    pub(crate) fn plain_try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        each!(self, s => s.try_read(buf), t => t.socket().plain_try_read(buf))
    }
    /// True for a unix-domain socket (plain or encrypted).
    pub(crate) fn is_unix(&self) -> bool {
        match self {
            Stream::Unix(_) => true,
            Stream::Tls(t) => t.socket().is_unix(),
            _ => false,
        }
    }
    /// The peer's address as PostgreSQL's messages name it ("[local]" for a unix socket).
    pub(crate) fn peer_host(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default(),
            Stream::Tls(t) => t.socket().peer_host(),
            Stream::Unix(_) | Stream::Closed => "[local]".into(),
        }
    }
    /// The peer's IP address (None: a unix socket, or unknown).
    pub(crate) fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            Stream::Tls(t) => t.socket().peer_ip(),
            Stream::Unix(_) | Stream::Closed => None,
        }
    }
    /// On a unix socket, the name of the operating-system user of the peer process (its
    /// SO_PEERCRED uid looked up in the user database).
    pub(crate) fn peer_os_user(&self) -> Option<String> {
        match self {
            Stream::Unix(s) => s.peer_cred().ok().and_then(|c| user_name(c.uid())),
            Stream::Tls(t) => t.socket().peer_os_user(),
            Stream::Tcp(_) | Stream::Closed => None,
        }
    }
    /// The socket's descriptor (`census::Endpoints` asks it for addresses when listed).
    pub(crate) fn raw_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Tcp(s) => Some(s.as_raw_fd()),
            Stream::Unix(s) => Some(s.as_raw_fd()),
            Stream::Tls(t) => t.socket().raw_fd(),
            Stream::Closed => None,
        }
    }
    /// TLS in use, as `SHOW CLIENTS` shows it ("TLSv1.3/TLS13_AES_256_GCM_SHA384"); None
    /// for plaintext.
    pub(crate) fn tls_description(&self) -> Option<String> {
        match self {
            Stream::Tls(t) => Some(t.description()),
            _ => None,
        }
    }
    /// Reads what is available into `buf` without blocking.
    ///
    /// A read that does not fill the buffer has drained the socket, so it also clears
    /// tokio's read readiness (as `AsyncRead::poll_read` does; `try_read*` alone clears it
    /// only on `WouldBlock`). Otherwise the next `readable()` returns at once and costs a
    /// wasted wakeup and an `EAGAIN` read per batch. The tick check in tokio keeps this
    /// race-free: readiness reported after the read is not cleared.
    pub(crate) fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let spare = buf.capacity() - buf.len();
        if let Stream::Tls(t) = self {
            return t.try_read_buf(buf);
        }
        each!(self, s => {
            let mut got = None;
            let r = s.try_io(Interest::READABLE, || {
                let n = s.try_read_buf(buf)?;
                got = Some(n);
                if n > 0 && n < spare { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            });
            match got {
                Some(n) => Ok(n),
                None => r,
            }
        }, _t => unreachable!("handled above"))
    }
    /// Writes what the socket takes without blocking.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        each!(self, s => s.try_write(buf), t => t.try_write(buf))
    }
    /// Reads at least one byte (0 = end of stream).
    pub(crate) async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if let Stream::Tls(t) = self {
            loop {
                match t.try_read_buf(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::future::poll_fn(|cx| t.poll_read_ready(cx)).await?;
                    }
                    r => return r,
                }
            }
        }
        each!(self, s => s.read_buf(buf).await, _t => unreachable!("handled above"))
    }
    /// Writes all of `buf`.
    pub(crate) async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Stream::Tls(t) = self {
            let mut at = 0;
            // (`Ok(n)` comes once the ciphertext of those bytes is on the socket.)
            while at < buf.len() {
                match t.try_write(&buf[at..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => at += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::future::poll_fn(|cx| t.socket().poll_write_ready(cx)).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok(());
        }
        each!(self, s => s.write_all(buf).await, _t => unreachable!("handled above"))
    }
    /// Moves the socket's registration to the current thread's event loop (`shards`): its
    /// events then wake this thread directly. Two `epoll_ctl` calls; what is already
    /// readable is reported again by the new registration.
    pub(crate) fn rehome(&mut self) -> io::Result<()> {
        *self = match std::mem::replace(self, Stream::Closed) {
            Stream::Tcp(s) => Stream::Tcp(TcpStream::from_std(s.into_std()?)?),
            Stream::Unix(s) => Stream::Unix(UnixStream::from_std(s.into_std()?)?),
            Stream::Tls(mut t) => {
                t.socket_mut().rehome()?;
                Stream::Tls(t)
            }
            Stream::Closed => Stream::Closed,
        };
        Ok(())
    }
    /// Disables Nagle on TCP.
    pub(crate) fn set_nodelay(&self) {
        if let Stream::Tcp(s) = self {
            let _ = s.set_nodelay(true);
        }
    }
    /// Writes as much of `buf` as the socket takes now, removing it from `buf`.
    /// `Ok(true)` when `buf` is now empty.
    pub(crate) fn flush_some(&self, buf: &mut BytesMut) -> io::Result<bool> {
        while !buf.is_empty() {
            match self.try_write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    bytes::Buf::advance(buf, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        buf.clear();
        Ok(true)
    }
}
