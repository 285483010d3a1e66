//! Startup parameters and SET are per client, even when clients share one server connection.

mod support;

use std::time::Duration;

use support::*;

/// What a client sees of its settings: application_name, TimeZone, DateStyle, search_path.
const SETTINGS_SQL: &str = "select current_setting('application_name'), current_setting('TimeZone'), \
     current_setting('DateStyle'), current_setting('search_path'), \
     to_char(timestamptz '2024-01-02 12:00:00+00', 'HH24:MI')";

#[tokio::test]
async fn startup_parameters_follow_each_client() {
    let p = Parsnip::trust("pool_size = 1\npool_mode = \"transaction\"");
    bounded(60, "startup_parameters_follow_each_client", async {
        let mut a = p.raw().await;
        a.startup(
            &[
                ("user", "postgres"),
                ("database", "postgres"),
                ("application_name", "alpha"),
                ("TimeZone", "Asia/Tokyo"),
                ("DateStyle", "SQL, DMY"),
                ("options", "-c search_path=alpha_schema,public"),
            ],
            Some(SUPER_PW),
        )
        .await
        .unwrap_or_else(|e| panic!("client a: {e}\n{}", p.log_tail()));
        let mut b = p.raw().await;
        b.startup(
            &[
                ("user", "postgres"),
                ("database", "postgres"),
                ("application_name", "beta"),
                ("TimeZone", "America/New_York"),
                ("DateStyle", "German"),
                ("options", "-c search_path=beta_schema"),
            ],
            Some(SUPER_PW),
        )
        .await
        .unwrap_or_else(|e| panic!("client b: {e}\n{}", p.log_tail()));

        let want_a = vec![
            Some("alpha".to_string()),
            Some("Asia/Tokyo".to_string()),
            Some("SQL, DMY".to_string()),
            Some("alpha_schema,public".to_string()),
            Some("21:00".to_string()),
        ];
        let want_b = vec![
            Some("beta".to_string()),
            Some("America/New_York".to_string()),
            Some("German, DMY".to_string()),
            Some("beta_schema".to_string()),
            Some("07:00".to_string()),
        ];
        let mut pids = std::collections::HashSet::new();
        for round in 0..4 {
            for (name, raw, want) in [("a", &mut a, &want_a), ("b", &mut b, &want_b)] {
                let rows = raw
                    .simple_query(SETTINGS_SQL)
                    .await
                    .unwrap_or_else(|e| panic!("client {name} round {round}: {e}\n{}", p.log_tail()));
                assert_eq!(&rows[0], want, "client {name} round {round}\n{}", p.log_tail());
                // SHOW goes through the same path.
                let tz = raw.scalar("SHOW TimeZone").await.unwrap();
                assert_eq!(tz.as_ref(), want[1].as_ref(), "SHOW TimeZone, client {name}");
                let pid = raw.scalar("select pg_backend_pid()").await.unwrap();
                pids.insert(pid);
            }
        }
        if !direct_mode() {
            assert_eq!(pids.len(), 1, "pool_size 1 should mean one server: {pids:?}");
        }
        // The ParameterStatus each client got at login reflects its own startup parameters, as
        // PostgreSQL reports them (DateStyle normalized to "German, DMY").
        for (raw, app, tz, ds) in
            [(&a, "alpha", "Asia/Tokyo", "SQL, DMY"), (&b, "beta", "America/New_York", "German, DMY")]
        {
            assert_eq!(
                raw.params.get("application_name").map(String::as_str),
                Some(app),
                "application_name ParameterStatus"
            );
            assert_eq!(raw.params.get("TimeZone").map(String::as_str), Some(tz), "TimeZone ParameterStatus");
            assert_eq!(raw.params.get("DateStyle").map(String::as_str), Some(ds), "DateStyle ParameterStatus");
        }

        // A transaction in between does not change anything either.
        a.simple_query("BEGIN; select 1; COMMIT").await.unwrap();
        let rows = b.simple_query(SETTINGS_SQL).await.unwrap();
        assert_eq!(rows[0], want_b);
        let rows = a.simple_query(SETTINGS_SQL).await.unwrap();
        assert_eq!(rows[0], want_a);
    })
    .await;
}

#[tokio::test]
async fn application_name_via_tokio_postgres() {
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "application_name_via_tokio_postgres", async {
        let mut cfg = pg_config(p.port(), "postgres", Some(SUPER_PW), "postgres");
        cfg.application_name("tp-one").options("-c search_path=one_schema -c TimeZone=UTC");
        let one = Pg::connect_config(&mut cfg).await.unwrap();
        let mut cfg = pg_config(p.port(), "postgres", Some(SUPER_PW), "postgres");
        cfg.application_name("tp-two").options("-c TimeZone=Europe/Paris");
        let two = Pg::connect_config(&mut cfg).await.unwrap();
        for _ in 0..3 {
            assert_eq!(one.scalar("SHOW application_name").await.unwrap(), "tp-one");
            assert_eq!(two.scalar("SHOW application_name").await.unwrap(), "tp-two");
            assert_eq!(one.scalar("SHOW search_path").await.unwrap(), "one_schema");
            assert_eq!(two.scalar("SHOW search_path").await.unwrap(), "\"$user\", public");
            assert_eq!(one.scalar("SHOW TimeZone").await.unwrap(), "UTC");
            assert_eq!(two.scalar("SHOW TimeZone").await.unwrap(), "Europe/Paris");
        }
        // pg_stat_activity shows the name of the client being served.
        let row = one
            .query_one("select application_name from pg_stat_activity where pid = pg_backend_pid()", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "tp-one");
    })
    .await;
}

/// Schemas s_a, s_b and public each hold a table `who` naming its schema.
fn schema_db(db: &str) {
    create_db(db);
    psql(
        db,
        "CREATE SCHEMA s_a; CREATE SCHEMA s_b; \
         CREATE TABLE s_a.who (v text); INSERT INTO s_a.who VALUES ('schema a'); \
         CREATE TABLE s_b.who (v text); INSERT INTO s_b.who VALUES ('schema b'); \
         CREATE TABLE public.who (v text); INSERT INTO public.who VALUES ('public'); \
         GRANT ALL ON ALL TABLES IN SCHEMA s_a, s_b, public TO PUBLIC; \
         GRANT USAGE ON SCHEMA s_a, s_b TO PUBLIC;",
    );
}

fn first_column(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect()
}

/// SET outside a transaction sticks to its client across transactions, although another
/// client uses the same (single) server connection in between.
#[tokio::test]
async fn set_persists_for_its_client() {
    const DB: &str = "setdb1";
    schema_db(DB);
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "set_persists_for_its_client", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let other = p.connect("postgres", SUPER_PW, DB).await;

        a.batch_execute("SET statement_timeout = '300ms'").await.unwrap();
        a.batch_execute("SET search_path = s_a").await.unwrap();
        a.batch_execute("SET work_mem = '7MB'").await.unwrap();

        for round in 0..3 {
            // The other client takes the server in between each of a's statements.
            assert_eq!(other.scalar("select v from who").await.unwrap(), "public");
            assert_eq!(a.scalar("SHOW statement_timeout").await.unwrap(), "300ms", "round {round}\n{}", p.log_tail());
            assert_eq!(other.scalar("select 1").await.unwrap(), "1");
            assert_eq!(a.scalar("select v from who").await.unwrap(), "schema a", "round {round}");
            assert_eq!(other.scalar("select 1").await.unwrap(), "1");
            assert_eq!(a.scalar("SHOW work_mem").await.unwrap(), "7MB", "round {round}");
            let texts = first_column(
                &a.simple_query("BEGIN; select current_setting('search_path'); select v from who; COMMIT")
                    .await
                    .unwrap(),
            );
            assert_eq!(texts, vec!["s_a".to_string(), "schema a".to_string()], "round {round}");
        }

        // The timeout really applies to a.
        other.batch_execute("select 1").await.unwrap();
        let t0 = std::time::Instant::now();
        let e = expect_code(a.simple_query("select pg_sleep(3)").await, "57014", "statement_timeout of client a");
        assert_eq!(e.message(), "canceling statement due to statement timeout");
        assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());

        // SET LOCAL does not persist; RESET restores the default.
        a.batch_execute("BEGIN; SET LOCAL search_path = s_b; COMMIT").await.unwrap();
        other.batch_execute("select 1").await.unwrap();
        assert_eq!(a.scalar("select v from who").await.unwrap(), "schema a");
        a.batch_execute("RESET statement_timeout").await.unwrap();
        other.batch_execute("select 1").await.unwrap();
        assert_eq!(a.scalar("SHOW statement_timeout").await.unwrap(), "0");
        assert_eq!(a.scalar("select v from who").await.unwrap(), "schema a");

        // A SET inside a rolled-back transaction is undone; a committed one persists.
        a.batch_execute("BEGIN; SET search_path = s_b; ROLLBACK").await.unwrap();
        other.batch_execute("select 1").await.unwrap();
        assert_eq!(a.scalar("select v from who").await.unwrap(), "schema a");
        a.batch_execute("BEGIN; SET search_path = s_b; COMMIT").await.unwrap();
        other.batch_execute("select 1").await.unwrap();
        assert_eq!(a.scalar("select v from who").await.unwrap(), "schema b");
        assert_eq!(other.scalar("select v from who").await.unwrap(), "public");
    })
    .await;
}

/// A client's SET never shows in another client on the same server connection, including one
/// that made SETs of its own.
#[tokio::test]
async fn set_never_leaks_to_other_clients() {
    const DB: &str = "setdb2";
    schema_db(DB);
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "set_never_leaks_to_other_clients", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        let c = p.connect("postgres", SUPER_PW, DB).await;

        a.batch_execute("SET statement_timeout = '300ms'; SET search_path = s_a").await.unwrap();
        // c has set nothing, b has set something else.
        assert_eq!(c.scalar("SHOW statement_timeout").await.unwrap(), "0", "{}", p.log_tail());
        assert_eq!(c.scalar("select v from who").await.unwrap(), "public");
        b.batch_execute("SET search_path TO s_b").await.unwrap();

        for round in 0..3 {
            assert_eq!(a.scalar("SHOW statement_timeout").await.unwrap(), "300ms", "round {round}");
            assert_eq!(
                b.scalar("SHOW statement_timeout").await.unwrap(),
                "0",
                "round {round}: client b sees a's statement_timeout\n{}",
                p.log_tail()
            );
            assert_eq!(c.scalar("SHOW statement_timeout").await.unwrap(), "0", "round {round}: client c");
            assert_eq!(a.scalar("select v from who").await.unwrap(), "schema a", "round {round}");
            assert_eq!(b.scalar("select v from who").await.unwrap(), "schema b", "round {round}");
            assert_eq!(c.scalar("select v from who").await.unwrap(), "public", "round {round}");
            let texts = first_column(&b.simple_query("BEGIN; SHOW statement_timeout; COMMIT").await.unwrap());
            assert_eq!(texts, vec!["0".to_string()], "round {round}: b in a transaction");
        }
        // Not just SHOW: b and c really run without a's timeout.
        a.batch_execute("select 1").await.unwrap();
        b.batch_execute("select pg_sleep(0.5)")
            .await
            .unwrap_or_else(|e| panic!("client b got a's statement_timeout: {}\n{}", describe(&e), p.log_tail()));
        a.batch_execute("select 1").await.unwrap();
        c.batch_execute("select pg_sleep(0.5)")
            .await
            .unwrap_or_else(|e| panic!("client c got a's statement_timeout: {}\n{}", describe(&e), p.log_tail()));

        // The shortest timeout there is: the reset that takes it off the server runs alone,
        // before b's replay, and b never pays for a's setting.
        a.batch_execute("SET statement_timeout = 1").await.unwrap();
        for round in 0..20 {
            assert_eq!(
                b.scalar("select v from who").await.unwrap_or_else(|e| panic!(
                    "round {round}: client b's replay under a's 1 ms timeout: {}\n{}",
                    describe(&e),
                    p.log_tail()
                )),
                "schema b"
            );
            // a's own statement may meet its timeout on a busy machine: only its replay
            // matters here, which puts the timeout back on the server.
            let _ = a.batch_execute("SHOW statement_timeout").await;
        }
    })
    .await;
}

/// `set_config(name, value, false)` changes the server's session, which parsnip cannot
/// replay: the next client must not inherit it (the server connection is closed after),
/// through the simple and the extended protocol, while a transaction-local one keeps it.
#[tokio::test]
async fn session_set_config_never_leaks() {
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "session_set_config_never_leaks", async {
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        let b = p.connect("postgres", SUPER_PW, "postgres").await;
        let before = b.scalar("select pg_backend_pid()::text").await.unwrap();
        // Transaction-local: nothing stays; the server connection is kept.
        a.batch_execute("BEGIN; SELECT set_config('work_mem', '7MB', true); COMMIT").await.unwrap();
        assert_eq!(b.scalar("SHOW work_mem").await.unwrap(), "4MB");
        let after = b.scalar("select pg_backend_pid()::text").await.unwrap();
        assert_eq!(after, before, "a local set_config closed the server connection");
        // Session-level, simple protocol.
        a.batch_execute("SELECT set_config('work_mem', '7MB', false)").await.unwrap();
        assert_eq!(b.scalar("SHOW work_mem").await.unwrap(), "4MB", "{}", p.log_tail());
        // Session-level, extended protocol with the value as a parameter.
        let stmt = a.prepare("SELECT set_config('work_mem', $1, false)").await.unwrap();
        a.query(&stmt, &[&"9MB"]).await.unwrap();
        assert_eq!(b.scalar("SHOW work_mem").await.unwrap(), "4MB", "{}", p.log_tail());
        // Again: what the statement's text may do is remembered in the cached statement.
        a.query(&stmt, &[&"10MB"]).await.unwrap();
        assert_eq!(b.scalar("SHOW work_mem").await.unwrap(), "4MB", "{}", p.log_tail());
    })
    .await;
}

/// A session-level `set_config` whose name is a literal or a bound parameter is followed:
/// its client keeps the setting on its next server connection, as directly, while other
/// clients never see it and the server connection is reused; a rolled-back one is undone,
/// and a custom setting (`myapp.x`, not listed in pg_settings) is kept too.
#[tokio::test]
async fn session_set_config_follows_its_client() {
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "session_set_config_follows_its_client", async {
        let a = p.connect("postgres", SUPER_PW, "postgres").await;
        let b = p.connect("postgres", SUPER_PW, "postgres").await;
        let pid = b.scalar("select pg_backend_pid()::text").await.unwrap();
        // Both the name and the value as parameters (psycopg's `set_config(%s, %s, false)`).
        let stmt = a.prepare("SELECT set_config($1, $2, false)").await.unwrap();
        a.query(&stmt, &[&"default_transaction_isolation", &"serializable"]).await.unwrap();
        a.batch_execute("SELECT set_config('myapp.x', 'on a', false)").await.unwrap();
        assert_eq!(b.scalar("SHOW default_transaction_isolation").await.unwrap(), "read committed", "{}", p.log_tail());
        // (Reset, a custom setting stays defined in the server's session, empty, as after a
        // RESET directly.)
        assert_eq!(b.scalar("select coalesce(current_setting('myapp.x', true), '')").await.unwrap(), "");
        assert_eq!(b.scalar("select pg_backend_pid()::text").await.unwrap(), pid, "the server connection was closed");
        assert_eq!(a.scalar("SHOW default_transaction_isolation").await.unwrap(), "serializable", "{}", p.log_tail());
        assert_eq!(a.scalar("select current_setting('myapp.x')").await.unwrap(), "on a");
        // Rolled back: the earlier value stays.
        a.batch_execute("BEGIN").await.unwrap();
        a.query(&stmt, &[&"default_transaction_isolation", &"repeatable read"]).await.unwrap();
        a.batch_execute("ROLLBACK").await.unwrap();
        b.batch_execute("select 1").await.unwrap();
        assert_eq!(a.scalar("SHOW default_transaction_isolation").await.unwrap(), "serializable");
        // Committed in a block; RESET forgets it.
        a.batch_execute("BEGIN").await.unwrap();
        a.query(&stmt, &[&"work_mem", &"9MB"]).await.unwrap();
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(b.scalar("SHOW work_mem").await.unwrap(), "4MB");
        assert_eq!(a.scalar("SHOW work_mem").await.unwrap(), "9MB");
        a.batch_execute("RESET default_transaction_isolation").await.unwrap();
        b.batch_execute("select 1").await.unwrap();
        assert_eq!(a.scalar("SHOW default_transaction_isolation").await.unwrap(), "read committed");
        assert_eq!(a.scalar("SHOW work_mem").await.unwrap(), "9MB");
        assert_eq!(b.scalar("select pg_backend_pid()::text").await.unwrap(), pid, "the server connection was closed");
    })
    .await;
}

/// A timeout that ends the session (`idle_session_timeout`) set by one client must not end
/// another's: the server connection it leaves in the pool would be closed by PostgreSQL
/// while idle, and the next client handed it would get the FATAL.
#[tokio::test]
async fn a_session_ending_timeout_never_ends_another_client() {
    const DB: &str = "setdb_idle";
    schema_db(DB);
    let p = Parsnip::trust("pool_size = 1");
    bounded(60, "a_session_ending_timeout_never_ends_another_client", async {
        let a = p.connect("postgres", SUPER_PW, DB).await;
        let b = p.connect("postgres", SUPER_PW, DB).await;
        a.batch_execute("SET idle_session_timeout = '100ms'").await.unwrap();
        for round in 0..3 {
            // Longer than the timeout: the time passing is what is tested.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(
                b.scalar("select v from who").await.unwrap_or_else(|e| panic!(
                    "round {round}: b got a's idle_session_timeout: {}\n{}",
                    describe(&e),
                    p.log_tail()
                )),
                "public"
            );
            a.batch_execute("select 1").await.unwrap();
        }
    })
    .await;
}
