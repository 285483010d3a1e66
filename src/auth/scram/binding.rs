//! SCRAM channel binding of type `tls-server-end-point` (RFC 5929 section 4): the hash of
//! the TLS server's certificate, the hash function chosen by the certificate's own
//! signature algorithm (MD5 and SHA-1 are replaced by SHA-256), as PostgreSQL and libpq
//! compute it.
//!
//! The certificate is read with a small DER walk, only as far as its signatureAlgorithm:
//!
//! ```text
//! Certificate ::= SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm AlgorithmIdentifier, signature BIT STRING }
//! AlgorithmIdentifier ::= SEQUENCE { algorithm OBJECT IDENTIFIER, parameters ANY OPTIONAL }
//! ```

use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

/// The one channel-binding type PostgreSQL (and parsnip) supports.
pub(crate) const TLS_SERVER_END_POINT: &str = "tls-server-end-point";

/// A hash function a certificate's signature algorithm names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hash {
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

/// The `tls-server-end-point` channel-binding data of the DER certificate `cert`: its hash
/// by the hash function of its signature algorithm. None when the certificate cannot be
/// parsed or its algorithm names no hash function (Ed25519, Ed448): then there is no
/// channel binding to offer (PostgreSQL fails such an exchange too).
#[must_use]
pub(crate) fn tls_server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    let hash = signature_hash(cert)?;
    Some(match hash {
        Hash::Sha224 => Sha224::digest(cert).to_vec(),
        Hash::Sha256 => Sha256::digest(cert).to_vec(),
        Hash::Sha384 => Sha384::digest(cert).to_vec(),
        Hash::Sha512 => Sha512::digest(cert).to_vec(),
    })
}

/// One DER element at the start of `input`: (tag, contents, the rest after it).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // Long form: the low bits say how many length bytes follow (at most 4 here).
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;

/// The hash function of the certificate's signatureAlgorithm, mapped as RFC 5929 says.
fn signature_hash(cert: &[u8]) -> Option<Hash> {
    let (tag, certificate, _) = element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, _tbs, rest) = element(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, alg, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, oid, params) = element(alg)?;
    if tag != OID {
        return None;
    }
    algorithm_hash(oid, params)
}

/// 1.2.840.113549.1.1 (PKCS #1) followed by one arc.
const PKCS1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
/// 1.2.840.10045.4 (ANSI X9.62 signatures) followed by more arcs.
const X962_SIGS: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
/// 2.16.840.1.101.3.4.3 (NIST signature algorithms) followed by one arc.
const NIST_SIGS: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03];
/// 2.16.840.1.101.3.4.2 (NIST hash algorithms) followed by one arc.
const NIST_HASHES: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02];
/// 1.2.840.10040.4.3: dsa-with-sha1.
const DSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x03];
/// 1.3.14.3.2.26: id-sha1.
const SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a];
/// 1.3.14.3.2.29: sha1WithRSASignature (OIW).
const OIW_SHA1_RSA: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1d];

/// The hash of signature algorithm `oid` (its encoded arcs); `params`: the
/// AlgorithmIdentifier's parameters (RSASSA-PSS names its hash there).
fn algorithm_hash(oid: &[u8], params: &[u8]) -> Option<Hash> {
    if let Some(arc) = oid.strip_prefix(PKCS1) {
        return match arc {
            // md5WithRSAEncryption, sha1WithRSAEncryption: SHA-256, as RFC 5929 says.
            [4] | [5] => Some(Hash::Sha256),
            [10] => pss_hash(params),
            [11] => Some(Hash::Sha256),
            [12] => Some(Hash::Sha384),
            [13] => Some(Hash::Sha512),
            [14] => Some(Hash::Sha224),
            _ => None,
        };
    }
    if let Some(arcs) = oid.strip_prefix(X962_SIGS) {
        return match arcs {
            // ecdsa-with-SHA1.
            [1] => Some(Hash::Sha256),
            [3, 1] => Some(Hash::Sha224),
            [3, 2] => Some(Hash::Sha256),
            [3, 3] => Some(Hash::Sha384),
            [3, 4] => Some(Hash::Sha512),
            _ => None,
        };
    }
    if let Some(arc) = oid.strip_prefix(NIST_SIGS) {
        return match arc {
            // dsa-with-sha224, dsa-with-sha256.
            [1] => Some(Hash::Sha224),
            [2] => Some(Hash::Sha256),
            _ => None,
        };
    }
    if oid == DSA_SHA1 || oid == OIW_SHA1_RSA {
        return Some(Hash::Sha256);
    }
    None
}

/// RSASSA-PSS-params ::= SEQUENCE { hashAlgorithm [0] AlgorithmIdentifier DEFAULT sha1, ... }
fn pss_hash(params: &[u8]) -> Option<Hash> {
    let (tag, seq, _) = element(params)?;
    if tag != SEQUENCE {
        return None;
    }
    match element(seq) {
        Some((0xa0, explicit, _)) => {
            let (tag, alg, _) = element(explicit)?;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, _) = element(alg)?;
            if tag != OID {
                return None;
            }
            hash_oid(oid)
        }
        // The default hash, SHA-1: SHA-256 for channel binding.
        _ => Some(Hash::Sha256),
    }
}

fn hash_oid(oid: &[u8]) -> Option<Hash> {
    if oid == SHA1 {
        return Some(Hash::Sha256);
    }
    match oid.strip_prefix(NIST_HASHES)? {
        [1] => Some(Hash::Sha256),
        [2] => Some(Hash::Sha384),
        [3] => Some(Hash::Sha512),
        [4] => Some(Hash::Sha224),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_der(alg: &'static rcgen::SignatureAlgorithm) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(alg).expect("key");
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.self_signed(&key).expect("certificate").der().to_vec()
    }

    #[test]
    fn the_hash_follows_the_signature_algorithm() {
        let p256 = cert_der(&rcgen::PKCS_ECDSA_P256_SHA256);
        let hash = tls_server_end_point(&p256).expect("ECDSA P-256 with SHA-256");
        assert_eq!(hash.len(), 32);
        assert_eq!(hash, Sha256::digest(&p256).to_vec());
        let p384 = cert_der(&rcgen::PKCS_ECDSA_P384_SHA384);
        let hash = tls_server_end_point(&p384).expect("ECDSA P-384 with SHA-384");
        assert_eq!(hash.len(), 48);
        assert_eq!(hash, Sha384::digest(&p384).to_vec());
        // Ed25519 names no hash function: no channel binding.
        assert_eq!(tls_server_end_point(&cert_der(&rcgen::PKCS_ED25519)), None);
    }

    #[test]
    fn algorithm_oids() {
        assert_eq!(algorithm_hash(&[PKCS1, &[5]].concat(), &[]), Some(Hash::Sha256), "SHA-1 becomes SHA-256");
        assert_eq!(algorithm_hash(&[PKCS1, &[4]].concat(), &[]), Some(Hash::Sha256), "MD5 becomes SHA-256");
        assert_eq!(algorithm_hash(&[PKCS1, &[13]].concat(), &[]), Some(Hash::Sha512));
        assert_eq!(algorithm_hash(&[X962_SIGS, &[1]].concat(), &[]), Some(Hash::Sha256));
        // RSASSA-PSS with SHA-384: SEQUENCE { [0] { SEQUENCE { OID sha384 } } }.
        let sha384 = [NIST_HASHES, &[2]].concat();
        let mut alg = vec![OID, sha384.len() as u8];
        alg.extend_from_slice(&sha384);
        let mut explicit = vec![SEQUENCE, alg.len() as u8];
        explicit.extend_from_slice(&alg);
        let mut tagged = vec![0xa0, explicit.len() as u8];
        tagged.extend_from_slice(&explicit);
        let mut params = vec![SEQUENCE, tagged.len() as u8];
        params.extend_from_slice(&tagged);
        assert_eq!(algorithm_hash(&[PKCS1, &[10]].concat(), &params), Some(Hash::Sha384));
        assert_eq!(algorithm_hash(&[PKCS1, &[10]].concat(), &[SEQUENCE, 0]), Some(Hash::Sha256), "PSS default");
        assert_eq!(algorithm_hash(&[PKCS1, &[1]].concat(), &[]), None, "rsaEncryption is no signature");
    }

    #[test]
    fn garbage_is_no_certificate() {
        for bad in [&b""[..], b"\x30", b"\x30\x85\x01\x02\x03\x04\x05", b"\x30\x03\x30\x01", b"\x04\x00"] {
            assert_eq!(tls_server_end_point(bad), None, "{bad:?}");
        }
    }
}
