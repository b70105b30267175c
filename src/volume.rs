//! Workspace volumes: the storage behind each sandbox's workspace, by storage class.
//!
//! * `ext4-loop`: a sparse file formatted as ext4 and loop-mounted at the workspace's data
//!   directory. Its size is a hard cap: writes past it get ENOSPC (inside gVisor too), and one
//!   sandbox can never fill the node's disk. Sparse, with lazy inode tables and journal
//!   (`noinit_itable`), a fresh 5 GiB volume takes ~3 MB of disk.
//! * `dir`: a plain directory with no size cap (for tests and trusted setups).
//!
//! All functions block (mkfs, mount); call them off the async runtime.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::workspace::Paths;

/// Errors of volume operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// An external tool (mkfs, mount, umount) failed.
    #[error("{tool} failed for {path}: {stderr}")]
    Tool {
        /// The tool.
        tool: &'static str,
        /// The volume.
        path: PathBuf,
        /// What it said.
        stderr: String,
    },
}

type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether the filesystem under the volume ran out of space (or quota).
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::Io { source, .. } => matches!(
                rustix::io::Errno::from_io_error(source),
                Some(rustix::io::Errno::NOSPC | rustix::io::Errno::DQUOT)
            ),
            Error::Tool { stderr, .. } => {
                stderr.contains("No space left") || stderr.contains("quota exceeded")
            }
        }
    }

    /// Whether no loop device could be had for the volume.
    pub fn is_no_loop_device(&self) -> bool {
        matches!(self, Error::Tool { stderr, .. }
            if stderr.contains("loop device") || stderr.contains("/dev/loop"))
    }
}

/// Bytes available to unprivileged writers on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// How many ext4-loop volumes under `<dir>/workspaces` of any of `dirs` (the state directory,
/// the workspace store) are mounted (each holds a loop device).
pub fn loop_volumes(dirs: &[PathBuf]) -> usize {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let prefixes: Vec<String> = dirs
        .iter()
        .map(|d| format!("{}/", d.join("workspaces").display()))
        .collect();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| {
            let mp = unescape_mountinfo(mp);
            prefixes.iter().any(|p| mp.starts_with(p))
        })
        .count()
}

/// A storage backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// A loop-mounted ext4 image with a hard size cap.
    Ext4Loop,
    /// A plain directory, no cap.
    Dir,
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

fn run(tool: &'static str, cmd: &mut Command, path: &Path) -> Result<()> {
    let out = cmd.output().map_err(io("run", Path::new(tool)))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Tool {
            tool,
            path: path.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The image file of an ext4-loop volume.
pub fn image_path(paths: &Paths) -> PathBuf {
    paths.base.join("volume.ext4")
}

/// Whether `dir` is a mount point (per this process's mountinfo).
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.display().to_string();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| unescape_mountinfo(mp) == want)
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Creates the volume of a new sandbox and makes it available at `paths.data`.
pub fn create(paths: &Paths, backend: Backend, size_bytes: u64) -> Result<()> {
    paths.create().map_err(io("create", &paths.base))?;
    match backend {
        Backend::Dir => Ok(()),
        Backend::Ext4Loop => {
            let img = image_path(paths);
            if !img.exists() {
                let tmp = img.with_extension("tmp");
                let f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
                f.set_len(size_bytes).map_err(io("size", &tmp))?;
                drop(f);
                let mut cmd = Command::new("mkfs.ext4");
                cmd.args(["-q", "-F", "-m", "0", "-E"])
                    .arg("lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0");
                if size_bytes >= 1 << 30 {
                    cmd.args(["-J", "size=32"]);
                }
                run("mkfs.ext4", cmd.arg(&tmp), &tmp)?;
                std::fs::rename(&tmp, &img).map_err(io("rename", &img))?;
                attach(paths)?;
                // The sandbox sees the volume's root as its workspace: no lost+found there.
                let lf = paths.data.join("lost+found");
                std::fs::remove_dir(&lf).map_err(io("remove", &lf))?;
                return Ok(());
            }
            attach(paths)
        }
    }
}

/// Mounts an ext4-loop volume at `paths.data` if it is not mounted (after a reboot, or before
/// reading a soft-deleted one). `read_only` mounts it read-only.
pub fn attach_with(paths: &Paths, read_only: bool) -> Result<()> {
    if is_mounted(&paths.data) {
        return Ok(());
    }
    std::fs::create_dir_all(&paths.data).map_err(io("create", &paths.data))?;
    let img = image_path(paths);
    let mut opts = String::from("loop,nosuid,nodev,noatime,noinit_itable");
    if read_only {
        opts.push_str(",ro");
    }
    run(
        "mount",
        Command::new("mount")
            .args(["-t", "ext4", "-o", &opts])
            .arg(&img)
            .arg(&paths.data),
        &img,
    )
}

/// Mounts an ext4-loop volume read-write.
pub fn attach(paths: &Paths) -> Result<()> {
    attach_with(paths, false)
}

/// Mounts the volume at `paths.data` and those of its extra mounts (`paths.extra(i)`) that
/// have an image and are not mounted: after a reboot. Returns whether any was mounted.
pub fn attach_all(paths: &Paths) -> Result<bool> {
    let mut attached = false;
    for p in std::iter::once(paths.clone()).chain(extras(paths)) {
        if has_image(&p) && !is_mounted(&p.data) {
            attach(&p)?;
            attached = true;
        }
    }
    Ok(attached)
}

/// The extra mounts a workspace has on disk, in order.
pub fn extras(paths: &Paths) -> Vec<Paths> {
    let mut found: Vec<usize> = std::fs::read_dir(paths.base.join("mounts"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    found.sort_unstable();
    found.into_iter().map(|i| paths.extra(i)).collect()
}

/// Unmounts the volume and its extra mounts' (ext4-loop); their loop devices are released with
/// them. Nothing for `dir`.
pub fn detach(paths: &Paths) -> Result<()> {
    for p in extras(paths)
        .into_iter()
        .chain(std::iter::once(paths.clone()))
    {
        if is_mounted(&p.data) {
            umount(&p.data)?;
        }
    }
    Ok(())
}

/// Unmounts `dir`. A mount still busy (the sandbox's gofer or shim a moment behind its
/// task's exit, on a loaded node) is tried again for up to 5 s, then detached lazily: it is
/// gone from the tree at once, and its loop device is released when the last holder exits.
fn umount(dir: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match run("umount", Command::new("umount").arg(dir), dir) {
            Err(Error::Tool { stderr, .. })
                if stderr.contains("busy") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(Error::Tool { stderr, .. }) if stderr.contains("busy") => {
                tracing::warn!(path = %dir.display(), "volume still busy after 5 s: lazy unmount");
                return run("umount", Command::new("umount").arg("-l").arg(dir), dir);
            }
            r => return r,
        }
    }
}

/// Whether the sandbox's volume is an ext4-loop image.
pub fn has_image(paths: &Paths) -> bool {
    image_path(paths).exists()
}

/// Deletes a volume, its extra mounts' and everything of its workspace.
pub fn delete(paths: &Paths) -> Result<()> {
    detach(paths)?;
    match std::fs::remove_dir_all(&paths.base) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove", &paths.base)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert!(is_mounted(Path::new("/proc")));
        assert!(!is_mounted(Path::new("/definitely/not/mounted")));
    }

    #[test]
    fn full_disks_and_missing_loop_devices_are_recognised() {
        let io = |errno: i32| Error::Io {
            what: "create",
            path: "/x".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        let tool = |stderr: &str| Error::Tool {
            tool: "mount",
            path: "/x".into(),
            stderr: stderr.into(),
        };
        assert!(io(rustix::io::Errno::NOSPC.raw_os_error()).is_no_space());
        assert!(!io(rustix::io::Errno::ACCESS.raw_os_error()).is_no_space());
        assert!(tool("mkfs.ext4: No space left on device while writing").is_no_space());
        assert!(
            tool("mount: /x: failed to setup loop device for /x/volume.ext4.").is_no_loop_device()
        );
        assert!(!tool("mount: wrong fs type").is_no_loop_device());
        assert!(!tool("mount: wrong fs type").is_no_space());
    }

    #[test]
    fn free_bytes_and_loop_volumes_read_the_host() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert_eq!(loop_volumes(&[dir.path().to_path_buf()]), 0);
    }

    #[test]
    fn dir_backend_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path(), "x");
        create(&paths, Backend::Dir, 1 << 20).unwrap();
        assert!(paths.data.is_dir());
        delete(&paths).unwrap();
        assert!(!paths.base.exists());
    }
}
