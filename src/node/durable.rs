//! Durable workspaces: volumes that outlive the sandboxes that mount them, and their
//! snapshots.
//!
//! A durable workspace is a volume of the same kinds as a sandbox's own (an ext4-loop image
//! with a hard cap, or a directory; [`crate::volume`]) kept under the node's workspace store
//! (`workspace_store_dir`, default `<state_dir>/store`):
//!
//! ```text
//! <store>/workspaces/<id>/workspace.json   the record (the daemon holds no database)
//!                         volume.ext4      its image (ext4-loop)
//!                         data/            mounted while a sandbox has it
//! <store>/snapshots/<id>/snapshot.json, volume.ext4 | data/
//! ```
//!
//! At most one live sandbox has a workspace at a time: creating (or resuming) a sandbox claims
//! every durable workspace it mounts at once, under one lock, or claims none and fails
//! FAILED_PRECONDITION. The claim is dropped when the sandbox is destroyed or suspended, and
//! rebuilt from the sandboxes' records after a restart.
//!
//! A snapshot is one instant of the file system: an attached ext4-loop workspace is frozen
//! (`fsfreeze`: writes from the sandbox wait, the journal is flushed) while its image is
//! copied, a detached one is copied under the workspace's lock. The copy is a reflink where
//! the store's file system has them (XFS, btrfs: the snapshot shares every block not changed
//! since, so it costs disk in proportion to what changes) and a sparse copy elsewhere (ext4:
//! it costs the workspace's used blocks). A `dir` workspace has no file system of its own to
//! freeze: it is snapshotted only while detached.
//!
//! Every function that touches the disk blocks; the async ones move that off the runtime.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};
use tracing::{info, instrument, warn};

use super::{blocking, Definition, Error, Node, Result, Sandbox};
use crate::size::ByteSize;
use crate::volume::{self, Backend};
use crate::workspace::Paths;

/// A durable workspace's record (`workspace.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurableWorkspace {
    /// Its id (a UUID).
    pub id: String,
    /// Its namespace.
    pub namespace: String,
    /// Its size cap.
    pub size: ByteSize,
    /// The node's storage class.
    pub storage_class: String,
    /// The class's backend.
    pub backend: Backend,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// When it was made.
    pub created_at: SystemTime,
    /// The snapshot it was restored from, if any.
    #[serde(default)]
    pub restored_from: String,
}

/// A snapshot's record (`snapshot.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its id (a UUID).
    pub id: String,
    /// The workspace it was taken of.
    pub workspace_id: String,
    /// Its namespace (the workspace's).
    pub namespace: String,
    /// When it was taken.
    pub created_at: SystemTime,
    /// The workspace's size then.
    pub size: ByteSize,
    /// The backend it was taken from (a restore makes one of the same).
    pub backend: Backend,
    /// Disk it took when taken, bytes.
    pub disk_bytes: u64,
    /// `reflink` or `copy`.
    pub method: String,
    /// `freeze` or `detached`.
    pub consistency: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// How long it took, ms.
    pub took_ms: u64,
}

/// What a durable workspace is now: its record, the sandbox that has it, its disk.
#[derive(Debug, Clone)]
pub struct WorkspaceInfo {
    /// The record.
    pub record: DurableWorkspace,
    /// The live sandbox that has it mounted, if any.
    pub attached_to: Option<String>,
    /// Allocated bytes of its volume.
    pub disk_bytes: u64,
}

/// A workspace mount of a sandbox, as the host sees it.
#[derive(Debug, Clone)]
pub struct MountedAt {
    /// The volume's paths (`data` is what the sandbox sees).
    pub paths: Paths,
    /// The durable workspace it is, if it is one.
    pub durable: Option<String>,
    /// Where the sandbox sees it.
    pub mount_path: String,
    /// Read-only inside the sandbox.
    pub read_only: bool,
}

/// What SyncWorkspace did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    /// Regular files changed since the last sync (or since the sandbox got the mount).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The node's durable workspaces: who has which, per-workspace locks, sync marks.
#[derive(Default)]
pub(super) struct State {
    /// Workspace id → the live sandbox that has it.
    attached: Mutex<HashMap<String, String>>,
    /// One lock per workspace: attach, detach, snapshot and delete take it.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// (sandbox, data dir) → the last SyncWorkspace.
    synced: Mutex<HashMap<(String, PathBuf), SystemTime>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn missing(what: &str, id: &str) -> Error {
    Error::Missing(format!("{what} {id}"))
}

fn internal(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("{what}: {e}"))
}

/// Writes `value` as JSON to `path` atomically.
fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap_or_default())?;
    std::fs::rename(&tmp, path)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let b = std::fs::read(path).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Allocated bytes under `path` (a file, or a tree walked without following symlinks).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut n = m.blocks() * 512;
    if m.is_dir() {
        for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
            n += allocated(&e.path());
        }
    }
    n
}

/// Copies `from` to `to`: a reflink when the file system has them, else a sparse copy (a
/// directory tree: `cp -a`, reflinking where it can). Returns the method used.
fn clone_or_copy(from: &Path, to: &Path) -> Result<&'static str> {
    let cp = |args: &[&str]| -> std::io::Result<std::process::Output> {
        Command::new("cp").args(args).arg(from).arg(to).output()
    };
    let dir = from.is_dir();
    let first = if dir {
        cp(&["-a", "--reflink=always"])
    } else {
        cp(&["--reflink=always"])
    }
    .map_err(internal("run cp"))?;
    if first.status.success() {
        return Ok("reflink");
    }
    if to.is_dir() {
        let _ = std::fs::remove_dir_all(to);
    } else {
        let _ = std::fs::remove_file(to);
    }
    let out = if dir {
        cp(&["-a", "--reflink=auto"])
    } else {
        cp(&["--sparse=always"])
    }
    .map_err(internal("run cp"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if err.contains("No space left") {
            return Err(Error::ResourceExhausted(format!(
                "the workspace store is full: {err}"
            )));
        }
        return Err(Error::Internal(format!("copy {}: {err}", from.display())));
    }
    Ok("copy")
}

/// A frozen file system, thawed when dropped.
struct Frozen(PathBuf);

impl Frozen {
    fn freeze(dir: &Path) -> Result<Self> {
        let out = Command::new("fsfreeze")
            .arg("-f")
            .arg(dir)
            .output()
            .map_err(internal("run fsfreeze"))?;
        if !out.status.success() {
            return Err(Error::Internal(format!(
                "fsfreeze {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Self(dir.to_path_buf()))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let ok = Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            warn!(path = %self.0.display(), "could not thaw a frozen workspace");
        }
    }
}

/// Regular files under `root` changed at or after `since`, and their bytes: a walk from a
/// handle on the root, every component opened `O_NOFOLLOW` relative to its parent (the tree is
/// the sandbox's and hostile: a symlink is never followed).
fn changed_since(root: &Path, since: SystemTime) -> std::io::Result<(u64, u64)> {
    let since = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = (0, 0);
    walk(fd, since, &mut out, 0)?;
    Ok(out)
}

fn walk(
    dir: OwnedFd,
    since: std::time::Duration,
    out: &mut (u64, u64),
    depth: usize,
) -> std::io::Result<()> {
    if depth > 256 {
        return Ok(());
    }
    let entries = rustix::fs::Dir::read_from(dir.as_fd())?;
    for e in entries {
        let e = e?;
        let name = e.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(st) = rustix::fs::statat(dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {
                let at = |s: i64, ns: u64| std::time::Duration::new(s.max(0) as u64, ns as u32);
                let changed =
                    at(st.st_ctime, st.st_ctime_nsec).max(at(st.st_mtime, st.st_mtime_nsec));
                if changed >= since {
                    out.0 += 1;
                    out.1 += st.st_size as u64;
                }
            }
            FileType::Directory => {
                if let Ok(sub) = rustix::fs::openat(
                    dir.as_fd(),
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    walk(sub, since, out, depth + 1)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

impl Node {
    fn store_dir(&self) -> PathBuf {
        self.inner.cfg.store_dir()
    }

    /// The paths of durable workspace `id`.
    pub(super) fn durable_paths(&self, id: &str) -> Paths {
        let base = self.store_dir().join("workspaces").join(id);
        Paths {
            data: base.join("data"),
            tombstone: base.join("tombstone.json"),
            base,
        }
    }

    fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.store_dir().join("snapshots").join(id)
    }

    fn workspace_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.inner.durable.locks)
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Every workspace mount of sandbox `def`, the first (its own workspace) first.
    pub(super) fn mounts_of(&self, def: &Definition) -> Vec<MountedAt> {
        let own = self.paths(&def.id);
        let spec = def.platform.as_deref();
        let first_durable = spec.map(|p| p.workspace_id.clone()).unwrap_or_default();
        let first = MountedAt {
            paths: if first_durable.is_empty() {
                own.clone()
            } else {
                self.durable_paths(&first_durable)
            },
            durable: (!first_durable.is_empty()).then_some(first_durable),
            mount_path: def.workspace.mount_path.clone(),
            read_only: spec.is_some_and(|p| p.read_only),
        };
        std::iter::once(first)
            .chain(def.extra_mounts().iter().enumerate().map(|(i, m)| {
                let durable = !m.workspace_id.is_empty();
                MountedAt {
                    paths: if durable {
                        self.durable_paths(&m.workspace_id)
                    } else {
                        own.extra(i + 1)
                    },
                    durable: durable.then(|| m.workspace_id.clone()),
                    mount_path: m.mount_path.clone(),
                    read_only: m.read_only,
                }
            }))
            .collect()
    }

    /// The durable workspaces sandbox `def` mounts.
    pub(super) fn durable_of(def: &Definition) -> Vec<String> {
        let spec = def.platform.as_deref();
        spec.map(|p| p.workspace_id.clone())
            .into_iter()
            .chain(def.extra_mounts().iter().map(|m| m.workspace_id.clone()))
            .filter(|w| !w.is_empty())
            .collect()
    }

    /// Claims every durable workspace `def` mounts for it, all or none: FAILED_PRECONDITION
    /// when one is another live sandbox's, NOT_FOUND when one is gone; then mounts them.
    pub(super) async fn attach_durable(&self, def: &Definition) -> Result<()> {
        let ids = Self::durable_of(def);
        if ids.is_empty() {
            return Ok(());
        }
        for id in &ids {
            if !self.durable_paths(id).base.join("workspace.json").exists() {
                return Err(missing("workspace", id));
            }
        }
        {
            let mut attached = lock(&self.inner.durable.attached);
            if let Some((ws, other)) = ids
                .iter()
                .find_map(|w| attached.get(w).filter(|s| **s != def.id).map(|s| (w, s)))
            {
                return Err(Error::Precondition(format!(
                    "workspace {ws} is attached to sandbox {other}: a durable workspace is \
                     mounted by one live sandbox at a time"
                )));
            }
            for w in &ids {
                attached.insert(w.clone(), def.id.clone());
            }
        }
        let mounts: Vec<MountedAt> = self
            .mounts_of(def)
            .into_iter()
            .filter(|m| m.durable.is_some())
            .collect();
        // Mounted under their locks: a snapshot of a detached one is never copied while a
        // sandbox starts writing to it.
        let mut sorted = ids.clone();
        sorted.sort();
        let locks: Vec<_> = sorted.iter().map(|w| self.workspace_lock(w)).collect();
        let mut guards = Vec::with_capacity(locks.len());
        for l in &locks {
            guards.push(l.lock().await);
        }
        let r = blocking(move || -> std::result::Result<(), volume::Error> {
            for m in &mounts {
                if volume::has_image(&m.paths) {
                    volume::attach(&m.paths)?;
                }
            }
            Ok(())
        })
        .await
        .and_then(|r| r.map_err(|e| Error::Internal(format!("mount workspace: {e}"))));
        drop(guards);
        if r.is_err() {
            self.release_durable(def).await;
        }
        r
    }

    /// Unmounts the durable workspaces `def` has and drops its claims on them.
    pub(super) async fn release_durable(&self, def: &Definition) {
        let ids = Self::durable_of(def);
        if ids.is_empty() {
            return;
        }
        for id in &ids {
            let l = self.workspace_lock(id);
            let _g = l.lock().await;
            // One another sandbox has now (this one let it go at suspend) stays mounted.
            let holder = lock(&self.inner.durable.attached).get(id).cloned();
            if holder.as_ref().is_some_and(|h| *h != def.id) {
                continue;
            }
            let paths = self.durable_paths(id);
            let r = blocking(move || volume::detach(&paths)).await;
            if !matches!(r, Ok(Ok(()))) {
                warn!(sandbox_id = %def.id, workspace_id = %id, "could not unmount a durable workspace");
            }
            let mut attached = lock(&self.inner.durable.attached);
            if attached.get(id) == Some(&def.id) {
                attached.remove(id);
            }
        }
        lock(&self.inner.durable.synced).retain(|(s, _), _| *s != def.id);
    }

    /// Rebuilds the claims of a recovered live sandbox (after a restart).
    pub(super) fn reclaim_durable(&self, def: &Definition) {
        let mut attached = lock(&self.inner.durable.attached);
        for w in Self::durable_of(def) {
            attached.insert(w, def.id.clone());
        }
    }

    fn read_workspace(&self, id: &str) -> Option<DurableWorkspace> {
        read_json(&self.durable_paths(id).base.join("workspace.json"))
    }

    fn info(&self, record: DurableWorkspace) -> WorkspaceInfo {
        let attached_to = lock(&self.inner.durable.attached).get(&record.id).cloned();
        let paths = self.durable_paths(&record.id);
        let disk_bytes = if volume::has_image(&paths) {
            allocated(&volume::image_path(&paths))
        } else {
            allocated(&paths.data)
        };
        WorkspaceInfo {
            record,
            attached_to,
            disk_bytes,
        }
    }

    /// Makes a durable workspace in `namespace`: empty, or `from_snapshot`'s content.
    #[instrument(skip_all, fields(namespace = %namespace))]
    pub async fn create_workspace(
        &self,
        namespace: &str,
        size: &str,
        storage_class: &str,
        labels: BTreeMap<String, String>,
        from_snapshot: &str,
    ) -> Result<WorkspaceInfo> {
        let cfg = self.config();
        let class = if storage_class.is_empty() {
            cfg.storage_class.clone()
        } else {
            storage_class.to_string()
        };
        let snapshot = if from_snapshot.is_empty() {
            None
        } else {
            Some(self.snapshot(namespace, from_snapshot).await?)
        };
        let (size, backend) = match &snapshot {
            Some(s) => {
                if !size.is_empty() && super::create::workspace_size(cfg, size)? != s.size {
                    return Err(Error::InvalidArgument(format!(
                        "size {size} differs from snapshot {}'s {} (a restore keeps the size)",
                        s.id,
                        s.size.as_str()
                    )));
                }
                if !storage_class.is_empty()
                    && cfg.storage_classes.get(storage_class) != Some(&s.backend)
                {
                    return Err(Error::InvalidArgument(format!(
                        "storage_class {storage_class} is not the snapshot's kind of volume"
                    )));
                }
                let class = cfg
                    .storage_classes
                    .iter()
                    .find(|(_, b)| **b == s.backend)
                    .map(|(c, _)| c.clone())
                    .unwrap_or(class.clone());
                (s.size.clone(), (s.backend, class))
            }
            None => {
                let Some(backend) = cfg.storage_classes.get(&class).copied() else {
                    return Err(Error::InvalidArgument(format!(
                        "unknown storage_class {class:?}"
                    )));
                };
                (super::create::workspace_size(cfg, size)?, (backend, class))
            }
        };
        self.check_free_disk().await?;
        let (backend, class) = backend;
        let record = DurableWorkspace {
            id: uuid::Uuid::new_v4().to_string(),
            namespace: namespace.to_string(),
            size,
            storage_class: class,
            backend,
            labels,
            created_at: SystemTime::now(),
            restored_from: from_snapshot.to_string(),
        };
        let paths = self.durable_paths(&record.id);
        let snap_dir = snapshot.as_ref().map(|s| self.snapshot_dir(&s.id));
        let r2 = record.clone();
        let made = blocking(move || -> Result<()> {
            match snap_dir {
                None => {
                    volume::create(&paths, backend, r2.size.bytes())
                        .map_err(|e| super::capacity::volume_error(&r2.id, e))?;
                    // Unmounted until a sandbox has it (a loop device each only then).
                    volume::detach(&paths).map_err(|e| Error::Internal(e.to_string()))?;
                }
                Some(from) => {
                    paths.create().map_err(internal("create workspace"))?;
                    match backend {
                        Backend::Ext4Loop => {
                            clone_or_copy(&from.join("volume.ext4"), &volume::image_path(&paths))?;
                        }
                        Backend::Dir => {
                            std::fs::remove_dir(&paths.data).map_err(internal("restore"))?;
                            clone_or_copy(&from.join("data"), &paths.data)?;
                        }
                    }
                }
            }
            write_json(&paths.base.join("workspace.json"), &r2).map_err(internal("record"))
        })
        .await?;
        if let Err(e) = made {
            let paths = self.durable_paths(&record.id);
            let _ = blocking(move || volume::delete(&paths)).await;
            return Err(e);
        }
        info!(workspace_id = %record.id, size = %record.size.as_str(),
              restored_from = %record.restored_from, "durable workspace created");
        Ok(self.info(record))
    }

    /// A durable workspace (NOT_FOUND when there is none, or it is another namespace's and
    /// `namespace` is given).
    pub fn get_workspace(&self, id: &str) -> Result<WorkspaceInfo> {
        if uuid::Uuid::parse_str(id).is_err() {
            return Err(missing("workspace", id));
        }
        let r = self
            .read_workspace(id)
            .ok_or_else(|| missing("workspace", id))?;
        Ok(self.info(r))
    }

    /// Every durable workspace of `namespace` (all of them for an empty one), oldest first.
    pub async fn list_workspaces(&self, namespace: &str) -> Result<Vec<WorkspaceInfo>> {
        let dir = self.store_dir().join("workspaces");
        let ns = namespace.to_string();
        let mut all: Vec<DurableWorkspace> = blocking(move || {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| read_json::<DurableWorkspace>(&e.path().join("workspace.json")))
                .filter(|w| ns.is_empty() || w.namespace == ns)
                .collect()
        })
        .await?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all.into_iter().map(|r| self.info(r)).collect())
    }

    /// Deletes a durable workspace: FAILED_PRECONDITION while a sandbox has it (a suspended
    /// one counts: it mounts it again on resume). Its snapshots stay.
    #[instrument(skip_all, fields(workspace_id = %id))]
    pub async fn delete_workspace(&self, id: &str) -> Result<()> {
        let info = self.get_workspace(id)?;
        let l = self.workspace_lock(id);
        let _g = l.lock().await;
        if let Some(sb) = &info.attached_to {
            return Err(Error::Precondition(format!(
                "workspace {id} is attached to sandbox {sb}"
            )));
        }
        if let Some(sb) = self.table().by_id.values().find(|s| {
            !s.status().has_ended() && Self::durable_of(s.definition()).contains(&info.record.id)
        }) {
            return Err(Error::Precondition(format!(
                "workspace {id} is mounted by sandbox {} ({})",
                sb.id,
                sb.status().word()
            )));
        }
        let paths = self.durable_paths(id);
        blocking(move || volume::delete(&paths))
            .await?
            .map_err(|e| Error::Internal(format!("delete workspace: {e}")))?;
        lock(&self.inner.durable.locks).remove(id);
        info!("durable workspace deleted");
        Ok(())
    }

    /// Takes a snapshot of a durable workspace (see the module doc for how it is one instant).
    #[instrument(skip_all, fields(workspace_id = %id))]
    pub async fn snapshot_workspace(
        &self,
        id: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Snapshot> {
        let info = self.get_workspace(id)?;
        let l = self.workspace_lock(id);
        let _g = l.lock().await;
        let attached = lock(&self.inner.durable.attached).get(id).cloned();
        let record = info.record;
        if record.backend == Backend::Dir && attached.is_some() {
            return Err(Error::Precondition(format!(
                "workspace {id} is a directory (storage class {}) attached to sandbox {}: it \
                 has no file system of its own to freeze, so it is snapshotted while detached",
                record.storage_class,
                attached.unwrap_or_default()
            )));
        }
        self.check_free_disk().await?;
        let snap_id = uuid::Uuid::new_v4().to_string();
        let dir = self.snapshot_dir(&snap_id);
        let paths = self.durable_paths(id);
        let store = self.store_dir();
        let frozen = attached.is_some() && volume::is_mounted(&paths.data);
        let took = Instant::now();
        let dir2 = dir.clone();
        let backend = record.backend;
        let taken = blocking(move || -> Result<(&'static str, u64)> {
            std::fs::create_dir_all(&dir2).map_err(internal("snapshot dir"))?;
            let before = volume::free_bytes(&store).unwrap_or(0);
            let method = match backend {
                Backend::Ext4Loop => {
                    let _frozen = if frozen {
                        Some(Frozen::freeze(&paths.data)?)
                    } else {
                        None
                    };
                    clone_or_copy(&volume::image_path(&paths), &dir2.join("volume.ext4"))?
                }
                Backend::Dir => clone_or_copy(&paths.data, &dir2.join("data"))?,
            };
            let after = volume::free_bytes(&store).unwrap_or(0);
            let disk = if method == "reflink" {
                before.saturating_sub(after)
            } else {
                allocated(&dir2)
            };
            Ok((method, disk))
        })
        .await
        .and_then(|r| r);
        let (method, disk_bytes) = match taken {
            Ok(t) => t,
            Err(e) => {
                let _ = blocking(move || std::fs::remove_dir_all(dir)).await;
                return Err(e);
            }
        };
        let snap = Snapshot {
            id: snap_id,
            workspace_id: record.id.clone(),
            namespace: record.namespace.clone(),
            created_at: SystemTime::now(),
            size: record.size.clone(),
            backend: record.backend,
            disk_bytes,
            method: method.to_string(),
            consistency: if frozen { "freeze" } else { "detached" }.to_string(),
            labels,
            took_ms: took.elapsed().as_millis() as u64,
        };
        let s2 = snap.clone();
        let dir = self.snapshot_dir(&snap.id);
        blocking(move || write_json(&dir.join("snapshot.json"), &s2))
            .await?
            .map_err(internal("snapshot record"))?;
        info!(snapshot_id = %snap.id, method, disk_bytes, took_ms = snap.took_ms,
              consistency = %snap.consistency, "workspace snapshot taken");
        Ok(snap)
    }

    /// A snapshot in `namespace` (NOT_FOUND otherwise).
    pub async fn snapshot(&self, namespace: &str, id: &str) -> Result<Snapshot> {
        if uuid::Uuid::parse_str(id).is_err() {
            return Err(missing("snapshot", id));
        }
        let path = self.snapshot_dir(id).join("snapshot.json");
        let s: Option<Snapshot> = blocking(move || read_json(&path)).await?;
        s.filter(|s| namespace.is_empty() || s.namespace == namespace)
            .ok_or_else(|| missing("snapshot", id))
    }

    /// The snapshots of `namespace` (all for empty), only `workspace_id`'s when given, oldest
    /// first.
    pub async fn list_snapshots(
        &self,
        namespace: &str,
        workspace_id: &str,
    ) -> Result<Vec<Snapshot>> {
        let dir = self.store_dir().join("snapshots");
        let (ns, ws) = (namespace.to_string(), workspace_id.to_string());
        let mut all: Vec<Snapshot> = blocking(move || {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| read_json::<Snapshot>(&e.path().join("snapshot.json")))
                .filter(|s| ns.is_empty() || s.namespace == ns)
                .filter(|s| ws.is_empty() || s.workspace_id == ws)
                .collect()
        })
        .await?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    /// Deletes a snapshot (workspaces restored from it are copies and stay).
    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.snapshot("", id).await?;
        let dir = self.snapshot_dir(id);
        blocking(move || std::fs::remove_dir_all(dir))
            .await?
            .map_err(internal("delete snapshot"))
    }

    /// SyncWorkspace: flushes the sandbox's writable mounts (`workspace_id` empty: every one;
    /// else the one mounting that durable workspace, or the one at that mount path) to the
    /// store (syncfs, then the image file's own fsync) and reports the regular files changed
    /// since the last sync of each mount.
    #[instrument(skip_all, fields(sandbox_id = %sb.id))]
    pub async fn sync_workspace(&self, sb: &Arc<Sandbox>, workspace_id: &str) -> Result<Synced> {
        if !sb.status().can_exec() {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: format!("{} (SyncWorkspace needs it running)", sb.status().word()),
            });
        }
        let writable: Vec<MountedAt> = self
            .mounts_of(sb.definition())
            .into_iter()
            .filter(|m| !m.read_only)
            .filter(|m| {
                workspace_id.is_empty()
                    || m.durable.as_deref() == Some(workspace_id)
                    || m.mount_path == workspace_id
            })
            .collect();
        if writable.is_empty() {
            return Err(Error::Precondition(if workspace_id.is_empty() {
                format!("sandbox {} has no writable workspace", sb.id)
            } else {
                format!(
                    "sandbox {} has no writable mount of workspace {workspace_id}",
                    sb.id
                )
            }));
        }
        let now = SystemTime::now();
        let marks: Vec<SystemTime> = {
            let synced = lock(&self.inner.durable.synced);
            writable
                .iter()
                .map(|m| {
                    synced
                        .get(&(sb.id.clone(), m.paths.data.clone()))
                        .copied()
                        .unwrap_or(sb.created_at)
                })
                .collect()
        };
        let dirs: Vec<(Paths, SystemTime)> = writable
            .iter()
            .map(|m| m.paths.clone())
            .zip(marks)
            .collect();
        let total = blocking(move || -> std::io::Result<Synced> {
            let mut total = Synced::default();
            for (p, since) in &dirs {
                let fd = rustix::fs::open(
                    &p.data,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                rustix::fs::syncfs(&fd)?;
                let img = volume::image_path(p);
                if img.exists() {
                    std::fs::File::open(&img)?.sync_all()?;
                }
                let (files, bytes) = changed_since(&p.data, *since)?;
                total.files += files;
                total.bytes += bytes;
            }
            Ok(total)
        })
        .await?
        .map_err(internal("sync workspace"))?;
        let mut synced = lock(&self.inner.durable.synced);
        for m in &writable {
            synced.insert((sb.id.clone(), m.paths.data.clone()), now);
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_files_are_counted_without_following_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let t0 = SystemTime::now() - std::time::Duration::from_secs(1);
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), b"12345").unwrap();
        std::fs::write(d.path().join("g"), b"123").unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("escape")).unwrap();
        assert_eq!(changed_since(d.path(), t0).unwrap(), (2, 8));
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        assert_eq!(changed_since(d.path(), later).unwrap(), (0, 0));
    }

    #[test]
    fn a_copy_is_sparse_and_reports_its_method() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("img");
        let f = std::fs::File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[7u8; 4096], 1 << 20).unwrap();
        let dst = d.path().join("copy");
        let m = clone_or_copy(&src, &dst).unwrap();
        assert!(m == "reflink" || m == "copy");
        assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
        assert!(allocated(&dst) < 1 << 20, "{}", allocated(&dst));
    }
}
