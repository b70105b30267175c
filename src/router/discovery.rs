//! Finding node daemons: a static list, or the ready pods of the node DaemonSet watched through
//! the Kubernetes API. Either publishes a [`NodeSet`] on a watch channel; changes apply live.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{NodeEndpoint, NodeSet};

/// A node set from a static list of URLs (`http://host:port`; the scheme may be left out).
pub fn static_nodes(urls: &[String]) -> NodeSet {
    urls.iter()
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
        .map(|u| {
            let url = if u.contains("://") {
                u.to_string()
            } else {
                format!("http://{u}")
            };
            let name = url.split("://").nth(1).unwrap_or(&url).to_string();
            (name.clone(), NodeEndpoint { name, url })
        })
        .collect()
}

/// The endpoint of a node-daemon pod, if it is ready to serve.
pub fn pod_endpoint(pod: &Pod, port: u16) -> Option<NodeEndpoint> {
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
        url: format!("http://{host}:{port}"),
    })
}

fn key(pod: &Pod) -> String {
    pod.metadata
        .uid
        .clone()
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default()
}

/// Watches the pods matching `selector` in `namespace` and publishes the ready ones. Runs until
/// the returned task is aborted; watch errors are retried with backoff by kube's watcher.
pub fn watch_pods(
    client: kube::Client,
    namespace: &str,
    selector: &str,
    port: u16,
) -> (watch::Receiver<NodeSet>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(NodeSet::new());
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default().labels(selector);
    let ns = namespace.to_string();
    let task = tokio::spawn(async move {
        use kube::runtime::WatchStreamExt;
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut init: Option<BTreeMap<String, Pod>> = None;
        let stream = watcher(api, cfg).default_backoff();
        futures::pin_mut!(stream);
        loop {
            let ev = match stream.try_next().await {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    warn!(namespace = %ns, error = %e, "pod watch error");
                    continue;
                }
            };
            match ev {
                watcher::Event::Init => init = Some(BTreeMap::new()),
                watcher::Event::InitApply(p) => {
                    if let Some(m) = init.as_mut() {
                        m.insert(key(&p), p);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(m) = init.take() {
                        pods = m;
                    }
                }
                watcher::Event::Apply(p) => {
                    pods.insert(key(&p), p);
                }
                watcher::Event::Delete(p) => {
                    pods.remove(&key(&p));
                }
            }
            if init.is_some() {
                continue;
            }
            let set: NodeSet = pods
                .values()
                .filter_map(|p| pod_endpoint(p, port))
                .map(|n| (n.name.clone(), n))
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
        let s = static_nodes(&["127.0.0.1:1".into(), "http://h:2".into(), " ".into()]);
        assert_eq!(s.len(), 2);
        assert_eq!(s["127.0.0.1:1"].url, "http://127.0.0.1:1");
        assert_eq!(s["h:2"].url, "http://h:2");
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
        let e = pod_endpoint(&pod(true, "10.0.0.5"), 50051).unwrap();
        assert_eq!(e.name, "node-a");
        assert_eq!(e.url, "http://10.0.0.5:50051");
        assert!(pod_endpoint(&pod(false, "10.0.0.5"), 50051).is_none());
        assert!(pod_endpoint(&pod(true, ""), 50051).is_none());
        assert_eq!(
            pod_endpoint(&pod(true, "fd00::1"), 1).unwrap().url,
            "http://[fd00::1]:1"
        );
    }
}
