//! Prints the sizes of what every idle client holds (`cargo run --example sizes`), for the
//! idle-memory work. The proxy loop's own sizes are asserted by the unit test
//! `driver::proxy::task_size`.

fn main() {
    println!("Session {}", std::mem::size_of::<parsnip::session::Session>());
    println!("Settings {}", std::mem::size_of::<parsnip::state::Settings>());
    println!("ServerState {}", std::mem::size_of::<parsnip::state::ServerState>());
    println!("ServerConn {}", std::mem::size_of::<parsnip::driver::server_conn::ServerConn>());
}
