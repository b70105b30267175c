//! Framing of sandbox.v1 messages over a byte stream (the in-sandbox agent's stdio FIFOs).
//!
//! A frame is `MAGIC` (4 bytes), a big-endian u32 length and that many bytes of protobuf. A
//! reader that meets anything else (half a frame left by a daemon restart, noise) skips forward
//! to the next `MAGIC` and carries on, so a cut frame never wedges the stream.
//!
//! One more kind of frame travels from the node daemon to its in-sandbox agent only:
//! [`FLOW_MAGIC`] and a [`Flow`], the agent-private flow control of exec output (see
//! `crate::flow`). It is not part of sandbox.v1: a reader that does not know it (an agent from
//! before it) skips it as noise, and external workers never see it.
//!
//! Interactive execs add two more, also between the node daemon and its agent only:
//!
//! * [`CONTROL_MAGIC`] and a [`Control`] (daemon → agent): start an interactive exec (a tty or
//!   streamed stdin), its stdin bytes, stdin's end, a terminal resize, an abort. All of one
//!   exec's controls travel in order on one channel, so a start is never overtaken by its
//!   stdin or its abort.
//! * [`FLOW_MAGIC`] and a [`Flow`] the other way (agent → daemon): stdin credit. The daemon
//!   sends at most [`Start::stdin_window`] bytes of an exec's stdin that the agent has not yet
//!   credited back; the agent credits them as the process takes them (written into its pipe or
//!   terminal), so a process that does not read stdin stops the client, not memory.
//!
//! An agent that serves them says so in its Hello's capabilities ([`INTERACTIVE_CAPABILITY`]);
//! the daemon sends none to an agent that does not.

use prost::Message;

/// Start of every frame.
pub const MAGIC: &[u8; 4] = b"SBX\x01";
/// Start of an agent-private flow-control frame (daemon → agent).
pub const FLOW_MAGIC: &[u8; 4] = b"SBX\x02";
/// Start of an agent-private control frame (daemon → agent): [`Control`].
pub const CONTROL_MAGIC: &[u8; 4] = b"SBX\x03";
/// The Hello capability of an agent that takes [`Control`] frames.
pub const INTERACTIVE_CAPABILITY: &str = "compute/interactive-exec";
/// Largest frame accepted (a 16 MiB chunk plus room).
pub const MAX_FRAME: usize = 17 << 20;

/// Flow control of exec output, daemon → agent.
///
/// * `window` > 0 announces flow control for the link: from now on every exec may have at most
///   `window` bytes of output sent and not yet credited back. Sent once, first, by each daemon
///   that opens the link; a later one (a new daemon after a restart) releases the execs of the
///   earlier link, whose readers are gone.
/// * Otherwise `credit` more bytes of exec `req_id`'s output may be sent: the daemon's client
///   has taken that much.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Flow {
    /// The exec credited.
    #[prost(uint64, tag = "1")]
    pub req_id: u64,
    /// Bytes credited back.
    #[prost(uint64, tag = "2")]
    pub credit: u64,
    /// Per-exec window announced for the link (0: this is a credit).
    #[prost(uint64, tag = "3")]
    pub window: u64,
}

/// How an interactive exec starts (in a [`Control`]).
#[derive(Clone, PartialEq, Message)]
pub struct Start {
    /// The exec, as sandbox.v1 has it (its `stdin` bytes, if any, are written first).
    #[prost(message, optional, tag = "1")]
    pub exec: Option<crate::pb::Exec>,
    /// Run it on a new pseudo-terminal: stdin, stdout and stderr are the terminal (all output
    /// comes as stdout), the process leads a new session whose controlling terminal it is.
    #[prost(bool, tag = "2")]
    pub tty: bool,
    /// The terminal's initial size (0: 24 rows, 80 columns).
    #[prost(uint32, tag = "3")]
    pub rows: u32,
    /// Columns (0: 80).
    #[prost(uint32, tag = "4")]
    pub cols: u32,
    /// Stdin comes in [`Control::data`] frames until [`Control::eof`] (without a tty, a pipe;
    /// false and no tty: `/dev/null` after the exec's own stdin bytes).
    #[prost(bool, tag = "5")]
    pub stdin: bool,
    /// Most stdin bytes the daemon sends ahead of the agent's credit.
    #[prost(uint64, tag = "6")]
    pub stdin_window: u64,
}

/// A terminal size.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct TtySize {
    /// Rows.
    #[prost(uint32, tag = "1")]
    pub rows: u32,
    /// Columns.
    #[prost(uint32, tag = "2")]
    pub cols: u32,
}

/// An agent-private control of exec `req_id`, daemon → agent. The fields that are set apply
/// in this order: start, data, eof, resize, abort.
#[derive(Clone, PartialEq, Message)]
pub struct Control {
    /// The exec.
    #[prost(uint64, tag = "1")]
    pub req_id: u64,
    /// Start it (instead of a sandbox.v1 Exec frame).
    #[prost(message, optional, tag = "2")]
    pub start: Option<Start>,
    /// Stdin bytes, within the credit.
    #[prost(bytes = "vec", tag = "3")]
    pub data: Vec<u8>,
    /// Stdin ends: without a tty its pipe is closed once everything before is written; with
    /// a tty the terminal's end-of-file character (^D) is typed.
    #[prost(bool, tag = "4")]
    pub eof: bool,
    /// The terminal's new size (the foreground process group gets SIGWINCH).
    #[prost(message, optional, tag = "5")]
    pub resize: Option<TtySize>,
    /// Abort it, as sandbox.v1's Abort does (a second one kills at once).
    #[prost(bool, tag = "6")]
    pub abort: bool,
}

/// One frame read: a sandbox.v1 message, or an agent-private frame.
#[derive(Debug, PartialEq)]
pub enum Frame<M> {
    /// A sandbox.v1 message.
    Message(M),
    /// Flow control (daemon → agent: output credit; agent → daemon: stdin credit).
    Flow(Flow),
    /// Control of an interactive exec (daemon → agent).
    Control(Control),
}

/// Encodes one message as a frame.
pub fn encode<M: Message>(m: &M) -> Vec<u8> {
    encode_with(MAGIC, m)
}

/// Encodes a flow-control frame.
pub fn encode_flow(f: &Flow) -> Vec<u8> {
    encode_with(FLOW_MAGIC, f)
}

/// Encodes a control frame.
pub fn encode_control(c: &Control) -> Vec<u8> {
    encode_with(CONTROL_MAGIC, c)
}

fn encode_with<M: Message>(magic: &[u8; 4], m: &M) -> Vec<u8> {
    let body = m.encode_to_vec();
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(magic);
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

    /// The next whole sandbox.v1 message, if one is buffered (agent-private frames are
    /// skipped).
    pub fn next_message<M: Message + Default>(&mut self) -> Option<M> {
        loop {
            match self.next_frame()? {
                Frame::Message(m) => return Some(m),
                Frame::Flow(_) | Frame::Control(_) => continue,
            }
        }
    }

    /// The next whole frame of either kind, if one is buffered.
    pub fn next_frame<M: Message + Default>(&mut self) -> Option<Frame<M>> {
        loop {
            // Align on either MAGIC.
            match self
                .buf
                .windows(4)
                .position(|w| w == MAGIC || w == FLOW_MAGIC || w == CONTROL_MAGIC)
            {
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
            let body = &self.buf[8..8 + len];
            let decoded = match &self.buf[..4] {
                m if m == FLOW_MAGIC => Flow::decode(body).map(Frame::Flow),
                m if m == CONTROL_MAGIC => Control::decode(body).map(Frame::Control),
                _ => M::decode(body).map(Frame::Message),
            };
            self.buf.drain(..8 + len);
            match decoded {
                Ok(f) => return Some(f),
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

    #[test]
    fn flow_frames_interleave_and_old_readers_skip_them() {
        let credit = Flow {
            req_id: 9,
            credit: 65536,
            window: 0,
        };
        let mut bytes = encode_flow(&Flow {
            window: 1 << 20,
            ..Default::default()
        });
        bytes.extend(encode(&end(1)));
        bytes.extend(encode_flow(&credit));
        bytes.extend(encode(&end(2)));
        let mut r = Reader::default();
        let mut got = Vec::new();
        for b in &bytes {
            r.push(&[*b]);
            while let Some(f) = r.next_frame::<pb::WorkerFrame>() {
                got.push(f);
            }
        }
        assert_eq!(
            got,
            vec![
                Frame::Flow(Flow {
                    window: 1 << 20,
                    ..Default::default()
                }),
                Frame::Message(end(1)),
                Frame::Flow(credit),
                Frame::Message(end(2)),
            ]
        );
        // A reader that knows only MAGIC (an agent from before flow control) resyncs past them.
        let old: Vec<u8> = bytes.clone();
        let mut r = Reader::default();
        r.push(&old);
        let mut msgs = Vec::new();
        while let Some(m) = r.next_message::<pb::WorkerFrame>() {
            msgs.push(m);
        }
        assert_eq!(msgs, vec![end(1), end(2)]);
        let mut plain = Vec::new();
        let mut i = 0;
        while let Some(p) = old[i..].windows(4).position(|w| w == MAGIC) {
            plain.push(i + p);
            i += p + 4;
        }
        assert_eq!(
            plain.len(),
            2,
            "flow frames never look like sandbox.v1 frames"
        );
    }
}
