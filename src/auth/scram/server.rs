//! SCRAM-SHA-256 and SCRAM-SHA-256-PLUS server side: parsnip authenticating a client.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{
    DEFAULT_ITERATIONS, TLS_SERVER_END_POINT, as_str, attribute, auth_message, check_extensions, decode_key,
    expect_attribute, hmac_sha256, is_valid_nonce, random_salt, sha256, xor,
};
use crate::auth::{AuthError, ScramSecret, Secret, ct_eq};

/// Server side: parsnip authenticating a client.
///
/// Call [`handle_client_first`](Self::handle_client_first) with the SASLInitialResponse data,
/// send the result in AuthenticationSASLContinue, call
/// [`handle_client_final`](Self::handle_client_final) with the SASLResponse data and send the
/// result in AuthenticationSASLFinal. Any error ends the exchange; calls out of order return
/// `AuthError::Malformed` and leave the state unchanged.
///
/// Channel binding follows the connection and the mechanism the client chose
/// ([`set_binding`](Self::set_binding), before client-first-message); without it, the
/// exchange is plain SCRAM-SHA-256 on a connection that offers no binding.
pub(crate) struct ScramServer {
    secret: ScramSecret,
    server_nonce: String,
    binding: ServerBinding,
    state: State,
}

/// What channel binding an exchange runs with (PostgreSQL's rules, auth-scram.c).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum ServerBinding {
    /// SCRAM-SHA-256-PLUS was not offered (plaintext, or a certificate whose signature
    /// algorithm names no hash): gs2 flags `n` and `y` are accepted, `p=` is not.
    #[default]
    NotOffered,
    /// SCRAM-SHA-256-PLUS was offered and the client chose SCRAM-SHA-256: `n` is accepted;
    /// `y` ("I support binding, and you do not") is a downgrade and refused.
    Declined,
    /// The client chose SCRAM-SHA-256-PLUS: `p=tls-server-end-point` is required, and the
    /// channel-binding data must be this hash of parsnip's certificate.
    Selected(Vec<u8>),
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
    /// The channel-binding attribute client-final must carry: base64 of the gs2 header
    /// (and of the certificate hash, with SCRAM-SHA-256-PLUS).
    channel_binding: String,
    /// Client nonce + server nonce.
    nonce: String,
    client_first_bare: String,
    server_first: String,
}

/// A parsed client-first-message.
struct ClientFirst<'a> {
    channel_binding: String,
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
        Some(ScramServer { secret, server_nonce, binding: ServerBinding::NotOffered, state: State::Initial })
    }

    /// The channel binding of this exchange: what the connection offered and which mechanism
    /// the client chose. Call before [`handle_client_first`](Self::handle_client_first).
    pub(crate) fn set_binding(&mut self, binding: ServerBinding) {
        self.binding = binding;
    }

    /// Same, but generates an 18-byte random nonce, base64-encoded.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_random_nonce(secret: &Secret) -> Option<ScramServer> {
        ScramServer::new(secret, super::random_nonce())
    }

    /// Consumes client-first-message (the SASLInitialResponse data). Accepts gs2 headers "n,,",
    /// "y,," and "p=tls-server-end-point,," as the binding allows (see [`ServerBinding`]: a "y"
    /// where PLUS was offered is `AuthError::ChannelBindingNegotiation`, a flag that does not
    /// fit the mechanism `AuthError::Malformed`); ignores the user name attribute (PostgreSQL
    /// does, it may be empty); rejects extensions ('m=') and malformed input. Returns
    /// server-first-message.
    ///
    /// An authorization identity ("n,a=...,") is rejected as malformed, as PostgreSQL does.
    /// Optional extension attributes after the nonce are ignored.
    pub(crate) fn handle_client_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::Initial) {
            return Err(AuthError::Malformed("unexpected client-first-message"));
        }
        self.state = State::Failed;
        let first = parse_client_first(as_str(msg)?, &self.binding)?;
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

    /// Consumes client-final-message, checks channel-binding attribute ("biws" for "n,,",
    /// "eSws" for "y,,", base64 of the gs2 header and the certificate hash for
    /// "p=tls-server-end-point,,"), nonce, and proof (constant-time). Returns
    /// server-final-message ("v=..."). Wrong proof -> AuthError::WrongPassword.
    ///
    /// Channel-binding data that does not match the certificate gives
    /// `AuthError::ChannelBindingCheck`; a channel-binding attribute that does not repeat the
    /// gs2 header, a nonce mismatch or an unparsable message `AuthError::Malformed`.
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
            return Err(match self.binding {
                ServerBinding::Selected(_) => AuthError::ChannelBindingCheck,
                _ => AuthError::Malformed("unexpected SCRAM channel-binding attribute in client-final-message"),
            });
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

/// PostgreSQL's details for a gs2 flag that does not fit the mechanism chosen.
const PLUS_WITHOUT_DATA: &str =
    "The client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include channel binding data.";
const DATA_WITHOUT_PLUS: &str =
    "The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.";

fn parse_client_first<'a>(msg: &'a str, binding: &ServerBinding) -> Result<ClientFirst<'a>, AuthError> {
    // gs2-header = gs2-cbind-flag "," [ authzid ] ","
    let (flag, rest) = msg.split_once(',').ok_or(AuthError::Malformed("missing gs2 header"))?;
    let channel_binding = match (flag, binding) {
        ("n" | "y", ServerBinding::Selected(_)) => return Err(AuthError::Malformed(PLUS_WITHOUT_DATA)),
        ("n", _) => "biws".to_owned(), // base64("n,,")
        // The client supports binding and thinks parsnip does not: a downgrade if it was offered.
        ("y", ServerBinding::Declined) => return Err(AuthError::ChannelBindingNegotiation),
        ("y", ServerBinding::NotOffered) => "eSws".to_owned(), // base64("y,,")
        (_, ServerBinding::Selected(hash)) if flag.starts_with("p=") => {
            if &flag[2..] != TLS_SERVER_END_POINT {
                return Err(AuthError::Malformed("unsupported SCRAM channel-binding type"));
            }
            // cbind-input = gs2-header cbind-data; the authzid is checked empty below.
            let mut input = format!("{flag},,").into_bytes();
            input.extend_from_slice(hash);
            STANDARD.encode(input)
        }
        _ if flag.starts_with("p=") => return Err(AuthError::Malformed(DATA_WITHOUT_PLUS)),
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
        let binding = match self.binding {
            ServerBinding::NotOffered => "NotOffered",
            ServerBinding::Declined => "Declined",
            ServerBinding::Selected(_) => "Selected",
        };
        f.debug_struct("ScramServer")
            .field("secret", &self.secret)
            .field("binding", &binding)
            .field("state", &state)
            .finish_non_exhaustive()
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
