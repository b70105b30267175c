//! Preview host names: `{port}-{sandbox_id}.{domain}`, one origin per sandbox and port.

/// What a preview host name points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The sandbox (a UUID, lower case).
    pub sandbox_id: String,
    /// Its port.
    pub port: u16,
}

/// The ports a preview may never expose: the egress capture owns DNS, HTTP and HTTPS.
pub const RESERVED_PORTS: [u16; 3] = [53, 80, 443];

/// Whether `port` may be exposed (1–65535, none of [`RESERVED_PORTS`]).
pub fn exposable(port: u32) -> bool {
    (1..=65535).contains(&port) && !RESERVED_PORTS.contains(&(port as u16))
}

/// The host name of `port` of `sandbox_id` under `domain`.
pub fn name(domain: &str, sandbox_id: &str, port: u16) -> String {
    format!("{port}-{sandbox_id}.{domain}")
}

/// The target of the `Host` (or `:authority`) `host` under `domain`: a port suffix and the
/// case of letters are ignored, anything else that is not exactly one label of our form in
/// front of `domain` is `None`.
pub fn parse(host: &str, domain: &str) -> Option<Target> {
    let host = host.trim_end_matches('.');
    let host = match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h,
        Some(_) => return None,
        None => host,
    };
    let host = host.to_ascii_lowercase();
    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(&domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    if port.is_empty() || port.starts_with('0') || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u32 = port.parse().ok()?;
    if !(1..=65535).contains(&port) {
        return None;
    }
    let uuid = uuid::Uuid::parse_str(id).ok()?;
    // Only the canonical hyphenated form: one name per origin.
    if uuid.hyphenated().to_string() != id {
        return None;
    }
    Some(Target {
        sandbox_id: id.to_string(),
        port: port as u16,
    })
}

/// The target of a request's `Host` header (or, for HTTP/2, its `:authority`) under `domain`.
pub fn of_request(head: &http::request::Parts, domain: &str) -> Option<Target> {
    let host = head
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| head.uri.authority().map(|a| a.as_str()))?;
    parse(host, domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b5f6c1e-7d1a-4c6e-9a53-2f8f7b1d2c3a";

    #[test]
    fn names_round_trip_and_only_our_form_parses() {
        let d = "preview.example.com";
        let n = name(d, ID, 8080);
        assert_eq!(n, format!("8080-{ID}.preview.example.com"));
        let want = Some(Target {
            sandbox_id: ID.into(),
            port: 8080,
        });
        assert_eq!(parse(&n, d), want);
        assert_eq!(parse(&format!("{n}:443"), d), want);
        assert_eq!(parse(&format!("{n}."), d), want);
        assert_eq!(parse(&n.to_uppercase(), d), want);
        assert_eq!(parse(&format!("1-{ID}.{d}"), d).unwrap().port, 1);
        assert_eq!(parse(&format!("65535-{ID}.{d}"), d).unwrap().port, 65535);
        for bad in [
            format!("0-{ID}.{d}"),
            format!("65536-{ID}.{d}"),
            format!("080-{ID}.{d}"),
            format!("-{ID}.{d}"),
            format!("x80-{ID}.{d}"),
            format!("8080-{}.{d}", ID.replace('-', "")),
            format!("8080-{ID}x.{d}"),
            format!("a.8080-{ID}.{d}"),
            format!("8080-{ID}.evil.com"),
            format!("8080-{ID}.xpreview.example.com"),
            format!("8080-{ID}{d}"),
            format!("{n}:"),
            format!("{n}:x"),
            d.to_string(),
            String::new(),
        ] {
            assert_eq!(parse(&bad, d), None, "{bad:?}");
        }
    }

    #[test]
    fn reserved_and_out_of_range_ports_are_not_exposable() {
        for p in [0, 53, 80, 443, 65536, 70000] {
            assert!(!exposable(p), "{p}");
        }
        for p in [1, 22, 3000, 8080, 65535] {
            assert!(exposable(p), "{p}");
        }
    }
}
