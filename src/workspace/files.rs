//! The file calls over one workspace: every path resolved one component at a time from the
//! root's handle (see the module doc of `workspace`), then read, written or listed through
//! the handle of exactly the inode that was resolved.

use super::*;

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
