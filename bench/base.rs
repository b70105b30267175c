//! "baseline": the same sandboxes driven straight through containerd + runsc with the project's
//! runtime library and no daemon: the container with the same OCI spec (limits, mounts; a plain
//! host directory as the workspace), snapshot + task, execs with FIFOs, and teardown.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use computed::config::{Config, RuntimeKind};
use computed::metering::{CgroupVersion, SandboxCgroup};
use computed::runtime::image::{self, ResolvedImage};
use computed::runtime::{
    spec, Containerd, ExecIo, ImagePolicy, Runtime, RuntimeChoice, SandboxLaunch, SandboxRuntime,
};
use tokio::io::AsyncReadExt;

use crate::target::{ExecOutcome, Target, IMAGE};

/// The cgroup parent both sides use (the daemon's default `cgroup_parent`).
const CGROUP_PARENT: &str = "compute";

/// The init of a baseline sandbox: the image's shell, idling.
const INIT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// The baseline side.
pub struct Base {
    cfg: Config,
    image_tar: PathBuf,
    dir: PathBuf,
    rt: OnceLock<Runtime>,
    /// The same containerd client, for execs driven call by call.
    ctr: OnceLock<Containerd>,
    image: OnceLock<ResolvedImage>,
    live: Mutex<BTreeSet<String>>,
    /// The host copy of the data `write_read` copies in and out, and its length.
    src: Mutex<Option<(PathBuf, usize)>>,
}

/// The cgroup of a sandbox (both sides put it at `/compute/<id>`).
pub fn cgroup(id: &str) -> SandboxCgroup {
    let root = Path::new("/sys/fs/cgroup");
    SandboxCgroup::new(
        root,
        CgroupVersion::detect(root),
        &format!("/{CGROUP_PARENT}/{id}"),
    )
}

/// Tears down every container left in `namespace` (tasks, containers, snapshots, cgroups).
pub async fn sweep_namespace(containerd: &Path, namespace: &str) {
    let Ok(ctr) = Containerd::connect(containerd, namespace).await else {
        return;
    };
    let choice = RuntimeChoice {
        kind: RuntimeKind::RuncWrapper,
        name: String::new(),
        options: Default::default(),
        binary: Default::default(),
        runsc: Default::default(),
        platform: String::new(),
    };
    let rt = Runtime::new(ctr.clone(), choice, ImagePolicy::default());
    let Ok(containers) = ctr.list_containers().await else {
        return;
    };
    for c in containers {
        match tokio::time::timeout(Duration::from_secs(30), rt.teardown(&c.id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("compute-bench: cleanup of {namespace}/{}: {e}", c.id),
            Err(_) => eprintln!("compute-bench: cleanup of {namespace}/{}: timed out", c.id),
        }
        for d in cgroup(&c.id).dirs() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

impl Base {
    /// The raw checkpoints with runsc `--compression=compression` (None: runsc's default).
    pub fn with_checkpoint_compression(mut self, compression: Option<&str>) -> Base {
        if let Some(c) = compression {
            self.cfg.checkpoint_compression = c.to_string();
        }
        self
    }

    /// Prepares the baseline's directories and config (nothing runs yet).
    pub fn new(
        image_tar: &Path,
        containerd: &Path,
        runsc: &Path,
        platform: &str,
        dir: PathBuf,
    ) -> Result<Base> {
        std::fs::create_dir_all(dir.join("workspaces"))
            .with_context(|| format!("create {}", dir.display()))?;
        let cfg = Config {
            containerd_socket: containerd.to_path_buf(),
            namespace: format!("bench-base-{}", std::process::id()),
            state_dir: dir.join("state"),
            run_dir: dir.join("run"),
            runsc_path: runsc.to_path_buf(),
            runsc_platform: platform.to_string(),
            runtime: RuntimeKind::Auto,
            ..Config::default()
        };
        Ok(Base {
            cfg,
            image_tar: image_tar.to_path_buf(),
            dir,
            rt: OnceLock::new(),
            ctr: OnceLock::new(),
            image: OnceLock::new(),
            live: Mutex::new(BTreeSet::new()),
            src: Mutex::new(None),
        })
    }

    /// Connects, writes the runsc wrapper, imports and resolves the image.
    pub async fn start(&self) -> Result<()> {
        let ctr = Containerd::connect(&self.cfg.containerd_socket, &self.cfg.namespace).await?;
        ctr.version().await.context("containerd does not answer")?;
        let choice = computed::runtime::choose_runtime(&self.cfg)?;
        image::import_tar(&ctr, &self.image_tar, Some(IMAGE))
            .await
            .context("import the image")?;
        let resolved = image::resolve(&ctr, IMAGE).await?;
        let _ = self.image.set(resolved);
        let _ = self
            .rt
            .set(Runtime::new(ctr.clone(), choice, ImagePolicy::default()));
        let _ = self.ctr.set(ctr);
        Ok(())
    }

    fn rt(&self) -> Result<&Runtime> {
        self.rt.get().context("baseline not started")
    }

    fn workspace(&self, id: &str) -> PathBuf {
        self.dir.join("workspaces").join(id)
    }

    /// Same limits as the daemon's defaults: 1000 m CPU, 1 GiB + 384 MiB headroom, pids 1024.
    fn spec(&self, id: &str, ws: &Path, env: &[String]) -> Vec<u8> {
        let cfg = &self.cfg;
        let mem = cfg.default_memory_bytes;
        spec::sandbox_spec(&spec::SandboxSpec {
            hostname: format!("sandbox-{}", &id[..8]),
            init_args: vec!["/bin/sh".into(), "-c".into(), INIT.into()],
            env: env.to_vec(),
            workspace_dir: ws,
            mount_path: "/workspace",
            read_only: false,
            extra_mounts: Vec::new(),
            helpers_dir: None,
            cgroups_path: format!("/{CGROUP_PARENT}/{id}"),
            cpu_quota: i64::from(cfg.default_cpu_millis) * 100,
            memory_limit: (mem + cfg.memory_headroom_bytes.max(mem / 4)) as i64,
            pids_limit: cfg.pids_limit,
            netns: None,
            net_files: None,
        })
    }

    /// Container + snapshot + task, started.
    async fn create(&self) -> Result<String> {
        let rt = self.rt()?;
        let img = self.image.get().context("baseline not started")?;
        let id = uuid::Uuid::new_v4().to_string();
        let ws = self.workspace(&id);
        std::fs::create_dir_all(&ws).with_context(|| format!("create {}", ws.display()))?;
        let spec = self.spec(&id, &ws, &img.env);
        self.live.lock().unwrap().insert(id.clone());
        rt.record(SandboxLaunch {
            id: &id,
            labels: HashMap::from([("compute-bench".to_string(), "baseline".to_string())]),
            spec,
            image: IMAGE,
        })
        .await?;
        rt.start(&id, &img.chain_id, ["", "", ""]).await?;
        Ok(id)
    }

    /// Where a raw sandbox's checkpoint goes (group `suspend`).
    pub fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.dir.join("checkpoints").join(id)
    }

    /// The raw suspend: runsc checkpoint through containerd's runc shim into
    /// [`Base::checkpoint_dir`] (the task exits and is deleted; `Runtime::checkpoint`).
    pub async fn suspend(&self, id: &str) -> Result<Duration> {
        let rt = self.rt()?;
        let dir = self.checkpoint_dir(id);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let t0 = Instant::now();
        rt.checkpoint(id, &dir).await?;
        let d = t0.elapsed();
        // The (empty) cgroup directories runsc may leave.
        for c in cgroup(id).dirs() {
            let _ = std::fs::remove_dir(c);
        }
        Ok(d)
    }

    /// The raw resume: a new task restored from [`Base::checkpoint_dir`] (runc's
    /// `criu_image_path`, a `runsc restore`), then `Tasks.Exec` of `echo hi`; the time until its
    /// first stdout byte.
    pub async fn resume_first_output(&self, id: &str) -> Result<Duration> {
        let rt = self.rt()?;
        let img = self.image.get().context("baseline not started")?;
        let dir = self.checkpoint_dir(id);
        let t0 = Instant::now();
        rt.restore(id, &img.chain_id, ["", "", ""], &dir).await?;
        let out = self
            .run_exec(id, &["echo", "hi"], t0)
            .await?
            .check(Some(b"hi\n"))?;
        out.first_stdout.context("no stdout")
    }

    async fn run_exec(&self, id: &str, argv: &[&str], t0: Instant) -> Result<ExecOutcome> {
        let ctr = self.ctr.get().context("baseline not started")?;
        let exec_id = format!("exec-{}", uuid::Uuid::new_v4().simple());
        let dir = self.cfg.run_dir.join("io").join(id).join(&exec_id);
        let mut io = ExecIo::create(dir, false, false)?;
        let args: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env = vec![spec::DEFAULT_PATH.to_string(), "HOME=/root".into()];
        let process = spec::exec_process(&args, &env, "/workspace", None);
        let out = io.stdout_path.display().to_string();
        let err = io
            .stderr_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        ctr.exec(id, &exec_id, process, ["", &out, &err], false)
            .await?;
        if let Err(e) = ctr.start(id, &exec_id).await {
            let _ = ctr.delete_process(id, &exec_id).await;
            return Err(e.into());
        }
        io.release_writers();
        let (Some(mut out_rx), Some(mut err_rx)) = (io.stdout.take(), io.stderr.take()) else {
            bail!("exec stdio missing");
        };
        let read_out = async {
            let mut buf = vec![0u8; 32 * 1024];
            let mut data = Vec::new();
            let mut first = None;
            while let Ok(n) = out_rx.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                first.get_or_insert_with(|| t0.elapsed());
                data.extend_from_slice(&buf[..n]);
            }
            (first, data)
        };
        let read_err = async {
            let mut data = Vec::new();
            let _ = err_rx.read_to_end(&mut data).await;
            data
        };
        let ((first, stdout), stderr, code) =
            tokio::join!(read_out, read_err, ctr.wait(id, &exec_id));
        let code = code?;
        let _ = ctr.delete_process(id, &exec_id).await;
        let total = t0.elapsed();
        drop(io);
        Ok(ExecOutcome {
            first_stdout: first,
            total,
            stdout,
            stderr,
            exit_code: code as i32,
        })
    }
}

impl Target for Base {
    fn name(&self) -> &'static str {
        "baseline"
    }

    async fn create_first_output(&self) -> Result<(String, Duration)> {
        let t0 = Instant::now();
        let id = self.create().await?;
        let out = self
            .run_exec(&id, &["echo", "hi"], t0)
            .await?
            .check(Some(b"hi\n"))?;
        Ok((id, out.first_stdout.context("no stdout")?))
    }

    async fn create_ready(&self) -> Result<(String, Duration)> {
        let t0 = Instant::now();
        let id = self.create().await?;
        Ok((id, t0.elapsed()))
    }

    async fn exec(&self, id: &str, argv: &[&str]) -> Result<ExecOutcome> {
        self.run_exec(id, argv, Instant::now()).await
    }

    async fn write_read(&self, id: &str, data: &[u8]) -> Result<(Duration, Duration)> {
        // The source file on the host is written once, outside the measurement.
        let src = {
            let mut g = self.src.lock().unwrap();
            match &*g {
                Some((p, len)) if *len == data.len() => p.clone(),
                _ => {
                    let p = self.dir.join("src.bin");
                    std::fs::write(&p, data)?;
                    *g = Some((p.clone(), data.len()));
                    p
                }
            }
        };
        let inside = self.workspace(id).join("data.bin");
        let back = self.dir.join("back.bin");
        let cp = |from: PathBuf, to: PathBuf| async move {
            let st = tokio::process::Command::new("cp")
                .arg(&from)
                .arg(&to)
                .status()
                .await?;
            if !st.success() {
                bail!("cp {} {}: {st}", from.display(), to.display());
            }
            Ok(())
        };
        let t0 = Instant::now();
        cp(src, inside.clone()).await?;
        let write = t0.elapsed();
        let t1 = Instant::now();
        cp(inside, back.clone()).await?;
        let read = t1.elapsed();
        let len = std::fs::metadata(&back)?.len();
        if len != data.len() as u64 {
            bail!("copied back {len} bytes, not {}", data.len());
        }
        Ok((write, read))
    }

    async fn destroy(&self, id: &str) -> Result<Duration> {
        let rt = self.rt()?;
        let t0 = Instant::now();
        rt.teardown(id).await?;
        let d = t0.elapsed();
        self.live.lock().unwrap().remove(id);
        for dir in cgroup(id).dirs() {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_dir_all(self.workspace(id));
        let _ = std::fs::remove_dir_all(self.checkpoint_dir(id));
        let _ = std::fs::remove_dir_all(self.cfg.run_dir.join("io").join(id));
        Ok(d)
    }

    fn namespace(&self) -> &str {
        &self.cfg.namespace
    }

    fn daemon_pid(&self) -> Option<u32> {
        None
    }

    async fn cleanup(&self) {
        sweep_namespace(&self.cfg.containerd_socket, &self.cfg.namespace).await;
        crate::host::drop_namespace(&self.cfg.containerd_socket, &self.cfg.namespace).await;
    }
}
