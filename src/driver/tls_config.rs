//! The rustls configurations built from parsnip's: what clients are shown (certificate,
//! key, ALPN `postgresql`, and the certificate's SCRAM channel-binding hash, kept with the
//! configuration that shows it so a reload cannot part them) and how servers are checked
//! (with `client_tls_ca_file`, client certificates asked for and verified, and the common
//! name hba's `cert` compares) (libpq's sslmode: `require` checks nothing, `verify-ca` the chain, `verify-full` the
//! chain and the host name; libpq's channel_binding).
//!
//! Owns: reading the PEM files and choosing the verifier. Must not touch sockets.

use crate::config::{ChannelBinding, Config, ServerTlsMode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use std::sync::Arc;

use crate::protocol::startup::ALPN;

/// How parsnip talks TLS to servers.
#[derive(Debug)]
pub(crate) struct ServerTls {
    /// The sslmode.
    pub(crate) mode: ServerTlsMode,
    /// The rustls configuration (None: `disable`).
    pub(crate) config: Option<Arc<ClientConfig>>,
    /// SCRAM channel binding (libpq's `channel_binding`).
    pub(crate) channel_binding: ChannelBinding,
}

/// What clients are shown: the rustls configuration and, computed from the same
/// certificate, its `tls-server-end-point` hash (None: its signature algorithm names no
/// hash, so SCRAM-SHA-256-PLUS is not offered). A login takes both from one load, so the
/// hash is the one of the certificate its handshake showed, whatever a reload swaps in.
#[derive(Debug)]
pub(crate) struct ClientTls {
    /// The rustls configuration.
    pub(crate) config: Arc<ServerConfig>,
    /// The channel-binding hash of its end-entity certificate.
    pub(crate) end_point: Option<Vec<u8>>,
}

pub(super) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of the PEM file `path`, as trusted roots.
pub(super) fn roots(path: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots.add(c).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(roots)
}

fn certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path}: no certificate in the file"));
    }
    Ok(certs)
}

fn key(path: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{path}: {e}"))
}

/// What clients are shown, when a certificate is configured.
pub(crate) fn for_clients(cfg: &Config) -> Result<Option<Arc<ClientTls>>, String> {
    let (Some(cert), Some(k)) = (&cfg.client_tls_cert_file, &cfg.client_tls_key_file) else {
        return Ok(None);
    };
    let chain = certs(cert)?;
    // The end-entity certificate comes first in the file (rustls shows the chain as given).
    let end_point = chain.first().and_then(|c| crate::auth::tls_server_end_point(c));
    if end_point.is_none() {
        tracing::warn!(
            "{cert}: the certificate's signature algorithm names no hash function: SCRAM-SHA-256-PLUS \
             (channel binding) is not offered to clients"
        );
    }
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &cfg.client_tls_ca_file {
        // Certificates asked for and checked when shown; required under verify-ca/-full.
        Some(path) => {
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(path)?), provider());
            let v = if cfg.client_tls_mode().verifies() { v } else { v.allow_unauthenticated() };
            builder.with_client_cert_verifier(v.build().map_err(|e| format!("client_tls_ca_file: {e}"))?)
        }
        None => builder.with_no_client_auth(),
    };
    let mut sc = builder
        .with_single_cert(chain, key(k)?)
        .map_err(|e| format!("client_tls_cert_file / client_tls_key_file: {e}"))?;
    sc.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Some(Arc::new(ClientTls { config: Arc::new(sc), end_point })))
}

/// The common name of a certificate's subject (the first one, as PostgreSQL's `cert`
/// reads it); None when it has none or cannot be read.
pub(crate) fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// How servers are checked.
pub(crate) fn for_servers(cfg: &Config) -> Result<ServerTls, String> {
    let mut mode = cfg.server_tls_sslmode;
    let channel_binding = cfg.server_channel_binding;
    if mode == ServerTlsMode::Disable {
        return Ok(ServerTls { mode, config: None, channel_binding });
    }
    let provider = provider();
    let algs = provider.signature_verification_algorithms;
    let roots = match &cfg.server_tls_ca_file {
        Some(path) => {
            let roots = roots(path)?;
            // As libpq: with a root certificate, require checks the chain (verify-ca).
            if mode == ServerTlsMode::Require {
                mode = ServerTlsMode::VerifyCa;
            }
            Some(Arc::new(roots))
        }
        None => None,
    };
    let chain = match (mode.verifies(), roots) {
        (true, Some(roots)) => Some(
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("server_tls_ca_file: {e}"))?,
        ),
        (true, None) => return Err("server_tls_sslmode verify-ca / verify-full needs server_tls_ca_file".into()),
        (false, _) => None,
    };
    let verifier = Arc::new(Verifier { chain, check_name: mode == ServerTlsMode::VerifyFull, algs });
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut cc = match (&cfg.server_tls_cert_file, &cfg.server_tls_key_file) {
        (Some(c), Some(k)) => builder
            .with_client_auth_cert(certs(c)?, key(k)?)
            .map_err(|e| format!("server_tls_cert_file / server_tls_key_file: {e}"))?,
        _ => builder.with_no_client_auth(),
    };
    cc.alpn_protocols = vec![ALPN.to_vec()];
    Ok(ServerTls { mode, config: Some(Arc::new(cc)), channel_binding })
}

/// The name a server's certificate is checked against (an IP address or a DNS name).
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: not a host name for TLS: {e}"))
}

/// How a server's certificate is checked: `chain` None is `require` (encrypted, the
/// certificate unchecked, as libpq's sslmode=require; the handshake's signatures are still
/// verified); `verify-ca` and `verify-full` check the chain with webpki, `verify-ca` then
/// forgiving a name mismatch.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(NotValidForName | NotValidForNameContext { .. }))
                if !self.check_name =>
            {
                Ok(ServerCertVerified::assertion())
            }
            r => r,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}
