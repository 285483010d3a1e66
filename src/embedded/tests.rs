//! Tests that start real clusters (needs PostgreSQL installed, see [`find_bin_dir`]).

use super::*;
use std::net::TcpStream;

fn cluster(opts: ClusterOptions) -> Cluster {
    match Cluster::start(opts) {
        Ok(c) => c,
        Err(e) => panic!("cluster start failed: {e}"),
    }
}

/// Runs the cluster's psql over TCP as `user` with `password`; Ok(stdout) or Err(stderr).
fn psql_tcp(c: &Cluster, user: &str, password: &str, sql: &str) -> Result<String, String> {
    let mut cmd = Command::new(c.bin_dir().join("psql"));
    for (key, _) in std::env::vars_os() {
        if key.as_encoded_bytes().starts_with(b"PG") {
            cmd.env_remove(key);
        }
    }
    cmd.env("PGPASSWORD", password)
        .args(["-X", "-q", "-A", "-t", "-w", "-h", "127.0.0.1", "-p"])
        .arg(c.port().to_string())
        .args(["-U", user, "-d", "postgres", "-c", sql])
        .stdin(Stdio::null());
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Pids whose parent is `ppid` (from /proc).
fn children_of(ppid: i32) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if parent == Some(ppid) {
            pids.push(pid);
        }
    }
    pids
}

/// kill(pid, 0) fails with ESRCH — or the pid is a zombie: this sandbox's PID 1 does not reap
/// orphans, and the postmaster (started by pg_ctl, so not our child) is reparented to it.
fn pid_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only probes.
    let rc = unsafe { libc::kill(pid, 0) };
    (rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)) || sys::is_zombie(pid)
}

#[test]
fn finds_binaries() {
    let dir = find_bin_dir().expect("PostgreSQL binaries");
    assert!(dir.join("initdb").is_file(), "{}", dir.display());
}

#[test]
fn missing_binaries_error_says_how_to_install() {
    let opts = ClusterOptions { bin_dir: Some(PathBuf::from("/nonexistent/parsnip/bin")), ..ClusterOptions::default() };
    let err = Cluster::start(opts).expect_err("must fail");
    let msg = err.to_string();
    assert!(msg.contains("apt-get install postgresql"), "{msg}");
    assert!(msg.contains("PARSNIP_PG_BIN"), "{msg}");
}

#[test]
fn rejects_unknown_auth_method() {
    let opts =
        ClusterOptions { auth_method: "trust\nhost all all 0.0.0.0/0 trust".into(), ..ClusterOptions::default() };
    assert!(Cluster::start(opts).is_err());
}

#[test]
fn starts_answers_and_drop_cleans_up() {
    let c = cluster(ClusterOptions { extra_conf: vec!["work_mem = '7MB'".into()], ..ClusterOptions::default() });
    assert_eq!(c.psql("postgres", "select 1").expect("psql"), "1");
    assert_eq!(c.psql("postgres", "show max_connections").expect("psql"), "300");
    assert_eq!(c.psql("postgres", "show work_mem").expect("psql"), "7MB");
    assert_eq!(c.superuser(), "postgres");
    // Whichever PostgreSQL the suite runs against (15 from Debian, 18 with PARSNIP_PG_BIN).
    let version_num: u32 = c.psql("postgres", "show server_version_num").expect("psql").parse().expect("a number");
    assert_eq!(c.major_version(), version_num / 10000);
    assert_eq!(c.url(), format!("postgres://postgres@127.0.0.1:{}/postgres", c.port()));
    assert!(c.log_file().is_file());
    assert!(c.data_dir().join("PG_VERSION").is_file());
    assert!(c.socket_dir().join(format!(".s.PGSQL.{}", c.port())).exists());
    TcpStream::connect(("127.0.0.1", c.port())).expect("TCP port reachable");
    // Trust over TCP for the superuser without a password.
    assert_eq!(psql_tcp(&c, "postgres", "", "select 2").as_deref(), Ok("2"));
    // Errors come back with psql's stderr.
    let err = c.psql("postgres", "select * from no_such_table").expect_err("must fail");
    assert!(err.to_string().contains("no_such_table"), "{err}");

    let root = c.root.clone();
    let pid = c.postmaster_pid.expect("postmaster pid");
    let children = children_of(pid);
    assert!(!children.is_empty(), "postmaster {pid} has no children?");
    drop(c);
    assert!(!root.exists(), "{} still exists", root.display());
    assert!(pid_gone(pid), "postmaster {pid} survived drop");
    for child in children {
        assert!(pid_gone(child), "server process {child} survived drop");
    }
}

#[test]
fn scram_auth_over_tcp() {
    let c = cluster(ClusterOptions {
        auth_method: "scram-sha-256".into(),
        superuser_password: Some("su p'w@d".into()),
        ..ClusterOptions::default()
    });
    c.psql("postgres", "CREATE ROLE alice LOGIN PASSWORD 'secret'").expect("create role");
    let stored = c
        .psql("postgres", "select rolpassword like 'SCRAM-SHA-256$%' from pg_authid where rolname = 'alice'")
        .expect("psql");
    assert_eq!(stored, "t");
    assert_eq!(psql_tcp(&c, "alice", "secret", "select current_user").as_deref(), Ok("alice"));
    let err = psql_tcp(&c, "alice", "wrong", "select 1").expect_err("wrong password");
    assert!(err.contains("password authentication failed"), "{err}");
    // The superuser needs its password over TCP but not over the socket.
    assert_eq!(psql_tcp(&c, "postgres", "su p'w@d", "select 3").as_deref(), Ok("3"));
    assert!(psql_tcp(&c, "postgres", "nope", "select 3").is_err());
    assert_eq!(c.psql("postgres", "select 4").expect("socket"), "4");
    assert_eq!(c.url(), format!("postgres://postgres:su%20p%27w%40d@127.0.0.1:{}/postgres", c.port()));
}

#[test]
fn restart_and_stop_keep_data() {
    let mut c = cluster(ClusterOptions::default());
    let port = c.port();
    c.psql("postgres", "create table kept (v int); insert into kept values (42);").expect("create");
    let old_pid = c.postmaster_pid.expect("pid");
    c.restart().expect("restart");
    assert_eq!(c.port(), port);
    assert_ne!(c.postmaster_pid, Some(old_pid));
    assert_eq!(c.psql("postgres", "select v from kept").expect("select"), "42");

    c.stop().expect("stop");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(c.psql("postgres", "select 1").is_err());
    c.start_again().expect("start again");
    assert_eq!(c.port(), port);
    assert_eq!(c.psql("postgres", "select v from kept").expect("select"), "42");
}

#[test]
fn retries_when_port_is_taken() {
    let busy = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let busy_port = busy.local_addr().expect("addr").port();
    let mut offered = Vec::new();
    let mut next_port = || {
        let port = if offered.is_empty() { busy_port } else { sys::free_port()? };
        offered.push(port);
        Ok(port)
    };
    let c = Cluster::start_with_ports(ClusterOptions::default(), &mut next_port).expect("start after retry");
    assert_eq!(offered.len(), 2, "{offered:?}");
    assert_ne!(c.port(), busy_port);
    assert_eq!(c.psql("postgres", "select 1").expect("psql"), "1");
}

#[test]
fn start_failure_quotes_server_log() {
    let busy = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let busy_port = busy.local_addr().expect("addr").port();
    let mut attempts = 0;
    let mut next_port = || {
        attempts += 1;
        Ok(busy_port)
    };
    let err = Cluster::start_with_ports(ClusterOptions::default(), &mut next_port).expect_err("port always taken");
    let msg = err.to_string();
    assert!(msg.contains("server log"), "{msg}");
    assert!(msg.contains("Address already in use"), "{msg}");
    assert_eq!(attempts, 5);
}
