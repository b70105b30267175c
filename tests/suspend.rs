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
