//! Reading and checking configuration files.

use super::*;

#[test]
fn example_file_parses() {
    let text = include_str!("../../docs/parsnip.example.toml");
    let cfg = Config::from_toml(text).expect("example config is valid");
    assert_eq!(cfg.pool_mode, PoolMode::Transaction);
    assert!(cfg.databases.contains_key("app"));
    assert!(cfg.listen.iter().any(|l| l.starts_with('/')));
}

#[test]
fn unknown_key_is_an_error() {
    let e = Config::from_toml("pool_sise = 3\n[databases.a]\nhost='h'\nport=1\n").unwrap_err();
    assert!(e.0.contains("pool_sise"), "{e}");
}

#[test]
fn tls_settings_are_checked_together() {
    let db = "[databases.a]\nhost='h'\nport=1\n";
    let bad = [
        ("client_tls_cert_file = '/c'\n", "go together"),
        ("client_tls_sslmode = 'require'\n", "needs client_tls_cert_file"),
        ("server_tls_cert_file = '/c'\n", "go together"),
        ("server_tls_sslmode = 'verify-full'\n", "server_tls_ca_file"),
        ("server_tls_sslmode = 'verify_full'\n", "unknown variant"),
        ("server_channel_binding = 'required'\n", "unknown variant"),
        ("server_channel_binding = 'require'\nserver_tls_sslmode = 'disable'\n", "needs TLS"),
        (
            "client_tls_cert_file = '/c'\nclient_tls_key_file = '/k'\nclient_tls_sslmode = 'verify-ca'\n",
            "client_tls_ca_file",
        ),
        ("auth_type = 'hba'\n", "needs auth_hba_file"),
        (
            "auth_type = 'cert'\nclient_tls_cert_file = '/c'\nclient_tls_key_file = '/k'\nclient_tls_sslmode = 'require'\n",
            "needs client_tls_sslmode verify-ca or verify-full",
        ),
    ];
    for (top, want) in bad {
        let e = Config::from_toml(&format!("{top}{db}")).unwrap_err();
        assert!(e.0.contains(want), "{top}: {e}");
    }
    let cfg = Config::from_toml(&format!("client_tls_cert_file = '/c'\nclient_tls_key_file = '/k'\n{db}")).unwrap();
    assert_eq!(cfg.client_tls_mode(), ClientTlsMode::Prefer, "a certificate alone means prefer");
    let cfg = Config::from_toml(db).unwrap();
    assert_eq!(cfg.client_tls_mode(), ClientTlsMode::Disable);
    assert_eq!(cfg.server_tls_sslmode, ServerTlsMode::Prefer, "libpq's default");
    assert_eq!(cfg.server_channel_binding, ChannelBinding::Prefer, "libpq's default");
    let tls = "client_tls_cert_file = '/c'\nclient_tls_key_file = '/k'\nclient_tls_ca_file = '/ca'\n";
    let cfg = Config::from_toml(&format!("{tls}client_tls_sslmode = 'verify-full'\n{db}")).unwrap();
    assert!(cfg.client_tls_mode().verifies() && cfg.client_tls_mode().required());
    let shown = crate::config::KEYS.iter().find(|k| k.name == "client_tls_sslmode").map(|k| (k.show)(&cfg));
    assert_eq!(shown.as_deref(), Some("verify-full"), "PgBouncer's spelling in SHOW CONFIG");
    let cfg = Config::from_toml(&format!("server_channel_binding = 'require'\n{db}")).unwrap();
    assert_eq!(cfg.server_channel_binding, ChannelBinding::Require);
}

#[test]
fn wildcard_database_and_overrides() {
    let cfg = Config::from_toml(
        "pool_size = 7\n[databases.\"*\"]\nhost='h'\nport=5\n\
            [databases.x]\nhost='h'\nport=5\ndbname='real'\npool_size=2\n[users.u]\npool_mode='session'\n",
    )
    .unwrap();
    let (db, name) = cfg.database("other").unwrap();
    assert_eq!(name, "other");
    assert_eq!(cfg.pool_size_for(db, "v"), 7);
    let (db, name) = cfg.database("x").unwrap();
    assert_eq!(name, "real");
    assert_eq!(cfg.pool_size_for(db, "v"), 2);
    assert_eq!(cfg.pool_mode_for(db, "u"), PoolMode::Session);
}

#[test]
fn printed_toml_reads_back_the_same() {
    let text = include_str!("../../docs/parsnip.example.toml");
    let cfg = Config::from_toml(text).expect("example config is valid");
    let printed = cfg.to_toml().expect("prints");
    let back = Config::from_toml(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(back.to_toml().expect("prints"), printed);
    assert_eq!(back.entries(), cfg.entries());
    assert_eq!(format!("{:?}", back.databases), format!("{:?}", cfg.databases));
    assert_eq!(format!("{:?}", back.users), format!("{:?}", cfg.users));
}

#[test]
fn unix_socket_group_by_name_or_number() {
    let with = |g: &str| Config { unix_socket_group: g.into(), ..Config::default() };
    assert_eq!(with("").socket_group().expect("unset"), None);
    assert_eq!(with("0").socket_group().expect("a number"), Some(0));
    assert_eq!(with("root").socket_group().expect("a name"), Some(0));
    let e = with("no_such_group_parsnip").socket_group().expect_err("unknown");
    assert!(e.0.contains("no_such_group_parsnip"), "{}", e.0);
    assert!(with("no_such_group_parsnip").validate().is_err());
}
