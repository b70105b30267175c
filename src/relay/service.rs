//! The gRPC face of the relay: `SandboxWorker` and `SandboxExec`.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use super::{auth, Error, Relay};
use crate::api::sandbox::v1 as pb;
use pb::sandbox_exec_server::SandboxExec;
use pb::sandbox_worker_server::SandboxWorker;

/// How long a worker has to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Both relay services over one [`Relay`].
#[derive(Clone)]
pub struct RelayService {
    relay: Relay,
}

impl RelayService {
    /// Serves `relay`.
    pub fn new(relay: Relay) -> Self {
        Self { relay }
    }
}

type FrameStream = Pin<Box<dyn Stream<Item = Result<pb::ServerFrame, Status>> + Send>>;
type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ExecEvent, Status>> + Send>>;

#[tonic::async_trait]
impl SandboxWorker for RelayService {
    type AttachStream = FrameStream;

    async fn attach(
        &self,
        req: Request<Streaming<pb::WorkerFrame>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        // The credential (never logged). Without one, refuse before waiting for a Hello.
        let token = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(auth::bearer)
            .map(str::to_string);
        if token.is_none() {
            debug!("worker without a credential refused");
            return Err(
                Error::Unauthenticated("no credential (authorization: Bearer <token>)").into(),
            );
        }
        let mut frames = req.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, frames.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 10 s"))??;
        let hello = match first.and_then(|f| f.msg) {
            Some(pb::worker_frame::Msg::Hello(h)) if !h.sandbox_id.is_empty() => h,
            Some(pb::worker_frame::Msg::Hello(_)) => {
                return Err(Status::invalid_argument("Hello needs a sandbox_id"))
            }
            _ => return Err(Status::invalid_argument("the first frame must be Hello")),
        };
        let (w, rx) = self.relay.attach_network(hello, token.as_deref())?;
        let relay = self.relay.clone();
        self.relay.tasks().spawn(async move {
            loop {
                match frames.message().await {
                    Ok(Some(f)) => relay.on_frame(&w, f),
                    Ok(None) => {
                        relay.detach(&w, "worker disconnected");
                        return;
                    }
                    Err(e) => {
                        debug!(error = %e, "worker stream error");
                        relay.detach(&w, "worker disconnected");
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[tonic::async_trait]
impl SandboxExec for RelayService {
    type ExecStream = EventStream;

    async fn exec(
        &self,
        req: Request<pb::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let rx = self.relay.exec(req.into_inner()).await?;
        // The stream ends with the exec's End or ExecError. An event's bytes stay held in the
        // exec's window until the stream is asked for the next one (its message has gone to
        // the transport, which takes it only as the harness's flow control allows).
        let held = crate::flow::Hold::none();
        let stream =
            futures::stream::unfold((rx, false, held), |(mut rx, done, held)| async move {
                drop(held);
                if done {
                    return None;
                }
                let (item, held) = rx.recv().await?;
                let last = matches!(
                    &item,
                    pb::ExecEvent {
                        event: Some(
                            pb::exec_event::Event::End(_) | pb::exec_event::Event::Error(_)
                        )
                    }
                );
                Some((Ok(item), (rx, last, held)))
            })
            .boxed();
        Ok(Response::new(stream))
    }

    async fn abort(
        &self,
        req: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::AbortResponse>, Status> {
        let req = req.into_inner();
        self.relay.abort(&req.sandbox_id, req.req_id).await;
        Ok(Response::new(pb::AbortResponse {}))
    }
}
