//! A server login's authentication exchange: the reply to each Authentication request
//! (cleartext, md5, SCRAM-SHA-256, and SCRAM-SHA-256-PLUS over TLS as `channel_binding`
//! chooses), from the pool's credentials. `server_conn` runs the login and does the IO.

use super::server_conn::{ConnectError, ServerTarget};
use crate::auth::{self, ClientBinding, Credentials, ScramClient};
use crate::config::ChannelBinding;
use crate::protocol::frontend;
use bytes::BytesMut;

/// What a server login can bind its SCRAM exchange to.
pub(super) struct Binding {
    /// `channel_binding`.
    pub(super) mode: ChannelBinding,
    /// The connection is TLS.
    pub(super) tls: bool,
    /// The `tls-server-end-point` hash of the server's certificate.
    pub(super) end_point: Option<Vec<u8>>,
}

impl Binding {
    /// The binding of a SCRAM exchange with a server that offers `mechanisms`, as libpq
    /// chooses it (pg_SASL_init): PLUS when offered over TLS and not disabled; else, on TLS,
    /// "y" (parsnip could bind, the server did not offer it), or "n".
    fn choose(&self, mechanisms: &[&[u8]]) -> Result<ClientBinding, String> {
        let require = self.mode == ChannelBinding::Require;
        if require && !self.tls {
            return Err("channel binding required, but SSL not in use".into());
        }
        let plus = mechanisms.contains(&auth::SCRAM_SHA_256_PLUS.as_bytes());
        let binding = match (plus, self.tls, self.mode) {
            (_, _, ChannelBinding::Disable) => ClientBinding::No,
            // A proxy may have stripped TLS: binding was possible and is not (libpq refuses).
            (true, false, _) => {
                return Err("server offered SCRAM-SHA-256-PLUS authentication over a non-SSL connection".into());
            }
            (true, true, _) => match &self.end_point {
                Some(hash) => ClientBinding::Plus(hash.clone()),
                // A certificate whose signature algorithm names no hash: no binding possible.
                None => ClientBinding::No,
            },
            (false, true, _) => ClientBinding::NotOffered,
            (false, false, _) => ClientBinding::No,
        };
        if require && !matches!(binding, ClientBinding::Plus(_)) {
            return Err("channel binding is required, but server did not offer an authentication method that \
                        supports channel binding"
                .into());
        }
        if !matches!(binding, ClientBinding::Plus(_)) && !mechanisms.contains(&auth::SCRAM_SHA_256.as_bytes()) {
            return Err("server offers no SASL mechanism we support".into());
        }
        Ok(binding)
    }
}

pub(super) fn auth_reply(
    code: i32,
    data: &[u8],
    target: &ServerTarget,
    creds: &Credentials,
    binding: &Binding,
    scram: &mut Option<ScramClient>,
) -> Result<Option<BytesMut>, ConnectError> {
    let mut out = BytesMut::new();
    let no_creds = || ConnectError::Auth(format!("no password known for server login as \"{}\"", target.user));
    // As libpq's check_expected_areq: with channel_binding=require, nothing but SCRAM is
    // answered, and the login must have ended with a bound exchange.
    if binding.mode == ChannelBinding::Require {
        match code {
            10..=12 => {}
            0 if scram.as_ref().is_some_and(ScramClient::channel_bound) => {}
            0 => {
                return Err(ConnectError::Auth(
                    "channel binding required, but server authenticated client without channel binding".into(),
                ));
            }
            _ => {
                return Err(ConnectError::Auth(
                    "channel binding required but not supported by server's authentication request".into(),
                ));
            }
        }
    }
    match code {
        0 => return Ok(None),
        3 => match creds {
            Credentials::Password(p) => frontend::password(&mut out, p.as_bytes(), true),
            _ => return Err(no_creds()),
        },
        5 => {
            let salt: [u8; 4] =
                data.get(..4).and_then(|s| s.try_into().ok()).ok_or_else(|| ConnectError::Io("bad md5 salt".into()))?;
            let secret = match creds {
                Credentials::Password(p) => auth::md5_secret(&target.user, p),
                Credentials::Md5Secret(s) => s.clone(),
                _ => return Err(no_creds()),
            };
            frontend::password(&mut out, auth::md5_response(&secret, salt).as_bytes(), true);
        }
        10 => {
            let mechanisms: Vec<&[u8]> = data.split(|&c| c == 0).filter(|m| !m.is_empty()).collect();
            let chosen = binding.choose(&mechanisms).map_err(ConnectError::Auth)?;
            let client = match creds {
                Credentials::Password(p) => ScramClient::with_password(p, ScramClient::random_nonce()),
                Credentials::ScramKeys { client_key, server_key } => {
                    ScramClient::with_client_key(*client_key, Some(*server_key), ScramClient::random_nonce())
                }
                _ => return Err(no_creds()),
            };
            let client = client.with_binding(chosen);
            tracing::debug!(user = %target.user, mechanism = client.mechanism(), "SCRAM login to the server");
            frontend::sasl_initial_response(&mut out, client.mechanism(), &client.client_first());
            *scram = Some(client);
        }
        11 => {
            let c = scram.as_mut().ok_or_else(|| ConnectError::Io("SASL continue without SASL start".into()))?;
            let msg = c.handle_server_first(data).map_err(|e| ConnectError::Auth(format!("SCRAM: {e}")))?;
            frontend::password(&mut out, &msg, false);
        }
        12 => {
            let c = scram.as_mut().ok_or_else(|| ConnectError::Io("SASL final without SASL start".into()))?;
            c.handle_server_final(data).map_err(|e| ConnectError::Auth(format!("SCRAM: {e}")))?;
            return Ok(None);
        }
        c => {
            return Err(ConnectError::Auth(format!("unsupported server authentication request {c}")));
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(mode: ChannelBinding, tls: bool) -> Binding {
        Binding { mode, tls, end_point: tls.then(|| vec![9; 32]) }
    }

    const PLUS: &[&[u8]] = &[b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"];
    const PLAIN: &[&[u8]] = &[b"SCRAM-SHA-256"];

    #[test]
    fn the_binding_is_chosen_as_libpq_chooses_it() {
        use ChannelBinding::*;
        let plus = ClientBinding::Plus(vec![9; 32]);
        assert_eq!(binding(Prefer, true).choose(PLUS), Ok(plus.clone()));
        assert_eq!(binding(Require, true).choose(PLUS), Ok(plus));
        assert_eq!(binding(Disable, true).choose(PLUS), Ok(ClientBinding::No));
        // TLS, no PLUS offered: "y" (parsnip could bind), or an error under require.
        assert_eq!(binding(Prefer, true).choose(PLAIN), Ok(ClientBinding::NotOffered));
        assert_eq!(binding(Disable, true).choose(PLAIN), Ok(ClientBinding::No));
        let e = binding(Require, true).choose(PLAIN).unwrap_err();
        assert!(e.contains("server did not offer an authentication method that supports channel binding"), "{e}");
        // Plaintext.
        assert_eq!(binding(Prefer, false).choose(PLAIN), Ok(ClientBinding::No));
        assert_eq!(binding(Require, false).choose(PLAIN), Err("channel binding required, but SSL not in use".into()));
        let e = binding(Prefer, false).choose(PLUS).unwrap_err();
        assert!(e.contains("over a non-SSL connection"), "{e}");
        // A server certificate without a usable hash: no binding.
        let no_hash = Binding { mode: Prefer, tls: true, end_point: None };
        assert_eq!(no_hash.choose(PLUS), Ok(ClientBinding::No));
        assert!(binding(Prefer, true).choose(&[b"OTHER"]).is_err());
    }

    #[test]
    fn require_refuses_every_login_but_a_bound_scram_one() {
        let target = ServerTarget::plain("h", 1, "d", "u");
        let creds = Credentials::Password("pw".into());
        let require = binding(ChannelBinding::Require, true);
        for code in [0, 3, 5] {
            let r = auth_reply(code, &[0; 4], &target, &creds, &require, &mut None);
            let Err(ConnectError::Auth(m)) = r else { panic!("{code}: {r:?}") };
            assert!(m.starts_with("channel binding required"), "{m}");
            assert_eq!(ConnectError::Auth(m).to_error().code.0, "28000");
        }
        // An unbound SCRAM exchange that ends in AuthenticationOk is refused too.
        let mut scram = Some(ScramClient::with_password("pw", "n".into()));
        let r = auth_reply(0, &[], &target, &creds, &require, &mut scram);
        let Err(ConnectError::Auth(m)) = r else { panic!("{r:?}") };
        assert_eq!(m, "channel binding required, but server authenticated client without channel binding");
        // prefer: a cleartext password is answered.
        let prefer = binding(ChannelBinding::Prefer, true);
        assert!(auth_reply(3, &[], &target, &creds, &prefer, &mut None).is_ok());
        // The SASL start names the mechanism chosen.
        let mut scram = None;
        let out = auth_reply(10, b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0", &target, &creds, &require, &mut scram)
            .expect("SASLInitialResponse")
            .expect("a reply");
        assert!(out.windows(18).any(|w| w == b"SCRAM-SHA-256-PLUS"));
        assert!(out.windows(24).any(|w| w == b"p=tls-server-end-point,,"));
    }
}
