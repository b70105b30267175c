//! `computectl cp SRC DST`: copy a file to or from a sandbox's workspace (`ID:PATH` names the
//! sandbox side), in 16 MiB chunks.

use std::io::{Read, Write};

use super::{status_error, Target};
use crate::api::compute::v1 as pb;

const CHUNK: usize = 16 << 20;

fn remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    uuid::Uuid::parse_str(id).ok().map(|_| (id, path))
}

/// Runs `cp`.
pub async fn run(t: &Target, src: &str, dst: &str) -> anyhow::Result<()> {
    let mut c = t.compute().await?;
    match (remote(src), remote(dst)) {
        (Some((id, path)), None) => {
            let mut f = std::fs::File::create(dst)?;
            let mut offset = 0i64;
            loop {
                let r = c
                    .read_file(pb::ReadFileRequest {
                        sandbox_id: id.into(),
                        path: path.into(),
                        offset,
                        max_bytes: 0,
                    })
                    .await
                    .map_err(|s| status_error(&format!("read {src}"), s))?
                    .into_inner();
                f.write_all(&r.data)?;
                offset += r.data.len() as i64;
                if r.eof || r.data.is_empty() {
                    break;
                }
            }
            eprintln!("copied {offset} bytes from {src} to {dst}");
        }
        (None, Some((id, path))) => {
            let mut f = std::fs::File::open(src)?;
            let mut total = 0u64;
            let mut first = true;
            loop {
                let mut buf = Vec::with_capacity(CHUNK);
                (&mut f).take(CHUNK as u64).read_to_end(&mut buf)?;
                if buf.is_empty() && !first {
                    break;
                }
                let n = buf.len();
                c.write_file(pb::WriteFileRequest {
                    sandbox_id: id.into(),
                    path: path.into(),
                    data: buf,
                    append: !first,
                    mode: 0,
                })
                .await
                .map_err(|s| status_error(&format!("write {dst}"), s))?;
                total += n as u64;
                first = false;
                if n < CHUNK {
                    break;
                }
            }
            eprintln!("copied {total} bytes from {src} to {dst}");
        }
        _ => anyhow::bail!("exactly one of SRC and DST must be SANDBOX_ID:PATH"),
    }
    Ok(())
}
