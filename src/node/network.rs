//! Sandbox networks (issue 20): a platform sandbox on a node with `[egress]` configured gets its
//! own network namespace and a veth pair (a /30 of the pool; the host side's interface is named
//! after its slot), runsc runs it with `--network=sandbox` in that namespace, and the node's
//! nft table ([`crate::egress`]) decides what it reaches: nothing but what its base policy
//! (its environment's `egress`) and its live grants open, never the node, other sandboxes or
//! the never-reachable list.
//!
//! The record: the slot is in the sandbox's platform spec (its labels), the grants in labels
//! of their own (`egress-grants-N`), so that a restart rebuilds the whole table from
//! containerd ([`Node::rebuild_network`]). The kernel's state is derived, never the record: the
//! table is replaced in one transaction at start, and a sandbox's elements are replaced in one
//! transaction at each change. Bytes are the veth's own counters (the host side's rx is the
//! sandbox's egress, tx its ingress), at the IP layer (each frame's 14-byte Ethernet header
//! taken off); they outlive a daemon restart with the veth.
//!
//! A revoked or expired grant's connections are cut: their conntrack entries go, so that their
//! next packet meets the grants again (and a TCP reset).

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{blocking, record, Error, Node, Result, Sandbox};
use crate::egress::dns::{NamePattern, Resolved};
use crate::egress::{self, Allow, Capture, Cidr, Element, Layout, Named, Proto};
use crate::platform::records::EgressPolicy;

/// The longest grant TTL (a day).
pub const MAX_GRANT_TTL_SECS: u32 = 86_400;

/// Most live grants of one sandbox.
pub const MAX_GRANTS: usize = 64;

/// A sandbox's base policy, from its platform spec (none: deny-all).
fn base_policy(sb: &Sandbox) -> EgressPolicy {
    sb.platform
        .as_ref()
        .and_then(|p| p.egress.clone())
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

/// How long a base policy lasts without a max lifetime (the platform's "egress bootstrap").
pub const DEFAULT_BOOTSTRAP_SECS: u64 = 24 * 3600;

/// Where network namespaces are bound (as `ip netns` does).
const NETNS_DIR: &str = "/run/netns";

/// One grant on top of a sandbox's base policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Its id.
    pub id: String,
    /// What it opens.
    pub policy: EgressPolicy,
    /// Milliseconds since the epoch.
    pub created_at_ms: u64,
    /// Milliseconds since the epoch; 0 = no expiry.
    #[serde(default)]
    pub expires_at_ms: u64,
    /// Why (in the audit log too).
    #[serde(default)]
    pub reason: String,
    /// The principal that granted it.
    #[serde(default)]
    pub granted_by: String,
    /// The sandbox's egress and ingress bytes when it was granted.
    #[serde(default)]
    pub bytes_at_grant: [u64; 2],
}

impl Grant {
    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }
}

/// What ended a grant, and the bytes the sandbox moved while it was active.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The grant.
    pub grant: Grant,
    /// Egress bytes while it was active.
    pub egress_bytes: u64,
    /// Ingress bytes while it was active.
    pub ingress_bytes: u64,
}

/// A sandbox's egress as it is enforced now: its base policy and its active grants.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    /// The base policy.
    pub base: EgressPolicy,
    /// The active grants (expired ones left out).
    pub grants: Vec<Grant>,
}

#[derive(Default)]
pub(super) struct Binding {
    slot: u32,
    base: EgressPolicy,
    /// When the base policy (the egress bootstrap) ends, ms since the epoch: the sandbox's
    /// max lifetime, or `[egress] bootstrap_secs` (24 h) after its creation without one.
    base_until_ms: u64,
    grants: Vec<Grant>,
    /// Addresses allowed names resolved to for this sandbox (through the capture's DNS).
    resolved: Vec<ResolvedAddr>,
    /// Connections the capture's proxy carries for it now.
    pub(super) proxied: Vec<Proxied>,
    /// What is in the kernel now.
    applied: Vec<Element>,
    applied_named: Vec<Named>,
    /// Its preview exposures (issue 21), as its labels record them.
    pub(super) exposures: Vec<super::preview::Exposure>,
}

/// An address a name resolved to, open until `expires_ms`.
#[derive(Debug, Clone)]
struct ResolvedAddr {
    name: String,
    addr: Ipv4Addr,
    expires_ms: u64,
}

/// A connection of the proxy: what it was let through for, and how to end it.
pub(super) struct Proxied {
    /// Its number.
    pub conn: u64,
    /// The name its first bytes asked for.
    pub name: String,
    /// Its destination port (80 or 443).
    pub port: u16,
    /// Its destination address.
    pub addr: Ipv4Addr,
    /// Cancelled when what is in force no longer allows it.
    pub cancel: tokio_util::sync::CancellationToken,
}

/// One rule of a sandbox's policy in force: a DNS name pattern, its ports (empty: all), its
/// transport ("" = both) and when it ends (None: with the sandbox).
struct NameRule {
    pattern: NamePattern,
    ports: Vec<u16>,
    protocol: String,
    expires_ms: Option<u64>,
}

impl Binding {
    /// Whether the base policy is still in force at `now`.
    fn base_in_force(&self, now: u64) -> bool {
        self.base_until_ms == 0 || self.base_until_ms > now
    }

    /// The name rules in force at `now`: the base policy's and every active grant's.
    fn name_rules(&self, now: u64) -> Vec<NameRule> {
        let mut out = Vec::new();
        let mut add = |p: &EgressPolicy, expires_ms: Option<u64>| {
            for r in &p.rules {
                if Cidr::parse(&r.destination).is_ok() {
                    continue;
                }
                if let Ok(pattern) = NamePattern::parse(&r.destination) {
                    out.push(NameRule {
                        pattern,
                        ports: r.ports.clone(),
                        protocol: r.protocol.clone(),
                        expires_ms,
                    });
                }
            }
        };
        if self.base_in_force(now) {
            add(&self.base, Some(self.base_until_ms));
        }
        for g in self.grants.iter().filter(|g| !g.expired(now)) {
            add(&g.policy, (g.expires_at_ms != 0).then_some(g.expires_at_ms));
        }
        out
    }

    /// Whether a name may resolve for this sandbox now.
    pub(super) fn name_allowed(&self, name: &str) -> bool {
        self.name_rules(now_ms())
            .iter()
            .any(|r| r.pattern.matches(name))
    }

    /// Whether the proxy may carry a TCP connection to `name` at `addr:port` now: a rule allows
    /// the name on that port, and the name resolved to that address for this sandbox.
    pub(super) fn proxy_allowed(&self, name: &str, port: u16, addr: Ipv4Addr) -> bool {
        let now = now_ms();
        let ruled = self.name_rules(now).iter().any(|r| {
            r.pattern.matches(name)
                && (r.ports.is_empty() || r.ports.contains(&port))
                && (r.protocol.is_empty() || r.protocol == "tcp")
        });
        ruled
            && self
                .resolved
                .iter()
                .any(|x| x.name == name && x.addr == addr && x.expires_ms > now)
    }
}

/// The node's sandbox networks.
pub(super) struct Net {
    pub layout: Layout,
    /// Where the capture listens.
    pub capture: Capture,
    /// The resolver allowed names are asked of (None: none known; such queries fail).
    pub upstream: Option<std::net::SocketAddr>,
    /// The shortest time a resolved address stays open.
    min_ttl_secs: u32,
    /// How long a base policy lasts in a sandbox without a max lifetime.
    bootstrap_secs: u64,
    /// `<run_dir>/net`: a file per networked sandbox id (what the runsc wrapper looks for),
    /// and its `/etc/hosts`.
    dir: PathBuf,
    used: Mutex<BTreeSet<u32>>,
    bindings: Mutex<HashMap<String, Binding>>,
    /// One nft transaction at a time, in the order their changes were decided.
    apply: tokio::sync::Mutex<()>,
    /// Grants that expired (namespace, sandbox id, what ended), for the audit log.
    ended_tx: tokio::sync::mpsc::UnboundedSender<(String, String, Ended)>,
    ended_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<(String, String, Ended)>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn internal(what: &str) -> impl Fn(String) -> Error + '_ {
    move |e| Error::Internal(format!("{what}: {e}"))
}

/// Runs a command; its stderr is the error.
fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> std::result::Result<String, String> {
    let mut c = Command::new(cmd);
    c.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("{cmd}: {e}"))?;
    if let (Some(input), Some(mut w)) = (stdin, child.stdin.take()) {
        w.write_all(input.as_bytes())
            .map_err(|e| format!("{cmd}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nft(script: &str) -> std::result::Result<(), String> {
    if script.is_empty() {
        return Ok(());
    }
    run("nft", &["-f", "-"], Some(script)).map(|_| ())
}

/// The allows of a policy's CIDR rules (DNS-name rules are refused before they get here).
fn allows_of(p: &EgressPolicy) -> Vec<Allow> {
    let mut out = Vec::new();
    for r in &p.rules {
        if let Ok(c) = Cidr::parse(&r.destination) {
            out.extend(Allow::of_rule(c, &r.ports, &r.protocol).unwrap_or_default());
        }
    }
    out
}

/// INVALID_ARGUMENT for a bad rule (a destination that is neither a CIDR nor a DNS name).
pub fn check_policy(p: &EgressPolicy) -> Result<()> {
    p.check()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    for r in &p.rules {
        if Cidr::parse(&r.destination).is_err() {
            NamePattern::parse(&r.destination)
                .map_err(|e| Error::InvalidArgument(format!("egress destination: {e}")))?;
        }
    }
    Ok(())
}

/// The first `nameserver` of the node's `/etc/resolv.conf`, port 53 (IPv4 or IPv6).
fn resolv_conf_nameserver() -> Option<std::net::SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("nameserver"))
            .then(|| w.next())
            .flatten()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            .map(|ip| std::net::SocketAddr::new(ip, 53))
    })
}

/// The port ranges of `ports` (empty: every port) without 80 and 443, which the capture's
/// proxy owns for names.
fn ranges_without_web(ports: &[u16]) -> Vec<(u16, u16)> {
    let mut sorted: Vec<u16> = if ports.is_empty() {
        Vec::new()
    } else {
        let mut v = ports.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut out = Vec::new();
    if sorted.is_empty() {
        out.extend([(1, 79), (81, 442), (444, u16::MAX)]);
        return out;
    }
    sorted.retain(|p| *p != 80 && *p != 443);
    for p in sorted {
        match out.last_mut() {
            Some((_, hi)) if hi.checked_add(1) == Some(p) => *hi = p,
            _ => out.push((p, p)),
        }
    }
    out
}

/// One conntrack entry's original direction: protocol, source, destination, ports.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flow {
    proto: egress::Proto,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
}

/// The flows of `conntrack -L` output (the first tuple of each line is the original one).
fn flows(listing: &str) -> Vec<Flow> {
    let mut out = Vec::new();
    for line in listing.lines() {
        let mut words = line.split_whitespace();
        let proto = match words.next() {
            Some("tcp") => egress::Proto::Tcp,
            Some("udp") => egress::Proto::Udp,
            _ => continue,
        };
        let mut dst = None;
        let mut sport = None;
        let mut dport = None;
        for w in line.split_whitespace() {
            if let Some(v) = w.strip_prefix("dst=") {
                dst = dst.or(v.parse().ok());
            } else if let Some(v) = w.strip_prefix("sport=") {
                sport = sport.or(v.parse().ok());
            } else if let Some(v) = w.strip_prefix("dport=") {
                dport = dport.or(v.parse().ok());
            }
        }
        if let (Some(dst), Some(sport), Some(dport)) = (dst, sport, dport) {
            out.push(Flow {
                proto,
                dst,
                sport,
                dport,
            });
        }
    }
    out
}

impl Net {
    /// The node's networks from its configuration; None without `[egress]`.
    pub fn new(cfg: &crate::config::Config) -> std::result::Result<Option<Net>, String> {
        let Some(e) = &cfg.egress else {
            return Ok(None);
        };
        let capture = Capture {
            dns_port: e.dns_port,
            proxy_port: e.proxy_port,
        };
        let layout = Layout::new(&e.table, &e.iface_prefix, &e.pool, &e.uplink, &e.never)
            .map_err(|e| format!("[egress]: {e}"))?
            .with_capture(capture);
        let upstream = if e.dns_upstream.is_empty() {
            resolv_conf_nameserver()
        } else {
            e.dns_upstream.parse().ok()
        };
        let (ended_tx, ended_rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(Some(Net {
            capture,
            upstream,
            min_ttl_secs: e.dns_min_ttl_secs,
            bootstrap_secs: e.bootstrap_secs,
            ended_tx,
            ended_rx: Mutex::new(Some(ended_rx)),
            layout,
            dir: cfg.run_dir.join("net"),
            used: Mutex::default(),
            bindings: Mutex::default(),
            apply: tokio::sync::Mutex::new(()),
        }))
    }

    /// A free slot, now taken.
    pub fn allocate(&self) -> Result<u32> {
        let mut used = lock(&self.used);
        let n = self.layout.slots();
        let slot = (0..n).find(|s| !used.contains(s)).ok_or_else(|| {
            Error::ResourceExhausted(format!(
                "every sandbox network of the pool {} is taken",
                self.layout.pool
            ))
        })?;
        used.insert(slot);
        Ok(slot)
    }

    /// Gives a slot back (a create that did not happen).
    pub fn release(&self, slot: u32) {
        lock(&self.used).remove(&slot);
    }

    fn netns(&self, slot: u32) -> PathBuf {
        Path::new(NETNS_DIR).join(self.layout.iface(slot))
    }

    /// The network namespace a sandbox's spec names.
    pub fn netns_path(&self, slot: u32) -> PathBuf {
        self.netns(slot)
    }

    /// The `/etc/hosts` of sandbox `id`.
    pub fn hosts_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.hosts"))
    }

    /// The `/etc/resolv.conf` of sandbox `id`.
    pub fn resolv_file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.resolv"))
    }

    /// Makes the namespace, the veth pair with its addresses and routes, the wrapper's marker
    /// and the sandbox's `/etc/hosts` (blocking; what exists already is kept). Returns whether
    /// the veth is a new one (its counters start from zero).
    fn make(&self, id: &str, slot: u32, hostname: &str) -> std::result::Result<bool, String> {
        let iface = self.layout.iface(slot);
        let (host, sandbox) = self.layout.addrs(slot);
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let ns = self.netns(slot);
        if !ns.exists() {
            run("ip", &["netns", "add", &iface], None)?;
        }
        let fresh = !egress::iface_exists(&iface);
        if fresh {
            let script = format!(
                "link add {iface} type veth peer name eth0 netns {iface}\n\
                 addr add {host}/30 dev {iface}\n\
                 link set {iface} up\n"
            );
            run("ip", &["-batch", "-"], Some(&script))?;
            let inside = self.inside(slot) + "link set lo up\n";
            run("ip", &["-n", &iface, "-batch", "-"], Some(&inside))?;
        }
        std::fs::write(
            self.hosts_file(id),
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n{sandbox}\t{hostname}\n"),
        )
        .map_err(|e| e.to_string())?;
        // Any address answers DNS (the capture takes every packet to port 53); the veth's
        // host side is the one a sandbox surely has a route to.
        std::fs::write(self.resolv_file(id), format!("nameserver {host}\n"))
            .map_err(|e| e.to_string())?;
        std::fs::write(self.dir.join(id), ns.display().to_string()).map_err(|e| e.to_string())?;
        Ok(fresh)
    }

    /// Gives the sandbox side of the veth its address and default route again (blocking).
    /// runsc `--network=sandbox` takes them off the interface when its sandbox boots (the
    /// sentry's netstack owns them from then on), and a later `runsc restore` or `start` in the
    /// same namespace leaves out an interface without an address: 20240729's restore then came
    /// back with `lo` only (verified). Only while no task runs on the namespace: with the
    /// address on it, the host kernel would answer the sandbox's packets too.
    fn readdress(&self, slot: u32) -> std::result::Result<(), String> {
        let iface = self.layout.iface(slot);
        run(
            "ip",
            &["-n", &iface, "-batch", "-"],
            Some(&self.inside(slot)),
        )
        .map(drop)
    }

    /// The `ip -batch` lines that give the sandbox side of slot `slot`'s veth its address,
    /// link and default route (what [`Net::make`] sets up and [`Net::readdress`] puts back).
    fn inside(&self, slot: u32) -> String {
        let (host, sandbox) = self.layout.addrs(slot);
        format!(
            "addr replace {sandbox}/30 dev eth0\n\
             link set eth0 up\n\
             route replace default via {host}\n"
        )
    }

    /// Removes what [`Net::make`] made (blocking; what is gone already is fine).
    fn unmake(&self, id: &str, slot: u32) {
        let iface = self.layout.iface(slot);
        if self.netns(slot).exists() {
            if let Err(e) = run("ip", &["netns", "del", &iface], None) {
                warn!(sandbox_id = %id, error = %e, "could not delete the network namespace");
            }
        }
        // The host side goes with its peer's namespace; a veth left behind (its peer moved
        // out) is deleted.
        if egress::iface_exists(&iface) {
            let _ = run("ip", &["link", "del", &iface], None);
        }
        let _ = std::fs::remove_file(self.dir.join(id));
        let _ = std::fs::remove_file(self.hosts_file(id));
        let _ = std::fs::remove_file(self.resolv_file(id));
    }

    /// The elements a binding needs now: the CIDR rules' and, for the addresses allowed names
    /// resolved to, their ports but 80 and 443 in `grants4` and the address in `named4` (its
    /// 80 and 443 go through the proxy) when the rule covers those.
    fn wanted(&self, b: &Binding) -> (Vec<Element>, Vec<Named>) {
        let now = now_ms();
        let secs = |at: u64| at.saturating_sub(now).div_ceil(1000);
        let mut allows: Vec<(Allow, Option<u64>)> = Vec::new();
        if b.base_in_force(now) {
            let ttl = (b.base_until_ms != 0).then(|| secs(b.base_until_ms));
            allows.extend(allows_of(&b.base).into_iter().map(|a| (a, ttl)));
        }
        for g in b.grants.iter().filter(|g| !g.expired(now)) {
            let ttl = (g.expires_at_ms != 0).then(|| secs(g.expires_at_ms));
            allows.extend(allows_of(&g.policy).into_iter().map(|a| (a, ttl)));
        }
        let iface = self.layout.iface(b.slot);
        let mut named: Vec<Named> = Vec::new();
        for r in b.name_rules(now) {
            let protos = match r.protocol.as_str() {
                "tcp" => vec![Proto::Tcp],
                "udp" => vec![Proto::Udp],
                _ => vec![Proto::Tcp, Proto::Udp],
            };
            let web = protos.contains(&Proto::Tcp)
                && (r.ports.is_empty() || r.ports.iter().any(|p| *p == 80 || *p == 443));
            for x in b
                .resolved
                .iter()
                .filter(|x| x.expires_ms > now && r.pattern.matches(&x.name))
            {
                let until = r.expires_ms.map_or(x.expires_ms, |e| e.min(x.expires_ms));
                let cidr = Cidr {
                    addr: x.addr.into(),
                    prefix: 32,
                };
                for &proto in &protos {
                    for ports in ranges_without_web(&r.ports) {
                        allows.push((Allow { cidr, proto, ports }, Some(secs(until))));
                    }
                }
                if web {
                    match named.iter_mut().find(|n| n.addr == x.addr) {
                        Some(n) => n.timeout = n.timeout.max(Some(secs(until))),
                        None => named.push(Named {
                            iface: iface.clone(),
                            addr: x.addr,
                            timeout: Some(secs(until)),
                        }),
                    }
                }
            }
        }
        (egress::elements(&iface, &allows), named)
    }

    /// Cuts the connections of sandbox `slot` that what it may reach now (`elements`, and
    /// ports 80 and 443 of `named` addresses, whose proxy cuts its own) no longer opens.
    fn cut(&self, slot: u32, elements: &[Element], named: &[Named]) {
        let (_, addr) = self.layout.addrs(slot);
        let addr = addr.to_string();
        let Ok(listing) = run("conntrack", &["-L", "-s", &addr], None) else {
            return;
        };
        for f in flows(&listing) {
            let web = f.proto == egress::Proto::Tcp
                && (f.dport == 80 || f.dport == 443)
                && named.iter().any(|n| n.addr == f.dst);
            let dns = f.dport == 53;
            let open = web
                || dns
                || elements.iter().any(|e| {
                    e.allow.proto == f.proto
                        && e.allow.cidr.contains(f.dst.into())
                        && e.allow.ports.0 <= f.dport
                        && f.dport <= e.allow.ports.1
                });
            if open {
                continue;
            }
            let proto = match f.proto {
                egress::Proto::Tcp => "tcp",
                egress::Proto::Udp => "udp",
            };
            let _ = run(
                "conntrack",
                &[
                    "-D",
                    "-p",
                    proto,
                    "-s",
                    &addr,
                    "-d",
                    &f.dst.to_string(),
                    "--sport",
                    &f.sport.to_string(),
                    "--dport",
                    &f.dport.to_string(),
                ],
                None,
            );
        }
    }
}

impl Node {
    fn net(&self) -> Option<&Net> {
        self.inner.net.as_ref()
    }

    /// Whether this node gives platform sandboxes networks.
    pub fn egress_configured(&self) -> bool {
        self.net().is_some()
    }

    /// A slot for a new platform sandbox when the node has networks (None: it has none).
    pub(super) fn allocate_network(&self) -> Result<Option<u32>> {
        self.net().map(Net::allocate).transpose()
    }

    /// Gives back a slot a create did not use.
    pub(super) fn release_network(&self, slot: u32) {
        if let Some(n) = self.net() {
            n.release(slot);
        }
    }

    /// The network namespace, `/etc/hosts` and `/etc/resolv.conf` of a networked sandbox, for
    /// its spec.
    pub(super) fn network_of(&self, sb: &Sandbox) -> Option<(PathBuf, [PathBuf; 2])> {
        let slot = sb.platform.as_ref()?.network?;
        let n = self.net()?;
        Some((
            n.netns_path(slot),
            [n.hosts_file(&sb.id), n.resolv_file(&sb.id)],
        ))
    }

    /// The sandbox whose address `peer` is (its network's), if any.
    pub(super) fn sandbox_at(&self, peer: std::net::SocketAddr) -> Option<String> {
        let std::net::IpAddr::V4(ip) = peer.ip() else {
            return None;
        };
        let n = self.net()?;
        let slot = n.layout.slot_of_addr(ip)?;
        lock(&n.bindings)
            .iter()
            .find(|(_, b)| b.slot == slot)
            .map(|(id, _)| id.clone())
    }

    /// `f` of sandbox `id`'s binding (None: it has none).
    pub(super) fn with_binding<R>(&self, id: &str, f: impl FnOnce(&Binding) -> R) -> Option<R> {
        let n = self.net()?;
        let b = lock(&n.bindings);
        b.get(id).map(f)
    }

    /// `f` of sandbox `id`'s binding, to change it (None: it has none).
    pub(super) fn with_binding_mut<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Binding) -> R,
    ) -> Option<R> {
        let n = self.net()?;
        let mut b = lock(&n.bindings);
        b.get_mut(id).map(f)
    }

    /// Notes addresses names resolved to for sandbox `id`, each open for its TTL (at least the
    /// node's minimum). Whether the table needs them: an address new to it, or one whose
    /// opening would otherwise end before half its new TTL.
    pub(super) fn note_resolved(&self, id: &str, resolved: &[Resolved]) -> bool {
        let Some(n) = self.net() else {
            return false;
        };
        let now = now_ms();
        let min = n.min_ttl_secs;
        self.with_binding_mut(id, |b| {
            let mut changed = false;
            for r in resolved {
                let ttl = u64::from(r.ttl.max(min)) * 1000;
                let until = now + ttl;
                match b
                    .resolved
                    .iter_mut()
                    .find(|x| x.name == r.name && x.addr == r.addr)
                {
                    Some(x) => {
                        // Extended only with the table: the kernel's element keeps the timeout
                        // it was last given, and a later expiry noted here alone would leave
                        // the daemon thinking an address open that the kernel has closed.
                        if x.expires_ms < now + ttl / 2 {
                            changed = true;
                            x.expires_ms = x.expires_ms.max(until);
                        }
                    }
                    None => {
                        changed = true;
                        b.resolved.push(ResolvedAddr {
                            name: r.name.clone(),
                            addr: r.addr,
                            expires_ms: until,
                        });
                    }
                }
            }
            changed
        })
        .unwrap_or(false)
    }

    /// The host-side interface of a networked sandbox (what its meter reads).
    pub(super) fn network_iface(&self, def: &super::Definition) -> Option<String> {
        let slot = def.platform.as_ref()?.network?;
        Some(self.net()?.layout.iface(slot))
    }

    /// Sets up a networked sandbox's network before its task starts: namespace, veth, and its
    /// source address and base policy in the table. Idempotent (a provisioning a restart cut
    /// short sets up again).
    pub(super) async fn network_up(&self, sb: &Sandbox) -> Result<()> {
        let (Some(n), Some(slot)) = (self.net(), sb.platform.as_ref().and_then(|p| p.network))
        else {
            return Ok(());
        };
        let base = base_policy(sb);
        let t0 = std::time::Instant::now();
        self.make_network(sb, slot, false).await?;
        {
            let mut b = lock(&n.bindings);
            let e = b.entry(sb.id.clone()).or_insert_with(|| Binding {
                slot,
                ..Default::default()
            });
            e.base = base;
            e.base_until_ms = self.base_until_ms(sb);
        }
        lock(&n.used).insert(slot);
        self.apply_egress(&sb.id, true).await?;
        info!(sandbox_id = %sb.id, iface = %n.layout.iface(slot),
              ms = t0.elapsed().as_secs_f64() * 1e3, "sandbox network up");
        Ok(())
    }

    /// [`Net::make`] for sandbox `sb` on `slot` (its meter rebased on a new veth), and with
    /// `readdress` [`Net::readdress`] on a veth it kept. Returns whether the veth is new.
    async fn make_network(&self, sb: &Sandbox, slot: u32, readdress: bool) -> Result<bool> {
        let node = self.clone();
        let (id, host) = (sb.id.clone(), super::lifecycle::hostname(&sb.id));
        let meter = sb.meter.clone();
        blocking(move || {
            let n = node.net().expect("a slot is only given with a network");
            let fresh = n.make(&id, slot, &host)?;
            if fresh {
                meter.rebase_net();
            } else if readdress {
                n.readdress(slot)?;
            }
            Ok::<bool, String>(fresh)
        })
        .await?
        .map_err(internal("sandbox network"))
    }

    /// Readies a networked sandbox's network for its task to start on it again (a resume's
    /// restore or cold start, after the task was deleted): the namespace and veth it kept
    /// while suspended (made again, with its elements and source, if they went), and the
    /// address and route runsc took off the sandbox's side put back ([`Net::readdress`]).
    pub(super) async fn network_again(&self, sb: &Sandbox) -> Result<()> {
        let (Some(_), Some(slot)) = (self.net(), sb.platform.as_ref().and_then(|p| p.network))
        else {
            return Ok(());
        };
        if self.make_network(sb, slot, true).await? {
            self.apply_egress(&sb.id, true).await?;
        }
        Ok(())
    }

    /// Puts a sandbox's elements in the kernel as its binding says now (and its source
    /// address with `source`), in one transaction; cuts the connections nothing opens any more
    /// (the proxy's too).
    pub(super) async fn apply_egress(&self, id: &str, source: bool) -> Result<()> {
        let Some(n) = self.net() else {
            return Ok(());
        };
        let _g = n.apply.lock().await;
        let (slot, script, new, named) = {
            let mut b = lock(&n.bindings);
            let Some(b) = b.get_mut(id) else {
                return Ok(());
            };
            let now = now_ms();
            b.resolved.retain(|x| x.expires_ms > now);
            let (new, named) = n.wanted(b);
            let mut script = if source {
                n.layout.source(b.slot)
            } else {
                String::new()
            };
            script += &n.layout.change(&b.applied, &new);
            script += &n.layout.change_named(&b.applied_named, &named);
            (b.slot, script, new, named)
        };
        let node = self.clone();
        let (elements, names) = (new.clone(), named.clone());
        blocking(move || {
            let n = node.net().expect("checked above");
            nft(&script)?;
            n.cut(slot, &elements, &names);
            Ok::<(), String>(())
        })
        .await?
        .map_err(internal("egress rules"))?;
        if let Some(b) = lock(&n.bindings).get_mut(id) {
            b.applied = new;
            b.applied_named = named;
            // The proxy's connections that what is in force no longer allows end now.
            let still: Vec<bool> = b
                .proxied
                .iter()
                .map(|p| b.proxy_allowed(&p.name, p.port, p.addr))
                .collect();
            for (p, ok) in b.proxied.iter().zip(still) {
                if !ok {
                    p.cancel.cancel();
                }
            }
        }
        Ok(())
    }

    /// Tears a sandbox's network down (after its task is gone): its elements, its source,
    /// its connections, namespace, veth and files; its slot is free again. Returns its last
    /// byte counts (what the meter banks).
    pub(super) async fn network_down(&self, sb: &Sandbox) {
        let Some(n) = self.net() else {
            return;
        };
        let Some(slot) = sb.platform.as_ref().and_then(|p| p.network) else {
            return;
        };
        let _g = n.apply.lock().await;
        let (applied, named) = lock(&n.bindings)
            .remove(&sb.id)
            .map(|b| {
                for p in &b.proxied {
                    p.cancel.cancel();
                }
                (b.applied, b.applied_named)
            })
            .unwrap_or_default();
        let script = n.layout.unsource(slot)
            + &n.layout.change(&applied, &[])
            + &n.layout.change_named(&named, &[]);
        let node = self.clone();
        let id = sb.id.clone();
        let r = blocking(move || {
            let n = node.net().expect("checked above");
            if let Err(e) = nft(&script) {
                warn!(sandbox_id = %id, error = %e, "could not remove the sandbox's egress rules");
            }
            n.cut(slot, &[], &[]);
            n.unmake(&id, slot);
        })
        .await;
        if r.is_err() {
            warn!(sandbox_id = %sb.id, "sandbox network teardown timed out");
        }
        n.release(slot);
    }

    fn grants_labels(grants: &[Grant]) -> HashMap<String, String> {
        record::chunk_labels(
            "egress-grants",
            &serde_json::to_string(grants).unwrap_or_default(),
        )
    }

    /// The grants recorded in a sandbox's labels.
    pub(super) fn grants_of_labels(labels: &HashMap<String, String>) -> Vec<Grant> {
        record::unchunk_labels("egress-grants", labels)
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default()
    }

    /// A networked sandbox and its binding, or why not: UNIMPLEMENTED without `[egress]`,
    /// FAILED_PRECONDITION for a sandbox without a network (a compute.v1 one, or one made
    /// before the node had egress) or one that has ended.
    fn networked(&self, id: &str) -> Result<(Arc<Sandbox>, &Net)> {
        let Some(n) = self.net() else {
            return Err(Error::Unimplemented(
                "egress is not configured on this node ([egress] in its config)".into(),
            ));
        };
        let sb = self.get(id)?;
        if sb.status().has_ended() {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: sb.status().word().into(),
            });
        }
        if !lock(&n.bindings).contains_key(&sb.id) {
            return Err(Error::FailedPrecondition {
                id: sb.id.clone(),
                state: "a sandbox created without egress configured (it has no network)".into(),
            });
        }
        Ok((sb, n))
    }

    /// The sandbox's bytes now (egress, ingress).
    async fn net_bytes(&self, sb: &Sandbox) -> [u64; 2] {
        let u = self.usage(sb).await;
        [u.network_egress_bytes, u.network_ingress_bytes]
    }

    /// GrantEgress: records a grant on top of the sandbox's base policy and puts it in force
    /// (the record first: a restart keeps it). `ttl_sec` 0 = no expiry, else at most a day.
    pub async fn grant_egress(
        &self,
        id: &str,
        policy: EgressPolicy,
        ttl_sec: u32,
        reason: String,
        granted_by: String,
    ) -> Result<Grant> {
        let (sb, n) = self.networked(id)?;
        if policy.rules.is_empty() {
            return Err(Error::InvalidArgument(
                "policy: a grant needs at least one rule".into(),
            ));
        }
        check_policy(&policy)?;
        if ttl_sec > MAX_GRANT_TTL_SECS {
            return Err(Error::InvalidArgument(format!(
                "ttl_sec {ttl_sec}: at most {MAX_GRANT_TTL_SECS} (0 = no expiry)"
            )));
        }
        let _ops = sb.ops.lock().await;
        let now = now_ms();
        let grant = Grant {
            id: uuid::Uuid::new_v4().to_string(),
            policy,
            created_at_ms: now,
            expires_at_ms: if ttl_sec == 0 {
                0
            } else {
                now + u64::from(ttl_sec) * 1000
            },
            reason,
            granted_by,
            bytes_at_grant: self.net_bytes(&sb).await,
        };
        let grants = {
            let mut b = lock(&n.bindings);
            let b = b.get_mut(&sb.id).ok_or(Error::NotFound(sb.id.clone()))?;
            b.grants.retain(|g| !g.expired(now));
            if b.grants.len() >= MAX_GRANTS {
                return Err(Error::ResourceExhausted(format!(
                    "{MAX_GRANTS} live grants already: revoke one first"
                )));
            }
            let mut v = b.grants.clone();
            v.push(grant.clone());
            v
        };
        self.inner
            .rt
            .set_labels(&sb.id, Self::grants_labels(&grants))
            .await?;
        if let Some(b) = lock(&n.bindings).get_mut(&sb.id) {
            b.grants = grants;
        }
        self.apply_egress(&sb.id, false).await?;
        if grant.expires_at_ms != 0 {
            self.spawn_grant_expiry(sb.clone(), grant.id.clone(), grant.expires_at_ms);
        }
        info!(sandbox_id = %sb.id, grant_id = %grant.id, ttl_sec, "egress granted");
        Ok(grant)
    }

    /// RevokeEgress: removes exactly one grant and cuts the connections only it opened.
    /// NOT_FOUND for a grant the sandbox does not have (or no longer has: expired).
    pub async fn revoke_egress(&self, id: &str, grant_id: &str) -> Result<Ended> {
        let (sb, _) = self.networked(id)?;
        let _ops = sb.ops.lock().await;
        self.end_grant(&sb, grant_id, false)
            .await?
            .ok_or_else(|| Error::NoSuchGrant {
                id: sb.id.clone(),
                grant: grant_id.to_string(),
            })
    }

    /// Ends one grant (revoked, or `expired`): the record, then the kernel.
    async fn end_grant(
        &self,
        sb: &Sandbox,
        grant_id: &str,
        expired: bool,
    ) -> Result<Option<Ended>> {
        let Some(n) = self.net() else {
            return Ok(None);
        };
        let now = now_ms();
        let (grant, rest) = {
            let b = lock(&n.bindings);
            let Some(b) = b.get(&sb.id) else {
                return Ok(None);
            };
            let Some(g) = b.grants.iter().find(|g| g.id == grant_id) else {
                return Ok(None);
            };
            if g.expired(now) && !expired {
                return Ok(None);
            }
            let rest: Vec<Grant> = b
                .grants
                .iter()
                .filter(|g| g.id != grant_id && !g.expired(now))
                .cloned()
                .collect();
            (g.clone(), rest)
        };
        self.inner
            .rt
            .set_labels(&sb.id, Self::grants_labels(&rest))
            .await?;
        if let Some(b) = lock(&n.bindings).get_mut(&sb.id) {
            b.grants = rest;
        }
        self.apply_egress(&sb.id, false).await?;
        let [e, i] = self.net_bytes(sb).await;
        let ended = Ended {
            egress_bytes: e.saturating_sub(grant.bytes_at_grant[0]),
            ingress_bytes: i.saturating_sub(grant.bytes_at_grant[1]),
            grant,
        };
        info!(sandbox_id = %sb.id, grant_id = %ended.grant.id, expired,
              egress_bytes = ended.egress_bytes, ingress_bytes = ended.ingress_bytes,
              reason = %ended.grant.reason, "egress grant ended");
        Ok(Some(ended))
    }

    /// At a grant's expiry: its elements go (the kernel's timeout may have taken them
    /// already), what it alone opened is closed again and its connections are cut.
    /// When a sandbox's base policy (its egress bootstrap) ends: at its max lifetime, or
    /// `[egress] bootstrap_secs` after its creation when it has none.
    fn base_until_ms(&self, sb: &Sandbox) -> u64 {
        let secs = match sb.platform.as_ref().map_or(0, |p| p.max_lifetime_sec) {
            0 => self
                .net()
                .map_or(DEFAULT_BOOTSTRAP_SECS, |n| n.bootstrap_secs),
            s => u64::from(s),
        };
        if secs == 0 {
            // `bootstrap_secs = 0`: the base policy lasts as long as the sandbox.
            return 0;
        }
        let created = sb
            .created_at
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        created + secs * 1000
    }

    /// Ends a sandbox's base policy at its bootstrap's end: what it opened is cut (the
    /// kernel's elements time out by themselves; open connections and the proxy's are cut here).
    pub(super) fn spawn_bootstrap_end(&self, sb: Arc<Sandbox>) {
        let Some(until) = self.net().and_then(|n| {
            lock(&n.bindings)
                .get(&sb.id)
                .map(|b| b.base_until_ms)
                .filter(|u| *u != 0)
        }) else {
            return;
        };
        let node = self.clone();
        self.inner.tasks.spawn_until(sb.cancel.clone(), async move {
            let wait = until.saturating_sub(now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let _ops = sb.ops.lock().await;
            if sb.status().has_ended() {
                return;
            }
            info!(sandbox_id = %sb.id, "egress bootstrap ended: the base policy opens nothing now");
            if let Err(e) = node.apply_egress(&sb.id, false).await {
                warn!(sandbox_id = %sb.id, error = %e, "could not end the egress bootstrap");
            }
        });
    }

    fn spawn_grant_expiry(&self, sb: Arc<Sandbox>, grant_id: String, at_ms: u64) {
        let node = self.clone();
        self.inner.tasks.spawn_until(sb.cancel.clone(), async move {
            let wait = at_ms.saturating_sub(now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let _ops = sb.ops.lock().await;
            if sb.status().has_ended() {
                return;
            }
            match node.end_grant(&sb, &grant_id, true).await {
                Ok(Some(ended)) => {
                    if let Some(n) = node.net() {
                        let ns = sb.platform.as_ref().map(|p| p.namespace.clone()).unwrap_or_default();
                        let _ = n.ended_tx.send((ns, sb.id.clone(), ended));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(sandbox_id = %sb.id, grant_id, error = %e, "could not end an expired grant")
                }
            }
        });
    }

    /// The grants that expire on this node from now on, with their bytes (namespace, sandbox
    /// id, what ended): once, for the one that audits them.
    pub fn take_ended_grants(
        &self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<(String, String, Ended)>> {
        lock(&self.net()?.ended_rx).take()
    }

    /// The egress in force for a sandbox (None: it has no network).
    pub fn egress(&self, id: &str) -> Option<Egress> {
        let n = self.net()?;
        let b = lock(&n.bindings);
        let b = b.get(id)?;
        let now = now_ms();
        Some(Egress {
            // Past its bootstrap the base policy opens nothing and is not shown.
            base: if b.base_in_force(now) {
                b.base.clone()
            } else {
                EgressPolicy::default()
            },
            grants: b
                .grants
                .iter()
                .filter(|g| !g.expired(now))
                .cloned()
                .collect(),
        })
    }

    /// After a restart: a recovered networked sandbox's binding (its grants from its labels).
    pub(super) fn recover_network(&self, sb: &Arc<Sandbox>, labels: &HashMap<String, String>) {
        let (Some(n), Some(slot)) = (self.net(), sb.platform.as_ref().and_then(|p| p.network))
        else {
            return;
        };
        lock(&n.used).insert(slot);
        if sb.status().has_ended() {
            return;
        }
        let base = base_policy(sb);
        let now = now_ms();
        let grants: Vec<Grant> = Self::grants_of_labels(labels)
            .into_iter()
            .filter(|g| !g.expired(now))
            .collect();
        for g in grants.iter().filter(|g| g.expires_at_ms != 0) {
            self.spawn_grant_expiry(sb.clone(), g.id.clone(), g.expires_at_ms);
        }
        lock(&n.bindings).insert(
            sb.id.clone(),
            Binding {
                slot,
                base,
                base_until_ms: self.base_until_ms(sb),
                grants,
                exposures: super::preview::exposures_of_labels(labels),
                ..Default::default()
            },
        );
    }

    /// A networked sandbox's address and its preview exposures (None: it has no network).
    pub(super) fn preview_of(&self, id: &str) -> Option<(Ipv4Addr, Vec<super::preview::Exposure>)> {
        let n = self.net()?;
        let b = lock(&n.bindings);
        let b = b.get(id)?;
        Some((n.layout.addrs(b.slot).1, b.exposures.clone()))
    }

    /// Replaces a networked sandbox's exposures in its binding (its labels were written).
    pub(super) fn set_exposures(&self, id: &str, exposures: Vec<super::preview::Exposure>) {
        if let Some(n) = self.net() {
            if let Some(b) = lock(&n.bindings).get_mut(id) {
                b.exposures = exposures;
            }
        }
    }

    /// The sandbox's network or why not (as for egress grants).
    pub(super) fn networked_sandbox(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.networked(id).map(|(sb, _)| sb)
    }

    /// Starts the node's networks (at start, after recovery): forwarding on, the whole table
    /// replaced by one built from the records (every live sandbox's source and elements), and
    /// what no record owns removed (a namespace or veth of a sandbox whose teardown a crash
    /// cut short).
    pub async fn rebuild_network(&self) -> Result<()> {
        let Some(n) = self.net() else {
            return Ok(());
        };
        let _g = n.apply.lock().await;
        let (script, owned) = {
            let mut b = lock(&n.bindings);
            let mut elements = String::new();
            let mut owned = BTreeSet::new();
            for v in b.values_mut() {
                let (want, named) = n.wanted(v);
                elements += &n.layout.source(v.slot);
                elements += &n.layout.change(&[], &want);
                elements += &n.layout.change_named(&[], &named);
                v.applied = want;
                v.applied_named = named;
                owned.insert(v.slot);
            }
            (n.layout.script(&elements), owned)
        };
        let used = lock(&n.used).clone();
        let node = self.clone();
        blocking(move || {
            let n = node.net().expect("checked above");
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
                .map_err(|e| format!("turn on IPv4 forwarding: {e}"))?;
            nft(&script)?;
            // Leftovers: namespaces and veths of this layout that no live record owns.
            let mut names: BTreeSet<String> = egress::iface_names().into_iter().collect();
            if let Ok(rd) = std::fs::read_dir(NETNS_DIR) {
                for e in rd.flatten() {
                    names.insert(e.file_name().to_string_lossy().into_owned());
                }
            }
            for name in names {
                let Some(slot) = n.layout.slot_of(&name) else {
                    continue;
                };
                if owned.contains(&slot) || used.contains(&slot) {
                    continue;
                }
                info!(iface = %name, "removing a sandbox network no record owns");
                n.cut(slot, &[], &[]);
                n.unmake("", slot);
            }
            Ok::<(), String>(())
        })
        .await?
        .map_err(internal("sandbox networks"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_listings_give_the_original_tuples() {
        let l = "tcp      6 431999 ESTABLISHED src=10.200.0.2 dst=198.18.0.1 sport=40312 dport=8000 src=198.18.0.1 dst=198.18.0.254 sport=8000 dport=40312 [ASSURED] mark=0 use=1\n\
                 udp      17 29 src=10.200.0.2 dst=198.18.0.9 sport=5353 dport=53 [UNREPLIED] src=198.18.0.9 dst=198.18.0.254 sport=53 dport=5353 mark=0 use=1\n\
                 conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.\n";
        let f = flows(l);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].dst, "198.18.0.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!((f[0].sport, f[0].dport), (40312, 8000));
        assert_eq!(f[1].proto, egress::Proto::Udp);
        assert_eq!(f[1].dport, 53);
    }

    #[test]
    fn policies_take_cidrs_and_dns_names() {
        let p = |d: &str| EgressPolicy {
            rules: vec![crate::platform::records::EgressRule {
                destination: d.into(),
                ports: vec![443],
                protocol: "tcp".into(),
            }],
        };
        assert!(check_policy(&p("198.18.0.0/24")).is_ok());
        assert!(check_policy(&p("api.example.com")).is_ok());
        assert!(check_policy(&p("*.example.com")).is_ok());
        assert!(matches!(
            check_policy(&p("not a thing")),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn names_leave_ports_80_and_443_to_the_proxy() {
        assert_eq!(
            ranges_without_web(&[]),
            vec![(1, 79), (81, 442), (444, u16::MAX)]
        );
        assert_eq!(ranges_without_web(&[443]), vec![]);
        assert_eq!(
            ranges_without_web(&[22, 80, 5432, 5433]),
            vec![(22, 22), (5432, 5433)]
        );
    }

    #[test]
    fn bindings_allow_names_by_rule_and_the_proxy_by_resolution() {
        let rule = |d: &str, ports: Vec<u16>| crate::platform::records::EgressRule {
            destination: d.into(),
            ports,
            protocol: String::new(),
        };
        let now = now_ms();
        let mut b = Binding {
            base: EgressPolicy {
                rules: vec![rule("*.pypi.org", vec![443])],
            },
            grants: vec![Grant {
                id: "g".into(),
                policy: EgressPolicy {
                    rules: vec![rule("api.test", vec![])],
                },
                created_at_ms: now,
                expires_at_ms: now + 60_000,
                reason: String::new(),
                granted_by: String::new(),
                bytes_at_grant: [0, 0],
            }],
            ..Default::default()
        };
        assert!(b.name_allowed("files.pypi.org"));
        assert!(b.name_allowed("api.test"));
        assert!(!b.name_allowed("pypi.org"));
        assert!(!b.name_allowed("other.test"));
        let a: Ipv4Addr = "198.18.0.10".parse().unwrap();
        assert!(
            !b.proxy_allowed("files.pypi.org", 443, a),
            "not resolved yet"
        );
        b.resolved.push(ResolvedAddr {
            name: "files.pypi.org".into(),
            addr: a,
            expires_ms: now + 30_000,
        });
        assert!(b.proxy_allowed("files.pypi.org", 443, a));
        assert!(
            !b.proxy_allowed("files.pypi.org", 80, a),
            "port 80 is not in its rule"
        );
        assert!(
            !b.proxy_allowed("api.test", 443, a),
            "api.test never resolved to it"
        );
        assert!(!b.proxy_allowed("files.pypi.org", 443, "198.18.0.11".parse().unwrap()));
        b.grants[0].expires_at_ms = now - 1;
        assert!(!b.name_allowed("api.test"), "an expired grant's names");
    }

    #[test]
    fn grants_expire_by_their_clock() {
        let g = Grant {
            id: "g".into(),
            policy: EgressPolicy::default(),
            created_at_ms: 1000,
            expires_at_ms: 5000,
            reason: String::new(),
            granted_by: String::new(),
            bytes_at_grant: [0, 0],
        };
        assert!(!g.expired(4999));
        assert!(g.expired(5000));
        let forever = Grant {
            expires_at_ms: 0,
            ..g
        };
        assert!(!forever.expired(u64::MAX));
    }
}
