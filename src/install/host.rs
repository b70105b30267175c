//! Host paths seen through the host root mount, and the file operations the installer does on
//! them: hashing, and whole-file replacement by temp file + fsync + rename.
//!
//! The host's `/` is mounted at the host root (hostPath `/` at `/host`). A host path such as
//! `/etc/containerd/config.toml` is resolved one component at a time under that root, with
//! symlinks read the way the host reads them: an absolute target starts again from the host
//! root (on Fedora CoreOS `/usr/local` is a link to `/var/usrlocal`: we must write to
//! `<root>/var/usrlocal`, not to the container's `/var/usrlocal`), a relative one continues from
//! the link's directory. A `..` that would climb above the host root is refused, as is a `..`
//! anywhere in a path given on the command line. The host root is the node's own filesystem,
//! written by root only, so resolving by name (rather than through directory handles, as the
//! workspace code must) is enough here: nothing hostile races us.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Error;

/// Symlinks followed while resolving one path before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// The host's root filesystem as mounted into the installer's container.
#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
}

impl HostRoot {
    /// Wraps `root`, which must be an existing directory.
    pub fn new(root: &Path) -> Result<Self, Error> {
        let meta = std::fs::metadata(root).map_err(io("open host root", root))?;
        if !meta.is_dir() {
            return Err(Error::HostRootNotDir { path: root.into() });
        }
        Ok(Self { root: root.into() })
    }

    /// The mount point of the host root.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Resolves the absolute host path `host_path` to the path under the host root that the
    /// host means by it, following symlinks (also in the last component) in the host's view.
    /// Components that do not exist yet are kept as they are.
    pub fn resolve(&self, host_path: &Path) -> Result<PathBuf, Error> {
        check_host_path(host_path)?;
        let mut todo: Vec<OsString> = components(host_path);
        todo.reverse(); // a stack: the next component is last
        let mut done: Vec<OsString> = Vec::new();
        let mut links = 0;
        while let Some(c) = todo.pop() {
            if c == ".." {
                if done.pop().is_none() {
                    return Err(Error::Escape {
                        path: host_path.into(),
                    });
                }
                continue;
            }
            let here = self.join(&done).join(&c);
            match std::fs::symlink_metadata(&here) {
                Ok(m) if m.file_type().is_symlink() => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Error::TooManyLinks {
                            path: host_path.into(),
                        });
                    }
                    let target = std::fs::read_link(&here).map_err(io("read link", &here))?;
                    if target.is_absolute() {
                        done.clear();
                    }
                    let mut more = components(&target);
                    more.reverse();
                    todo.extend(more);
                }
                // Missing (or unreadable: the write that follows reports it) components are
                // taken literally.
                _ => done.push(c),
            }
        }
        Ok(self.join(&done))
    }

    fn join(&self, parts: &[OsString]) -> PathBuf {
        let mut p = self.root.clone();
        p.extend(parts);
        p
    }
}

/// Refuses host paths that are relative or contain `..`.
pub fn check_host_path(p: &Path) -> Result<(), Error> {
    if !p.is_absolute() {
        return Err(Error::NotAbsolute { path: p.into() });
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(Error::Escape { path: p.into() });
    }
    Ok(())
}

/// The normal components of `p` (`..` kept as a component, `/` and `.` dropped).
fn components(p: &Path) -> Vec<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Wraps an I/O error with what we did and where.
pub fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

/// The SHA-256 of the file at `path`, or `None` when it does not exist.
pub fn sha256_file(path: &Path) -> Result<Option<[u8; 32]>, Error> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", path)(e)),
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(io("read", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(Some(h.finalize().into()))
}

/// Reads the file at `path`, or `None` when it does not exist.
pub fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("read", path)(e)),
    }
}

/// The permission bits of the file at `path`, if it exists.
pub fn mode_of(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

/// Mode and owner a replaced file gets.
#[derive(Debug, Clone, Copy)]
pub struct Attrs {
    /// Permission bits.
    pub mode: u32,
    /// Owner and group, kept from the file being replaced.
    pub owner: Option<(u32, u32)>,
}

impl Attrs {
    /// `mode`, owned by whoever runs us.
    pub fn mode(mode: u32) -> Self {
        Self { mode, owner: None }
    }

    /// The mode and owner of the existing file at `path`, else `default_mode`.
    pub fn of_existing(path: &Path, default_mode: u32) -> Self {
        match std::fs::metadata(path) {
            Ok(m) => Self {
                mode: m.permissions().mode() & 0o7777,
                owner: Some((m.uid(), m.gid())),
            },
            Err(_) => Self::mode(default_mode),
        }
    }
}

/// Replaces (or creates) the file `dest` with what `fill` writes, atomically: a temp file in
/// the same directory, written, chmod'ed (and chown'ed), fsync'ed, renamed over `dest`, then
/// the directory fsync'ed. A reader (containerd starting up, a shim exec'ing runsc) sees the
/// old file or the new one, never a half-written one; a running binary keeps its old inode.
/// Missing parent directories are created (0755).
pub fn replace_file(
    dest: &Path,
    attrs: Attrs,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), Error> {
    let dir = dest.parent().ok_or_else(|| Error::NotAbsolute {
        path: dest.to_path_buf(),
    })?;
    let name = dest.file_name().ok_or_else(|| Error::NotAbsolute {
        path: dest.to_path_buf(),
    })?;
    std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".computed-{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
    };
    let mut file = match open() {
        Ok(f) => f,
        // Left by an earlier run of ours with the same pid that died mid-write.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp).map_err(io("remove stale temp file", &tmp))?;
            open().map_err(io("create", &tmp))?
        }
        Err(e) => return Err(io("create", &tmp)(e)),
    };
    let written = (|| {
        fill(&mut file).map_err(io("write", &tmp))?;
        file.flush().map_err(io("write", &tmp))?;
        if let Some((uid, gid)) = attrs.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io("chown", &tmp))?;
        }
        file.set_permissions(std::fs::Permissions::from_mode(attrs.mode))
            .map_err(io("chmod", &tmp))?;
        file.sync_all().map_err(io("fsync", &tmp))?;
        std::fs::rename(&tmp, dest).map_err(io("rename into place", dest))
    })();
    if let Err(e) = written {
        // Best effort: the temp file is ours and useless now; the error that matters is `e`.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable only once the directory is on disk.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))?;
    Ok(())
}

/// Replaces `dest` with `data` (see [`replace_file`]).
pub fn write_bytes(dest: &Path, data: &[u8], attrs: Attrs) -> Result<(), Error> {
    replace_file(dest, attrs, |f| f.write_all(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn host() -> (tempfile::TempDir, HostRoot) {
        let d = tempfile::tempdir().unwrap();
        let h = HostRoot::new(d.path()).unwrap();
        (d, h)
    }

    #[test]
    fn plain_and_missing_paths_resolve_under_the_root() {
        let (d, h) = host();
        std::fs::create_dir_all(d.path().join("etc/containerd")).unwrap();
        assert_eq!(
            h.resolve(Path::new("/etc/containerd/config.toml")).unwrap(),
            d.path().join("etc/containerd/config.toml")
        );
        assert_eq!(
            h.resolve(Path::new("/opt/new/dir/./x")).unwrap(),
            d.path().join("opt/new/dir/x")
        );
        assert_eq!(h.resolve(Path::new("/")).unwrap(), d.path());
    }

    #[test]
    fn links_are_read_in_the_hosts_view() {
        let (d, h) = host();
        let r = d.path();
        std::fs::create_dir_all(r.join("var/usrlocal/bin")).unwrap();
        std::fs::create_dir_all(r.join("usr")).unwrap();
        // Absolute target: re-rooted under the host root, never the container's own path.
        symlink("/var/usrlocal", r.join("usr/local")).unwrap();
        assert_eq!(
            h.resolve(Path::new("/usr/local/bin/runsc")).unwrap(),
            r.join("var/usrlocal/bin/runsc")
        );
        // Relative target, continuing from the link's directory.
        std::fs::create_dir_all(r.join("etc/real")).unwrap();
        symlink("real", r.join("etc/containerd")).unwrap();
        assert_eq!(
            h.resolve(Path::new("/etc/containerd/config.toml")).unwrap(),
            r.join("etc/real/config.toml")
        );
        // A link in the last component is followed, so a write replaces its target.
        symlink("../real/config.toml", r.join("etc/real/link.toml")).unwrap();
        assert_eq!(
            h.resolve(Path::new("/etc/containerd/link.toml")).unwrap(),
            r.join("etc/real/config.toml")
        );
        // `/..` inside a target that stays inside is fine.
        symlink("/etc/../var/usrlocal", r.join("opt")).unwrap();
        assert_eq!(
            h.resolve(Path::new("/opt/bin")).unwrap(),
            r.join("var/usrlocal/bin")
        );
    }

    #[test]
    fn escapes_are_refused() {
        let (d, h) = host();
        let r = d.path();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        symlink("../../../../tmp", r.join("etc/up")).unwrap();
        symlink("loop2", r.join("etc/loop1")).unwrap();
        symlink("loop1", r.join("etc/loop2")).unwrap();
        for (p, want) in [
            ("/etc/up/x", "escapes"),
            ("/../etc/x", "escapes"),
            ("/etc/../../x", "escapes"),
            ("etc/x", "absolute"),
            ("/etc/loop1/x", "symlinks"),
        ] {
            let e = h.resolve(Path::new(p)).unwrap_err().to_string();
            assert!(e.contains(want), "{p}: {e}");
        }
    }

    #[test]
    fn replace_file_is_atomic_and_keeps_attrs() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/dir/f");
        write_bytes(&p, b"one", Attrs::mode(0o755)).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        assert_eq!(mode_of(&p), Some(0o755));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_bytes(&p, b"two", Attrs::of_existing(&p, 0o644)).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(mode_of(&p), Some(0o640));
        // No temp file left behind, also after a failed fill.
        let err = replace_file(&p, Attrs::mode(0o644), |_| {
            Err(std::io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("f")]);
    }

    #[test]
    fn hashes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        assert_eq!(sha256_file(&p).unwrap(), None);
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            hex::encode(sha256_file(&p).unwrap().unwrap()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
