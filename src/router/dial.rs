//! Dialing node daemons: one lazily connected channel per node URL, over TLS exactly when the
//! router has `--node-tls-ca` (a node URL can never downgrade a TLS router to plaintext).

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::{lock, Error, NodeEndpoint, Result, Router};
use crate::api::compute::v1::compute_service_client::ComputeServiceClient;

impl Router {
    /// The channel to a node, made (without connecting yet) on first use.
    pub(super) fn channel(&self, n: &NodeEndpoint) -> Result<Channel> {
        let mut ch = lock(&self.inner.channels);
        if let Some(c) = ch.get(&n.url) {
            return Ok(c.clone());
        }
        let timeout = self.inner.settings.connect_timeout;
        let ep = Endpoint::from_shared(n.url.clone())
            .map_err(|e| Error::Unavailable(format!("bad node URL {}: {e}", n.url)))?
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        // tonic dials an `http://` URL in plaintext even with TLS configured: the scheme is
        // checked here so that a node URL can never downgrade a TLS router.
        let https = n.url.starts_with("https://");
        let ep = match &self.inner.settings.node_tls {
            Some(tls) if https => ep.tls_config(tls.client_config(timeout)).map_err(|e| {
                Error::Unavailable(format!(
                    "node {}: TLS: {}",
                    n.url,
                    crate::server::error_chain(&e)
                ))
            })?,
            Some(_) => {
                return Err(Error::Unavailable(format!(
                    "node {}: refusing plaintext, the router dials nodes with TLS",
                    n.url
                )))
            }
            None if https => {
                return Err(Error::Unavailable(format!(
                    "node {}: TLS URL, but the router has no --node-tls-ca",
                    n.url
                )))
            }
            None => ep,
        };
        let c = ep.connect_lazy();
        ch.insert(n.url.clone(), c.clone());
        Ok(c)
    }

    /// A ComputeService client to a node.
    pub fn client(&self, n: &NodeEndpoint) -> Result<ComputeServiceClient<Channel>> {
        Ok(ComputeServiceClient::new(self.channel(n)?)
            .max_decoding_message_size(crate::server::MAX_MESSAGE)
            .max_encoding_message_size(crate::server::MAX_MESSAGE))
    }

    /// A channel to a node (for the relay services).
    pub fn node_channel(&self, n: &NodeEndpoint) -> Result<Channel> {
        self.channel(n)
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::super::{tls, NodeSet, Settings};
    use super::*;

    #[tokio::test]
    async fn a_tls_router_never_dials_a_node_in_plaintext() {
        let d = tempfile::tempdir().unwrap();
        tls::write_test_pki(d.path());
        let node_tls = tls::NodeTls::load(
            Some(&d.path().join("ca.pem")),
            Some(&d.path().join("cert.pem")),
            Some(&d.path().join("key.pem")),
            None,
        )
        .unwrap();
        let node = |url: &str| NodeEndpoint {
            name: "n".into(),
            url: url.into(),
            cordoned: false,
        };
        let router = |node_tls| {
            let (_tx, rx) = watch::channel(NodeSet::new());
            Router::new(
                rx,
                Settings {
                    node_tls,
                    ..Settings::default()
                },
            )
        };
        let with_tls = router(node_tls);
        assert!(with_tls.channel(&node("https://127.0.0.1:1")).is_ok());
        match with_tls.channel(&node("http://127.0.0.1:1")) {
            Err(Error::Unavailable(m)) => assert!(m.contains("refusing plaintext"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a TLS router made a plaintext channel"),
        }
        let plain = router(None);
        assert!(plain.channel(&node("http://127.0.0.1:1")).is_ok());
        assert!(plain.channel(&node("https://127.0.0.1:1")).is_err());
    }
}
