//! The per-sandbox meter: turns cgroup and disk counters into per-exec, cumulative and lifetime
//! usage.
//!
//! Every tick reads the counters once and splits the deltas since the previous tick equally
//! among the execs running during it; deltas while no exec runs belong to the sandbox alone.
//! So the per-exec numbers of a sandbox never add up to more than its total. Memory is sampled
//! on the same ticks: the sandbox's peak and time-weighted average working set over its
//! lifetime, and per exec the peak and average of what the sandbox held *above* its level when
//! the exec started (what the exec added: a `true` right after a 256 MiB job reports a small
//! peak even while gVisor is still returning that memory to the host).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::disk::{self, DiskSource};
use super::{MemoryWindow, SandboxCgroup, Usage};

/// What survives a daemon restart (kept in the sandbox's container labels).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Persisted {
    /// Lifetime peak working set.
    pub peak: u64,
    /// Σ working set × µs, for the lifetime average.
    pub weighted: u128,
    /// µs covered by `weighted`.
    pub span_us: u128,
    /// Added to the device's read counter to give the lifetime figure: minus what the device
    /// had counted before the sandbox (mkfs and mount), plus what an earlier device counted
    /// before a reattach.
    pub disk_read_base: i64,
    /// Likewise for writes.
    pub disk_write_base: i64,
    /// Highest lifetime CPU reported, in ns (monotonic guard).
    pub cpu_ns: u64,
    /// Highest lifetime disk bytes reported (monotonic guard).
    pub disk_read: u64,
    /// Likewise for writes.
    pub disk_write: u64,
    /// The cgroup's CPU counter when usage started (non-zero for a claimed warm-pool member,
    /// whose cgroup ran before its tenant got it; negative after a resume, whose new cgroup
    /// counts from zero again).
    #[serde(default)]
    pub cpu_base: i64,
    /// Highest lifetime network egress bytes reported (monotonic guard).
    #[serde(default)]
    pub net_egress: u64,
    /// Likewise for ingress.
    #[serde(default)]
    pub net_ingress: u64,
    /// Added to the veth's egress counter to give the lifetime figure (what an earlier veth
    /// counted, for a sandbox whose veth was made again).
    #[serde(default)]
    pub net_egress_base: i64,
    /// Likewise for ingress.
    #[serde(default)]
    pub net_ingress_base: i64,
}

#[derive(Debug, Clone, Copy)]
struct Raw {
    cpu_ns: u64,
    ws: u64,
    read: u64,
    write: u64,
    /// The veth's IP-layer bytes (egress, ingress), if the sandbox has a network.
    net: Option<(u64, u64)>,
}

#[derive(Debug)]
struct ExecAcc {
    cpu_ns: u64,
    read: u64,
    write: u64,
    net_out: u64,
    net_in: u64,
    start_ws: u64,
    mem: MemoryWindow,
    /// Bytes the sandbox's host processes had dirtied when the exec began.
    dirtied: Option<u64>,
}

#[derive(Debug)]
struct State {
    last: Option<Raw>,
    lifetime_mem: Option<MemoryWindow>,
    persisted: Persisted,
    execs: HashMap<u64, ExecAcc>,
    next_id: u64,
}

/// The meter of one sandbox. Methods block (file reads): call them off the async runtime.
#[derive(Debug)]
pub struct Meter {
    cg: SandboxCgroup,
    /// The sandbox's host-side veth (its rx is the sandbox's egress).
    net: Option<String>,
    data_dirs: Vec<PathBuf>,
    disk: Mutex<Option<DiskSource>>,
    state: Mutex<State>,
}

impl Meter {
    /// A meter over the sandbox's cgroup and its workspace mounted at `data_dirs[0]` (and its
    /// extra mounts at the rest), continuing from `persisted`.
    pub fn new(cg: SandboxCgroup, data_dirs: Vec<PathBuf>, persisted: Persisted) -> Self {
        Self {
            cg,
            net: None,
            data_dirs,
            disk: Mutex::new(None),
            state: Mutex::new(State {
                last: None,
                lifetime_mem: None,
                persisted,
                execs: HashMap::new(),
                next_id: 0,
            }),
        }
    }

    /// This meter also counting the network bytes of host-side veth `iface`.
    pub fn with_network(mut self, iface: Option<String>) -> Self {
        self.net = iface;
        self
    }

    /// Network usage goes on from what was counted so far over a new veth (made again
    /// after a crash: its counters start from zero).
    pub fn rebase_net(&self) {
        let now = self.read_net(true);
        let mut st = self.lock();
        let p = &mut st.persisted;
        let (o, i) = now.unwrap_or((0, 0));
        p.net_egress_base = p.net_egress as i64 - o as i64;
        p.net_ingress_base = p.net_ingress as i64 - i as i64;
        if let Some(last) = st.last.as_mut() {
            last.net = now;
        }
    }

    /// The veth's bytes: `fresh`, read now; else a reading at most a few ms old (the periodic
    /// tick reads every sandbox's veth and shares one read of `/proc/net/dev`).
    fn read_net(&self, fresh: bool) -> Option<(u64, u64)> {
        let iface = self.net.as_deref()?;
        if fresh {
            crate::egress::veth_bytes_now(iface)
        } else {
            crate::egress::veth_bytes(iface)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn disk_source(&self) -> DiskSource {
        let mut d = self.disk.lock().unwrap_or_else(|p| p.into_inner());
        d.get_or_insert_with(|| DiskSource::for_workspace(&self.data_dirs, &self.cg))
            .clone()
    }

    /// The counters now (the network's as [`Self::read_net`] reads them with `fresh`).
    fn read_raw_with(&self, fresh: bool) -> Option<Raw> {
        let cpu_ns = self.cg.cpu_ns().ok()?;
        let ws = self.cg.working_set().ok()?;
        let (read, write) = self.disk_source().read().unwrap_or((0, 0));
        Some(Raw {
            cpu_ns,
            ws,
            read,
            write,
            net: self.read_net(fresh),
        })
    }

    /// The counters now, every one read fresh: what a usage receipt, a Get or the final
    /// reading at destroy reports must include the bytes of the last milliseconds.
    fn read_raw(&self) -> Option<Raw> {
        self.read_raw_with(true)
    }

    /// Reads the counters and accounts the deltas since the last tick. Returns the current
    /// working set (None when the cgroup is gone).
    pub fn tick(&self) -> Option<u64> {
        let raw = self.read_raw_with(false)?;
        let mut st = self.lock();
        self.account(&mut st, raw);
        Some(raw.ws)
    }

    fn account(&self, st: &mut State, mut raw: Raw) {
        // A veth that could not be read this time keeps its last reading (no delta twice).
        if raw.net.is_none() {
            raw.net = st.last.and_then(|l| l.net);
        }
        if let Some(last) = st.last {
            let (d_out, d_in) = match (last.net, raw.net) {
                (Some(a), Some(b)) => (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)),
                _ => (0, 0),
            };
            let n = st.execs.len() as u64;
            let share = |d: u64| d.checked_div(n).unwrap_or(0);
            let d_cpu = share(raw.cpu_ns.saturating_sub(last.cpu_ns));
            let d_r = share(raw.read.saturating_sub(last.read));
            let d_w = share(raw.write.saturating_sub(last.write));
            // Bytes are not shared out: each exec running then saw them all (a network is
            // the sandbox's, not one process's).
            for acc in st.execs.values_mut() {
                acc.cpu_ns += d_cpu;
                acc.read += d_r;
                acc.write += d_w;
                acc.net_out += d_out;
                acc.net_in += d_in;
            }
        }
        for acc in st.execs.values_mut() {
            acc.mem.add(raw.ws.saturating_sub(acc.start_ws));
        }
        match st.lifetime_mem.as_mut() {
            Some(w) => w.add(raw.ws),
            None => st.lifetime_mem = Some(MemoryWindow::new(raw.ws)),
        }
        st.persisted.peak = st.persisted.peak.max(raw.ws);
        st.last = Some(raw);
    }

    /// Bytes of page cache the sandbox's host processes (sentry, gofer) have dirtied so far
    /// (procfs `write_bytes`, counted when a page is dirtied, not when it is written back).
    fn dirtied(&self) -> Option<u64> {
        let mut w = 0;
        for pid in self.cg.procs().ok()? {
            if let Ok(io) = procfs::process::Process::new(pid).and_then(|p| p.io()) {
                w += io.write_bytes;
            }
        }
        Some(w)
    }

    /// Starts metering an exec; returns its handle and the sandbox's working set now (None
    /// when the cgroup could not be read).
    pub fn begin_exec(&self) -> (u64, Option<u64>) {
        let dirtied = self
            .disk_source()
            .needs_flush()
            .then(|| self.dirtied())
            .flatten();
        let raw = self.read_raw();
        let now_ws = raw.as_ref().map(|r| r.ws);
        let mut st = self.lock();
        if let Some(raw) = raw {
            self.account(&mut st, raw);
        }
        let start_ws = st.last.map(|r| r.ws).unwrap_or(0);
        let id = st.next_id;
        st.next_id += 1;
        st.execs.insert(
            id,
            ExecAcc {
                cpu_ns: 0,
                read: 0,
                write: 0,
                net_out: 0,
                net_in: 0,
                start_ws,
                mem: MemoryWindow::new(0),
                dirtied,
            },
        );
        (id, now_ws)
    }

    /// Ends an exec: flushes the workspace if the sandbox dirtied pages meanwhile (so that its
    /// writes are counted; a flush costs ~4 ms even when there is nothing to write), takes a
    /// last tick and returns the exec's usage.
    pub fn end_exec(&self, id: u64) -> Usage {
        if self.disk_source().needs_flush() {
            let before = self.lock().execs.get(&id).and_then(|a| a.dirtied);
            let wrote = match (before, self.dirtied()) {
                (Some(a), Some(b)) => a != b,
                _ => true,
            };
            if wrote {
                self.flush_disk();
            }
        }
        let raw = self.read_raw();
        let mut st = self.lock();
        if let Some(raw) = raw {
            self.account(&mut st, raw);
        }
        let Some(acc) = st.execs.remove(&id) else {
            return Usage::default();
        };
        Usage {
            cpu_ms: acc.cpu_ns / 1_000_000,
            memory_peak_bytes: acc.mem.peak(),
            memory_avg_bytes: acc.mem.average(),
            disk_read_bytes: acc.read,
            disk_write_bytes: acc.write,
            network_egress_bytes: acc.net_out,
            network_ingress_bytes: acc.net_in,
        }
    }

    /// Cumulative usage since the sandbox was created. Never goes backwards.
    pub fn lifetime(&self) -> Usage {
        let raw = self.read_raw();
        let mut st = self.lock();
        if let Some(raw) = raw {
            self.account(&mut st, raw);
        }
        let last = st.last;
        let p = &mut st.persisted;
        if let Some(raw) = last {
            p.cpu_ns = p.cpu_ns.max((raw.cpu_ns as i64 - p.cpu_base).max(0) as u64);
            let add = |base: i64, v: u64| (base + v as i64).max(0) as u64;
            p.disk_read = p.disk_read.max(add(p.disk_read_base, raw.read));
            p.disk_write = p.disk_write.max(add(p.disk_write_base, raw.write));
            if let Some((o, i)) = raw.net {
                p.net_egress = p.net_egress.max(add(p.net_egress_base, o));
                p.net_ingress = p.net_ingress.max(add(p.net_ingress_base, i));
            }
        }
        let p = st.persisted;
        let (weighted, span) = match &st.lifetime_mem {
            Some(w) => {
                let (a, b) = w.parts();
                (p.weighted + a, p.span_us + b)
            }
            None => (p.weighted, p.span_us),
        };
        let avg = weighted
            .checked_div(span)
            .map_or_else(|| st.last.map(|r| r.ws).unwrap_or(0), |v| v as u64);
        Usage {
            cpu_ms: p.cpu_ns / 1_000_000,
            memory_peak_bytes: p.peak,
            memory_avg_bytes: avg,
            disk_read_bytes: p.disk_read,
            disk_write_bytes: p.disk_write,
            network_egress_bytes: p.net_egress,
            network_ingress_bytes: p.net_ingress,
        }
    }

    /// The state to persist (lifetime() first, for fresh numbers).
    pub fn persisted(&self) -> Persisted {
        let _ = self.lifetime();
        let st = self.lock();
        let mut p = st.persisted;
        if let Some(w) = &st.lifetime_mem {
            let (a, b) = w.parts();
            p.weighted += a;
            p.span_us += b;
        }
        p
    }

    /// Starts usage over from zero at the counters' current values (a warm-pool member is
    /// claimed: what it used while waiting is not its tenant's).
    pub fn reset(&self) {
        let raw = self.read_raw();
        let mut st = self.lock();
        st.persisted = Persisted {
            cpu_base: raw.map_or(0, |r| r.cpu_ns as i64),
            // Same device: its counters now are the zero point.
            disk_read_base: -(raw.map_or(0, |r| r.read) as i64),
            disk_write_base: -(raw.map_or(0, |r| r.write) as i64),
            net_egress_base: -(raw.and_then(|r| r.net).map_or(0, |n| n.0) as i64),
            net_ingress_base: -(raw.and_then(|r| r.net).map_or(0, |n| n.1) as i64),
            ..Default::default()
        };
        st.lifetime_mem = None;
        st.last = raw;
    }

    /// The sandbox is being suspended: takes the last reading of its cgroup (the caller
    /// flushed the workspace first) and closes the lifetime memory window, so that nothing
    /// is counted while it holds no memory. Returns the state to persist.
    pub fn suspend(&self) -> Persisted {
        let p = self.persisted();
        let mut st = self.lock();
        st.persisted = p;
        st.lifetime_mem = None;
        st.last = None;
        p
    }

    /// The sandbox runs again in a new cgroup after `away` suspended: its CPU counter starts
    /// over, so the lifetime figure continues from what was banked; the time away counts in
    /// the lifetime memory average as time holding nothing.
    pub fn resumed(&self, away: std::time::Duration) {
        let raw = self.read_raw();
        let mut st = self.lock();
        let cpu_now = raw.map_or(0, |r| r.cpu_ns) as i64;
        st.persisted.cpu_base = cpu_now - st.persisted.cpu_ns as i64;
        st.persisted.span_us += away.as_micros();
        st.lifetime_mem = None;
        st.last = None;
        if let Some(raw) = raw {
            self.account(&mut st, raw);
        }
    }

    /// Flushes the workspace and its extra mounts to their devices (so that the writes so far
    /// are counted).
    pub fn flush_disk(&self) {
        for dir in &self.data_dirs {
            let _ = disk::flush(dir);
        }
    }

    /// The workspace's device was attached anew (a new sandbox, or a reattach after a
    /// reboot): its counters hold what mkfs and mount did, or restarted. Carry the lifetime
    /// figures so far onto the device's current counters.
    pub fn rebase_disk(&self) {
        *self.disk.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let (r, w) = self.disk_source().read().unwrap_or((0, 0));
        let mut st = self.lock();
        st.persisted.disk_read_base = st.persisted.disk_read as i64 - r as i64;
        st.persisted.disk_write_base = st.persisted.disk_write as i64 - w as i64;
        if let Some(last) = st.last.as_mut() {
            last.read = r;
            last.write = w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metering::fake::{Counters, FakeTree};
    use crate::metering::CgroupVersion;
    use std::path::Path;

    struct Fake {
        tree: FakeTree,
    }

    impl Fake {
        fn new() -> Self {
            let tree = FakeTree::new(CgroupVersion::V1);
            tree.add("/compute/x");
            Fake { tree }
        }
        fn set(&self, cpu_ns: u64, mem: u64) {
            let c = Counters {
                cpu_ns,
                usage: mem,
                inactive: 0,
                peak: mem,
            };
            self.tree.set("/compute/x", c);
        }
        fn meter(&self, p: Persisted) -> Meter {
            let cg = SandboxCgroup::new(self.tree.root(), CgroupVersion::V1, "/compute/x");
            Meter::new(cg, vec![Path::new("/nonexistent").into()], p)
        }
    }

    #[test]
    fn concurrent_execs_split_the_window_and_never_exceed_the_total() {
        let f = Fake::new();
        let m = f.meter(Persisted::default());
        f.set(10_000_000, 100);
        m.tick();
        let (a, _) = m.begin_exec();
        f.set(30_000_000, 200); // 20 ms while only `a` runs
        let (b, _) = m.begin_exec();
        f.set(70_000_000, 500); // 40 ms shared by a and b
        let ua = m.end_exec(a);
        f.set(80_000_000, 100); // 10 ms for b alone
        let ub = m.end_exec(b);
        f.set(95_000_000, 100); // 15 ms idle: nobody's
        let life = m.lifetime();
        assert_eq!(ua.cpu_ms, 40);
        assert_eq!(ub.cpu_ms, 30);
        assert!(ua.cpu_ms + ub.cpu_ms <= life.cpu_ms);
        assert_eq!(life.cpu_ms, 95);
        // Memory per exec is what it added above its start.
        assert_eq!(ua.memory_peak_bytes, 400);
        assert_eq!(ub.memory_peak_bytes, 300);
        assert_eq!(life.memory_peak_bytes, 500);
    }

    #[test]
    fn lifetime_never_goes_backwards_and_continues_from_persisted() {
        let f = Fake::new();
        let m = f.meter(Persisted {
            peak: 1000,
            cpu_ns: 50_000_000,
            ..Default::default()
        });
        f.set(20_000_000, 10);
        let u = m.lifetime();
        assert_eq!(
            u.cpu_ms, 50,
            "a counter behind the persisted value does not go back"
        );
        assert_eq!(u.memory_peak_bytes, 1000);
        f.set(60_000_000, 10);
        assert_eq!(m.lifetime().cpu_ms, 60);
        let p = m.persisted();
        assert_eq!(p.cpu_ns, 60_000_000);
        assert!(p.span_us > 0 || p.weighted == 0);
    }

    #[test]
    fn reset_starts_usage_from_zero_and_survives_persistence() {
        let f = Fake::new();
        let m = f.meter(Persisted::default());
        f.set(700_000_000, 5000);
        assert_eq!(m.lifetime().cpu_ms, 700);
        m.reset();
        let u = m.lifetime();
        assert_eq!(u.cpu_ms, 0);
        assert_eq!(u.disk_read_bytes + u.disk_write_bytes, 0);
        f.set(730_000_000, 5000);
        assert_eq!(m.lifetime().cpu_ms, 30);
        // A restarted daemon continues from the labels with the same base.
        let p = m.persisted();
        assert_eq!(p.cpu_base, 700_000_000);
        let json = serde_json::to_string(&p).unwrap();
        let m2 = f.meter(serde_json::from_str(&json).unwrap());
        f.set(750_000_000, 5000);
        assert_eq!(m2.lifetime().cpu_ms, 50);
        // Labels written before cpu_base existed still parse.
        let old: Persisted = serde_json::from_str(
            r#"{"peak":1,"weighted":0,"span_us":0,"disk_read_base":0,"disk_write_base":0,"cpu_ns":5,"disk_read":0,"disk_write":0}"#,
        )
        .unwrap();
        assert_eq!(old.cpu_base, 0);
    }

    #[test]
    fn a_suspend_banks_the_cpu_and_a_resume_continues_on_a_new_counter() {
        let f = Fake::new();
        let m = f.meter(Persisted::default());
        f.set(900_000_000, 1 << 20);
        assert_eq!(m.lifetime().cpu_ms, 900);
        let banked = m.suspend();
        assert_eq!(banked.cpu_ns, 900_000_000);
        // Suspended: the cgroup is gone; nothing moves, nothing goes backwards.
        let _ = std::fs::remove_dir_all(f.tree.root().join("cpuacct/compute/x"));
        let _ = std::fs::remove_dir_all(f.tree.root().join("memory/compute/x"));
        assert_eq!(m.lifetime().cpu_ms, 900);
        // Restored into a new cgroup counting from a small value.
        f.tree.add("/compute/x");
        f.set(20_000_000, 1 << 20);
        m.resumed(std::time::Duration::from_secs(10));
        assert_eq!(
            m.lifetime().cpu_ms,
            900,
            "the restore's own CPU is not the tenant's"
        );
        f.set(70_000_000, 1 << 20);
        assert_eq!(m.lifetime().cpu_ms, 950);
        // The ten seconds away count as holding nothing in the lifetime average.
        let p = m.persisted();
        assert!(p.span_us >= 10_000_000, "{p:?}");
        assert!(m.lifetime().memory_avg_bytes < 1 << 20);
        // And a restarted daemon continues from the labels.
        let json = serde_json::to_string(&p).unwrap();
        let m2 = f.meter(serde_json::from_str(&json).unwrap());
        f.set(100_000_000, 1 << 20);
        assert_eq!(m2.lifetime().cpu_ms, 980);
    }
}
