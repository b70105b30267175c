//! Hostile sandboxes: what one sandbox does to exhaust the node or reach the host stays inside
//! it. Fork bomb, memory exhaustion, disk fill, a CPU hog next to another sandbox, and every
//! way out (network, the host's loopback, the daemon's socket and state).
//!
//! Real containerd + runsc, one daemon per test (see tests/common).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// A file of the sandbox's cgroup in `controller` (cgroup v1 hierarchy, else v2 unified).
fn cgroup_file(controller: &str, id: &str, v1: &str, v2: &str) -> PathBuf {
    let p = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join("compute")
        .join(id)
        .join(v1);
    if p.exists() {
        return p;
    }
    Path::new("/sys/fs/cgroup/compute").join(id).join(v2)
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The sandbox cgroup's CPU time in nanoseconds.
fn cpu_ns(id: &str) -> u64 {
    let v1 = Path::new("/sys/fs/cgroup/cpuacct/compute")
        .join(id)
        .join("cpuacct.usage");
    if v1.exists() {
        return read_u64(&v1);
    }
    let stat = std::fs::read_to_string(
        Path::new("/sys/fs/cgroup/compute")
            .join(id)
            .join("cpu.stat"),
    )
    .unwrap();
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .map(|v| v.trim().parse::<u64>().unwrap() * 1000)
        .expect("usage_usec in cpu.stat")
}

/// The `max` count of the pids cgroup's events: how often a fork was refused at the limit.
fn pids_refusals(id: &str) -> u64 {
    let p = cgroup_file("pids", id, "pids.events", "pids.events");
    std::fs::read_to_string(&p)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// DestroySandbox, after which nothing of the sandbox is left (see [`assert_no_leftovers`]).
async fn destroy_clean(c: &mut Client, d: &Daemon, id: &str) {
    destroy(c, id).await;
    assert_no_leftovers(d, id).await;
}

/// After DestroySandbox: no process, cgroup, containerd task or container, or mount is left.
async fn assert_no_leftovers(d: &Daemon, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let procs = processes_mentioning(id);
        let cgroups = cgroups_of(id);
        let tasks = d.ctr(&["tasks", "ls", "-q"]);
        let containers = d.ctr(&["containers", "ls", "-q"]);
        let mounts = mounts_mentioning(id);
        let clean = procs.is_empty()
            && cgroups.is_empty()
            && !tasks.contains(id)
            && !containers.contains(id)
            && mounts.is_empty();
        if clean {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "leftovers of {id}: processes {procs:?} cgroups {cgroups:?} tasks {tasks:?} \
             containers {containers:?} mounts {mounts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_hits_the_pids_limit_and_the_node_keeps_serving() {
    need!();
    let (d, mut c) = start_client("forkbomb", "pids_limit = 256").await;
    let bomb_id = ready_sandbox(&mut c, create_req("t", "bomb")).await;
    let other = ready_sandbox(&mut c, create_req("t", "bystander")).await;
    let limit = read_u64(&cgroup_file("pids", &bomb_id, "pids.max", "pids.max"));
    assert_eq!(limit, 256, "the sandbox cgroup carries pids_limit");

    // The classic bomb, in the background of an exec that then waits: every child forks two
    // more until fork fails.
    let bomb = "b() { b | b & }; b & sleep 12; echo survived";
    let mut c2 = c.clone();
    let bomb_req = timed(&bomb_id, "sh", &["-c", bomb], 20);
    let bomb_task = tokio::spawn(async move { exec(&mut c2, bomb_req).await });

    // While it runs: the pids limit holds and the other sandbox still serves execs.
    let mut peak = 0;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cur = read_u64(&cgroup_file(
            "pids",
            &bomb_id,
            "pids.current",
            "pids.current",
        ));
        peak = peak.max(cur);
        assert!(cur <= limit, "pids.current {cur} over pids.max {limit}");
        let o = exec(&mut c, timed(&other, "echo", &["alive"], 60))
            .await
            .unwrap();
        assert_eq!(
            o.out(),
            "alive\n",
            "the bystander sandbox answers during the bomb"
        );
    }
    eprintln!("peak host pids of the bombed sandbox: {peak} of {limit}");
    // The daemon itself is fine: it still creates sandboxes.
    let third = ready_sandbox(&mut c, create_req("t", "third")).await;
    assert_eq!(sh(&mut c, &third, "echo new").await, "new\n");
    destroy(&mut c, &third).await;
    // The bomb ran into the host pids limit. On the ptrace platform every guest address space
    // is a host stub process with a thread per sentry thread that ran it, so no in-sandbox
    // limit can keep a bomb under the host limit, and the sentry dies when it cannot create a
    // stub thread: the sandbox is then FAILED with a reason (or, on platforms that cope, still
    // READY). Either way the host limit held and nothing else was touched.
    let bomb_out = bomb_task.await.unwrap();
    eprintln!("bomb exec: {:?}", bomb_out.as_ref().map(|o| &o.completed));
    assert!(
        pids_refusals(&bomb_id) > 0,
        "the bomb reached the pids limit"
    );
    let desc = describe(&mut c, &bomb_id).await;
    let status = SandboxStatus::try_from(desc.status).unwrap();
    eprintln!("bombed sandbox: {status:?} {}", desc.failure_reason);
    match status {
        SandboxStatus::Failed => assert!(!desc.failure_reason.is_empty()),
        SandboxStatus::Ready => {}
        other => panic!("bombed sandbox is {other:?}"),
    }
    // The bombed sandbox can be destroyed with nothing left behind.
    destroy_clean(&mut c, &d, &bomb_id).await;
    let o = exec(&mut c, exec_req(&other, "echo", &["still"]))
        .await
        .unwrap();
    assert_eq!(o.out(), "still\n");
    destroy_clean(&mut c, &d, &other).await;
}

/// Python touching 32 MiB.
const ALLOC_32M: &str = "b = bytearray(32 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1";

#[tokio::test(flavor = "multi_thread")]
async fn memory_exhaustion_stays_in_the_sandbox() {
    need!();
    let (d, mut c) = start_client("memhog", "").await;
    let id = ready_sandbox(&mut c, with_limits(create_req("t", "memhog"), 0, 128 << 20)).await;
    let other = ready_sandbox(&mut c, create_req("t", "memok")).await;
    sh(&mut c, &id, "echo keep > /workspace/keep.txt").await;

    // Many processes each taking a little: no single one is over the limit, together they are.
    let hog = "for i in 1 2 3 4 5 6 7 8; do \
               python3 -c 'b = bytearray(40 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(60)' & \
               done; wait";
    let o = exec(&mut c, timed(&id, "sh", &["-c", hog], 60))
        .await
        .unwrap();
    let done = o.completed.unwrap();
    assert!(
        done.oom_killed && done.exit_code == 137,
        "the exec is reported OOM-killed: {done:?} stderr {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The sandbox survives and is usable; the other sandbox never noticed.
    let desc = describe(&mut c, &id).await;
    assert_eq!(
        desc.status,
        SandboxStatus::Ready as i32,
        "{}",
        desc.failure_reason
    );
    assert_eq!(sh(&mut c, &id, "cat /workspace/keep.txt").await, "keep\n");
    assert_eq!(sh(&mut c, &other, "echo fine").await, "fine\n");

    // Memory that no process holds: a tmpfs file. Killing the exec cannot free it; the exec
    // is still reported, and the sandbox is either still READY or FAILED with a reason.
    let fill = "dd if=/dev/zero of=/tmp/fill bs=1M count=1024 2>&1; sleep 30";
    let o = exec(&mut c, timed(&id, "sh", &["-c", fill], 60)).await;
    eprintln!("tmpfs fill: {o:?}");
    let desc = describe(&mut c, &id).await;
    eprintln!(
        "after tmpfs fill: {:?} {}",
        SandboxStatus::try_from(desc.status),
        desc.failure_reason
    );
    if let Ok(o) = &o {
        let done = o.completed.unwrap();
        assert!(
            done.oom_killed || desc.status == SandboxStatus::Failed as i32,
            "{done:?}"
        );
    }
    if desc.status == SandboxStatus::Failed as i32 {
        assert!(!desc.failure_reason.is_empty());
    }
    // The sandbox can free that memory itself and go on: an exec that starts over the limit
    // is killed only if it grows the sandbox further, so the image's own (dynamically
    // linked) `rm` runs, however slowly it starts.
    if desc.status == SandboxStatus::Ready as i32 {
        let o = exec(&mut c, exec_req(&id, "rm", &["-f", "/tmp/fill"]))
            .await
            .unwrap();
        let done = o.completed.unwrap();
        assert!(
            done.exit_code == 0 && !done.oom_killed,
            "rm after tmpfs fill: {done:?} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(sh(&mut c, &id, "echo recovered").await, "recovered\n");
        // Once gVisor has handed the file's memory back, a real workload fits again.
        let t0 = Instant::now();
        loop {
            let o = exec(&mut c, exec_req(&id, "python3", &["-c", ALLOC_32M]))
                .await
                .unwrap();
            let done = o.completed.unwrap();
            if done.exit_code == 0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "32 MiB still does not fit 30 s after rm: {done:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("32 MiB fits again {:?} after rm", t0.elapsed());
    }
    // The other sandbox still works.
    assert_eq!(sh(&mut c, &other, "echo fine").await, "fine\n");
    destroy_clean(&mut c, &d, &id).await;
}

/// Free bytes of the filesystem holding `p`.
fn free_bytes(p: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(p).unwrap();
    s.blocks_available() as u64 * s.fragment_size() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_fill_is_enospc_inside_only() {
    need!();
    let (d, mut c) = start_client("diskfill", "").await;
    let req = with_workspace(create_req("t", "diskfill"), "", "64Mi", "");
    let id = ready_sandbox(&mut c, req).await;
    let host_free = free_bytes(&d.state_dir());

    // The workspace volume caps the workspace: ENOSPC inside.
    let o = exec(
        &mut c,
        timed(
            &id,
            "sh",
            &["-c", "dd if=/dev/zero of=/workspace/fill bs=1M count=512"],
            120,
        ),
    )
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.code(), 0);
    assert!(err.contains("No space left on device"), "{err}");
    let size: u64 = sh(&mut c, &id, "wc -c < /workspace/fill")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(size <= 64 << 20, "{size}");
    // On the host, the volume image holds at most its cap (it is sparse; the partition's free
    // space is shared with everything else on the machine, so it is only printed).
    let img = d
        .state_dir()
        .join("workspaces")
        .join(&id)
        .join("volume.ext4");
    let allocated = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&img).unwrap()) * 512;
    eprintln!(
        "volume image {allocated} bytes; host partition lost {} bytes meanwhile",
        host_free.saturating_sub(free_bytes(&d.state_dir()))
    );
    assert!(
        allocated <= (64 << 20) + (8 << 20),
        "volume image {allocated} bytes"
    );
    // The sandbox still works and can free its space.
    sh(
        &mut c,
        &id,
        "rm /workspace/fill && echo ok > /workspace/after",
    )
    .await;
    assert_eq!(sh(&mut c, &id, "cat /workspace/after").await, "ok\n");

    // The root filesystem is not a way around the cap: what the sandbox writes to / must not
    // land in the container's rootfs on the host disk.
    let rootfs = Path::new("/run/compute/containerd/io.containerd.runtime.v2.task")
        .join(&d.namespace)
        .join(&id)
        .join("rootfs");
    assert!(
        rootfs.join("etc").exists(),
        "{} is the rootfs",
        rootfs.display()
    );
    let before = free_bytes(Path::new("/"));
    let o = exec(
        &mut c,
        timed(
            &id,
            "sh",
            &["-c", "dd if=/dev/zero of=/rootfill bs=1M count=256; sync"],
            120,
        ),
    )
    .await
    .unwrap();
    let lost = before.saturating_sub(free_bytes(Path::new("/")));
    eprintln!(
        "rootfs fill: {:?} stderr {} host lost {lost}",
        o.completed,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !rootfs.join("rootfill").exists(),
        "a write to / inside went to the host's disk"
    );
    // It went to the sandbox's memory instead, where memory_bytes caps it.
    let done = o.completed.unwrap();
    assert_eq!(done.exit_code, 0);
    assert!(
        done.usage.unwrap().memory_peak_bytes > 200 << 20,
        "{done:?}"
    );
    destroy_clean(&mut c, &d, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_hog_does_not_starve_another_sandbox() {
    need!();
    let (_d, mut c) = start_client("cpuhog", "").await;
    let hog = ready_sandbox(&mut c, with_limits(create_req("t", "hog"), 500, 0)).await;
    let victim = ready_sandbox(&mut c, create_req("t", "victim")).await;

    // Two busy loops in the hog: it would take both cores without its limit.
    let mut c2 = c.clone();
    let hog_req = timed(
        &hog,
        "sh",
        &["-c", "while :; do :; done & while :; do :; done & sleep 40"],
        40,
    );
    let hog_task = tokio::spawn(async move { exec(&mut c2, hog_req).await });
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A CPU-bound exec in the victim completes, and over its window the hog's cgroup used no
    // more than its quota (half a core) allows.
    let hog_cpu0 = cpu_ns(&hog);
    let victim_cpu0 = cpu_ns(&victim);
    let t0 = Instant::now();
    let o = exec(
        &mut c,
        timed(
            &victim,
            "python3",
            &["-c", "print(sum(i * i for i in range(15_000_000)))"],
            120,
        ),
    )
    .await
    .unwrap();
    let elapsed = t0.elapsed();
    let hog_used = cpu_ns(&hog) - hog_cpu0;
    let victim_used = cpu_ns(&victim) - victim_cpu0;
    assert_eq!(o.code(), 0);
    assert_eq!(o.out().trim(), "1124999887500002500000");
    let quota = elapsed.as_nanos() as f64 * 0.5;
    eprintln!(
        "window {elapsed:?}: hog used {} ms (quota {} ms), victim used {} ms",
        hog_used / 1_000_000,
        quota as u64 / 1_000_000,
        victim_used / 1_000_000
    );
    // One CFS period (100 ms) of slack at each end of the window.
    assert!(
        (hog_used as f64) <= quota * 1.1 + 200e6,
        "the hog used {hog_used} ns over a window where its quota allows {quota} ns"
    );
    assert!(victim_used > 0, "the victim's exec ran on its own cgroup");
    let done = o.completed.unwrap();
    assert!(done.usage.unwrap().cpu_ms > 0);
    hog_task.abort();
    destroy(&mut c, &hog).await;
    destroy(&mut c, &victim).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_network_but_loopback_and_no_way_to_the_host() {
    need!();
    let (d, mut c, id) = start_sandbox("escape", "").await;

    // Interfaces: loopback only.
    let dev = sh(&mut c, &id, "cat /proc/net/dev").await;
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "{dev}");
    let addrs = sh(&mut c, &id, "ip -o addr 2>&1 || true").await;
    eprintln!("ip -o addr inside: {addrs}");
    for l in addrs.lines().filter(|l| !l.trim().is_empty()) {
        assert!(l.contains(" lo "), "an interface other than lo: {l}");
    }

    // A listener on the host (on every address, so on its loopback too) is not reachable: the
    // sandbox's 127.0.0.1 is its own, and it has no route anywhere else.
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let host_ip = host_address();
    let probe = format!(
        "import socket\n\
         for host in ['127.0.0.1', 'localhost', '{host_ip}', '10.0.2.2', '172.17.0.1']:\n\
         \ttry:\n\
         \t\ts = socket.create_connection((host, {port}), timeout=3)\n\
         \t\tprint('CONNECTED', host)\n\
         \texcept Exception as e:\n\
         \t\tprint('refused', host, type(e).__name__)\n"
    );
    let o = exec(&mut c, exec_req(&id, "python3", &["-c", &probe]))
        .await
        .unwrap();
    eprintln!("probe: {}", o.out());
    assert_eq!(o.code(), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!o.out().contains("CONNECTED"), "{}", o.out());
    assert_eq!(o.out().lines().count(), 5, "{}", o.out());
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the host listener got a connection from inside: {other:?}"),
    }

    // The daemon's socket, state and run dirs, and containerd's socket are not inside.
    let socket = d.socket.display().to_string();
    let state = d.state_dir().display().to_string();
    let run = d.dir.path().join("run").display().to_string();
    let ctr = containerd_socket().display().to_string();
    for p in [&socket, &state, &run, &ctr, &"/run/compute".to_string()] {
        let out = sh(
            &mut c,
            &id,
            &format!("test -e '{p}' && echo VISIBLE || echo absent"),
        )
        .await;
        assert_eq!(out, "absent\n", "{p} is visible inside");
    }
    // Nor can a unix connect reach the daemon's socket path.
    let probe = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\n\
         try:\n\ts.connect('{socket}')\n\tprint('CONNECTED')\nexcept Exception as e:\n\tprint('refused', type(e).__name__)\n"
    );
    let o = exec(&mut c, exec_req(&id, "python3", &["-c", &probe]))
        .await
        .unwrap();
    assert!(o.out().starts_with("refused"), "{}", o.out());
    destroy(&mut c, &id).await;
}

/// The host's first non-loopback IPv4 address (or 127.0.0.2 if it has none).
fn host_address() -> String {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    if s.connect("192.0.2.1:9").is_ok() {
        if let Ok(a) = s.local_addr() {
            if !a.ip().is_unspecified() {
                return a.ip().to_string();
            }
        }
    }
    "127.0.0.2".into()
}
