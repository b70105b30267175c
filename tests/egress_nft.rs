//! The host-side egress table of `computed::egress` enforced by the real kernel, in network
//! namespaces this test makes: a "host" (the table, forwarding), a "sandbox" behind a veth
//! `cs-…` and a fake internet host at 198.18.0.1. No packet leaves them.
//!
//! Checked: deny-all without a grant; a CIDR + port grant opens exactly its port; a grant with a
//! TTL expires in the kernel; the never-reachable list holds against a 0.0.0.0/0 grant; the
//! node itself is unreachable; a spoofed source address is dropped.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use std::cell::RefCell;

use computed::egress::{elements, Allow, Cidr, Element, Layout};

/// The node's layout in the test's "host" namespace: slot 0 is `cs-0`, 10.200.0.1 ↔ 10.200.0.2.
fn layout(never: &[&str]) -> Layout {
    let never: Vec<String> = never.iter().map(|s| s.to_string()).collect();
    Layout::new("compute", "cs-", "10.200.0.0/16", "up0", &never).unwrap()
}

/// Runs `cmd`, split at spaces; fails the test when it fails.
fn run(cmd: &str) {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Namespaces named after this process, deleted on drop.
struct Net {
    host: String,
    sandbox: String,
    world: String,
    servers: Vec<std::process::Child>,
    /// What has been granted, and what is in the kernel.
    granted: RefCell<Vec<(Allow, Option<u64>)>>,
    applied: RefCell<Vec<Element>>,
}

impl Drop for Net {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        for n in [&self.host, &self.sandbox, &self.world] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

impl Net {
    fn new() -> Net {
        let p = std::process::id();
        let net = Net {
            host: format!("egh-{p}"),
            sandbox: format!("egs-{p}"),
            world: format!("egw-{p}"),
            servers: Vec::new(),
            granted: RefCell::default(),
            applied: RefCell::default(),
        };
        let (h, s, w) = (&net.host, &net.sandbox, &net.world);
        for n in [h, s, w] {
            run(&format!("ip netns add {n}"));
            run(&format!("ip -n {n} link set lo up"));
        }
        run(&format!(
            "ip link add cs-0 netns {h} type veth peer name eth0 netns {s}"
        ));
        run(&format!(
            "ip link add up0 netns {h} type veth peer name eth0 netns {w}"
        ));
        for cmd in [
            format!("ip -n {h} addr add 10.200.0.1/30 dev cs-0"),
            format!("ip -n {s} addr add 10.200.0.2/30 dev eth0"),
            // A second address in the sandbox: sending from it is spoofing.
            format!("ip -n {s} addr add 10.200.0.6/32 dev eth0"),
            format!("ip -n {h} addr add 198.18.0.254/24 dev up0"),
            format!("ip -n {w} addr add 198.18.0.1/24 dev eth0"),
            format!("ip -n {w} addr add 198.18.1.1/24 dev eth0"),
            format!("ip -n {h} link set cs-0 up"),
            format!("ip -n {h} link set up0 up"),
            format!("ip -n {s} link set eth0 up"),
            format!("ip -n {w} link set eth0 up"),
            format!("ip -n {s} route add default via 10.200.0.1"),
            format!("ip -n {h} route add 10.200.0.6/32 dev cs-0"),
            format!("ip -n {h} route add 198.18.1.0/24 via 198.18.0.1"),
            format!("ip -n {w} route add 10.200.0.0/16 via 198.18.0.254"),
            format!("ip netns exec {h} sysctl -qw net.ipv4.ip_forward=1"),
        ] {
            run(&cmd);
        }
        net
    }

    /// A TCP server answering "hi" in `ns` at `addr:port`.
    fn serve(&mut self, ns: &str, addr: &str, port: u16) {
        let code = format!(
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('{addr}', {port}))\ns.listen(16)\nwhile True:\n    c, _ = s.accept()\n    c.sendall(b'hi')\n    c.close()\n"
        );
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-c", &code])
            .spawn()
            .unwrap();
        self.servers.push(child);
    }

    /// Whether the sandbox, sending from `src`, gets "hi" from `addr:port` within a second.
    fn reach(&self, src: &str, addr: &str, port: u16) -> bool {
        let code = format!(
            "import socket, sys\ns = socket.socket()\ns.settimeout(1)\ns.bind(('{src}', 0))\n\
             try:\n    s.connect(('{addr}', {port}))\n    sys.exit(0 if s.recv(2) == b'hi' else 1)\n\
             except OSError:\n    sys.exit(1)\n"
        );
        Command::new("ip")
            .args(["netns", "exec", &self.sandbox, "python3", "-c", &code])
            .status()
            .unwrap()
            .success()
    }

    fn nft(&self, script: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.host, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
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

    /// Replaces the table (nothing granted).
    fn table(&self, l: &Layout) {
        self.granted.borrow_mut().clear();
        self.applied.borrow_mut().clear();
        self.nft(&l.script(&l.source(0)));
    }

    /// Grants `cidr` on `ports` over TCP, for `ttl` seconds (0: no expiry), on top of what is
    /// granted already (the elements replaced in one transaction, as the node does).
    fn grant(&self, l: &Layout, cidr: &str, ports: &[u16], ttl: u64) {
        let ttl = (ttl > 0).then_some(ttl);
        for a in Allow::of_rule(Cidr::parse(cidr).unwrap(), ports, "tcp").unwrap() {
            self.granted.borrow_mut().push((a, ttl));
        }
        let new = elements(&l.iface(0), &self.granted.borrow());
        self.nft(&l.change(&self.applied.borrow(), &new));
        *self.applied.borrow_mut() = new;
    }
}

#[test]
fn the_host_side_table_enforces_egress() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes network namespaces and needs root"
    );
    let mut net = Net::new();
    let w = net.world.clone();
    let h = net.host.clone();
    net.serve(&w, "198.18.0.1", 8000);
    net.serve(&w, "198.18.0.1", 9000);
    net.serve(&w, "198.18.1.1", 8000);
    net.serve(&h, "10.200.0.1", 7000);
    std::thread::sleep(Duration::from_millis(500));
    // Without the table everything is reachable: the checks below can fail.
    assert!(
        net.reach("10.200.0.2", "198.18.0.1", 8000),
        "no path at all"
    );
    assert!(net.reach("10.200.0.6", "198.18.0.1", 8000));
    assert!(net.reach("10.200.0.2", "198.18.1.1", 8000));
    assert!(net.reach("10.200.0.2", "10.200.0.1", 7000));

    let l = layout(&["198.18.1.0/24"]);
    net.table(&l);
    assert!(!net.reach("10.200.0.2", "198.18.0.1", 8000), "deny-all");

    net.grant(&l, "198.18.0.0/24", &[8000], 0);
    assert!(net.reach("10.200.0.2", "198.18.0.1", 8000), "granted");
    assert!(!net.reach("10.200.0.2", "198.18.0.1", 9000), "another port");
    assert!(
        !net.reach("10.200.0.6", "198.18.0.1", 8000),
        "a spoofed source"
    );
    assert!(
        !net.reach("10.200.0.2", "10.200.0.1", 7000),
        "the node itself"
    );

    // 198.18.1.0/24 is on the never list: a grant of everything does not open it.
    net.grant(&l, "0.0.0.0/0", &[], 0);
    assert!(
        net.reach("10.200.0.2", "198.18.0.1", 9000),
        "0.0.0.0/0 granted"
    );
    assert!(
        !net.reach("10.200.0.2", "198.18.1.1", 8000),
        "a never-reachable address"
    );
    assert!(
        !net.reach("10.200.0.2", "10.200.0.1", 7000),
        "the node itself"
    );

    // A grant with a TTL expires in the kernel.
    let l = layout(&[]);
    net.table(&l);
    net.grant(&l, "198.18.1.0/24", &[8000], 2);
    assert!(
        net.reach("10.200.0.2", "198.18.1.1", 8000),
        "granted for 2 s"
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!net.reach("10.200.0.2", "198.18.1.1", 8000), "expired");
}
