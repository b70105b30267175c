//! The router's preview proxy routes (docs/preview.md): a preview host name names its sandbox,
//! the sandbox's owner is found as for every call ([`Router::owner`]), and the request goes
//! to that node's preview listener with its Host kept. Access is checked on the node, where
//! the exposure is recorded; the router only moves bytes (streams, upgrades and limits are
//! the shared proxy's, `crate::preview::proxy`).

use std::net::{IpAddr, SocketAddr};

use http::StatusCode;
use tracing::debug;

use super::{Error, NodeEndpoint, Router};
use crate::preview::host;
use crate::preview::proxy::{self, Route};

/// Routes preview requests to the node that owns their sandbox.
pub struct Routes {
    router: Router,
    domain: String,
    node_port: u16,
}

impl Routes {
    /// Over `router`, for host names under `domain`, to the nodes' preview listeners on
    /// `node_port`.
    pub fn new(router: Router, domain: &str, node_port: u16) -> Self {
        Self {
            router,
            domain: domain.to_string(),
            node_port,
        }
    }
}

/// The address of `node`'s preview listener: its gRPC URL's host (resolved if it is a name)
/// and `port`.
async fn preview_addr(node: &NodeEndpoint, port: u16) -> Option<SocketAddr> {
    let uri: http::Uri = node.url.parse().ok()?;
    let host = uri
        .host()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    let found = tokio::net::lookup_host((host.as_str(), port))
        .await
        .ok()?
        .next();
    found
}

#[async_trait::async_trait]
impl proxy::Routes for Routes {
    async fn route(&self, head: &http::request::Parts) -> Route {
        let not_found = || {
            Route::Respond(proxy::page(
                StatusCode::NOT_FOUND,
                "There is no preview at this address.",
            ))
        };
        let Some(target) = host::of_request(head, &self.domain) else {
            return not_found();
        };
        let node = match self.router.owner(&target.sandbox_id).await {
            Ok(n) => n,
            Err(Error::Unavailable(why)) => {
                debug!(sandbox_id = %target.sandbox_id, %why, "preview: owner unavailable");
                return Route::Respond(proxy::page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The node running this sandbox cannot be reached. Try again in a moment.",
                ));
            }
            Err(_) => return not_found(),
        };
        let Some(addr) = preview_addr(&node, self.node_port).await else {
            return Route::Respond(proxy::page(
                StatusCode::BAD_GATEWAY,
                "The node running this sandbox has no preview address.",
            ));
        };
        Route::Forward {
            addr,
            set_cookie: None,
            // The node checks (and strips) its access cookie.
            strip_cookie: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_nodes_preview_address_is_its_url_host_and_the_preview_port() {
        let n = |url: &str| NodeEndpoint {
            name: "n".into(),
            url: url.into(),
            cordoned: false,
        };
        assert_eq!(
            preview_addr(&n("http://10.0.0.5:50051"), 8088).await,
            Some("10.0.0.5:8088".parse().unwrap())
        );
        assert_eq!(
            preview_addr(&n("https://[fd00::5]:50051"), 8088).await,
            Some("[fd00::5]:8088".parse().unwrap())
        );
        let local = preview_addr(&n("http://localhost:50051"), 8088)
            .await
            .expect("localhost resolves");
        assert!(local.ip().is_loopback() && local.port() == 8088, "{local}");
        assert_eq!(preview_addr(&n("not a url"), 8088).await, None);
    }
}
