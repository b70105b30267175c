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

/// A handle on one workspace root.
pub struct Workspace {
    root: OwnedFd,
    mount_path: String,
}

/// One ListFiles entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the listed directory.
    pub path: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Permission bits.
    pub mode: u32,
    /// Modification time.
    pub modified: SystemTime,
}

/// The result of a ReadFile.
#[derive(Debug)]
pub struct ReadResult {
    /// The bytes read.
    pub data: Vec<u8>,
    /// The file's size.
    pub total_size: u64,
    /// Whether the data reaches the end of the file.
    pub eof: bool,
}

fn stat_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + std::time::Duration::new(secs as u64, nsecs as u32)
    } else {
        SystemTime::UNIX_EPOCH
    }
}

/// Most symlinks one resolution follows before giving up (as the kernel's 40).
const MAX_SYMLINKS: usize = 40;

/// Where a resolution ended.
struct Resolved {
    /// The directory holding the final entry (the final directory itself when `name` is None).
    dir: OwnedFd,
    /// The final entry's name; None when the path is a directory reached as a whole (the root,
    /// or a path ending in `..` through a symlink).
    name: Option<String>,
    /// An O_PATH handle on the final entry, when it exists.
    fd: Option<OwnedFd>,
}

fn o_path_dir(dirfd: &OwnedFd) -> std::io::Result<OwnedFd> {
    // `.` from a directory handle: a second handle on the same directory.
    rustix::fs::openat(
        dirfd,
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

/// The permission bits of the regular file behind `fd`; a directory or a special file (FIFO,
/// socket, device: never opened, a FIFO would block) is WrongType.
fn regular_file_mode(fd: &OwnedFd, path: &str) -> Result<u32> {
    let st = rustix::fs::fstat(fd).map_err(|e| map_errno("stat", path, e))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Ok(st.st_mode & 0o7777),
        FileType::Directory => Err(Error::WrongType {
            path: path.into(),
            why: "is a directory",
        }),
        _ => Err(Error::WrongType {
            path: path.into(),
            why: "not a regular file",
        }),
    }
}

fn is_type(fd: &OwnedFd, want: FileType) -> Result<bool> {
    let st = rustix::fs::fstat(fd).map_err(|e| map_errno("stat", "", e))?;
    Ok(FileType::from_raw_mode(st.st_mode) == want)
}

/// Opens the object behind an O_PATH handle for I/O, through `/proc/self/fd`: the kernel hands
/// back exactly the inode the handle names, whatever happened to its path meanwhile.
fn reopen(fd: &OwnedFd, flags: OFlags, path: &str) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::open(proc_path.as_str(), flags | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| map_errno("open", path, e))
}

impl Workspace {
    /// Opens the workspace rooted at the host directory `dir`.
    pub fn open(dir: &Path, mount_path: &str) -> Result<Self> {
        let root = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| map_errno("open", &dir.display().to_string(), e))?;
        Ok(Self {
            root,
            mount_path: mount_path.to_string(),
        })
    }

    /// Resolves `comps` from the root, one component at a time, each opened with `O_NOFOLLOW`
    /// relative to the handle of its parent. Symlinks are expanded here, by our rules: a
    /// relative target continues from the link's directory, an absolute target must lie under
    /// the mount path (it is the sandbox's view) and restarts from the root, and `..` may never
    /// climb above the root. Anything else is an escape. The final component is followed too.
    /// With `create_dirs`, missing intermediate directories are made.
    fn resolve(&self, comps: &[String], create_dirs: bool, path: &str) -> Result<Resolved> {
        let dup = |fd: &OwnedFd| o_path_dir(fd).map_err(|e| map_io("open", path, e));
        let mut stack: Vec<OwnedFd> = vec![dup(&self.root)?];
        let mut todo: std::collections::VecDeque<String> = comps.iter().cloned().collect();
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            if c.is_empty() || c == "." {
                continue;
            }
            if c == ".." {
                if stack.len() == 1 {
                    return Err(Error::Escape(path.into()));
                }
                stack.pop();
                continue;
            }
            let is_last = todo.is_empty();
            let cur = stack.last().expect("stack never empties");
            let opened = rustix::fs::openat(
                cur,
                c.as_str(),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            let fd = match opened {
                Ok(fd) => fd,
                Err(Errno::NOENT) if is_last => {
                    return Ok(Resolved {
                        dir: dup(cur)?,
                        name: Some(c),
                        fd: None,
                    })
                }
                Err(Errno::NOENT) if create_dirs => {
                    match rustix::fs::mkdirat(cur, c.as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(map_errno("mkdir", path, e)),
                    }
                    // Go round again: whatever is there now is resolved by the same rules.
                    todo.push_front(c);
                    continue;
                }
                Err(e) => return Err(map_errno("open", path, e)),
            };
            let st = rustix::fs::fstat(&fd).map_err(|e| map_errno("stat", path, e))?;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(Error::Loop(path.into()));
                    }
                    let target = rustix::fs::readlinkat(&fd, "", Vec::new())
                        .map_err(|e| map_errno("readlink", path, e))?;
                    let target = target.to_string_lossy().into_owned();
                    let mut next: Vec<String> = Vec::new();
                    if let Some(abs) = target.strip_prefix('/') {
                        let mp = self.mount_path.trim_matches('/');
                        let rest = if abs == mp {
                            ""
                        } else if let Some(r) = abs.strip_prefix(&format!("{mp}/")) {
                            r
                        } else {
                            return Err(Error::Escape(path.into()));
                        };
                        stack.truncate(1);
                        next.extend(rest.split('/').map(String::from));
                    } else {
                        next.extend(target.split('/').map(String::from));
                    }
                    for n in next.into_iter().rev() {
                        todo.push_front(n);
                    }
                }
                FileType::Directory => {
                    if is_last {
                        return Ok(Resolved {
                            dir: dup(cur)?,
                            name: Some(c),
                            fd: Some(fd),
                        });
                    }
                    stack.push(fd);
                }
                _ if is_last => {
                    return Ok(Resolved {
                        dir: dup(cur)?,
                        name: Some(c),
                        fd: Some(fd),
                    })
                }
                _ => {
                    return Err(Error::WrongType {
                        path: path.into(),
                        why: "a parent is not a directory",
                    })
                }
            }
        }
        // Ran out of components on a directory step (the root, `..`, or a link to a dir).
        let top = stack.pop().expect("stack never empties");
        let dir = match stack.last() {
            Some(parent) => dup(parent)?,
            None => dup(&top)?,
        };
        Ok(Resolved {
            dir,
            name: None,
            fd: Some(top),
        })
    }

    /// Reads up to `max_bytes` (0 = up to the cap) from `offset`.
    pub fn read(&self, path: &str, offset: i64, max_bytes: i64) -> Result<ReadResult> {
        if offset < 0 || max_bytes < 0 {
            return Err(Error::InvalidPath {
                path: path.into(),
                why: "offset and max_bytes must not be negative",
            });
        }
        let comps = clean_path(path, &self.mount_path)?;
        let r = self.resolve(&comps, false, path)?;
        let Some(target) = r.fd else {
            return Err(Error::NotFound(path.into()));
        };
        regular_file_mode(&target, path)?;
        let fd = reopen(
            &target,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            path,
        )?;
        let file = File::from(fd);
        let total = file.metadata().map_err(|e| map_io("stat", path, e))?.len();
        let cap = if max_bytes == 0 {
            MAX_IO_BYTES
        } else {
            (max_bytes as usize).min(MAX_IO_BYTES)
        };
        let offset = offset as u64;
        let want = total.saturating_sub(offset).min(cap as u64) as usize;
        let mut data = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match file.read_at(&mut data[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map_io("read", path, e)),
            }
        }
        data.truncate(got);
        Ok(ReadResult {
            eof: offset + got as u64 >= total,
            data,
            total_size: total,
        })
    }

    /// Writes `data` to `path`: appends, or atomically replaces the file (a reader sees the old
    /// or the new content, never a mix). `mode` applies only when the file is created. Parent
    /// directories are created. A symlink at `path` is followed when it stays inside.
    pub fn write(&self, path: &str, data: &[u8], append: bool, mode: u32) -> Result<u64> {
        if data.len() > MAX_IO_BYTES {
            return Err(Error::TooLarge(data.len()));
        }
        let comps = clean_path(path, &self.mount_path)?;
        if comps.is_empty() {
            return Err(Error::WrongType {
                path: path.into(),
                why: "is the workspace root",
            });
        }
        let r = self.resolve(&comps, true, path)?;
        let Some(name) = r.name else {
            return Err(Error::WrongType {
                path: path.into(),
                why: "is a directory",
            });
        };
        // setuid and setgid bits are never set from the host side.
        let mode = if mode == 0 { 0o644 } else { mode & 0o1777 };
        let existing_mode = match &r.fd {
            None => None,
            Some(fd) => Some(regular_file_mode(fd, path)?),
        };
        if append {
            let fd = match &r.fd {
                Some(fd) => reopen(fd, OFlags::WRONLY | OFlags::APPEND | OFlags::NONBLOCK, path)?,
                None => rustix::fs::openat(
                    &r.dir,
                    name.as_str(),
                    OFlags::WRONLY
                        | OFlags::APPEND
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(mode),
                )
                .map_err(|e| map_errno("create", path, e))?,
            };
            if !is_type(&fd, FileType::RegularFile)? {
                return Err(Error::WrongType {
                    path: path.into(),
                    why: "not a regular file",
                });
            }
            let mut f = File::from(fd);
            if existing_mode.is_none() {
                rustix::fs::fchmod(&f, Mode::from_raw_mode(mode))
                    .map_err(|e| map_errno("chmod", path, e))?;
            }
            f.write_all(data).map_err(|e| map_io("write", path, e))?;
            return Ok(data.len() as u64);
        }
        let final_mode = existing_mode.unwrap_or(mode);
        let tmp = format!(".compute-write-{}", uuid::Uuid::new_v4().simple());
        let fd = rustix::fs::openat(
            &r.dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(final_mode),
        )
        .map_err(|e| map_errno("create", path, e))?;
        let mut f = File::from(fd);
        let res = f
            .write_all(data)
            .map_err(|e| map_io("write", path, e))
            .and_then(|_| {
                rustix::fs::fchmod(f.as_fd(), Mode::from_raw_mode(final_mode))
                    .map_err(|e| map_errno("chmod", path, e))
            })
            .and_then(|_| {
                rustix::fs::renameat(&r.dir, tmp.as_str(), &r.dir, name.as_str())
                    .map_err(|e| map_errno("rename", path, e))
            });
        if res.is_err() {
            let _ = rustix::fs::unlinkat(&r.dir, tmp.as_str(), AtFlags::empty());
        }
        res?;
        Ok(data.len() as u64)
    }

    /// Lists `path` (a directory), recursively if asked, up to `max_entries` (0 = 1000, capped
    /// at 10000). Returns the entries and whether the cap cut the listing. Symlinks are listed
    /// as entries and never descended into.
    pub fn list(
        &self,
        path: &str,
        recursive: bool,
        max_entries: u32,
    ) -> Result<(Vec<Entry>, bool)> {
        let cap = match max_entries as usize {
            0 => DEFAULT_LIST,
            n => n.min(MAX_LIST),
        };
        let comps = clean_path(path, &self.mount_path)?;
        let r = self.resolve(&comps, false, path)?;
        let Some(target) = r.fd else {
            return Err(Error::NotFound(path.into()));
        };
        if !is_type(&target, FileType::Directory)? {
            return Err(Error::WrongType {
                path: path.into(),
                why: "not a directory",
            });
        }
        let dir = reopen(&target, OFlags::RDONLY | OFlags::DIRECTORY, path)?;
        let mut out = Vec::new();
        let mut stack: Vec<(OwnedFd, String)> = vec![(dir, String::new())];
        let mut truncated = false;
        'walk: while let Some((fd, prefix)) = stack.pop() {
            let mut names = Vec::new();
            let mut d =
                rustix::fs::Dir::read_from(&fd).map_err(|e| map_errno("readdir", path, e))?;
            while let Some(ent) = d.read() {
                let ent = ent.map_err(|e| map_errno("readdir", path, e))?;
                let name = ent.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                names.push(String::from_utf8_lossy(name).into_owned());
            }
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                let st = match rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    Err(Errno::NOENT) => continue, // removed by the sandbox meanwhile
                    Err(e) => return Err(map_errno("stat", path, e)),
                };
                if out.len() >= cap {
                    truncated = true;
                    break 'walk;
                }
                let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
                let rel = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}/{name}")
                };
                out.push(Entry {
                    path: rel.clone(),
                    size: if is_dir { 0 } else { st.st_size as u64 },
                    is_dir,
                    mode: st.st_mode & 0o7777,
                    modified: stat_time(st.st_mtime, st.st_mtime_nsec as i64),
                });
                if recursive && is_dir {
                    // Never follow a symlink when descending: one swapped in is skipped.
                    if let Ok(sub) = rustix::fs::openat(
                        &fd,
                        name.as_str(),
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) {
                        subdirs.push((sub, rel));
                    }
                }
            }
            // Depth-first in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok((out, truncated))
    }
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
