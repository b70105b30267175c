//! Framing of sandbox.v1 messages over a byte stream (the in-sandbox agent's stdio FIFOs).
//!
//! A frame is `MAGIC` (4 bytes), a big-endian u32 length and that many bytes of protobuf. A
//! reader that meets anything else (half a frame left by a daemon restart, noise) skips forward
//! to the next `MAGIC` and carries on, so a cut frame never wedges the stream.

use prost::Message;

/// Start of every frame.
pub const MAGIC: &[u8; 4] = b"SBX\x01";
/// Largest frame accepted (a 16 MiB chunk plus room).
pub const MAX_FRAME: usize = 17 << 20;

/// Encodes one message as a frame.
pub fn encode<M: Message>(m: &M) -> Vec<u8> {
    let body = m.encode_to_vec();
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Accumulates bytes and yields whole messages.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
    /// Bytes skipped to resynchronise, for diagnostics.
    pub skipped: u64,
}

impl Reader {
    /// Adds bytes read from the stream.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if one is buffered.
    pub fn next_message<M: Message + Default>(&mut self) -> Option<M> {
        loop {
            // Align on MAGIC.
            match self.buf.windows(4).position(|w| w == MAGIC) {
                Some(0) => {}
                Some(i) => {
                    self.skipped += i as u64;
                    self.buf.drain(..i);
                }
                None => {
                    // Keep a possible MAGIC prefix at the end.
                    let keep = self.buf.len().min(3);
                    let drop = self.buf.len() - keep;
                    self.skipped += drop as u64;
                    self.buf.drain(..drop);
                    return None;
                }
            }
            if self.buf.len() < 8 {
                return None;
            }
            let len =
                u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]) as usize;
            if len > MAX_FRAME {
                // Not a real frame header: skip this MAGIC.
                self.skipped += 4;
                self.buf.drain(..4);
                continue;
            }
            if self.buf.len() < 8 + len {
                return None;
            }
            let body: Vec<u8> = self.buf.drain(..8 + len).skip(8).collect();
            match M::decode(body.as_slice()) {
                Ok(m) => return Some(m),
                Err(_) => {
                    self.skipped += (8 + len) as u64;
                    continue;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    fn hb() -> pb::WorkerFrame {
        pb::WorkerFrame {
            msg: Some(pb::worker_frame::Msg::Heartbeat(pb::Heartbeat {})),
        }
    }

    fn end(req_id: u64) -> pb::WorkerFrame {
        pb::WorkerFrame {
            msg: Some(pb::worker_frame::Msg::End(pb::End {
                req_id,
                exit_code: 3,
            })),
        }
    }

    #[test]
    fn frames_round_trip_byte_by_byte() {
        let mut bytes = encode(&hb());
        bytes.extend(encode(&end(7)));
        let mut r = Reader::default();
        let mut got = Vec::new();
        for b in bytes {
            r.push(&[b]);
            while let Some(m) = r.next_message::<pb::WorkerFrame>() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![hb(), end(7)]);
    }

    #[test]
    fn a_cut_frame_does_not_wedge_the_stream() {
        let whole = encode(&end(1));
        let mut bytes = whole[..whole.len() - 3].to_vec(); // cut by a restart
        bytes.extend(b"noise");
        bytes.extend(encode(&end(2)));
        let mut r = Reader::default();
        r.push(&bytes);
        let mut got = Vec::new();
        while let Some(m) = r.next_message::<pb::WorkerFrame>() {
            got.push(m);
        }
        assert_eq!(got.last(), Some(&end(2)));
        // A huge bogus length after MAGIC is skipped too.
        let mut r = Reader::default();
        let mut bogus = MAGIC.to_vec();
        bogus.extend(u32::MAX.to_be_bytes());
        bogus.extend(encode(&end(3)));
        r.push(&bogus);
        assert_eq!(r.next_message::<pb::WorkerFrame>(), Some(end(3)));
    }
}
