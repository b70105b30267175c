//! TLS on both sides of the router: dialing the node daemons (`--node-tls-*`: server-verified
//! TLS with a CA alone, mutual TLS with a client certificate too) and its own listener
//! (`--tls-*`, built by the node's listener code in [`crate::server`]).
//!
//! Server names: a node is dialed at the address discovery gives (its pod IP, or the
//! `host[:port]` of a static list) and its certificate is verified against that host, so it
//! needs an IP SAN for a pod IP or a DNS SAN for a host name. With `--node-tls-server-name NAME`
//! every node's certificate is verified against NAME instead: one DNS name that all node
//! certificates carry (e.g. `computed-node.compute-system.svc`), for certificates issued
//! without knowing the pod IPs. Either way the chain must lead to `--node-tls-ca`.
//!
//! Everything here is read and checked at start-up, before a port is bound: a missing file, a
//! file without a PEM certificate or key, a key that does not match its certificate, or flags
//! that only make sense together given apart are an [`Error`] (the binary exits 64).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// A TLS setting of the router that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Flags that go together were given apart, or a value is malformed.
    #[error("{0}")]
    Invalid(String),
    /// A file named by a flag could not be read.
    #[error("{flag} {path}: {source}")]
    Read {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file named by a flag holds no usable PEM certificate or key.
    #[error("{flag} {path}: {what}")]
    Pem {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
}

/// The scheme of node URLs: `https` exactly when the router dials nodes with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plaintext HTTP/2.
    Http,
    /// TLS.
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// How the router dials node daemons over TLS: the CA their certificates must chain to, the
/// client certificate it presents (mutual TLS) if any, and the name it verifies them against
/// if not the dialed host. Cheap to clone.
#[derive(Clone)]
pub struct NodeTls {
    ca: Certificate,
    identity: Option<Identity>,
    server_name: Option<String>,
}

impl fmt::Debug for NodeTls {
    // Not derived: Identity's Debug prints the private key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTls")
            .field("mutual", &self.is_mutual())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Only the non-empty paths (an environment variable set to "" is unset).
fn given(p: Option<&Path>) -> Option<&Path> {
    p.filter(|p| !p.as_os_str().is_empty())
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

/// The file's bytes, if they hold at least one PEM certificate and nothing unparsable.
fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read(flag, path)?;
    let bad = |what: String| Error::Pem {
        flag,
        path: path.to_path_buf(),
        what,
    };
    let n = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate: {e}")))?
        .len();
    if n == 0 {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(pem)
}

/// The file's bytes, if they hold a PEM private key.
fn read_key(flag: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| Error::Pem {
        flag,
        path: path.to_path_buf(),
        what: format!("no PEM private key in it: {e}"),
    })?;
    Ok(pem)
}

impl NodeTls {
    /// Loads `--node-tls-ca`, `--node-tls-cert`, `--node-tls-key` and
    /// `--node-tls-server-name`. None of them: `None` (nodes are dialed in plaintext). The CA
    /// alone: server-verified TLS. CA, certificate and key: mutual TLS. A certificate without
    /// its key (or the reverse), or a certificate or server name without the CA, is an error.
    pub fn load(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        server_name: Option<&str>,
    ) -> Result<Option<Self>, Error> {
        let (ca, cert, key) = (given(ca), given(cert), given(key));
        let server_name = server_name.filter(|s| !s.is_empty());
        match (cert, key) {
            (Some(_), None) => {
                return Err(Error::Invalid(
                    "--node-tls-cert needs --node-tls-key (the client certificate's private key)"
                        .into(),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::Invalid(
                    "--node-tls-key needs --node-tls-cert (the client certificate it signs for)"
                        .into(),
                ))
            }
            _ => {}
        }
        let Some(ca) = ca else {
            if cert.is_some() {
                return Err(Error::Invalid(
                    "--node-tls-cert and --node-tls-key need --node-tls-ca: the nodes' \
                     certificates are verified against it"
                        .into(),
                ));
            }
            if server_name.is_some() {
                return Err(Error::Invalid(
                    "--node-tls-server-name needs --node-tls-ca".into(),
                ));
            }
            return Ok(None);
        };
        if let Some(name) = server_name {
            ServerName::try_from(name).map_err(|e| {
                Error::Invalid(format!(
                    "--node-tls-server-name {name:?} is not a DNS name or IP address: {e}"
                ))
            })?;
        }
        let ca = Certificate::from_pem(read_certs("--node-tls-ca", ca)?);
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some(Identity::from_pem(
                read_certs("--node-tls-cert", c)?,
                read_key("--node-tls-key", k)?,
            )),
            _ => None,
        };
        let tls = NodeTls {
            ca,
            identity,
            server_name: server_name.map(String::from),
        };
        // Build a connector once, as every node's channel will: rustls checks the key against
        // the certificate here rather than at the first handshake.
        Endpoint::from_static("https://node.invalid")
            .tls_config(tls.client_config(Duration::from_secs(1)))
            .map_err(|e| {
                Error::Invalid(format!(
                    "--node-tls-cert/--node-tls-key: {}",
                    crate::server::error_chain(&e)
                ))
            })?;
        Ok(Some(tls))
    }

    /// Whether the router presents a client certificate (mutual TLS).
    pub fn is_mutual(&self) -> bool {
        self.identity.is_some()
    }

    /// The name node certificates are verified against instead of the dialed host, if set.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// tonic's client settings; the TLS handshake must finish within `handshake_timeout`.
    pub fn client_config(&self, handshake_timeout: Duration) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .timeout(handshake_timeout);
        if let Some(id) = &self.identity {
            c = c.identity(id.clone());
        }
        if let Some(name) = &self.server_name {
            c = c.domain_name(name.clone());
        }
        c
    }
}

/// The scheme of node URLs under `tls`.
pub fn scheme(tls: Option<&NodeTls>) -> Scheme {
    if tls.is_some() {
        Scheme::Https
    } else {
        Scheme::Http
    }
}

/// Loads the router listener's `--tls-cert`, `--tls-key` and `--tls-client-ca` with the
/// node's listener code ([`crate::server::tls_files`]). None of them: `None` (plaintext).
/// Certificate and key: TLS. With the client CA too: callers must present a certificate signed
/// by it (mutual TLS, gRPC health included). A certificate without its key (or the reverse),
/// or a client CA without them, is an error.
pub fn listener(
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
) -> Result<Option<ServerTlsConfig>, Error> {
    let (cert, key, client_ca) = (given(cert), given(key), given(client_ca));
    let (cert, key) = match (cert, key) {
        (Some(c), Some(k)) => (c, k),
        (Some(_), None) => return Err(Error::Invalid("--tls-cert needs --tls-key".into())),
        (None, Some(_)) => return Err(Error::Invalid("--tls-key needs --tls-cert".into())),
        (None, None) if client_ca.is_some() => {
            return Err(Error::Invalid(
                "--tls-client-ca needs --tls-cert and --tls-key".into(),
            ))
        }
        (None, None) => return Ok(None),
    };
    // Read and parsed here for a message naming the flag; served from the same files.
    read_certs("--tls-cert", cert)?;
    read_key("--tls-key", key)?;
    if let Some(ca) = client_ca {
        read_certs("--tls-client-ca", ca)?;
    }
    let invalid = |e: crate::server::Error| Error::Invalid(format!("--tls-cert/--tls-key: {e}"));
    let tls =
        crate::server::tls_files(cert, key, client_ca.unwrap_or(Path::new(""))).map_err(invalid)?;
    if let Some(t) = &tls {
        crate::server::check_server_tls(t).map_err(invalid)?;
    }
    Ok(tls)
}

/// Test PEM files in `dir`: `ca.pem`, a leaf it signed (`cert.pem`, `key.pem`, for
/// `localhost`), a key of nothing (`other.key`) and `garbage.pem`.
#[cfg(test)]
pub(crate) fn write_test_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let other_key = KeyPair::generate().unwrap();
    for (name, data) in [
        ("ca.pem", ca.pem()),
        ("cert.pem", leaf.pem()),
        ("key.pem", key.serialize_pem()),
        ("other.key", other_key.serialize_pem()),
        ("garbage.pem", "not pem at all\n".to_string()),
    ] {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

#[cfg(test)]
mod tests;
