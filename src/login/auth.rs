//! The password exchange of a login: which method a user is asked for (by `auth_type` and
//! the kind of secret held), the challenge, and checking the answer, each message read and
//! refused as PostgreSQL reads and refuses it.
//!
//! A user parsnip does not know (not in `[users]`, not found by `auth_query`) is asked
//! exactly as a known one would be — a mock SCRAM exchange whose salt is stable per user
//! name, an md5 challenge, or a cleartext request — and refused with 28P01 at the end, as
//! PostgreSQL does: nothing on the wire tells which users exist, and no client is asked for
//! its password in cleartext where SCRAM is configured.
//!
//! Under `ldap` and `pam` every user is asked for a cleartext password, which the driver
//! checks (`Step::CheckPassword`): users need not be known to parsnip, and neither
//! `[users]` nor `auth_query` is consulted. An empty password is refused before that, as
//! PostgreSQL refuses it.

use super::{Checker, Cleartext, Login, Phase, Step};
use crate::auth::hba::Method;
use crate::auth::{self, AuthError, Credentials, ScramSecret, ScramServer, Secret, ServerBinding};
use crate::config::AuthType;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, read_cstr, split_frame, tags};
use bytes::BytesMut;

/// The longest authentication message PostgreSQL reads, its length word included
/// (`PG_MAX_AUTH_TOKEN_LENGTH`).
const MAX_AUTH_MESSAGE: usize = 65_535;

/// A password message the login waits for, and what it is checked against. A `None` secret
/// is a user parsnip does not know: the exchange runs as for any user, then fails.
pub(super) enum Pending {
    /// A cleartext password.
    Cleartext(Option<Secret>),
    /// The answer to an md5 challenge with `salt`.
    Md5 { secret: Option<Secret>, salt: [u8; 4] },
    /// A cleartext password for `Login::checker` (ldap, pam).
    External,
    /// SASLInitialResponse: the mechanism, and client-first-message unless it comes next.
    ScramFirst(Scram),
    /// A SASLResponse carrying client-first-message (the SASLInitialResponse had none).
    ScramClientFirst(Scram),
    /// A SASLResponse carrying client-final-message.
    ScramFinal(Scram),
}

impl Pending {
    fn is_sasl(&self) -> bool {
        matches!(self, Pending::ScramFirst(_) | Pending::ScramClientFirst(_) | Pending::ScramFinal(_))
    }
}

/// A SCRAM exchange in progress.
pub(super) struct Scram {
    server: Box<ScramServer>,
    /// The user's secret; None: a mock exchange, refused whatever the proof.
    secret: Option<Secret>,
}

fn wrong_password(user: &str) -> Error {
    Error::fatal(SqlState::INVALID_PASSWORD, format!("password authentication failed for user \"{user}\""))
}

/// What the client is told when its SCRAM exchange fails, as PostgreSQL tells it.
fn scram_error(e: AuthError, user: &str) -> Error {
    match e {
        AuthError::WrongPassword => wrong_password(user),
        AuthError::ChannelBindingNegotiation => {
            tracing::info!(user, "SCRAM channel binding downgrade refused (gs2 flag 'y' on TLS)");
            Error::fatal(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, "SCRAM channel binding negotiation error")
                .with_detail(
                    "The client supports SCRAM channel binding but thinks the server does not.  \
                     However, this server does support channel binding.",
                )
        }
        AuthError::ChannelBindingCheck => {
            tracing::info!(user, "SCRAM channel binding check failed (another certificate on the client's side)");
            Error::fatal(SqlState::INVALID_AUTHORIZATION_SPECIFICATION, "SCRAM channel binding check failed")
        }
        AuthError::Malformed(detail) => malformed_scram(detail),
        e => Error::protocol(format!("malformed SCRAM message: {e}")),
    }
}

fn malformed_scram(detail: &'static str) -> Error {
    Error::protocol("malformed SCRAM message").with_detail(detail)
}

/// The string of a PasswordMessage (cleartext or md5), checked as PostgreSQL checks it:
/// exactly one NUL-terminated string, not empty.
fn password_string(data: &[u8]) -> Result<&[u8], Error> {
    match data.iter().position(|&b| b == 0) {
        Some(0) if data.len() == 1 => {
            Err(Error::fatal(SqlState::INVALID_PASSWORD, "empty password returned by client"))
        }
        Some(n) if n + 1 == data.len() => Ok(&data[..n]),
        _ => Err(Error::protocol("invalid password packet size")),
    }
}

/// The data of a SCRAM message, checked as PostgreSQL checks it before parsing: not empty,
/// no NUL inside.
fn scram_data(data: &[u8]) -> Result<&[u8], Error> {
    if data.is_empty() {
        return Err(malformed_scram("The message is empty."));
    }
    if data.contains(&0) {
        return Err(malformed_scram("Message length does not match input length."));
    }
    Ok(data)
}

/// "insufficient data left in message", PostgreSQL's words for a length beyond the message.
fn insufficient_data() -> Error {
    Error::protocol("insufficient data left in message")
}

impl Login {
    /// The secret configured for the user, if any.
    fn configured_secret(&self) -> Option<Secret> {
        self.cfg.users.get(&self.user).and_then(|u| u.password.as_deref()).map(Secret::parse)
    }

    /// What logging in to the server as this user takes, from its secret (or the
    /// database's password).
    fn credentials_from(&self, secret: Option<&Secret>) -> Credentials {
        match secret {
            Some(Secret::Plain(p)) => Credentials::Password(p.clone()),
            Some(Secret::Md5(m)) => Credentials::Md5Secret(m.clone()),
            _ => self
                .target
                .as_ref()
                .and_then(|t| t.db_cfg.password.clone())
                .map(Credentials::Password)
                .unwrap_or_default(),
        }
    }

    /// Starts authenticating the user of the startup packet.
    pub(super) fn start_auth(&mut self) -> Step {
        let configured = self.configured_secret();
        let console = self.target.as_ref().is_some_and(|t| t.console);
        match self.cfg.auth_type {
            AuthType::Hba => match self.hba_method() {
                Ok((m, identified, checker)) => (self.method, self.identified, self.checker) = (m, identified, checker),
                Err(e) => return self.close(e),
            },
            // The console's users keep to their configured secrets; one without any is
            // checked as everyone is (PgBouncer asks PAM or LDAP for every login).
            AuthType::Ldap | AuthType::Pam if console && configured.is_some() => self.method = AuthType::ScramSha256,
            AuthType::Ldap => self.checker = self.cfg.ldap.clone().map(Checker::Ldap),
            AuthType::Pam => self.checker = Some(Checker::Pam { service: self.cfg.auth_pam_service.clone() }),
            // The database names the server's user; the client's is not checked.
            AuthType::Any => self.method = AuthType::Trust,
            _ => {}
        }
        if matches!(self.method, AuthType::Ldap | AuthType::Pam) {
            backend::auth_cleartext(&mut self.to_client);
            self.phase = Phase::Password(Pending::External);
            return Step::NeedBytes;
        }
        // PgBouncer's global cert: the certificate's common name is the user name (no
        // map); the user is let in as under trust, but is no console admin for it.
        if self.method == AuthType::Cert
            && let Err(e) = self.check_cert(None)
        {
            return self.close(e);
        }
        if matches!(self.method, AuthType::Trust | AuthType::Cert) {
            let creds = self.credentials_from(configured.as_ref());
            return self.authenticated(creds);
        }
        match configured {
            Some(secret) => self.begin_password(Some(secret)),
            None if self.target.as_ref().is_some_and(|t| self.cfg.auth_lookup(&t.db_cfg).is_some()) => {
                self.phase = Phase::AwaitSecret;
                Step::NeedSecret
            }
            None => self.begin_password(None),
        }
    }

    /// The method a user with `secret` is asked for (None: a user parsnip does not know,
    /// asked for what `auth_type` asks).
    fn method(&self, secret: Option<&Secret>) -> AuthType {
        match (self.method, secret) {
            (AuthType::Password, _) => AuthType::Password,
            (AuthType::Md5, Some(Secret::Scram(_))) => AuthType::ScramSha256,
            (AuthType::ScramSha256, Some(Secret::Md5(_))) => AuthType::Md5,
            (AuthType::Md5, _) => AuthType::Md5,
            _ => AuthType::ScramSha256,
        }
    }

    /// Under `auth_type = "hba"`: the method of the client's line, `cert` and `peer`
    /// checked here (and then as trust, marked as identified: no console admin for it), who
    /// checks the password of an `ldap` or `pam` line; an error for `reject` or no line.
    fn hba_method(&self) -> Result<(AuthType, bool, Option<Checker>), Error> {
        let client = crate::auth::hba::Client {
            addr: if self.transport.unix { None } else { self.transport.addr },
            tls: self.encrypted,
            replication: false,
            db: &self.db,
            user: &self.user,
        };
        let Some(hba) = &self.cfg.hba else {
            tracing::warn!("auth_type is hba but no auth_hba_file was read: refusing");
            return Err(crate::auth::hba::refusal(&client, false));
        };
        let no_entry = || crate::auth::hba::refusal(&client, false);
        if !self.transport.unix && self.transport.addr.is_none() {
            // A TCP client whose address is unknown falls under no line.
            return Err(no_entry());
        }
        let Some(rule) = hba.find(&client) else { return Err(no_entry()) };
        tracing::debug!(user = %self.user, db = %self.db, line = rule.line, method = ?rule.method, "hba line");
        Ok((
            match rule.method {
                Method::Trust => AuthType::Trust,
                Method::Password => AuthType::Password,
                Method::Md5 => AuthType::Md5,
                Method::ScramSha256 => AuthType::ScramSha256,
                Method::Ldap => return Ok((AuthType::Ldap, false, rule.ldap.clone().map(Checker::Ldap))),
                Method::Pam => {
                    let service = rule.pam_service.clone().unwrap_or_else(|| self.cfg.auth_pam_service.clone());
                    return Ok((AuthType::Pam, false, Some(Checker::Pam { service })));
                }
                Method::Reject => return Err(crate::auth::hba::refusal(&client, true)),
                Method::Cert => {
                    self.check_cert(rule.map.as_deref())?;
                    return Ok((AuthType::Trust, true, None));
                }
                Method::Peer => {
                    let allowed =
                        self.transport.os_user.as_deref().is_some_and(|os| self.maps_to_user(rule.map.as_deref(), os));
                    if !allowed {
                        tracing::info!(user = %self.user, os_user = ?self.transport.os_user, map = ?rule.map, "peer is another user");
                        return Err(Error::fatal(
                            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                            format!("Peer authentication failed for user \"{}\"", self.user),
                        ));
                    }
                    return Ok((AuthType::Trust, true, None));
                }
            },
            false,
            None,
        ))
    }

    /// `cert`: a verified client certificate whose common name is the user name, or maps
    /// to it through `map` of `auth_ident_file`; an error (28000, PostgreSQL's words) if not.
    fn check_cert(&self, map: Option<&str>) -> Result<(), Error> {
        let Some(name) = &self.cert_name else {
            return Err(Error::fatal(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                "connection requires a valid client certificate",
            ));
        };
        if !self.maps_to_user(map, name) {
            tracing::info!(user = %self.user, certificate = %name, map = ?map, "certificate name is not the user name");
            return Err(Error::fatal(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                format!("certificate authentication failed for user \"{}\"", self.user),
            ));
        }
        Ok(())
    }

    /// Whether `system` (a certificate's common name, a peer's OS user) may log in as the
    /// user: without a map when it is the user name; with one when `auth_ident_file` has a
    /// line of that map allowing it (PostgreSQL's rule: no implicit identity).
    fn maps_to_user(&self, map: Option<&str>, system: &str) -> bool {
        match map {
            None => system == self.user,
            Some(map) => match &self.cfg.ident {
                Some(ident) => ident.allows(map, system, &self.user),
                None => {
                    tracing::warn!(map, "an hba line names a map but no auth_ident_file was read: refusing");
                    false
                }
            },
        }
    }

    /// Asks the client for its password the way `secret` can check it (None: an unknown
    /// user, asked the same way and refused at the end).
    pub(super) fn begin_password(&mut self, secret: Option<Secret>) -> Step {
        let pending = match self.method(secret.as_ref()) {
            AuthType::Password => {
                backend::auth_cleartext(&mut self.to_client);
                Pending::Cleartext(secret)
            }
            AuthType::Md5 => {
                let salt = self.entropy.md5_salt;
                backend::auth_md5(&mut self.to_client, salt);
                Pending::Md5 { secret, salt }
            }
            _ => {
                // The verifier the exchange runs with: the stored one, one derived from a
                // plain password, or a mock one; the last two with a salt stable per name,
                // as a stored verifier's is.
                let key = &self.entropy.salt_key;
                let verifier = match &secret {
                    Some(Secret::Scram(s)) => Some(s.clone()),
                    Some(Secret::Plain(p)) => Some(ScramSecret::from_password(
                        p,
                        &auth::derived_salt(key, &self.user),
                        auth::DEFAULT_ITERATIONS,
                    )),
                    Some(Secret::Md5(_)) => None,
                    None => Some(auth::mock_secret(key, &self.user)),
                };
                let server =
                    verifier.and_then(|v| ScramServer::new(&Secret::Scram(v), self.entropy.scram_nonce.clone()));
                let Some(server) = server else {
                    let user = self.user.clone();
                    return self.close(wrong_password(&user));
                };
                // As PostgreSQL: over TLS, the channel-binding variant first.
                if self.end_point.is_some() {
                    backend::auth_sasl(&mut self.to_client, &[auth::SCRAM_SHA_256_PLUS, auth::SCRAM_SHA_256]);
                } else {
                    backend::auth_sasl(&mut self.to_client, &[auth::SCRAM_SHA_256]);
                }
                Pending::ScramFirst(Scram { server: Box::new(server), secret })
            }
        };
        self.phase = Phase::Password(pending);
        Step::NeedBytes
    }

    /// The client's bytes while a password message is awaited.
    pub(super) fn on_auth_bytes(&mut self, buf: &mut BytesMut) -> Step {
        let Phase::Password(pending) = &self.phase else { return Step::NeedBytes };
        let sasl = pending.is_sasl();
        // PostgreSQL reads the type byte first: any other message is refused at once.
        match buf.first() {
            None => return Step::NeedBytes,
            Some(&t) if t != tags::PASSWORD => {
                let what = if sasl { "SASL" } else { "password" };
                return self.close(Error::protocol(format!("expected {what} response, got message type {t}")));
            }
            Some(_) => {}
        }
        match split_frame(buf, MAX_AUTH_MESSAGE + 1) {
            Ok(Some(n)) => {
                let frame = buf.split_to(n);
                self.on_password(body(&frame))
            }
            Ok(None) => Step::NeedBytes,
            Err(e) => {
                // PostgreSQL logs "invalid message length" and gives up: a SASL exchange as
                // failed, a password exchange without a word.
                tracing::info!(error = %e, user = %self.user, "invalid message length during authentication");
                if sasl {
                    let user = self.user.clone();
                    self.close(wrong_password(&user))
                } else {
                    self.close_quietly()
                }
            }
        }
    }

    /// The data of a password message (type 'p') while one is awaited.
    fn on_password(&mut self, data: &[u8]) -> Step {
        let Phase::Password(pending) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return Step::NeedBytes;
        };
        let user = self.user.clone();
        match pending {
            Pending::Cleartext(secret) => {
                let pw = match password_string(data) {
                    Ok(pw) => pw,
                    Err(e) => return self.close(e),
                };
                match secret {
                    Some(secret) if auth::verify_cleartext(&secret, &user, pw) => {
                        self.authenticated(Credentials::Password(String::from_utf8_lossy(pw).into_owned()))
                    }
                    _ => self.close(wrong_password(&user)),
                }
            }
            Pending::External => {
                let pw = match password_string(data) {
                    Ok(pw) => Cleartext(pw.to_vec()),
                    Err(e) => return self.close(e),
                };
                let Some(checker) = self.checker.clone() else {
                    tracing::warn!(user, "ldap authentication without LDAP options read: refusing");
                    return self.close(self.external_failure());
                };
                self.phase = Phase::AwaitVerdict(pw.clone());
                Step::CheckPassword { checker, user, password: pw }
            }
            Pending::Md5 { secret, salt } => {
                let resp = match password_string(data) {
                    Ok(r) => r,
                    Err(e) => return self.close(e),
                };
                match secret {
                    Some(secret) if auth::verify_md5(&secret, &user, salt, resp) => {
                        let creds = self.credentials_from(Some(&secret));
                        self.authenticated(creds)
                    }
                    _ => self.close(wrong_password(&user)),
                }
            }
            Pending::ScramFirst(mut scram) => {
                let first = match self.sasl_initial(data) {
                    Ok((binding, first)) => {
                        scram.server.set_binding(binding);
                        first
                    }
                    Err(e) => return self.close(e),
                };
                match first {
                    Some(first) => self.scram_client_first(scram, first),
                    None => {
                        // No initial response: an empty challenge, answered with it.
                        backend::auth_sasl_continue(&mut self.to_client, &[]);
                        self.phase = Phase::Password(Pending::ScramClientFirst(scram));
                        Step::NeedBytes
                    }
                }
            }
            Pending::ScramClientFirst(scram) => self.scram_client_first(scram, data),
            Pending::ScramFinal(mut scram) => {
                let fin = match scram_data(data) {
                    Ok(d) => scram.server.handle_client_final(d).map_err(|e| scram_error(e, &user)),
                    Err(e) => Err(e),
                };
                let fin = match (fin, &scram.secret) {
                    (Ok(fin), Some(_)) => fin,
                    // A mock exchange fails at its proof, as a wrong password does.
                    (Ok(_), None) => return self.close(wrong_password(&user)),
                    (Err(e), _) => return self.close(e),
                };
                backend::auth_sasl_final(&mut self.to_client, &fin);
                let creds = match (&scram.secret, scram.server.client_key()) {
                    (Some(Secret::Scram(s)), Some(client_key)) => {
                        Credentials::ScramKeys { client_key, server_key: s.server_key }
                    }
                    (secret, _) => self.credentials_from(secret.as_ref()),
                };
                self.authenticated(creds)
            }
        }
    }

    /// The answer to `Step::CheckPassword`: whether the password is right. Right: the
    /// client is in, and logs in to the server with that password (unless its database
    /// names another user); wrong: refused as PostgreSQL refuses it.
    pub(crate) fn handle_password_verdict(&mut self, ok: bool) -> Step {
        let Phase::AwaitVerdict(pw) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return Step::NeedBytes;
        };
        if !ok {
            return self.close(self.external_failure());
        }
        self.authenticated(Credentials::Password(String::from_utf8_lossy(&pw.0).into_owned()))
    }

    /// PostgreSQL's refusal when LDAP or PAM says no (or cannot be asked).
    fn external_failure(&self) -> Error {
        let what = if self.method == AuthType::Pam { "PAM" } else { "LDAP" };
        Error::fatal(
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            format!("{what} authentication failed for user \"{}\"", self.user),
        )
    }

    /// client-first-message: answered with server-first-message.
    fn scram_client_first(&mut self, mut scram: Scram, data: &[u8]) -> Step {
        let reply = match scram_data(data) {
            Ok(d) => scram.server.handle_client_first(d).map_err(|e| scram_error(e, &self.user)),
            Err(e) => Err(e),
        };
        match reply {
            Ok(reply) => backend::auth_sasl_continue(&mut self.to_client, &reply),
            Err(e) => return self.close(e),
        }
        self.phase = Phase::Password(Pending::ScramFinal(scram));
        Step::NeedBytes
    }

    /// A SASLInitialResponse read as PostgreSQL reads it: the mechanism (checked before the
    /// rest), then the length of client-first-message and the message; None for length -1
    /// (the client sends it in a SASLResponse after an empty challenge).
    fn sasl_initial<'a>(&self, data: &'a [u8]) -> Result<(ServerBinding, Option<&'a [u8]>), Error> {
        let (mech, rest) = read_cstr(data).ok_or_else(|| Error::protocol("invalid string in message"))?;
        let binding = match (mech, &self.end_point) {
            (m, Some(hash)) if m == auth::SCRAM_SHA_256_PLUS.as_bytes() => ServerBinding::Selected(hash.clone()),
            (m, Some(_)) if m == auth::SCRAM_SHA_256.as_bytes() => ServerBinding::Declined,
            (m, None) if m == auth::SCRAM_SHA_256.as_bytes() => ServerBinding::NotOffered,
            _ => return Err(Error::protocol("client selected an invalid SASL authentication mechanism")),
        };
        let len = rest.get(..4).ok_or_else(insufficient_data)?;
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        let rest = &rest[4..];
        let (first, left) = if len == -1 {
            (None, rest)
        } else {
            let n = usize::try_from(len).ok().filter(|&n| n <= rest.len()).ok_or_else(insufficient_data)?;
            (Some(&rest[..n]), &rest[n..])
        };
        if !left.is_empty() {
            return Err(Error::protocol("invalid message format"));
        }
        Ok((binding, first))
    }
}
