//! Signed preview tokens (AUTH_SIGNED_URL): stateless, bound to one sandbox and one port,
//! valid until they expire.
//!
//! A token is `v1.{expires}.{nonce}.{mac}`: `expires` in Unix seconds, `nonce` 16 random bytes
//! in hex (two tokens for the same port differ), `mac` HMAC-SHA256 in hex over
//! `preview.v1 \0 sandbox_id \0 port \0 expires \0 nonce` with the key the node and its routers
//! share. Nothing is stored: Unexpose cannot revoke a token, it ends at its expiry (the spec's
//! "metadata only").

use std::path::Path;

use ring::hmac;

use super::Error;

/// The fewest secret bytes a signing key may have.
pub const MIN_KEY_BYTES: usize = 32;

/// Why a token was refused. The proxy answers every one the same way (403, no detail); the
/// reason is for its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not of the token's form.
    #[error("malformed")]
    Malformed,
    /// Signed by another key, or for another sandbox or port, or altered.
    #[error("bad signature")]
    BadSignature,
    /// Past its expiry.
    #[error("expired")]
    Expired,
}

/// Signs and checks tokens with one key.
pub struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer { .. }")
    }
}

impl Signer {
    /// A signer over `secret` (at least [`MIN_KEY_BYTES`]).
    pub fn new(secret: &[u8]) -> Result<Self, Error> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(Error::Config(format!(
                "the preview signing key has {} bytes; it needs at least {MIN_KEY_BYTES}",
                secret.len()
            )));
        }
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        })
    }

    /// A signer over the contents of `path` (surrounding whitespace ignored, so a key written
    /// with `openssl rand -hex 32 > FILE` works as is).
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read(path)
            .map_err(|e| Error::Config(format!("read {}: {e}", path.display())))?;
        Self::new(text.trim_ascii())
    }

    /// A new token for `port` of `sandbox_id`, valid until `expires` (Unix seconds).
    pub fn sign(&self, sandbox_id: &str, port: u16, expires: u64) -> Result<String, Error> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| Error::Config(format!("randomness: {e}")))?;
        let nonce = hex::encode(nonce);
        let tag = hmac::sign(&self.key, &message(sandbox_id, port, expires, &nonce));
        Ok(format!(
            "v1.{expires}.{nonce}.{}",
            hex::encode(tag.as_ref())
        ))
    }

    /// Checks `token` for `port` of `sandbox_id` at `now` (Unix seconds); returns its expiry.
    pub fn verify(
        &self,
        token: &str,
        sandbox_id: &str,
        port: u16,
        now: u64,
    ) -> Result<u64, Refused> {
        let mut parts = token.split('.');
        let (Some("v1"), Some(expires), Some(nonce), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Refused::Malformed);
        };
        let expires: u64 = match expires.parse() {
            Ok(e) if expires.bytes().all(|b| b.is_ascii_digit()) => e,
            _ => return Err(Refused::Malformed),
        };
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Refused::Malformed);
        }
        let mac = hex::decode(mac).map_err(|_| Refused::Malformed)?;
        // The signature first: an expired token of another key says nothing about its expiry.
        hmac::verify(&self.key, &message(sandbox_id, port, expires, nonce), &mac)
            .map_err(|_| Refused::BadSignature)?;
        if now >= expires {
            return Err(Refused::Expired);
        }
        Ok(expires)
    }
}

/// What the MAC covers.
fn message(sandbox_id: &str, port: u16, expires: u64, nonce: &str) -> Vec<u8> {
    format!("preview.v1\0{sandbox_id}\0{port}\0{expires}\0{nonce}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b5f6c1e-7d1a-4c6e-9a53-2f8f7b1d2c3a";
    const OTHER: &str = "9a2b6c1e-7d1a-4c6e-9a53-2f8f7b1d2c3a";

    fn signer(byte: u8) -> Signer {
        Signer::new(&[byte; 32]).unwrap()
    }

    #[test]
    fn a_token_opens_its_port_of_its_sandbox_until_it_expires() {
        let s = signer(1);
        let t = s.sign(ID, 8080, 1_000).unwrap();
        assert_eq!(s.verify(&t, ID, 8080, 999), Ok(1_000));
        assert_eq!(s.verify(&t, ID, 8080, 1_000), Err(Refused::Expired));
        assert_eq!(s.verify(&t, ID, 8081, 10), Err(Refused::BadSignature));
        assert_eq!(s.verify(&t, OTHER, 8080, 10), Err(Refused::BadSignature));
        assert_eq!(
            signer(2).verify(&t, ID, 8080, 10),
            Err(Refused::BadSignature)
        );
        // Two tokens for one port differ (their nonces).
        assert_ne!(t, s.sign(ID, 8080, 1_000).unwrap());
    }

    #[test]
    fn an_altered_token_is_refused() {
        let s = signer(1);
        let t = s.sign(ID, 8080, 1_000).unwrap();
        // A later expiry with the old MAC.
        let later = t.replacen("v1.1000.", "v1.9000.", 1);
        assert_eq!(s.verify(&later, ID, 8080, 10), Err(Refused::BadSignature));
        for bad in [
            "",
            "v1",
            "v2.1000.00000000000000000000000000000000.00",
            "v1.+1000.00000000000000000000000000000000.00",
            "v1.1000.0000.00",
            "v1.1000.00000000000000000000000000000000.zz",
            &format!("{t}.x"),
        ] {
            assert_eq!(
                s.verify(bad, ID, 8080, 10),
                Err(Refused::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn short_keys_are_refused_and_files_are_trimmed() {
        assert!(Signer::new(&[0; 31]).is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        let a = Signer::from_file(&path).unwrap();
        let b = Signer::new("ab".repeat(32).as_bytes()).unwrap();
        let t = a.sign(ID, 3000, 50).unwrap();
        assert_eq!(b.verify(&t, ID, 3000, 1), Ok(50));
        assert!(Signer::from_file(&dir.path().join("missing")).is_err());
    }
}
