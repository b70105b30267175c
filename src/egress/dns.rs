//! The egress capture's DNS (issue 20): a sandbox's queries (every packet to port 53, wherever
//! it was sent) reach the node, which answers only names its policy allows. This module holds
//! the pure parts: name patterns, and what to do with a query and with the upstream's answer;
//! [`crate::node`]'s capture serves them.
//!
//! Only allowed names resolve: anything else is NXDOMAIN. An allowed name's query goes to the
//! node's upstream resolver; the IPv4 addresses it answers, less the never-reachable ones, are
//! what the host then lets the sandbox reach (for their TTL) and what the sandbox is told.
//! Sandboxes have no IPv6: AAAA questions get an empty answer, and no answer carries an IPv6
//! address (nor an IPv4 one to a question of another type, such as HTTPS hints).

use std::net::{IpAddr, Ipv4Addr};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{RData, RecordType};

use super::{Cidr, Invalid};

/// A DNS name of a policy: `api.example.com` (that name) or `*.example.com` (any name under
/// it, not the name itself). Lowercase, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern {
    /// The name, or the suffix after `*.`.
    name: String,
    wildcard: bool,
}

/// A name in the form patterns compare: lowercase, no trailing dot.
pub fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl NamePattern {
    /// Parses a policy destination that is not a CIDR.
    pub fn parse(s: &str) -> Result<NamePattern, Invalid> {
        let s = normalize(s);
        let (wildcard, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, s.clone()),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(Invalid(format!("{s:?}: not a DNS name")));
        }
        Ok(NamePattern { name, wildcard })
    }

    /// Whether `name` (normalized) is one this pattern allows.
    pub fn matches(&self, name: &str) -> bool {
        if self.wildcard {
            name.len() > self.name.len() + 1
                && name.ends_with(&self.name)
                && name.as_bytes()[name.len() - self.name.len() - 1] == b'.'
        } else {
            name == self.name
        }
    }
}

/// What the capture does with one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Answer at once with these bytes (a refusal, or an empty AAAA answer).
    Answer(Vec<u8>),
    /// Ask the upstream resolver, then [`filter`] its answer.
    Forward,
}

/// The question of a query message: (normalized name, type); None when it is not a query of
/// exactly one question.
pub fn question(query: &Message) -> Option<(String, RecordType)> {
    if query.metadata.message_type != MessageType::Query
        || query.metadata.op_code != OpCode::Query
        || query.queries.len() != 1
    {
        return None;
    }
    let q = &query.queries[0];
    Some((normalize(&q.name().to_ascii()), q.query_type()))
}

/// A response to `query` with `code` and no records.
pub fn empty_answer(query: &Message, code: ResponseCode) -> Vec<u8> {
    let mut m = Message::error_msg(query.metadata.id, query.metadata.op_code, code);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.add_queries(query.queries.to_vec());
    m.to_vec().unwrap_or_default()
}

/// Decides on query bytes `raw` from a sandbox, `allowed` saying whether a name may resolve.
pub fn decide(raw: &[u8], allowed: impl Fn(&str) -> bool) -> Decision {
    let Ok(query) = Message::from_vec(raw) else {
        // Not a DNS message: nothing to answer (a truncated header cannot carry an id).
        return Decision::Answer(Vec::new());
    };
    let Some((name, qtype)) = question(&query) else {
        return Decision::Answer(empty_answer(&query, ResponseCode::FormErr));
    };
    if !allowed(&name) {
        return Decision::Answer(empty_answer(&query, ResponseCode::NXDomain));
    }
    if qtype == RecordType::AAAA {
        return Decision::Answer(empty_answer(&query, ResponseCode::NoError));
    }
    Decision::Forward
}

/// One address an answer let through: the name asked, the address, its TTL in seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The name the sandbox asked for (normalized).
    pub name: String,
    /// An IPv4 address it resolved to.
    pub addr: Ipv4Addr,
    /// Seconds the answer holds.
    pub ttl: u32,
}

/// The upstream's answer `raw` to the sandbox's question `name` (type `qtype`), made fit for
/// the sandbox: A records only in answers to A questions, none in `never`, no AAAA anywhere.
/// Returns the bytes to send and the addresses to open. None: not a usable answer (the
/// sandbox then gets SERVFAIL).
pub fn filter(raw: &[u8], name: &str, never: &[Cidr]) -> Option<(Vec<u8>, Vec<Resolved>)> {
    let mut m = Message::from_vec(raw).ok()?;
    if m.metadata.message_type != MessageType::Response {
        return None;
    }
    let qtype = m.queries.first().map(|q| q.query_type())?;
    let mut out = Vec::new();
    let closed = |a: Ipv4Addr| never.iter().any(|c| c.contains(IpAddr::V4(a)));
    m.answers.retain(|r| match &r.data {
        RData::A(a) if qtype == RecordType::A && !closed(a.0) => {
            out.push(Resolved {
                name: name.to_string(),
                addr: a.0,
                ttl: r.ttl,
            });
            true
        }
        RData::A(_) | RData::AAAA(_) => false,
        _ => true,
    });
    for section in [&mut m.authorities, &mut m.additionals] {
        section.retain(|r| !matches!(r.data, RData::A(_) | RData::AAAA(_)));
    }
    Some((m.to_vec().ok()?, out))
}

/// The SERVFAIL answer to query bytes `raw` (the upstream did not answer usably).
pub fn servfail(raw: &[u8]) -> Vec<u8> {
    match Message::from_vec(raw) {
        Ok(q) => empty_answer(&q, ResponseCode::ServFail),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, Record};

    fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 4242;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    fn code(raw: &[u8]) -> ResponseCode {
        Message::from_vec(raw).unwrap().metadata.response_code
    }

    #[test]
    fn patterns_match_names_and_wildcards_only_below() {
        let exact = NamePattern::parse("API.Example.com.").unwrap();
        assert!(exact.matches("api.example.com"));
        assert!(!exact.matches("x.api.example.com"));
        assert!(!exact.matches("example.com"));
        let wild = NamePattern::parse("*.example.com").unwrap();
        assert!(wild.matches("a.example.com"));
        assert!(wild.matches("a.b.example.com"));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("badexample.com"));
        assert!(!wild.matches("a.example.com.evil.org"));
        for bad in [
            "",
            "*.",
            "a..b",
            "-a.com",
            "a b.com",
            "*.*.com",
            "198.18.0.0/15/1",
        ] {
            assert!(NamePattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_allowed_names_resolve_and_never_to_ipv6() {
        let allow = |n: &str| n == "pypi.org";
        assert_eq!(
            decide(&query("pypi.org.", RecordType::A), allow),
            Decision::Forward
        );
        assert_eq!(
            decide(&query("PyPI.org.", RecordType::TXT), allow),
            Decision::Forward
        );
        let Decision::Answer(no) = decide(&query("evil.org.", RecordType::A), allow) else {
            panic!("a refusal")
        };
        assert_eq!(code(&no), ResponseCode::NXDomain);
        let m = Message::from_vec(&no).unwrap();
        assert_eq!(m.metadata.id, 4242, "the query's id");
        assert_eq!(m.queries.len(), 1, "the question echoed");
        let Decision::Answer(six) = decide(&query("pypi.org.", RecordType::AAAA), allow) else {
            panic!("an empty answer")
        };
        assert_eq!(code(&six), ResponseCode::NoError);
        assert!(Message::from_vec(&six).unwrap().answers.is_empty());
        assert_eq!(decide(b"garbage", allow), Decision::Answer(Vec::new()));
    }

    #[test]
    fn answers_lose_never_reachable_and_ipv6_addresses() {
        let name = Name::from_ascii("pypi.org.").unwrap();
        let cdn = Name::from_ascii("cdn.example.net.").unwrap();
        let mut m = Message::response(7, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::A));
        m.add_answer(Record::from_rdata(
            name.clone(),
            300,
            RData::CNAME(CNAME(cdn.clone())),
        ));
        m.add_answer(Record::from_rdata(
            cdn.clone(),
            60,
            RData::A(A::new(198, 18, 0, 10)),
        ));
        m.add_answer(Record::from_rdata(
            cdn.clone(),
            60,
            RData::A(A::new(169, 254, 169, 254)),
        ));
        m.add_answer(Record::from_rdata(
            cdn.clone(),
            60,
            RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ));
        m.add_additional(Record::from_rdata(cdn, 60, RData::A(A::new(10, 0, 0, 1))));
        let never = super::super::always_never();
        let (bytes, opened) = filter(&m.to_vec().unwrap(), "pypi.org", &never).unwrap();
        assert_eq!(
            opened,
            vec![Resolved {
                name: "pypi.org".into(),
                addr: Ipv4Addr::new(198, 18, 0, 10),
                ttl: 60
            }]
        );
        let back = Message::from_vec(&bytes).unwrap();
        assert_eq!(
            back.answers.len(),
            2,
            "the CNAME and the one address: {back:?}"
        );
        assert!(back.additionals.is_empty());
        // An A record in the answer to another question opens nothing and is not passed on.
        let mut h = Message::response(8, OpCode::Query);
        h.add_query(Query::query(name.clone(), RecordType::HTTPS));
        h.add_answer(Record::from_rdata(
            name,
            60,
            RData::A(A::new(198, 18, 0, 11)),
        ));
        let (bytes, opened) = filter(&h.to_vec().unwrap(), "pypi.org", &never).unwrap();
        assert!(opened.is_empty());
        assert!(Message::from_vec(&bytes).unwrap().answers.is_empty());
        assert_eq!(
            code(&servfail(&query("x.org.", RecordType::A))),
            ResponseCode::ServFail
        );
    }
}
