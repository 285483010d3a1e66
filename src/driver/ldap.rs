//! LDAP password checks (`login::Step::CheckPassword` with `Checker::Ldap`), as PostgreSQL
//! makes them: the first of the configured servers that accepts a connection is used;
//! simple bind binds as prefix + user name + suffix with the client's password;
//! search+bind binds as `ldapbinddn` (or anonymously), searches for the user's entry,
//! requires exactly one, and binds as it with the client's password.
//!
//! With `ldaptls=1` StartTLS is asked for, with `ldaps` TLS starts at once; the server's
//! certificate is verified (chain and name, rustls) against `auth_ldap_tls_ca_file`, or
//! the system's trust store when it is not set.
//!
//! Owns: the conversation with the LDAP server (`ldap3`). Why a check failed is logged
//! here (a wrong password or an unknown user at info, a server that cannot be reached or
//! fails at warn); the client only learns that it failed. The login's timeout
//! (`client_login_timeout`) bounds the whole check; each connect is bounded by it too.

use crate::auth::ldap::{LdapOptions, Mode, Scope, Security};
use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, SearchEntry};
use rustls::{ClientConfig, RootCertStore};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// The system's trust store (as OpenSSL finds it; `SSL_CERT_FILE`, `SSL_CERT_DIR`), read
/// at the first TLS check.
static SYSTEM_ROOTS: LazyLock<Arc<RootCertStore>> = LazyLock::new(|| {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "reading the system's trust store for LDAP TLS");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    tracing::debug!(added, ignored, "the system's trust store for LDAP TLS");
    Arc::new(roots)
});

/// The TLS configuration of a check: the certificates of `ca_file`, else the system's.
fn tls_config(ca_file: Option<&str>) -> Result<Arc<ClientConfig>, String> {
    let roots = match ca_file {
        Some(path) => Arc::new(super::tls_config::roots(path)?),
        None => SYSTEM_ROOTS.clone(),
    };
    let config = ClientConfig::builder_with_provider(super::tls_config::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Why a check failed.
enum Failure {
    /// The server said no (wrong password, no such user), or the name was refused.
    Refused(String),
    /// The server could not be asked, or failed.
    Server(String),
}

/// Whether `password` is `user`'s, by the server(s) of `opts`; `timeout` bounds each connect;
/// `ca_file`: `auth_ldap_tls_ca_file`.
pub(crate) async fn check(
    opts: &LdapOptions,
    user: &str,
    password: &[u8],
    timeout: Duration,
    ca_file: Option<&str>,
) -> bool {
    match try_check(opts, user, password, timeout, ca_file).await {
        Ok(()) => true,
        Err(Failure::Refused(why)) => {
            tracing::info!(user, "LDAP authentication failed: {why}");
            false
        }
        Err(Failure::Server(why)) => {
            tracing::warn!(user, "LDAP authentication failed: {why}");
            false
        }
    }
}

async fn try_check(
    opts: &LdapOptions,
    user: &str,
    password: &[u8],
    timeout: Duration,
    ca_file: Option<&str>,
) -> Result<(), Failure> {
    let password =
        std::str::from_utf8(password).map_err(|_| Failure::Refused("the password is not valid UTF-8".into()))?;
    // Names are refused before a server is asked.
    let target = match &opts.mode {
        Mode::Simple { prefix, suffix } => LdapOptions::bind_dn(prefix, suffix, user)
            .ok_or_else(|| Failure::Refused("invalid character in user name for LDAP simple bind".into()))?,
        Mode::Search { attribute, filter, .. } => LdapOptions::search_filter(attribute, filter.as_deref(), user)
            .ok_or_else(|| Failure::Refused("invalid character in user name for LDAP authentication".into()))?,
    };
    let mut ldap = connect(opts, timeout, ca_file).await?;
    let res = match &opts.mode {
        Mode::Simple { .. } => bind(&mut ldap, &target, password).await,
        Mode::Search { base, scope, bind_dn, bind_password, .. } => {
            let (dn, pw) = bind_dn.as_deref().map_or(("", ""), |dn| (dn, bind_password.as_str()));
            match bind(&mut ldap, dn, pw).await {
                Ok(()) => match find(&mut ldap, base, *scope, &target, user).await {
                    Ok(entry) => bind(&mut ldap, &entry, password).await,
                    Err(e) => Err(e),
                },
                Err(Failure::Refused(why) | Failure::Server(why)) => {
                    Err(Failure::Server(format!("could not perform initial LDAP bind for ldapbinddn \"{dn}\": {why}")))
                }
            }
        }
    };
    let _ = ldap.unbind().await;
    res
}

/// A connection to the first server that takes one.
async fn connect(opts: &LdapOptions, timeout: Duration, ca_file: Option<&str>) -> Result<Ldap, Failure> {
    let mut settings = LdapConnSettings::new().set_conn_timeout(timeout);
    if opts.tls != Security::Plain {
        let config = tls_config(ca_file).map_err(|e| Failure::Server(format!("auth_ldap_tls_ca_file: {e}")))?;
        settings = settings.set_config(config).set_starttls(opts.tls == Security::StartTls);
    }
    let mut why = Vec::new();
    for url in opts.urls() {
        let settings = settings.clone();
        match LdapConnAsync::with_settings(settings, &url).await {
            Ok((conn, ldap)) => {
                tokio::spawn(async move {
                    if let Err(e) = conn.drive().await {
                        tracing::debug!(error = %e, "LDAP connection ended");
                    }
                });
                return Ok(ldap);
            }
            Err(e) => why.push(format!("{url}: {e}")),
        }
    }
    Err(Failure::Server(format!("could not connect to the LDAP server: {}", why.join("; "))))
}

/// A simple bind as `dn`.
async fn bind(ldap: &mut Ldap, dn: &str, password: &str) -> Result<(), Failure> {
    let res = ldap.simple_bind(dn, password).await.map_err(|e| Failure::Server(e.to_string()))?;
    match res.rc {
        0 => Ok(()),
        // invalidCredentials, inappropriateAuthentication: the password.
        49 | 48 => Err(Failure::Refused(format!("bind as \"{dn}\": {res}"))),
        _ => Err(Failure::Server(format!("bind as \"{dn}\": {res}"))),
    }
}

/// The DN of the one entry `filter` finds.
async fn find(ldap: &mut Ldap, base: &str, scope: Scope, filter: &str, user: &str) -> Result<String, Failure> {
    let scope = match scope {
        Scope::Base => ldap3::Scope::Base,
        Scope::One => ldap3::Scope::OneLevel,
        Scope::Sub => ldap3::Scope::Subtree,
    };
    let fail = |e: String| Failure::Server(format!("could not search LDAP for filter \"{filter}\": {e}"));
    let res = ldap.search(base, scope, filter, vec!["1.1"]).await.map_err(|e| fail(e.to_string()))?;
    let (entries, _) = res.success().map_err(|e| fail(e.to_string()))?;
    let mut entries = entries.into_iter();
    match (entries.next(), entries.len()) {
        (None, _) => Err(Failure::Refused(format!("LDAP user \"{user}\" does not exist"))),
        (Some(e), 0) => Ok(SearchEntry::construct(e).dn),
        (Some(_), n) => Err(Failure::Refused(format!("LDAP user \"{user}\" is not unique ({} entries match)", n + 1))),
    }
}
