//! Preview URLs (issue 21; design in docs/preview.md): a sandbox port published on a host name
//! of its own, reached through a reverse proxy on the node and the router.
//!
//! Here: the host names ([`host`]), the signed tokens ([`token`]), forward auth
//! ([`forward_auth`]) and the proxy core ([`proxy`]). ExposeSandboxPort / UnexposeSandboxPort
//! and the node's routes are in `node::preview`, the router's in `router::preview`.

pub mod forward_auth;
pub mod host;
pub mod proxy;
pub mod token;

/// What goes wrong in this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `[preview]` configuration cannot work (a short or unreadable key, say).
    #[error("preview: {0}")]
    Config(String),
}
