//! A fake [`SandboxRuntime`] for unit tests: records, tasks and images in memory, with
//! failures and hangs injected per verb, and every call logged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::signal::Signal;
use prost_types::Any;
use tokio::sync::watch;

use super::{
    containerd, ConsoleSize, ExecLaunch, ImageInfo, Progress, Record, ResolvedImage, Result,
    RuntimeChoice, SandboxLaunch, SandboxRuntime, TaskState,
};
use crate::config::RuntimeKind;

/// The verbs a test can make fail or hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`SandboxRuntime::record`].
    Record,
    /// [`SandboxRuntime::records`].
    Records,
    /// [`SandboxRuntime::set_labels`].
    SetLabels,
    /// [`SandboxRuntime::set_spec`].
    SetSpec,
    /// [`SandboxRuntime::resolve_image`].
    Resolve,
    /// [`SandboxRuntime::start`].
    Start,
    /// [`SandboxRuntime::state`].
    State,
    /// [`SandboxRuntime::kill`].
    Kill,
    /// [`SandboxRuntime::teardown`].
    Teardown,
    /// [`SandboxRuntime::checkpoint`].
    Checkpoint,
    /// [`SandboxRuntime::restore`].
    Restore,
}

/// A sandbox record as the fake keeps it.
#[derive(Debug, Clone)]
pub struct FakeRecord {
    /// Labels.
    pub labels: HashMap<String, String>,
    /// The spec last written.
    pub spec: Vec<u8>,
    /// The image name.
    pub image: String,
}

#[derive(Default)]
struct State {
    records: BTreeMap<String, FakeRecord>,
    tasks: HashMap<String, TaskState>,
    images: HashMap<String, ResolvedImage>,
    failing: HashMap<Op, bool>,
    hanging: HashSet<Op>,
    calls: Vec<String>,
}

/// The fake runtime.
pub struct FakeRuntime {
    state: Mutex<State>,
    choice: RuntimeChoice,
    exits: watch::Sender<u64>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            choice: RuntimeChoice {
                kind: RuntimeKind::RuncWrapper,
                name: "fake".into(),
                options: Any::default(),
                binary: PathBuf::from("/nonexistent/runsc-fake"),
                runsc: Default::default(),
                platform: "ptrace".into(),
            },
            exits: watch::channel(0).0,
        }
    }
}

fn injected(op: Op, unavailable: bool) -> super::Error {
    let status = if unavailable {
        tonic::Status::unavailable("injected: containerd is down")
    } else {
        tonic::Status::internal("injected failure")
    };
    super::Error::Containerd(containerd::Error::Call {
        op: "fake",
        what: format!("{op:?}"),
        status,
    })
}

impl FakeRuntime {
    /// A fake that knows `image` (digest `sha256:<image>`).
    pub fn with_image(image: &str) -> Self {
        let f = Self::default();
        f.add_image(image, &format!("sha256:{image}"));
        f
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `name` resolvable, pointing at `digest`.
    pub fn add_image(&self, name: &str, digest: &str) {
        self.lock().images.insert(
            name.into(),
            ResolvedImage {
                name: name.into(),
                chain_id: format!("chain-{digest}"),
                env: vec!["FROM_IMAGE=1".into()],
                argv: vec!["/bin/sh".into(), "-c".into(), "echo from the image".into()],
                working_dir: String::new(),
                digest: digest.into(),
            },
        );
    }

    /// Every later call of `op` fails (INTERNAL, or UNAVAILABLE with `unavailable`) until
    /// [`FakeRuntime::heal`].
    pub fn fail(&self, op: Op, unavailable: bool) {
        self.lock().failing.insert(op, unavailable);
    }

    /// Every later call of `op` never returns (a pull that hangs, a shim that never answers).
    pub fn hang(&self, op: Op) {
        self.lock().hanging.insert(op);
    }

    /// Ends every injected failure and hang.
    pub fn heal(&self) {
        let mut s = self.lock();
        s.failing.clear();
        s.hanging.clear();
    }

    /// Sets a sandbox's task state (as a daemon restart would find it).
    pub fn set_task(&self, id: &str, state: TaskState) {
        self.lock().tasks.insert(id.into(), state);
        self.exits.send_modify(|n| *n += 1);
    }

    /// Plants a record (as an earlier daemon left it).
    pub fn plant(&self, id: &str, labels: HashMap<String, String>, task: TaskState) {
        let mut s = self.lock();
        s.records.insert(
            id.into(),
            FakeRecord {
                labels,
                spec: vec![],
                image: String::new(),
            },
        );
        s.tasks.insert(id.into(), task);
    }

    /// The record of a sandbox.
    pub fn record_of(&self, id: &str) -> Option<FakeRecord> {
        self.lock().records.get(id).cloned()
    }

    /// The task state of a sandbox (Missing without one).
    pub fn task(&self, id: &str) -> TaskState {
        self.lock()
            .tasks
            .get(id)
            .copied()
            .unwrap_or(TaskState::Missing)
    }

    /// How many records there are.
    pub fn record_count(&self) -> usize {
        self.lock().records.len()
    }

    /// The calls so far, as `Op id` strings.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    async fn enter(&self, op: Op, id: &str) -> Result<()> {
        let (fail, hang) = {
            let mut s = self.lock();
            s.calls.push(format!("{op:?} {id}"));
            (s.failing.get(&op).copied(), s.hanging.contains(&op))
        };
        if hang {
            std::future::pending::<()>().await;
        }
        match fail {
            Some(unavailable) => Err(injected(op, unavailable)),
            None => Ok(()),
        }
    }

    fn not_found(what: &str) -> super::Error {
        super::Error::Containerd(containerd::Error::Call {
            op: "fake",
            what: what.into(),
            status: tonic::Status::not_found("not found"),
        })
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for FakeRuntime {
    fn choice(&self) -> &RuntimeChoice {
        &self.choice
    }

    async fn version(&self) -> Result<String> {
        Ok("fake".into())
    }

    async fn record(&self, l: SandboxLaunch<'_>) -> Result<()> {
        self.enter(Op::Record, l.id).await?;
        self.lock().records.insert(
            l.id.into(),
            FakeRecord {
                labels: l.labels,
                spec: l.spec,
                image: l.image.into(),
            },
        );
        Ok(())
    }

    async fn records(&self) -> Result<Vec<Record>> {
        self.enter(Op::Records, "").await?;
        Ok(self
            .lock()
            .records
            .iter()
            .map(|(id, r)| Record {
                id: id.clone(),
                labels: r.labels.clone(),
            })
            .collect())
    }

    async fn set_labels(&self, id: &str, labels: HashMap<String, String>) -> Result<()> {
        self.enter(Op::SetLabels, id).await?;
        let mut s = self.lock();
        let r = s.records.get_mut(id).ok_or_else(|| Self::not_found(id))?;
        r.labels.extend(labels);
        Ok(())
    }

    async fn set_spec(&self, id: &str, spec: Vec<u8>) -> Result<()> {
        self.enter(Op::SetSpec, id).await?;
        let mut s = self.lock();
        let r = s.records.get_mut(id).ok_or_else(|| Self::not_found(id))?;
        r.spec = spec;
        Ok(())
    }

    async fn resolve_image(&self, name: &str) -> Result<ResolvedImage> {
        self.enter(Op::Resolve, name).await?;
        self.lock()
            .images
            .get(name)
            .cloned()
            .ok_or_else(|| super::Error::Image(super::image::Error::NotFound(name.into())))
    }

    async fn image_digest(&self, name: &str) -> String {
        self.lock()
            .images
            .get(name)
            .map(|i| i.digest.clone())
            .unwrap_or_default()
    }

    async fn start(&self, id: &str, _chain_id: &str, _stdio: [&str; 3]) -> Result<()> {
        self.enter(Op::Start, id).await?;
        if !self.lock().records.contains_key(id) {
            return Err(Self::not_found(id));
        }
        self.set_task(id, TaskState::Running);
        Ok(())
    }

    async fn checkpoint(&self, id: &str, dir: &Path) -> Result<()> {
        self.enter(Op::Checkpoint, id).await?;
        if self.task(id) != TaskState::Running {
            return Err(Self::not_found(id));
        }
        std::fs::create_dir_all(dir).map_err(|e| super::Error::Io {
            what: "fake checkpoint",
            path: dir.to_path_buf(),
            source: e,
        })?;
        let _ = std::fs::write(dir.join("checkpoint.img"), b"fake");
        self.lock().tasks.remove(id);
        self.exits.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn restore(&self, id: &str, _chain_id: &str, _: [&str; 3], dir: &Path) -> Result<()> {
        self.enter(Op::Restore, id).await?;
        if !dir.join("checkpoint.img").exists() {
            return Err(super::Error::Unsupported("no checkpoint".into()));
        }
        self.set_task(id, TaskState::Running);
        Ok(())
    }

    async fn state(&self, id: &str) -> Result<TaskState> {
        self.enter(Op::State, id).await?;
        Ok(self.task(id))
    }

    async fn delete_task(&self, id: &str) -> Result<()> {
        if self.lock().tasks.remove(id).is_some() {
            self.exits.send_modify(|n| *n += 1);
        }
        Ok(())
    }

    async fn wait_exit(&self, id: &str) -> Result<u32> {
        let mut rx = self.exits.subscribe();
        loop {
            match self.task(id) {
                TaskState::Stopped(code) => return Ok(code),
                TaskState::Missing => return Err(Self::not_found(id)),
                _ => {}
            }
            if rx.changed().await.is_err() {
                return Err(Self::not_found(id));
            }
        }
    }

    async fn kill(&self, id: &str, signal: Signal) -> Result<()> {
        self.enter(Op::Kill, id).await?;
        if self.task(id) != TaskState::Missing {
            self.set_task(id, TaskState::Stopped(128 + signal as u32));
        }
        Ok(())
    }

    async fn teardown(&self, id: &str) -> Result<()> {
        self.enter(Op::Teardown, id).await?;
        {
            let mut s = self.lock();
            s.records.remove(id);
            s.tasks.remove(id);
        }
        self.exits.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn exec_start(&self, id: &str, _: ExecLaunch<'_>) -> Result<()> {
        Err(Self::not_found(id))
    }

    async fn exec_wait(&self, id: &str, _: &str) -> Result<u32> {
        Err(Self::not_found(id))
    }

    async fn exec_state(&self, _: &str, _: &str) -> Result<TaskState> {
        Ok(TaskState::Missing)
    }

    async fn exec_kill(&self, id: &str, _: &str, _: Signal) -> Result<()> {
        Err(Self::not_found(id))
    }

    async fn exec_resize(&self, id: &str, _: &str, _: ConsoleSize) -> Result<()> {
        Err(Self::not_found(id))
    }

    async fn exec_close_stdin(&self, id: &str, _: &str) -> Result<()> {
        Err(Self::not_found(id))
    }

    async fn exec_delete(&self, _: &str, _: &str) -> Result<()> {
        Ok(())
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>> {
        Ok(self
            .lock()
            .images
            .values()
            .map(|i| ImageInfo {
                name: i.name.clone(),
                digest: i.digest.clone(),
                size: 0,
            })
            .collect())
    }

    async fn import_image(
        &self,
        _: &Path,
        _: Option<&str>,
        _: Progress<'_>,
    ) -> Result<Vec<String>> {
        Err(Self::not_found("import"))
    }

    async fn pull_image(&self, reference: &str, _: Progress<'_>) -> Result<()> {
        Err(Self::not_found(reference))
    }

    async fn alias_image(&self, existing: &str, alias: &str) -> Result<()> {
        let mut s = self.lock();
        let img = s
            .images
            .get(existing)
            .cloned()
            .ok_or_else(|| Self::not_found(existing))?;
        s.images.insert(alias.into(), img);
        Ok(())
    }
}
