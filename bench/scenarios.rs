//! The measurements, written once against [`Target`] and run on both sides.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;

use crate::host;
use crate::target::Target;

/// Sample counts and sizes of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Cold creates (each followed by a timed destroy).
    pub creates: usize,
    /// Sequential `true` execs on one sandbox.
    pub execs: usize,
    /// WriteFile + ReadFile rounds.
    pub file_rounds: usize,
    /// Bytes per WriteFile / ReadFile.
    pub file_bytes: usize,
    /// Concurrent sessions of the throughput scenario.
    pub sessions: usize,
    /// Duration of the throughput scenario.
    pub throughput: Duration,
    /// Most idle sandboxes the density scenario creates.
    pub density: usize,
    /// How long the density scenario's sandboxes sit idle while their CPU (and the daemon's)
    /// is read.
    pub idle: Duration,
    /// The density scenario stops early when MemAvailable falls below this.
    pub mem_reserve: u64,
    /// Rounds of the agents' workloads per side.
    pub workload_rounds: usize,
    /// Of those rounds, how many end with a burst of execs (the raw side's takes a minute).
    pub burst_rounds: usize,
    /// Idle Python sessions per side of the suspend group.
    pub suspend_sessions: usize,
}

/// Runs `f`, failing after `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, f: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .with_context(|| format!("{what}: no answer in {secs} s"))?
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Destroys sandboxes two at a time (not measured).
async fn destroy_all<T: Target>(t: &T, ids: &[String]) {
    futures::stream::iter(ids)
        .for_each_concurrent(2, |id| async move {
            if let Err(e) = within(60, "destroy", t.destroy(id)).await {
                eprintln!("compute-bench: {}: destroy {id}: {e:#}", t.name());
            }
        })
        .await;
}

/// Destroys each side's sandbox (those that were made).
async fn destroy_each<T: Target>(sides: &[&T], ids: &[Option<String>]) {
    for (t, id) in sides.iter().zip(ids) {
        if let Some(id) = id {
            destroy_all(*t, std::slice::from_ref(id)).await;
        }
    }
}

/// The order in which round `i` visits the sides: alternating, so that neither side always
/// runs right after the other.
pub fn order(n: usize, i: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if i % 2 == 1 {
        v.reverse();
    }
    v
}

/// Records a side's first failure; later rounds skip that side.
fn fail<R>(t: &impl Target, what: &str, slot: &mut Result<R>, e: anyhow::Error) {
    eprintln!("compute-bench: {what}: {} failed: {e:#}", t.name());
    *slot = Err(e);
}

/// Cold create → first output of `echo hi`, then a timed destroy of the same sandbox.
#[derive(Default)]
pub struct Cold {
    /// Create → first stdout byte, ms.
    pub first_output_ms: Vec<f64>,
    /// Destroy latency, ms.
    pub destroy_ms: Vec<f64>,
}

async fn cold_round<T: Target>(t: &T) -> Result<(f64, f64)> {
    let (id, first) = within(90, "create + echo", t.create_first_output()).await?;
    let d = within(60, "destroy", t.destroy(&id)).await?;
    Ok((ms(first), ms(d)))
}

/// One warm-up round (not recorded), then `plan.creates` rounds, the sides taking turns.
pub async fn cold<T: Target>(sides: &[&T], plan: &Plan) -> Vec<Result<Cold>> {
    let mut out: Vec<Result<Cold>> = sides.iter().map(|_| Ok(Cold::default())).collect();
    for i in 0..=plan.creates {
        for s in order(sides.len(), i) {
            let Ok(acc) = &mut out[s] else { continue };
            match cold_round(sides[s]).await {
                Ok((f, d)) if i > 0 => {
                    acc.first_output_ms.push(f);
                    acc.destroy_ms.push(d);
                }
                Ok(_) => {}
                Err(e) => fail(sides[s], "cold create", &mut out[s], e),
            }
        }
    }
    out
}

/// Members of the warm pool in the pool scenario.
pub const POOL_SIZE: u32 = 2;

/// Ours only (raw containerd has no pool): restarts the daemon with a warm pool, then
/// `plan.creates` rounds (after one warm-up) of CreateSandbox → first output of `echo hi`
/// from a pool member, each once the pool is full again (the wait is not measured), each
/// sandbox destroyed unmeasured. The daemon is restarted without the pool afterwards.
pub async fn pool(o: &crate::ours::Ours, plan: &Plan) -> Result<Vec<f64>> {
    o.set_pool(Some(POOL_SIZE)).await?;
    let rounds = async {
        let mut v = Vec::new();
        for i in 0..=plan.creates {
            o.wait_pool(POOL_SIZE).await?;
            let (id, first) = within(90, "pool create + echo", o.pool_first_output()).await?;
            within(60, "destroy", o.destroy(&id)).await?;
            if i > 0 {
                v.push(ms(first));
            }
        }
        Ok::<_, anyhow::Error>(v)
    }
    .await;
    let back = o.set_pool(None).await;
    let v = rounds?;
    back?;
    Ok(v)
}

/// File rounds not recorded: the first rounds of a side pay for a fresh file system's block
/// allocation and the allocators' growth (runs of 5 rounds varied 0.38–0.51× where runs of 40
/// and 60 gave 0.60× and 0.58×).
pub const FILE_WARMUP: usize = 3;

/// Exec round trips and file throughput on one ready sandbox.
#[derive(Default)]
pub struct Ready {
    /// `true` round trips, ms.
    pub rtt_ms: Vec<f64>,
    /// Write + read of `file_bytes` each way, MB/s (10^6 bytes) over both.
    pub file_mbps: Vec<f64>,
    /// Write only, MB/s.
    pub write_mbps: Vec<f64>,
    /// Read only, MB/s.
    pub read_mbps: Vec<f64>,
}

/// One ready sandbox per side; three warm-up execs and [`FILE_WARMUP`] file rounds are not
/// recorded; the sides take turns round by round.
pub async fn ready<T: Target>(sides: &[&T], plan: &Plan) -> Vec<Result<Ready>> {
    let mut out: Vec<Result<Ready>> = Vec::new();
    let mut ids: Vec<Option<String>> = Vec::new();
    for t in sides {
        match within(90, "create", t.create_ready()).await {
            Ok((id, _)) => {
                ids.push(Some(id));
                out.push(Ok(Ready::default()));
            }
            Err(e) => {
                eprintln!("compute-bench: create: {} failed: {e:#}", t.name());
                ids.push(None);
                out.push(Err(e));
            }
        }
    }
    for i in 0..plan.execs + 3 {
        for s in order(sides.len(), i) {
            let (Ok(acc), Some(id)) = (&mut out[s], &ids[s]) else {
                continue;
            };
            let r = within(60, "exec true", sides[s].exec(id, &["true"]))
                .await
                .and_then(|o| o.check(None));
            match r {
                Ok(o) if i >= 3 => acc.rtt_ms.push(ms(o.total)),
                Ok(_) => {}
                Err(e) => fail(sides[s], "exec true", &mut out[s], e),
            }
        }
    }
    let data = host::test_data(plan.file_bytes, 0x5eed);
    let mb = plan.file_bytes as f64 / 1e6;
    for i in 0..plan.file_rounds + FILE_WARMUP {
        for s in order(sides.len(), i) {
            let (Ok(acc), Some(id)) = (&mut out[s], &ids[s]) else {
                continue;
            };
            match within(120, "write + read", sides[s].write_read(id, &data)).await {
                Ok((w, r)) if i >= FILE_WARMUP => {
                    acc.file_mbps
                        .push(2.0 * mb / (w + r).as_secs_f64().max(1e-9));
                    acc.write_mbps.push(mb / w.as_secs_f64().max(1e-9));
                    acc.read_mbps.push(mb / r.as_secs_f64().max(1e-9));
                }
                Ok(_) => {}
                Err(e) => fail(sides[s], "write + read", &mut out[s], e),
            }
        }
    }
    destroy_each(sides, &ids).await;
    out
}

/// `true` in a loop in `sessions` sandboxes at once.
pub struct Throughput {
    /// execs/s of each whole one-second window.
    pub windows: Vec<f64>,
    /// Completed execs.
    pub total: u64,
    /// Failed execs.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// From the start until the last exec ended.
    pub elapsed: Duration,
    /// Exec latencies under this load, ms.
    pub latency_ms: Vec<f64>,
}

impl Throughput {
    /// Completed execs per second over the whole run.
    pub fn mean(&self) -> f64 {
        self.total as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Default)]
struct Tally {
    done_at: Vec<f64>,
    latency_ms: Vec<f64>,
    errors: u64,
    first_error: Option<String>,
}

/// The sandboxes are created first (not measured); each session then runs `true` until the
/// duration is over.
pub async fn throughput<T: Target>(t: &T, plan: &Plan) -> Result<Throughput> {
    let mut ids = Vec::new();
    for _ in 0..plan.sessions {
        match within(90, "create", t.create_ready()).await {
            Ok((id, _)) => ids.push(id),
            Err(e) => {
                destroy_all(t, &ids).await;
                return Err(e);
            }
        }
    }
    // One exec each before the clock starts.
    for id in &ids {
        if let Err(e) = within(60, "exec true", t.exec(id, &["true"])).await {
            destroy_all(t, &ids).await;
            return Err(e);
        }
    }
    let tally = Mutex::new(Tally::default());
    let start = Instant::now();
    let deadline = start + plan.throughput;
    futures::future::join_all(ids.iter().map(|id| {
        let tally = &tally;
        async move {
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let r = within(60, "exec true", t.exec(id, &["true"]))
                    .await
                    .and_then(|o| o.check(None));
                let failed = {
                    let mut g = tally.lock().unwrap();
                    match r {
                        Ok(_) => {
                            g.done_at.push(start.elapsed().as_secs_f64());
                            g.latency_ms.push(ms(t0.elapsed()));
                            false
                        }
                        Err(e) => {
                            g.errors += 1;
                            g.first_error.get_or_insert_with(|| format!("{e:#}"));
                            true
                        }
                    }
                };
                if failed {
                    // Do not spin on a broken sandbox.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }))
    .await;
    let elapsed = start.elapsed();
    destroy_all(t, &ids).await;
    let tally = tally.into_inner().unwrap();
    let whole = plan.throughput.as_secs() as usize;
    let mut counts = vec![0u64; whole];
    for &s in &tally.done_at {
        let w = s.floor() as usize;
        if w < whole {
            counts[w] += 1;
        }
    }
    Ok(Throughput {
        windows: counts.iter().map(|&c| c as f64).collect(),
        total: tally.done_at.len() as u64,
        errors: tally.errors,
        first_error: tally.first_error,
        elapsed,
        latency_ms: tally.latency_ms,
    })
}

/// Many idle sandboxes at once.
pub struct Density {
    /// How many were created.
    pub n: usize,
    /// Create latency of each, in order, ms.
    pub create_ms: Vec<f64>,
    /// MemAvailable drop per sandbox, MB.
    pub mem_mb_per_sandbox: f64,
    /// Sum of the sandboxes' cgroup working sets per sandbox, MB.
    pub cgroup_mb_per_sandbox: f64,
    /// PSS of each sandbox's host processes (shim, sentry, gofer, ptrace stubs), mean, MB.
    pub pss_mb_per_sandbox: f64,
    /// Daemon VmRSS growth per sandbox, KB (ours only).
    pub daemon_rss_kb_per_sandbox: Option<f64>,
    /// CPU of an idle sandbox (its cgroup: sentry, gofer, stubs, and the agent for ours) over
    /// the idle window, ms per second, mean of the sandboxes.
    pub idle_cpu_ms_per_s: f64,
    /// The daemon's CPU over the idle window, % of one core (ours only).
    pub daemon_idle_cpu_pct: Option<f64>,
    /// Why it stopped before `plan.density`.
    pub stopped_early: Option<String>,
}

/// Creates up to `plan.density` sandboxes one after the other, each ready before the next, and
/// reads the host's and the daemon's memory before and after (after a few seconds' settling).
pub async fn density<T: Target>(t: &T, plan: &Plan) -> Result<Density> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mem0 = host::mem_available().context("read /proc/meminfo")?;
    let rss0 = t.daemon_pid().and_then(host::vm_rss);
    let mut ids = Vec::new();
    let mut create_ms = Vec::new();
    let mut stopped_early = None;
    for i in 0..plan.density {
        if host::mem_available().unwrap_or(0) < plan.mem_reserve {
            stopped_early = Some(format!(
                "stopped at {i}: MemAvailable below {} MB",
                plan.mem_reserve >> 20
            ));
            break;
        }
        match within(120, "create", t.create_ready()).await {
            Ok((id, d)) => {
                ids.push(id);
                create_ms.push(ms(d));
            }
            Err(e) if !ids.is_empty() => {
                stopped_early = Some(format!("stopped at {i}: {e:#}"));
                break;
            }
            Err(e) => return Err(e),
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mem1 = host::mem_available().context("read /proc/meminfo")?;
    let rss1 = t.daemon_pid().and_then(host::vm_rss);
    // Idle: nothing runs in the sandboxes, nobody calls the daemon.
    let cpu_of = |ids: &[String]| -> Vec<Option<u64>> {
        ids.iter()
            .map(|id| crate::base::cgroup(id).cpu_ns().ok())
            .collect()
    };
    let cpu0 = cpu_of(&ids);
    let daemon0 = t.daemon_pid().and_then(host::cpu_ms);
    let idle0 = Instant::now();
    tokio::time::sleep(plan.idle).await;
    let cpu1 = cpu_of(&ids);
    let daemon1 = t.daemon_pid().and_then(host::cpu_ms);
    let idle_s = idle0.elapsed().as_secs_f64();
    let deltas: Vec<f64> = cpu0
        .iter()
        .zip(&cpu1)
        .filter_map(|(a, b)| Some(b.as_ref()?.saturating_sub(*a.as_ref()?) as f64 / 1e6))
        .collect();
    let idle_cpu_ms_per_s =
        deltas.iter().sum::<f64>() / deltas.len().max(1) as f64 / idle_s.max(1e-9);
    let daemon_idle_cpu_pct = match (daemon0, daemon1) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e3 / idle_s.max(1e-9) * 100.0),
        _ => None,
    };
    let cg: u64 = ids
        .iter()
        .filter_map(|id| crate::base::cgroup(id).working_set().ok())
        .sum();
    let shims = host::shims(t.namespace());
    let pss: u64 = ids
        .iter()
        .map(|id| {
            let procs = crate::base::cgroup(id).procs().unwrap_or_default();
            let shim = shims.get(id).copied();
            procs
                .into_iter()
                .chain(shim)
                .filter_map(host::pss)
                .sum::<u64>()
        })
        .sum();
    let n = ids.len();
    destroy_all(t, &ids).await;
    let per = |v: f64| v / n.max(1) as f64;
    Ok(Density {
        n,
        create_ms,
        mem_mb_per_sandbox: per(mem0 as f64 - mem1 as f64) / 1e6,
        cgroup_mb_per_sandbox: per(cg as f64) / 1e6,
        pss_mb_per_sandbox: per(pss as f64) / 1e6,
        daemon_rss_kb_per_sandbox: match (rss0, rss1) {
            (Some(a), Some(b)) => Some(per(b as f64 - a as f64) / 1024.0),
            _ => None,
        },
        idle_cpu_ms_per_s,
        daemon_idle_cpu_pct,
        stopped_early,
    })
}

/// What agents run, each on one ready sandbox per side (the sides take turns round by round).
pub const WORKLOADS: &[(&str, &[&str], &str)] = &[
    (
        "python_tool_call",
        &[
            "python3",
            "-c",
            "import json, re, os, subprocess\n\
             s = sum(i * i for i in range(10**6))\n\
             for i in range(100):\n    \
                 with open(f'/workspace/tool{i}.json', 'w') as f: json.dump({'i': i, 's': s}, f)\n\
             print(len([n for n in os.listdir('/workspace') if re.match(r'tool\\d+', n)]))",
        ],
        "imports, a million-term sum, 100 small JSON files written to the workspace",
    ),
    (
        "shell_pipeline",
        &[
            "sh",
            "-c",
            "grep 7 /workspace/lines.txt | sort -r | uniq | wc -l",
        ],
        "grep | sort | uniq | wc over a 300,000-line file (four processes)",
    ),
    (
        "data_stack_import",
        &[
            "python3",
            "-c",
            "import numpy, pandas\nprint(int(pandas.DataFrame({'a': numpy.arange(10)}).a.sum()))",
        ],
        "import numpy and pandas from the default image and use them once",
    ),
];

/// How many short execs a burst starts at once.
pub const BURST: usize = 50;

/// Wall times of the workloads and of the bursts, ms.
#[derive(Default)]
pub struct Workloads {
    /// One list per entry of [`WORKLOADS`].
    pub ms: Vec<Vec<f64>>,
    /// Time until all [`BURST`] concurrent `true` execs have ended.
    pub burst_ms: Vec<f64>,
}

async fn burst<T: Target>(t: &T, id: &str) -> Result<f64> {
    let t0 = Instant::now();
    let runs = (0..BURST).map(|_| async {
        within(120, "burst exec", t.exec(id, &["true"]))
            .await
            .and_then(|o| o.check(None))
    });
    for r in futures::future::join_all(runs).await {
        r?;
    }
    Ok(ms(t0.elapsed()))
}

/// One ready sandbox per side with a 300,000-line file; one warm-up round of the workloads (not
/// recorded), then `rounds` rounds of every workload, the first `bursts` of them ending with a
/// burst, the sides taking turns.
pub async fn workloads<T: Target>(
    sides: &[&T],
    rounds: usize,
    bursts: usize,
) -> Vec<Result<Workloads>> {
    let mut out: Vec<Result<Workloads>> = Vec::new();
    let mut ids: Vec<Option<String>> = Vec::new();
    let prepare = "seq 1 300000 | sed 's/$/ some text/' > /workspace/lines.txt";
    for t in sides {
        let made = async {
            let (id, _) = within(90, "create", t.create_ready()).await?;
            within(120, "prepare", t.exec(&id, &["sh", "-c", prepare]))
                .await?
                .check(None)?;
            Ok::<_, anyhow::Error>(id)
        };
        match made.await {
            Ok(id) => {
                ids.push(Some(id));
                out.push(Ok(Workloads {
                    ms: vec![Vec::new(); WORKLOADS.len()],
                    burst_ms: Vec::new(),
                }));
            }
            Err(e) => {
                eprintln!("compute-bench: workloads: {} failed: {e:#}", t.name());
                ids.push(None);
                out.push(Err(e));
            }
        }
    }
    for i in 0..=rounds {
        for s in order(sides.len(), i) {
            let (Ok(acc), Some(id)) = (&mut out[s], &ids[s]) else {
                continue;
            };
            let mut round = Vec::new();
            let mut failed = None;
            for (name, argv, _) in WORKLOADS {
                match within(300, name, sides[s].exec(id, argv))
                    .await
                    .and_then(|o| o.check(None))
                {
                    Ok(o) => round.push(ms(o.total)),
                    Err(e) => {
                        failed = Some(e.context(*name));
                        break;
                    }
                }
            }
            // The warm-up round has no burst: it would only repeat the measured ones (a burst
            // of raw `runsc exec`s takes a minute on 2 cores).
            let b = match failed {
                None if i > 0 && i <= bursts => burst(sides[s], id).await.map(Some),
                None => Ok(None),
                Some(e) => Err(e),
            };
            match b {
                Ok(b) if i > 0 => {
                    for (k, v) in round.into_iter().enumerate() {
                        acc.ms[k].push(v);
                    }
                    acc.burst_ms.extend(b);
                }
                Ok(_) => {}
                Err(e) => fail(sides[s], "workloads", &mut out[s], e),
            }
        }
    }
    destroy_each(sides, &ids).await;
    out
}
