//! Conversions between wire types and domain types.

use std::time::{Duration, SystemTime};

use super::common::v1 as common;
use super::compute::v1 as pb;
use crate::metering::Usage;
use crate::node::{self, exec, Status};
use crate::workspace;

/// A protobuf Timestamp of a SystemTime.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

/// A protobuf Timestamp of an RFC 3339 time; None when it does not parse.
pub fn timestamp_of_rfc3339(s: &str) -> Option<prost_types::Timestamp> {
    let t = chrono::DateTime::parse_from_rfc3339(s).ok()?;
    Some(prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    })
}

/// A protobuf Timestamp as RFC 3339 in UTC with milliseconds (how the platform's records
/// write times); None when it is out of range.
pub fn rfc3339_millis(t: &prost_types::Timestamp) -> Option<String> {
    let d = chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?)?;
    Some(d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// A protobuf Duration of a std Duration.
pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
}

/// A std Duration of a protobuf Duration; negative or invalid values are an error.
pub fn from_duration(d: &prost_types::Duration) -> Result<Duration, node::Error> {
    Duration::try_from(*d)
        .map_err(|_| node::Error::InvalidArgument(format!("invalid duration {d}")))
}

impl From<Usage> for common::UsageMetrics {
    fn from(u: Usage) -> Self {
        common::UsageMetrics {
            cpu_ms: u.cpu_ms,
            memory_peak_bytes: u.memory_peak_bytes,
            memory_avg_bytes: u.memory_avg_bytes,
            disk_read_bytes: u.disk_read_bytes,
            disk_write_bytes: u.disk_write_bytes,
            network_egress_bytes: u.network_egress_bytes,
            network_ingress_bytes: u.network_ingress_bytes,
        }
    }
}

impl From<Status> for pb::SandboxStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Starting => pb::SandboxStatus::Starting,
            // compute.v1 has no suspended state: a suspended sandbox resumes transparently
            // on its next exec or file call, so it is READY to its callers.
            Status::Ready | Status::Suspending | Status::Suspended | Status::Resuming => {
                pb::SandboxStatus::Ready
            }
            Status::Failed => pb::SandboxStatus::Failed,
            Status::Destroyed => pb::SandboxStatus::Destroyed,
        }
    }
}

/// The domain create request of a wire one.
pub fn create_request(r: pb::CreateSandboxRequest) -> Result<node::CreateRequest, node::Error> {
    let ws = r.workspace.unwrap_or_default();
    let limits = r.limits.unwrap_or_default();
    let max_runtime = limits.max_runtime.as_ref().map(from_duration).transpose()?;
    Ok(node::CreateRequest {
        tenant_id: r.tenant_id,
        session_id: r.session_id,
        image: r.image,
        storage_class: ws.storage_class,
        size: ws.size,
        mount_path: ws.mount_path,
        cpu_millis: limits.cpu_millis,
        memory_bytes: limits.memory_bytes,
        max_runtime,
        platform: None,
    })
}

/// The domain exec request of a wire one.
pub fn exec_request(r: pb::ExecCommandRequest) -> Result<exec::ExecRequest, node::Error> {
    Ok(exec::ExecRequest {
        command: r.command,
        args: r.args,
        env: r.env.into_iter().collect(),
        working_dir: r.working_dir,
        timeout: r.timeout.as_ref().map(from_duration).transpose()?,
        workload: None,
        tty: None,
        uncapped: false,
    })
}

/// The wire event of a domain exec event; a failed exec ends the stream with its status.
pub fn exec_event(e: exec::ExecEvent) -> Result<pb::ExecEvent, tonic::Status> {
    use pb::exec_event::Event;
    let (event, at) = match e {
        exec::ExecEvent::Failed(e) => return Err(e.into()),
        // The chunk's hold is dropped here: its bytes have left the exec's window for the
        // response stream, which takes it only as the client's flow control allows.
        exec::ExecEvent::Stdout(data, at, _) => (Event::Stdout(pb::StdoutLine { data }), at),
        exec::ExecEvent::Stderr(data, at, _) => (Event::Stderr(pb::StderrLine { data }), at),
        exec::ExecEvent::Completed(c, at) => (
            Event::Completed(pb::ExecCompleted {
                exit_code: c.exit_code,
                wall_time: Some(duration(c.wall_time)),
                cancelled: c.cancelled,
                usage: Some(c.usage.into()),
                timed_out: c.timed_out,
                oom_killed: c.oom_killed,
            }),
            at,
        ),
    };
    Ok(pb::ExecEvent {
        event: Some(event),
        emitted_at: Some(timestamp(at)),
    })
}

impl From<workspace::Entry> for pb::FileEntry {
    fn from(e: workspace::Entry) -> Self {
        pb::FileEntry {
            path: e.path,
            size: e.size,
            is_dir: e.is_dir,
            mode: e.mode,
            modified_at: Some(timestamp(e.modified)),
        }
    }
}
