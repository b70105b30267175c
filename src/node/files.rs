//! ReadFile, WriteFile and ListFiles: on the host side of a sandbox's workspace, with no exec,
//! through the workspace's safe resolver (off the async runtime).

use super::{blocking, Node, Result};
use crate::workspace::{Entry, ReadResult};

impl Node {
    /// Reads up to `max_bytes` (0: the cap) of `path` from `offset`.
    pub async fn read_file(
        &self,
        id: &str,
        path: String,
        offset: i64,
        max_bytes: i64,
    ) -> Result<ReadResult> {
        let (_, ws) = self.workspace(id).await?;
        Ok(blocking(move || ws.read(&path, offset, max_bytes)).await??)
    }

    /// Writes (or appends) `data` to `path`, creating parents; returns the bytes written.
    /// RESOURCE_EXHAUSTED when the node's disk is under its reserve.
    pub async fn write_file(
        &self,
        id: &str,
        path: String,
        data: bytes::Bytes,
        append: bool,
        mode: u32,
    ) -> Result<u64> {
        let (sb, ws) = self.workspace(id).await?;
        if sb.platform.as_ref().is_some_and(|p| p.read_only) {
            return Err(super::Error::Precondition(format!(
                "sandbox {id}'s workspace at {} is mounted read-only",
                sb.workspace.mount_path
            )));
        }
        self.check_free_disk().await?;
        Ok(blocking(move || ws.write(&path, &data, append, mode)).await??)
    }

    /// Lists `path` (recursively with `recursive`), at most `max_entries` (0: the default);
    /// returns the entries and whether the listing was cut.
    pub async fn list_files(
        &self,
        id: &str,
        path: String,
        recursive: bool,
        max_entries: u32,
    ) -> Result<(Vec<Entry>, bool)> {
        let (_, ws) = self.workspace(id).await?;
        Ok(blocking(move || ws.list(&path, recursive, max_entries)).await??)
    }
}
