//! Tasks (a sandbox's init process) and exec processes.

use std::time::Duration;

use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    CheckpointTaskRequest, CloseIoRequest, CreateTaskRequest, DeleteProcessRequest,
    DeleteTaskRequest, ExecProcessRequest, GetRequest, KillRequest, ResizePtyRequest, StartRequest,
    WaitRequest,
};
use containerd_client::types::v1::Status as TaskStatus;
use containerd_client::types::Mount;
use prost_types::Any;
use tonic::Code;

use super::{call_err, deleted, Containerd, Error, Result, TaskState};

impl Containerd {
    /// Creates the task (the init process) of a container with the given rootfs mounts and
    /// stdio FIFO paths (stdin, stdout, stderr; empty = none).
    pub async fn create_task(&self, id: &str, rootfs: Vec<Mount>, stdio: [&str; 3]) -> Result<u32> {
        self.create_task_with(id, rootfs, stdio, None).await
    }

    /// Like [`Containerd::create_task`], with the runtime's task options: a restore passes
    /// runc's options with `criu_image_path`, so the shim's start restores from that directory.
    pub async fn create_task_with(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        stdio: [&str; 3],
        options: Option<Any>,
    ) -> Result<u32> {
        let resp = TasksClient::new(self.channel.clone())
            .create(self.req(CreateTaskRequest {
                container_id: id.into(),
                rootfs,
                stdin: stdio[0].into(),
                stdout: stdio[1].into(),
                stderr: stdio[2].into(),
                terminal: false,
                checkpoint: None,
                options,
                runtime_path: String::new(),
            }))
            .await
            .map_err(call_err("Tasks.Create", id))?;
        Ok(resp.into_inner().pid)
    }

    /// Checkpoints the task with the runtime's checkpoint `options` (for runc's shim: an
    /// image path and exit, so containerd writes nothing to its content store).
    pub async fn checkpoint_task(&self, id: &str, options: Any) -> Result<()> {
        TasksClient::new(self.channel.clone())
            .checkpoint(self.req(CheckpointTaskRequest {
                container_id: id.into(),
                parent_checkpoint: String::new(),
                options: Some(options),
            }))
            .await
            .map_err(call_err("Tasks.Checkpoint", id))?;
        Ok(())
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
            Ok(r) => deleted(r, "Tasks.Delete", id),
        }
    }

    /// Adds an exec process to a running task. `process_json` is an OCI `Process`; `stdio`
    /// are its FIFO paths (stdin, stdout, stderr; empty = none), and with `terminal` it runs
    /// on a pseudo-terminal the shim copies to stdout (it takes no stderr then).
    pub async fn exec(
        &self,
        id: &str,
        exec_id: &str,
        process_json: Vec<u8>,
        stdio: [&str; 3],
        terminal: bool,
    ) -> Result<()> {
        TasksClient::new(self.channel.clone())
            .exec(self.req(ExecProcessRequest {
                container_id: id.into(),
                stdin: stdio[0].into(),
                stdout: stdio[1].into(),
                stderr: stdio[2].into(),
                terminal,
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

    /// Resizes the pseudo-terminal of the task or of one exec process.
    pub async fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        TasksClient::new(self.channel.clone())
            .resize_pty(self.req(ResizePtyRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
                width,
                height,
            }))
            .await
            .map_err(call_err("Tasks.ResizePty", format!("{id}/{exec_id}")))?;
        Ok(())
    }

    /// Closes the shim's own write end of the stdin FIFO of the task or of one exec process,
    /// so that the process reads end-of-file once the other writers are gone.
    pub async fn close_stdin(&self, id: &str, exec_id: &str) -> Result<()> {
        TasksClient::new(self.channel.clone())
            .close_io(self.req(CloseIoRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
                stdin: true,
            }))
            .await
            .map_err(call_err("Tasks.CloseIO", format!("{id}/{exec_id}")))?;
        Ok(())
    }

    /// Deletes an exited exec process; a missing one is not an error.
    pub async fn delete_process(&self, id: &str, exec_id: &str) -> Result<()> {
        let r = TasksClient::new(self.channel.clone())
            .delete_process(self.req(DeleteProcessRequest {
                container_id: id.into(),
                exec_id: exec_id.into(),
            }))
            .await;
        deleted(r, "Tasks.DeleteProcess", format!("{id}/{exec_id}"))
    }
}
