fn main() {
    use parsnip::session::Session;
    println!("Session {}", std::mem::size_of::<Session>());
    println!("Settings {}", std::mem::size_of::<parsnip::state::Settings>());
    println!("ServerConn {}", std::mem::size_of::<parsnip::driver::server_conn::ServerConn>());
    println!("Stream {}", std::mem::size_of::<parsnip::driver::stream::Stream>());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _g = rt.enter();
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let cfg = std::sync::Arc::new(parsnip::config::Config::default());
    let shared = std::sync::Arc::new(parsnip::driver::Shared {
        cfg: cfg.clone(),
        pools: Default::default(),
        cancels: Default::default(),
        client_slots: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
        shutdown: rx,
        stopping: Default::default(),
    });
    let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = s.local_addr().unwrap();
    let c = std::net::TcpStream::connect(a).unwrap();
    c.set_nonblocking(true).unwrap();
    let st = parsnip::driver::stream::Stream::Tcp(tokio::net::TcpStream::from_std(c).unwrap());
    let fut = parsnip::driver::client::serve(st, shared);
    println!("serve future {}", std::mem::size_of_val(&fut));
    let c2 = std::net::TcpStream::connect(a).unwrap();
    c2.set_nonblocking(true).unwrap();
    let st2 = parsnip::driver::stream::Stream::Tcp(tokio::net::TcpStream::from_std(c2).unwrap());
    println!("readable {}", std::mem::size_of_val(&st2.readable()));
    println!("writable {}", std::mem::size_of_val(&st2.writable()));
    println!("sleep {}", std::mem::size_of_val(&tokio::time::sleep(std::time::Duration::from_secs(1))));
    let (_t, mut r) = tokio::sync::watch::channel(false);
    println!("changed {}", std::mem::size_of_val(&r.changed()));
}
#[allow(dead_code)]
fn more() {}
