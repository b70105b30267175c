//! `compute-bench`: measures the compute service against a raw containerd + runsc baseline, in
//! the same run, on the same machine, with the same image and the same requests.
//!
//! "ours" is a real `computed node` started for the run (temp config, free port, namespace
//! `bench-ours-<pid>`); "baseline" drives containerd + runsc directly through the project's
//! runtime library (namespace `bench-base-<pid>`), with no daemon. Every scenario runs on both.
//! Prints a table and writes `results.json` (and `results.md`). Everything made is removed at
//! the end, also on error or Ctrl-C. See docs/bench.md.

mod base;
mod egress;
mod host;
mod interactive;
mod ours;
mod platform;
mod scenarios;
mod stats;
mod suspend;
mod target;
mod workspaces;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::FutureExt;
use serde_json::Value;

use base::Base;
use ours::Ours;
use scenarios::Plan;
use stats::{Better, Dist, Scenario, Side};
use target::{Sut, Target};

#[derive(Parser, Debug)]
#[command(
    name = "compute-bench",
    about = "Benchmarks computed against raw containerd + runsc"
)]
struct Args {
    /// Small sample counts (finishes in a few minutes on 2 cores).
    #[arg(long)]
    quick: bool,
    /// Where to write results.json (results.md and the daemon's log go beside it).
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
    /// The `computed` binary (default: next to this one).
    #[arg(long)]
    computed: Option<PathBuf>,
    /// The OCI image tarball both sides run.
    #[arg(long, default_value = "target/images/sandbox-python.tar")]
    image_tar: PathBuf,
    /// containerd's socket.
    #[arg(
        long,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/compute/containerd.sock"
    )]
    containerd: PathBuf,
    /// The runsc binary (both sides).
    #[arg(long, default_value = "/usr/bin/runsc")]
    runsc: PathBuf,
    /// runsc's platform on both sides (`ptrace`, `systrap`); empty: the daemon's default.
    #[arg(long, default_value = "")]
    platform: String,
    /// Storage class of ours' workspaces; empty = the daemon's default (`standard`, ext4-loop).
    #[arg(long, default_value = "")]
    storage_class: String,
    /// Ours' workspace store (`workspace_store_dir`); empty: `<state_dir>/store`. On XFS or
    /// btrfs the workspaces group measures reflinked snapshots.
    #[arg(long)]
    workspace_store: Option<PathBuf>,
    /// Scenario groups to run: cold (create_to_first_output_*, destroy), ready (exec_rtt_true,
    /// write_read_16mib), workloads (what agents run: a Python tool call, a shell pipeline,
    /// the data stack's import, a burst of 50 execs), platform (the API key gate's added cost;
    /// create from an environment → RUNNING against compute.v1's create → READY; Watch and
    /// follow latency),
    /// output (stdout throughput, memory with stalled clients), throughput, density,
    /// suspend (suspend and resume with memory: latency, disk, sessions per node),
    /// egress (sandbox networks: create with a network, TCP throughput, grant and revoke
    /// latency), workspaces (a durable workspace's snapshot: time and disk).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cold,ready,workloads,platform,output,throughput,density,suspend,egress"
    )]
    only: Vec<String>,
    /// The egress group's node: runsc's platform for its sandboxes with a network (`[egress]
    /// runsc_platform`; empty: the node's).
    #[arg(long, default_value = "")]
    egress_platform: String,
    /// The egress group's node: whose network stack its sandboxes run on (`[egress]
    /// runsc_network`: sandbox or host).
    #[arg(long, default_value = "sandbox")]
    egress_network: String,
    /// Override: rounds of the workloads per side.
    #[arg(long)]
    workload_rounds: Option<usize>,
    /// Override: cold creates per side.
    #[arg(long)]
    creates: Option<usize>,
    /// Override: `true` round trips per side.
    #[arg(long)]
    execs: Option<usize>,
    /// Override: 16 MiB write + read rounds per side.
    #[arg(long)]
    file_rounds: Option<usize>,
    /// Override: throughput duration in seconds.
    #[arg(long)]
    throughput_secs: Option<u64>,
    /// Concurrent sessions (one sandbox each) of the throughput scenario.
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Override: most sandboxes of the density scenario.
    #[arg(long)]
    density: Option<usize>,
    /// runsc checkpoint `--compression` on both sides (`none`, `flate-best-speed`); unset:
    /// the daemon's default (`checkpoint_compression`).
    #[arg(long)]
    checkpoint_compression: Option<String>,
    /// Override: idle Python sessions per side of the suspend group.
    #[arg(long)]
    suspend_sessions: Option<usize>,
    /// The density scenario stops when MemAvailable falls below this many MiB.
    #[arg(long, default_value_t = 3072)]
    mem_reserve_mib: u64,
}

impl Args {
    fn plan(&self) -> Plan {
        let q = self.quick;
        Plan {
            creates: self.creates.unwrap_or(if q { 10 } else { 30 }),
            execs: self.execs.unwrap_or(if q { 30 } else { 200 }),
            file_rounds: self.file_rounds.unwrap_or(if q { 10 } else { 20 }),
            file_bytes: 16 << 20,
            sessions: self.sessions.max(1),
            throughput: Duration::from_secs(
                self.throughput_secs
                    .unwrap_or(if q { 10 } else { 30 })
                    .max(1),
            ),
            density: self.density.unwrap_or(if q { 20 } else { 200 }),
            idle: Duration::from_secs(if q { 10 } else { 30 }),
            workload_rounds: self.workload_rounds.unwrap_or(if q { 2 } else { 10 }),
            // The raw side's burst (50 concurrent `runsc exec`s) takes a minute: once in a
            // quick run.
            burst_rounds: if q { 1 } else { usize::MAX },
            mem_reserve: self.mem_reserve_mib << 20,
            suspend_sessions: self
                .suspend_sessions
                .unwrap_or(if q { 5 } else { 20 })
                .max(1),
        }
    }

    fn runs(&self, group: &str) -> bool {
        self.only.iter().any(|g| g == group)
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("compute-bench: tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench(args)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("compute-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The scenario groups of `--only`.
const GROUPS: [&str; 10] = [
    "cold",
    "ready",
    "workloads",
    "platform",
    "output",
    "throughput",
    "density",
    "suspend",
    "egress",
    "workspaces",
];

async fn bench(args: Args) -> Result<u8> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("must run as root (sandboxes need root)");
    }
    for g in &args.only {
        if !GROUPS.contains(&g.as_str()) {
            bail!("unknown scenario group {g:?}");
        }
    }
    let computed = match &args.computed {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory of the executable")?
            .join("computed"),
    };
    if !computed.is_file() {
        bail!(
            "{} not found (build with `cargo build --release --bins`)",
            computed.display()
        );
    }
    if !args.image_tar.is_file() {
        bail!(
            "image tarball {} not found (scripts/build-image)",
            args.image_tar.display()
        );
    }
    let image_tar = std::fs::canonicalize(&args.image_tar)?;
    let out_dir = args
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    std::fs::create_dir_all(&out_dir)?;
    let plan = args.plan();
    let mut args = args;
    if args.platform.is_empty() {
        args.platform = computed::config::Config::default().runsc_platform;
    }
    let tmp = std::env::temp_dir().join(format!("compute-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&tmp)?;
    eprintln!(
        "compute-bench: {} run on {}; scratch {}",
        if args.quick { "quick" } else { "full" },
        host::machine(&args.runsc, &args.platform),
        tmp.display()
    );
    eprintln!("compute-bench: plan {plan:?}");
    if let Some(c) = &args.checkpoint_compression {
        eprintln!("compute-bench: checkpoint_compression {c:?} on both sides");
    }

    let made = (|| -> Result<(Ours, Base)> {
        Ok((
            Ours::new(
                &computed,
                &image_tar,
                &args.containerd,
                &args.runsc,
                &args.platform,
                tmp.join("ours"),
                &args.storage_class,
            )?
            .with_store(args.workspace_store.as_deref())?
            .with_checkpoint_compression(args.checkpoint_compression.as_deref())?,
            Base::new(
                &image_tar,
                &args.containerd,
                &args.runsc,
                &args.platform,
                tmp.join("base"),
            )?
            .with_checkpoint_compression(args.checkpoint_compression.as_deref()),
        ))
    })();
    let (ours, base) = match made {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };

    let began = std::time::Instant::now();
    let results: Mutex<Vec<Scenario>> = Mutex::new(Vec::new());
    let run =
        std::panic::AssertUnwindSafe(run(&args, &plan, &ours, &base, &results)).catch_unwind();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let (outcome, signalled): (Result<()>, bool) = tokio::select! {
        r = run => match r {
            Ok(r) => (r, false),
            Err(_) => (Err(anyhow::anyhow!("the run panicked")), false),
        },
        _ = tokio::signal::ctrl_c() => (Err(anyhow::anyhow!("interrupted")), true),
        _ = term.recv() => (Err(anyhow::anyhow!("terminated")), true),
        _ = hup.recv() => (Err(anyhow::anyhow!("hung up")), true),
    };
    if let Err(e) = &outcome {
        eprintln!("compute-bench: {e:#}");
    }

    // Cleanup, whatever happened. A second Ctrl-C gives up on it.
    let give_up = tokio::spawn(async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("compute-bench: cleanup abandoned");
        std::process::exit(130);
    });
    eprintln!("compute-bench: cleaning up");
    ours.cleanup().await;
    base.cleanup().await;
    let _ = std::fs::copy(ours.log(), out_dir.join("computed.log"));
    if let Err(e) = std::fs::remove_dir_all(&tmp) {
        eprintln!(
            "compute-bench: could not remove {}: {e} (a mount left behind?)",
            tmp.display()
        );
    }
    give_up.abort();

    eprintln!(
        "compute-bench: done in {:.0} s",
        began.elapsed().as_secs_f64()
    );
    let results = results.into_inner().unwrap_or_default();
    if !results.is_empty() {
        report(&args, &plan, &results)?;
    }
    let failed = results
        .iter()
        .any(|s| s.ours.error.is_some() || s.baseline.error.is_some());
    Ok(match outcome {
        Err(_) if signalled => 130,
        Err(_) => 1,
        Ok(()) if failed => 1,
        Ok(()) => 0,
    })
}

/// Starts a side; returns why it did not start.
async fn start(name: &str, f: impl Future<Output = Result<()>>) -> Option<String> {
    eprintln!("compute-bench: starting {name}");
    match f.await {
        Ok(()) => None,
        Err(e) => {
            eprintln!("compute-bench: {name} did not start: {e:#}");
            Some(format!("{e:#}"))
        }
    }
}

/// Maps the results of the sides that started back to [ours, baseline]; a side that did not
/// start gets its start error.
fn by_side<R>(start_errors: [&Option<String>; 2], results: Vec<Result<R>>) -> [Result<R>; 2] {
    let mut it = results.into_iter();
    start_errors.map(|e| match e {
        Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
        None => it
            .next()
            .unwrap_or_else(|| Err(anyhow::anyhow!("no result"))),
    })
}

/// Runs a per-side scenario on each side in turn (`reverse`: baseline first).
async fn each<'x, 'y, R, F, Fut>(
    live: &[&'x Sut<'y>],
    reverse: bool,
    what: &str,
    f: F,
) -> Vec<Result<R>>
where
    F: Fn(&'x Sut<'y>) -> Fut,
    Fut: Future<Output = Result<R>>,
{
    let mut idx: Vec<usize> = (0..live.len()).collect();
    if reverse {
        idx.reverse();
    }
    let mut out: Vec<Option<Result<R>>> = live.iter().map(|_| None).collect();
    for i in idx {
        eprintln!("compute-bench: {what}: {}", live[i].name());
        let r = f(live[i]).await;
        if let Err(e) = &r {
            eprintln!("compute-bench: {what}: {} failed: {e:#}", live[i].name());
        }
        out[i] = Some(r);
    }
    out.into_iter().flatten().collect()
}

fn side_of<R>(r: &Result<R>, f: impl FnOnce(&R) -> Side) -> Side {
    match r {
        Ok(v) => f(v),
        Err(e) => Side::failed(e),
    }
}

async fn run(
    args: &Args,
    plan: &Plan,
    ours: &Ours,
    base: &Base,
    results: &Mutex<Vec<Scenario>>,
) -> Result<()> {
    let o_err = start("ours", ours.start()).await;
    let b_err = start("baseline", base.start()).await;
    let (o, b) = (Sut::Ours(ours), Sut::Base(base));
    let errs = [&o_err, &b_err];
    let live: Vec<&Sut> = [(&o, &o_err), (&b, &b_err)]
        .into_iter()
        .filter(|(_, e)| e.is_none())
        .map(|(s, _)| s)
        .collect();
    let push = |s: Scenario| results.lock().unwrap().push(s);
    // Ours' cold create → first output samples, when the cold group ran (the suspend group's
    // reference).
    let mut cold_ours: Option<Vec<f64>> = None;

    if args.runs("cold") {
        eprintln!("compute-bench: cold create + destroy (sides take turns)");
        let [ro, rb] = by_side(errs, scenarios::cold(&live, plan).await);
        if let Ok(c) = &ro {
            cold_ours = Some(c.first_output_ms.clone()).filter(|v| !v.is_empty());
        }
        push(Scenario {
            name: "create_to_first_output_cold",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&ro, |c| {
                Side::measured(Dist::of(&c.first_output_ms, Better::Lower))
            }),
            baseline: side_of(&rb, |c| {
                Side::measured(Dist::of(&c.first_output_ms, Better::Lower))
            }),
            notes: vec![
                "ours: CreateSandbox then ExecCommand `echo hi` at once (it waits for READY) \
                 until the first stdout byte; baseline: container + snapshot + task create/start, \
                 then Tasks.Exec `echo hi` until the first byte on the FIFO"
                    .into(),
            ],
        });
        eprintln!("compute-bench: warm pool (ours only; the baseline is the raw cold create)");
        let rp = match &o_err {
            None => scenarios::pool(ours, plan).await,
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
        };
        if let Err(e) = &rp {
            eprintln!("compute-bench: warm pool: ours failed: {e:#}");
        }
        push(Scenario {
            name: "create_to_first_output_pool",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&rp, |v| Side::measured(Dist::of(v, Better::Lower))),
            baseline: side_of(&rb, |c| {
                Side::measured(Dist::of(&c.first_output_ms, Better::Lower))
            }),
            notes: vec![format!(
                "ours: the daemon restarted with a warm pool of {} bench-image sandboxes and the \
                 in-sandbox agent on; CreateSandbox (a pool member, READY in the response) then \
                 ExecCommand `echo hi` until the first stdout byte, each round once the pool \
                 is full again; baseline: the raw cold create of create_to_first_output_cold \
                 (raw containerd has no pool), the same samples",
                scenarios::POOL_SIZE
            )],
        });
        push(Scenario {
            name: "destroy",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&ro, |c| {
                Side::measured(Dist::of(&c.destroy_ms, Better::Lower))
            }),
            baseline: side_of(&rb, |c| {
                Side::measured(Dist::of(&c.destroy_ms, Better::Lower))
            }),
            notes: vec![
                "ours: DestroySandbox right after the cold create's exec (final usage, teardown, \
                 volume unmount, tombstone); baseline: kill + delete task, container, snapshot"
                    .into(),
            ],
        });
    }

    if args.runs("ready") {
        eprintln!("compute-bench: exec round trips + files (sides take turns)");
        let [ro, rb] = by_side(errs, scenarios::ready(&live, plan).await);
        push(Scenario {
            name: "exec_rtt_true",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&ro, |r| Side::measured(Dist::of(&r.rtt_ms, Better::Lower))),
            baseline: side_of(&rb, |r| Side::measured(Dist::of(&r.rtt_ms, Better::Lower))),
            notes: vec![
                "one ready sandbox, sequential; ours: ExecCommand `true` until the stream ends; \
                 baseline: FIFOs + Tasks.Exec + Start + Wait + DeleteProcess"
                    .into(),
            ],
        });
        let files = |r: &scenarios::Ready| {
            let p50 = |v: &[f64]| Dist::of(v, Better::Higher).map(|d| d.p50);
            let mut s = Side::measured(Dist::of(&r.file_mbps, Better::Higher));
            if let Some(v) = p50(&r.write_mbps) {
                s = s.with("write_p50", v);
            }
            if let Some(v) = p50(&r.read_mbps) {
                s = s.with("read_p50", v);
            }
            s
        };
        push(Scenario {
            name: "write_read_16mib",
            unit: "MB/s",
            better: Better::Higher,
            ours: side_of(&ro, files),
            baseline: side_of(&rb, files),
            notes: vec![format!(
                "16 MiB written then read back, MB/s = 2 x 16.78 MB / (write + read time); \
                 ours: WriteFile + ReadFile over gRPC into the workspace{}; baseline: host `cp` \
                 into a plain directory and back; p90/p99 are the slow tail (lower MB/s)",
                if args.storage_class.is_empty() {
                    " (default class: ext4-loop)".to_string()
                } else {
                    format!(" (class {})", args.storage_class)
                }
            )],
        });
    }

    if args.runs("platform") {
        eprintln!("compute-bench: platform API gate (authorised vs open calls, in turns)");
        let rounds = plan.execs * 10;
        let r = match &o_err {
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
            None => ours.auth_overhead(rounds).await,
        };
        let added = r.as_ref().ok().and_then(|(a, o)| {
            let a = Dist::of(a, Better::Lower)?;
            let o = Dist::of(o, Better::Lower)?;
            Some(a.p50 - o.p50)
        });
        let mut ours_side = side_of(&r, |(a, _)| Side::measured(Dist::of(a, Better::Lower)));
        if let Some(d) = added {
            ours_side = ours_side.with("added_p50_ms", (d * 1000.0).round() / 1000.0);
        }
        push(Scenario {
            name: "platform_authorised_call",
            unit: "ms",
            better: Better::Lower,
            ours: ours_side,
            baseline: side_of(&r, |(_, o)| Side::measured(Dist::of(o, Better::Lower))),
            notes: vec![format!(
                "one daemon, one TCP connection, {rounds} pairs in turns; ours: \
                 platform.v1 WhoAmI with an API key (header, SHA-256, key cache, roles); \
                 baseline: grpc.health Check, no key; target: added p50 <= 0.2 ms{}",
                match added {
                    Some(d) => format!(" (measured {d:.3} ms)"),
                    None => String::new(),
                }
            )],
        });
    }

    if args.runs("platform") {
        let rounds = plan.creates;
        eprintln!(
            "compute-bench: platform sandboxes ({rounds} creates per kind in turns, watch, follow)"
        );
        let r = match &o_err {
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
            None => platform::run(ours, rounds).await,
        };
        if let Err(e) = &r {
            eprintln!("compute-bench: platform sandboxes: {e:#}");
        }
        type Pick = fn(&platform::Measured) -> Vec<f64>;
        for (name, pick, what) in [
            (
                "platform_create_to_running",
                (|m| m.platform_running_ms.clone()) as Pick,
                format!(
                    "one daemon, {rounds} rounds in turns (after a warm-up round); ours: \
                     platform.v1 CreateSandbox from an environment (as root on the socket) until \
                     a WatchSandbox opened after it says RUNNING; baseline: compute.v1 \
                     CreateSandbox until DescribeSandbox (every 5 ms) says READY, on the same \
                     daemon; target: p50 ratio <= 1.05"
                ),
            ),
            (
                "platform_create_4_mounts_to_running",
                |m| m.mounts_running_ms.clone(),
                "as platform_create_to_running (in the same turns), from an environment with 4 \
                 ephemeral 1Gi mounts: 4 ext4-loop volumes made, mounted and bound into the \
                 sandbox, against compute.v1's one; no target (the cost of 3 more volumes)"
                    .to_string(),
            ),
        ] {
            let ratio = r.as_ref().ok().and_then(|m| {
                let p = Dist::of(&pick(m), Better::Lower)?;
                let v = Dist::of(&m.v1_ready_ms, Better::Lower)?;
                Some((p.p50 / v.p50 * 1000.0).round() / 1000.0)
            });
            let mut ours_side = side_of(&r, |m| Side::measured(Dist::of(&pick(m), Better::Lower)));
            if let Some(x) = ratio {
                ours_side = ours_side.with("p50_ratio_to_compute_v1", x);
            }
            push(Scenario {
                name,
                unit: "ms",
                better: Better::Lower,
                ours: ours_side,
                baseline: side_of(&r, |m| {
                    Side::measured(Dist::of(&m.v1_ready_ms, Better::Lower))
                }),
                notes: vec![format!(
                    "{what}{}",
                    ratio
                        .map(|x| format!(" (measured {x})"))
                        .unwrap_or_default()
                )],
            });
        }
        for (name, what, pick) in [
            (
                "platform_watch_latency",
                "a state change (the sandbox's updated_at: PENDING -> RUNNING, and the \
                 workload's exit) until the watcher's event arrives",
                (|m| m.watch_ms.clone()) as Pick,
            ),
            (
                "platform_follow_latency",
                "a line the workload stamps with its clock (200 lines, 20 ms apart) until a \
                 TailSandboxLogs follower has it",
                |m| m.follow_ms.clone(),
            ),
            (
                "platform_watch_latency_router",
                "as platform_watch_latency, through a computed router in front of the node",
                |m| m.router_watch_ms.clone(),
            ),
            (
                "platform_follow_latency_router",
                "as platform_follow_latency, through a computed router in front of the node",
                |m| m.router_follow_ms.clone(),
            ),
        ] {
            push(Scenario {
                name,
                unit: "ms",
                better: Better::Lower,
                ours: side_of(&r, |m| Side::measured(Dist::of(&pick(m), Better::Lower))),
                baseline: side_of(&r, |_| Side::measured(Some(Dist::single(2000.0)))),
                notes: vec![format!(
                    "{what}; baseline: the spec's service, which polls every 2 s \
                     (its mean wait is 1 s, its worst 2 s; shown as 2000); target: p50 <= 100 ms"
                )],
            });
        }
    }

    if args.runs("platform") {
        let (echoes, bytes, rounds) = if args.quick {
            (200, 256 << 20, 2)
        } else {
            (1000, 1 << 30, 4)
        };
        eprintln!(
            "compute-bench: interactive exec ({echoes} echoes, {rounds} x {} MiB of stdin, in turns)",
            bytes >> 20
        );
        let r = match &o_err {
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
            None => interactive::run(ours, echoes, bytes, rounds).await,
        };
        if let Err(e) = &r {
            eprintln!("compute-bench: interactive exec: {e:#}");
        }
        let p50 = r
            .as_ref()
            .ok()
            .and_then(|m| Dist::of(&m.echo_ms, Better::Lower))
            .map(|d| d.p50);
        push(Scenario {
            name: "exec_tty_echo_rtt",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&r, |m| Side::measured(Dist::of(&m.echo_ms, Better::Lower))),
            baseline: side_of(&r, |m| {
                Side::measured(Dist::of(&m.host_echo_ms, Better::Lower))
            }),
            notes: vec![format!(
                "one exec-only platform sandbox, {echoes} round trips per side in turns of 50;                  ours: platform.v1 ExecInSandbox (root on the socket) of `cat` on a terminal                  in raw mode, one byte on stdin until the same byte is back on stdout;                  baseline: the same through a host `cat` over pipes (no sandbox, no daemon, no                  terminal); target: p50 <= 2 ms{}",
                p50.map(|v| format!(" (measured {v:.2} ms)")).unwrap_or_default()
            )],
        });
        let ratio = r.as_ref().ok().and_then(|m| {
            let o = Dist::of(&m.stdin_mbps, Better::Higher)?;
            let h = Dist::of(&m.host_stdin_mbps, Better::Higher)?;
            Some((o.p50 / h.p50 * 1000.0).round() / 1000.0)
        });
        push(Scenario {
            name: "exec_stdin_throughput",
            unit: "MB/s",
            better: Better::Higher,
            ours: side_of(&r, |m| {
                let mut side = Side::measured(Dist::of(&m.stdin_mbps, Better::Higher));
                if let Some(d) = Dist::of(&m.sandbox_pipe_mbps, Better::Higher) {
                    side = side.with("sandbox_pipe_p50_mbps", (d.p50 * 10.0).round() / 10.0);
                }
                side
            }),
            baseline: side_of(&r, |m| {
                Side::measured(Dist::of(&m.host_stdin_mbps, Better::Higher))
            }),
            notes: vec![format!(
                "{rounds} transfer(s) of {} MiB per side in turns; ours: ExecInSandbox stdin                  (1 MiB messages) into `cat > /dev/null` in the sandbox until its exit;                  baseline: the same bytes into a host `cat > /dev/null` through a pipe;                  target: ratio >= 0.3{}",
                bytes >> 20,
                ratio.map(|x| format!(" (measured {x})")).unwrap_or_default()
            )],
        });
    }

    if args.runs("output") {
        let (bytes, rounds) = (200_000_000u64, if args.quick { 1 } else { 3 });
        eprintln!("compute-bench: stdout throughput ({bytes} bytes, {rounds} rounds in turns)");
        let r = match &o_err {
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
            None => ours.stdout_throughput(bytes, rounds).await,
        };
        if let Err(e) = &r {
            eprintln!("compute-bench: stdout throughput: {e:#}");
        }
        push(Scenario {
            name: "exec_stdout_200mb",
            unit: "MB/s",
            better: Better::Higher,
            ours: side_of(&r, |(s, _)| Side::measured(Dist::of(s, Better::Higher))),
            baseline: side_of(&r, |(_, p)| Side::measured(Dist::of(p, Better::Higher))),
            notes: vec![format!(
                "one ready sandbox, {rounds} pair(s) in turns; ours: ExecCommand `head -c \
                 {bytes} /dev/zero` read by this client as fast as it can; baseline: the same \
                 pipe inside the sandbox (`head -c {bytes} /dev/zero | cat > /dev/null`); MB/s \
                 from the client's clock; target: ratio >= 0.8"
            )],
        });
        let n = 50;
        eprintln!("compute-bench: daemon memory with {n} stalled clients");
        let r = match &o_err {
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
            None => ours.stalled_memory(n).await,
        };
        if let Err(e) = &r {
            eprintln!("compute-bench: stalled clients: {e:#}");
        }
        let mib = |b: u64| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
        push(Scenario {
            name: "daemon_rss_50_stalled",
            unit: "MiB",
            better: Better::Lower,
            ours: side_of(&r, |(idle, stalled)| {
                Side::measured(Some(Dist::single(mib(*stalled))))
                    .with("added_per_exec_mib", mib(stalled.saturating_sub(*idle) / n as u64))
            }),
            baseline: side_of(&r, |(idle, _)| Side::measured(Some(Dist::single(mib(*idle))))),
            notes: vec![format!(
                "the daemon's VmRSS; ours: {n} execs of `head -c 1G /dev/zero` in one sandbox, each \
                 client on its own connection reading one event and then nothing, after 5 s; \
                 baseline: the same daemon just before (idle, warmed by a 20 MB exec); the \
                 bound is the output window (exec_output_window, 1 MiB) per exec; every process \
                 is gone within 10 s of its client"
            )],
        });
    }

    if args.runs("workloads") {
        eprintln!("compute-bench: workloads (sides take turns)");
        let rounds = plan.workload_rounds;
        let [ro, rb] = by_side(
            errs,
            scenarios::workloads(&live, rounds, plan.burst_rounds).await,
        );
        for (k, (name, argv, what)) in scenarios::WORKLOADS.iter().enumerate() {
            push(Scenario {
                name,
                unit: "ms",
                better: Better::Lower,
                ours: side_of(&ro, |w| Side::measured(Dist::of(&w.ms[k], Better::Lower))),
                baseline: side_of(&rb, |w| Side::measured(Dist::of(&w.ms[k], Better::Lower))),
                notes: vec![format!(
                    "{what}; one exec, start to end; ours: ExecCommand; baseline: Tasks.Exec \
                     (`{}`)",
                    argv.join(" ").replace('\n', "; ")
                )],
            });
        }
        push(Scenario {
            name: "burst_50_execs",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&ro, |w| {
                Side::measured(Dist::of(&w.burst_ms, Better::Lower))
            }),
            baseline: side_of(&rb, |w| {
                Side::measured(Dist::of(&w.burst_ms, Better::Lower))
            }),
            notes: vec![format!(
                "{} `true` execs started at once in one sandbox, until the last has ended",
                scenarios::BURST
            )],
        });
    }

    if args.runs("throughput") {
        let r = each(&live, false, "exec throughput", |t| {
            scenarios::throughput(t, plan)
        })
        .await;
        let [ro, rb] = by_side(errs, r);
        let side = |r: &scenarios::Throughput| {
            let lat = Dist::of(&r.latency_ms, Better::Lower);
            let mut s = Side::measured(Dist::of(&r.windows, Better::Higher))
                .with("mean", r.mean())
                .with("execs", r.total)
                .with("errors", r.errors)
                .with("elapsed_s", r.elapsed.as_secs_f64());
            if let Some(l) = lat {
                s = s
                    .with("latency_ms_p50", l.p50)
                    .with("latency_ms_p99", l.p99);
            }
            if let Some(e) = &r.first_error {
                s = s.with("first_error", e.clone());
            }
            s
        };
        push(Scenario {
            name: "exec_throughput",
            unit: "execs/s",
            better: Better::Higher,
            ours: side_of(&ro, side),
            baseline: side_of(&rb, side),
            notes: vec![format!(
                "{} sessions, each its own sandbox running `true` in a loop for {} s; \
                 percentiles over 1-s windows (p90/p99 = the slow windows); *_mean = all execs / \
                 elapsed; *_errors = failed execs",
                plan.sessions,
                plan.throughput.as_secs()
            )],
        });
    }

    if args.runs("density") {
        // Baseline first here, ours first in the throughput scenario.
        let r = each(&live, true, "density", |t| scenarios::density(t, plan)).await;
        let [ro, rb] = by_side(errs, r);
        let side = |d: &scenarios::Density| {
            let first = d.create_ms.first().copied();
            let last = d.create_ms.last().copied();
            let k = d.create_ms.len().min(5);
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let first_k = mean(&d.create_ms[..k]);
            let last_k = mean(&d.create_ms[d.create_ms.len() - k..]);
            let mut s = Side::measured(Some(Dist {
                n: d.n as u64,
                ..Dist::single(d.mem_mb_per_sandbox)
            }))
            .with("sandboxes", d.n as u64)
            .with("cgroup_mb_per_sandbox", d.cgroup_mb_per_sandbox)
            .with("pss_mb_per_sandbox", d.pss_mb_per_sandbox)
            .with("create_ms_first5_mean", first_k)
            .with("create_ms_last5_mean", last_k)
            .with(
                "create_ratio_n_vs_1",
                if first_k > 0.0 { last_k / first_k } else { 0.0 },
            );
            if let (Some(f), Some(l)) = (first, last) {
                s = s.with("create_ms_at_1", f).with("create_ms_at_n", l);
            }
            if let Some(r) = d.daemon_rss_kb_per_sandbox {
                s = s.with("daemon_rss_kb_per_sandbox", r);
            }
            if let Some(why) = &d.stopped_early {
                s = s.with("stopped_early", why.clone());
            }
            s
        };
        push(Scenario {
            name: "density",
            unit: "MB/sandbox",
            better: Better::Lower,
            ours: side_of(&ro, side),
            baseline: side_of(&rb, side),
            notes: vec![format!(
                "up to {} idle sandboxes created one after the other (each ready before the \
                 next); value = MemAvailable drop / N (host-wide, so other load on the machine \
                 shows up); *_pss_mb_per_sandbox = PSS of each sandbox's shim + sentry + gofer + \
                 stubs, mean; *_cgroup_mb_per_sandbox = sandbox cgroup working set / N (sentry + \
                 gofer, no shim); *_daemon_rss_kb_per_sandbox = computed VmRSS growth / N; \
                 create latency = Create until READY (ours polls Describe every 5 ms) vs \
                 start_task returning",
                plan.density
            )],
        });
        push(Scenario {
            name: "density_pss",
            unit: "MB/sandbox",
            better: Better::Lower,
            ours: side_of(&ro, |d| {
                let daemon = d.daemon_rss_kb_per_sandbox.unwrap_or(0.0).max(0.0) * 1024.0 / 1e6;
                Side::measured(Some(Dist {
                    n: d.n as u64,
                    ..Dist::single(d.pss_mb_per_sandbox + daemon)
                }))
            }),
            baseline: side_of(&rb, |d| {
                Side::measured(Some(Dist {
                    n: d.n as u64,
                    ..Dist::single(d.pss_mb_per_sandbox)
                }))
            }),
            notes: vec![
                "the density run's sandboxes: mean PSS of each one's host processes (shim, \
                 runsc sandbox/sentry, gofer, ptrace stubs); ours adds the daemon's VmRSS growth / N. \
                 Not disturbed by other load on the machine, unlike MemAvailable"
                    .into(),
            ],
        });
        let idle = |d: &scenarios::Density| {
            let mut s = Side::measured(Some(Dist {
                n: d.n as u64,
                ..Dist::single(d.idle_cpu_ms_per_s)
            }));
            if let Some(p) = d.daemon_idle_cpu_pct {
                s = s.with("daemon_cpu_pct_of_a_core", p);
            }
            s
        };
        push(Scenario {
            name: "idle_cpu",
            unit: "ms/s per sandbox",
            better: Better::Lower,
            ours: side_of(&ro, idle),
            baseline: side_of(&rb, idle),
            notes: vec![format!(
                "the density run's sandboxes left idle for {} s: value = cgroup CPU per sandbox \
                 (sentry + gofer + stubs; ours also runs the agent as init, the baseline a \
                 sleeping shell), ms per second; ours_daemon_cpu_pct_of_a_core = the daemon's \
                 own CPU over the same window with all N sandboxes (metering ticks, health \
                 checks, usage persistence), % of one core (10 ms resolution)",
                plan.idle.as_secs()
            )],
        });
        let near_n = |d: &scenarios::Density| {
            let k = d.create_ms.len().min(5);
            Side::measured(Dist::of(
                &d.create_ms[d.create_ms.len() - k..],
                Better::Lower,
            ))
        };
        push(Scenario {
            name: "density_create_at_n",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&ro, near_n),
            baseline: side_of(&rb, near_n),
            notes: vec![
                "create latency (until READY / task started) of the last 5 sandboxes of the \
                 density run, with N-1 idle ones already there; compare *_create_ms_first5_mean \
                 of the density row"
                    .into(),
            ],
        });
    }

    if args.runs("suspend") {
        for s in suspend::group(args.quick, plan, ours, base, errs, cold_ours).await {
            push(s);
        }
    }

    if args.runs("workspaces") {
        let (rounds, fill) = if args.quick { (2, 256) } else { (5, 896) };
        eprintln!(
            "compute-bench: workspace snapshots (1Gi workspace, {fill} MiB written, {rounds} x \
             10 MiB changed + snapshot)"
        );
        let r = match &o_err {
            Some(e) => Err(anyhow::anyhow!("did not start: {e}")),
            None => workspaces::run(ours, rounds, fill).await,
        };
        if let Err(e) = &r {
            eprintln!("compute-bench: workspace snapshots: {e:#}");
        }
        let how = r.as_ref().map(|m| m.method.clone()).unwrap_or_default();
        let filled = r.as_ref().map(|m| m.filled_mib).unwrap_or(0);
        push(Scenario {
            name: "workspace_snapshot",
            unit: "ms",
            better: Better::Lower,
            ours: side_of(&r, |m| {
                Side::measured(Dist::of(&m.snapshot_ms, Better::Lower))
                    .with("method", m.method.clone())
            }),
            baseline: side_of(&r, |m| Side::measured(Dist::of(&m.copy_ms, Better::Lower))),
            notes: vec![format!(
                "a 1Gi ext4-loop durable workspace with {filled} MiB written, attached to a \
                 running sandbox; each round rewrites 10 MiB, then ours: SnapshotWorkspace \
                 (fsfreeze, {how} of the image, thaw, record); baseline: cp --reflink=auto \
                 --sparse=always of the same image file, nothing frozen, no API"
            )],
        });
        push(Scenario {
            name: "workspace_snapshot_disk",
            unit: "bytes",
            better: Better::Lower,
            ours: side_of(&r, |m| {
                let mut s = Side::measured(Dist::of(&m.snapshot_disk, Better::Lower));
                if let Some(d) = Dist::of(&m.round_disk, Better::Lower) {
                    s = s.with("round_disk_p50_bytes", d.p50);
                }
                s
            }),
            baseline: side_of(&r, |m| {
                Side::measured(Dist::of(&m.copy_disk, Better::Lower))
            }),
            notes: vec![format!(
                "disk each snapshot of workspace_snapshot took ({how}; free space of the \
                 store's file system before and after): a copy costs the workspace's used \
                 blocks (a store without reflinks, as this machine's ext4), a reflink what \
                 changed since (10 MiB; XFS or btrfs), which shows in \
                 ours_round_disk_p50_bytes (free space \
                 before the 10 MiB change and after the snapshot: the blocks the earlier \
                 snapshot shares are copied on write)"
            )],
        });
    }

    if args.runs("egress") {
        eprintln!("compute-bench: sandbox networks (a second node, with [egress])");
        let (_, computed, dir) = ours.parts();
        let dir = dir.parent().unwrap_or(dir).join("egress");
        let egress = Ours::new(
            computed,
            &std::fs::canonicalize(&args.image_tar)?,
            &args.containerd,
            &args.runsc,
            &args.platform,
            dir.clone(),
            &args.storage_class,
        )?;
        for s in egress::group(
            args.quick,
            ours,
            egress,
            dir,
            &args.egress_platform,
            &args.egress_network,
        )
        .await
        {
            push(s);
        }
    }
    Ok(())
}

fn report(args: &Args, plan: &Plan, results: &[Scenario]) -> Result<()> {
    let table = stats::text_table(results);
    println!("\n{table}");
    let json: Vec<Value> = results.iter().map(Scenario::to_json).collect();
    std::fs::write(&args.out, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("write {}", args.out.display()))?;
    let md_path = args.out.with_extension("md");
    let mut md = format!(
        "compute-bench {} run, {} UTC, {}\n\nplan: {} cold creates, {} exec round trips, {} file \
         rounds, throughput {} sessions x {} s, density up to {}\n\n",
        if args.quick { "--quick" } else { "full" },
        chrono::Utc::now().format("%Y-%m-%d %H:%M"),
        host::machine(&args.runsc, &args.platform),
        plan.creates,
        plan.execs,
        plan.file_rounds,
        plan.sessions,
        plan.throughput.as_secs(),
        plan.density,
    );
    md.push_str(&stats::markdown_table(results));
    md.push('\n');
    for s in results {
        for (side, e) in [("ours", &s.ours.error), ("baseline", &s.baseline.error)] {
            if let Some(e) = e {
                md.push_str(&format!("* {} ({side}) failed: {e}\n", s.name));
            }
        }
    }
    std::fs::write(&md_path, md).with_context(|| format!("write {}", md_path.display()))?;
    for s in results {
        for (side, e) in [("ours", &s.ours.error), ("baseline", &s.baseline.error)] {
            if let Some(e) = e {
                eprintln!("compute-bench: {} ({side}) failed: {e}", s.name);
            }
        }
    }
    println!("wrote {} and {}", args.out.display(), md_path.display());
    Ok(())
}
