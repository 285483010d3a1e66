//! The floor of a TCP hop: a relay that copies bytes between each client and its own
//! upstream connection and does nothing else (no protocol, no pooling), on one thread, with
//! the syscalls of a proxy at its best: one read per readable socket (a short read clears
//! the readiness, as parsnip's `driver::stream` does) and one write per read. `bench/run.py
//! --systems relay` runs it beside parsnip: its CPU per transaction is what any proxy on
//! this machine pays the kernel for the extra hop, so parsnip's CPU above it is parsnip's
//! own (docs/benchmarks.md "The hop's floor").
//!
//! Usage: `relay LISTEN_ADDR UPSTREAM` (UPSTREAM: `host:port`, or a unix socket path).

use std::io;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// Reads what `s` has into `buf`; a short read also clears the readiness (no wasted wakeup).
fn read_some<S: Readable>(s: &S, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = None;
    let r = s.try_io_read(&mut || {
        let n = s.raw_read(buf)?;
        got = Some(n);
        if n > 0 && n < buf.len() { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
    });
    got.map_or(r, Ok)
}

/// A socket the relay reads from: TCP or unix, the same calls.
trait Readable {
    fn try_io_read(&self, f: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>;
    fn raw_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    async fn ready_to_read(&self) -> io::Result<()>;
}

macro_rules! readable {
    ($t:ty) => {
        impl Readable for $t {
            fn try_io_read(&self, f: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize> {
                self.try_io(Interest::READABLE, f)
            }
            fn raw_read(&self, buf: &mut [u8]) -> io::Result<usize> {
                self.try_read(buf)
            }
            async fn ready_to_read(&self) -> io::Result<()> {
                self.readable().await
            }
        }
    };
}
readable!(TcpStream);
readable!(UnixStream);

async fn relay<U>(mut client: TcpStream, mut up: U) -> io::Result<()>
where
    U: Readable + AsyncWriteExt + Unpin,
{
    let (mut a, mut b) = (vec![0u8; 16384], vec![0u8; 16384]);
    loop {
        tokio::select! {
            r = client.readable() => {
                r?;
                match read_some(&client, &mut a) {
                    Ok(0) => return Ok(()),
                    Ok(n) => up.write_all(&a[..n]).await?,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            r = up.ready_to_read() => {
                r?;
                match read_some(&up, &mut b) {
                    Ok(0) => return Ok(()),
                    Ok(n) => client.write_all(&b[..n]).await?,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, upstream] = &args[..] else {
        eprintln!("usage: relay LISTEN_ADDR UPSTREAM (host:port or a unix socket path)");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let l = TcpListener::bind(listen).await?;
        loop {
            let (c, _) = l.accept().await?;
            c.set_nodelay(true)?;
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let r = if upstream.starts_with('/') {
                    match UnixStream::connect(&upstream).await {
                        Ok(u) => relay(c, u).await,
                        Err(e) => Err(e),
                    }
                } else {
                    match TcpStream::connect(&upstream).await {
                        Ok(u) => {
                            let _ = u.set_nodelay(true);
                            relay(c, u).await
                        }
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = r {
                    eprintln!("relay: {e}");
                }
            });
        }
    })
}
