//! Preview URLs on the node (issue 21, docs/preview.md): a networked sandbox's exposures
//! (recorded in its labels), the signed URLs of ExposeSandboxPort, and the routes of the
//! node's preview proxy (which reaches apps at their sandbox's address, through its veth: the
//! sandbox's byte counters count preview traffic).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::sandbox::Status;
use super::{record, Error, Node, Result};
use crate::config::PreviewConfig;
use crate::preview::forward_auth::{self, ForwardAuth};
use crate::preview::proxy::{self, Route};
use crate::preview::token::Signer;
use crate::preview::{self as pv, host};

/// The proxy's own cookie: a signed URL's token, so the app's links keep working.
pub const COOKIE: &str = "compute_preview";
/// The query parameter a signed URL carries its token in.
pub const QUERY: &str = "preview_token";

/// How a preview is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// With a signed, expiring token (in the URL, then a cookie).
    SignedUrl,
    /// As a configured auth endpoint says, per request.
    ForwardAuth,
    /// By anyone who has the URL.
    Public,
}

/// One exposed port of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exposure {
    /// The sandbox's port.
    pub port: u16,
    /// How it is reached.
    pub access: Access,
    /// When it was (last) exposed, ms since the epoch.
    pub created_at_ms: u64,
}

/// What ExposeSandboxPort answers.
#[derive(Debug, Clone)]
pub struct Exposed {
    /// The exposure as recorded.
    pub exposure: Exposure,
    /// The preview URL (a signed one with its token).
    pub url: String,
    /// The token and its expiry (Unix seconds): signed URLs only.
    pub token: Option<(String, u64)>,
}

/// The node's preview settings and signing key (`[preview]`).
pub(super) struct Preview {
    cfg: PreviewConfig,
    signer: Signer,
    /// FORWARD_AUTH's endpoint (`forward_auth_url`), if configured.
    auth: Option<ForwardAuth>,
}

impl Preview {
    /// From the configuration (None without `[preview]`).
    pub(super) fn new(cfg: &crate::config::Config) -> std::result::Result<Option<Self>, pv::Error> {
        let Some(p) = &cfg.preview else {
            return Ok(None);
        };
        let auth = (!p.forward_auth_url.is_empty())
            .then(|| {
                ForwardAuth::new(forward_auth::Settings {
                    url: p.forward_auth_url.clone(),
                    timeout: Duration::from_millis(p.forward_auth_timeout_ms.into()),
                    allow_for: Duration::from_secs(p.forward_auth_allow_cache_secs.into()),
                    deny_for: Duration::from_secs(p.forward_auth_deny_cache_secs.into()),
                    max_entries: p.forward_auth_cache_entries as usize,
                })
                .map_err(|e| pv::Error::Config(format!("forward_auth_url: {e}")))
            })
            .transpose()?;
        Ok(Some(Self {
            signer: Signer::from_file(&p.signing_key_file)?,
            cfg: p.clone(),
            auth,
        }))
    }

    /// The URL of `port` of `id`, without a token.
    fn url(&self, id: &str, port: u16) -> String {
        let host = host::name(&self.cfg.domain, id, port);
        match self.cfg.public_port {
            0 => format!("{}://{host}/", self.cfg.scheme),
            p => format!("{}://{host}:{p}/", self.cfg.scheme),
        }
    }
}

/// The exposures recorded in a sandbox's labels.
pub(super) fn exposures_of_labels(labels: &HashMap<String, String>) -> Vec<Exposure> {
    record::unchunk_labels("preview-ports", labels)
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default()
}

fn exposures_labels(v: &[Exposure]) -> HashMap<String, String> {
    record::chunk_labels(
        "preview-ports",
        &serde_json::to_string(v).unwrap_or_default(),
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Node {
    fn preview(&self) -> Result<&Preview> {
        self.inner.preview.as_ref().ok_or_else(|| {
            Error::Unimplemented(
                "preview URLs are not configured on this node ([preview] in its config)".into(),
            )
        })
    }

    /// The proxy's settings, or None without `[preview]`: (listen address, settings).
    pub fn preview_proxy_settings(&self) -> Option<(String, proxy::Settings)> {
        let p = &self.inner.preview.as_ref()?.cfg;
        Some((
            p.listen.clone(),
            proxy::Settings {
                header_timeout: std::time::Duration::from_secs(p.header_timeout_secs.into()),
                response_timeout: std::time::Duration::from_secs(p.response_timeout_secs.into()),
                max_request_body: p.max_request_body.bytes(),
                max_connections: p.max_connections as usize,
                forwarded_proto: if p.scheme == "https" { "https" } else { "http" },
                ..proxy::Settings::default()
            },
        ))
    }

    /// ExposeSandboxPort: records the exposure (idempotent per port: a second call replaces
    /// its access) and, for a signed URL, mints a token valid `ttl_sec` (0: the default).
    pub async fn expose_port(
        &self,
        id: &str,
        port: u32,
        access: Access,
        ttl_sec: u32,
    ) -> Result<Exposed> {
        let p = self.preview()?;
        if !host::exposable(port) {
            return Err(Error::InvalidArgument(format!(
                "port {port}: 1-65535, and not 53, 80 or 443 (the egress capture's)"
            )));
        }
        if ttl_sec > p.cfg.max_ttl_secs {
            return Err(Error::InvalidArgument(format!(
                "ttl_sec {ttl_sec}: at most {} (0 = {})",
                p.cfg.max_ttl_secs, p.cfg.default_ttl_secs
            )));
        }
        if access == Access::ForwardAuth && p.auth.is_none() {
            return Err(Error::Unimplemented(
                "FORWARD_AUTH needs [preview] forward_auth_url on this node".into(),
            ));
        }
        let port = port as u16;
        let sb = self.networked_sandbox(id)?;
        let _ops = sb.ops.lock().await;
        let exposure = Exposure {
            port,
            access,
            created_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        let mut all = self.preview_of(&sb.id).map(|(_, v)| v).unwrap_or_default();
        all.retain(|e| e.port != port);
        all.push(exposure.clone());
        all.sort_by_key(|e| e.port);
        self.inner
            .rt
            .set_labels(&sb.id, exposures_labels(&all))
            .await?;
        self.set_exposures(&sb.id, all);
        let mut url = p.url(&sb.id, port);
        let token = if access == Access::SignedUrl {
            let ttl = if ttl_sec == 0 {
                p.cfg.default_ttl_secs
            } else {
                ttl_sec
            };
            let expires = unix_now() + u64::from(ttl);
            let t = p
                .signer
                .sign(&sb.id, port, expires)
                .map_err(|e| Error::Internal(e.to_string()))?;
            url = format!("{url}?{QUERY}={t}");
            Some((t, expires))
        } else {
            None
        };
        info!(sandbox_id = %sb.id, port, ?access, "port exposed");
        Ok(Exposed {
            exposure,
            url,
            token,
        })
    }

    /// UnexposeSandboxPort: drops the port's exposure (a port not exposed is a no-op).
    /// Tokens already issued work until they expire.
    pub async fn unexpose_port(&self, id: &str, port: u32) -> Result<()> {
        self.preview()?;
        let sb = self.networked_sandbox(id)?;
        let _ops = sb.ops.lock().await;
        let mut all = self.preview_of(&sb.id).map(|(_, v)| v).unwrap_or_default();
        let before = all.len();
        all.retain(|e| u32::from(e.port) != port);
        if all.len() == before {
            return Ok(());
        }
        self.inner
            .rt
            .set_labels(&sb.id, exposures_labels(&all))
            .await?;
        self.set_exposures(&sb.id, all);
        info!(sandbox_id = %sb.id, port, "port unexposed");
        Ok(())
    }

    /// The URL (without a token) of `port` of `id`; empty without `[preview]`.
    pub fn preview_url(&self, id: &str, port: u16) -> String {
        self.inner
            .preview
            .as_ref()
            .map(|p| p.url(id, port))
            .unwrap_or_default()
    }

    /// A sandbox's exposures (for Get), empty without a network.
    pub fn exposures(&self, id: &str) -> Vec<Exposure> {
        self.preview_of(id).map(|(_, v)| v).unwrap_or_default()
    }

    /// Where the proxy sends a request (see docs/preview.md, "Access"): the credentials
    /// first, then the sandbox's state.
    pub async fn preview_route(&self, head: &http::request::Parts) -> Route {
        let not_found = || {
            Route::Respond(proxy::page(
                StatusCode::NOT_FOUND,
                "There is no preview at this address.",
            ))
        };
        let Some(p) = self.inner.preview.as_ref() else {
            return not_found();
        };
        let Some(target) = host::of_request(head, &p.cfg.domain) else {
            return not_found();
        };
        let Some((addr, exposures)) = self.preview_of(&target.sandbox_id) else {
            return not_found();
        };
        let exposure = exposures.iter().find(|e| e.port == target.port);
        let now = unix_now();
        let check = |t: &str| {
            p.signer
                .verify(t, &target.sandbox_id, target.port, now)
                .map_err(|why| {
                    debug!(sandbox_id = %target.sandbox_id, port = target.port, %why,
                           "preview token refused");
                })
        };
        let forbidden = || {
            Route::Respond(proxy::page(
                StatusCode::FORBIDDEN,
                "This preview link is not valid (wrong, or expired).",
            ))
        };
        match exposure.map(|e| e.access) {
            Some(Access::Public) => {}
            Some(Access::ForwardAuth) => {
                let Some(auth) = p.auth.as_ref() else {
                    return forbidden();
                };
                let proto = if p.cfg.scheme == "https" {
                    "https"
                } else {
                    "http"
                };
                let verdict = auth
                    .check(head, &target.sandbox_id, target.port, proto)
                    .await;
                if let Some(r) = verdict.response() {
                    return Route::Respond(r);
                }
            }
            // Signed, or no longer exposed: a signed URL's token works until it expires.
            Some(Access::SignedUrl) | None => {
                if let Some(t) = query_token(head.uri.query()) {
                    let Ok(expires) = check(&t) else {
                        return forbidden();
                    };
                    // Into a cookie, and the URL without the token (its links, its history).
                    return Route::Respond(redirect(
                        &without_token(&head.uri),
                        &cookie(&t, expires - now, p.cfg.scheme == "https"),
                    ));
                }
                match cookie_token(&head.headers) {
                    Some(t) if check(&t).is_ok() => {}
                    Some(_) => return forbidden(),
                    None if exposure.is_none() => return not_found(),
                    None => return forbidden(),
                }
            }
        }
        let Ok(sb) = self.get(&target.sandbox_id) else {
            return not_found();
        };
        match sb.status() {
            Status::Ready => Route::Forward {
                addr: SocketAddr::from((addr, target.port)),
                set_cookie: None,
                strip_cookie: Some(COOKIE),
            },
            Status::Suspending | Status::Suspended | Status::Resuming => {
                let mut r = proxy::page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "This sandbox is suspended. It answers again once it is resumed.",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                Route::Respond(r)
            }
            Status::Starting => Route::Respond(proxy::page(
                StatusCode::SERVICE_UNAVAILABLE,
                "This sandbox is starting.",
            )),
            Status::Failed | Status::Destroyed => not_found(),
        }
    }
}

/// The `preview_token` of a query string.
fn query_token(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == QUERY)
        .map(|(_, v)| v.to_string())
}

/// The proxy's cookie in a request.
fn cookie_token(h: &http::HeaderMap) -> Option<String> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The request's path and query without `preview_token`.
fn without_token(uri: &http::Uri) -> String {
    let path = uri.path();
    let rest: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && kv.split('=').next() != Some(QUERY))
        .collect();
    if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", rest.join("&"))
    }
}

/// The host-only cookie that carries a signed URL's token for `max_age` seconds.
fn cookie(token: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        if secure { "; Secure" } else { "" }
    )
}

/// 303 to `location` with `set_cookie`.
fn redirect(location: &str, set_cookie: &str) -> Response<proxy::Body> {
    let mut r = proxy::page(StatusCode::SEE_OTHER, "Opening the preview.");
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(location) {
        h.insert(header::LOCATION, v);
    }
    if let Ok(v) = HeaderValue::from_str(set_cookie) {
        h.insert(header::SET_COOKIE, v);
    }
    r
}

/// The node's routes for its preview proxy.
pub struct Routes(pub Node);

#[async_trait::async_trait]
impl proxy::Routes for Routes {
    async fn route(&self, head: &http::request::Parts) -> Route {
        self.0.preview_route(head).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_leaves_the_url_and_goes_into_a_host_only_cookie() {
        let uri: http::Uri = "/app/?a=1&preview_token=v1.x&b=2".parse().unwrap();
        assert_eq!(query_token(uri.query()).as_deref(), Some("v1.x"));
        assert_eq!(without_token(&uri), "/app/?a=1&b=2");
        let uri: http::Uri = "/?preview_token=v1.x".parse().unwrap();
        assert_eq!(without_token(&uri), "/");
        assert_eq!(query_token(None), None);
        let c = cookie("v1.x", 60, true);
        assert_eq!(
            c,
            "compute_preview=v1.x; Path=/; Max-Age=60; HttpOnly; SameSite=Lax; Secure"
        );
        assert!(!c.to_ascii_lowercase().contains("domain"));
        let mut h = http::HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; compute_preview=v1.y"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("v1.y"));
    }

    #[test]
    fn exposures_round_trip_through_labels() {
        let v = vec![
            Exposure {
                port: 3000,
                access: Access::SignedUrl,
                created_at_ms: 1,
            },
            Exposure {
                port: 8000,
                access: Access::Public,
                created_at_ms: 2,
            },
        ];
        assert_eq!(exposures_of_labels(&exposures_labels(&v)), v);
        assert!(exposures_of_labels(&HashMap::new()).is_empty());
    }
}
