//! Client authentication: trust, cleartext, md5, SCRAM (plain and stored secrets), auth_query
//! and the URL mode; PostgreSQL's exact errors for wrong passwords and unknown databases.

mod support;

use std::time::Duration;
use support::*;

/// `[databases]` for the shared cluster: `postgres` (server login as the client's user) and
/// `forced` (always logs in to the server as postgres).
fn databases() -> String {
    let port = cluster().port();
    format!(
        "[databases.postgres]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [databases.forced]\nhost = \"127.0.0.1\"\nport = {port}\ndbname = \"postgres\"\n\
         user = \"postgres\"\npassword = \"{SUPER_PW}\"\n\n"
    )
}

async fn current_user(p: &Parsnip, user: &str, password: &str, db: &str) -> String {
    let c = p.connect(user, password, db).await;
    c.scalar("select current_user").await.unwrap()
}

/// Logs in with the raw client; returns the auth request codes seen.
async fn raw_auth(p: &Parsnip, user: &str, password: Option<&str>, db: &str) -> Result<Vec<i32>, PgError> {
    let mut raw = p.raw().await;
    raw.startup(&[("user", user), ("database", db)], password).await?;
    assert_eq!(raw.scalar("select 1").await.unwrap().as_deref(), Some("1"));
    Ok(raw.auth_requests)
}

/// What a SCRAM login attempt shows the client, up to its end.
struct ScramAttempt {
    /// The mechanisms AuthenticationSASL offers.
    mechanisms: Vec<String>,
    /// The salt of server-first-message (base64).
    salt: String,
    /// Its iteration count.
    iterations: String,
    /// The error the attempt ends with.
    error: PgError,
}

/// Logs in as `user` with `password` with the raw client, expecting to be asked for SCRAM
/// and refused at the end of the exchange.
async fn scram_attempt(p: &Parsnip, user: &str, password: &str, db: &str) -> ScramAttempt {
    let mut raw = p.raw().await;
    raw.send(&startup_packet(&[("user", user), ("database", db)])).await.unwrap();
    let auth_request = |f: Option<Frame>, code: i32| {
        let f = f.unwrap_or_else(|| panic!("{user}: closed instead of auth request {code}\n{}", p.log_tail()));
        let fields = f.fields().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(f.tag, b'R', "{user}: expected auth request {code}: {fields}");
        assert_eq!(i32::from_be_bytes(f.body[0..4].try_into().unwrap()), code, "{user}");
        String::from_utf8_lossy(&f.body[4..]).into_owned()
    };
    let sasl = auth_request(raw.read_frame().await, 10);
    let mechanisms = sasl.split('\0').filter(|m| !m.is_empty()).map(str::to_owned).collect();
    let mut state = ScramState::new(password);
    let first = state.client_first();
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first.as_bytes());
    raw.send(&msg(b'p', &body)).await.unwrap();
    let server_first = auth_request(raw.read_frame().await, 11);
    let attr = |name: &str| {
        server_first
            .split(',')
            .find_map(|a| a.strip_prefix(name))
            .unwrap_or_else(|| panic!("{server_first}"))
            .to_owned()
    };
    let (salt, iterations) = (attr("s="), attr("i="));
    let fin = state.client_final(&server_first).unwrap_or_else(|e| panic!("{user}: {e}"));
    raw.send(&msg(b'p', fin.as_bytes())).await.unwrap();
    let error = raw.expect_error_and_close(Duration::from_secs(10), user).await;
    ScramAttempt { mechanisms, salt, iterations, error }
}

/// A user parsnip does not know gets the SCRAM exchange a known user gets (its salt the same
/// at every attempt, as a stored verifier's), then 28P01, as PostgreSQL does.
async fn assert_asked_like_a_known_user(p: &Parsnip, unknown: &str, known: &str, db: &str) {
    let k = scram_attempt(p, known, "definitely-wrong", db).await;
    let u = scram_attempt(p, unknown, "definitely-wrong", db).await;
    for (a, user) in [(&k, known), (&u, unknown)] {
        assert_eq!(a.mechanisms, ["SCRAM-SHA-256"], "{user}");
        assert_eq!(a.iterations, "4096", "{user}");
        assert_eq!(a.salt.len(), 24, "{user}: a 16-byte salt, as PostgreSQL's");
        assert_eq!(a.error.code(), "28P01", "{user}: {}", a.error);
        assert_eq!(a.error.message(), format!("password authentication failed for user \"{user}\""));
    }
    assert_eq!(scram_attempt(p, unknown, "other", db).await.salt, u.salt, "{unknown}'s salt changed");
    assert_eq!(scram_attempt(p, known, "other", db).await.salt, k.salt, "{known}'s salt changed");
    assert_ne!(scram_attempt(p, &format!("{unknown}_2"), "x", db).await.salt, u.salt, "two names, one salt");
}

async fn assert_wrong_password(p: &Parsnip, user: &str, db: &str) {
    let r = p.try_connect(user, Some("definitely-wrong"), db).await;
    let e = expect_code(r.map(|_| ()), "28P01", &format!("wrong password for {user}"));
    assert_eq!(e.message(), format!("password authentication failed for user \"{user}\""));
    assert_eq!(e.severity(), "FATAL");
}

#[tokio::test]
async fn scram_with_plain_and_stored_secrets() {
    let aq_secret = stored_secret("aq");
    assert!(aq_secret.starts_with("SCRAM-SHA-256$"), "{aq_secret}");
    let p = Parsnip::with_config(&format!(
        "auth_type = \"scram-sha-256\"\n\n{}\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n\n\
         [users.app]\npassword = \"{APP_PW}\"\n\n\
         [users.aq]\npassword = \"{aq_secret}\"\n",
        databases()
    ));
    bounded(60, "scram_with_plain_and_stored_secrets", async {
        // Plain secret in [users]; the server login is as app.
        assert_eq!(current_user(&p, "app", APP_PW, "postgres").await, "app");
        // Stored SCRAM secret; the database entry logs in to the server as postgres.
        assert_eq!(current_user(&p, "aq", AQ_PW, "forced").await, "postgres");
        // Our own SCRAM client checks the server signature too, and sees SASL asked.
        let codes = raw_auth(&p, "app", Some(APP_PW), "postgres")
            .await
            .unwrap_or_else(|e| panic!("raw SCRAM login: {e}\n{}", p.log_tail()));
        assert_eq!(codes, vec![10, 11, 12, 0], "auth requests");
        let codes = raw_auth(&p, "aq", Some(AQ_PW), "forced").await.unwrap();
        assert_eq!(codes, vec![10, 11, 12, 0], "auth requests");

        assert_wrong_password(&p, "app", "postgres").await;
        assert_wrong_password(&p, "aq", "forced").await;
        // An unknown user looks exactly like a wrong password, all the way.
        assert_wrong_password(&p, "nobody_here", "postgres").await;
        assert_asked_like_a_known_user(&p, "nobody_here", "aq", "postgres").await;
        assert_asked_like_a_known_user(&p, "nobody_here", "app", "postgres").await;
        // A SASLInitialResponse whose mechanism is not NUL-terminated.
        let mut raw = p.raw().await;
        raw.send(&startup_packet(&[("user", "app"), ("database", "postgres")])).await.unwrap();
        assert_eq!(raw.read_frame().await.map(|f| f.tag), Some(b'R'));
        raw.send(&msg(b'p', b"SCRAM-SHA-256")).await.unwrap();
        let e = raw.expect_error_and_close(Duration::from_secs(5), "mechanism without NUL").await;
        assert_eq!((e.code(), e.severity(), e.message()), ("08P01", "FATAL", "invalid string in message"));
        // No password at all.
        let r = p.try_connect("app", None, "postgres").await;
        assert!(r.is_err(), "login without password succeeded");

        // Unknown database (no "*" entry in this config).
        let r = p.try_connect("app", Some(APP_PW), "no_such_db").await;
        let e = expect_code(r.map(|_| ()), "3D000", "unknown database");
        assert!(e.message().contains("no_such_db"), "{}", e.message());
        assert_eq!(e.severity(), "FATAL");

        // The pooler still serves clients after all those failures.
        assert_eq!(current_user(&p, "app", APP_PW, "postgres").await, "app");
    })
    .await;
}

#[tokio::test]
async fn md5_auth() {
    let md5_secret = md5_secret("md5user", MD5_PW);
    assert_eq!(stored_secret("md5user"), md5_secret, "md5user should be stored as md5");
    let p = Parsnip::with_config(&format!(
        "auth_type = \"md5\"\n\n{}\
         [users.app]\npassword = \"{APP_PW}\"\n\n\
         [users.md5user]\npassword = \"{md5_secret}\"\n",
        databases()
    ));
    bounded(60, "md5_auth", async {
        assert_eq!(current_user(&p, "app", APP_PW, "postgres").await, "app");
        assert_eq!(current_user(&p, "md5user", MD5_PW, "forced").await, "postgres");
        let codes = raw_auth(&p, "md5user", Some(MD5_PW), "forced")
            .await
            .unwrap_or_else(|e| panic!("raw md5 login: {e}\n{}", p.log_tail()));
        assert_eq!(codes, vec![5, 0], "md5 should be asked");
        let codes = raw_auth(&p, "app", Some(APP_PW), "postgres").await.unwrap();
        assert_eq!(codes, vec![5, 0], "md5 should be asked for a plain secret too");
        assert_wrong_password(&p, "md5user", "forced").await;
        assert_wrong_password(&p, "app", "postgres").await;
    })
    .await;
}

#[tokio::test]
async fn cleartext_password_auth() {
    let p = Parsnip::with_config(&format!(
        "auth_type = \"password\"\n\n{}[users.app]\npassword = \"{APP_PW}\"\n",
        databases()
    ));
    bounded(60, "cleartext_password_auth", async {
        assert_eq!(current_user(&p, "app", APP_PW, "postgres").await, "app");
        let codes = raw_auth(&p, "app", Some(APP_PW), "postgres")
            .await
            .unwrap_or_else(|e| panic!("raw cleartext login: {e}\n{}", p.log_tail()));
        assert_eq!(codes, vec![3, 0], "cleartext password should be asked");
        assert_wrong_password(&p, "app", "postgres").await;
        // A password message without its NUL is refused as PostgreSQL refuses it, the right
        // password or not, a known user or not.
        for (user, password) in [("app", APP_PW), ("nobody_here", "x")] {
            let mut raw = p.raw().await;
            raw.send(&startup_packet(&[("user", user), ("database", "postgres")])).await.unwrap();
            let f = raw.read_frame().await.expect("auth request");
            assert_eq!((f.tag, &f.body[..]), (b'R', &[0, 0, 0, 3][..]), "{user}: asked for cleartext");
            raw.send(&msg(b'p', password.as_bytes())).await.unwrap();
            let e = raw.expect_error_and_close(Duration::from_secs(5), "password without NUL").await;
            assert_eq!((e.code(), e.severity(), e.message()), ("08P01", "FATAL", "invalid password packet size"));
        }
    })
    .await;
}

#[tokio::test]
async fn trust_auth() {
    let p = Parsnip::with_config(&format!(
        "auth_type = \"trust\"\n\n{}[users.app]\npassword = \"{APP_PW}\"\n",
        databases()
    ));
    bounded(60, "trust_auth", async {
        // No password from the client; parsnip logs in to the server with the configured one.
        let c = p
            .try_connect("app", None, "postgres")
            .await
            .unwrap_or_else(|e| panic!("trust login: {}\n{}", describe(&e), p.log_tail()));
        assert_eq!(c.scalar("select current_user").await.unwrap(), "app");
        let codes = raw_auth(&p, "app", None, "postgres").await.unwrap();
        assert_eq!(codes, vec![0], "trust asks for nothing");
        let r = p.try_connect("app", None, "no_such_db").await;
        expect_code(r.map(|_| ()), "3D000", "unknown database under trust");
    })
    .await;
}

#[tokio::test]
async fn auth_query_looks_up_secrets_in_postgres() {
    let p = Parsnip::with_config(&format!(
        "auth_type = \"scram-sha-256\"\n\
         auth_query = \"SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = $1\"\n\
         auth_user = \"postgres\"\n\n{}\
         [users.postgres]\npassword = \"{SUPER_PW}\"\n",
        databases()
    ));
    bounded(60, "auth_query_looks_up_secrets_in_postgres", async {
        // aq is not in [users]: its SCRAM secret comes from pg_shadow.
        assert_eq!(current_user(&p, "aq", AQ_PW, "forced").await, "postgres");
        let codes = raw_auth(&p, "aq", Some(AQ_PW), "forced")
            .await
            .unwrap_or_else(|e| panic!("raw auth_query login: {e}\n{}", p.log_tail()));
        assert_eq!(codes, vec![10, 11, 12, 0]);
        assert_wrong_password(&p, "aq", "forced").await;
        assert_wrong_password(&p, "no_such_role", "forced").await;
        // A role auth_query does not find is asked for SCRAM as aq is, then refused.
        assert_asked_like_a_known_user(&p, "no_such_role", "aq", "forced").await;
        // The listed auth user itself.
        assert_eq!(current_user(&p, "postgres", SUPER_PW, "postgres").await, "postgres");
        // Logging in to the server as the looked-up user itself.
        assert_eq!(current_user(&p, "aq", AQ_PW, "postgres").await, "aq");
    })
    .await;
}

#[tokio::test]
async fn url_mode_authenticates_other_users_via_auth_query() {
    let p = Parsnip::url_mode(&[]);
    bounded(60, "url_mode_authenticates_other_users_via_auth_query", async {
        assert_eq!(current_user(&p, "postgres", SUPER_PW, "postgres").await, "postgres");
        assert_wrong_password(&p, "postgres", "postgres").await;
        assert_eq!(current_user(&p, "app", APP_PW, "postgres").await, "app");
        assert_wrong_password(&p, "app", "postgres").await;
        let codes = raw_auth(&p, "app", Some(APP_PW), "postgres")
            .await
            .unwrap_or_else(|e| panic!("raw URL-mode login: {e}\n{}", p.log_tail()));
        assert_eq!(codes, vec![10, 11, 12, 0]);
        // app can reach another database too.
        assert_eq!(current_user(&p, "app", APP_PW, "other").await, "app");
        // A role PostgreSQL does not have: SCRAM, as for app, then 28P01.
        assert_asked_like_a_known_user(&p, "no_such_role", "app", "postgres").await;
        // An unknown database is reported as PostgreSQL does.
        let r = p.try_connect("app", Some(APP_PW), "no_such_db").await;
        let e = expect_code(r.map(|_| ()), "3D000", "unknown database in URL mode");
        assert_eq!(e.message(), "database \"no_such_db\" does not exist");
    })
    .await;
}

/// A non-ASCII password that SASLprep changes (U+2168 ROMAN NUMERAL NINE becomes "IX",
/// U+00AD SOFT HYPHEN is dropped): PostgreSQL made the role's SCRAM verifier from the
/// prepared form, so parsnip, holding the plain password, must prepare it the same way both
/// to check the client and to log in to the server.
#[tokio::test]
async fn scram_passwords_go_through_saslprep() {
    const PW: &str = "\u{2168}pass\u{00AD}word";
    psql(
        "postgres",
        &format!(
            "SET password_encryption = 'scram-sha-256'; DROP ROLE IF EXISTS sasl_user; \
             CREATE ROLE sasl_user LOGIN PASSWORD '{PW}'"
        ),
    );
    let p = Parsnip::with_config(&format!(
        "auth_type = \"scram-sha-256\"\n\n{}[users.sasl_user]\npassword = \"{PW}\"\n",
        databases()
    ));
    bounded(60, "scram_passwords_go_through_saslprep", async {
        // tokio-postgres prepares its password too; both spellings are the same password.
        assert_eq!(current_user(&p, "sasl_user", PW, "postgres").await, "sasl_user");
        assert_eq!(current_user(&p, "sasl_user", "IXpassword", "postgres").await, "sasl_user");
        assert_wrong_password(&p, "sasl_user", "postgres").await;
    })
    .await;
}
