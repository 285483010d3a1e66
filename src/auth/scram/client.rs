//! SCRAM-SHA-256 and SCRAM-SHA-256-PLUS client side: parsnip authenticating to PostgreSQL.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::{
    SCRAM_SHA_256, SCRAM_SHA_256_PLUS, TLS_SERVER_END_POINT, as_str, auth_message, check_extensions, decode_base64,
    decode_key, expect_attribute, hmac_sha256, is_valid_nonce, random_nonce, salted_password_cached, saslprep, sha256,
    xor,
};
use crate::auth::{AuthError, ct_eq};

/// Client side: parsnip authenticating to PostgreSQL.
///
/// Send [`client_first`](Self::client_first) in SASLInitialResponse, feed the
/// AuthenticationSASLContinue data to [`handle_server_first`](Self::handle_server_first) and
/// send the result in SASLResponse, then feed the AuthenticationSASLFinal data to
/// [`handle_server_final`](Self::handle_server_final). Any error ends the exchange; calls out
/// of order return `AuthError::Malformed` and leave the state unchanged.
pub(crate) struct ScramClient {
    credential: Credential,
    binding: ClientBinding,
    nonce: String,
    /// Always empty outside tests: PostgreSQL ignores it (RFC 7677's vector needs "user").
    user: String,
    state: State,
}

/// The channel binding parsnip uses towards a server, as libpq chooses it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum ClientBinding {
    /// gs2 flag `n`: plaintext, or `channel_binding=disable`.
    #[default]
    No,
    /// gs2 flag `y`: parsnip could bind (TLS is on) but the server offered no
    /// SCRAM-SHA-256-PLUS; a server that does support binding refuses this as a downgrade.
    NotOffered,
    /// SCRAM-SHA-256-PLUS with `p=tls-server-end-point`: the hash of the server's
    /// certificate (see `tls_server_end_point`).
    Plus(Vec<u8>),
}

enum Credential {
    /// The password, after SASLprep.
    Password(Vec<u8>),
    ClientKey {
        client_key: [u8; 32],
        server_key: Option<[u8; 32]>,
    },
}

enum State {
    /// client-first sent (or about to be), waiting for server-first.
    Initial,
    /// client-final sent; the expected server signature if it can be computed.
    SentFinal { server_signature: Option<[u8; 32]> },
    /// The server is authenticated (as far as possible).
    Done,
    /// The exchange failed.
    Failed,
}

impl ScramClient {
    /// Authenticates with a password. `client_nonce` must be printable ASCII without ','
    /// (see [`ScramClient::random_nonce`]).
    #[must_use]
    pub(crate) fn with_password(password: &str, client_nonce: String) -> ScramClient {
        ScramClient::new(Credential::Password(saslprep(password.as_bytes()).into_owned()), client_nonce)
    }

    /// Authenticates with a ClientKey (recovered by ScramServer::client_key) instead of a password;
    /// `server_key` if known is used to verify the server's signature, else verification of
    /// server-final is skipped (only the "v=" shape is checked).
    ///
    /// The salt and iteration count the server sends are not used: the ClientKey already
    /// depends on them, so it only works if PostgreSQL's secret is the one it came from.
    #[must_use]
    pub(crate) fn with_client_key(
        client_key: [u8; 32],
        server_key: Option<[u8; 32]>,
        client_nonce: String,
    ) -> ScramClient {
        ScramClient::new(Credential::ClientKey { client_key, server_key }, client_nonce)
    }

    fn new(credential: Credential, nonce: String) -> ScramClient {
        ScramClient { credential, binding: ClientBinding::No, nonce, user: String::new(), state: State::Initial }
    }

    /// Uses `binding` (default: none, gs2 flag `n`).
    #[must_use]
    pub(crate) fn with_binding(mut self, binding: ClientBinding) -> ScramClient {
        self.binding = binding;
        self
    }

    /// The SASL mechanism to name in SASLInitialResponse.
    #[must_use]
    pub(crate) fn mechanism(&self) -> &'static str {
        match self.binding {
            ClientBinding::Plus(_) => SCRAM_SHA_256_PLUS,
            _ => SCRAM_SHA_256,
        }
    }

    /// The exchange succeeded with channel binding: the server proved it knows the secret
    /// over this very TLS connection (libpq's `channel_bound`).
    #[must_use]
    pub(crate) fn channel_bound(&self) -> bool {
        matches!(self.state, State::Done) && matches!(self.binding, ClientBinding::Plus(_))
    }

    /// gs2-header: the channel-binding flag and an empty authzid.
    fn gs2_header(&self) -> String {
        match self.binding {
            ClientBinding::No => "n,,".to_owned(),
            ClientBinding::NotOffered => "y,,".to_owned(),
            ClientBinding::Plus(_) => format!("p={TLS_SERVER_END_POINT},,"),
        }
    }

    /// The channel-binding attribute of client-final-message: base64 of the gs2 header and,
    /// with PLUS, the certificate hash.
    fn channel_binding_attribute(&self) -> String {
        let mut input = self.gs2_header().into_bytes();
        if let ClientBinding::Plus(hash) = &self.binding {
            input.extend_from_slice(hash);
        }
        STANDARD.encode(input)
    }

    /// A fresh client nonce: 18 random bytes, base64.
    #[must_use]
    pub(crate) fn random_nonce() -> String {
        random_nonce()
    }

    fn client_first_bare(&self) -> String {
        format!("n={},r={}", self.user, self.nonce)
    }

    /// client-first-message: `"n,,n=,r=<nonce>"` (PostgreSQL ignores the user name), with
    /// `y,,` or `p=tls-server-end-point,,` as the binding says.
    #[must_use]
    pub(crate) fn client_first(&self) -> Vec<u8> {
        format!("{}{}", self.gs2_header(), self.client_first_bare()).into_bytes()
    }

    /// Consumes server-first-message (checks the nonce starts with ours, parses salt and iterations,
    /// rejects iterations == 0), returns client-final-message.
    ///
    /// The server nonce must be strictly longer than ours; optional extension attributes after
    /// the iteration count are ignored, a mandatory one ("m=") is rejected.
    pub(crate) fn handle_server_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::Initial) {
            return Err(AuthError::Malformed("unexpected server-first-message"));
        }
        self.state = State::Failed;
        let msg = as_str(msg)?;

        let mut parts = msg.split(',');
        let first = parts.next();
        if first.is_some_and(|p| p.starts_with("m=")) {
            return Err(AuthError::Malformed("unsupported mandatory SCRAM extension"));
        }
        let nonce = expect_attribute(first, b'r', "expected nonce attribute")?;
        if nonce.len() <= self.nonce.len() || !nonce.starts_with(&self.nonce) {
            return Err(AuthError::Malformed("server nonce does not extend the client nonce"));
        }
        if !is_valid_nonce(nonce) {
            return Err(AuthError::Malformed("invalid server nonce"));
        }
        let salt = expect_attribute(parts.next(), b's', "expected salt attribute")?;
        let salt = decode_base64(salt, "invalid salt")?;
        let iterations = expect_attribute(parts.next(), b'i', "expected iteration count attribute")?;
        let iterations = parse_iterations(iterations)?;
        check_extensions(parts)?;

        let (client_key, server_key) = match &self.credential {
            Credential::Password(password) => {
                let salted = salted_password_cached(password, &salt, iterations);
                (hmac_sha256(&salted, &[b"Client Key"]), Some(hmac_sha256(&salted, &[b"Server Key"])))
            }
            Credential::ClientKey { client_key, server_key } => (*client_key, *server_key),
        };

        let without_proof = format!("c={},r={nonce}", self.channel_binding_attribute());
        let auth_message = auth_message(&self.client_first_bare(), msg, &without_proof);
        let client_signature = hmac_sha256(&sha256(&client_key), &[auth_message.as_bytes()]);
        let proof = xor(&client_key, &client_signature);
        self.state =
            State::SentFinal { server_signature: server_key.map(|k| hmac_sha256(&k, &[auth_message.as_bytes()])) };
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes())
    }

    /// Consumes server-final-message; a "e=..." error or a wrong signature -> Err.
    ///
    /// "e=..." gives `AuthError::ServerRejected`, a signature mismatch
    /// `AuthError::BadServerSignature`, anything unparsable `AuthError::Malformed`.
    pub(crate) fn handle_server_final(&mut self, msg: &[u8]) -> Result<(), AuthError> {
        let expected = match self.state {
            State::SentFinal { server_signature } => server_signature,
            _ => return Err(AuthError::Malformed("unexpected server-final-message")),
        };
        self.state = State::Failed;
        let msg = as_str(msg)?;

        let mut parts = msg.split(',');
        let first = parts.next();
        if let Some(error) = first.and_then(|p| p.strip_prefix("e=")) {
            return Err(AuthError::ServerRejected(error.to_owned()));
        }
        let signature = expect_attribute(first, b'v', "expected verifier attribute")?;
        let signature = decode_key(signature, "invalid server signature")?;
        check_extensions(parts)?;
        if let Some(expected) = expected
            && !ct_eq(&signature, &expected)
        {
            return Err(AuthError::BadServerSignature);
        }
        self.state = State::Done;
        Ok(())
    }
}

/// A positive decimal `u32` without sign.
fn parse_iterations(s: &str) -> Result<u32, AuthError> {
    const INVALID: AuthError = AuthError::Malformed("invalid iteration count");
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(INVALID);
    }
    match s.parse::<u32>() {
        Ok(0) | Err(_) => Err(INVALID),
        Ok(n) => Ok(n),
    }
}

impl fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let credential = match self.credential {
            Credential::Password(_) => "Password",
            Credential::ClientKey { .. } => "ClientKey",
        };
        let state = match self.state {
            State::Initial => "Initial",
            State::SentFinal { .. } => "SentFinal",
            State::Done => "Done",
            State::Failed => "Failed",
        };
        f.debug_struct("ScramClient")
            .field("credential", &credential)
            .field("binding", &self.gs2_header())
            .field("nonce", &self.nonce)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ScramSecret;
    use crate::auth::scram::salted_password;

    // RFC 7677, section 3.
    const CLIENT_FIRST: &[u8] = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_FIRST: &[u8] =
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &[u8] =
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &[u8] = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    fn rfc_client(credential: Credential) -> ScramClient {
        let mut client = ScramClient::new(credential, "rOprNGfwEbeRWgbNEkqO".into());
        client.user = "user".into();
        client
    }

    fn rfc_secret() -> ScramSecret {
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("valid base64");
        ScramSecret::from_password("pencil", &salt, 4096)
    }

    #[test]
    fn rfc7677_vector_password() {
        let mut client = rfc_client(Credential::Password(b"pencil".to_vec()));
        assert_eq!(client.client_first(), CLIENT_FIRST);
        assert_eq!(client.handle_server_first(SERVER_FIRST).as_deref(), Ok(CLIENT_FINAL));
        assert_eq!(client.handle_server_final(SERVER_FINAL), Ok(()));
    }

    #[test]
    fn rfc7677_vector_client_key() {
        // ClientKey = HMAC(SaltedPassword, "Client Key"), computed independently here.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("valid base64");
        let salted = salted_password(b"pencil", &salt, 4096);
        assert_eq!(salted_password_cached(b"pencil", &salt, 4096), salted, "cached as derived");
        assert_eq!(salted_password_cached(b"pencil", &salt, 4096), salted, "from the cache");
        assert_ne!(salted_password_cached(b"pencil", &salt, 4097), salted, "keyed by the iterations too");
        let client_key = hmac_sha256(&salted, &[b"Client Key"]);
        assert_eq!(sha256(&client_key), rfc_secret().stored_key);

        for server_key in [Some(rfc_secret().server_key), None] {
            let mut client = rfc_client(Credential::ClientKey { client_key, server_key });
            assert_eq!(client.handle_server_first(SERVER_FIRST).as_deref(), Ok(CLIENT_FINAL));
            assert_eq!(client.handle_server_final(SERVER_FINAL), Ok(()));
        }
    }

    #[test]
    fn rfc7677_vector_bad_signature() {
        let mut client = rfc_client(Credential::Password(b"pencil".to_vec()));
        client.handle_server_first(SERVER_FIRST).expect("valid server-first");
        assert_eq!(
            client.handle_server_final(b"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(AuthError::BadServerSignature)
        );
    }

    #[test]
    fn public_client_first_has_empty_user() {
        let client = ScramClient::with_password("pencil", "abc".into());
        assert_eq!(client.client_first(), b"n,,n=,r=abc");
    }

    #[test]
    fn iterations_parsing() {
        assert_eq!(parse_iterations("4096"), Ok(4096));
        assert_eq!(parse_iterations("4294967295"), Ok(u32::MAX));
        for bad in ["", "0", "-1", "+1", "4294967296", "1.5", " 1", "0x10"] {
            assert!(parse_iterations(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_hides_password() {
        let dbg = format!("{:?}", ScramClient::with_password("hunter2", "abc".into()));
        assert!(!dbg.contains("hunter2"));
    }
}
