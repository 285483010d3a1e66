//! Certificates made in the test (rcgen): a CA, and leaf certificates signed by it, written
//! as PEM files into a temp dir.

#![allow(dead_code)]

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::path::PathBuf;

/// A CA and one certificate it signed, as PEM text and files.
pub struct Certs {
    /// The CA certificate's file.
    pub ca_file: PathBuf,
    /// The leaf certificate's file.
    pub cert_file: PathBuf,
    /// Its key's file (mode 0600).
    pub key_file: PathBuf,
    /// The leaf certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    pub key_pem: String,
}

impl Certs {
    /// A fresh CA and a certificate for `names` (DNS names or IP addresses).
    pub fn new(names: &[&str]) -> Certs {
        let dir = super::temp_path("tls");
        std::fs::create_dir_all(&dir).expect("cert dir");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own: OpenSSL finds an issuer by name.
        let ca_name = format!("parsnip test CA {}", dir.display());
        ca_params.distinguished_name.push(DnType::CommonName, ca_name);
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("parsnip"));
        let cert = params.signed_by(&key, &issuer).expect("leaf certificate");
        let certs = Certs {
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("cert.pem"),
            key_file: dir.join("key.pem"),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        std::fs::write(&certs.ca_file, ca_cert.pem()).expect("write CA");
        std::fs::write(&certs.cert_file, &certs.cert_pem).expect("write cert");
        std::fs::write(&certs.key_file, &certs.key_pem).expect("write key");
        std::fs::set_permissions(&certs.key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("key mode");
        certs
    }

    /// The CA file's path as a string.
    pub fn ca(&self) -> String {
        self.ca_file.display().to_string()
    }
    /// The certificate file's path as a string.
    pub fn cert(&self) -> String {
        self.cert_file.display().to_string()
    }
    /// The key file's path as a string.
    pub fn key(&self) -> String {
        self.key_file.display().to_string()
    }
}
