//! `computectl cp SRC DST`: copy a file to or from a sandbox's workspace (`ID:PATH` names the
//! sandbox side), in 16 MiB chunks.

use std::io::Read;

use super::{read_chunks, Answer, Target};
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
            let copied = read_chunks(&mut f, |offset| {
                let mut c = c.clone();
                let req = pb::ReadFileRequest {
                    sandbox_id: id.into(),
                    path: path.into(),
                    offset,
                    max_bytes: 0,
                };
                async move {
                    let r = c.read_file(req).await.answer(&format!("read {src}"))?;
                    Ok((r.data, r.eof))
                }
            })
            .await?;
            eprintln!("copied {copied} bytes from {src} to {dst}");
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
                    data: buf.into(),
                    append: !first,
                    mode: 0,
                })
                .await
                .answer(&format!("write {dst}"))?;
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
