//! Finding node daemons: a static list, or the ready pods of the node DaemonSet watched through
//! the Kubernetes API. Either publishes a [`NodeSet`] on a watch channel; changes apply live.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

use super::tls::{Error, Scheme};
use super::{NodeEndpoint, NodeSet};

/// A node set from a static list of addresses (`host:port`), each dialed with `scheme`. An
/// entry may spell the scheme out, but only as `scheme` itself: `http://` under TLS would be a
/// silent downgrade and `https://` without TLS cannot be dialed, so either is an error.
pub fn static_nodes(urls: &[String], scheme: Scheme) -> Result<NodeSet, Error> {
    urls.iter()
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
        .map(|u| {
            let addr = match u.split_once("://") {
                None => u,
                Some((s, addr)) if s == scheme.as_str() => addr,
                Some(("http", _)) => {
                    return Err(Error::Invalid(format!(
                        "node {u}: plaintext, but --node-tls-ca is set and the router does not \
                         downgrade (give host:port or https://)"
                    )))
                }
                Some(("https", _)) => {
                    return Err(Error::Invalid(format!(
                        "node {u}: https needs --node-tls-ca (the CA of the nodes' certificates)"
                    )))
                }
                Some((s, _)) => {
                    return Err(Error::Invalid(format!(
                        "node {u}: unknown scheme {s:?} (give host:port)"
                    )))
                }
            };
            let name = addr.to_string();
            Ok((
                name.clone(),
                NodeEndpoint {
                    name,
                    url: format!("{}://{addr}", scheme.as_str()),
                    cordoned: false,
                },
            ))
        })
        .collect()
}

/// The endpoint of a node-daemon pod, if it is ready to serve: its pod IP and `port`, dialed
/// with `scheme`.
pub fn pod_endpoint(pod: &Pod, port: u16, scheme: Scheme) -> Option<NodeEndpoint> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let ip = status.pod_ip.as_ref().filter(|ip| !ip.is_empty())?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.clone()
    };
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .or_else(|| pod.metadata.name.clone())?;
    Some(NodeEndpoint {
        name,
        url: format!("{}://{host}:{port}", scheme.as_str()),
        cordoned: false,
    })
}

fn key(pod: &Pod) -> String {
    pod.metadata
        .uid
        .clone()
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default()
}

enum Change {
    Pods(Box<watcher::Event<Pod>>),
    Nodes(Box<watcher::Event<Node>>),
}

/// Applies one watcher event to a map of objects, buffering a re-list until it is complete.
fn apply<K: Clone>(
    ev: watcher::Event<K>,
    key: impl Fn(&K) -> String,
    live: &mut BTreeMap<String, K>,
    init: &mut Option<BTreeMap<String, K>>,
) {
    match ev {
        watcher::Event::Init => *init = Some(BTreeMap::new()),
        watcher::Event::InitApply(o) => {
            if let Some(m) = init.as_mut() {
                m.insert(key(&o), o);
            }
        }
        watcher::Event::InitDone => {
            if let Some(m) = init.take() {
                *live = m;
            }
        }
        watcher::Event::Apply(o) => {
            live.insert(key(&o), o);
        }
        watcher::Event::Delete(o) => {
            live.remove(&key(&o));
        }
    }
}

/// Watches the pods matching `selector` in `namespace` and publishes the ready ones (their pod
/// IPs and `port`, dialed with `scheme`); with
/// `watch_nodes`, also watches the cluster's Nodes and marks the pods on cordoned
/// (unschedulable) nodes, which then take no new sandboxes. Runs until the returned task is
/// aborted; watch errors are retried with backoff by kube's watcher.
pub fn watch_pods(
    client: kube::Client,
    namespace: &str,
    selector: &str,
    port: u16,
    scheme: Scheme,
    watch_nodes: bool,
) -> (watch::Receiver<NodeSet>, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let (tx, rx) = watch::channel(NodeSet::new());
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pods = watcher(pods_api, watcher::Config::default().labels(selector))
        .default_backoff()
        .map(|e| e.map(|ev| Change::Pods(Box::new(ev))));
    let nodes = if watch_nodes {
        let nodes_api: Api<Node> = Api::all(client);
        watcher(nodes_api, watcher::Config::default())
            .default_backoff()
            .map(|e| e.map(|ev| Change::Nodes(Box::new(ev))))
            .boxed()
    } else {
        futures::stream::pending().boxed()
    };
    let ns = namespace.to_string();
    let task = tokio::spawn(async move {
        let mut pods_live: BTreeMap<String, Pod> = BTreeMap::new();
        let mut pods_init: Option<BTreeMap<String, Pod>> = None;
        let mut nodes_live: BTreeMap<String, Node> = BTreeMap::new();
        let mut nodes_init: Option<BTreeMap<String, Node>> = None;
        let stream = futures::stream::select(pods, nodes);
        futures::pin_mut!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(Change::Pods(ev))) => apply(*ev, key, &mut pods_live, &mut pods_init),
                Ok(Some(Change::Nodes(ev))) => apply(
                    *ev,
                    |n: &Node| n.metadata.name.clone().unwrap_or_default(),
                    &mut nodes_live,
                    &mut nodes_init,
                ),
                Ok(None) => return,
                Err(e) => {
                    warn!(namespace = %ns, error = %e, "watch error");
                    continue;
                }
            }
            if pods_init.is_some() {
                continue;
            }
            let cordoned = |name: &str| {
                nodes_live
                    .get(name)
                    .and_then(|n| n.spec.as_ref())
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
            };
            let set: NodeSet = pods_live
                .values()
                .filter_map(|p| pod_endpoint(p, port, scheme))
                .map(|mut n| {
                    n.cordoned = cordoned(&n.name);
                    (n.name.clone(), n)
                })
                .collect();
            if *tx.borrow() != set {
                info!(nodes = set.len(), "node set changed");
                if tx.send(set).is_err() {
                    return;
                }
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_lists_parse() {
        let s = static_nodes(
            &["127.0.0.1:1".into(), "http://h:2".into(), " ".into()],
            Scheme::Http,
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s["127.0.0.1:1"].url, "http://127.0.0.1:1");
        assert_eq!(s["h:2"].url, "http://h:2");
        // Under TLS every node is https, named the same.
        let s = static_nodes(&["127.0.0.1:1".into(), "https://h:2".into()], Scheme::Https).unwrap();
        assert_eq!(s["127.0.0.1:1"].url, "https://127.0.0.1:1");
        assert_eq!(s["h:2"].url, "https://h:2");
    }

    #[test]
    fn static_lists_never_change_the_configured_scheme() {
        for (entry, scheme, want) in [
            ("http://h:1", Scheme::Https, "does not downgrade"),
            ("https://h:1", Scheme::Http, "needs --node-tls-ca"),
            ("grpc://h:1", Scheme::Http, "unknown scheme"),
            ("grpcs://h:1", Scheme::Https, "unknown scheme"),
        ] {
            let e = static_nodes(&["ok:1".into(), entry.into()], scheme).unwrap_err();
            assert!(e.to_string().contains(want), "{entry} {scheme:?}: {e}");
        }
    }

    fn pod(ready: bool, ip: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "computed-node-x", "uid": "u1"},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_ready_pods_with_an_ip_are_nodes() {
        let e = pod_endpoint(&pod(true, "10.0.0.5"), 50051, Scheme::Http).unwrap();
        assert_eq!(e.name, "node-a");
        assert_eq!(e.url, "http://10.0.0.5:50051");
        assert!(pod_endpoint(&pod(false, "10.0.0.5"), 50051, Scheme::Http).is_none());
        assert!(pod_endpoint(&pod(true, ""), 50051, Scheme::Http).is_none());
        assert_eq!(
            pod_endpoint(&pod(true, "fd00::1"), 1, Scheme::Http)
                .unwrap()
                .url,
            "http://[fd00::1]:1"
        );
        // With TLS to the nodes, the same pods are dialed with https.
        assert_eq!(
            pod_endpoint(&pod(true, "10.0.0.5"), 50051, Scheme::Https)
                .unwrap()
                .url,
            "https://10.0.0.5:50051"
        );
    }
}
