//! The name a connection's first bytes ask for (issue 20's Host/SNI check): the server name of a
//! TLS ClientHello (port 443) or the `Host` header of an HTTP/1 request (port 80). The capture
//! reads a connection's first bytes, asks [`name`], and lets it through only to a name the
//! sandbox may reach, at an address that name resolved to for it.

/// The most a connection's first bytes may take before it is refused (a ClientHello or an HTTP
/// request head larger than this is not one a client sends to an allowed service).
pub const MAX_HELLO: usize = 16 << 10;

/// What the first bytes say so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not enough bytes yet.
    More,
    /// The name asked for (normalized: lowercase, no trailing dot, no port).
    Name(String),
    /// Not the protocol of the port, or one that names no host: refused.
    Nameless(String),
}

/// The name in `head`, the first bytes of a connection to port `port` (443: TLS, else HTTP).
pub fn name(port: u16, head: &[u8]) -> Hello {
    if port == 443 {
        tls(head)
    } else {
        http(head)
    }
}

fn tls(head: &[u8]) -> Hello {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rd = head;
    while !rd.is_empty() {
        match acceptor.read_tls(&mut rd) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Hello::Nameless(format!("not TLS: {e}")),
        }
    }
    match acceptor.accept() {
        Ok(None) => Hello::More,
        Ok(Some(accepted)) => match accepted.client_hello().server_name() {
            Some(n) => Hello::Name(super::dns::normalize(n)),
            None => Hello::Nameless("a TLS ClientHello without a server name".into()),
        },
        Err((e, _)) => Hello::Nameless(format!("not a TLS ClientHello: {e}")),
    }
}

fn http(head: &[u8]) -> Hello {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Partial) => Hello::More,
        Ok(httparse::Status::Complete(_)) => {
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok());
            match host {
                Some(h) => Hello::Name(super::dns::normalize(strip_port(h.trim()))),
                None => Hello::Nameless("an HTTP request without a Host header".into()),
            }
        }
        Err(e) => Hello::Nameless(format!("not an HTTP/1 request: {e}")),
    }
}

/// `host:port` → `host` (a bracketed IPv6 literal keeps its brackets).
fn strip_port(h: &str) -> &str {
    if h.starts_with('[') {
        return h.split_once(']').map_or(h, |(a, _)| &h[..a.len() + 1]);
    }
    h.rsplit_once(':')
        .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
        .map_or(h, |(a, _)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real ClientHello for `sni` (rustls's own client, no network).
    fn client_hello(sni: &str) -> Vec<u8> {
        use std::sync::Arc;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let mut c = rustls::ClientConnection::new(
            Arc::new(config),
            rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        c.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn tls_client_hellos_name_their_server() {
        let h = client_hello("API.example.com");
        assert_eq!(name(443, &h), Hello::Name("api.example.com".into()));
        // Byte by byte: more is needed until the record is whole.
        assert_eq!(name(443, &h[..5]), Hello::More);
        assert_eq!(name(443, &h[..h.len() - 1]), Hello::More);
        assert!(matches!(
            name(443, b"GET / HTTP/1.1\r\n\r\n"),
            Hello::Nameless(_)
        ));
        // An IP address is no server name: rustls leaves it out of the hello.
        let ip = client_hello("198.18.0.10");
        assert!(
            matches!(name(443, &ip), Hello::Nameless(_)),
            "{:?}",
            name(443, &ip)
        );
    }

    #[test]
    fn http_requests_name_their_host() {
        let r = b"GET /simple HTTP/1.1\r\nUser-Agent: x\r\nHost: Files.Example.org:8080\r\n\r\n";
        assert_eq!(name(80, r), Hello::Name("files.example.org".into()));
        assert_eq!(name(80, &r[..20]), Hello::More);
        assert!(matches!(
            name(80, b"GET / HTTP/1.1\r\nX: y\r\n\r\n"),
            Hello::Nameless(_)
        ));
        assert!(matches!(
            name(80, &[0x16, 3, 1, 0, 5, 1]),
            Hello::Nameless(_)
        ));
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("a.b"), "a.b");
    }
}
