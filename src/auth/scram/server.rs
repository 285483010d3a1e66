//! SCRAM-SHA-256 server side: parsnip authenticating a client.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{
    DEFAULT_ITERATIONS, as_str, attribute, auth_message, check_extensions, decode_key, expect_attribute, hmac_sha256,
    is_valid_nonce, random_salt, sha256, xor,
};
use crate::auth::{AuthError, ScramSecret, Secret, ct_eq};

/// Server side: parsnip authenticating a client.
///
/// Call [`handle_client_first`](Self::handle_client_first) with the SASLInitialResponse data,
/// send the result in AuthenticationSASLContinue, call
/// [`handle_client_final`](Self::handle_client_final) with the SASLResponse data and send the
/// result in AuthenticationSASLFinal. Any error ends the exchange; calls out of order return
/// `AuthError::Malformed` and leave the state unchanged.
pub(crate) struct ScramServer {
    secret: ScramSecret,
    server_nonce: String,
    state: State,
}

enum State {
    /// Waiting for client-first-message.
    Initial,
    /// Sent server-first-message, waiting for client-final-message.
    SentFirst(Exchange),
    /// Authenticated; the client's ClientKey.
    Done { client_key: [u8; 32] },
    /// The exchange failed; nothing more is accepted.
    Failed,
}

/// What the server remembers between its two messages.
struct Exchange {
    /// The channel-binding attribute client-final must carry: base64 of the gs2 header.
    channel_binding: &'static str,
    /// Client nonce + server nonce.
    nonce: String,
    client_first_bare: String,
    server_first: String,
}

/// A parsed client-first-message.
struct ClientFirst<'a> {
    channel_binding: &'static str,
    bare: &'a str,
    client_nonce: &'a str,
}

impl ScramServer {
    /// `secret` must be Plain or Scram (for Plain, derive a ScramSecret with a random 16-byte salt
    /// and 4096 iterations); returns None for Md5 (SCRAM impossible). `nonce` is the server's
    /// random nonce part (printable ASCII, no ','); inject it so tests are deterministic.
    ///
    /// Also returns None if `server_nonce` is empty or not printable ASCII without ','.
    #[must_use]
    pub(crate) fn new(secret: &Secret, server_nonce: String) -> Option<ScramServer> {
        if !is_valid_nonce(&server_nonce) {
            return None;
        }
        let secret = match secret {
            Secret::Plain(password) => ScramSecret::from_password(password, &random_salt(), DEFAULT_ITERATIONS),
            Secret::Scram(scram) => scram.clone(),
            Secret::Md5(_) => return None,
        };
        Some(ScramServer { secret, server_nonce, state: State::Initial })
    }

    /// Same, but generates an 18-byte random nonce, base64-encoded.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_random_nonce(secret: &Secret) -> Option<ScramServer> {
        ScramServer::new(secret, super::random_nonce())
    }

    /// Consumes client-first-message (the SASLInitialResponse data). Accepts gs2 headers "n,," and "y,,"
    /// (reject "p=..." with AuthError::ChannelBinding); ignores the user name attribute (PostgreSQL does,
    /// it may be empty); rejects extensions ('m=') and malformed input. Returns server-first-message.
    ///
    /// An authorization identity ("n,a=...,") is rejected as malformed, as PostgreSQL does.
    /// Optional extension attributes after the nonce are ignored.
    pub(crate) fn handle_client_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::Initial) {
            return Err(AuthError::Malformed("unexpected client-first-message"));
        }
        self.state = State::Failed;
        let first = parse_client_first(as_str(msg)?)?;
        let nonce = format!("{}{}", first.client_nonce, self.server_nonce);
        let server_first = format!("r={nonce},s={},i={}", STANDARD.encode(&self.secret.salt), self.secret.iterations);
        let reply = server_first.clone().into_bytes();
        self.state = State::SentFirst(Exchange {
            channel_binding: first.channel_binding,
            nonce,
            client_first_bare: first.bare.to_owned(),
            server_first,
        });
        Ok(reply)
    }

    /// Consumes client-final-message, checks channel-binding attribute ("biws" for "n,,", "eSws" for "y,,"),
    /// nonce, and proof (constant-time). Returns server-final-message ("v=..."). Wrong proof -> AuthError::WrongPassword.
    ///
    /// A mismatched channel-binding attribute gives `AuthError::ChannelBinding`, a nonce mismatch
    /// or unparsable message `AuthError::Malformed`.
    pub(crate) fn handle_client_final(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        let exchange = match std::mem::replace(&mut self.state, State::Failed) {
            State::SentFirst(exchange) => exchange,
            other => {
                self.state = other;
                return Err(AuthError::Malformed("unexpected client-final-message"));
            }
        };
        let msg = as_str(msg)?;

        // The proof is the last attribute; what precedes it is signed.
        let (without_proof, proof) =
            msg.rsplit_once(",p=").ok_or(AuthError::Malformed("missing proof in client-final-message"))?;
        let proof = decode_key(proof, "invalid client proof")?;
        let mut parts = without_proof.split(',');
        let channel_binding =
            expect_attribute(parts.next(), b'c', "expected channel-binding attribute in client-final-message")?;
        if channel_binding != exchange.channel_binding {
            return Err(AuthError::ChannelBinding);
        }
        let nonce = expect_attribute(parts.next(), b'r', "expected nonce attribute in client-final-message")?;
        if nonce != exchange.nonce {
            return Err(AuthError::Malformed("SCRAM nonce mismatch"));
        }
        for part in parts {
            match attribute(part) {
                Some((name, _)) if name != b'p' => {}
                _ => {
                    return Err(AuthError::Malformed("invalid attribute in client-final-message"));
                }
            }
        }

        let auth_message = auth_message(&exchange.client_first_bare, &exchange.server_first, without_proof);
        let client_signature = hmac_sha256(&self.secret.stored_key, &[auth_message.as_bytes()]);
        let client_key = xor(&proof, &client_signature);
        if !ct_eq(&sha256(&client_key), &self.secret.stored_key) {
            return Err(AuthError::WrongPassword);
        }
        let server_signature = hmac_sha256(&self.secret.server_key, &[auth_message.as_bytes()]);
        self.state = State::Done { client_key };
        Ok(format!("v={}", STANDARD.encode(server_signature)).into_bytes())
    }

    /// After a successful exchange: the client's ClientKey recovered as ClientProof XOR ClientSignature.
    /// Lets the pooler log in to PostgreSQL as this user without knowing the password.
    ///
    /// The key only works against PostgreSQL if its stored secret has the same salt and
    /// iteration count as the one this server used, i.e. the server was built from the
    /// `Secret::Scram` PostgreSQL has (not from a `Secret::Plain`, which gets a random salt).
    /// None before success or after a failure.
    #[must_use]
    pub(crate) fn client_key(&self) -> Option<[u8; 32]> {
        match self.state {
            State::Done { client_key } => Some(client_key),
            _ => None,
        }
    }
}

fn parse_client_first(msg: &str) -> Result<ClientFirst<'_>, AuthError> {
    // gs2-header = gs2-cbind-flag "," [ authzid ] ","
    let (flag, rest) = msg.split_once(',').ok_or(AuthError::Malformed("missing gs2 header"))?;
    let channel_binding = match flag {
        "n" => "biws", // base64("n,,")
        "y" => "eSws", // base64("y,,")
        _ if flag.starts_with("p=") => return Err(AuthError::ChannelBinding),
        _ => return Err(AuthError::Malformed("invalid channel-binding flag")),
    };
    let (authzid, bare) = rest.split_once(',').ok_or(AuthError::Malformed("missing gs2 header"))?;
    if authzid.starts_with("a=") {
        return Err(AuthError::Malformed("authorization identity is not supported"));
    } else if !authzid.is_empty() {
        return Err(AuthError::Malformed("invalid gs2 header"));
    }

    // client-first-message-bare = [reserved-mext ","] username "," nonce ["," extensions]
    let mut parts = bare.split(',');
    let first = parts.next();
    if first.is_some_and(|p| p.starts_with("m=")) {
        return Err(AuthError::Malformed("unsupported mandatory SCRAM extension"));
    }
    // The user name is ignored: PostgreSQL uses the one from the startup packet.
    expect_attribute(first, b'n', "expected user name attribute")?;
    let client_nonce = expect_attribute(parts.next(), b'r', "expected nonce attribute")?;
    if !is_valid_nonce(client_nonce) {
        return Err(AuthError::Malformed("invalid client nonce"));
    }
    check_extensions(parts)?;
    Ok(ClientFirst { channel_binding, bare, client_nonce })
}

impl fmt::Debug for ScramServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Initial => "Initial",
            State::SentFirst(_) => "SentFirst",
            State::Done { .. } => "Done",
            State::Failed => "Failed",
        };
        f.debug_struct("ScramServer").field("secret", &self.secret).field("state", &state).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677, section 3.
    const CLIENT_FIRST: &[u8] = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_FIRST: &[u8] =
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &[u8] =
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &[u8] = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    fn rfc_server() -> ScramServer {
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("valid base64");
        let secret = Secret::Scram(ScramSecret::from_password("pencil", &salt, 4096));
        ScramServer::new(&secret, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into()).expect("scram")
    }

    #[test]
    fn rfc7677_vector() {
        let mut server = rfc_server();
        assert_eq!(server.handle_client_first(CLIENT_FIRST).as_deref(), Ok(SERVER_FIRST));
        assert_eq!(server.handle_client_final(CLIENT_FINAL).as_deref(), Ok(SERVER_FINAL));
        let client_key = server.client_key().expect("authenticated");
        assert_eq!(sha256(&client_key), server.secret.stored_key);
    }

    #[test]
    fn rfc7677_vector_wrong_proof() {
        let mut server = rfc_server();
        server.handle_client_first(CLIENT_FIRST).expect("valid client-first");
        let mut bad = CLIENT_FINAL.to_vec();
        // Flip one proof character ('d' -> 'e').
        let pos = bad.len() - 44;
        bad[pos] = b'e';
        assert_eq!(server.handle_client_final(&bad), Err(AuthError::WrongPassword));
        assert_eq!(server.client_key(), None);
    }

    #[test]
    fn rfc7677_vector_user_name_is_part_of_signature() {
        // The user name is ignored for lookup but still signed: changing it breaks the proof.
        let mut server = rfc_server();
        server.handle_client_first(b"n,,n=,r=rOprNGfwEbeRWgbNEkqO").expect("valid client-first");
        assert_eq!(server.handle_client_final(CLIENT_FINAL), Err(AuthError::WrongPassword));
    }

    #[test]
    fn debug_hides_keys() {
        let dbg = format!("{:?}", rfc_server());
        assert!(dbg.contains("Initial"));
        assert!(!dbg.contains("WG5d8oPm"));
    }
}
