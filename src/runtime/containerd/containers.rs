//! Containers (sandbox records) and snapshots (their rootfs, and image layers).

use std::collections::HashMap;

use prost_types::{Any, FieldMask};
use tonic::Code;

use super::{call_err, deleted, Containerd, Result, SNAPSHOTTER};
use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::{
    ApplyRequest, Container, CreateContainerRequest, DeleteContainerRequest, GetContainerRequest,
    ListContainersRequest, UpdateContainerRequest,
};
use containerd_client::types::{Descriptor, Mount};

impl Containerd {
    /// Creates a container record.
    pub async fn create_container(
        &self,
        id: &str,
        image: &str,
        labels: HashMap<String, String>,
        runtime: &str,
        runtime_options: Option<Any>,
        spec_json: Vec<u8>,
    ) -> Result<()> {
        let container = Container {
            id: id.to_string(),
            labels,
            image: image.to_string(),
            runtime: Some(ContainerRuntime {
                name: runtime.to_string(),
                options: runtime_options,
            }),
            spec: Some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
                value: spec_json,
            }),
            snapshotter: SNAPSHOTTER.into(),
            snapshot_key: id.to_string(),
            ..Default::default()
        };
        ContainersClient::new(self.channel.clone())
            .create(self.req(CreateContainerRequest {
                container: Some(container),
            }))
            .await
            .map_err(call_err("Containers.Create", id))?;
        Ok(())
    }

    /// Lists the containers of the namespace.
    pub async fn list_containers(&self) -> Result<Vec<Container>> {
        let resp = ContainersClient::new(self.channel.clone())
            .list(self.req(ListContainersRequest { filters: vec![] }))
            .await
            .map_err(call_err("Containers.List", ""))?;
        Ok(resp.into_inner().containers)
    }

    /// Gets one container.
    pub async fn get_container(&self, id: &str) -> Result<Container> {
        let resp = ContainersClient::new(self.channel.clone())
            .get(self.req(GetContainerRequest { id: id.into() }))
            .await
            .map_err(call_err("Containers.Get", id))?;
        Ok(resp.into_inner().container.unwrap_or_default())
    }

    /// Sets the given labels on a container (other labels stay as they are).
    pub async fn set_labels(&self, id: &str, labels: HashMap<String, String>) -> Result<()> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let container = Container {
            id: id.to_string(),
            labels,
            ..Default::default()
        };
        ContainersClient::new(self.channel.clone())
            .update(self.req(UpdateContainerRequest {
                container: Some(container),
                update_mask: Some(FieldMask { paths }),
            }))
            .await
            .map_err(call_err("Containers.Update", id))?;
        Ok(())
    }

    /// Replaces a container's OCI spec in place (the record and its labels stay: no window
    /// in which a crash would lose the container).
    pub async fn set_spec(&self, id: &str, spec_json: Vec<u8>) -> Result<()> {
        let container = Container {
            id: id.to_string(),
            spec: Some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
                value: spec_json,
            }),
            ..Default::default()
        };
        ContainersClient::new(self.channel.clone())
            .update(self.req(UpdateContainerRequest {
                container: Some(container),
                update_mask: Some(FieldMask {
                    paths: vec!["spec".into()],
                }),
            }))
            .await
            .map_err(call_err("Containers.Update", id))?;
        Ok(())
    }

    /// Deletes a container record; a missing one is not an error.
    pub async fn delete_container(&self, id: &str) -> Result<()> {
        let r = ContainersClient::new(self.channel.clone())
            .delete(self.req(DeleteContainerRequest { id: id.into() }))
            .await;
        deleted(r, "Containers.Delete", id)
    }

    /// Prepares an active snapshot `key` on top of `parent` and returns its mounts.
    pub async fn prepare_snapshot(
        &self,
        key: &str,
        parent: &str,
        lease: Option<&str>,
    ) -> Result<Vec<Mount>> {
        let msg = PrepareSnapshotRequest {
            snapshotter: SNAPSHOTTER.into(),
            key: key.into(),
            parent: parent.into(),
            labels: HashMap::new(),
        };
        let req = match lease {
            Some(l) => self.req_leased(msg, l),
            None => self.req(msg),
        };
        let resp = SnapshotsClient::new(self.channel.clone())
            .prepare(req)
            .await
            .map_err(call_err("Snapshots.Prepare", key))?;
        Ok(resp.into_inner().mounts)
    }

    /// The mounts of an existing snapshot.
    pub async fn snapshot_mounts(&self, key: &str) -> Result<Vec<Mount>> {
        let resp = SnapshotsClient::new(self.channel.clone())
            .mounts(
                self.req(containerd_client::services::v1::snapshots::MountsRequest {
                    snapshotter: SNAPSHOTTER.into(),
                    key: key.into(),
                }),
            )
            .await
            .map_err(call_err("Snapshots.Mounts", key))?;
        Ok(resp.into_inner().mounts)
    }

    /// Whether a snapshot exists.
    pub async fn snapshot_exists(&self, key: &str) -> Result<bool> {
        match SnapshotsClient::new(self.channel.clone())
            .stat(self.req(StatSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: key.into(),
            }))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(call_err("Snapshots.Stat", key)(s)),
        }
    }

    /// Commits active snapshot `key` as `name`.
    pub async fn commit_snapshot(&self, name: &str, key: &str, lease: &str) -> Result<()> {
        SnapshotsClient::new(self.channel.clone())
            .commit(self.req_leased(
                CommitSnapshotRequest {
                    snapshotter: SNAPSHOTTER.into(),
                    name: name.into(),
                    key: key.into(),
                    labels: HashMap::new(),
                },
                lease,
            ))
            .await
            .map_err(call_err("Snapshots.Commit", name))?;
        Ok(())
    }

    /// Removes a snapshot; a missing one is not an error.
    pub async fn remove_snapshot(&self, key: &str) -> Result<()> {
        let r = SnapshotsClient::new(self.channel.clone())
            .remove(self.req(RemoveSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: key.into(),
            }))
            .await;
        deleted(r, "Snapshots.Remove", key)
    }

    /// Applies a layer blob (already in the content store) onto the given mounts.
    pub async fn apply_diff(
        &self,
        layer: Descriptor,
        mounts: Vec<Mount>,
        lease: &str,
    ) -> Result<Descriptor> {
        let what = layer.digest.clone();
        let resp = DiffClient::new(self.channel.clone())
            .apply(self.req_leased(
                ApplyRequest {
                    diff: Some(layer),
                    mounts,
                    payloads: HashMap::new(),
                    sync_fs: false,
                },
                lease,
            ))
            .await
            .map_err(call_err("Diff.Apply", what))?;
        Ok(resp.into_inner().applied.unwrap_or_default())
    }
}
