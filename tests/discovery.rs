//! Kubernetes discovery of node daemons against kube-rs's mock API service (`tower-test`): the
//! closest thing to an API server that runs here. The router's real watcher lists the pods,
//! then follows watch events; the node set it publishes follows readiness, additions and
//! deletions.

use std::time::Duration;

use computed::router::discovery::watch_pods;
use http::{Request, Response};
use kube::client::Body;
use serde_json::json;

fn pod(name: &str, node: &str, ip: &str, ready: bool, rv: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "compute-system", "uid": format!("uid-{name}"),
                     "resourceVersion": rv, "labels": {"app.kubernetes.io/name": "computed-node"}},
        "spec": {"nodeName": node, "containers": [{"name": "node", "image": "x"}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    })
}

fn respond(body: String) -> Response<Body> {
    Response::builder()
        .status(200)
        .body(Body::from(body.into_bytes()))
        .unwrap()
}

#[tokio::test]
async fn node_set_follows_the_daemonset_pods() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "compute-system");
    let (mut rx, task) = watch_pods(
        client,
        "compute-system",
        "app.kubernetes.io/name=computed-node",
        50051,
    );

    // The fake API server: one list, then watch responses in order, each released by the test
    // once it has seen the state before it.
    let (go_tx, mut go) = tokio::sync::mpsc::unbounded_channel::<()>();
    let server = tokio::spawn(async move {
        let mut watches = vec![
            // pod-b becomes ready; pod-c is added not ready.
            vec![
                json!({"type": "MODIFIED", "object": pod("pod-b", "node-b", "10.0.0.2", true, "11")}),
                json!({"type": "ADDED", "object": pod("pod-c", "node-c", "10.0.0.3", false, "12")}),
            ],
            // pod-a goes away.
            vec![json!({"type": "DELETED", "object": pod("pod-a", "node-a", "10.0.0.1", true, "13")})],
        ]
        .into_iter();
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let uri = req.uri().to_string();
            seen.push(uri.clone());
            assert!(
                uri.starts_with("/api/v1/namespaces/compute-system/pods"),
                "{uri}"
            );
            assert!(
                uri.contains("labelSelector=app.kubernetes.io%2Fname%3Dcomputed-node"),
                "{uri}"
            );
            if uri.contains("watch=true") {
                if go.recv().await.is_none() {
                    break;
                }
                match watches.next() {
                    Some(events) => {
                        let body = events
                            .iter()
                            .map(|e| e.to_string() + "\n")
                            .collect::<String>();
                        send.send_response(respond(body));
                    }
                    // No more scripted events: hold the watch open.
                    None => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                }
            } else {
                let list = json!({
                    "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                    "items": [pod("pod-a", "node-a", "10.0.0.1", true, "9"),
                              pod("pod-b", "node-b", "10.0.0.2", false, "9")]
                });
                send.send_response(respond(list.to_string()));
            }
        }
        seen
    });

    let wait_for = |want: &'static [&'static str]| {
        let mut rx = rx.clone();
        async move {
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
    };
    // The initial list: only the ready pod.
    wait_for(&["node-a"]).await;
    assert_eq!(rx.borrow()["node-a"].url, "http://10.0.0.1:50051");
    // pod-b ready, pod-c not ready yet.
    go_tx.send(()).unwrap();
    wait_for(&["node-a", "node-b"]).await;
    // pod-a deleted.
    go_tx.send(()).unwrap();
    wait_for(&["node-b"]).await;
    go_tx.send(()).unwrap();
    assert_eq!(
        rx.borrow_and_update()["node-b"].url,
        "http://10.0.0.2:50051"
    );
    task.abort();
    server.abort();
}
