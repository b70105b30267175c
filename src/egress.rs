//! Host-side egress enforcement for sandbox networks (issue 20), first part: the nft ruleset the
//! node keeps and the set elements a policy or a grant becomes.
//!
//! Enforcement is on the host side only (DESIGN.md: nft inside the sandbox's netns is bypassed by
//! runsc's raw socket). One table, `inet compute`, holds:
//!
//! * `sources`: each sandbox's host-side veth and the one address it may send from (anything
//!   else from a sandbox interface is dropped: anti-spoof comes first);
//! * `never4` / `never6`: what no grant opens (the node's own addresses, link-local and metadata
//!   addresses, the cluster's pod and service ranges, the sandbox pool itself);
//! * `grants4` / `grants6`: `ifname . daddr . l4proto . dport`, with intervals (CIDRs, port
//!   ranges) and per-element timeouts (grants with a TTL expire in the kernel);
//! * a forward chain (a sandbox's traffic to the world) and an input chain (to the node itself:
//!   dropped).
//!
//! Not built yet: the netns and veth per sandbox, the DNS answering and the Host/SNI check on
//! ports 53, 80 and 443, grants over the API, metering from the counters.

use std::fmt;
use std::net::IpAddr;

/// The nft table's family and name.
pub const TABLE: &str = "inet compute";

/// Prefix of every sandbox's host-side interface name (the chains match `prefix*`).
pub const IFACE_PREFIX: &str = "cs-";

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

    /// The set element for host-side interface `iface`, expiring after `ttl_secs` (0 = never).
    pub fn element(&self, iface: &str, ttl_secs: u64) -> String {
        let ports = if self.ports.0 == self.ports.1 {
            self.ports.0.to_string()
        } else {
            format!("{}-{}", self.ports.0, self.ports.1)
        };
        let ttl = if ttl_secs == 0 {
            String::new()
        } else {
            format!(" timeout {ttl_secs}s")
        };
        format!(
            "\"{iface}\" . {} . {} . {ports}{ttl}",
            self.cidr,
            self.proto.nft()
        )
    }

    /// The set the element goes in.
    pub fn set(&self) -> &'static str {
        if self.cidr.addr.is_ipv4() {
            "grants4"
        } else {
            "grants6"
        }
    }
}

/// A valid host-side interface name for a sandbox: the prefix and at most 15 bytes in all
/// (IFNAMSIZ), of characters nft takes in a quoted string unescaped.
pub fn check_iface(iface: &str) -> Result<(), Invalid> {
    let ok = iface.starts_with(IFACE_PREFIX)
        && iface.len() <= 15
        && iface
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!("{iface:?}: not a sandbox interface name")))
    }
}

/// The whole table, as one `nft -f` script that replaces any previous one atomically (the
/// table is declared, flushed and deleted, then built again in the same transaction).
pub fn table(never: &[Cidr]) -> String {
    let mut all = always_never();
    all.extend_from_slice(never);
    let list = |v4: bool| {
        let e: Vec<String> = all
            .iter()
            .filter(|c| c.addr.is_ipv4() == v4)
            .map(|c| c.to_string())
            .collect();
        if e.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", e.join(", "))
        }
    };
    let p = IFACE_PREFIX;
    format!(
        "table {TABLE} {{}}\n\
         delete table {TABLE}\n\
         table {TABLE} {{\n\
         \tset sources {{ type ifname . ipv4_addr; }}\n\
         \tset never4 {{ type ipv4_addr; flags interval; auto-merge;{n4} }}\n\
         \tset never6 {{ type ipv6_addr; flags interval; auto-merge;{n6} }}\n\
         \tset grants4 {{ type ifname . ipv4_addr . inet_proto . inet_service; flags interval, timeout; }}\n\
         \tset grants6 {{ type ifname . ipv6_addr . inet_proto . inet_service; flags interval, timeout; }}\n\
         \tchain sandbox_out {{\n\
         \t\tmeta nfproto ipv6 drop\n\
         \t\tiifname . ip saddr != @sources drop\n\
         \t\tip daddr @never4 drop\n\
         \t\tct state established,related accept\n\
         \t\tiifname . ip daddr . meta l4proto . th dport @grants4 accept\n\
         \t\tcounter drop\n\
         \t}}\n\
         \tchain forward_hook {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname \"{p}*\" jump sandbox_out\n\
         \t}}\n\
         \tchain input_hook {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname \"{p}*\" ct state established,related accept\n\
         \t\tiifname \"{p}*\" counter drop\n\
         \t}}\n\
         }}\n",
        n4 = list(true),
        n6 = list(false),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn rules_become_elements_with_merged_port_ranges() {
        let c = Cidr::parse("198.18.0.0/24").unwrap();
        let a = Allow::of_rule(c, &[444, 443, 8080, 443], "tcp").unwrap();
        let e: Vec<String> = a.iter().map(|a| a.element("cs-1", 0)).collect();
        assert_eq!(
            e,
            [
                "\"cs-1\" . 198.18.0.0/24 . tcp . 443-444",
                "\"cs-1\" . 198.18.0.0/24 . tcp . 8080"
            ]
        );
        let a = Allow::of_rule(c, &[], "").unwrap();
        let e: Vec<String> = a.iter().map(|a| a.element("cs-1", 60)).collect();
        assert_eq!(
            e,
            [
                "\"cs-1\" . 198.18.0.0/24 . tcp . 1-65535 timeout 60s",
                "\"cs-1\" . 198.18.0.0/24 . udp . 1-65535 timeout 60s"
            ]
        );
        assert_eq!(a[0].set(), "grants4");
        assert!(Allow::of_rule(c, &[0], "tcp").is_err());
        assert!(Allow::of_rule(c, &[1], "icmp").is_err());
        let top = Allow::of_rule(c, &[65535, 65534], "udp").unwrap();
        assert_eq!(top[0].ports, (65534, 65535));
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(check_iface("cs-0a1b2c3d").is_ok());
        assert!(check_iface("eth0").is_err());
        assert!(check_iface("cs-\"; flush").is_err());
        assert!(check_iface("cs-0123456789abc").is_err());
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
        let never = [Cidr::parse("10.96.0.0/12").unwrap()];
        let mut script = table(&never);
        let c = Cidr::parse("198.18.0.0/15").unwrap();
        for a in Allow::of_rule(c, &[80, 443], "").unwrap() {
            script += &format!(
                "add element {TABLE} {} {{ {} }}\n",
                a.set(),
                a.element("cs-test", 30)
            );
        }
        script += &format!("add element {TABLE} sources {{ \"cs-test\" . 10.200.0.2 }}\n");
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
