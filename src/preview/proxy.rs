//! The preview reverse proxy: HTTP/1.1 and HTTP/2 from browsers, HTTP/1.1 to the app, bodies
//! streamed both ways, `Upgrade` (WebSocket) spliced, and the limits of docs/preview.md.
//!
//! What a request may reach is decided by a [`Routes`] (the node's: by host name, the
//! sandbox's exposures and the access mode); this module only moves bytes and enforces limits.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// A body's error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The bodies the proxy answers with.
pub type Body = BoxBody<Bytes, BoxError>;

/// The proxy's limits and how it names itself to apps.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A client's request headers must arrive within this (HTTP/1.1).
    pub header_timeout: Duration,
    /// The app must answer with its response headers within this.
    pub response_timeout: Duration,
    /// Connecting to the app.
    pub connect_timeout: Duration,
    /// The most bytes of a request body (413 beyond).
    pub max_request_body: u64,
    /// The most client connections at once (more wait to be accepted).
    pub max_connections: usize,
    /// `X-Forwarded-Proto` (`https` behind a TLS ingress).
    pub forwarded_proto: &'static str,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            max_request_body: 64 << 20,
            max_connections: 4096,
            forwarded_proto: "http",
        }
    }
}

/// Where one request goes.
pub enum Route {
    /// To the app listening at `addr`.
    Forward {
        /// The app's address (a sandbox's address and port).
        addr: SocketAddr,
        /// Added to the app's response (the access cookie after a signed URL).
        set_cookie: Option<HeaderValue>,
        /// A cookie of the proxy's own that the app never sees.
        strip_cookie: Option<&'static str>,
    },
    /// Answered by the proxy (403, 404, a redirect, the "sandbox suspended" page).
    Respond(Response<Body>),
}

/// Decides each request's [`Route`].
#[async_trait::async_trait]
pub trait Routes: Send + Sync + 'static {
    /// The route of the request whose head is `head`.
    async fn route(&self, head: &http::request::Parts) -> Route;
}

/// Serves the proxy on `listener` until `stop`; connections in flight finish gracefully.
pub async fn serve(
    listener: TcpListener,
    routes: Arc<dyn Routes>,
    settings: Settings,
    stop: CancellationToken,
) {
    let settings = Arc::new(settings);
    let slots = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    warn!(error = %e, "preview proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (routes, settings, stop) = (routes.clone(), settings.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let header_timeout = settings.header_timeout;
            let svc = hyper::service::service_fn(move |req| {
                let (routes, settings) = (routes.clone(), settings.clone());
                async move { Ok::<_, Infallible>(handle(req, peer, &*routes, &settings).await) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        debug!(error = %e, %peer, "preview connection ended");
                    }
                }
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

/// One request, from its route to the app's response.
async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    routes: &dyn Routes,
    settings: &Settings,
) -> Response<Body> {
    let (mut head, body) = req.into_parts();
    let (addr, set_cookie, strip_cookie) = match routes.route(&head).await {
        Route::Respond(r) => return r,
        Route::Forward {
            addr,
            set_cookie,
            strip_cookie,
        } => (addr, set_cookie, strip_cookie),
    };
    if content_length(&head.headers).is_some_and(|n| n > settings.max_request_body) {
        return page(StatusCode::PAYLOAD_TOO_LARGE, "The request is too large.");
    }
    let upgrade = head.version == Version::HTTP_11 && wants_upgrade(&head.headers);
    let client_upgrade = if upgrade {
        head.extensions.remove::<OnUpgrade>()
    } else {
        None
    };

    // The request as the app gets it: origin form, HTTP/1.1, its Host, no hop-by-hop headers.
    let host = head.headers.get(header::HOST).cloned().or_else(|| {
        head.uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let mut headers = std::mem::take(&mut head.headers);
    let upgrade_to = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut headers);
    join_cookies(&mut headers, strip_cookie);
    if let Some(h) = host {
        headers.insert(header::HOST, h.clone());
        headers.insert(HeaderName::from_static("x-forwarded-host"), h);
    }
    if let Ok(ip) = HeaderValue::from_str(&peer.ip().to_string()) {
        headers.append(HeaderName::from_static("x-forwarded-for"), ip);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(settings.forwarded_proto),
    );
    if let (true, Some(to)) = (upgrade, upgrade_to) {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, to);
    }
    let path = head
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let limit = usize::try_from(settings.max_request_body).unwrap_or(usize::MAX);
    let body: Body = Limited::new(body, limit).boxed();
    let mut up = match Request::builder()
        .method(head.method)
        .uri(path)
        .version(Version::HTTP_11)
        .body(body)
    {
        Ok(r) => r,
        Err(_) => return page(StatusCode::BAD_REQUEST, "The request's target is invalid."),
    };
    *up.headers_mut() = headers;

    let stream =
        match tokio::time::timeout(settings.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                debug!(%addr, error = %e, "preview: the app refused");
                return page(StatusCode::BAD_GATEWAY, "Nothing answers on this port.");
            }
            Err(_) => return too_slow(),
        };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(c) => c,
        Err(_) => return page(StatusCode::BAD_GATEWAY, "Nothing answers on this port."),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "preview: the app's connection ended");
        }
    });
    let resp = match tokio::time::timeout(settings.response_timeout, sender.send_request(up)).await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) if is_too_large(&e) => {
            return page(StatusCode::PAYLOAD_TOO_LARGE, "The request is too large.")
        }
        Ok(Err(e)) => {
            debug!(%addr, error = %e, "preview: the app's response failed");
            return page(StatusCode::BAD_GATEWAY, "The app's response failed.");
        }
        Err(_) => return too_slow(),
    };

    let (mut rhead, rbody) = resp.into_parts();
    if rhead.status == StatusCode::SWITCHING_PROTOCOLS {
        let (Some(client), Some(app)) = (client_upgrade, rhead.extensions.remove::<OnUpgrade>())
        else {
            return page(
                StatusCode::BAD_GATEWAY,
                "The app switched protocols unasked.",
            );
        };
        let to = rhead.headers.get(header::UPGRADE).cloned();
        strip_hop_by_hop(&mut rhead.headers);
        if let Some(to) = to {
            rhead
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            rhead.headers.insert(header::UPGRADE, to);
        }
        tokio::spawn(async move {
            if let (Ok(c), Ok(a)) = tokio::join!(client, app) {
                let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
                let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
            }
        });
        return Response::from_parts(rhead, empty());
    }
    strip_hop_by_hop(&mut rhead.headers);
    host_only_cookies(&mut rhead.headers);
    if let Some(c) = set_cookie {
        rhead.headers.append(header::SET_COOKIE, c);
    }
    Response::from_parts(rhead, rbody.map_err(BoxError::from).boxed())
}

/// 504: the app did not connect or answer within its time.
fn too_slow() -> Response<Body> {
    page(
        StatusCode::GATEWAY_TIMEOUT,
        "The app did not answer in time.",
    )
}

/// A short HTML page of the proxy's own.
pub fn page(status: StatusCode, text: &str) -> Response<Body> {
    let title = status.canonical_reason().unwrap_or("Error");
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p>{}</p></body></html>\n",
        escape(text)
    );
    let mut r = Response::new(full(html));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A body of `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn wants_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

/// Whether a failed exchange failed on the request body's limit.
fn is_too_large(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Removes the hop-by-hop headers (RFC 9110 §7.6.1), those that `Connection` names included.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
}

/// One `Cookie` header for HTTP/1.1 (HTTP/2 clients send one per cookie), without `strip`.
fn join_cookies(h: &mut HeaderMap, strip: Option<&str>) {
    let pairs: Vec<String> = h
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .filter(|p| strip.is_none_or(|s| p.split('=').next().map(str::trim) != Some(s)))
        .map(String::from)
        .collect();
    h.remove(header::COOKIE);
    if !pairs.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&pairs.join("; ")) {
            h.insert(header::COOKIE, v);
        }
    }
}

/// Drops `Domain=` from every `Set-Cookie`: an app's cookies stay with its own origin and
/// never reach another preview under the same domain.
fn host_only_cookies(h: &mut HeaderMap) {
    let cookies: Vec<HeaderValue> = h.get_all(header::SET_COOKIE).iter().cloned().collect();
    if cookies.is_empty() {
        return;
    }
    h.remove(header::SET_COOKIE);
    for c in cookies {
        let Ok(s) = c.to_str() else {
            // Not text: nothing we can vouch for.
            continue;
        };
        let kept: Vec<&str> = s
            .split(';')
            .filter(|a| {
                !a.split('=')
                    .next()
                    .is_some_and(|k| k.trim().eq_ignore_ascii_case("domain"))
            })
            .map(str::trim)
            .collect();
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            h.append(header::SET_COOKIE, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Notify;

    /// The app: `/echo` answers what it got, `/stream` sends a chunk and the rest only when
    /// told, `/ws` switches to an echo of bytes, `/slow` never answers.
    async fn app(release: Arc<Notify>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                let release = release.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let release = release.clone();
                        async move { Ok::<_, Infallible>(app_answer(req, release).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        addr
    }

    async fn app_answer(mut req: Request<Incoming>, release: Arc<Notify>) -> Response<Body> {
        match req.uri().path() {
            "/echo" => {
                let mut text = format!("{} {}\n", req.method(), req.uri());
                let mut names: Vec<&str> = req.headers().keys().map(|k| k.as_str()).collect();
                names.sort();
                names.dedup();
                for n in names {
                    for v in req.headers().get_all(n) {
                        text += &format!("{n}: {}\n", v.to_str().unwrap());
                    }
                }
                let body = req.into_body().collect().await.unwrap().to_bytes();
                text += &format!("body {}\n", body.len());
                Response::builder()
                    .header("set-cookie", "a=1; Domain=preview.test; Path=/; HttpOnly")
                    .header("connection", "x-private")
                    .header("x-private", "1")
                    .header("x-app", "yes")
                    .body(full(text))
                    .unwrap()
            }
            "/stream" => {
                let (tx, rx) =
                    tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, BoxError>>(2);
                tokio::spawn(async move {
                    tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"first"))))
                        .await
                        .unwrap();
                    release.notified().await;
                    let _ = tx
                        .send(Ok(hyper::body::Frame::data(Bytes::from_static(b"second"))))
                        .await;
                });
                let body = http_body_util::StreamBody::new(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                );
                Response::new(BodyExt::boxed(body))
            }
            "/ws" => {
                let on = hyper::upgrade::on(&mut req);
                tokio::spawn(async move {
                    let mut io = TokioIo::new(on.await.unwrap());
                    let mut buf = [0u8; 1024];
                    loop {
                        let n = io.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        io.write_all(&buf[..n]).await.unwrap();
                    }
                });
                Response::builder()
                    .status(StatusCode::SWITCHING_PROTOCOLS)
                    .header("connection", "upgrade")
                    .header("upgrade", "websocket")
                    .body(empty())
                    .unwrap()
            }
            _ => {
                release.notified().await;
                Response::new(empty())
            }
        }
    }

    struct To(SocketAddr);

    #[async_trait::async_trait]
    impl Routes for To {
        async fn route(&self, head: &http::request::Parts) -> Route {
            if head.uri.path() == "/denied" {
                return Route::Respond(page(StatusCode::FORBIDDEN, "no <entry>"));
            }
            Route::Forward {
                addr: self.0,
                set_cookie: Some(HeaderValue::from_static("proxy=tok; Path=/; HttpOnly")),
                strip_cookie: Some("proxy"),
            }
        }
    }

    async fn proxy(to: SocketAddr, settings: Settings) -> (SocketAddr, CancellationToken) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(l, Arc::new(To(to)), settings, stop.clone()));
        (addr, stop)
    }

    async fn h1(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Body> {
        let s = TcpStream::connect(addr).await.unwrap();
        let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
            .await
            .unwrap();
        tokio::spawn(conn.with_upgrades());
        tx
    }

    async fn text(r: Response<Incoming>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_request_reaches_the_app_without_hop_headers_and_its_cookies_stay_host_only() {
        let app = app(Arc::new(Notify::new())).await;
        let (p, _stop) = proxy(app, Settings::default()).await;
        let mut c = h1(p).await;
        let r = c
            .send_request(
                Request::post("/echo?q=1")
                    .header("host", "8080-x.preview.test")
                    .header("cookie", "proxy=secret; theirs=2")
                    .header("connection", "keep-alive, x-hop")
                    .header("x-hop", "gone")
                    .header("te", "trailers")
                    .header("x-end", "kept")
                    .body(full("hello"))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let set: Vec<_> = r
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            set,
            ["a=1; Path=/; HttpOnly", "proxy=tok; Path=/; HttpOnly"]
        );
        assert!(r.headers().get("x-private").is_none(), "{:?}", r.headers());
        assert_eq!(r.headers()["x-app"], "yes");
        let t = text(r).await;
        assert!(t.starts_with("POST /echo?q=1\n"), "{t}");
        assert!(t.contains("cookie: theirs=2\n"), "{t}");
        assert!(!t.contains("secret"), "{t}");
        assert!(t.contains("host: 8080-x.preview.test\n"), "{t}");
        assert!(t.contains("x-forwarded-host: 8080-x.preview.test\n"), "{t}");
        assert!(t.contains("x-forwarded-for: 127.0.0.1\n"), "{t}");
        assert!(t.contains("x-forwarded-proto: http\n"), "{t}");
        assert!(t.contains("x-end: kept\n"), "{t}");
        assert!(!t.contains("x-hop") && !t.contains("\nte:"), "{t}");
        assert!(t.ends_with("body 5\n"), "{t}");

        // The proxy's own answers pass as they are, escaped.
        let r = c
            .send_request(Request::get("/denied").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(text(r).await.contains("no &lt;entry&gt;"));
    }

    #[tokio::test]
    async fn http2_clients_are_served_and_their_cookies_joined() {
        let app = app(Arc::new(Notify::new())).await;
        let (p, _stop) = proxy(app, Settings::default()).await;
        let s = TcpStream::connect(p).await.unwrap();
        let (mut c, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
                .await
                .unwrap();
        tokio::spawn(conn);
        let r = c
            .send_request(
                Request::get("http://8080-x.preview.test/echo")
                    .version(Version::HTTP_2)
                    .header("cookie", "a=1")
                    .header("cookie", "proxy=secret")
                    .header("cookie", "b=2")
                    .body(empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.version(), Version::HTTP_2);
        let t = text(r).await;
        assert!(t.contains("host: 8080-x.preview.test\n"), "{t}");
        assert!(t.contains("cookie: a=1; b=2\n"), "{t}");
    }

    #[tokio::test]
    async fn responses_stream_and_upgrades_are_spliced() {
        let release = Arc::new(Notify::new());
        let app = app(release.clone()).await;
        let (p, _stop) = proxy(app, Settings::default()).await;
        let mut c = h1(p).await;
        let r = c
            .send_request(Request::get("/stream").body(empty()).unwrap())
            .await
            .unwrap();
        let mut body = r.into_body();
        // The first chunk arrives while the app still holds the rest.
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"first");
        release.notify_one();
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"second");

        let mut c = h1(p).await;
        let mut r = c
            .send_request(
                Request::get("/ws")
                    .header("connection", "Upgrade")
                    .header("upgrade", "websocket")
                    .body(empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(r.headers()["upgrade"], "websocket");
        let mut io = TokioIo::new(hyper::upgrade::on(&mut r).await.unwrap());
        for msg in [&b"ping"[..], &[0u8, 255, 10, 13][..]] {
            io.write_all(msg).await.unwrap();
            let mut got = vec![0u8; msg.len()];
            io.read_exact(&mut got).await.unwrap();
            assert_eq!(got, msg);
        }
    }

    #[tokio::test]
    async fn limits_and_a_missing_app_get_precise_answers() {
        let app = app(Arc::new(Notify::new())).await;
        let settings = Settings {
            max_request_body: 1000,
            response_timeout: Duration::from_millis(300),
            ..Settings::default()
        };
        let (p, _stop) = proxy(app, settings.clone()).await;
        let mut c = h1(p).await;
        // Declared too large.
        let r = c
            .send_request(Request::post("/echo").body(full(vec![b'x'; 1001])).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // Streamed too large (no length given).
        let chunks =
            futures::stream::iter((0..4).map(|_| {
                Ok::<_, BoxError>(hyper::body::Frame::data(Bytes::from(vec![b'y'; 400])))
            }));
        let mut c = h1(p).await;
        let r = c
            .send_request(
                Request::post("/echo")
                    .body(BodyExt::boxed(http_body_util::StreamBody::new(chunks)))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // Within the limit.
        let mut c = h1(p).await;
        let r = c
            .send_request(Request::post("/echo").body(full(vec![b'x'; 1000])).unwrap())
            .await
            .unwrap();
        assert!(text(r).await.ends_with("body 1000\n"));
        // An app that never answers.
        let r = c
            .send_request(Request::get("/slow").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);

        // Nothing listening.
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone_addr = gone.local_addr().unwrap();
        drop(gone);
        let (p2, stop) = proxy(gone_addr, settings).await;
        let mut c = h1(p2).await;
        let r = c
            .send_request(Request::get("/").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        // Stopped: no longer accepting.
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(p2).await.is_err());
    }
}
