//! A TCP or unix-domain socket behind one type, with the readiness-based calls the proxy
//! loop uses (wait, then read or write without blocking).

use bytes::BytesMut;
use std::io;
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};

/// A connected socket.
#[derive(Debug)]
pub enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// Unix domain socket.
    Unix(UnixStream),
}

macro_rules! each {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            Stream::Tcp($s) => $e,
            Stream::Unix($s) => $e,
        }
    };
}

impl Stream {
    /// Waits until the socket may be read.
    pub async fn readable(&self) -> io::Result<()> {
        each!(self, s => s.readable().await)
    }
    /// Waits until the socket may be written.
    pub async fn writable(&self) -> io::Result<()> {
        each!(self, s => s.writable().await)
    }
    /// Polls for read readiness. Keeps one waker per socket (the owner's), so waiting costs
    /// no future and no entry in the socket's waiter list.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_read_ready(cx))
    }
    /// Polls for write readiness (see `poll_read_ready`).
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_write_ready(cx))
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
        })
    }
    /// Writes what the socket takes without blocking.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        each!(self, s => s.try_write(buf))
    }
    /// Reads at least one byte (0 = end of stream).
    pub(crate) async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        each!(self, s => s.read_buf(buf).await)
    }
    /// Writes all of `buf`.
    pub(crate) async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        each!(self, s => s.write_all(buf).await)
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
