//! Unit tests of [`super`]: the router's TLS flags, for dialing nodes and for its own listener.

use super::*;

#[test]
fn node_tls_flags_go_together() {
    let d = tempfile::tempdir().unwrap();
    write_test_pki(d.path());
    let f = |n: &str| Some(d.path().join(n));
    let none = None;
    // (ca, cert, key, server name) → Ok(mutual?) or the error's text.
    #[allow(clippy::type_complexity)]
    let table: Vec<(
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
        Option<&str>,
        Result<Option<bool>, &str>,
    )> = vec![
        (none.clone(), none.clone(), none.clone(), None, Ok(None)),
        (
            Some(PathBuf::new()),
            Some(PathBuf::new()),
            none.clone(),
            Some(""),
            Ok(None),
        ),
        (
            f("ca.pem"),
            none.clone(),
            none.clone(),
            None,
            Ok(Some(false)),
        ),
        (
            f("ca.pem"),
            f("cert.pem"),
            f("key.pem"),
            None,
            Ok(Some(true)),
        ),
        (
            f("ca.pem"),
            f("cert.pem"),
            f("key.pem"),
            Some("computed-node.compute-system.svc"),
            Ok(Some(true)),
        ),
        (
            f("ca.pem"),
            none.clone(),
            none.clone(),
            Some("10.0.0.5"),
            Ok(Some(false)),
        ),
        (
            f("ca.pem"),
            f("cert.pem"),
            none.clone(),
            None,
            Err("--node-tls-cert needs --node-tls-key"),
        ),
        (
            f("ca.pem"),
            none.clone(),
            f("key.pem"),
            None,
            Err("--node-tls-key needs --node-tls-cert"),
        ),
        (
            none.clone(),
            none.clone(),
            f("key.pem"),
            None,
            Err("--node-tls-key needs --node-tls-cert"),
        ),
        (
            none.clone(),
            f("cert.pem"),
            f("key.pem"),
            None,
            Err("need --node-tls-ca"),
        ),
        (
            none.clone(),
            none.clone(),
            none.clone(),
            Some("x"),
            Err("--node-tls-server-name needs --node-tls-ca"),
        ),
        (
            f("ca.pem"),
            none.clone(),
            none.clone(),
            Some("not a name!"),
            Err("not a DNS name"),
        ),
        (
            f("missing.pem"),
            none.clone(),
            none.clone(),
            None,
            Err("--node-tls-ca"),
        ),
        (
            f("garbage.pem"),
            none.clone(),
            none.clone(),
            None,
            Err("no PEM certificate"),
        ),
        (
            f("ca.pem"),
            f("cert.pem"),
            f("garbage.pem"),
            None,
            Err("--node-tls-key"),
        ),
        (
            f("ca.pem"),
            f("cert.pem"),
            f("other.key"),
            None,
            Err("--node-tls-cert/--node-tls-key"),
        ),
    ];
    for (ca, cert, key, name, want) in table {
        let got = NodeTls::load(ca.as_deref(), cert.as_deref(), key.as_deref(), name);
        let case = format!("{ca:?} {cert:?} {key:?} {name:?}");
        match (got, want) {
            (Ok(t), Ok(m)) => assert_eq!(t.map(|t| t.is_mutual()), m, "{case}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{case}: {e}"),
            (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn listener_flags_go_together() {
    let d = tempfile::tempdir().unwrap();
    write_test_pki(d.path());
    let f = |n: &str| Some(d.path().join(n));
    let none: Option<PathBuf> = None;
    #[allow(clippy::type_complexity)]
    let table: Vec<(
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
        Result<bool, &str>,
    )> = vec![
        (none.clone(), none.clone(), none.clone(), Ok(false)),
        (f("cert.pem"), f("key.pem"), none.clone(), Ok(true)),
        (f("cert.pem"), f("key.pem"), f("ca.pem"), Ok(true)),
        (
            f("cert.pem"),
            none.clone(),
            none.clone(),
            Err("--tls-cert needs --tls-key"),
        ),
        (
            none.clone(),
            f("key.pem"),
            none.clone(),
            Err("--tls-key needs --tls-cert"),
        ),
        (
            none.clone(),
            none.clone(),
            f("ca.pem"),
            Err("--tls-client-ca needs"),
        ),
        (
            f("cert.pem"),
            f("missing.key"),
            none.clone(),
            Err("--tls-key"),
        ),
        (
            f("cert.pem"),
            f("key.pem"),
            f("garbage.pem"),
            Err("--tls-client-ca"),
        ),
        (
            f("cert.pem"),
            f("other.key"),
            none.clone(),
            Err("--tls-cert/--tls-key"),
        ),
    ];
    for (cert, key, ca, want) in table {
        let got = listener(cert.as_deref(), key.as_deref(), ca.as_deref());
        let case = format!("{cert:?} {key:?} {ca:?}");
        match (got, want) {
            (Ok(t), Ok(on)) => assert_eq!(t.is_some(), on, "{case}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{case}: {e}"),
            (got, want) => panic!("{case}: got {:?}, want {want:?}", got.map(|t| t.is_some())),
        }
    }
}
