//! Credentials of external workers: the operator issues one per sandbox_id
//! (`computectl relay token ID`, the admin service on the unix socket), the worker presents it
//! on `SandboxWorker.Attach` as `authorization: Bearer <token>`, and the node keeps only its
//! SHA-256, persisted under `<state_dir>/relay/worker-tokens.json` (0600, written atomically)
//! so that a restart keeps every credential valid.
//!
//! A token is `cwt_` and 64 hex digits: 32 bytes from the kernel's CSPRNG (`getrandom`). With
//! 256 random bits a plain SHA-256 is enough (no salt, no slow hash: there is nothing to
//! guess), and looking the digest up in a map leaks nothing useful through timing. Tokens are
//! never logged, and never stored.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Error;

/// The prefix of the tokens this node makes (so that secret scanners can recognise them).
pub const TOKEN_PREFIX: &str = "cwt_";

/// The shortest token an operator may install (`IssueWorkerToken` with a token).
pub const MIN_TOKEN_LEN: usize = 32;

/// One stored credential.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The sandbox_id it lets a worker attach for.
    pub sandbox_id: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    /// RFC 3339.
    pub issued_at: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    tokens: Vec<Entry>,
}

/// The credential store: at most one credential per sandbox_id (issuing again rotates it).
#[derive(Debug)]
pub struct Credentials {
    path: PathBuf,
    /// sandbox_id → entry. Loaded by [`Credentials::load`]; empty (so every external worker
    /// is refused) until then.
    by_id: Mutex<HashMap<String, Entry>>,
}

/// A new random token.
pub fn new_token() -> Result<String, Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| Error::Random(e.to_string()))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(b)))
}

/// Hex SHA-256 of a token.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The token of an `authorization` header value: `Bearer <token>` (scheme case-insensitive).
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Credentials {
    /// A store kept in `path`; nothing is read until [`Credentials::load`].
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            by_id: Mutex::new(HashMap::new()),
        }
    }

    /// Where the store lives under a state directory.
    pub fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join("relay").join("worker-tokens.json")
    }

    /// (Re)reads the file; a missing file is an empty store. Blocking.
    pub fn load(&self) -> Result<usize, Error> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                lock(&self.by_id).clear();
                return Ok(0);
            }
            Err(source) => {
                return Err(Error::Store {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let f: File = serde_json::from_str(&text).map_err(|e| Error::Store {
            path: self.path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?;
        let map: HashMap<String, Entry> = f
            .tokens
            .into_iter()
            .map(|e| (e.sandbox_id.clone(), e))
            .collect();
        let n = map.len();
        *lock(&self.by_id) = map;
        Ok(n)
    }

    /// Checks a presented token for `sandbox_id`: Unauthenticated when absent or unknown,
    /// PermissionDenied when it is valid for another sandbox_id.
    pub fn verify(&self, sandbox_id: &str, token: Option<&str>) -> Result<(), Error> {
        let token = token.ok_or(Error::Unauthenticated("no credential"))?;
        let d = digest(token);
        let by_id = lock(&self.by_id);
        if by_id.get(sandbox_id).is_some_and(|e| e.sha256 == d) {
            return Ok(());
        }
        if by_id.values().any(|e| e.sha256 == d) {
            return Err(Error::PermissionDenied {
                sandbox_id: sandbox_id.to_string(),
                why: "the credential is for another sandbox_id",
            });
        }
        Err(Error::Unauthenticated("invalid credential"))
    }

    /// Issues (or, with `token`, installs) the credential of `sandbox_id`, replacing an
    /// earlier one. Returns the token to show once (None when it was given) and whether one
    /// was replaced. Blocking: persists before answering.
    pub fn issue(
        &self,
        sandbox_id: &str,
        token: Option<&str>,
    ) -> Result<(Option<String>, bool), Error> {
        if sandbox_id.is_empty() {
            return Err(Error::InvalidArgument("sandbox_id is required".into()));
        }
        let (shown, sha256) = match token {
            Some(t) if t.len() < MIN_TOKEN_LEN || t.chars().any(|c| !c.is_ascii_graphic()) => {
                return Err(Error::InvalidArgument(format!(
                    "a token must be at least {MIN_TOKEN_LEN} printable ASCII characters"
                )))
            }
            Some(t) => (None, digest(t)),
            None => {
                let t = new_token()?;
                let d = digest(&t);
                (Some(t), d)
            }
        };
        let entry = Entry {
            sandbox_id: sandbox_id.to_string(),
            sha256,
            issued_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        let mut by_id = lock(&self.by_id);
        if by_id
            .iter()
            .any(|(id, e)| id != sandbox_id && e.sha256 == entry.sha256)
        {
            // One token, one sandbox_id: otherwise "valid for another id" would be ambiguous.
            return Err(Error::InvalidArgument(
                "that token is already the credential of another sandbox_id".into(),
            ));
        }
        let mut next = by_id.clone();
        let replaced = next.insert(sandbox_id.to_string(), entry).is_some();
        // Persist first: a credential the node would forget on restart is not issued.
        self.persist(&next)?;
        *by_id = next;
        Ok((shown, replaced))
    }

    /// Removes the credential of `sandbox_id`. Blocking.
    pub fn revoke(&self, sandbox_id: &str) -> Result<(), Error> {
        let mut by_id = lock(&self.by_id);
        if !by_id.contains_key(sandbox_id) {
            return Err(Error::NoCredential(sandbox_id.to_string()));
        }
        let mut next = by_id.clone();
        next.remove(sandbox_id);
        self.persist(&next)?;
        *by_id = next;
        Ok(())
    }

    /// Every credential (digests included; callers show ids and dates only).
    pub fn list(&self) -> Vec<Entry> {
        let mut v: Vec<Entry> = lock(&self.by_id).values().cloned().collect();
        v.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        v
    }

    /// Writes the store atomically: a 0600 temporary file in the same directory, fsync,
    /// rename over the old one, fsync the directory. A crash leaves the old or the new file.
    fn persist(&self, map: &HashMap<String, Entry>) -> Result<(), Error> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let err = |source| Error::Store {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
        let mut tokens: Vec<Entry> = map.values().cloned().collect();
        tokens.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        let body = serde_json::to_vec_pretty(&File { version: 1, tokens })
            .map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = dir.join(format!(
            ".worker-tokens.{}.{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_random_and_well_formed() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert!(a[TOKEN_PREFIX.len()..]
            .chars()
            .all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn bearer_headers() {
        for (h, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer  abc ", Some("abc")),
            ("BEARER abc", Some("abc")),
            ("Basic abc", None),
            ("Bearer", None),
            ("Bearer ", None),
            ("abc", None),
            ("", None),
        ] {
            assert_eq!(bearer(h), want, "{h:?}");
        }
    }

    #[test]
    fn issue_verify_revoke_and_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = Credentials::path_in(dir.path());
        let c = Credentials::new(path.clone());
        assert_eq!(c.load().unwrap(), 0);
        let (a, replaced) = c.issue("sb-a", None).unwrap();
        let a = a.unwrap();
        assert!(!replaced);
        let (b, _) = c.issue("sb-b", None).unwrap();
        let b = b.unwrap();

        // Table: (sandbox_id, token) → outcome.
        type Check = fn(&Result<(), Error>) -> bool;
        let ok: Check = |r| r.is_ok();
        let unauth: Check = |r| matches!(r, Err(Error::Unauthenticated(_)));
        let denied: Check = |r| matches!(r, Err(Error::PermissionDenied { .. }));
        let cases: Vec<(&str, Option<&str>, Check)> = vec![
            ("sb-a", Some(&a), ok),
            ("sb-b", Some(&b), ok),
            ("sb-a", None, unauth),
            ("sb-a", Some("cwt_0000"), unauth),
            ("sb-a", Some(&b), denied),
            ("sb-c", Some(&a), denied),
            ("sb-c", None, unauth),
        ];
        for (id, tok, want) in &cases {
            assert!(want(&c.verify(id, *tok)), "{id} {tok:?}");
        }

        // The file holds digests only, mode 0600; a reload (a restart) keeps both valid.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&a) && !text.contains(&b));
        assert!(text.contains(&digest(&a)));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Credentials::new(path.clone());
        assert_eq!(again.load().unwrap(), 2);
        assert!(again.verify("sb-a", Some(&a)).is_ok());

        // Rotation: the new token works, the old one no longer does.
        let (a2, replaced) = again.issue("sb-a", None).unwrap();
        assert!(replaced);
        assert!(again.verify("sb-a", Some(&a2.unwrap())).is_ok());
        assert!(matches!(
            again.verify("sb-a", Some(&a)),
            Err(Error::Unauthenticated(_))
        ));

        // Revoke.
        again.revoke("sb-b").unwrap();
        assert!(again.verify("sb-b", Some(&b)).is_err());
        assert!(matches!(again.revoke("sb-b"), Err(Error::NoCredential(_))));
        let third = Credentials::new(path);
        assert_eq!(third.load().unwrap(), 1);
        assert_eq!(third.list()[0].sandbox_id, "sb-a");
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("relay"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn installed_tokens_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let c = Credentials::new(Credentials::path_in(dir.path()));
        let t = "x".repeat(MIN_TOKEN_LEN);
        assert!(c.issue("sb", Some("short")).is_err());
        assert!(c.issue("sb", Some(&format!("{t} y"))).is_err());
        assert!(c.issue("", None).is_err());
        assert_eq!(c.issue("sb", Some(&t)).unwrap(), (None, false));
        assert!(c.verify("sb", Some(&t)).is_ok());
        // The same token for a second id is refused.
        assert!(c.issue("other", Some(&t)).is_err());
    }

    #[test]
    fn a_corrupt_store_is_an_error_not_an_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = Credentials::path_in(dir.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(
            Credentials::new(path).load(),
            Err(Error::Store { .. })
        ));
    }
}
