//! `compute.v1.ComputeService` over a [`Node`]. Each RPC is a method of [`ComputeApi`] that
//! reads: request → domain call → response, with the node's errors turned into a Status in
//! `api::status`; one macro puts them behind the trait with the request metrics.

use std::pin::Pin;
use std::time::SystemTime;

use futures::Stream;
use tokio_stream::StreamExt;
use tonic::Status;
use tracing::instrument;

use crate::api::compute::v1 as pb;
use crate::api::compute::v1::compute_service_server::ComputeService;
use crate::api::convert;
use crate::node::{Error, Node};

/// ComputeService over a [`Node`].
#[derive(Clone)]
pub struct ComputeApi {
    node: Node,
}

type ExecStream = Pin<Box<dyn Stream<Item = Result<pb::ExecEvent, Status>> + Send>>;

impl ComputeApi {
    /// Serves `node`.
    pub fn new(node: Node) -> Self {
        Self { node }
    }

    #[instrument(skip_all, fields(tenant_id = %r.tenant_id, session_id = %r.session_id))]
    async fn create(
        &self,
        r: pb::CreateSandboxRequest,
    ) -> Result<pb::CreateSandboxResponse, Error> {
        let sb = self.node.create(convert::create_request(r)?).await?;
        Ok(pb::CreateSandboxResponse {
            sandbox_id: sb.id.clone(),
            status: pb::SandboxStatus::from(sb.status()) as i32,
            created_at: Some(convert::timestamp(sb.created_at)),
        })
    }

    #[instrument(skip_all, fields(sandbox_id = %r.sandbox_id))]
    async fn destroy(
        &self,
        r: pb::DestroySandboxRequest,
    ) -> Result<pb::DestroySandboxResponse, Error> {
        let (sb, usage) = self.node.destroy(&r.sandbox_id).await?;
        Ok(pb::DestroySandboxResponse {
            sandbox_id: sb.id.clone(),
            total_usage: Some(usage.into()),
        })
    }

    #[instrument(skip_all, fields(sandbox_id = %r.sandbox_id))]
    async fn describe(
        &self,
        r: pb::DescribeSandboxRequest,
    ) -> Result<pb::DescribeSandboxResponse, Error> {
        let sb = self.node.get(&r.sandbox_id)?;
        let usage = self.node.usage(&sb).await;
        let state = sb.state();
        let uptime = SystemTime::now()
            .duration_since(sb.created_at)
            .unwrap_or_default();
        Ok(pb::DescribeSandboxResponse {
            sandbox_id: sb.id.clone(),
            status: pb::SandboxStatus::from(state.status) as i32,
            created_at: Some(convert::timestamp(sb.created_at)),
            current_uptime: Some(convert::duration(uptime)),
            current_usage: Some(usage.into()),
            failure_reason: state.reason,
            tenant_id: sb.tenant_id.clone(),
            session_id: sb.session_id.clone(),
            image: sb.image.clone(),
        })
    }

    #[instrument(skip_all, fields(sandbox_id = %r.sandbox_id))]
    async fn exec(&self, r: pb::ExecCommandRequest) -> Result<ExecStream, Error> {
        let id = r.sandbox_id.clone();
        let rx = self.node.exec(&id, convert::exec_request(r)?).await?;
        Ok(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx).map(convert::exec_event),
        ))
    }

    #[instrument(skip_all, fields(sandbox_id = %r.sandbox_id))]
    async fn read(&self, r: pb::ReadFileRequest) -> Result<pb::ReadFileResponse, Error> {
        let d = self
            .node
            .read_file(&r.sandbox_id, r.path, r.offset, r.max_bytes)
            .await?;
        Ok(pb::ReadFileResponse {
            data: d.data.into(),
            total_size: d.total_size as i64,
            eof: d.eof,
        })
    }

    #[instrument(skip_all, fields(sandbox_id = %r.sandbox_id))]
    async fn write(&self, r: pb::WriteFileRequest) -> Result<pb::WriteFileResponse, Error> {
        let n = self
            .node
            .write_file(&r.sandbox_id, r.path, r.data, r.append, r.mode)
            .await?;
        Ok(pb::WriteFileResponse {
            bytes_written: n as i64,
        })
    }

    #[instrument(skip_all, fields(sandbox_id = %r.sandbox_id))]
    async fn list(&self, r: pb::ListFilesRequest) -> Result<pb::ListFilesResponse, Error> {
        let (entries, truncated) = self
            .node
            .list_files(&r.sandbox_id, r.path, r.recursive, r.max_entries)
            .await?;
        Ok(pb::ListFilesResponse {
            entries: entries.into_iter().map(Into::into).collect(),
            truncated,
        })
    }
}

super::rpcs! {
    observed impl ComputeService for ComputeApi {
        streams { ExecCommandStream = ExecStream; }
        create_sandbox(pb::CreateSandboxRequest) -> pb::CreateSandboxResponse = create as "CreateSandbox";
        destroy_sandbox(pb::DestroySandboxRequest) -> pb::DestroySandboxResponse = destroy as "DestroySandbox";
        describe_sandbox(pb::DescribeSandboxRequest) -> pb::DescribeSandboxResponse = describe as "DescribeSandbox";
        exec_command(pb::ExecCommandRequest) -> ExecStream = exec as "ExecCommand";
        read_file(pb::ReadFileRequest) -> pb::ReadFileResponse = read as "ReadFile";
        write_file(pb::WriteFileRequest) -> pb::WriteFileResponse = write as "WriteFile";
        list_files(pb::ListFilesRequest) -> pb::ListFilesResponse = list as "ListFiles";
    }
}
