//! Workspaces: one directory per sandbox, bind-mounted at its mount path, and the host-side file
//! RPCs over it.
//!
//! The sandbox owns its workspace and is hostile: it may replace any directory with a symlink at
//! any moment. Every path is therefore resolved one component at a time from a handle on the
//! workspace root, each component opened `O_PATH | O_NOFOLLOW` relative to the handle of its
//! parent, so no lookup ever passes through a symlink the kernel follows for us. Symlinks are
//! expanded by our own rules (see [`Workspace::resolve`]): a target that leaves the workspace
//! is PERMISSION_DENIED. The final object is then opened through its handle
//! (`/proc/self/fd/N`), so what is read or written is exactly the inode that was resolved. No
//! path string is ever checked and then opened by name.
//!
//! Paths in requests are relative to the mount path. An absolute path is taken as relative to the
//! mount path when it starts with it (`/workspace/a` is `a`), and as relative to the workspace
//! root otherwise (`/a` is `a`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

mod files;
pub use files::{Entry, ReadResult, Workspace};

/// Per-call data cap of ReadFile and WriteFile.
pub const MAX_IO_BYTES: usize = 16 << 20;
/// Default and hard cap of ListFiles entries.
pub const DEFAULT_LIST: usize = 1000;
/// Hard cap of ListFiles entries.
pub const MAX_LIST: usize = 10_000;

/// Errors of workspace operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path is malformed or escapes the workspace lexically.
    #[error("invalid path {path:?}: {why}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// A mount path that is not clean and absolute, or is reserved.
    #[error("mount_path {path:?} {why}")]
    InvalidMountPath {
        /// The mount path as given.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// Resolution would leave the workspace (a symlink pointing outside).
    #[error("path {0:?} resolves outside the workspace")]
    Escape(String),
    /// Too many symlinks (a loop).
    #[error("path {0:?}: too many levels of symbolic links")]
    Loop(String),
    /// Nothing at that path.
    #[error("path {0:?} not found")]
    NotFound(String),
    /// The path is not the kind of file the call needs.
    #[error("path {path:?}: {why}")]
    WrongType {
        /// The path.
        path: String,
        /// What it is, or what was expected.
        why: &'static str,
    },
    /// The data is over the per-call cap.
    #[error("{0} bytes is over the per-call cap of 16 MiB")]
    TooLarge(usize),
    /// The workspace volume is full.
    #[error("workspace is full writing {0:?}")]
    NoSpace(String),
    /// Any other I/O failure.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, Error>;

fn map_errno(op: &'static str, path: &str, e: Errno) -> Error {
    match e {
        Errno::XDEV => Error::Escape(path.into()),
        Errno::NOENT => Error::NotFound(path.into()),
        Errno::LOOP => Error::Loop(path.into()),
        Errno::NOTDIR => Error::WrongType {
            path: path.into(),
            why: "a parent is not a directory",
        },
        Errno::ISDIR => Error::WrongType {
            path: path.into(),
            why: "is a directory",
        },
        Errno::NOSPC | Errno::DQUOT => Error::NoSpace(path.into()),
        Errno::NAMETOOLONG => Error::InvalidPath {
            path: path.into(),
            why: "name too long",
        },
        other => Error::Io {
            op,
            path: path.into(),
            source: std::io::Error::from_raw_os_error(other.raw_os_error()),
        },
    }
}

fn map_io(op: &'static str, path: &str, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(n) => map_errno(op, path, Errno::from_raw_os_error(n)),
        None => Error::Io {
            op,
            path: path.into(),
            source: e,
        },
    }
}

/// Cleans a request path into components relative to the workspace root (see the module doc).
/// An empty result is the root itself.
pub fn clean_path(path: &str, mount_path: &str) -> Result<Vec<String>> {
    let invalid = |why| Error::InvalidPath {
        path: path.into(),
        why,
    };
    if path.contains('\0') {
        return Err(invalid("contains NUL"));
    }
    let mut rel = path;
    if rel.starts_with('/') {
        let mp = mount_path.trim_end_matches('/');
        if !mp.is_empty() && (rel == mp || rel.starts_with(&format!("{mp}/"))) {
            rel = &rel[mp.len()..];
        }
    }
    let mut out: Vec<String> = Vec::new();
    for comp in rel.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err(invalid("escapes the workspace"));
                }
            }
            c => out.push(c.to_string()),
        }
    }
    Ok(out)
}

/// Checks a workspace mount path: absolute, clean, not `/` and not one of the paths gVisor or
/// the node own inside a sandbox.
pub fn validate_mount_path(p: &str) -> Result<()> {
    let bad = |why| {
        Err(Error::InvalidMountPath {
            path: p.to_string(),
            why,
        })
    };
    if !p.starts_with('/') {
        return bad("must be absolute");
    }
    if p == "/" {
        return bad("must not be /");
    }
    if p.contains('\0') || p.ends_with('/') || p.contains("//") {
        return bad("must be clean");
    }
    if p.split('/').any(|c| c == "." || c == "..") {
        return bad("must be clean");
    }
    for reserved in ["/proc", "/dev", "/sys", "/.compute"] {
        if p == reserved || p.starts_with(&format!("{reserved}/")) {
            return bad("is reserved");
        }
    }
    Ok(())
}

/// Reads at most `limit` bytes of a small host file (used for tombstones).
pub fn read_small(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)?.take(limit).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The host directories of one sandbox's workspace.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `<state>/workspaces/<id>`: private to the daemon.
    pub base: PathBuf,
    /// `<base>/data`: what the sandbox sees at its mount path.
    pub data: PathBuf,
    /// `<base>/tombstone.json`: written when the sandbox is destroyed.
    pub tombstone: PathBuf,
}

impl Paths {
    /// The paths of sandbox `id` under `state_dir`.
    pub fn new(state_dir: &Path, id: &str) -> Self {
        let base = state_dir.join("workspaces").join(id);
        Self {
            data: base.join("data"),
            tombstone: base.join("tombstone.json"),
            base,
        }
    }

    /// The paths of the sandbox's extra mount `i` (1..8: a platform sandbox's second and
    /// later workspace mounts), each a volume of its own under `<base>/mounts/<i>`, so it has a
    /// size cap of its own and goes with the sandbox's workspace.
    pub fn extra(&self, i: usize) -> Self {
        let base = self.base.join("mounts").join(i.to_string());
        Self {
            data: base.join("data"),
            tombstone: base.join("tombstone.json"),
            base,
        }
    }

    /// Creates the workspace directories.
    pub fn create(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&self.data)?;
        std::fs::set_permissions(&self.base, std::fs::Permissions::from_mode(0o700))?;
        std::fs::set_permissions(&self.data, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths() {
        for ok in ["/workspace", "/home/user/work", "/w"] {
            validate_mount_path(ok).unwrap();
        }
        for bad in [
            "workspace",
            "/",
            "/a/../b",
            "/a/./b",
            "/a//b",
            "/a/",
            "/proc/x",
            "/dev",
            "/.compute",
            "",
        ] {
            assert!(
                matches!(
                    validate_mount_path(bad),
                    Err(Error::InvalidMountPath { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn clean_path_table() {
        let ok: &[(&str, &[&str])] = &[
            ("a", &["a"]),
            ("a/b/../c", &["a", "c"]),
            ("./a//b/", &["a", "b"]),
            ("/a", &["a"]),
            ("/workspace/a", &["a"]),
            ("/workspace", &[]),
            ("/workspacex/a", &["workspacex", "a"]),
            ("", &[]),
            (".", &[]),
            ("a/..", &[]),
        ];
        for (p, want) in ok {
            let got = clean_path(p, "/workspace").unwrap();
            assert_eq!(
                got,
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{p}"
            );
        }
        for p in [
            "..",
            "../a",
            "a/../../b",
            "/../etc",
            "/workspace/../x",
            "a\0b",
        ] {
            assert!(clean_path(p, "/workspace").is_err(), "{p}");
        }
    }

    #[test]
    fn write_read_list_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path(), "/workspace").unwrap();
        assert_eq!(ws.write("d/e/f.txt", b"hello", false, 0o600).unwrap(), 5);
        ws.write("d/e/f.txt", b" world", true, 0).unwrap();
        let r = ws.read("d/e/f.txt", 0, 0).unwrap();
        assert_eq!(r.data, b"hello world");
        assert!(r.eof);
        let r = ws.read("/workspace/d/e/f.txt", 6, 3).unwrap();
        assert_eq!(r.data, b"wor");
        assert!(!r.eof);
        assert_eq!(r.total_size, 11);
        ws.write("d/e/f.txt", b"new", false, 0o777).unwrap();
        let (entries, truncated) = ws.list("d", true, 0).unwrap();
        assert!(!truncated);
        let f = entries.iter().find(|e| e.path == "e/f.txt").unwrap();
        assert_eq!(f.mode, 0o600, "replace keeps the existing mode");
        assert_eq!(f.size, 3);
        assert!(entries.iter().any(|e| e.path == "e" && e.is_dir));
    }

    #[test]
    fn escapes_are_refused() {
        let outer = tempfile::tempdir().unwrap();
        let root = outer.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(outer.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("/", root.join("slash")).unwrap();
        std::os::unix::fs::symlink("../secret", root.join("up")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root", root.join("proc")).unwrap();
        let ws = Workspace::open(&root, "/workspace").unwrap();
        for p in ["slash/etc/passwd", "up", "proc/etc/passwd"] {
            assert!(matches!(ws.read(p, 0, 0), Err(Error::Escape(_))), "{p}");
        }
        // Links that stay inside are followed, also absolute ones in the sandbox's view.
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), b"inside").unwrap();
        std::os::unix::fs::symlink("d/f", root.join("rel")).unwrap();
        std::os::unix::fs::symlink("/workspace/d/f", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../d", root.join("d/self")).unwrap();
        for p in ["rel", "abs", "d/self/self/f"] {
            assert_eq!(ws.read(p, 0, 0).unwrap().data, b"inside", "{p}");
        }
        ws.write("rel", b"via-link", false, 0).unwrap();
        assert_eq!(std::fs::read(root.join("d/f")).unwrap(), b"via-link");
        assert!(std::fs::symlink_metadata(root.join("rel"))
            .unwrap()
            .file_type()
            .is_symlink());
        std::os::unix::fs::symlink("loop2", root.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", root.join("loop2")).unwrap();
        assert!(matches!(ws.read("loop1", 0, 0), Err(Error::Loop(_))));
        assert!(matches!(
            ws.write("slash/tmp/x", b"x", false, 0),
            Err(Error::Escape(_))
        ));
        assert!(matches!(
            ws.write("up", b"x", true, 0),
            Err(Error::Escape(_))
        ));
        assert_eq!(std::fs::read(outer.path().join("secret")).unwrap(), b"s");
        assert!(matches!(ws.read("nope", 0, 0), Err(Error::NotFound(_))));
    }

    #[test]
    fn fifo_read_does_not_hang() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("f"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let ws = Workspace::open(dir.path(), "/workspace").unwrap();
        assert!(matches!(ws.read("f", 0, 0), Err(Error::WrongType { .. })));
    }

    #[test]
    fn listing_caps_at_ten_thousand() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(MAX_LIST + 5) {
            std::fs::write(dir.path().join(format!("f{i:05}")), b"").unwrap();
        }
        let ws = Workspace::open(dir.path(), "/workspace").unwrap();
        let (e, truncated) = ws.list(".", false, 50_000).unwrap();
        assert_eq!(e.len(), MAX_LIST);
        assert!(truncated);
        let (e, truncated) = ws.list(".", false, 0).unwrap();
        assert_eq!(e.len(), DEFAULT_LIST);
        assert!(truncated);
    }

    #[test]
    fn oversized_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path(), "/workspace").unwrap();
        let big = vec![0u8; MAX_IO_BYTES + 1];
        assert!(matches!(
            ws.write("big", &big, false, 0),
            Err(Error::TooLarge(_))
        ));
    }
}
