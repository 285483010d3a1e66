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
    /// Whether `flush_some_more` can hold bytes back here: plain TCP only.
    pub(crate) fn can_cork(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }
    /// Like `flush_some`, with `MSG_MORE` on plain TCP: the kernel keeps what does not
    /// fill a segment until the next write without it, or `push` (about 200 ms at worst,
    /// when nothing else comes). Elsewhere it is `flush_some`.
    pub(crate) fn flush_some_more(&self, buf: &mut BytesMut) -> io::Result<bool> {
        let Stream::Tcp(s) = self else { return self.flush_some(buf) };
        use std::os::fd::AsRawFd;
        let fd = s.as_raw_fd();
        drain(buf, |b| {
            s.try_io(Interest::WRITABLE, || {
                // SAFETY: `b` is a live, initialised slice of the length given; `fd` is
                // this socket's descriptor, open while `s` is.
                let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_MORE | libc::MSG_NOSIGNAL) };
                if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
            })
        })
    }
    /// Sends at once what `flush_some_more` left in the kernel: setting `TCP_NODELAY`
    /// again pushes the pending segments out.
    pub(crate) fn push(&self) {
        self.set_nodelay();
    }
    /// Writes as much of `buf` as the socket takes now, removing it from `buf`.
    /// `Ok(true)` when `buf` is now empty.
    pub(crate) fn flush_some(&self, buf: &mut BytesMut) -> io::Result<bool> {
        drain(buf, |b| self.try_write(b))
    }
}

/// Writes `buf` with `write` until it is empty (`Ok(true)`) or the socket takes no more
/// (`Ok(false)`), removing what was written.
fn drain(buf: &mut BytesMut, mut write: impl FnMut(&[u8]) -> io::Result<usize>) -> io::Result<bool> {
    while !buf.is_empty() {
        match write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes::Buf::advance(buf, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    buf.clear();
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Bytes in the socket's send queue not sent yet (`SIOCOUTQNSD`, linux/sockios.h).
    fn unsent(s: &Stream) -> i32 {
        const SIOCOUTQNSD: libc::c_ulong = 0x894B;
        let mut n: libc::c_int = -1;
        let fd = s.raw_fd().expect("a socket");
        // SAFETY: the ioctl writes one int to `n`, a live local.
        let rc = unsafe { libc::ioctl(fd, SIOCOUTQNSD as _, &mut n) };
        assert_eq!(rc, 0, "SIOCOUTQNSD: {}", io::Error::last_os_error());
        n
    }

    /// A loopback TCP pair: ours as a `Stream` (Nagle off, as every connection parsnip
    /// opens), the peer's a blocking std socket.
    async fn pair() -> (Stream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let s = Stream::Tcp(ours);
        s.set_nodelay();
        (s, peer)
    }

    #[tokio::test]
    async fn bytes_written_with_more_wait_for_the_next_write_and_go_in_one_segment() {
        let (s, mut peer) = pair().await;
        assert!(s.can_cork());
        let mut first = BytesMut::from(&b"first;"[..]);
        assert!(s.flush_some_more(&mut first).unwrap());
        assert!(first.is_empty());
        assert_eq!(unsent(&s), 6, "held in the kernel, not sent");
        let mut second = BytesMut::from(&b"second"[..]);
        assert!(s.flush_some(&mut second).unwrap());
        assert_eq!(unsent(&s), 0, "a write without MSG_MORE sends both");
        let mut got = [0u8; 64];
        let n = peer.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"first;second", "one segment, one read");
    }

    #[tokio::test]
    async fn push_sends_what_waited() {
        let (s, mut peer) = pair().await;
        let mut b = BytesMut::from(&b"held"[..]);
        assert!(s.flush_some_more(&mut b).unwrap());
        assert_eq!(unsent(&s), 4);
        s.push();
        assert_eq!(unsent(&s), 0, "pushed out at once");
        let mut got = [0u8; 16];
        let n = peer.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"held");
    }
}
