//! The egress capture's servers (issue 20): the node's DNS answering for sandboxes, and the
//! proxy that checks the Host or SNI of their connections to ports 80 and 443 of the addresses
//! allowed names resolved to. The node's nft table redirects those packets here
//! ([`crate::egress::Capture`]); nobody else reaches these ports.
//!
//! A sandbox is known by its source address (the table drops any other a sandbox sends from).
//! DNS: only names its policy allows resolve ([`crate::egress::dns`]); the addresses the
//! upstream answers are opened for it for their TTL (at least `dns_min_ttl_secs`) before the
//! answer goes back. Proxy: the first bytes name a host ([`crate::egress::hello`]); the
//! connection goes on to its original destination only when a rule allows that name on that
//! port and the name resolved to that address for this sandbox, so an allowed name cannot be
//! used to reach another host at the same address. A refused HTTP request gets a 403 that
//! says why; a refused TLS connection is closed.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tracing::{debug, info, warn};

use super::{Error, Node, Result};
use crate::egress::dns::{self, Decision};
use crate::egress::hello::{self, Hello, MAX_HELLO};

/// How long the upstream resolver has to answer (asked twice over UDP, then once over TCP
/// when the answer was truncated).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection has to send its first bytes, and the proxy to reach its destination.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections of the proxy, numbered.
static CONN: AtomicU64 = AtomicU64::new(1);

impl Node {
    /// Starts the capture's listeners (UDP and TCP DNS, the TCP proxy) on every address of the
    /// node's network namespace; the table lets only sandboxes' redirected packets reach them.
    pub(super) async fn spawn_capture(&self) -> Result<()> {
        let Some(n) = self.inner.net.as_ref() else {
            return Ok(());
        };
        let c = n.capture;
        let bind = |what: &'static str, port: u16| {
            move |e: std::io::Error| {
                Error::Internal(format!("egress capture: {what} port {port}: {e}"))
            }
        };
        let any = |port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let udp = UdpSocket::bind(any(c.dns_port))
            .await
            .map_err(bind("DNS (UDP)", c.dns_port))?;
        let tcp_dns = TcpListener::bind(any(c.dns_port))
            .await
            .map_err(bind("DNS (TCP)", c.dns_port))?;
        let proxy = TcpListener::bind(any(c.proxy_port))
            .await
            .map_err(bind("proxy", c.proxy_port))?;
        info!(dns_port = c.dns_port, proxy_port = c.proxy_port, upstream = ?n.upstream,
              "egress capture listening");
        let udp = std::sync::Arc::new(udp);
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((len, peer)) = udp.recv_from(&mut buf).await else {
                    continue;
                };
                let (node, udp, q) = (node.clone(), udp.clone(), buf[..len].to_vec());
                node.inner.tasks.clone().spawn(async move {
                    let r = node.answer_dns(peer, &q, false).await;
                    if !r.is_empty() {
                        let _ = udp.send_to(&r, peer).await;
                    }
                });
            }
        });
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            loop {
                let Ok((s, peer)) = tcp_dns.accept().await else {
                    continue;
                };
                let n2 = node.clone();
                node.inner.tasks.spawn(async move {
                    let _ = tokio::time::timeout(HELLO_TIMEOUT, n2.dns_over_tcp(s, peer)).await;
                });
            }
        });
        let node = self.clone();
        self.inner.tasks.spawn(async move {
            loop {
                let Ok((s, peer)) = proxy.accept().await else {
                    continue;
                };
                let n2 = node.clone();
                node.inner
                    .tasks
                    .spawn(async move { n2.proxy(s, peer).await });
            }
        });
        Ok(())
    }

    /// One DNS query over TCP (length-prefixed, as RFC 1035 has it); one answer.
    async fn dns_over_tcp(&self, mut s: TcpStream, peer: SocketAddr) {
        let Ok(len) = s.read_u16().await else { return };
        let mut q = vec![0u8; usize::from(len)];
        if s.read_exact(&mut q).await.is_err() {
            return;
        }
        let r = self.answer_dns(peer, &q, true).await;
        if !r.is_empty() {
            let mut out = (r.len() as u16).to_be_bytes().to_vec();
            out.extend(r);
            let _ = s.write_all(&out).await;
        }
    }

    /// The answer to query `raw` from `peer` (an empty one: nothing to send).
    async fn answer_dns(&self, peer: SocketAddr, raw: &[u8], tcp: bool) -> Vec<u8> {
        let Some(n) = self.inner.net.as_ref() else {
            return Vec::new();
        };
        let Some(id) = self.sandbox_at(peer) else {
            // Not a sandbox (the table lets nobody else here): refuse whatever it is.
            return match hickory_proto::op::Message::from_vec(raw) {
                Ok(q) => dns::empty_answer(&q, hickory_proto::op::ResponseCode::Refused),
                Err(_) => Vec::new(),
            };
        };
        let decision = dns::decide(raw, |name| {
            self.with_binding(&id, |b| b.name_allowed(name))
                .unwrap_or(false)
        });
        let name = match decision {
            Decision::Answer(bytes) => {
                debug!(sandbox_id = %id, "DNS query answered by the node");
                return bytes;
            }
            Decision::Forward => hickory_proto::op::Message::from_vec(raw)
                .ok()
                .and_then(|q| dns::question(&q))
                .map(|(name, _)| name)
                .unwrap_or_default(),
        };
        let Some(upstream) = n.upstream else {
            warn!(sandbox_id = %id, "no upstream resolver: set [egress] dns_upstream");
            return dns::servfail(raw);
        };
        let answer = match ask_upstream(upstream, raw, tcp).await {
            Ok(a) => a,
            Err(e) => {
                warn!(sandbox_id = %id, name, error = %e, "upstream resolver did not answer");
                return dns::servfail(raw);
            }
        };
        let Some((bytes, resolved)) = dns::filter(&answer, &name, &n.layout.never_reachable())
        else {
            return dns::servfail(raw);
        };
        // Open the addresses before the sandbox hears of them.
        if self.note_resolved(&id, &resolved) {
            if let Err(e) = self.apply_egress(&id, false).await {
                warn!(sandbox_id = %id, error = %e, "could not open a name's addresses");
                return dns::servfail(raw);
            }
        }
        info!(sandbox_id = %id, name, addrs = resolved.len(), "name resolved for a sandbox");
        bytes
    }

    /// One connection redirected from a sandbox's port 80 or 443: checked, then carried.
    async fn proxy(&self, mut s: TcpStream, peer: SocketAddr) {
        let Some(id) = self.sandbox_at(peer) else {
            return;
        };
        let Some(dst) = original_destination(&s) else {
            warn!(sandbox_id = %id, "a proxied connection without its original destination");
            return;
        };
        let port = dst.port();
        let mut head = Vec::with_capacity(2048);
        let name = loop {
            let mut buf = [0u8; 4096];
            let read = tokio::time::timeout(HELLO_TIMEOUT, s.read(&mut buf)).await;
            let Ok(Ok(k)) = read else { return };
            if k == 0 {
                return;
            }
            head.extend_from_slice(&buf[..k]);
            match hello::name(port, &head) {
                Hello::More if head.len() < MAX_HELLO => continue,
                Hello::More => {
                    return self
                        .refuse(s, &id, port, "", "its first bytes name no host")
                        .await
                }
                Hello::Nameless(why) => return self.refuse(s, &id, port, "", &why).await,
                Hello::Name(n) => break n,
            }
        };
        let addr = *dst.ip();
        let allowed = self
            .with_binding(&id, |b| b.proxy_allowed(&name, port, addr))
            .unwrap_or(false);
        let closed = self.inner.net.as_ref().is_some_and(|n| {
            n.layout
                .never_reachable()
                .iter()
                .any(|c| c.contains(std::net::IpAddr::V4(addr)))
        });
        if !allowed || closed {
            let why = format!("{name} at {addr}:{port} is not allowed for this sandbox");
            return self.refuse(s, &id, port, &name, &why).await;
        }
        let Ok(Ok(mut up)) =
            tokio::time::timeout(HELLO_TIMEOUT, TcpStream::connect(SocketAddr::V4(dst))).await
        else {
            debug!(sandbox_id = %id, name, %dst, "the proxy could not reach the destination");
            return;
        };
        if up.write_all(&head).await.is_err() {
            return;
        }
        let cancel = tokio_util::sync::CancellationToken::new();
        let conn = CONN.fetch_add(1, Ordering::Relaxed);
        let registered = self
            .with_binding_mut(&id, |b| {
                b.proxied.push(super::network::Proxied {
                    conn,
                    name: name.clone(),
                    port,
                    addr,
                    cancel: cancel.clone(),
                })
            })
            .is_some();
        if !registered {
            return;
        }
        debug!(sandbox_id = %id, name, %dst, "proxying");
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut s, &mut up) => {}
            _ = cancel.cancelled() => {
                info!(sandbox_id = %id, name, %dst, "a proxied connection cut: its grant ended");
            }
        }
        self.with_binding_mut(&id, |b| b.proxied.retain(|p| p.conn != conn));
    }

    async fn refuse(&self, mut s: TcpStream, id: &str, port: u16, name: &str, why: &str) {
        info!(sandbox_id = %id, port, name, why, "egress refused by the capture");
        if port != 443 {
            let body = format!("egress refused: {why}\n");
            let r = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(r.as_bytes()).await;
        }
        let _ = s.shutdown().await;
    }
}

/// Asks `upstream` the query `raw`: over UDP (twice), or over TCP when `tcp` or when the UDP
/// answer was truncated.
async fn ask_upstream(upstream: SocketAddr, raw: &[u8], tcp: bool) -> std::io::Result<Vec<u8>> {
    use std::io::{Error as IoError, ErrorKind};
    if !tcp {
        let local = if upstream.is_ipv4() {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        } else {
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
        };
        let sock = UdpSocket::bind(local).await?;
        sock.connect(upstream).await?;
        for _ in 0..2 {
            sock.send(raw).await?;
            let mut buf = vec![0u8; 65535];
            if let Ok(r) = tokio::time::timeout(UPSTREAM_TIMEOUT, sock.recv(&mut buf)).await {
                let k = r?;
                buf.truncate(k);
                // The TC bit: ask again over TCP.
                if k < 3 || buf[2] & 0x02 == 0 {
                    return Ok(buf);
                }
                break;
            }
        }
    }
    let ask = async {
        let mut s = TcpStream::connect(upstream).await?;
        let mut q = (raw.len() as u16).to_be_bytes().to_vec();
        q.extend_from_slice(raw);
        s.write_all(&q).await?;
        let len = s.read_u16().await?;
        let mut a = vec![0u8; usize::from(len)];
        s.read_exact(&mut a).await?;
        Ok::<_, std::io::Error>(a)
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, ask)
        .await
        .map_err(|_| IoError::new(ErrorKind::TimedOut, "no answer"))?
}

/// The destination a redirected connection was sent to (SO_ORIGINAL_DST).
fn original_destination(s: &TcpStream) -> Option<SocketAddrV4> {
    let a = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::OriginalDst).ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
        u16::from_be(a.sin_port),
    ))
}
