//! Suspend and resume that keep memory (issue 19), against real containerd + runsc: a
//! compute.v1 sandbox idle-suspended and resumed transparently by its next exec and file call
//! (a background process and its memory go on), metering across it, and the operator's view.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::*;

/// `computectl ls -o json` entry of `id`.
fn ls_entry(d: &Daemon, id: &str) -> serde_json::Value {
    let o = d.computectl(&["ls", "-o", "json"]);
    assert_success(&o, "computectl ls");
    let all: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|s| s["sandbox_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not in ls: {all}"))
}

/// Waits until computectl shows `id` in `status`.
fn wait_status(d: &Daemon, id: &str, status: &str, within: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let e = ls_entry(d, id);
        if e["status"] == status {
            return e;
        }
        assert!(
            t0.elapsed() < within,
            "{id} never became {status}: {e}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Processes on the host that belong to sandbox `id` (its sentry, gofer, shim and the agent's
/// FIFO holder).
fn host_processes(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(id) {
            found.push(cmd);
        }
    }
    found
}

/// The checkpoint of `id` is removed soon after a resume answers (the daemon removes it in
/// the background, holding the sandbox's operation lock, so READY is published first).
fn checkpoint_goes(d: &Daemon, id: &str, when: &str) {
    let t0 = Instant::now();
    while checkpoint_dir(d, id).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{when}: checkpoint left after resume: {}",
            checkpoint_dir(d, id).display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The background program: holds 100 MiB and writes `pid count` to /tmp/bg every 100 ms.
const BG: &str = r#"
import os, time
x = bytearray(100 << 20)
for j in range(0, len(x), 4096):
    x[j] = 7
n = 0
while True:
    n += 1
    with open('/tmp/bg.tmp', 'w') as f:
        f.write('%d %d %d' % (os.getpid(), n, sum(x[::4096])))
    os.replace('/tmp/bg.tmp', '/tmp/bg')
    time.sleep(0.1)
"#;

/// (pid, count, checksum) the background program last wrote.
async fn bg_state(c: &mut Client, id: &str) -> (u32, u64, u64) {
    let o = exec(c, exec_req(id, "cat", &["/tmp/bg"])).await.unwrap();
    assert_eq!(o.code(), 0, "{:?}", o.out());
    let v: Vec<u64> = o
        .out()
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    (v[0] as u32, v[1], v[2])
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_compute_v1_sandbox_is_suspended_and_resumed_transparently_with_its_memory() {
    need!();
    let (d, mut c, id) = start_sandbox(
        "suspend-v1",
        "idle_suspend_secs = 3\nidle_check_ms = 200\nmeter_interval_ms = 200\n",
    )
    .await;
    wait_agent(&d).await;
    write_file(&mut c, &id, "bg.py", BG).await;
    let o = exec(
        &mut c,
        exec_req(
            &id,
            "sh",
            &[
                "-c",
                "setsid python3 /workspace/bg.py </dev/null >/dev/null 2>&1 &",
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(o.code(), 0);
    // The program is up and has touched its 100 MiB (25600 pages of 7).
    let t0 = Instant::now();
    let before = loop {
        if let Ok(o) = exec(&mut c, exec_req(&id, "cat", &["/tmp/bg"])).await {
            if o.code() == 0 && !o.out().is_empty() {
                break bg_state(&mut c, &id).await;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "bg never started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(before.2, 25600 * 7);
    let usage_before = describe(&mut c, &id).await.current_usage.unwrap();

    // Idle for 3 s: suspended, with nothing left running on the host but the FIFO holder.
    let e = wait_status(&d, &id, "SUSPENDED", Duration::from_secs(30));
    let ck = e["checkpoint_bytes"].as_u64().unwrap();
    assert!(ck > 0, "no checkpoint size: {e}");
    assert!(
        d.state_dir()
            .join("checkpoints")
            .join(&id)
            .join("checkpoint.img")
            .exists(),
        "no checkpoint on disk"
    );
    assert!(
        host_processes(&id).is_empty(),
        "processes left while suspended: {:?}",
        host_processes(&id)
    );
    // compute.v1 callers still see READY; usage stands still while suspended.
    let desc = describe(&mut c, &id).await;
    assert_eq!(
        desc.status,
        computed::api::compute::v1::SandboxStatus::Ready as i32
    );
    let u1 = desc.current_usage.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let u2 = describe(&mut c, &id).await.current_usage.unwrap();
    assert_eq!(u1.cpu_ms, u2.cpu_ms, "CPU counted while suspended");
    assert!(u1.cpu_ms >= usage_before.cpu_ms);

    // The next exec resumes it: the same process, its memory, its counter going on.
    let t_resume = Instant::now();
    let after = bg_state(&mut c, &id).await;
    let resume_ms = t_resume.elapsed().as_millis();
    assert_eq!(ls_entry(&d, &id)["status"], "READY");
    assert_eq!(after.0, before.0, "another process: memory was lost");
    assert!(
        after.1 >= before.1,
        "the counter went back: {before:?} → {after:?}"
    );
    assert_eq!(after.2, 25600 * 7, "its memory changed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = bg_state(&mut c, &id).await;
    assert!(
        later.1 > after.1,
        "the background process does not run after resume"
    );
    assert!(d.log_text().contains("sandbox resumed"), "{}", d.log_text());
    // Cumulative usage never decreases across it.
    let u3 = describe(&mut c, &id).await.current_usage.unwrap();
    assert!(u3.cpu_ms >= u2.cpu_ms, "{u2:?} → {u3:?}");
    assert!(u3.disk_write_bytes >= u2.disk_write_bytes);
    eprintln!("resume + exec: {resume_ms} ms, checkpoint {ck} bytes");

    // Suspended again when idle; a file call resumes it too.
    wait_status(&d, &id, "SUSPENDED", Duration::from_secs(30));
    let r = read_file(&mut c, &id, "bg.py").await;
    assert_eq!(r.data, BG.as_bytes());
    assert_eq!(ls_entry(&d, &id)["status"], "READY");
    let again = bg_state(&mut c, &id).await;
    assert_eq!(again.0, before.0);

    // Destroy removes the checkpoint.
    wait_status(&d, &id, "SUSPENDED", Duration::from_secs(30));
    destroy(&mut c, &id).await;
    assert!(!d.state_dir().join("checkpoints").join(&id).exists());
}

// ---- Issue 19's edges: restarts, broken checkpoints, many cycles, GC, refusals ----

/// `computectl ARGS -o json` (which must succeed), parsed.
fn ctl_json(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let o = d.computectl(&a);
    let out = assert_success(&o, &format!("computectl {args:?}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("computectl {args:?}: {e}: {out}"))
}

/// `computectl suspend|resume ID -o json`: its one entry.
fn ctl_one(d: &Daemon, verb: &str, id: &str) -> serde_json::Value {
    let v = ctl_json(d, &[verb, id]);
    let a = v.as_array().unwrap_or_else(|| panic!("{verb}: {v}"));
    assert_eq!(a.len(), 1, "{verb}: {v}");
    assert_eq!(a[0]["sandbox_id"], id, "{verb}: {v}");
    a[0].clone()
}

/// The `status` label containerd keeps on the sandbox's record.
fn label_status(d: &Daemon, id: &str) -> String {
    let info: serde_json::Value =
        serde_json::from_str(&d.ctr(&["containers", "info", id])).unwrap();
    info["Labels"]["compute.paper-board.io/status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Where `id`'s checkpoint is.
fn checkpoint_dir(d: &Daemon, id: &str) -> std::path::PathBuf {
    d.state_dir().join("checkpoints").join(id)
}

/// Bytes of the files under `dir` (0 when it does not exist).
fn bytes_under(dir: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Starts [`BG`] from the workspace and waits until it has written its first state.
async fn start_bg(c: &mut Client, id: &str) -> (u32, u64, u64) {
    write_file(c, id, "bg.py", BG).await;
    let o = exec(
        c,
        exec_req(
            id,
            "sh",
            &[
                "-c",
                "rm -f /tmp/bg; setsid python3 /workspace/bg.py </dev/null >/dev/null 2>&1 &",
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(o.code(), 0);
    let t0 = Instant::now();
    loop {
        let o = exec(c, exec_req(id, "cat", &["/tmp/bg"])).await.unwrap();
        if o.code() == 0 && !o.out().is_empty() {
            let s = bg_state(c, id).await;
            assert_eq!(s.2, 25600 * 7, "bg's memory: {s:?}");
            // The probe of the cold-start checks sees it.
            assert!(bg_running(c, id).await, "bg_running misses bg");
            return s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "bg never started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a process runs `bg.py` in the sandbox.
async fn bg_running(c: &mut Client, id: &str) -> bool {
    let script = "import os\nn = 0\nfor p in os.listdir('/proc'):\n    try:\n        if p.isdigit() and int(p) != os.getpid() and b'/workspace/bg' + b'.py' in open('/proc/%s/cmdline' % p, 'rb').read():\n            n += 1\n    except OSError:\n        pass\nprint(n)\n";
    let o = exec(c, exec_req(id, "python3", &["-c", script]))
        .await
        .unwrap();
    assert_eq!(
        o.code(),
        0,
        "{} {}",
        o.out(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.out().trim() != "0"
}

/// Asserts that the background program is the same process as `before`, its memory whole
/// and its counter going on; returns its state now.
async fn assert_bg_kept(
    c: &mut Client,
    id: &str,
    before: (u32, u64, u64),
    what: &str,
) -> (u32, u64, u64) {
    let now = bg_state(c, id).await;
    assert_eq!(
        now.0, before.0,
        "{what}: another process: {before:?} → {now:?}"
    );
    assert!(
        now.1 >= before.1,
        "{what}: the counter went back: {before:?} → {now:?}"
    );
    assert_eq!(now.2, 25600 * 7, "{what}: its memory changed: {now:?}");
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = bg_state(c, id).await;
        if later.1 > now.1 {
            return later;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{what}: the background process does not run: {now:?} → {later:?}"
        );
    }
}

/// Polls `ls` until `id` is in one of `settled` (at most `within`), failing at once on FAILED
/// or DESTROYED; returns the entry.
fn wait_settled(d: &Daemon, id: &str, settled: &[&str], within: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let e = ls_entry(d, id);
        let s = e["status"].as_str().unwrap_or_default().to_string();
        assert!(
            s != "FAILED" && s != "DESTROYED",
            "{id} became {s}: {e}\n{}",
            d.log_text()
        );
        if seen.last() != Some(&s) {
            seen.push(s.clone());
        }
        if settled.contains(&s.as_str()) {
            return e;
        }
        assert!(
            t0.elapsed() < within,
            "{id} never settled to {settled:?} (went {seen:?}): {e}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills the daemon `delay` after starting `computectl VERB ID` (left to fail or finish),
/// restarts it, and returns the new client.
async fn kill_during(d: &mut Daemon, verb: &str, id: &str, delay: Duration) -> Client {
    let mut child = d
        .computectl_command()
        .args([verb, id])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(delay);
    d.kill9();
    let _ = child.wait();
    eprintln!(
        "{verb} cut after {delay:?}: label {:?}, checkpoint {} bytes",
        label_status(d, id),
        bytes_under(&checkpoint_dir(d, id))
    );
    d.spawn();
    d.client().await
}

#[tokio::test(flavor = "multi_thread")]
async fn suspended_sandboxes_survive_a_daemon_restart_in_every_state() {
    need!();
    let (mut d, mut c, id) = start_sandbox("suspend-restart", "").await;
    wait_agent(&d).await;
    let mut bg = start_bg(&mut c, &id).await;

    // (a) Suspended, then the daemon is killed and restarted: still suspended, the same
    // checkpoint, and the next exec restores it with its memory.
    let s = ctl_one(&d, "suspend", &id);
    assert_eq!(s["status"], "SUSPENDED", "{s}");
    let ck = s["checkpoint_bytes"].as_u64().unwrap();
    assert!(ck > 0, "{s}");
    assert_eq!(label_status(&d, &id), "suspended");
    d.kill9();
    d.spawn();
    let mut c = d.client().await;
    let e = ls_entry(&d, &id);
    assert_eq!(e["status"], "SUSPENDED", "{e}");
    assert_eq!(e["checkpoint_bytes"].as_u64(), Some(ck), "{e}");
    assert_eq!(e["checkpoint_memory"], true, "{e}");
    assert!(host_processes(&id).is_empty(), "{:?}", host_processes(&id));
    bg = assert_bg_kept(&mut c, &id, bg, "restored after a restart").await;
    assert_eq!(ls_entry(&d, &id)["status"], "READY");
    assert_eq!(label_status(&d, &id), "ready");
    checkpoint_goes(&d, &id, "after resume");

    // (b) The daemon killed while a suspend is under way: READY or SUSPENDED after the
    // restart, never stuck or FAILED, and an exec works (with the same process if restored).
    for ms in [50, 90, 130, 150] {
        let mut c2 = kill_during(&mut d, "suspend", &id, Duration::from_millis(ms)).await;
        let e = wait_settled(&d, &id, &["READY", "SUSPENDED"], Duration::from_secs(1));
        let status = e["status"].as_str().unwrap().to_string();
        // Still so a moment later (a checkpoint finishing behind the restarted daemon's back
        // would end a task it thinks READY).
        std::thread::sleep(Duration::from_millis(1500));
        let again = ls_entry(&d, &id);
        assert_eq!(again["status"], status, "{ms} ms: {e} then {again}");
        assert_eq!(label_status(&d, &id), status.to_lowercase(), "{ms} ms");
        let memory = status == "READY" || e["checkpoint_memory"] == true;
        eprintln!("suspend cut at {ms} ms: {status}, memory kept: {memory}");
        if status == "SUSPENDED" {
            assert!(host_processes(&id).is_empty(), "{:?}", host_processes(&id));
        }
        if memory {
            bg = assert_bg_kept(&mut c2, &id, bg, &format!("suspend cut at {ms} ms")).await;
        } else {
            // A cold start: the sandbox works, its old processes are gone.
            assert!(
                !bg_running(&mut c2, &id).await,
                "{ms} ms: bg survived a cold start"
            );
            bg = start_bg(&mut c2, &id).await;
        }
        assert_eq!(ls_entry(&d, &id)["status"], "READY");
        assert_eq!(label_status(&d, &id), "ready");
        assert!(
            !checkpoint_dir(&d, &id).exists(),
            "{ms} ms: checkpoint left while READY"
        );
        c = c2;
    }

    // (c) The daemon killed while a resume is under way: finished after the restart, READY
    // with its memory.
    for ms in [50, 100, 150] {
        let s = ctl_one(&d, "suspend", &id);
        assert_eq!(s["status"], "SUSPENDED", "{s}");
        assert_eq!(s["checkpoint_memory"], true, "{s}");
        let mut c2 = kill_during(&mut d, "resume", &id, Duration::from_millis(ms)).await;
        let e = wait_settled(&d, &id, &["READY"], Duration::from_secs(60));
        assert_eq!(label_status(&d, &id), "ready", "{ms} ms: {e}");
        bg = assert_bg_kept(&mut c2, &id, bg, &format!("resume cut at {ms} ms")).await;
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(ls_entry(&d, &id)["status"], "READY", "{ms} ms");
        assert!(
            !checkpoint_dir(&d, &id).exists(),
            "{ms} ms: checkpoint left while READY"
        );
        c = c2;
    }
    let o = exec(&mut c, exec_req(&id, "true", &[])).await.unwrap();
    assert_eq!(o.code(), 0);
    destroy(&mut c, &id).await;
    assert!(!checkpoint_dir(&d, &id).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_that_cannot_be_restored_falls_back_to_a_cold_start() {
    need!();
    let (d, mut c, id) = start_sandbox("suspend-corrupt", "").await;
    wait_agent(&d).await;
    write_file(&mut c, &id, "keep.txt", "kept across cold starts").await;
    start_bg(&mut c, &id).await;

    // A garbled image: runsc cannot restore it, the sandbox starts afresh on its record.
    let s = ctl_one(&d, "suspend", &id);
    assert_eq!(s["status"], "SUSPENDED", "{s}");
    let img = checkpoint_dir(&d, &id).join("checkpoint.img");
    assert!(img.exists(), "no {}", img.display());
    std::fs::write(&img, vec![0xa5u8; 1 << 20]).unwrap();
    let r = ctl_one(&d, "resume", &id);
    let lost = r["memory_lost"].as_str().unwrap();
    assert!(!lost.is_empty(), "a garbled checkpoint restored: {r}");
    eprintln!("garbled checkpoint: memory lost: {lost}");
    assert_eq!(r["status"], "READY", "{r}");
    checkpoint_goes(&d, &id, "after resume");
    assert!(!bg_running(&mut c, &id).await, "bg survived a cold start");
    assert_eq!(sh(&mut c, &id, "echo up").await, "up\n");
    let f = read_file(&mut c, &id, "keep.txt").await;
    assert_eq!(f.data, b"kept across cold starts".as_slice());
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(ls_entry(&d, &id)["status"], "READY");
    assert_eq!(label_status(&d, &id), "ready");

    // A checkpoint another runsc wrote (an upgrade): not even tried, a cold start that says
    // which version made it.
    start_bg(&mut c, &id).await;
    let s = ctl_one(&d, "suspend", &id);
    assert_eq!(s["checkpoint_memory"], true, "{s}");
    let complete = checkpoint_dir(&d, &id).join("complete");
    let mine = std::fs::read_to_string(&complete).unwrap();
    assert!(!mine.trim().is_empty(), "an empty complete file");
    let other = "runsc version 0.0~19990101.0";
    assert!(!mine.contains("19990101"));
    std::fs::write(&complete, other).unwrap();
    let r = ctl_one(&d, "resume", &id);
    let lost = r["memory_lost"].as_str().unwrap();
    assert!(
        lost.contains("19990101"),
        "memory_lost does not name the version: {r}"
    );
    assert_eq!(r["status"], "READY", "{r}");
    assert!(!bg_running(&mut c, &id).await, "bg survived a cold start");
    let f = read_file(&mut c, &id, "keep.txt").await;
    assert_eq!(f.data, b"kept across cold starts".as_slice());
    assert_eq!(sh(&mut c, &id, "echo up").await, "up\n");
    destroy(&mut c, &id).await;
}

/// Host processes of the kinds a sandbox leaves (runsc, containerd shims, FIFO holders): all
/// of them, and those of daemon `d` (its namespace, sandbox or directory in the command line).
fn sandbox_processes(d: &Daemon, id: &str) -> (usize, Vec<String>) {
    let dir = d.dir.path().to_string_lossy().into_owned();
    let all: Vec<String> = command_lines()
        .into_iter()
        .map(|(_, cmd)| cmd)
        .filter(|cmd| {
            cmd.contains("runsc") || cmd.contains("containerd-shim") || cmd.contains("fifo-hold")
        })
        .collect();
    let total = all.len();
    let mine = all
        .into_iter()
        .filter(|cmd| cmd.contains(&d.namespace) || cmd.contains(id) || cmd.contains(&dir))
        .collect();
    (total, mine)
}

/// What a suspend/resume cycle could leak.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    processes: Vec<String>,
    mounts: usize,
    loops: usize,
    checkpoint_bytes: u64,
}

fn footprint(d: &Daemon, id: &str) -> (Footprint, usize, usize, u64) {
    let (all_procs, processes) = sandbox_processes(d, id);
    // runsc's arguments come in no fixed order from one start to the next: compare each
    // command line as its sorted words.
    let mut processes: Vec<String> = processes
        .into_iter()
        .map(|cmd| {
            let mut words: Vec<&str> = cmd.split_whitespace().collect();
            words.sort_unstable();
            words.join(" ")
        })
        .collect();
    processes.sort();
    let state = d.state_dir().to_string_lossy().into_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let all_mounts = mountinfo.lines().count();
    let mounts = mountinfo
        .lines()
        .filter(|l| l.contains(id) || l.contains(&state) || l.contains(&d.namespace))
        .count();
    let loops = loops_mentioning(&state).len();
    let free = nix::sys::statvfs::statvfs(&d.state_dir()).unwrap();
    let free = free.blocks_available() as u64 * free.fragment_size() as u64;
    (
        Footprint {
            processes,
            mounts,
            loops,
            checkpoint_bytes: bytes_under(&d.state_dir().join("checkpoints")),
        },
        all_procs,
        all_mounts,
        free,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_suspend_resume_cycles_leak_nothing() {
    need!();
    let (d, mut c, id) = start_sandbox("suspend-cycles", "").await;
    wait_agent(&d).await;
    let first = start_bg(&mut c, &id).await;
    let (before, procs0, mounts0, free0) = footprint(&d, &id);
    assert!(!before.processes.is_empty(), "no sandbox processes found");
    assert_eq!(before.checkpoint_bytes, 0);
    let all_loops0 = loops_mentioning("").len();

    let mut cycle_ms = Vec::new();
    let mut bg = first;
    for i in 0..50 {
        let t0 = Instant::now();
        let s = ctl_one(&d, "suspend", &id);
        assert_eq!(s["status"], "SUSPENDED", "cycle {i}: {s}");
        assert_eq!(s["checkpoint_memory"], true, "cycle {i}: {s}");
        if i % 2 == 0 {
            let r = ctl_one(&d, "resume", &id);
            assert_eq!(r["status"], "READY", "cycle {i}: {r}");
            assert_eq!(r["memory_lost"], "", "cycle {i}: {r}");
            cycle_ms.push(t0.elapsed().as_millis());
            let now = bg_state(&mut c, &id).await;
            assert_eq!(now.0, first.0, "cycle {i}: another process");
            bg = now;
        } else {
            // The exec resumes it transparently.
            let now = bg_state(&mut c, &id).await;
            cycle_ms.push(t0.elapsed().as_millis());
            assert_eq!(now.0, first.0, "cycle {i}: another process");
            assert!(now.1 >= bg.1, "cycle {i}: the counter went back");
            bg = now;
        }
        checkpoint_goes(&d, &id, &format!("cycle {i}"));
    }
    let last = assert_bg_kept(&mut c, &id, bg, "after 50 cycles").await;
    assert!(last.1 > first.1, "{first:?} → {last:?}");

    // Shims and holders of the last cycle may take a moment to go.
    let t0 = Instant::now();
    let (after, procs1, mounts1, free1) = loop {
        let f = footprint(&d, &id);
        if f.0 == before || t0.elapsed() > Duration::from_secs(10) {
            break f;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    cycle_ms.sort();
    eprintln!(
        "50 cycles: p50 {} ms, max {} ms; host runsc/shim/holder processes {procs0} → {procs1}, \
         mountinfo lines {mounts0} → {mounts1}, loop devices {all_loops0} → {}, free {} → {} MiB",
        cycle_ms[cycle_ms.len() / 2],
        cycle_ms[cycle_ms.len() - 1],
        loops_mentioning("").len(),
        free0 >> 20,
        free1 >> 20
    );
    assert_eq!(after, before, "a suspend/resume cycle leaks");
    // Other builds share the disk: a tolerance, far below one leaked checkpoint per cycle.
    assert!(
        free1 + (512 << 20) >= free0,
        "free disk fell from {free0} to {free1}"
    );
    destroy(&mut c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn gc_removes_checkpoints_no_sandbox_owns() {
    need!();
    let (d, mut c, id) = start_sandbox("suspend-gc", "gc_interval_secs = 0\n").await;
    wait_agent(&d).await;
    let bg = start_bg(&mut c, &id).await;
    let s = ctl_one(&d, "suspend", &id);
    assert_eq!(s["status"], "SUSPENDED", "{s}");
    let real = checkpoint_dir(&d, &id);
    let real_bytes = bytes_under(&real);
    assert!(real_bytes > 0);

    let stray_id = uuid::Uuid::new_v4().to_string();
    let stray = checkpoint_dir(&d, &stray_id);
    std::fs::create_dir_all(&stray).unwrap();
    std::fs::write(stray.join("checkpoint.img"), vec![1u8; 1 << 20]).unwrap();
    std::fs::write(stray.join("complete"), "runsc version x").unwrap();

    // A dry run names it and keeps it.
    let v = ctl_json(&d, &["gc", "--dry-run"]);
    let freed = v["freed"].as_array().unwrap().clone();
    assert!(freed.iter().any(|f| f["sandbox_id"] == stray_id), "{v}");
    assert!(stray.exists());

    let v = ctl_json(&d, &["gc"]);
    let freed = v["freed"].as_array().unwrap().clone();
    let entry = freed
        .iter()
        .find(|f| f["sandbox_id"] == stray_id)
        .unwrap_or_else(|| panic!("the stray checkpoint is not freed: {v}"));
    assert_eq!(entry["tenant_id"], "(checkpoint)", "{v}");
    assert!(entry["bytes"].as_u64().unwrap() >= 1 << 20, "{v}");
    assert!(
        !freed.iter().any(|f| f["sandbox_id"] == id),
        "GC freed a suspended sandbox's checkpoint: {v}"
    );
    assert!(!stray.exists(), "the stray checkpoint is still there");
    assert_eq!(
        bytes_under(&real),
        real_bytes,
        "the real checkpoint changed"
    );
    let e = ls_entry(&d, &id);
    assert_eq!(e["status"], "SUSPENDED", "{e}");

    // It still resumes with its memory.
    let r = ctl_one(&d, "resume", &id);
    assert_eq!(r["memory_lost"], "", "{r}");
    assert_bg_kept(&mut c, &id, bg, "after GC").await;
    destroy(&mut c, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn suspend_refuses_what_it_cannot_do() {
    need!();
    let (d, mut c, id) = start_sandbox("suspend-refuse", "").await;
    wait_agent(&d).await;

    // No such sandbox.
    let ghost = uuid::Uuid::new_v4().to_string();
    for verb in ["suspend", "resume"] {
        let o = d.computectl(&[verb, &ghost]);
        assert!(!o.status.success(), "{verb} of a missing sandbox succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("NotFound") && err.contains(&ghost),
            "{verb}: {err}"
        );
    }
    // Not a sandbox id at all.
    let o = d.computectl(&["suspend", "not-a-uuid"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("InvalidArgument"));

    // Resuming a READY sandbox: a success that kept its memory, nothing done.
    let o = d.computectl(&["resume", &id]);
    let out = assert_success(&o, "resume of a READY sandbox");
    assert!(
        out.contains("READY") && out.contains("memory kept"),
        "{out}"
    );
    let r = ctl_one(&d, "resume", &id);
    assert_eq!(
        (r["status"].as_str(), r["memory_lost"].as_str()),
        (Some("READY"), Some("")),
        "{r}"
    );

    // Suspending a SUSPENDED sandbox: a success, the same checkpoint untouched.
    let s = ctl_one(&d, "suspend", &id);
    assert_eq!(s["status"], "SUSPENDED", "{s}");
    let img = checkpoint_dir(&d, &id).join("checkpoint.img");
    let mtime = std::fs::metadata(&img).unwrap().modified().unwrap();
    let s2 = ctl_one(&d, "suspend", &id);
    assert_eq!(s2["status"], "SUSPENDED", "{s2}");
    assert_eq!(s2["checkpoint_bytes"], s["checkpoint_bytes"], "{s} → {s2}");
    assert_eq!(s2["suspended_at"], s["suspended_at"], "{s} → {s2}");
    assert_eq!(std::fs::metadata(&img).unwrap().modified().unwrap(), mtime);
    let r = ctl_one(&d, "resume", &id);
    assert_eq!(r["memory_lost"], "", "{r}");
    assert_eq!(r["status"], "READY", "{r}");

    // A destroyed sandbox can be neither.
    destroy(&mut c, &id).await;
    for verb in ["suspend", "resume"] {
        let o = d.computectl(&[verb, &id]);
        assert!(
            !o.status.success(),
            "{verb} of a destroyed sandbox succeeded"
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("FailedPrecondition"), "{verb}: {err}");
    }
    assert!(!checkpoint_dir(&d, &id).exists());
}
