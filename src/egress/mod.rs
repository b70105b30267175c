//! Host-side egress enforcement for sandbox networks (issue 20): the nft table the node keeps
//! and the set elements a policy and its grants become. [`crate::node`]'s network module makes
//! the namespaces and veths and applies these scripts.
//!
//! Enforcement is on the host side only (DESIGN.md: nft inside the sandbox's netns is bypassed by
//! runsc's raw socket). One table, `inet <name>` ([`Layout::script`]), holds:
//!
//! * `sources`: each sandbox's host-side veth and the one address it may send from (anything
//!   else from a sandbox interface is dropped: anti-spoof comes first);
//! * `never4`: what no grant opens (link-local and metadata addresses, loopback, multicast, the
//!   sandbox pool itself, the configured cluster ranges); the node's own addresses are closed
//!   to sandboxes in the input hook whatever they are;
//! * `grants4`: `ifname . daddr . l4proto . dport`, with intervals (CIDRs, port ranges) and
//!   per-element timeouts (grants with a TTL expire in the kernel too), kept disjoint
//!   ([`elements`]);
//! * the forward, input and masquerade chains.
//!
//! Sandboxes have no IPv6: an IPv6 packet from one is dropped, and IPv6 rules open nothing.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

pub mod dns;
pub mod hello;

/// A bad CIDR or rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// An address block, normalised (host bits cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `a::/n` or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Cidr, Invalid> {
        let (ip, bits) = match s.split_once('/') {
            Some((ip, bits)) => (ip, Some(bits)),
            None => (s, None),
        };
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| Invalid(format!("{s:?}: not an address")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match bits {
            None => max,
            Some(b) => match b.parse::<u8>() {
                Ok(b) if b <= max => b,
                _ => return Err(Invalid(format!("{s:?}: prefix length over {max}"))),
            },
        };
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }

    /// Whether the two blocks share an address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `ip` with all but its first `prefix` bits cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// What no grant opens, whatever the node's configuration adds: "this network", loopback,
/// link-local (where cloud metadata services answer: 169.254.169.254, and AWS's IPv6
/// fd00:ec2::254), multicast and broadcast.
pub fn always_never() -> Vec<Cidr> {
    [
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/4",
        "255.255.255.255/32",
        "::1/128",
        "fe80::/10",
        "ff00::/8",
        "fd00:ec2::254/128",
    ]
    .iter()
    .map(|c| Cidr::parse(c).expect("a valid built-in CIDR"))
    .collect()
}

/// One allowed destination block: addresses, a transport and a port range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    /// The addresses.
    pub cidr: Cidr,
    /// `tcp` or `udp`.
    pub proto: Proto,
    /// First and last port, inclusive (1–65535 = every port).
    pub ports: (u16, u16),
}

/// A transport protocol nft matches by `meta l4proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    fn nft(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

impl Allow {
    /// The allows of one CIDR rule: `ports` empty = every port (else each port its own
    /// element; adjacent ports are merged into a range), `protocol` "" = both.
    pub fn of_rule(cidr: Cidr, ports: &[u16], protocol: &str) -> Result<Vec<Allow>, Invalid> {
        let protos = match protocol {
            "" => vec![Proto::Tcp, Proto::Udp],
            "tcp" => vec![Proto::Tcp],
            "udp" => vec![Proto::Udp],
            p => return Err(Invalid(format!("protocol {p:?} is not tcp or udp"))),
        };
        if ports.contains(&0) {
            return Err(Invalid(format!("egress to {cidr}: port 0")));
        }
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut ranges: Vec<(u16, u16)> = Vec::new();
        for p in sorted {
            match ranges.last_mut() {
                Some(last) if last.1.checked_add(1) == Some(p) => last.1 = p,
                _ => ranges.push((p, p)),
            }
        }
        if ranges.is_empty() {
            ranges.push((1, u16::MAX));
        }
        let mut out = Vec::new();
        for proto in protos {
            for &ports in &ranges {
                out.push(Allow { cidr, proto, ports });
            }
        }
        Ok(out)
    }
}

/// One element of the `grants4` set: a sandbox's interface, a block of addresses, a transport,
/// a port range and the seconds it has left (None: no expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The sandbox's host-side interface.
    pub iface: String,
    /// What it opens.
    pub allow: Allow,
    /// Seconds left (the kernel removes it then); None = no expiry.
    pub timeout: Option<u64>,
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.allow;
        write!(f, "\"{}\" . {} . {} . ", self.iface, a.cidr, a.proto.nft())?;
        if a.ports.0 == a.ports.1 {
            write!(f, "{}", a.ports.0)?;
        } else {
            write!(f, "{}-{}", a.ports.0, a.ports.1)?;
        }
        if let Some(t) = self.timeout {
            write!(f, " timeout {}s", t.max(1))?;
        }
        Ok(())
    }
}

/// The elements that open exactly the union of `allows` (each with the seconds it has left,
/// None = no expiry) for interface `iface`, none overlapping another: the kernel's set of
/// concatenated intervals refuses overlapping elements, while grants overlap freely (a base
/// policy of 0.0.0.0/0 and a grant of one port of one host).
///
/// Per transport, the ports are cut where any allow starts or ends; in each piece the blocks
/// that no other block of the piece contains are kept (CIDR blocks either nest or are
/// disjoint, so those are disjoint), and a block's neighbouring pieces are merged again. A
/// kept block expires with the longest-lived allow of exactly that block: an allow of a
/// smaller block inside it that lives longer is opened again by the daemon when the larger
/// expires (between the two the kernel errs on the closed side). IPv6 allows are left out:
/// sandboxes have no IPv6.
pub fn elements(iface: &str, allows: &[(Allow, Option<u64>)]) -> Vec<Element> {
    let mut out = Vec::new();
    for proto in [Proto::Tcp, Proto::Udp] {
        let mine: Vec<&(Allow, Option<u64>)> = allows
            .iter()
            .filter(|(a, _)| a.proto == proto && a.cidr.addr.is_ipv4())
            .collect();
        let mut cuts: Vec<u32> = mine
            .iter()
            .flat_map(|(a, _)| [u32::from(a.ports.0), u32::from(a.ports.1) + 1])
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        // (block, expiry) → the port range it has open so far (to merge neighbours).
        let mut open: Vec<(Cidr, Option<u64>, (u16, u16))> = Vec::new();
        for w in cuts.windows(2) {
            let (lo, hi) = (w[0] as u16, (w[1] - 1) as u16);
            let cover: Vec<&(Allow, Option<u64>)> = mine
                .iter()
                .copied()
                .filter(|(a, _)| a.ports.0 <= lo && hi <= a.ports.1)
                .collect();
            let mut kept: Vec<(Cidr, Option<u64>)> = Vec::new();
            for (a, _) in &cover {
                let c = a.cidr;
                let inside_another = cover.iter().any(|(b, _)| {
                    b.cidr != c && b.cidr.prefix < c.prefix && b.cidr.contains(c.addr)
                });
                if inside_another || kept.iter().any(|(k, _)| *k == c) {
                    continue;
                }
                // The longest-lived allow of exactly this block (None lives forever).
                let ttl = cover
                    .iter()
                    .filter(|(b, _)| b.cidr == c)
                    .map(|(_, t)| *t)
                    .reduce(|x, y| match (x, y) {
                        (Some(x), Some(y)) => Some(x.max(y)),
                        _ => None,
                    })
                    .flatten();
                kept.push((c, ttl));
            }
            for (c, ttl) in kept {
                match open.iter_mut().find(|(oc, ot, r)| {
                    *oc == c && *ot == ttl && u32::from(r.1) + 1 == u32::from(lo)
                }) {
                    Some(o) => o.2 .1 = hi,
                    None => open.push((c, ttl, (lo, hi))),
                }
            }
        }
        for (cidr, timeout, ports) in open {
            out.push(Element {
                iface: iface.to_string(),
                allow: Allow { cidr, proto, ports },
                timeout,
            });
        }
    }
    out
}

/// How a node lays out its sandbox networks: the nft table, the interface names, the address
/// pool (a /30 per sandbox: the host side's address, then the sandbox's), the uplink
/// sandboxes' traffic may leave by, and what no grant opens beyond [`always_never`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The nft table's name (family `inet`).
    pub table: String,
    /// Prefix of every sandbox's host-side interface and network namespace name.
    pub prefix: String,
    /// The IPv4 pool the /30s come from.
    pub pool: Cidr,
    /// The interface sandbox traffic leaves by ("": any that is not a sandbox's).
    pub uplink: String,
    /// More never-reachable blocks (the cluster's pod and service ranges, metadata servers).
    pub never: Vec<Cidr>,
    /// The node's capture of ports 53, 80 and 443 ([`Layout::with_capture`]); None: none.
    pub capture: Option<Capture>,
}

/// Where the node's egress capture listens: every sandbox packet to port 53 is redirected to
/// `dns_port`, and a TCP connection to port 80 or 443 of an address an allowed name resolved
/// to (set `named4`) to `proxy_port`, where its Host or SNI is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    /// The node's DNS answering (UDP and TCP).
    pub dns_port: u16,
    /// The node's Host/SNI-checking proxy (TCP).
    pub proxy_port: u16,
}

/// One element of the `named4` set: a sandbox's interface, an address an allowed name resolved
/// to for it (its ports 80 and 443 go through the capture's proxy) and its seconds left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The sandbox's host-side interface.
    pub iface: String,
    /// The address.
    pub addr: Ipv4Addr,
    /// Seconds left (the kernel removes it then); None = no expiry.
    pub timeout: Option<u64>,
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\" . {}", self.iface, self.addr)?;
        if let Some(t) = self.timeout {
            write!(f, " timeout {}s", t.max(1))?;
        }
        Ok(())
    }
}

fn check_name(what: &str, v: &str, max: usize) -> Result<(), Invalid> {
    let ok = !v.is_empty()
        && v.len() <= max
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{what} {v:?}: 1-{max} letters, digits, '-' or '_'"
        )))
    }
}

impl Layout {
    /// A checked layout.
    pub fn new(
        table: &str,
        prefix: &str,
        pool: &str,
        uplink: &str,
        never: &[String],
    ) -> Result<Layout, Invalid> {
        check_name("nft table", table, 64)?;
        // The interface is the prefix and a slot number of at most 6 digits (IFNAMSIZ 15).
        check_name("interface prefix", prefix, 9)?;
        if !uplink.is_empty() {
            check_name("uplink", uplink, 15)?;
        }
        let pool = Cidr::parse(pool)?;
        if !pool.addr.is_ipv4() || pool.prefix > 30 {
            return Err(Invalid(format!(
                "pool {pool}: an IPv4 block of at least a /30"
            )));
        }
        let never = never
            .iter()
            .map(|c| Cidr::parse(c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Layout {
            table: table.to_string(),
            prefix: prefix.to_string(),
            pool,
            uplink: uplink.to_string(),
            never,
            capture: None,
        })
    }

    /// The same layout with the egress capture on these ports.
    pub fn with_capture(mut self, capture: Capture) -> Layout {
        self.capture = Some(capture);
        self
    }

    /// Every block no grant opens: [`always_never`], the pool itself and the configured ones.
    pub fn never_reachable(&self) -> Vec<Cidr> {
        let mut all = always_never();
        all.push(self.pool);
        all.extend(self.never.iter().copied());
        all
    }

    /// The slot whose sandbox has address `addr` (its /30's second address), if any.
    pub fn slot_of_addr(&self, addr: Ipv4Addr) -> Option<u32> {
        let IpAddr::V4(base) = self.pool.addr else {
            return None;
        };
        let off = u32::from(addr).checked_sub(u32::from(base))?;
        let slot = off / 4;
        (off % 4 == 2 && slot < self.slots() && self.pool.contains(IpAddr::V4(addr)))
            .then_some(slot)
    }

    /// `inet <table>`.
    pub fn family_table(&self) -> String {
        format!("inet {}", self.table)
    }

    /// How many sandboxes the pool holds (a /30 each; at most 10^6, the interface names'
    /// digits).
    pub fn slots(&self) -> u32 {
        let blocks = 1u64 << (30 - u32::from(self.pool.prefix));
        blocks.min(999_999) as u32
    }

    /// The host-side interface (and network namespace) name of slot `slot`.
    pub fn iface(&self, slot: u32) -> String {
        format!("{}{slot}", self.prefix)
    }

    /// The slot of a host-side interface name of this layout.
    pub fn slot_of(&self, iface: &str) -> Option<u32> {
        let n = iface.strip_prefix(&self.prefix)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 6 {
            return None;
        }
        n.parse().ok().filter(|s| *s < self.slots())
    }

    /// The host side's and the sandbox's addresses of slot `slot`.
    pub fn addrs(&self, slot: u32) -> (std::net::Ipv4Addr, std::net::Ipv4Addr) {
        let IpAddr::V4(base) = self.pool.addr else {
            unreachable!("the pool is IPv4 (checked in new)")
        };
        let b = u32::from(base) + slot * 4;
        ((b + 1).into(), (b + 2).into())
    }

    /// The whole table, as one `nft -f` script that replaces any previous one atomically (the
    /// table is declared, deleted and built again in the same transaction), with `elements`
    /// (each line an `add element`, from [`Layout::source`] and [`Layout::change`]) in it.
    ///
    /// A sandbox's packets first pass the anti-spoof check (its interface sends from its one
    /// address), then the never-reachable list, other sandboxes and the uplink check, then
    /// conntrack (replies, and connections opened while they were allowed), then the grants;
    /// anything else is refused (a TCP reset, else ICMP administratively prohibited) rather
    /// than dropped, so that a denied connection fails at once. The node itself (any of its
    /// addresses: the daemon, containerd, metrics) answers a sandbox nothing. Connections into
    /// a sandbox are only the replies of its own. Leaving by a non-sandbox interface, a
    /// sandbox's source address is masqueraded.
    pub fn script(&self, elements: &str) -> String {
        let all = self.never_reachable();
        let never: Vec<String> = all
            .iter()
            .filter(|c| c.addr.is_ipv4())
            .map(|c| c.to_string())
            .collect();
        let t = self.family_table();
        let p = &self.prefix;
        let uplink_out = if self.uplink.is_empty() {
            String::new()
        } else {
            format!("\t\toifname != \"{}\" drop\n", self.uplink)
        };
        let uplink_nat = if self.uplink.is_empty() {
            String::new()
        } else {
            format!(" oifname \"{}\"", self.uplink)
        };
        // The capture: the redirects (before routing, so a connection's first packet already
        // goes to the node), and the node's listeners open to sandboxes' redirected packets
        // only (nobody else reaches those ports).
        let (capture_in, capture_others, capture_chain) = match self.capture {
            None => (String::new(), String::new(), String::new()),
            Some(c) => {
                let ports = format!(
                    "{{ udp . {d}, tcp . {d}, tcp . {x} }}",
                    d = c.dns_port,
                    x = c.proxy_port
                );
                (
                    format!("\t\tiifname \"{p}*\" ct status dnat meta l4proto . th dport {ports} accept\n"),
                    format!("\t\tmeta l4proto . th dport {ports} drop\n"),
                    format!(
                        "\tchain capture {{\n\
                         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
                         \t\tiifname \"{p}*\" meta l4proto {{ tcp, udp }} th dport 53 redirect to :{d}\n\
                         \t\tiifname \"{p}*\" iifname . ip daddr . meta l4proto . th dport @grants4 return\n\
                         \t\tiifname \"{p}*\" tcp dport {{ 80, 443 }} iifname . ip daddr @named4 redirect to :{x}\n\
                         \t}}\n",
                        d = c.dns_port,
                        x = c.proxy_port
                    ),
                )
            }
        };
        format!(
            "table {t} {{}}\n\
             delete table {t}\n\
             table {t} {{\n\
             \tset sources {{ type ifname . ipv4_addr; }}\n\
             \tset never4 {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {never} }}; }}\n\
             \tset grants4 {{ type ifname . ipv4_addr . inet_proto . inet_service; flags interval, timeout; }}\n\
             \tset named4 {{ type ifname . ipv4_addr; flags timeout; }}\n\
             \tchain sandbox_out {{\n\
             \t\tmeta nfproto ipv6 drop\n\
             \t\tiifname . ip saddr != @sources drop\n\
             \t\tip daddr @never4 drop\n\
             \t\toifname \"{p}*\" drop\n\
             {uplink_out}\
             \t\tct state established,related accept\n\
             \t\tiifname . ip daddr . meta l4proto . th dport @grants4 accept\n\
             \t\tmeta l4proto tcp reject with tcp reset\n\
             \t\treject with icmpx type admin-prohibited\n\
             \t}}\n\
             \tchain forward_hook {{\n\
             \t\ttype filter hook forward priority filter; policy accept;\n\
             \t\tiifname \"{p}*\" jump sandbox_out\n\
             \t\toifname \"{p}*\" ct state established,related accept\n\
             \t\toifname \"{p}*\" drop\n\
             \t}}\n\
             \tchain input_hook {{\n\
             \t\ttype filter hook input priority filter; policy accept;\n\
             \t\tiifname \"{p}*\" ct state established,related accept\n\
             {capture_in}\
             \t\tiifname \"{p}*\" drop\n\
             {capture_others}\
             \t}}\n\
             {capture_chain}\
             \tchain nat_out {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr {pool} oifname != \"{p}*\"{uplink_nat} masquerade\n\
             \t}}\n\
             }}\n\
             {elements}",
            never = never.join(", "),
            pool = self.pool,
        )
    }

    /// The script that removes the table (the node's egress turned off).
    pub fn delete_script(&self) -> String {
        let t = self.family_table();
        format!("table {t} {{}}\ndelete table {t}\n")
    }

    /// The `add element` of slot `slot`'s one source address.
    pub fn source(&self, slot: u32) -> String {
        format!(
            "add element {} sources {{ \"{}\" . {} }}\n",
            self.family_table(),
            self.iface(slot),
            self.addrs(slot).1
        )
    }

    /// Removes slot `slot`'s source address (present or not: it is added first, in the same
    /// transaction, so the delete cannot fail).
    pub fn unsource(&self, slot: u32) -> String {
        let add = self.source(slot);
        let del = add.replacen("add element", "delete element", 1);
        add + &del
    }

    /// Replaces the elements `old` by `new` (in one transaction: no moment where neither
    /// holds). An old element that expired meanwhile is added back first, so that its delete
    /// cannot fail.
    pub fn change(&self, old: &[Element], new: &[Element]) -> String {
        let t = self.family_table();
        let mut s = String::new();
        for e in old {
            s += &format!("add element {t} grants4 {{ {e} }}\n");
            let mut bare = e.clone();
            bare.timeout = None;
            s += &format!("delete element {t} grants4 {{ {bare} }}\n");
        }
        for e in new {
            s += &format!("add element {t} grants4 {{ {e} }}\n");
        }
        s
    }
}

impl Layout {
    /// Replaces the `named4` elements `old` by `new`, in one transaction (as [`Layout::change`]).
    pub fn change_named(&self, old: &[Named], new: &[Named]) -> String {
        let t = self.family_table();
        let mut s = String::new();
        for e in old {
            s += &format!("add element {t} named4 {{ {e} }}\n");
            let mut bare = e.clone();
            bare.timeout = None;
            s += &format!("delete element {t} named4 {{ {bare} }}\n");
        }
        for e in new {
            s += &format!("add element {t} named4 {{ {e} }}\n");
        }
        s
    }
}

/// One interface's counters in `/proc/net/dev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DevCounters {
    rx_bytes: u64,
    rx_packets: u64,
    tx_bytes: u64,
    tx_packets: u64,
}

/// The interfaces of a `/proc/net/dev` listing and their counters.
fn parse_net_dev(text: &str) -> std::collections::HashMap<String, DevCounters> {
    let mut out = std::collections::HashMap::new();
    // Two header lines, then `name: rx_bytes rx_packets errs drop fifo frame compressed
    // multicast tx_bytes tx_packets ...`.
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let v: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if v.len() < 10 {
            continue;
        }
        out.insert(
            name.trim().to_string(),
            DevCounters {
                rx_bytes: v[0],
                rx_packets: v[1],
                tx_bytes: v[8],
                tx_packets: v[9],
            },
        );
    }
    out
}

/// The daemon's network namespace's interfaces, read at most every few milliseconds: the
/// meter reads every sandbox's veth in one tick, and `/proc/net/dev` lists them all.
///
/// `/proc/self/net/dev`, not `/sys/class/net`: sysfs shows the namespace of whoever mounted
/// it, while the daemon may run in another one (tests run it in a namespace of their own).
///
/// `fresh`: read now whatever the cache holds (a usage receipt, a Get, the final reading).
fn net_dev(fresh: bool) -> std::sync::Arc<std::collections::HashMap<String, DevCounters>> {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    type Cached = Option<(Instant, Arc<std::collections::HashMap<String, DevCounters>>)>;
    static CACHE: Mutex<Cached> = Mutex::new(None);
    const FRESH: Duration = Duration::from_millis(5);
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, v)) = c.as_ref() {
        if !fresh && at.elapsed() < FRESH {
            return v.clone();
        }
    }
    let v = Arc::new(parse_net_dev(
        &std::fs::read_to_string("/proc/self/net/dev").unwrap_or_default(),
    ));
    *c = Some((Instant::now(), v.clone()));
    v
}

/// Whether interface `iface` exists in the daemon's network namespace (read now).
pub fn iface_exists(iface: &str) -> bool {
    iface_names().iter().any(|n| n == iface)
}

/// Every interface of the daemon's network namespace (read now).
pub fn iface_names() -> Vec<String> {
    parse_net_dev(&std::fs::read_to_string("/proc/self/net/dev").unwrap_or_default())
        .into_keys()
        .collect()
}

/// IP-layer bytes a veth moved in each direction: (received, sent) by `iface`, each frame's
/// 14-byte Ethernet header taken off.
pub fn veth_bytes(iface: &str) -> Option<(u64, u64)> {
    veth_counters(iface, false)
}

/// Like [`veth_bytes`], read now rather than from a reading a few milliseconds old.
pub fn veth_bytes_now(iface: &str) -> Option<(u64, u64)> {
    veth_counters(iface, true)
}

fn veth_counters(iface: &str, fresh: bool) -> Option<(u64, u64)> {
    let c = *net_dev(fresh).get(iface)?;
    let rx = c.rx_bytes.saturating_sub(14 * c.rx_packets);
    let tx = c.tx_bytes.saturating_sub(14 * c.tx_packets);
    Some((rx, tx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_listings_give_each_interfaces_counters() {
        let t = "Inter-|   Receive                                                |  Transmit\n \
                 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
                     lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n\
                   cs-7: 10486000    7000    0    0    0     0          0         0   140000    2000    0    0    0     0       0          0\n";
        let m = parse_net_dev(t);
        assert_eq!(m.len(), 2);
        let c = m["cs-7"];
        assert_eq!((c.rx_bytes, c.rx_packets), (10_486_000, 7000));
        assert_eq!((c.tx_bytes, c.tx_packets), (140_000, 2000));
        assert!(
            iface_exists("lo"),
            "the test's own namespace has a loopback"
        );
        let (rx, tx) = veth_bytes("lo").expect("lo is listed");
        assert!(rx <= tx + 1_000_000_000 && tx <= rx + 1_000_000_000);
    }

    #[test]
    fn cidrs_are_parsed_and_normalised() {
        let c = Cidr::parse("198.18.7.9/15").unwrap();
        assert_eq!(c.to_string(), "198.18.0.0/15");
        assert!(c.contains("198.19.255.255".parse().unwrap()));
        assert!(!c.contains("198.20.0.0".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert_eq!(Cidr::parse("10.1.2.3").unwrap().to_string(), "10.1.2.3/32");
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
        assert_eq!(
            Cidr::parse("2001:db8::5/32").unwrap().to_string(),
            "2001:db8::/32"
        );
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("::/129").is_err());
        assert!(Cidr::parse("api.example.com").is_err());
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.overlaps(&Cidr::parse("169.254.169.254").unwrap()));
        assert!(!Cidr::parse("10.0.0.0/8")
            .unwrap()
            .overlaps(&Cidr::parse("11.0.0.0/8").unwrap()));
    }

    fn el(iface: &str, allows: &[(Allow, Option<u64>)]) -> Vec<String> {
        elements(iface, allows)
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    fn rule(cidr: &str, ports: &[u16], proto: &str, ttl: Option<u64>) -> Vec<(Allow, Option<u64>)> {
        Allow::of_rule(Cidr::parse(cidr).unwrap(), ports, proto)
            .unwrap()
            .into_iter()
            .map(|a| (a, ttl))
            .collect()
    }

    #[test]
    fn rules_become_elements_with_merged_port_ranges() {
        let a = rule("198.18.0.0/24", &[444, 443, 8080, 443], "tcp", None);
        assert_eq!(
            el("cs-1", &a),
            [
                "\"cs-1\" . 198.18.0.0/24 . tcp . 443-444",
                "\"cs-1\" . 198.18.0.0/24 . tcp . 8080"
            ]
        );
        let a = rule("198.18.0.0/24", &[], "", Some(60));
        assert_eq!(
            el("cs-1", &a),
            [
                "\"cs-1\" . 198.18.0.0/24 . tcp . 1-65535 timeout 60s",
                "\"cs-1\" . 198.18.0.0/24 . udp . 1-65535 timeout 60s"
            ]
        );
        let c = Cidr::parse("198.18.0.0/24").unwrap();
        assert!(Allow::of_rule(c, &[0], "tcp").is_err());
        assert!(Allow::of_rule(c, &[1], "icmp").is_err());
        let top = Allow::of_rule(c, &[65535, 65534], "udp").unwrap();
        assert_eq!(top[0].ports, (65534, 65535));
        // IPv6 is left out (sandboxes have none).
        assert!(el("cs-1", &rule("2001:db8::/32", &[], "", None)).is_empty());
    }

    #[test]
    fn overlapping_allows_become_disjoint_elements_of_the_same_union() {
        // Everything, plus one port of one block (inside it): just everything.
        let mut a = rule("0.0.0.0/0", &[], "tcp", None);
        a.extend(rule("198.18.0.0/24", &[80], "tcp", Some(30)));
        assert_eq!(el("cs-1", &a), ["\"cs-1\" . 0.0.0.0/0 . tcp . 1-65535"]);
        // A block on a few ports and a bigger block on one of them: the bigger block takes
        // that port, the smaller the rest; neighbours merge.
        let mut a = rule("198.18.0.0/24", &[80, 81, 82], "tcp", None);
        a.extend(rule("198.18.0.0/16", &[81], "tcp", Some(10)));
        assert_eq!(
            el("cs-1", &a),
            [
                "\"cs-1\" . 198.18.0.0/24 . tcp . 80",
                "\"cs-1\" . 198.18.0.0/16 . tcp . 81 timeout 10s",
                "\"cs-1\" . 198.18.0.0/24 . tcp . 82"
            ]
        );
        // The same block twice: the longer-lived wins, no expiry beats any.
        let mut a = rule("198.18.1.0/24", &[443], "tcp", Some(10));
        a.extend(rule("198.18.1.0/24", &[443], "tcp", Some(99)));
        assert_eq!(
            el("cs-1", &a),
            ["\"cs-1\" . 198.18.1.0/24 . tcp . 443 timeout 99s"]
        );
        a.extend(rule("198.18.1.0/24", &[443], "tcp", None));
        assert_eq!(el("cs-1", &a), ["\"cs-1\" . 198.18.1.0/24 . tcp . 443"]);
    }

    /// The union of the elements is the union of the allows, and no two elements overlap, for
    /// random allows (checked point by point on the ports and addresses that matter).
    #[test]
    fn elements_are_disjoint_and_exact_for_random_allows() {
        use proptest::prelude::*;
        let allow = (
            0u8..4,
            0u8..=32,
            prop::collection::vec(1u16..12, 0..3),
            0u8..3,
        );
        proptest!(|(raw in prop::collection::vec(allow, 1..6))| {
            let mut allows = Vec::new();
            for (net, prefix, ports, proto) in raw {
                let ip = format!("10.{net}.{}.0/{prefix}", net * 7);
                let proto = ["", "tcp", "udp"][proto as usize];
                allows.extend(rule(&ip, &ports, proto, None));
            }
            let els = elements("cs-1", &allows);
            let probes: Vec<IpAddr> = (0..4u8)
                .flat_map(|n| [format!("10.{n}.{}.1", n * 7), format!("10.{n}.{}.1", n * 7 + 1), format!("11.{n}.0.1", )])
                .map(|s| s.parse().unwrap())
                .collect();
            for proto in [Proto::Tcp, Proto::Udp] {
                for port in [1u16, 2, 5, 11, 12, 100, 65535] {
                    for ip in &probes {
                        let hit = |a: &Allow| a.proto == proto && a.cidr.contains(*ip)
                            && a.ports.0 <= port && port <= a.ports.1;
                        let want = allows.iter().any(|(a, _)| hit(a));
                        let n = els.iter().filter(|e| hit(&e.allow)).count();
                        prop_assert_eq!(n > 0, want, "{} {:?} {}", ip, proto, port);
                        prop_assert!(n <= 1, "overlap at {} {:?} {}: {:?}", ip, proto, port, els);
                    }
                }
            }
        });
    }

    #[test]
    fn layouts_are_checked_and_number_their_slots() {
        let l = Layout::new("compute", "cs-", "10.200.0.0/16", "", &[]).unwrap();
        assert_eq!(l.slots(), 16384);
        assert_eq!(l.iface(12), "cs-12");
        assert_eq!(l.slot_of("cs-12"), Some(12));
        assert_eq!(l.slot_of("cs-16384"), None);
        assert_eq!(l.slot_of("eth0"), None);
        assert_eq!(l.slot_of("cs-1x"), None);
        let (h, s) = l.addrs(3);
        assert_eq!(
            (h.to_string(), s.to_string()),
            ("10.200.0.13".into(), "10.200.0.14".into())
        );
        assert!(Layout::new("compute", "cs-\"; flush", "10.0.0.0/8", "", &[]).is_err());
        assert!(Layout::new("compute", "toolongprefix", "10.0.0.0/8", "", &[]).is_err());
        assert!(Layout::new("compute", "cs-", "10.0.0.0/31", "", &[]).is_err());
        assert!(Layout::new("compute", "cs-", "fd00::/64", "", &[]).is_err());
        assert!(Layout::new("compute", "cs-", "10.0.0.0/8", "", &["nope".into()]).is_err());
        assert!(Layout::new("a b", "cs-", "10.0.0.0/8", "", &[]).is_err());
    }

    /// The script and the elements are accepted by the real nft (`nft -c`: parsed and checked
    /// by the kernel's netlink, nothing applied) in a network namespace of the test's own.
    #[test]
    fn nft_accepts_the_table_and_the_elements() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs the tests as root"
            );
            eprintln!("not root: skipping the nft check");
            return;
        }
        for (uplink, capture) in [("", false), ("up0", true)] {
            let mut l = Layout::new(
                "compute",
                "cs-",
                "10.200.0.0/16",
                uplink,
                &["10.96.0.0/12".into()],
            )
            .unwrap();
            if capture {
                l = l.with_capture(Capture {
                    dns_port: 10053,
                    proxy_port: 10080,
                });
            }
            let mut a = rule("198.18.0.0/15", &[80, 443], "", Some(30));
            a.extend(rule("0.0.0.0/0", &[8080], "tcp", None));
            let els = elements(&l.iface(7), &a);
            let named = [Named {
                iface: l.iface(7),
                addr: "198.18.0.10".parse().unwrap(),
                timeout: Some(30),
            }];
            let script = l.script(
                &(l.source(7)
                    + &l.change(&[], &els)
                    + &l.change(&els, &[])
                    + &l.change_named(&[], &named)
                    + &l.change_named(&named, &[])
                    + &l.unsource(7)),
            );
            let mut child = Command::new("unshare")
                .args(["-n", "nft", "-c", "-f", "-"])
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("unshare and nft (scripts/install-deps installs nftables)");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(script.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "nft refused:\n{script}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
