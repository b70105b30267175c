//! Forward auth for FORWARD_AUTH previews (docs/preview.md, "Access"): the proxy asks a
//! configured endpoint about each request, with the request's method, host, URI and
//! credentials (`Cookie`, `Authorization`). A 2xx allows; any other answer denies, and its
//! status, `Location`, `WWW-Authenticate`, `Content-Type` and (up to 64 KiB of) body go to the
//! browser, so a login redirect works. Answers are remembered per (sandbox, port, credentials)
//! for a while, within a bounded number of entries. An endpoint that fails or is slow denies
//! (fail closed) and nothing is remembered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::proxy::{self, Body};

/// The most body bytes of a deny passed to the browser.
const MAX_DENY_BODY: usize = 64 << 10;

/// The endpoint's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `http://host:port/path`.
    pub url: String,
    /// How long the endpoint may take.
    pub timeout: Duration,
    /// How long an allow is remembered.
    pub allow_for: Duration,
    /// How long a deny is remembered.
    pub deny_for: Duration,
    /// The most remembered answers.
    pub max_entries: usize,
}

/// What a request's credentials get.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Pass it on to the app.
    Allow,
    /// Answer the browser with the endpoint's deny (a 401, 403 or a redirect to a login).
    Deny {
        /// The endpoint's status (a 2xx never; 5xx from the endpoint is passed as it is).
        status: StatusCode,
        /// `Location`, `WWW-Authenticate` and `Content-Type` as the endpoint sent them.
        headers: Vec<(HeaderName, HeaderValue)>,
        /// Its body (at most 64 KiB).
        body: Bytes,
    },
    /// The endpoint failed or did not answer in time: denied, not remembered.
    Unavailable,
}

impl Verdict {
    /// The browser's answer for a verdict that is not Allow.
    pub fn response(&self) -> Option<Response<Body>> {
        match self {
            Verdict::Allow => None,
            Verdict::Deny {
                status,
                headers,
                body,
            } => {
                let mut r = Response::new(proxy::full(body.clone()));
                *r.status_mut() = *status;
                for (k, v) in headers {
                    r.headers_mut().insert(k.clone(), v.clone());
                }
                Some(r)
            }
            Verdict::Unavailable => Some(proxy::page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The preview's sign-in service did not answer. Try again in a moment.",
            )),
        }
    }
}

/// The endpoint's parts: (`host:port` to connect to, the request target, the Host header).
pub fn endpoint(url: &str) -> Result<(String, String, String), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{url:?}: only http:// (a cluster-internal endpoint)"
        ));
    }
    let Some(auth) = uri.authority() else {
        return Err(format!("{url:?}: no host"));
    };
    if auth.as_str().contains('@') {
        return Err(format!("{url:?}: no user info in the URL"));
    }
    let connect = format!("{}:{}", auth.host(), auth.port_u16().unwrap_or(80));
    let target = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    Ok((connect, target, auth.as_str().to_string()))
}

struct Remembered {
    until: Instant,
    verdict: Verdict,
}

/// A forward-auth endpoint and its remembered answers.
pub struct ForwardAuth {
    connect: String,
    target: String,
    host: HeaderValue,
    settings: Settings,
    cache: Mutex<HashMap<[u8; 32], Remembered>>,
}

impl ForwardAuth {
    /// For `settings` (its URL checked as [`endpoint`] does).
    pub fn new(settings: Settings) -> Result<Self, String> {
        let (connect, target, host) = endpoint(&settings.url)?;
        Ok(Self {
            connect,
            target,
            host: HeaderValue::from_str(&host).map_err(|e| e.to_string())?,
            settings,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The verdict on a request for `port` of `sandbox_id` whose head is `head`; `proto` is
    /// the scheme the browser used.
    pub async fn check(
        &self,
        head: &http::request::Parts,
        sandbox_id: &str,
        port: u16,
        proto: &'static str,
    ) -> Verdict {
        let key = cache_key(head, sandbox_id, port);
        let now = Instant::now();
        if let Some(r) = self.cache().get(&key) {
            if r.until > now {
                return r.verdict.clone();
            }
        }
        let verdict = match tokio::time::timeout(
            self.settings.timeout,
            self.ask(head, sandbox_id, port, proto),
        )
        .await
        {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                warn!(sandbox_id, port, error = %e, "forward auth failed: denied");
                return Verdict::Unavailable;
            }
            Err(_) => {
                warn!(
                    sandbox_id,
                    port, "forward auth did not answer in time: denied"
                );
                return Verdict::Unavailable;
            }
        };
        let ttl = match verdict {
            Verdict::Allow => self.settings.allow_for,
            _ => self.settings.deny_for,
        };
        if !ttl.is_zero() {
            let mut c = self.cache();
            if c.len() >= self.settings.max_entries.max(1) {
                c.retain(|_, r| r.until > now);
                // Still full: the ones closest to their end go.
                while c.len() >= self.settings.max_entries.max(1) {
                    let Some(k) = c.iter().min_by_key(|(_, r)| r.until).map(|(k, _)| *k) else {
                        break;
                    };
                    c.remove(&k);
                }
            }
            c.insert(
                key,
                Remembered {
                    until: now + ttl,
                    verdict: verdict.clone(),
                },
            );
        }
        verdict
    }

    /// How many answers are remembered now.
    pub fn remembered(&self) -> usize {
        self.cache().len()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Remembered>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn ask(
        &self,
        head: &http::request::Parts,
        sandbox_id: &str,
        port: u16,
        proto: &'static str,
    ) -> Result<Verdict, String> {
        let mut req = Request::builder()
            .method(http::Method::GET)
            .uri(self.target.as_str())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let h = req.headers_mut();
        h.insert(header::HOST, self.host.clone());
        let mut put = |name: &'static str, v: &str| {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(HeaderName::from_static(name), v);
            }
        };
        put("x-forwarded-method", head.method.as_str());
        put("x-forwarded-proto", proto);
        put(
            "x-forwarded-uri",
            head.uri.path_and_query().map_or("/", |p| p.as_str()),
        );
        put("x-preview-sandbox-id", sandbox_id);
        put("x-preview-port", &port.to_string());
        if let Some(v) = head.headers.get(header::HOST) {
            h.insert(HeaderName::from_static("x-forwarded-host"), v.clone());
        }
        for name in [header::COOKIE, header::AUTHORIZATION] {
            for v in head.headers.get_all(&name) {
                h.append(name.clone(), v.clone());
            }
        }
        let stream = TcpStream::connect(&self.connect)
            .await
            .map_err(|e| format!("connect {}: {e}", self.connect))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "forward auth connection ended");
            }
        });
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        if parts.status.is_success() {
            return Ok(Verdict::Allow);
        }
        let body = Limited::new(body, MAX_DENY_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let headers = [
            header::LOCATION,
            header::WWW_AUTHENTICATE,
            header::CONTENT_TYPE,
        ]
        .into_iter()
        .filter_map(|n| parts.headers.get(&n).map(|v| (n.clone(), v.clone())))
        .collect();
        Ok(Verdict::Deny {
            status: parts.status,
            headers,
            body,
        })
    }
}

/// SHA-256 of what an answer depends on: the exposure and the request's credentials.
fn cache_key(head: &http::request::Parts, sandbox_id: &str, port: u16) -> [u8; 32] {
    let mut d = ring::digest::Context::new(&ring::digest::SHA256);
    d.update(b"forward-auth.v1\0");
    d.update(sandbox_id.as_bytes());
    d.update(b"\0");
    d.update(&port.to_be_bytes());
    for name in [header::COOKIE, header::AUTHORIZATION] {
        for v in head.headers.get_all(&name) {
            d.update(b"\0");
            d.update(name.as_str().as_bytes());
            d.update(b"=");
            d.update(v.as_bytes());
        }
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(d.finish().as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn endpoints_are_plain_http_urls() {
        assert_eq!(
            endpoint("http://auth.svc:8080/check?x=1").unwrap(),
            (
                "auth.svc:8080".into(),
                "/check?x=1".into(),
                "auth.svc:8080".into()
            )
        );
        assert_eq!(endpoint("http://auth").unwrap().0, "auth:80");
        assert!(endpoint("https://auth/").is_err());
        assert!(endpoint("http://u:p@auth/").is_err());
        assert!(endpoint("/check").is_err());
    }

    fn head(cookie: Option<&str>) -> http::request::Parts {
        let mut b = Request::builder()
            .uri("/page?q=1")
            .header(header::HOST, "3000-x.preview.test");
        if let Some(c) = cookie {
            b = b.header(header::COOKIE, c);
        }
        b.body(()).unwrap().into_parts().0
    }

    /// An auth endpoint on a local port: allows `user=alice`, else a redirect to a login;
    /// counts what it is asked.
    async fn endpoint_server(asked: Arc<AtomicUsize>) -> (String, tokio::task::JoinHandle<()>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/check", l.local_addr().unwrap());
        let task = tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let asked = asked.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<_>| {
                        asked.fetch_add(1, Ordering::SeqCst);
                        let ok = req.uri().path() == "/check"
                            && req.headers()["x-forwarded-uri"] == "/page?q=1"
                            && req.headers()["x-forwarded-host"] == "3000-x.preview.test"
                            && req.headers()["x-preview-port"] == "3000"
                            && req
                                .headers()
                                .get(header::COOKIE)
                                .is_some_and(|c| c == "user=alice");
                        let r = if ok {
                            Response::builder().status(204).body(proxy::full(""))
                        } else {
                            Response::builder()
                                .status(302)
                                .header(header::LOCATION, "https://login.test/")
                                .header("x-other", "kept back")
                                .body(proxy::full("sign in"))
                        };
                        async move { Ok::<_, std::convert::Infallible>(r.unwrap()) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (url, task)
    }

    #[tokio::test]
    async fn allows_denies_remembers_and_fails_closed() {
        let asked = Arc::new(AtomicUsize::new(0));
        let (url, server) = endpoint_server(asked.clone()).await;
        let fa = ForwardAuth::new(Settings {
            url,
            timeout: Duration::from_secs(2),
            allow_for: Duration::from_secs(30),
            deny_for: Duration::from_millis(200),
            max_entries: 2,
        })
        .unwrap();
        let alice = head(Some("user=alice"));
        assert!(matches!(
            fa.check(&alice, "x", 3000, "https").await,
            Verdict::Allow
        ));
        assert!(matches!(
            fa.check(&alice, "x", 3000, "https").await,
            Verdict::Allow
        ));
        assert_eq!(asked.load(Ordering::SeqCst), 1, "an allow is remembered");
        // Another port is another exposure: asked again (and denied: the endpoint checks it).
        assert!(matches!(
            fa.check(&alice, "x", 3001, "https").await,
            Verdict::Deny { .. }
        ));
        assert_eq!(asked.load(Ordering::SeqCst), 2);

        let anon = head(None);
        let v = fa.check(&anon, "x", 3000, "https").await;
        let r = v.response().expect("a deny answers");
        assert_eq!(r.status(), StatusCode::FOUND);
        assert_eq!(r.headers()[header::LOCATION], "https://login.test/");
        assert!(r.headers().get("x-other").is_none());
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"sign in");
        assert!(fa.remembered() <= 2, "bounded: {}", fa.remembered());
        // A deny is remembered briefly.
        fa.check(&anon, "x", 3000, "https").await;
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        tokio::time::sleep(Duration::from_millis(250)).await;
        fa.check(&anon, "x", 3000, "https").await;
        assert_eq!(asked.load(Ordering::SeqCst), 4);

        // The endpoint gone: new credentials are denied (fail closed), not remembered.
        server.abort();
        let _ = server.await;
        let bob = head(Some("user=bob"));
        let v = fa.check(&bob, "x", 3000, "https").await;
        assert!(matches!(v, Verdict::Unavailable), "{v:?}");
        assert_eq!(
            v.response().unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn a_slow_endpoint_denies_in_time() {
        // Accepts and never answers.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", l.local_addr().unwrap());
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        let fa = ForwardAuth::new(Settings {
            url,
            timeout: Duration::from_millis(300),
            allow_for: Duration::from_secs(30),
            deny_for: Duration::from_secs(5),
            max_entries: 10,
        })
        .unwrap();
        let t = Instant::now();
        let v = fa.check(&head(Some("user=alice")), "x", 3000, "http").await;
        assert!(matches!(v, Verdict::Unavailable), "{v:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(fa.remembered(), 0);
    }
}
