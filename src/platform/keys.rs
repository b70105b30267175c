//! API keys: `cpk_<key id>_<secret>`, the key id 16 hex digits (public: listed, audited,
//! bound to roles) and the secret 64 hex digits, both from the kernel's CSPRNG. Only the
//! SHA-256 of the whole token is stored (256 random bits need no salt or slow hash: nothing
//! to guess) and compared in constant time. The token is returned once, at creation, and is
//! never logged, stored or echoed in an error.

use sha2::{Digest, Sha256};

/// The prefix of platform API keys (so that secret scanners can recognise them).
pub const PREFIX: &str = "cpk_";

const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// A new key: (key id, token).
pub fn mint() -> Result<(String, String), getrandom::Error> {
    let mut id = [0u8; ID_BYTES];
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut id)?;
    getrandom::fill(&mut secret)?;
    let id = hex::encode(id);
    let token = format!("{PREFIX}{id}_{}", hex::encode(secret));
    Ok((id, token))
}

/// Hex SHA-256 of a token: what the store keeps.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The key id a token claims, if it has the shape of one of ours (nothing is verified).
pub fn key_id_of(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, ID_BYTES * 2) && hex(secret, SECRET_BYTES * 2)).then_some(id)
}

/// Whether `token` is the one whose digest is `stored` (constant time in the digest).
pub fn matches(token: &str, stored: &str) -> bool {
    let d = digest(token);
    d.len() == stored.len()
        && d.bytes()
            .zip(stored.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The token of an `authorization` value: `Bearer <token>` (the relay's parser).
pub use crate::relay::auth::bearer;

/// The secret in file `path` (surrounding whitespace dropped); an empty or unreadable file is
/// an error naming it.
pub fn read_secret(path: &std::path::Path) -> std::io::Result<String> {
    let s = std::fs::read_to_string(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let s = s.trim().to_string();
    if s.len() < 16 || s.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: a peer secret is at least 16 printable ASCII characters",
                path.display()
            ),
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_parse_verify_and_differ() {
        let (id, token) = mint().unwrap();
        assert_eq!(key_id_of(&token), Some(id.as_str()));
        assert_eq!(token.len(), PREFIX.len() + 16 + 1 + 64);
        let stored = digest(&token);
        assert!(matches(&token, &stored));
        assert!(
            !stored.contains(&token[PREFIX.len() + 17..]),
            "the secret is not stored"
        );
        // One character off, or another key: no match.
        let mut off = token.clone().into_bytes();
        let last = off.len() - 1;
        off[last] = if off[last] == b'0' { b'1' } else { b'0' };
        assert!(!matches(std::str::from_utf8(&off).unwrap(), &stored));
        let (id2, token2) = mint().unwrap();
        assert_ne!(id, id2);
        assert!(!matches(&token2, &stored));
    }

    #[test]
    fn only_well_formed_tokens_name_a_key() {
        let (_, token) = mint().unwrap();
        for bad in [
            "",
            "cpk_",
            "cwt_0123456789abcdef",
            &token[..token.len() - 1],
            &token.replace("cpk_", "cpk-"),
            &format!("{token}0"),
            "cpk_0123456789abcdeg_0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert_eq!(key_id_of(bad), None, "{bad}");
        }
        assert_eq!(bearer(&format!("Bearer {token}")), Some(token.as_str()));
        assert_eq!(bearer(&format!("bearer  {token} ")), Some(token.as_str()));
        assert_eq!(bearer(&token), None);
    }
}
