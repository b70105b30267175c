//! Kubernetes discovery of node daemons against kube-rs's mock API service (`tower-test`), for
//! what a real API server does not do on demand: watch responses that end and are resumed from
//! the last resourceVersion, and a watch expired by etcd compaction (410 Gone), after which the
//! watcher re-lists and an object missing from the new list is dropped without any DELETED
//! event. The router's real watcher lists the pods, then follows watch events; the node set it
//! publishes follows readiness, additions and deletions. Discovery against a real
//! kube-apiserver, with the router's own token and RBAC, is `tests/kube_real.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use computed::router::discovery::watch_pods;
use http::{Request, Response};
use kube::client::Body;
use serde_json::json;
use tokio::sync::watch;
use tower_test::mock::Handle;

fn pod(name: &str, node: &str, ip: &str, ready: bool, rv: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "compute-system", "uid": format!("uid-{name}"),
                     "resourceVersion": rv, "labels": {"app.kubernetes.io/name": "computed-node"}},
        "spec": {"nodeName": node, "containers": [{"name": "node", "image": "x"}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    })
}

fn node(name: &str, unschedulable: bool, rv: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv},
        "spec": {"unschedulable": unschedulable}
    })
}

/// The mock API server's side: the requests, to answer.
type MockApi = Handle<Request<Body>, Response<Body>>;

/// The router's pod watcher (and node watcher, if `watch_nodes`) against a mock API server:
/// the node set it publishes, its task, and the handle that answers its requests.
fn mock_watch(
    watch_nodes: bool,
) -> (
    watch::Receiver<computed::router::NodeSet>,
    tokio::task::JoinHandle<()>,
    MockApi,
) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "compute-system");
    let (rx, task) = watch_pods(
        client,
        "compute-system",
        "app.kubernetes.io/name=computed-node",
        50051,
        computed::router::tls::Scheme::Http,
        watch_nodes,
    );
    (rx, task, handle)
}

/// Waits until the node set's names are `want`.
async fn wait_for<V>(rx: &watch::Receiver<BTreeMap<String, V>>, want: &[&str]) {
    let mut rx = rx.clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let names: Vec<String> = rx.borrow_and_update().keys().cloned().collect();
            if names == want {
                return;
            }
            rx.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "node set never became {want:?}; is {:?}",
            rx.borrow().keys().collect::<Vec<_>>()
        )
    });
}

fn respond(body: String) -> Response<Body> {
    Response::builder()
        .status(200)
        .body(Body::from(body.into_bytes()))
        .unwrap()
}

/// Answers a watch request with `events` (one JSON object a line), or, when there are none
/// left, holds it open for an hour.
async fn send_events(
    send: tower_test::mock::SendResponse<Response<Body>>,
    events: Option<Vec<serde_json::Value>>,
) {
    match events {
        Some(events) => send.send_response(respond(
            events.iter().map(|e| e.to_string() + "\n").collect(),
        )),
        None => tokio::time::sleep(Duration::from_secs(3600)).await,
    }
}

#[tokio::test]
async fn node_set_follows_the_daemonset_pods() {
    let (mut rx, task, mut handle) = mock_watch(true);

    // The fake API server: pod and node lists, then watch responses in order, each released
    // by the test once it has seen the state before it.
    let (go_tx, go) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (node_go_tx, node_go) = tokio::sync::mpsc::unbounded_channel::<()>();
    let go = std::sync::Arc::new(tokio::sync::Mutex::new(go));
    let node_go = std::sync::Arc::new(tokio::sync::Mutex::new(node_go));
    let pod_watches = std::sync::Arc::new(std::sync::Mutex::new(
        vec![
            // pod-b becomes ready; pod-c is added not ready.
            vec![
                json!({"type": "MODIFIED", "object": pod("pod-b", "node-b", "10.0.0.2", true, "11")}),
                json!({"type": "ADDED", "object": pod("pod-c", "node-c", "10.0.0.3", false, "12")}),
            ],
            // pod-a goes away.
            vec![json!({"type": "DELETED", "object": pod("pod-a", "node-a", "10.0.0.1", true, "13")})],
        ]
        .into_iter(),
    ));
    let node_watches = std::sync::Arc::new(std::sync::Mutex::new(
        vec![vec![
            json!({"type": "MODIFIED", "object": node("node-b", true, "21")}),
        ]]
        .into_iter(),
    ));
    let server = tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let uri = req.uri().to_string();
            let (go, node_go) = (go.clone(), node_go.clone());
            let (pod_watches, node_watches) = (pod_watches.clone(), node_watches.clone());
            tokio::spawn(async move {
                let watching = uri.contains("watch=true");
                if uri.starts_with("/api/v1/nodes") {
                    if !watching {
                        let list = json!({"apiVersion": "v1", "kind": "NodeList",
                            "metadata": {"resourceVersion": "20"},
                            "items": [node("node-a", false, "19"), node("node-b", false, "19")]});
                        send.send_response(respond(list.to_string()));
                        return;
                    }
                    let _ = node_go.lock().await.recv().await;
                    let next = node_watches.lock().unwrap().next();
                    send_events(send, next).await;
                    return;
                }
                assert!(
                    uri.starts_with("/api/v1/namespaces/compute-system/pods"),
                    "{uri}"
                );
                assert!(
                    uri.contains("labelSelector=app.kubernetes.io%2Fname%3Dcomputed-node"),
                    "{uri}"
                );
                if !watching {
                    let list = json!({
                        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                        "items": [pod("pod-a", "node-a", "10.0.0.1", true, "9"),
                                  pod("pod-b", "node-b", "10.0.0.2", false, "9")]
                    });
                    send.send_response(respond(list.to_string()));
                    return;
                }
                let _ = go.lock().await.recv().await;
                let next = pod_watches.lock().unwrap().next();
                send_events(send, next).await;
            });
        }
    });

    // The initial list: only the ready pod.
    wait_for(&rx, &["node-a"]).await;
    assert_eq!(rx.borrow()["node-a"].url, "http://10.0.0.1:50051");
    // pod-b ready, pod-c not ready yet.
    go_tx.send(()).unwrap();
    wait_for(&rx, &["node-a", "node-b"]).await;
    // pod-a deleted.
    go_tx.send(()).unwrap();
    wait_for(&rx, &["node-b"]).await;
    go_tx.send(()).unwrap();
    assert_eq!(
        rx.borrow_and_update()["node-b"].url,
        "http://10.0.0.2:50051"
    );
    assert!(!rx.borrow()["node-b"].cordoned);
    // node-b is cordoned: still a node (its sandboxes stay reachable), but marked, so that
    // placement skips it.
    node_go_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !rx
            .borrow_and_update()
            .get("node-b")
            .is_some_and(|n| n.cordoned)
        {
            rx.changed().await.unwrap();
        }
    })
    .await
    .expect("cordon never seen");
    task.abort();
    server.abort();
}

#[tokio::test]
async fn an_expired_watch_relists_and_drops_what_the_new_list_lacks() {
    let (mut rx, task, mut handle) = mock_watch(false);
    let lists = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The 410 is released once the test has seen the first list's node set.
    let expire = std::sync::Arc::new(tokio::sync::Notify::new());
    let server = tokio::spawn({
        let (lists, expire) = (lists.clone(), expire.clone());
        async move {
            while let Some((req, send)) = handle.next_request().await {
                let uri = req.uri().to_string();
                assert!(
                    uri.starts_with("/api/v1/namespaces/compute-system/pods"),
                    "{uri}"
                );
                if !uri.contains("watch=true") {
                    // The first list has both pods; the re-list after the 410 only pod-b (pod-a
                    // went while the watch was gone: its DELETED event was compacted away).
                    let n = lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let items = if n == 0 {
                        vec![
                            pod("pod-a", "node-a", "10.0.0.1", true, "9"),
                            pod("pod-b", "node-b", "10.0.0.2", true, "9"),
                        ]
                    } else {
                        vec![pod("pod-b", "node-b", "10.0.0.2", true, "30")]
                    };
                    let list = json!({"apiVersion": "v1", "kind": "PodList",
                        "metadata": {"resourceVersion": if n == 0 {"10"} else {"31"}},
                        "items": items});
                    send.send_response(respond(list.to_string()));
                } else if lists.load(std::sync::atomic::Ordering::SeqCst) == 1 {
                    expire.notified().await;
                    let gone = json!({"type": "ERROR", "object": {
                        "apiVersion": "v1", "kind": "Status", "metadata": {},
                        "status": "Failure", "reason": "Expired", "code": 410,
                        "message": "too old resource version: 10 (25)"}});
                    send.send_response(respond(gone.to_string() + "\n"));
                } else {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        drop(send);
                    });
                }
            }
        }
    });
    wait_for(&rx, &["node-a", "node-b"]).await;
    expire.notify_one();
    wait_for(&rx, &["node-b"]).await;
    assert!(
        lists.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "no re-list"
    );
    assert_eq!(
        rx.borrow_and_update()["node-b"].url,
        "http://10.0.0.2:50051"
    );
    task.abort();
    server.abort();
}
