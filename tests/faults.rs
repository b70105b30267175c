//! Load and faults, end to end against real containerd and runsc (issue #9).
//!
//! * Load: many sessions in parallel, each creating a sandbox, running execs and file I/O and
//!   destroying it; no errors, and nothing left behind (counted before and after, by this
//!   daemon's containerd namespace, state and run directories and sandbox ids).
//! * Faults: `kill -9` of the daemon under load; a containerd restart; a killed runsc sandbox
//!   process; a full workspace partition; no loop devices left; max_runtime (in tests/node.rs).
//!
//! The long forms run with `COMPUTE_LONG=1` (50 sessions of 20 execs for the load test, more
//! sandboxes for the kill -9 test); CI runs shorter forms. Each test prints its figures.

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use computed::api::compute::v1 as pb;
use tonic::Code;

fn long() -> bool {
    std::env::var("COMPUTE_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a daemon leaves on the host and in containerd, counted by its namespace, its state and
/// run directories and the ids of its sandboxes (so parallel tests do not disturb the counts).
/// Every test here ends with a census of what its sandboxes left on the host, and they run one
/// at a time: a sandbox started while another test's workspace volume is mounted holds a copy
/// of that mount in its own mount namespace (this host's mounts are private, not shared), so
/// the other volume's loop device stays attached until that sandbox ends, which a census taken
/// meanwhile would count as a leak.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Census {
    /// containerd shims of the namespace.
    shims: Vec<String>,
    /// runsc processes (sandbox, gofer, exec) of the namespace or of the sandboxes.
    runsc: Vec<String>,
    /// Mounts under the state dir or of the namespace's task bundles.
    mounts: Vec<String>,
    /// Loop devices backed by files under the state dir.
    loops: Vec<String>,
    /// cgroup directories named for the sandboxes.
    cgroups: Vec<PathBuf>,
    /// FIFOs under the run dir.
    fifos: Vec<PathBuf>,
    /// containerd containers, tasks, snapshots and leases of the namespace.
    containers: Vec<String>,
    tasks: Vec<String>,
    snapshots: Vec<String>,
    leases: Vec<String>,
}

impl Census {
    fn take(d: &Daemon, ids: &BTreeSet<String>) -> Census {
        let state = d.state_dir().display().to_string();
        let ns_flag = format!("-namespace {} ", d.namespace);
        let ns_path = format!("/{}/", d.namespace);
        let mut shims = Vec::new();
        let mut runsc = Vec::new();
        for cmd in processes_mentioning("") {
            let ours = cmd.contains(&ns_flag)
                || cmd.contains(&ns_path)
                || ids.iter().any(|id| cmd.contains(id.as_str()));
            if !ours {
                continue;
            }
            if cmd.contains("containerd-shim") {
                shims.push(cmd);
            } else if cmd.contains("runsc") {
                runsc.push(cmd);
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| {
                l.contains(&state)
                    || l.contains(&ns_path)
                    || ids.iter().any(|id| l.contains(id.as_str()))
            })
            .map(String::from)
            .collect();
        let loops = loops_mentioning(&state);
        let cgroups = ids.iter().flat_map(|id| cgroups_of(id)).collect();
        let mut fifos = Vec::new();
        walk_fifos(&d.run_dir(), &mut fifos);
        let lines = |args: &[&str]| -> Vec<String> {
            d.ctr(args)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        };
        let mut snapshots = lines(&["snapshots", "ls"]);
        snapshots.retain(|l| !l.starts_with("KEY"));
        Census {
            shims,
            runsc,
            mounts,
            loops,
            cgroups,
            fifos,
            containers: lines(&["containers", "ls", "-q"]),
            tasks: lines(&["tasks", "ls", "-q"]),
            snapshots,
            leases: lines(&["leases", "ls", "-q"]),
        }
    }

    fn counts(&self) -> String {
        format!(
            "shims {} runsc {} mounts {} loops {} cgroups {} fifos {} containers {} tasks {} snapshots {} leases {}",
            self.shims.len(),
            self.runsc.len(),
            self.mounts.len(),
            self.loops.len(),
            self.cgroups.len(),
            self.fifos.len(),
            self.containers.len(),
            self.tasks.len(),
            self.snapshots.len(),
            self.leases.len()
        )
    }
}

fn walk_fifos(dir: &Path, out: &mut Vec<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            walk_fifos(&e.path(), out);
        } else if t.is_fifo() {
            out.push(e.path());
        }
    }
}

/// Takes censuses until one equals `want` (teardown of shims and cgroups is asynchronous), or
/// returns the last one after `within`.
async fn settle(d: &Daemon, ids: &BTreeSet<String>, want: &Census, within: Duration) -> Census {
    let deadline = Instant::now() + within;
    loop {
        let c = Census::take(d, ids);
        if &c == want || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Settles the census (see [`settle`]), prints it beside `before` under `label`, and asserts
/// that nothing is left: `after` names the scenario in the failure message.
async fn assert_settled(
    d: &Daemon,
    ids: &BTreeSet<String>,
    before: &Census,
    within: Duration,
    label: &str,
    after: &str,
) {
    let now = settle(d, ids, before, within).await;
    eprintln!(
        "{label} leftovers\n  before: {}\n  after:  {}",
        before.counts(),
        now.counts()
    );
    assert_eq!(&now, before, "leftovers after {after}");
}

async fn read(c: &mut Client, id: &str, path: &str) -> Vec<u8> {
    read_file(c, id, path).await.data.to_vec()
}

/// One session of the load test: create, `execs` execs with file I/O between, destroy.
/// Returns the sandbox id and the errors met (as text).
async fn session(mut c: Client, i: usize, execs: usize) -> (Option<String>, Vec<String>, usize) {
    let mut errors = Vec::new();
    let id = match c.create_sandbox(create_req("load", &format!("s{i}"))).await {
        Ok(r) => r.into_inner().sandbox_id,
        Err(e) => return (None, vec![format!("create: {e}")], 0),
    };
    let mut done = 0;
    for j in 0..execs {
        // File I/O from the host side, checked from inside, and the reverse.
        let name = format!("f{j}.txt");
        let body = format!("session {i} exec {j}\n");
        if let Err(e) = try_write_file(&mut c, &id, &name, body.as_bytes()).await {
            errors.push(format!("write {name}: {e}"));
            continue;
        }
        let script = format!("cat /workspace/{name}; echo out-{j} > /workspace/o{j}.txt");
        match exec(&mut c, exec_req(&id, "sh", &["-c", &script])).await {
            Ok(o) if o.completed.as_ref().map(|c| c.exit_code) == Some(0) && o.out() == body => {
                done += 1
            }
            Ok(o) => errors.push(format!(
                "exec {j}: {:?} out {:?} err {:?}",
                o.completed,
                o.out(),
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => errors.push(format!("exec {j}: {e}")),
        }
        let back = read(&mut c, &id, &format!("o{j}.txt")).await;
        if back != format!("out-{j}\n").as_bytes() {
            errors.push(format!(
                "read o{j}.txt: {:?}",
                String::from_utf8_lossy(&back)
            ));
        }
    }
    if let Err(e) = try_destroy(&mut c, &id).await {
        errors.push(format!("destroy: {e}"));
    }
    (Some(id), errors, done)
}

#[tokio::test(flavor = "multi_thread")]
async fn load_sessions_in_parallel_leave_nothing_behind() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    let sessions = env_num("COMPUTE_LOAD_SESSIONS", if long() { 50 } else { 6 });
    let execs = env_num("COMPUTE_LOAD_EXECS", if long() { 20 } else { 5 });
    let d = start(
        "load",
        &format!("max_sandboxes = {}\nready_wait_secs = 300", sessions + 10),
    );
    let before = Census::take(&d, &BTreeSet::new());
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for i in 0..sessions {
        let c = d.client().await;
        handles.push(tokio::spawn(session(c, i, execs)));
    }
    let mut ids = BTreeSet::new();
    let mut errors = Vec::new();
    let mut done = 0;
    for h in handles {
        let (id, e, n) = h.await.unwrap();
        ids.extend(id);
        errors.extend(e);
        done += n;
    }
    let elapsed = t0.elapsed();
    let after = settle(&d, &ids, &before, Duration::from_secs(30)).await;
    eprintln!(
        "LOAD sessions {sessions} execs/session {execs} execs ok {done} errors {} duration {:.1}s\n  before: {}\n  after:  {}",
        errors.len(),
        elapsed.as_secs_f64(),
        before.counts(),
        after.counts()
    );
    assert!(errors.is_empty(), "errors under load: {errors:#?}");
    assert_eq!(ids.len(), sessions, "one sandbox per session");
    assert_eq!(done, sessions * execs);
    assert!(before.shims.is_empty() && before.containers.is_empty());
    assert_eq!(after, before, "leftovers after the load");
    // Every sandbox is DESTROYED.
    let mut c = d.client().await;
    for id in &ids {
        assert_eq!(status_of(&mut c, id).await, SandboxStatus::Destroyed);
    }
}

/// Lifetime usage of a sandbox as Describe reports it.
async fn usage_of(c: &mut Client, id: &str) -> computed::api::common::v1::UsageMetrics {
    describe(c, id).await.current_usage.unwrap()
}

/// Starts an exec that prints `started` and then sleeps; returns once `started` arrived, with a
/// task that drains the rest of the stream and yields how it ended.
async fn in_flight(
    c: &mut Client,
    id: &str,
) -> tokio::task::JoinHandle<Result<Option<pb::ExecCompleted>, tonic::Status>> {
    let mut stream = sh_stream(c, id, "echo started; sleep 60; echo never").await;
    let first = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(&first.event, Some(pb::exec_event::Event::Stdout(s)) if s.data == b"started\n"),
        "{first:?}"
    );
    tokio::spawn(async move {
        let mut completed = None;
        while let Some(ev) = stream.message().await? {
            if let Some(pb::exec_event::Event::Completed(c)) = ev.event {
                completed = Some(c);
            }
        }
        Ok(completed)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_under_load_keeps_every_ready_sandbox() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    kill9_under_load("kill9", "").await;
}

/// The same with execs through containerd (`runsc exec`) instead of the in-sandbox agent: the
/// orphaned execs are containerd exec processes, whose shim waits for their FIFOs.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_under_load_with_containerd_execs() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    kill9_under_load("kill9ctr", "agent = false").await;
}

/// A call cut by the daemon's death ends with a status that says the server went away; its
/// code and message are added to `codes`.
fn assert_server_gone(st: &tonic::Status, codes: &mut BTreeSet<String>, what: &str) {
    codes.insert(format!("{:?}: {}", st.code(), st.message()));
    assert!(
        matches!(
            st.code(),
            Code::Unavailable | Code::Unknown | Code::Internal
        ),
        "{what} ended with {st:?}"
    );
}

async fn kill9_under_load(name: &str, extra: &str) {
    let n = env_num("COMPUTE_KILL9_SANDBOXES", if long() { 12 } else { 3 });
    let mut d = start(
        name,
        &format!(
            "usage_persist_secs = 1\nmeter_interval_ms = 200\nmax_sandboxes = {}\n{extra}",
            n + 10
        ),
    );
    let before_census = Census::take(&d, &BTreeSet::new());
    let mut c = d.client().await;
    let mut ids = Vec::new();
    for i in 0..n {
        let id = ready_sandbox(&mut c, create_req("k9", &format!("ready{i}"))).await;
        write_file(&mut c, &id, "host.txt", format!("host {i}\n").as_bytes()).await;
        sh(
            &mut c,
            &id,
            &format!("echo inside {i} > /workspace/inside.txt; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"),
        )
        .await;
        ids.push(id);
    }
    // Let the meter persist what the sandboxes used so far.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut before = Vec::new();
    for id in &ids {
        before.push(usage_of(&mut c, id).await);
    }
    // Execs in flight on every sandbox, and sandboxes still starting, when the daemon dies.
    let mut streams = Vec::new();
    for id in &ids {
        streams.push(in_flight(&mut c, id).await);
    }
    let mut starting = Vec::new();
    for i in 0..2 {
        starting.push(
            create(&mut c, create_req("k9", &format!("starting{i}")))
                .await
                .sandbox_id,
        );
    }
    // A short exec of a burst in flight too.
    let mut bursts = Vec::new();
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for id in &ids {
        let mut c2 = d.client().await;
        let id = id.clone();
        let progress = progress.clone();
        bursts.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for _ in 0..500 {
                let r = exec(&mut c2, exec_req(&id, "true", &[])).await;
                let failed = r.is_err();
                results.push(r.map(|o| o.code()));
                if failed {
                    break;
                }
                progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            results
        }));
    }
    // Kill once the bursts are well under way.
    let deadline = Instant::now() + Duration::from_secs(20);
    while progress.load(std::sync::atomic::Ordering::Relaxed) < 2 * n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t0 = Instant::now();
    d.kill9();

    // Every caller's stream ends, with a status that says the server went away.
    let mut codes = BTreeSet::new();
    for s in streams {
        let r = tokio::time::timeout(Duration::from_secs(30), s)
            .await
            .expect("an in-flight exec stream hung after the daemon died")
            .unwrap();
        let st = r.expect_err("an in-flight exec cannot complete: its daemon died");
        assert_server_gone(&st, &mut codes, "in-flight exec");
    }
    let mut burst_ok = 0;
    let mut burst_cut = 0;
    for b in bursts {
        let results = tokio::time::timeout(Duration::from_secs(30), b)
            .await
            .expect("a burst of execs hung after the daemon died")
            .unwrap();
        for r in results {
            match r {
                Ok(code) => {
                    assert_eq!(code, 0);
                    burst_ok += 1;
                }
                Err(st) => {
                    burst_cut += 1;
                    assert_server_gone(&st, &mut codes, "exec");
                }
            }
        }
    }
    eprintln!(
        "KILL9 ({name}) sandboxes {n}, in-flight long execs {n}, burst execs completed before the kill {burst_ok}, cut by it {burst_cut}; callers saw {codes:?} within {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    d.spawn();
    eprintln!("KILL9 restarted after {:.1}s", t0.elapsed().as_secs_f64());
    let mut c = d.client().await;
    for (i, id) in ids.iter().enumerate() {
        let desc = describe(&mut c, id).await;
        assert_eq!(
            desc.status,
            SandboxStatus::Ready as i32,
            "{id} after restart: {}",
            desc.failure_reason
        );
        assert_eq!(
            read(&mut c, id, "host.txt").await,
            format!("host {i}\n").as_bytes()
        );
        assert_eq!(
            sh(&mut c, id, "cat /workspace/inside.txt /workspace/host.txt").await,
            format!("inside {i}\nhost {i}\n")
        );
        let after = usage_of(&mut c, id).await;
        let b = &before[i];
        assert!(
            after.cpu_ms >= b.cpu_ms,
            "cpu {} < {}",
            after.cpu_ms,
            b.cpu_ms
        );
        assert!(after.memory_peak_bytes >= b.memory_peak_bytes);
        assert!(after.disk_write_bytes >= b.disk_write_bytes);
        assert!(after.disk_read_bytes >= b.disk_read_bytes);
        write_file(&mut c, id, "after.txt", b"after\n").await;
    }
    eprintln!(
        "KILL9 ready sandboxes checked after {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    // Sandboxes caught starting finish starting.
    for id in &starting {
        wait_status(&mut c, id, SandboxStatus::Ready, Duration::from_secs(60)).await;
        assert_eq!(sh(&mut c, id, "echo up").await, "up\n");
    }
    eprintln!(
        "KILL9 starting sandboxes ready after {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    // Destroying everything leaves nothing behind, the orphaned execs included.
    let all: BTreeSet<String> = ids.iter().chain(starting.iter()).cloned().collect();
    for id in &all {
        destroy(&mut c, id).await;
    }
    let (secs, what) = (Duration::from_secs(30), "kill -9 and destroy");
    assert_settled(&d, &all, &before_census, secs, "KILL9", what).await;
}

/// Pids of host processes whose command line starts with `argv0` and mentions `needle`.
fn pids_of(argv0: &str, needle: &str) -> Vec<i32> {
    command_lines()
        .into_iter()
        .filter(|(_, cmd)| cmd.starts_with(argv0) && cmd.contains(needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// Kills the sandbox's runsc-sandbox process (the sentry) and waits for FAILED.
async fn kill_sentry(c: &mut Client, id: &str) -> pb::DescribeSandboxResponse {
    let pids = pids_of("runsc-sandbox", id);
    assert_eq!(
        pids.len(),
        1,
        "one runsc-sandbox process for {id}: {pids:?}"
    );
    sigkill(pids[0]);
    wait_status(c, id, SandboxStatus::Failed, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_runsc_sandbox_process_fails_the_sandbox_cleanly() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    let d = start("sentry", "");
    let before = Census::take(&d, &BTreeSet::new());
    let mut c = d.client().await;
    let id = ready_sandbox(&mut c, create_req("t", "sentry")).await;
    write_file(&mut c, &id, "kept.txt", b"kept\n").await;
    let ids = BTreeSet::from([id.clone()]);
    // The census sees a live sandbox (so that equal counts later mean something).
    let live = Census::take(&d, &ids);
    eprintln!("SENTRY live: {}", live.counts());
    assert!(!live.shims.is_empty() && !live.runsc.is_empty());
    assert!(!live.mounts.is_empty() && live.loops.len() == 1 && !live.cgroups.is_empty());
    assert!(live.containers.len() == 1 && live.tasks.len() == 1);
    assert!(live.snapshots.len() > before.snapshots.len());

    let desc = kill_sentry(&mut c, &id).await;
    assert!(
        desc.failure_reason.contains("exited"),
        "reason: {:?}",
        desc.failure_reason
    );
    // Describe, post-mortem reads and Destroy work; execs say why not.
    let desc = describe(&mut c, &id).await;
    assert_eq!(desc.status, SandboxStatus::Failed as i32);
    assert!(desc.current_usage.is_some());
    assert_eq!(read(&mut c, &id, "kept.txt").await, b"kept\n");
    let st = exec(&mut c, exec_req(&id, "true", &[])).await.unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert!(st.message().contains("FAILED"), "{st:?}");
    let total = destroy(&mut c, &id).await;
    assert!(total.total_usage.is_some());
    let desc = describe(&mut c, &id).await;
    assert_eq!(desc.status, SandboxStatus::Destroyed as i32);
    assert!(
        desc.failure_reason.contains("exited"),
        "{}",
        desc.failure_reason
    );
    let (secs, what) = (Duration::from_secs(20), "a killed sentry and Destroy");
    assert_settled(&d, &ids, &before, secs, "SENTRY", what).await;
}

/// A second, private containerd (its own root, state, sockets and config) that a test may kill
/// and restart without disturbing the shared one other tests use.
struct OwnContainerd {
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl OwnContainerd {
    fn start() -> OwnContainerd {
        let dir = tempfile::Builder::new()
            .prefix("faults-containerd-")
            .tempdir()
            .unwrap();
        let cfg = dir.path().join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "version = 2\nroot = {root:?}\nstate = {state:?}\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = {sock:?}\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n[debug]\n  address = \"\"\n",
                root = dir.path().join("root"),
                state = dir.path().join("state"),
                sock = dir.path().join("containerd.sock").display().to_string(),
            ),
        )
        .unwrap();
        let mut c = OwnContainerd { dir, child: None };
        c.spawn();
        c
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))
            .unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = Command::new("ctr")
                .arg("--address")
                .arg(self.socket())
                .arg("version")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private containerd did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnContainerd {
    fn drop(&mut self) {
        self.kill9();
        // Whatever containerd left mounted under its root (snapshots, task rootfs).
        let root = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(String::from))
            .filter(|m| m.starts_with(&root))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn containerd_restart_keeps_sandboxes_and_the_daemon_reconnects() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut ctrd = OwnContainerd::start();
    let d = start_with(
        "ctrdrestart",
        "",
        Options {
            containerd: Some(ctrd.socket()),
            ..Default::default()
        },
    );
    let before = Census::take(&d, &BTreeSet::new());
    let mut c = d.client().await;
    let a = ready_sandbox(&mut c, create_req("t", "a")).await;
    let b = ready_sandbox(&mut c, create_req("t", "b")).await;
    sh(&mut c, &a, "echo before > /workspace/state.txt").await;
    // A process that lives across the restart: the sandbox itself is not restarted.
    sh(
        &mut c,
        &b,
        "sleep 1000 > /dev/null 2>&1 & echo $! > /workspace/pid",
    )
    .await;
    let sentry_a = pids_of("runsc-sandbox", &a);

    ctrd.kill9();
    // While containerd is down: Describe answers from memory; calls that need containerd fail
    // with UNAVAILABLE rather than hanging.
    let desc = describe(&mut c, &a).await;
    assert_eq!(desc.status, SandboxStatus::Ready as i32);
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        exec(&mut c, exec_req(&a, "true", &[])),
    )
    .await
    .expect("an exec hung while containerd was down");
    // Through the in-sandbox agent an exec needs no containerd; through containerd it is
    // UNAVAILABLE.
    match r {
        Ok(o) => {
            eprintln!("CTRD exec while down: exit {}", o.code());
            assert_eq!(o.code(), 0, "{o:?}");
        }
        Err(st) => {
            eprintln!("CTRD exec while down: {st:?}");
            assert_eq!(st.code(), Code::Unavailable, "{st:?}");
        }
    }
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        c.create_sandbox(create_req("t", "during")),
    )
    .await
    .expect("a create hung while containerd was down");
    assert_eq!(r.unwrap_err().code(), Code::Unavailable);

    ctrd.spawn();
    // The sandboxes survived (same sentry, same processes inside) and the daemon serves again.
    assert_eq!(pids_of("runsc-sandbox", &a), sentry_a);
    for id in [&a, &b] {
        let desc = describe(&mut c, id).await;
        assert_eq!(
            desc.status,
            SandboxStatus::Ready as i32,
            "{}",
            desc.failure_reason
        );
    }
    assert_eq!(sh(&mut c, &a, "cat /workspace/state.txt").await, "before\n");
    assert_eq!(
        sh(&mut c, &b, "kill -0 $(cat /workspace/pid) && echo alive").await,
        "alive\n"
    );
    let n = ready_sandbox(&mut c, create_req("t", "after")).await;
    assert_eq!(sh(&mut c, &n, "echo new").await, "new\n");
    // The exit watch survived the restart: a sandbox dying now is noticed.
    let desc = kill_sentry(&mut c, &b).await;
    assert!(
        desc.failure_reason.contains("exited"),
        "{}",
        desc.failure_reason
    );

    let ids = BTreeSet::from([a.clone(), b.clone(), n.clone()]);
    for id in &ids {
        destroy(&mut c, id).await;
    }
    let (secs, what) = (Duration::from_secs(20), "the containerd restart test");
    assert_settled(&d, &ids, &before, secs, "CTRD", what).await;
    drop(d);
}

/// A small tmpfs, as the node's workspace partition.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("faults-disk-")
            .tempdir()
            .unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a filler file beside the state directory until the filesystem is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let p = self.path().join("filler");
        let mut f = std::fs::File::create(&p).unwrap();
        let chunk = vec![0xa5u8; 1 << 16];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        let _ = f.sync_all();
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn workspace_dirs(d: &Daemon) -> BTreeSet<String> {
    std::fs::read_dir(d.state_dir().join("workspaces"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn with_class(tenant: &str, session: &str, class: &str, size: &str) -> pb::CreateSandboxRequest {
    with_workspace(create_req(tenant, session), class, size, "")
}

/// Sets `key = value` in the daemon's config file (replacing an earlier line of that key).
fn set_config(d: &Daemon, key: &str, value: &str) {
    let text = std::fs::read_to_string(&d.config).unwrap();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with(&format!("{key} =")))
        .map(String::from)
        .collect();
    lines.insert(0, format!("{key} = {value}"));
    std::fs::write(&d.config, lines.join("\n") + "\n").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_workspace_disk_refuses_new_data_and_leaves_nothing_half_made() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    let disk = Tmpfs::mount("160m");
    let mut d = start_with(
        "diskfull",
        "min_free_disk = \"16Mi\"",
        Options {
            state_dir: Some(disk.path().join("state")),
            ..Default::default()
        },
    );
    let before = Census::take(&d, &BTreeSet::new());
    let mut c = d.client().await;
    let a = ready_sandbox(&mut c, with_class("t", "dir", "local", "8Mi")).await;
    let b = ready_sandbox(&mut c, with_class("t", "loop", "standard", "32Mi")).await;
    for id in [&a, &b] {
        write_file(&mut c, id, "kept.txt", b"kept\n").await;
    }
    let ids = BTreeSet::from([a.clone(), b.clone()]);
    let dirs = workspace_dirs(&d);
    let filler = disk.fill();

    // With a reserve (min_free_disk): refused before anything is written.
    for class in ["standard", "local"] {
        let st = c
            .create_sandbox(with_class("t", &format!("full-{class}"), class, "16Mi"))
            .await
            .unwrap_err();
        assert_eq!(st.code(), Code::ResourceExhausted, "{class}: {st:?}");
    }
    for id in [&a, &b] {
        let st = try_write_file(&mut c, id, "new.txt", b"x")
            .await
            .unwrap_err();
        assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
        let st = try_write_file(&mut c, id, "kept.txt", b"overwritten\n")
            .await
            .unwrap_err();
        assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
        assert_eq!(read(&mut c, id, "kept.txt").await, b"kept\n");
    }
    assert_eq!(workspace_dirs(&d), dirs, "no workspace half-made");
    assert_eq!(d.ctr(&["containers", "ls", "-q"]).lines().count(), 2);

    // Without a reserve the disk itself says no: mkfs and write(2) get ENOSPC.
    d.kill9();
    set_config(&d, "min_free_disk", "\"0\"");
    d.spawn();
    let mut c = d.client().await;
    let st = c
        .create_sandbox(with_class("t", "full-enospc", "standard", "16Mi"))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert!(
        !st.message().contains(&*disk.path().to_string_lossy()),
        "no host paths: {st:?}"
    );
    let st = try_write_file(&mut c, &a, "kept.txt", vec![1u8; 1 << 20])
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert_eq!(read(&mut c, &a, "kept.txt").await, b"kept\n");
    let leftovers: Vec<_> =
        std::fs::read_dir(d.state_dir().join("workspaces").join(&a).join("data"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
    assert_eq!(leftovers, vec!["kept.txt".to_string()], "no temp file left");
    // Inside, the sandbox gets ENOSPC and stays READY.
    let o = exec(
        &mut c,
        exec_req(
            &a,
            "sh",
            &["-c", "head -c 1048576 /dev/zero > /workspace/big"],
        ),
    )
    .await
    .unwrap();
    assert_ne!(o.code(), 0, "a write inside a full disk fails");
    let desc = describe(&mut c, &a).await;
    assert_eq!(desc.status, SandboxStatus::Ready as i32);
    assert_eq!(workspace_dirs(&d), dirs, "no workspace half-made");
    assert_eq!(d.ctr(&["containers", "ls", "-q"]).lines().count(), 2);
    let census = Census::take(&d, &ids);
    assert_eq!(
        census.loops.len(),
        1,
        "only b's loop device: {:?}",
        census.loops
    );

    // Space again: everything works.
    std::fs::remove_file(&filler).unwrap();
    sh(&mut c, &a, "rm -f /workspace/big").await;
    write_file(&mut c, &a, "new.txt", b"new\n").await;
    write_file(&mut c, &b, "new.txt", b"new\n").await;
    assert_eq!(
        sh(&mut c, &b, "cat /workspace/kept.txt /workspace/new.txt").await,
        "kept\nnew\n"
    );
    let n = ready_sandbox(&mut c, with_class("t", "again", "standard", "16Mi")).await;
    let mut all = ids.clone();
    all.insert(n.clone());
    for id in &all {
        destroy(&mut c, id).await;
    }
    let (secs, what) = (Duration::from_secs(20), "the full disk test");
    assert_settled(&d, &all, &before, secs, "DISK", what).await;
    drop(d);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_loop_device_left_is_resource_exhausted() {
    need!();
    let _alone = ONE_AT_A_TIME.lock().await;
    let d = start("loopcap", "max_loop_volumes = 2");
    let before = Census::take(&d, &BTreeSet::new());
    let mut c = d.client().await;
    let a = ready_sandbox(&mut c, with_class("t", "a", "standard", "16Mi")).await;
    let b = ready_sandbox(&mut c, with_class("t", "b", "standard", "16Mi")).await;
    let dirs = workspace_dirs(&d);
    let st = c
        .create_sandbox(with_class("t", "c", "standard", "16Mi"))
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert!(st.message().contains("loop"), "{st:?}");
    assert_eq!(workspace_dirs(&d), dirs, "no workspace half-made");
    assert_eq!(d.ctr(&["containers", "ls", "-q"]).lines().count(), 2);
    // A class without loop devices is still served.
    let l = ready_sandbox(&mut c, with_class("t", "l", "local", "16Mi")).await;
    // A destroyed sandbox gives its loop device back.
    destroy(&mut c, &a).await;
    let n = ready_sandbox(&mut c, with_class("t", "c", "standard", "16Mi")).await;
    assert_eq!(
        sh(&mut c, &n, "echo ok > /workspace/x; cat /workspace/x").await,
        "ok\n"
    );
    let all = BTreeSet::from([a.clone(), b.clone(), l.clone(), n.clone()]);
    for id in [&b, &l, &n] {
        destroy(&mut c, id).await;
    }
    let (secs, what) = (Duration::from_secs(20), "the loop device test");
    assert_settled(&d, &all, &before, secs, "LOOP", what).await;
}
