//! Admission against the node's disk and loop devices: CreateSandbox and WriteFile are
//! RESOURCE_EXHAUSTED, with nothing half-made, when the workspace partition is (nearly) full or
//! the node holds its most loop devices.
//!
//! ext4-loop volumes are sparse: their blocks are allocated on the host disk only when written.
//! A full host disk under a volume would turn the sandbox's writes into I/O errors of the loop
//! device (not ENOSPC), so the node keeps `min_free_disk` free and refuses new data below it.

use tracing::{debug, warn};

use super::{blocking, Error, Node, Result};
use crate::volume;

impl Node {
    /// RESOURCE_EXHAUSTED when the state directory's filesystem has less than `min_free_disk`
    /// free. A filesystem that cannot be asked is not refused (logged).
    pub async fn check_free_disk(&self) -> Result<()> {
        let cfg = self.config();
        let min = cfg.min_free_disk.bytes();
        if min == 0 {
            return Ok(());
        }
        let dir = cfg.state_dir.clone();
        match blocking(move || volume::free_bytes(&dir)).await? {
            Ok(free) if free < min => {
                warn!(free, min, "workspace disk is full: refusing new data");
                Err(Error::ResourceExhausted(format!(
                    "the node's workspace disk is full ({} MiB free, {} MiB kept free)",
                    free >> 20,
                    min >> 20
                )))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                debug!(error = %e, "could not read the free space of the state directory");
                Ok(())
            }
        }
    }

    /// RESOURCE_EXHAUSTED when `want` new volumes of `backend` would need loop devices the node
    /// has not left under `max_loop_volumes`.
    pub(super) async fn check_loop_devices(
        &self,
        backend: volume::Backend,
        want: usize,
    ) -> Result<()> {
        let cap = self.config().max_loop_volumes as usize;
        if cap == 0 || backend != volume::Backend::Ext4Loop {
            return Ok(());
        }
        let dirs = [self.config().state_dir.clone(), self.config().store_dir()];
        let held = blocking(move || volume::loop_volumes(&dirs)).await?;
        if held + want > cap {
            return Err(Error::ResourceExhausted(format!(
                "the node holds its maximum of {cap} loop-device volumes"
            )));
        }
        Ok(())
    }
}

/// The error of a failed volume creation: RESOURCE_EXHAUSTED for a full disk or no loop device
/// (the detail, with host paths, goes to the log only), INTERNAL otherwise.
pub(super) fn volume_error(id: &str, e: volume::Error) -> Error {
    if e.is_no_space() {
        warn!(sandbox_id = %id, error = %e, "no space for the workspace volume");
        Error::ResourceExhausted("no space left on the node for the workspace volume".into())
    } else if e.is_no_loop_device() {
        warn!(sandbox_id = %id, error = %e, "no loop device for the workspace volume");
        Error::ResourceExhausted("no loop device left on the node for the workspace volume".into())
    } else {
        Error::Internal(format!("create workspace volume: {e}"))
    }
}
