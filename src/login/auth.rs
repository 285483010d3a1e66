//! The password exchange of a login: which method a user is asked for (by `auth_type` and
//! the kind of secret held), the challenge, and checking the answer.

use super::{Login, Phase, Step};
use crate::auth::{self, AuthError, Credentials, ScramServer, Secret, ServerBinding};
use crate::config::AuthType;
use crate::error::{Error, SqlState};
use crate::protocol::{backend, body, frontend, tags};

/// A password message the login waits for, and what it is checked against.
pub(super) enum Pending {
    /// An unknown user: asked, as PostgreSQL asks, and refused whatever the answer.
    Refuse,
    /// A cleartext password.
    Cleartext(Secret),
    /// The answer to an md5 challenge with `salt`.
    Md5 { secret: Secret, salt: [u8; 4] },
    /// SASLInitialResponse (SCRAM client-first-message).
    ScramFirst { server: Box<ScramServer>, secret: Secret },
    /// SCRAM client-final-message.
    ScramFinal { server: Box<ScramServer>, secret: Secret },
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
        AuthError::Malformed(detail) => Error::protocol("malformed SCRAM message").with_detail(detail),
        e => Error::protocol(format!("malformed SCRAM message: {e}")),
    }
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
        if self.cfg.auth_type == AuthType::Trust {
            let creds = self.credentials_from(configured.as_ref());
            return self.authenticated(creds);
        }
        match configured {
            Some(secret) => self.begin_password(Some(secret)),
            None if self.cfg.auth_query.is_some() && self.cfg.auth_user.is_some() => {
                self.phase = Phase::AwaitSecret;
                Step::NeedSecret
            }
            None => self.begin_password(None),
        }
    }

    /// Asks the client for its password the way `secret` can check it.
    pub(super) fn begin_password(&mut self, secret: Option<Secret>) -> Step {
        let Some(secret) = secret else {
            // Answer as PostgreSQL does for an unknown role: ask, then refuse the same way.
            backend::auth_cleartext(&mut self.to_client);
            self.phase = Phase::Password(Pending::Refuse);
            return Step::NeedBytes;
        };
        let method = match (self.cfg.auth_type, &secret) {
            (AuthType::Password, _) => AuthType::Password,
            (AuthType::Md5, Secret::Scram(_)) => AuthType::ScramSha256,
            (AuthType::ScramSha256, Secret::Md5(_)) => AuthType::Md5,
            (m, _) => m,
        };
        let pending = match method {
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
                let Some(server) = ScramServer::new(&secret, self.entropy.scram_nonce.clone()) else {
                    let user = self.user.clone();
                    return self.close(wrong_password(&user));
                };
                // As PostgreSQL: over TLS, the channel-binding variant first.
                if self.end_point.is_some() {
                    backend::auth_sasl(&mut self.to_client, &[auth::SCRAM_SHA_256_PLUS, auth::SCRAM_SHA_256]);
                } else {
                    backend::auth_sasl(&mut self.to_client, &[auth::SCRAM_SHA_256]);
                }
                Pending::ScramFirst { server: Box::new(server), secret }
            }
        };
        self.phase = Phase::Password(pending);
        Step::NeedBytes
    }

    /// A frame from the client while a password message is awaited.
    pub(super) fn on_password(&mut self, frame: &[u8]) -> Step {
        let Phase::Password(pending) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return Step::NeedBytes;
        };
        let user = self.user.clone();
        if matches!(pending, Pending::Refuse) {
            return self.close(wrong_password(&user));
        }
        if frame[0] != tags::PASSWORD {
            return self.close(Error::protocol(format!("expected password response, got message type {}", frame[0])));
        }
        let data = body(frame);
        match pending {
            Pending::Refuse => self.close(wrong_password(&user)),
            Pending::Cleartext(secret) => {
                let pw = data.strip_suffix(&[0]).unwrap_or(data);
                if !auth::verify_cleartext(&secret, &user, pw) {
                    return self.close(wrong_password(&user));
                }
                self.authenticated(Credentials::Password(String::from_utf8_lossy(pw).into_owned()))
            }
            Pending::Md5 { secret, salt } => {
                let resp = data.strip_suffix(&[0]).unwrap_or(data);
                if !auth::verify_md5(&secret, &user, salt, resp) {
                    return self.close(wrong_password(&user));
                }
                let creds = self.credentials_from(Some(&secret));
                self.authenticated(creds)
            }
            Pending::ScramFirst { mut server, secret } => {
                let Some((mech, first)) = frontend::sasl_initial_fields(data) else {
                    return self.close(Error::protocol("malformed SASLInitialResponse message"));
                };
                let binding = match (mech, &self.end_point) {
                    (m, Some(hash)) if m == auth::SCRAM_SHA_256_PLUS.as_bytes() => {
                        ServerBinding::Selected(hash.clone())
                    }
                    (m, Some(_)) if m == auth::SCRAM_SHA_256.as_bytes() => ServerBinding::Declined,
                    (m, None) if m == auth::SCRAM_SHA_256.as_bytes() => ServerBinding::NotOffered,
                    _ => {
                        return self.close(Error::protocol("client selected an invalid SASL authentication mechanism"));
                    }
                };
                server.set_binding(binding);
                match server.handle_client_first(first) {
                    Ok(reply) => backend::auth_sasl_continue(&mut self.to_client, &reply),
                    Err(e) => return self.close(scram_error(e, &user)),
                }
                self.phase = Phase::Password(Pending::ScramFinal { server, secret });
                Step::NeedBytes
            }
            Pending::ScramFinal { mut server, secret } => {
                let fin = match server.handle_client_final(data) {
                    Ok(m) => m,
                    Err(e) => return self.close(scram_error(e, &user)),
                };
                backend::auth_sasl_final(&mut self.to_client, &fin);
                let creds = match (&secret, server.client_key()) {
                    (Secret::Scram(s), Some(client_key)) => {
                        Credentials::ScramKeys { client_key, server_key: s.server_key }
                    }
                    _ => self.credentials_from(Some(&secret)),
                };
                self.authenticated(creds)
            }
        }
    }
}
