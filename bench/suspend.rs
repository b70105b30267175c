//! Suspend and resume with memory (issue 19), group `suspend`:
//!
//! * N sandboxes per side, each holding an idle Python session (a background `python3` that
//!   imports `json`, builds a 100,000-element list and sleeps);
//! * their host memory while resident (the sandbox cgroup's working set, plus the PSS of the
//!   host processes of the sandbox outside it: the containerd shim and, on ours, the agent's
//!   FIFO holder; plus, on ours, the daemon's VmRSS growth / N);
//! * ours: admin `SuspendSandbox` of each, timed, over the daemon's unix socket (what
//!   `computectl suspend` sends); baseline: the raw runsc checkpoint through containerd's runc
//!   shim (`Runtime::checkpoint`: CheckpointTask with exit, wait, delete task), timed;
//! * what a suspended session leaves on the host (the same readings: on ours the daemon's
//!   share; no cgroup, no shim and no FIFO holder, which the row reports) and on disk
//!   (`checkpoint_bytes` of admin ListSandboxes, cross-checked with `du` of the checkpoint
//!   directory);
//! * ours: compute.v1 `ExecCommand echo hi` on each suspended sandbox until its first stdout
//!   byte: the transparent resume included; baseline: raw restore (a new task with
//!   `criu_image_path`) then `Tasks.Exec echo hi` until the first byte; the session must have
//!   survived on both (the same Python process, found by the pid it wrote to `/tmp`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use computed::api::admin::v1 as apb;
use tonic::transport::Channel;

use crate::base::{cgroup, Base};
use crate::host;
use crate::ours::Ours;
use crate::scenarios::{within, Plan};
use crate::stats::{Better, Dist, Scenario, Side};
use crate::target::Target;

type Admin = apb::node_admin_client::NodeAdminClient<Channel>;

/// Starts the idle Python session in the background; it writes its pid to `/tmp/py-session`
/// once its import and its list are done.
const SESSION: &str = "setsid python3 -c 'import json, os, time; x = list(range(100000)); \
    open(\"/tmp/py-session\", \"w\").write(str(os.getpid())); time.sleep(1e9)' \
    </dev/null >/dev/null 2>&1 &";

/// The least host memory counted for one suspended session, bytes: the daemon's bookkeeping of
/// a sandbox, which its VmRSS growth over a few sessions cannot resolve (it reads 0 or less).
/// A figure below it makes `sessions_per_node_ratio` a lower bound.
const SUSPENDED_FLOOR: f64 = 64.0 * 1024.0;

/// Host memory of one sandbox, bytes.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMem {
    /// The sandbox cgroup's working set (0: no cgroup).
    pub cgroup: f64,
    /// PSS of the sandbox's host processes outside its cgroup (shim, FIFO holder).
    pub outside_pss: f64,
    /// VmRSS of the same processes.
    pub outside_rss: f64,
    /// How many such processes there were.
    pub outside_procs: f64,
    /// Whether the sandbox had a cgroup.
    pub has_cgroup: bool,
    /// Whether a containerd shim of the sandbox was running.
    pub has_shim: bool,
}

/// What one side measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Sessions held.
    pub n: usize,
    /// Suspend (admin SuspendSandbox / raw checkpoint) of each, ms.
    pub suspend_ms: Vec<f64>,
    /// Exec `echo hi` on a suspended sandbox (resume included) → first stdout byte, ms.
    pub resume_first_ms: Vec<f64>,
    /// Checkpoint size of each: admin `checkpoint_bytes` (ours), the directory's file lengths
    /// (raw).
    pub checkpoint_bytes: Vec<f64>,
    /// `du` of each checkpoint directory: allocated bytes.
    pub du_bytes: Vec<f64>,
    /// `du --apparent-size` of each checkpoint directory, bytes.
    pub du_apparent_bytes: Vec<f64>,
    /// Per session while resident.
    pub resident: Vec<HostMem>,
    /// Per session while suspended.
    pub suspended: Vec<HostMem>,
    /// The daemon's VmRSS growth per session with all N resident / all N suspended, bytes.
    pub daemon_resident: Option<f64>,
    /// See `daemon_resident`.
    pub daemon_suspended: Option<f64>,
    /// Suspends that lost the memory (admin `checkpoint_memory` false).
    pub without_memory: usize,
    /// Why it stopped before N sessions.
    pub stopped_early: Option<String>,
    /// Sessions gone after the resume (raw only: ours fails instead).
    pub sessions_lost: usize,
}

/// Means of a list of readings.
pub fn mean_mem(v: &[HostMem]) -> HostMem {
    let n = v.len().max(1) as f64;
    let s = |f: fn(&HostMem) -> f64| v.iter().map(f).sum::<f64>() / n;
    HostMem {
        cgroup: s(|m| m.cgroup),
        outside_pss: s(|m| m.outside_pss),
        outside_rss: s(|m| m.outside_rss),
        outside_procs: s(|m| m.outside_procs),
        has_cgroup: v.iter().any(|m| m.has_cgroup),
        has_shim: v.iter().any(|m| m.has_shim),
    }
}

impl Measured {
    /// Host bytes per session (cgroup + PSS outside it + the daemon's share), resident and
    /// suspended.
    pub fn per_session(&self) -> (f64, f64) {
        let r = mean_mem(&self.resident);
        let s = mean_mem(&self.suspended);
        (
            r.cgroup + r.outside_pss + self.daemon_resident.unwrap_or(0.0).max(0.0),
            s.cgroup + s.outside_pss + self.daemon_suspended.unwrap_or(0.0).max(0.0),
        )
    }

    /// The same with VmRSS instead of PSS outside the cgroup.
    pub fn per_session_rss(&self) -> (f64, f64) {
        let r = mean_mem(&self.resident);
        let s = mean_mem(&self.suspended);
        (
            r.cgroup + r.outside_rss + self.daemon_resident.unwrap_or(0.0).max(0.0),
            s.cgroup + s.outside_rss + self.daemon_suspended.unwrap_or(0.0).max(0.0),
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Starts the session in sandbox `id` and waits until it is up; returns its pid.
async fn start_session<T: Target>(t: &T, id: &str) -> Result<u32> {
    within(60, "start the session", t.exec(id, &["sh", "-c", SESSION]))
        .await?
        .check(None)?;
    let t0 = Instant::now();
    loop {
        let o = within(
            60,
            "read the session's pid",
            t.exec(id, &["cat", "/tmp/py-session"]),
        )
        .await?;
        if o.exit_code == 0 {
            if let Ok(pid) = String::from_utf8_lossy(&o.stdout).trim().parse::<u32>() {
                return Ok(pid);
            }
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the Python session in {id} did not start within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails unless the session (pid `pid`) is still there: its memory survived the resume.
async fn check_session<T: Target>(t: &T, id: &str, pid: u32, when: &str) -> Result<()> {
    let script = format!("grep -q 'time[.]sleep' /proc/{pid}/cmdline");
    let o = within(60, "check the session", t.exec(id, &["sh", "-c", &script])).await?;
    if o.exit_code != 0 {
        let ps = t
            .exec(id, &["sh", "-c", "ls /proc; cat /tmp/py-session"])
            .await
            .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', " "))
            .unwrap_or_default();
        bail!("sandbox {id}: the Python session (pid {pid}) is gone {when} ({ps})");
    }
    Ok(())
}

/// The host processes of sandbox `id` that are not in its cgroup (their command line names
/// it: the containerd shim, ours' FIFO holder), with whether one is the shim.
fn outside(id: &str, in_cgroup: &[i32]) -> Vec<(i32, bool)> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me || in_cgroup.contains(&pid) {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(id) {
            out.push((pid, cmd.contains("containerd-shim")));
        }
    }
    out
}

/// The host memory of sandbox `id` now.
fn host_mem(id: &str) -> HostMem {
    let cg = cgroup(id);
    let has_cgroup = cg.exists();
    let procs = if has_cgroup {
        cg.procs().unwrap_or_default()
    } else {
        Vec::new()
    };
    let others = outside(id, &procs);
    HostMem {
        cgroup: if has_cgroup {
            cg.working_set().unwrap_or(0) as f64
        } else {
            0.0
        },
        outside_pss: others
            .iter()
            .filter_map(|(p, _)| host::pss(*p))
            .sum::<u64>() as f64,
        outside_rss: others
            .iter()
            .filter_map(|(p, _)| host::vm_rss(*p as u32))
            .sum::<u64>() as f64,
        outside_procs: others.len() as f64,
        has_cgroup,
        has_shim: others.iter().any(|(_, shim)| *shim),
    }
}

/// `du -s` of `dir` in bytes: (allocated, apparent).
fn du(dir: &Path) -> Result<(f64, f64)> {
    let run = |apparent: bool| -> Result<f64> {
        let mut c = std::process::Command::new("du");
        c.arg("-s");
        if apparent {
            c.arg("--apparent-size");
        }
        let o = c
            .arg("--block-size=1")
            .arg(dir)
            .output()
            .context("run du")?;
        if !o.status.success() {
            bail!(
                "du {}: {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .context("du's output")
    };
    Ok((run(false)?, run(true)?))
}

/// The daemon's VmRSS after a short settling.
async fn daemon_rss(pid: Option<u32>) -> Option<f64> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    pid.and_then(host::vm_rss).map(|v| v as f64)
}

/// Creates up to `n` sandboxes with a session each (stopping early when MemAvailable falls
/// below `reserve`); returns (id, session pid) and why it stopped early.
async fn sessions<T: Target>(
    t: &T,
    n: usize,
    reserve: u64,
    ids: &mut Vec<(String, u32)>,
) -> Result<Option<String>> {
    let mut stopped = None;
    for i in 0..n {
        if host::mem_available().unwrap_or(0) < reserve {
            stopped = Some(format!(
                "stopped at {i}: MemAvailable below {} MB",
                reserve >> 20
            ));
            break;
        }
        let (id, _) = within(120, "create", t.create_ready()).await?;
        ids.push((id.clone(), 0));
        let pid = start_session(t, &id).await?;
        ids.last_mut().expect("just pushed").1 = pid;
    }
    // Still there once all are up (nothing ended it with the exec that started it).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (id, pid) in ids.iter() {
        check_session(t, id, *pid, "before the suspend").await?;
    }
    Ok(stopped)
}

/// Destroys what a side made (not measured).
async fn destroy<T: Target>(t: &T, ids: &[(String, u32)]) {
    for (id, _) in ids {
        if let Err(e) = within(60, "destroy", t.destroy(id)).await {
            eprintln!("compute-bench: suspend: {}: destroy {id}: {e:#}", t.name());
        }
    }
}

/// Cold creates → first output of `echo hi` on ours, when the cold group did not run: one
/// warm-up and `rounds` measured, each destroyed unmeasured.
pub async fn cold_creates(o: &Ours, rounds: usize) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    for i in 0..=rounds {
        let (id, first) = within(90, "create + echo", o.create_first_output()).await?;
        within(60, "destroy", o.destroy(&id)).await?;
        if i > 0 {
            v.push(ms(first));
        }
    }
    Ok(v)
}

/// Ours: `n` sessions, resident then suspended (admin SuspendSandbox) then resumed by an exec.
pub async fn ours(o: &Ours, n: usize, reserve: u64) -> Result<Measured> {
    let mut admin = Admin::new(computed::client::unix_channel(&o.socket()).await?)
        .max_decoding_message_size(32 << 20);
    let node = admin
        .get_node(apb::GetNodeRequest {})
        .await
        .context("admin GetNode")?
        .into_inner();
    if !node.suspend_unsupported.is_empty() {
        bail!(
            "the daemon cannot suspend here: {}",
            node.suspend_unsupported
        );
    }
    let state_dir = std::path::PathBuf::from(&node.state_dir);
    let pid = o.daemon_pid();
    let rss0 = daemon_rss(pid).await;
    let mut ids = Vec::new();
    let r = async {
        let mut m = Measured {
            stopped_early: sessions(o, n, reserve, &mut ids).await?,
            n: ids.len(),
            ..Default::default()
        };
        if ids.is_empty() {
            bail!("no session could be made");
        }
        let rss1 = daemon_rss(pid).await;
        m.resident = ids.iter().map(|(id, _)| host_mem(id)).collect();
        for (id, _) in &ids {
            let t0 = Instant::now();
            let r = within(120, "SuspendSandbox", async {
                Ok(admin
                    .suspend_sandbox(apb::SuspendSandboxRequest {
                        sandbox_id: id.clone(),
                    })
                    .await
                    .context("admin SuspendSandbox")?
                    .into_inner())
            })
            .await?;
            m.suspend_ms.push(ms(t0.elapsed()));
            let s = r.sandbox.unwrap_or_default();
            if s.status != "SUSPENDED" {
                bail!("sandbox {id} is {} after SuspendSandbox", s.status);
            }
        }
        let rss2 = daemon_rss(pid).await;
        m.suspended = ids.iter().map(|(id, _)| host_mem(id)).collect();
        let per = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / ids.len() as f64);
        m.daemon_resident = per(rss0, rss1);
        m.daemon_suspended = per(rss0, rss2);
        let listed = admin
            .list_sandboxes(apb::ListSandboxesRequest {
                status: vec!["SUSPENDED".into()],
                tenant_id: String::new(),
            })
            .await
            .context("admin ListSandboxes")?
            .into_inner()
            .sandboxes;
        for (id, _) in &ids {
            let s = listed
                .iter()
                .find(|s| &s.sandbox_id == id)
                .with_context(|| format!("{id} is not listed as SUSPENDED"))?;
            if !s.checkpoint_memory {
                m.without_memory += 1;
            }
            m.checkpoint_bytes.push(s.checkpoint_bytes as f64);
            let (a, b) = du(&state_dir.join("checkpoints").join(id))?;
            m.du_bytes.push(a);
            m.du_apparent_bytes.push(b);
        }
        for (id, session) in &ids {
            let out = within(120, "resume + echo", o.exec(id, &["echo", "hi"]))
                .await?
                .check(Some(b"hi\n"))?;
            m.resume_first_ms
                .push(ms(out.first_stdout.context("no stdout")?));
            check_session(o, id, *session, "after the resume: memory lost").await?;
        }
        Ok(m)
    }
    .await;
    destroy(o, &ids).await;
    r
}

/// Baseline: `n` raw sessions, resident, checkpointed through containerd, restored.
pub async fn raw(b: &Base, n: usize, reserve: u64) -> Result<Measured> {
    let mut ids = Vec::new();
    let r = async {
        let mut m = Measured {
            stopped_early: sessions(b, n, reserve, &mut ids).await?,
            n: ids.len(),
            ..Default::default()
        };
        if ids.is_empty() {
            bail!("no session could be made");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        m.resident = ids.iter().map(|(id, _)| host_mem(id)).collect();
        for (id, _) in &ids {
            let d = within(120, "checkpoint", b.suspend(id)).await?;
            m.suspend_ms.push(ms(d));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        m.suspended = ids.iter().map(|(id, _)| host_mem(id)).collect();
        for (id, _) in &ids {
            let (a, ap) = du(&b.checkpoint_dir(id))?;
            m.du_bytes.push(a);
            m.du_apparent_bytes.push(ap);
            m.checkpoint_bytes.push(ap);
        }
        for (id, session) in &ids {
            let d = within(120, "restore + echo", b.resume_first_output(id)).await?;
            m.resume_first_ms.push(ms(d));
            // A raw restore does not bring back what `runsc exec` started (seen here: the
            // session is gone, its file in /tmp is not): counted, not a failure.
            if let Err(e) = check_session(b, id, *session, "after the restore").await {
                if m.sessions_lost == 0 {
                    eprintln!("compute-bench: suspend: baseline: {e:#}");
                }
                m.sessions_lost += 1;
            }
        }
        Ok(m)
    }
    .await;
    destroy(b, &ids).await;
    r
}

fn side_of(r: &Result<Measured>, f: impl FnOnce(&Measured) -> Side) -> Side {
    match r {
        Ok(m) => f(m),
        Err(e) => Side::failed(e),
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn mib(b: f64) -> f64 {
    (b / 1048576.0 * 100.0).round() / 100.0
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `suspend` group: ours, then the baseline, and their four rows. `cold`: ours' cold
/// create → first output samples of this run's cold group, if it ran (else a few are measured
/// here first).
pub async fn group(
    quick: bool,
    plan: &Plan,
    o: &Ours,
    b: &Base,
    start_errors: [&Option<String>; 2],
    cold: Option<Vec<f64>>,
) -> Vec<Scenario> {
    let n = plan.suspend_sessions;
    fn not_started<T>(e: &String) -> Result<T> {
        Err(anyhow::anyhow!("did not start: {e}"))
    }
    let cold_rounds = if quick { 3 } else { 5 };
    let (cold, cold_source) = match (cold, start_errors[0]) {
        (_, Some(e)) => (not_started(e), String::new()),
        (Some(v), None) => (
            Ok(v),
            "this run's create_to_first_output_cold samples".into(),
        ),
        (None, None) => {
            eprintln!("compute-bench: suspend: {cold_rounds} cold creates for the reference");
            (
                cold_creates(o, cold_rounds).await,
                format!(
                    "{cold_rounds} cold creates of ours measured in this group (after a warm-up)"
                ),
            )
        }
    };
    if let Err(e) = &cold {
        eprintln!("compute-bench: suspend: cold creates failed: {e:#}");
    }
    eprintln!("compute-bench: suspend: {n} idle Python sessions, ours");
    let ro = match start_errors[0] {
        Some(e) => not_started(e),
        None => ours(o, n, plan.mem_reserve).await,
    };
    if let Err(e) = &ro {
        eprintln!("compute-bench: suspend: ours failed: {e:#}");
    }
    eprintln!("compute-bench: suspend: {n} idle Python sessions, baseline");
    let rb = match start_errors[1] {
        Some(e) => not_started(e),
        None => raw(b, n, plan.mem_reserve).await,
    };
    if let Err(e) = &rb {
        eprintln!("compute-bench: suspend: baseline failed: {e:#}");
    }
    let common = |s: Side, m: &Measured| {
        let s = s.with("sessions", m.n as u64);
        match &m.stopped_early {
            Some(w) => s.with("stopped_early", w.clone()),
            None => s,
        }
    };
    let p50 = |v: &[f64]| Dist::of(v, Better::Lower).map(|d| d.p50);
    let workload = format!(
        "{n} sandboxes per side, each holding an idle Python session (a background python3 \
         that imported json, built a 100,000-element list and sleeps), ours first"
    );
    let mut out = Vec::new();

    out.push(Scenario {
        name: "suspend_p50_ms",
        unit: "ms",
        better: Better::Lower,
        ours: side_of(&ro, |m| {
            common(Side::measured(Dist::of(&m.suspend_ms, Better::Lower)), m)
                .with("suspended_without_memory", m.without_memory as u64)
        }),
        baseline: side_of(&rb, |m| {
            common(Side::measured(Dist::of(&m.suspend_ms, Better::Lower)), m)
                .with("sessions_lost_on_restore", m.sessions_lost as u64)
        }),
        notes: vec![format!(
            "{workload}; ours: admin SuspendSandbox of each, one at a time, over the daemon's \
             unix socket (as computectl suspend) until it answers SUSPENDED (workspace flush, \
             the meter's last reading, runsc checkpoint through containerd's runc shim into \
             <state_dir>/checkpoints/<id>, the task deleted, labels written); baseline: the raw \
             Runtime::checkpoint of a raw sandbox of the same workload (CheckpointTask with \
             exit, wait for the exit, delete the task); no target"
        )],
    });

    let resume = ro.as_ref().ok().and_then(|m| p50(&m.resume_first_ms));
    let cold_p50 = cold.as_ref().ok().and_then(|v| p50(v));
    let ratio = match (resume, cold_p50) {
        (Some(r), Some(c)) if c > 0.0 => Some(r3(r / c)),
        _ => None,
    };
    let raw_resume = rb.as_ref().ok().and_then(|m| p50(&m.resume_first_ms));
    out.push(Scenario {
        name: "resume_to_first_output_p50_ms",
        unit: "ms",
        better: Better::Lower,
        ours: side_of(&ro, |m| {
            let mut s = common(
                Side::measured(Dist::of(&m.resume_first_ms, Better::Lower)),
                m,
            );
            if let Some(r) = raw_resume {
                s = s.with("raw_restore_to_first_output_p50_ms", r);
                if let Some(o) = resume {
                    s = s.with("p50_ratio_to_raw_restore", r3(o / r.max(1e-9)));
                }
            }
            s
        }),
        baseline: match &cold {
            Ok(v) => Side::measured(Dist::of(v, Better::Lower)),
            Err(e) => Side::failed(e),
        },
        notes: vec![format!(
            "the suspend_p50_ms sessions, each suspended; ours: compute.v1 ExecCommand `echo hi` \
             on each until its first stdout byte (the transparent resume included: runsc \
             restore through the runc shim, the agent's link back), then the session is \
             checked to be the same Python process (its memory kept); baseline: ours' cold \
             create → first output of the same image in the same run ({cold_source}), so \
             ratio = resume / cold create; ours_raw_restore_to_first_output_p50_ms: the \
             baseline's raw sessions restored (a new task with criu_image_path) then \
             Tasks.Exec `echo hi` until its first byte (baseline_sessions_lost_on_restore of \
             suspend_p50_ms: raw sessions whose Python process did not come back: a session \
             started with `runsc exec` is not restored by a raw runsc restore, ours lives under \
             the in-sandbox agent); target: p50 <= 250 ms and ratio <= 0.6{}",
            match (resume, ratio) {
                (Some(r), Some(x)) => format!(" (measured {r:.0} ms, {x})"),
                (Some(r), None) => format!(" (measured {r:.0} ms)"),
                _ => String::new(),
            }
        )],
    });

    let disk = |m: &Measured| {
        common(
            Side::measured(Dist::of(&m.checkpoint_bytes, Better::Lower)),
            m,
        )
        .with("mean_bytes", mean(&m.checkpoint_bytes).round())
        .with("mean_mib", mib(mean(&m.checkpoint_bytes)))
        .with("du_allocated_mean_bytes", mean(&m.du_bytes).round())
        .with("du_apparent_mean_bytes", mean(&m.du_apparent_bytes).round())
    };
    out.push(Scenario {
        name: "suspended_session_disk_bytes",
        unit: "bytes",
        better: Better::Lower,
        ours: side_of(&ro, |m| {
            let s = disk(m);
            let c = mean(&m.checkpoint_bytes);
            if c > 0.0 {
                s.with(
                    "du_apparent_vs_checkpoint_bytes",
                    r3(mean(&m.du_apparent_bytes) / c),
                )
            } else {
                s
            }
        }),
        baseline: side_of(&rb, disk),
        notes: vec![
            "the suspend_p50_ms sessions while suspended; ours: checkpoint_bytes of admin \
             ListSandboxes (the checkpoint directory's file lengths), per session; \
             *_du_allocated_mean_bytes / *_du_apparent_mean_bytes: `du -s` of each \
             <state_dir>/checkpoints/<id> (blocks allocated / apparent size), the cross-check; \
             baseline: the apparent size of the raw checkpoint directory of the same workload"
                .into(),
        ],
    });

    let target = 10.0;
    out.push(Scenario {
        name: "sessions_per_node_ratio",
        unit: "x",
        better: Better::Higher,
        ours: side_of(&ro, |m| {
            let (res, sus) = m.per_session();
            let (res_rss, sus_rss) = m.per_session_rss();
            let r = mean_mem(&m.resident);
            let s = mean_mem(&m.suspended);
            let left_cg = m.suspended.iter().filter(|x| x.has_cgroup).count() as u64;
            let left_shim = m.suspended.iter().filter(|x| x.has_shim).count() as u64;
            let mut side = common(
                Side::measured(Some(Dist {
                    n: m.n as u64,
                    ..Dist::single(r3(res / sus.max(SUSPENDED_FLOOR)))
                })),
                m,
            )
            .with("resident_mib_per_session", mib(res))
            .with("suspended_mib_per_session", mib(sus))
            .with("resident_cgroup_mib", mib(r.cgroup))
            .with("resident_outside_pss_mib", mib(r.outside_pss))
            .with("resident_outside_procs", r.outside_procs)
            .with("suspended_outside_pss_mib", mib(s.outside_pss))
            .with("suspended_outside_rss_mib", mib(s.outside_rss))
            .with("suspended_outside_procs", s.outside_procs)
            .with("suspended_cgroups_left", left_cg)
            .with("suspended_shims_left", left_shim)
            .with("ratio_with_rss", r3(res_rss / sus_rss.max(SUSPENDED_FLOOR)))
            .with("ratio_is_lower_bound", sus < SUSPENDED_FLOOR);
            if let Ok(raw) = &rb {
                let r = raw.per_session().0;
                side = side.with("resident_vs_raw", r3(res / r.max(1.0)));
            }
            if let Some(d) = m.daemon_resident {
                side = side.with("daemon_rss_kib_per_session_resident", r3(d / 1024.0));
            }
            if let Some(d) = m.daemon_suspended {
                side = side.with("daemon_rss_kib_per_session_suspended", r3(d / 1024.0));
            }
            side
        }),
        baseline: {
            let s = Side::measured(Some(Dist::single(target)));
            match &rb {
                Ok(m) => {
                    let (res, sus) = m.per_session();
                    s.with("raw_resident_mib_per_session", mib(res))
                        .with("raw_suspended_mib_per_session", mib(sus))
                }
                Err(e) => s.with("raw_error", format!("{e:#}")),
            }
        },
        notes: vec![format!(
            "the suspend_p50_ms sessions; value = host memory per resident session / per \
             suspended session, i.e. how many more suspended sessions one node holds at the same \
             memory; memory per session = the sandbox cgroup's working set (sentry, gofer: 0 \
             when the cgroup is gone) + the PSS of its host processes outside the cgroup \
             (those whose command line names it: the containerd shim, the agent's \
             `computed fifo-hold` holder) + the daemon's VmRSS growth / N since before the \
             sessions (resident: with all N running; suspended: with all N suspended), each \
             after 2 s of settling, a suspended session counted as at least 64 KiB (the \
             daemon's bookkeeping, below what its VmRSS resolves: ours_ratio_is_lower_bound \
             says when the floor applied); not counted: the checkpoint on disk (see \
             suspended_session_disk_bytes) and page cache; ours_ratio_with_rss: the same with \
             VmRSS instead of PSS (shared pages counted in full); baseline: the target ({target}x), \
             with the raw runsc sandbox of the same workload's resident memory (cgroup + shim \
             PSS) as baseline_raw_resident_mib_per_session (ours_resident_vs_raw: ours' \
             resident figure over it); target: >= 10x"
        )],
    });
    out
}
