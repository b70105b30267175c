//! A thin typed client over containerd's gRPC services, scoped to one namespace.
//!
//! Every request carries the `containerd-namespace` header, and import calls also carry
//! `containerd-lease` so that content and snapshots written during an import are not collected
//! before the image references them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::version_client::VersionClient;
use containerd_client::services::v1::{
    ApplyRequest, Container, CreateContainerRequest, CreateImageRequest, CreateTaskRequest,
    DeleteContainerRequest, DeleteImageRequest, DeleteProcessRequest, DeleteTaskRequest,
    ExecProcessRequest, GetContainerRequest, GetImageRequest, GetRequest, Image, InfoRequest,
    KillRequest, ListContainersRequest, ListImagesRequest, ReadContentRequest, StartRequest,
    UpdateContainerRequest, WaitRequest, WriteAction, WriteContentRequest,
};
use containerd_client::types::v1::Status as TaskStatus;
use containerd_client::types::{Descriptor, Mount};
use prost_types::{Any, FieldMask};
use tonic::transport::Channel;
use tonic::{Code, Request};

/// The snapshotter every sandbox and image layer uses.
pub const SNAPSHOTTER: &str = "overlayfs";

/// Errors of the containerd client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// containerd's socket could not be reached.
    #[error("connect to containerd at {path}: {source}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// A containerd call failed.
    #[error("containerd {op} {what}: {status}")]
    Call {
        /// The operation, e.g. `Tasks.Start`.
        op: &'static str,
        /// What the call was about (container id, digest, …).
        what: String,
        /// The status containerd returned.
        status: tonic::Status,
    },
    /// A call did not answer in time.
    #[error("containerd {op} {what}: timed out")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// What it was about.
        what: String,
    },
}

impl Error {
    /// The gRPC code containerd answered with (Unavailable for a transport failure).
    pub fn code(&self) -> Code {
        match self {
            Error::Connect { .. } => Code::Unavailable,
            Error::Call { status, .. } => status.code(),
            Error::Timeout { .. } => Code::DeadlineExceeded,
        }
    }

    /// Whether containerd said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Code::NotFound
    }

    /// Whether containerd said the object exists already.
    pub fn is_already_exists(&self) -> bool {
        self.code() == Code::AlreadyExists
    }
}

type Result<T> = std::result::Result<T, Error>;

fn call_err(op: &'static str, what: impl Into<String>) -> impl FnOnce(tonic::Status) -> Error {
    let what = what.into();
    move |status| {
        crate::metrics::METRICS.containerd_error(op);
        Error::Call { op, what, status }
    }
}

/// The state of a task (the sandbox's init process) as containerd reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// There is no task for the container.
    Missing,
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited with the given status.
    Stopped(u32),
    /// Paused or pausing.
    Paused,
    /// containerd does not know.
    Unknown,
}

/// A containerd client bound to one namespace.
#[derive(Clone)]
pub struct Containerd {
    channel: Channel,
    namespace: String,
}

impl Containerd {
    /// Connects to containerd's gRPC socket. The connection is lazy-retrying: calls made while
    /// containerd restarts fail with Unavailable and later calls reconnect.
    pub async fn connect(path: &Path, namespace: &str) -> Result<Self> {
        let p = path.to_path_buf();
        let channel = tonic::transport::Endpoint::try_from("http://[::]")
            .map_err(|source| Error::Connect {
                path: p.clone(),
                source,
            })?
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(tower::service_fn(move |_| {
                let p = p.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(p).await?,
                    ))
                }
            }));
        Ok(Self {
            channel,
            namespace: namespace.to_string(),
        })
    }

    /// The namespace this client works in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn req<T>(&self, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        if let Ok(v) = self.namespace.parse() {
            req.metadata_mut().insert("containerd-namespace", v);
        }
        req
    }

    fn req_leased<T>(&self, msg: T, lease: &str) -> Request<T> {
        let mut req = self.req(msg);
        if let Ok(v) = lease.parse() {
            req.metadata_mut().insert("containerd-lease", v);
        }
        req
    }

    /// containerd's version string; used as the health probe.
    pub async fn version(&self) -> Result<String> {
        let resp = VersionClient::new(self.channel.clone())
            .version(Request::new(()))
            .await
            .map_err(call_err("Version", ""))?;
        Ok(resp.into_inner().version)
    }

    // ---- containers ----

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
        match ContainersClient::new(self.channel.clone())
            .delete(self.req(DeleteContainerRequest { id: id.into() }))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(call_err("Containers.Delete", id)(s)),
        }
    }

    // ---- snapshots ----

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
        match SnapshotsClient::new(self.channel.clone())
            .remove(self.req(RemoveSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: key.into(),
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(call_err("Snapshots.Remove", key)(s)),
        }
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

    // ---- leases ----

    /// Creates a lease that expires by itself after an hour, should we never delete it.
    pub async fn create_lease(&self, id: &str) -> Result<()> {
        let expire = chrono::Utc::now() + chrono::Duration::hours(1);
        let labels = HashMap::from([(
            "containerd.io/gc.expire".to_string(),
            expire.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )]);
        LeasesClient::new(self.channel.clone())
            .create(self.req(containerd_client::services::v1::CreateRequest {
                id: id.into(),
                labels,
            }))
            .await
            .map_err(call_err("Leases.Create", id))?;
        Ok(())
    }

    /// Deletes a lease, letting containerd's GC collect what nothing else references.
    pub async fn delete_lease(&self, id: &str) -> Result<()> {
        LeasesClient::new(self.channel.clone())
            .delete(self.req(containerd_client::services::v1::DeleteRequest {
                id: id.into(),
                sync: false,
            }))
            .await
            .map_err(call_err("Leases.Delete", id))?;
        Ok(())
    }

    // ---- content ----

    /// Whether a blob is in the content store.
    pub async fn content_exists(&self, digest: &str) -> Result<bool> {
        match ContentClient::new(self.channel.clone())
            .info(self.req(InfoRequest {
                digest: digest.into(),
            }))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(call_err("Content.Info", digest)(s)),
        }
    }

    /// Sets labels on a blob already in the store.
    pub async fn set_content_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<()> {
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        ContentClient::new(self.channel.clone())
            .update(self.req(containerd_client::services::v1::UpdateRequest {
                info: Some(containerd_client::services::v1::Info {
                    digest: digest.into(),
                    labels,
                    ..Default::default()
                }),
                update_mask: Some(FieldMask { paths }),
            }))
            .await
            .map_err(call_err("Content.Update", digest))?;
        Ok(())
    }

    /// Writes a blob into the content store under `digest` with `labels`. The request stream is
    /// fed from its own task: the call only returns once the server has the first message.
    pub async fn write_content(
        &self,
        digest: &str,
        data: Vec<u8>,
        labels: HashMap<String, String>,
        lease: &str,
    ) -> Result<()> {
        if self.content_exists(digest).await? {
            if !labels.is_empty() {
                self.set_content_labels(digest, labels).await?;
            }
            return Ok(());
        }
        const CHUNK: usize = 1 << 20;
        let total = data.len() as i64;
        let reference = format!("compute-{}", digest.trim_start_matches("sha256:"));
        let (tx, rx) = tokio::sync::mpsc::channel::<WriteContentRequest>(4);
        let expected = digest.to_string();
        let r2 = reference.clone();
        tokio::spawn(async move {
            let mut offset = 0usize;
            while offset < data.len() {
                let end = (offset + CHUNK).min(data.len());
                let msg = WriteContentRequest {
                    action: WriteAction::Write as i32,
                    r#ref: r2.clone(),
                    total,
                    expected: expected.clone(),
                    offset: offset as i64,
                    data: data[offset..end].to_vec(),
                    labels: HashMap::new(),
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
                offset = end;
            }
            let _ = tx
                .send(WriteContentRequest {
                    action: WriteAction::Commit as i32,
                    r#ref: r2,
                    total,
                    expected,
                    offset: total,
                    data: vec![],
                    labels,
                })
                .await;
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let resp = ContentClient::new(self.channel.clone())
            .write(self.req_leased(stream, lease))
            .await;
        let mut responses = match resp {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::AlreadyExists => return Ok(()),
            Err(s) => return Err(call_err("Content.Write", digest)(s)),
        };
        loop {
            match responses.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(s) if s.code() == Code::AlreadyExists => return Ok(()),
                Err(s) => return Err(call_err("Content.Write", digest)(s)),
            }
        }
    }

    /// Reads a whole blob from the content store.
    pub async fn read_content(&self, digest: &str) -> Result<Vec<u8>> {
        let mut stream = ContentClient::new(self.channel.clone())
            .read(self.req(ReadContentRequest {
                digest: digest.into(),
                offset: 0,
                size: 0,
            }))
            .await
            .map_err(call_err("Content.Read", digest))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(chunk) = stream
            .message()
            .await
            .map_err(call_err("Content.Read", digest))?
        {
            out.extend_from_slice(&chunk.data);
        }
        Ok(out)
    }

    // ---- images ----

    /// Gets an image by name.
    pub async fn get_image(&self, name: &str) -> Result<Image> {
        let resp = ImagesClient::new(self.channel.clone())
            .get(self.req(GetImageRequest { name: name.into() }))
            .await
            .map_err(call_err("Images.Get", name))?;
        Ok(resp.into_inner().image.unwrap_or_default())
    }

    /// Lists the images of the namespace.
    pub async fn list_images(&self) -> Result<Vec<Image>> {
        let resp = ImagesClient::new(self.channel.clone())
            .list(self.req(ListImagesRequest { filters: vec![] }))
            .await
            .map_err(call_err("Images.List", ""))?;
        Ok(resp.into_inner().images)
    }

    /// Creates or replaces the image record `name` pointing at `target`.
    pub async fn put_image(
        &self,
        name: &str,
        target: Descriptor,
        lease: Option<&str>,
    ) -> Result<()> {
        let image = Image {
            name: name.into(),
            target: Some(target),
            ..Default::default()
        };
        let _ = self.delete_image(name).await;
        let msg = CreateImageRequest {
            image: Some(image),
            source_date_epoch: None,
        };
        let req = match lease {
            Some(l) => self.req_leased(msg, l),
            None => self.req(msg),
        };
        ImagesClient::new(self.channel.clone())
            .create(req)
            .await
            .map_err(call_err("Images.Create", name))?;
        Ok(())
    }

    /// Deletes an image record.
    pub async fn delete_image(&self, name: &str) -> Result<()> {
        ImagesClient::new(self.channel.clone())
            .delete(self.req(DeleteImageRequest {
                name: name.into(),
                sync: false,
                target: None,
            }))
            .await
            .map_err(call_err("Images.Delete", name))?;
        Ok(())
    }

    // ---- tasks ----

    /// Creates the task (the init process) of a container with the given rootfs mounts and
    /// stdio FIFO paths (stdin, stdout, stderr; empty = none).
    pub async fn create_task(&self, id: &str, rootfs: Vec<Mount>, stdio: [&str; 3]) -> Result<u32> {
        let resp = TasksClient::new(self.channel.clone())
            .create(self.req(CreateTaskRequest {
                container_id: id.into(),
                rootfs,
                stdin: stdio[0].into(),
                stdout: stdio[1].into(),
                stderr: stdio[2].into(),
                terminal: false,
                checkpoint: None,
                options: None,
                runtime_path: String::new(),
            }))
            .await
            .map_err(call_err("Tasks.Create", id))?;
        Ok(resp.into_inner().pid)
    }

    /// Starts the task (`exec_id` empty) or one of its exec processes.
    pub async fn start(&self, id: &str, exec_id: &str) -> Result<u32> {
        let resp = TasksClient::new(self.channel.clone())
            .start(self.req(StartRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(call_err("Tasks.Start", format!("{id}/{exec_id}")))?;
        Ok(resp.into_inner().pid)
    }

    /// The state of the task (`exec_id` empty) or of one exec process.
    pub async fn task_state(&self, id: &str, exec_id: &str) -> Result<TaskState> {
        match TasksClient::new(self.channel.clone())
            .get(self.req(GetRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
        {
            Ok(resp) => {
                let p = resp.into_inner().process.unwrap_or_default();
                Ok(
                    match TaskStatus::try_from(p.status).unwrap_or(TaskStatus::Unknown) {
                        TaskStatus::Created => TaskState::Created,
                        TaskStatus::Running => TaskState::Running,
                        TaskStatus::Stopped => TaskState::Stopped(p.exit_status),
                        TaskStatus::Paused | TaskStatus::Pausing => TaskState::Paused,
                        TaskStatus::Unknown => TaskState::Unknown,
                    },
                )
            }
            Err(s) if s.code() == Code::NotFound => Ok(TaskState::Missing),
            Err(s) => Err(call_err("Tasks.Get", id)(s)),
        }
    }

    /// Sends a signal to the task or an exec process.
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        TasksClient::new(self.channel.clone())
            .kill(self.req(KillRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
                signal,
                all,
            }))
            .await
            .map_err(call_err("Tasks.Kill", format!("{id}/{exec_id}")))?;
        Ok(())
    }

    /// Waits for the task or an exec process to exit and returns its exit status.
    pub async fn wait(&self, id: &str, exec_id: &str) -> Result<u32> {
        let resp = TasksClient::new(self.channel.clone())
            .wait(self.req(WaitRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(call_err("Tasks.Wait", format!("{id}/{exec_id}")))?;
        Ok(resp.into_inner().exit_status)
    }

    /// Deletes a stopped task; a missing one is not an error. Bounded by `timeout` because a task
    /// whose start failed may never answer.
    pub async fn delete_task(&self, id: &str, timeout: Duration) -> Result<()> {
        let mut client = TasksClient::new(self.channel.clone());
        let fut = client.delete(self.req(DeleteTaskRequest {
            container_id: id.into(),
        }));
        match tokio::time::timeout(timeout, fut).await {
            Err(_) => Err(Error::Timeout {
                op: "Tasks.Delete",
                what: id.into(),
            }),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) if s.code() == Code::NotFound => Ok(()),
            Ok(Err(s)) => Err(call_err("Tasks.Delete", id)(s)),
        }
    }

    /// Adds an exec process to a running task. `process_json` is an OCI `Process`.
    pub async fn exec(
        &self,
        id: &str,
        exec_id: &str,
        process_json: Vec<u8>,
        stdout: &str,
        stderr: &str,
    ) -> Result<()> {
        TasksClient::new(self.channel.clone())
            .exec(self.req(ExecProcessRequest {
                container_id: id.into(),
                stdin: String::new(),
                stdout: stdout.into(),
                stderr: stderr.into(),
                terminal: false,
                spec: Some(Any {
                    type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
                    value: process_json,
                }),
                exec_id: exec_id.into(),
            }))
            .await
            .map_err(call_err("Tasks.Exec", format!("{id}/{exec_id}")))?;
        Ok(())
    }

    /// Deletes an exited exec process; a missing one is not an error.
    pub async fn delete_process(&self, id: &str, exec_id: &str) -> Result<()> {
        match TasksClient::new(self.channel.clone())
            .delete_process(self.req(DeleteProcessRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(call_err("Tasks.DeleteProcess", format!("{id}/{exec_id}"))(
                s,
            )),
        }
    }
}
