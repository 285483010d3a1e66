//! The raw client's own md5 and SCRAM (independent of the pooler's code).

#![allow(dead_code)]

use super::*;

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest as _;
    hex(&md5::Md5::digest(data))
}

/// PostgreSQL's md5 answer: "md5" + md5(md5(password + user) + salt).
pub fn md5_response(user: &str, password: &str, salt: &[u8]) -> String {
    let inner = md5_hex(format!("{password}{user}").as_bytes());
    let mut outer = inner.into_bytes();
    outer.extend_from_slice(salt);
    format!("md5{}", md5_hex(&outer))
}

/// PostgreSQL's stored md5 secret: "md5" + md5(password + user).
pub fn md5_secret(user: &str, password: &str) -> String {
    format!("md5{}", md5_hex(format!("{password}{user}").as_bytes()))
}

pub(crate) struct ScramState {
    password: String,
    nonce: String,
    client_first_bare: String,
    auth_message: String,
    server_key: Vec<u8>,
}

fn hmac256(key: &[u8], data: &[u8]) -> Vec<u8> {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key).expect("hmac key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

impl ScramState {
    pub(crate) fn new(password: &str) -> ScramState {
        let mut raw = [0u8; 18];
        rand::fill(&mut raw[..]);
        let nonce = b64(&raw);
        ScramState {
            password: password.to_string(),
            client_first_bare: format!("n=,r={nonce}"),
            nonce,
            auth_message: String::new(),
            server_key: Vec::new(),
        }
    }

    pub(crate) fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    pub(crate) fn client_final(&mut self, server_first: &str) -> Result<String, PgError> {
        let mut nonce = None;
        let mut salt = None;
        let mut iters = None;
        for part in server_first.split(',') {
            if let Some(v) = part.strip_prefix("r=") {
                nonce = Some(v.to_string());
            } else if let Some(v) = part.strip_prefix("s=") {
                salt = Some(unb64(v)?);
            } else if let Some(v) = part.strip_prefix("i=") {
                iters = v.parse::<u32>().ok();
            }
        }
        let (Some(nonce), Some(salt), Some(iters)) = (nonce, salt, iters) else {
            return Err(io_err(&format!("bad server-first-message {server_first:?}")));
        };
        if !nonce.starts_with(&self.nonce) {
            return Err(io_err("server nonce does not extend ours"));
        }
        let salted = pbkdf2::pbkdf2_hmac_array::<sha2::Sha256, 32>(self.password.as_bytes(), &salt, iters);
        let client_key = hmac256(&salted, b"Client Key");
        let stored_key = {
            use sha2::Digest as _;
            sha2::Sha256::digest(&client_key).to_vec()
        };
        let without_proof = format!("c=biws,r={nonce}");
        self.auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac256(&stored_key, self.auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        self.server_key = hmac256(&salted, b"Server Key");
        Ok(format!("{without_proof},p={}", b64(&proof)))
    }

    pub(crate) fn verify_server(&self, server_final: &str) -> Result<(), PgError> {
        let v = server_final
            .strip_prefix("v=")
            .ok_or_else(|| io_err(&format!("bad server-final-message {server_final:?}")))?;
        let expected = hmac256(&self.server_key, self.auth_message.as_bytes());
        if unb64(v)? != expected {
            return Err(io_err("server signature does not verify"));
        }
        Ok(())
    }
}

fn b64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(s: &str) -> Result<Vec<u8>, PgError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| io_err(&format!("bad base64 {s:?}: {e}")))
}

/// The stored SCRAM secret of `role` on the shared cluster (from pg_authid).
pub fn stored_secret(role: &str) -> String {
    psql("postgres", &format!("SELECT rolpassword FROM pg_authid WHERE rolname = '{role}'"))
}
