//! The run log of a platform sandbox: its workload's stdout/stderr and typed lifecycle markers
//! (created, started, exited with its code, oom, deleted, ...), across the sandbox's whole life,
//! on the node's disk under `<state_dir>/runlogs/<id>/`.
//!
//! * Every entry has an offset: 1, 2, 3, ... in the order written, never reused, so a reader
//!   that has seen offset N asks for "after N" and gets nothing twice and nothing missed (of
//!   what is still retained).
//! * Entries go to segment files named by their first offset (`00000000000000000001.seg`). A
//!   segment is closed at a quarter of the sandbox's retention and the oldest segments are
//!   deleted while the rest is over it: what is kept is at most the retention (plus one entry).
//! * A record is `len u32 | offset u64 | run u32 | time_ns u64 | kind u8 | exit i32 | data`,
//!   little-endian, `len` counting what follows it. A record torn by a crash is cut off when
//!   the log is opened again, and the offsets go on from the last whole one.
//! * Writers and readers are blocking (call them through `blocking`); followers wait on
//!   [`RunLog::subscribe`], which changes on every append, instead of polling.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Workload stdout.
    Stdout,
    /// Workload stderr.
    Stderr,
    /// A lifecycle marker.
    Marker(Marker),
}

/// A typed lifecycle marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The sandbox was created (its definition recorded).
    Created,
    /// The workload (or, with exec_only, the sandbox) started.
    Started,
    /// The workload exited; the entry carries its code.
    Exited,
    /// The workload was killed for going over the sandbox's memory.
    OomKilled,
    /// Suspended.
    Suspended,
    /// Resumed.
    Resumed,
    /// The sandbox's runtime failed; the data says why.
    Failed,
    /// Its max lifetime ran out.
    Terminated,
    /// Deleted: the last entry of a log.
    Deleted,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Stdout => 1,
            Kind::Stderr => 2,
            Kind::Marker(m) => {
                10 + match m {
                    Marker::Created => 0,
                    Marker::Started => 1,
                    Marker::Exited => 2,
                    Marker::OomKilled => 3,
                    Marker::Suspended => 4,
                    Marker::Resumed => 5,
                    Marker::Failed => 6,
                    Marker::Terminated => 7,
                    Marker::Deleted => 8,
                }
            }
        }
    }

    fn of(code: u8) -> Option<Kind> {
        use Marker::*;
        Some(match code {
            1 => Kind::Stdout,
            2 => Kind::Stderr,
            10..=18 => Kind::Marker(
                [
                    Created, Started, Exited, OomKilled, Suspended, Resumed, Failed, Terminated,
                    Deleted,
                ][usize::from(code - 10)],
            ),
            _ => return None,
        })
    }

    /// Whether this entry ends the log (nothing is written after it).
    pub fn is_final(self) -> bool {
        self == Kind::Marker(Marker::Deleted)
    }
}

/// One entry of a run log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its offset (1-based, never reused).
    pub offset: u64,
    /// The run of the workload it belongs to.
    pub run: u32,
    /// When it was written.
    pub time: SystemTime,
    /// What it is.
    pub kind: Kind,
    /// The output chunk, or a marker's detail.
    pub data: Vec<u8>,
    /// The exit code of [`Marker::Exited`] (0 otherwise).
    pub exit_code: i32,
}

/// Header bytes after `len`.
const HEAD: usize = 8 + 4 + 8 + 1 + 4;
/// The largest record a reader accepts (a corrupt length is not an allocation).
const MAX_RECORD: usize = 16 << 20;
/// The most bytes of entries one read returns (besides the first, whatever its size).
const READ_BYTES: usize = 4 << 20;

fn encode(e: &Entry) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + HEAD + e.data.len());
    b.extend_from_slice(&((HEAD + e.data.len()) as u32).to_le_bytes());
    b.extend_from_slice(&e.offset.to_le_bytes());
    b.extend_from_slice(&e.run.to_le_bytes());
    let ns = e
        .time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    b.extend_from_slice(&ns.to_le_bytes());
    b.push(e.kind.code());
    b.extend_from_slice(&e.exit_code.to_le_bytes());
    b.extend_from_slice(&e.data);
    b
}

/// Reads one record; `Ok(None)` at a clean end or a torn tail.
fn decode(r: &mut impl Read) -> io::Result<Option<(Entry, usize)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if !(HEAD..=MAX_RECORD).contains(&len) {
        return Ok(None);
    }
    let mut b = vec![0u8; len];
    match r.read_exact(&mut b) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let Some(kind) = Kind::of(b[20]) else {
        return Ok(None);
    };
    let e = Entry {
        offset: u64_at(0),
        run: u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
        time: UNIX_EPOCH + Duration::from_nanos(u64_at(12)),
        kind,
        exit_code: i32::from_le_bytes(b[21..25].try_into().unwrap_or_default()),
        data: b[HEAD..].to_vec(),
    };
    Ok(Some((e, 4 + len)))
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The segments of a log directory, oldest first: (first offset, path, bytes).
fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf, u64)>> {
    let mut v = Vec::new();
    for d in fs::read_dir(dir)? {
        let d = d?;
        let name = d.file_name();
        let Some(first) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".seg"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        v.push((first, d.path(), d.metadata()?.len()));
    }
    v.sort();
    Ok(v)
}

struct Writer {
    /// The open segment.
    file: File,
    /// Its first offset and size.
    first: u64,
    bytes: u64,
    /// Closed segments: (first offset, bytes), oldest first.
    closed: Vec<(u64, u64)>,
    /// The next offset to write.
    next: u64,
    /// Set once the final entry is written.
    done: bool,
}

/// The run log of one sandbox. Cheap to share behind an `Arc`.
pub struct RunLog {
    dir: PathBuf,
    retention: u64,
    w: Mutex<Writer>,
    /// The last offset written (0: none); changes on every append.
    tip: watch::Sender<u64>,
}

impl std::fmt::Debug for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLog").field("dir", &self.dir).finish()
    }
}

impl RunLog {
    /// Opens (or creates) the log in `dir`, keeping at most `retention` bytes. A torn last
    /// record is cut off. Blocking.
    pub fn open(dir: &Path, retention: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let segs = segments(dir)?;
        let mut closed: Vec<(u64, u64)> = segs.iter().map(|(f, _, b)| (*f, *b)).collect();
        let (file, first, bytes, next, done) = match closed.pop() {
            None => {
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(segment_name(1)))?;
                (f, 1, 0, 1, false)
            }
            Some((first, _)) => {
                let path = dir.join(segment_name(first));
                let mut r = BufReader::new(File::open(&path)?);
                let (mut good, mut next, mut done) = (0u64, first, false);
                while let Some((e, n)) = decode(&mut r)? {
                    good += n as u64;
                    next = e.offset + 1;
                    done = e.kind.is_final();
                }
                let f = OpenOptions::new().append(true).open(&path)?;
                f.set_len(good)?;
                (f, first, good, next, done)
            }
        };
        let tip = watch::channel(next - 1).0;
        Ok(Self {
            dir: dir.to_path_buf(),
            retention: retention.max(64 << 10),
            w: Mutex::new(Writer {
                file,
                first,
                bytes,
                closed,
                next,
                done,
            }),
            tip,
        })
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.w.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an entry of `kind` for `run`; returns its offset (None once the log has ended
    /// with its final entry). Blocking.
    pub fn append(
        &self,
        run: u32,
        kind: Kind,
        data: &[u8],
        exit_code: i32,
    ) -> io::Result<Option<u64>> {
        let mut w = self.writer();
        if w.done {
            return Ok(None);
        }
        let seg_max = self.retention / 4;
        if w.bytes > 0 && w.bytes + (4 + HEAD + data.len()) as u64 > seg_max {
            let first = w.next;
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(segment_name(first)))?;
            let old = (w.first, w.bytes);
            w.closed.push(old);
            w.file = file;
            w.first = first;
            w.bytes = 0;
            // Drop the oldest segments while what is kept, with the new segment full, would
            // be over the retention.
            let mut total: u64 = w.closed.iter().map(|c| c.1).sum();
            while total + seg_max > self.retention && !w.closed.is_empty() {
                let (f, b) = w.closed.remove(0);
                let _ = fs::remove_file(self.dir.join(segment_name(f)));
                total -= b;
            }
        }
        let e = Entry {
            offset: w.next,
            run,
            time: SystemTime::now(),
            kind,
            data: data.to_vec(),
            exit_code,
        };
        let rec = encode(&e);
        w.file.write_all(&rec)?;
        w.bytes += rec.len() as u64;
        w.next += 1;
        w.done = kind.is_final();
        drop(w);
        self.tip.send_replace(e.offset);
        Ok(Some(e.offset))
    }

    /// The last offset written (0: none yet).
    pub fn tip(&self) -> u64 {
        *self.tip.borrow()
    }

    /// Whether the final entry has been written.
    pub fn ended(&self) -> bool {
        self.writer().done
    }

    /// A receiver that changes on every append.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tip.subscribe()
    }

    /// The oldest offset still retained (the tip + 1 when empty).
    pub fn first_retained(&self) -> u64 {
        let w = self.writer();
        w.closed.first().map(|c| c.0).unwrap_or(w.first)
    }

    /// Bytes kept on disk.
    pub fn retained_bytes(&self) -> u64 {
        let w = self.writer();
        w.closed.iter().map(|c| c.1).sum::<u64>() + w.bytes
    }

    /// Up to `limit` entries after `after` (of `run` only when it is not 0), oldest first, and
    /// at most ~4 MiB of them. Blocking.
    pub fn read(&self, after: u64, run: u32, limit: usize) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let segs = segments(&self.dir)?;
        // The last segment whose first offset is <= after + 1 holds it.
        let start = segs
            .iter()
            .rposition(|(f, _, _)| *f <= after + 1)
            .unwrap_or(0);
        for (_, path, _) in &segs[start..] {
            let f = match File::open(path) {
                Ok(f) => f,
                // Retention removed it under us: the next one goes on.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let mut r = BufReader::with_capacity(256 << 10, f);
            r.seek(SeekFrom::Start(0))?;
            while let Some((e, n)) = decode(&mut r)? {
                if e.offset <= after || (run != 0 && e.run != run) {
                    continue;
                }
                bytes += n;
                out.push(e);
                if out.len() >= limit || bytes >= READ_BYTES {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Removes the log from disk. Blocking.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn offsets_go_on_across_reopen_and_a_torn_tail_is_cut() {
        let d = dir();
        let log = RunLog::open(d.path(), 1 << 20).unwrap();
        assert_eq!(log.tip(), 0);
        log.append(1, Kind::Marker(Marker::Created), b"", 0)
            .unwrap();
        log.append(1, Kind::Stdout, b"hello\n", 0).unwrap();
        log.append(1, Kind::Marker(Marker::Exited), b"", 3).unwrap();
        drop(log);
        // Half a record at the end, as a crash leaves it.
        let seg = d.path().join(segment_name(1));
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&[40, 0, 0, 0, 9, 9]).unwrap();
        drop(f);
        let log = RunLog::open(d.path(), 1 << 20).unwrap();
        assert_eq!(log.tip(), 3);
        assert_eq!(log.append(2, Kind::Stderr, b"x", 0).unwrap(), Some(4));
        let all = log.read(0, 0, 100).unwrap();
        let offsets: Vec<u64> = all.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, [1, 2, 3, 4]);
        assert_eq!(all[1].data, b"hello\n");
        assert_eq!(all[2].kind, Kind::Marker(Marker::Exited));
        assert_eq!(all[2].exit_code, 3);
        // After, run filter, limit.
        assert_eq!(log.read(2, 0, 100).unwrap()[0].offset, 3);
        let run2 = log.read(0, 2, 100).unwrap();
        assert_eq!(run2.len(), 1);
        assert_eq!(run2[0].offset, 4);
        assert_eq!(log.read(0, 0, 2).unwrap().len(), 2);
    }

    #[test]
    fn retention_holds_and_reads_go_on_from_the_oldest_kept() {
        let d = dir();
        let retention = 256 << 10;
        let log = RunLog::open(d.path(), retention).unwrap();
        let chunk = vec![b'a'; 4000];
        for _ in 0..1000 {
            log.append(1, Kind::Stdout, &chunk, 0).unwrap();
        }
        let on_disk: u64 = segments(d.path()).unwrap().iter().map(|s| s.2).sum();
        assert!(on_disk <= retention + 4100, "{on_disk}");
        assert!(on_disk >= retention / 2, "{on_disk}");
        assert_eq!(log.retained_bytes(), on_disk);
        let first = log.first_retained();
        assert!(first > 1);
        let got = log.read(0, 0, 10).unwrap();
        assert_eq!(got[0].offset, first);
        // Everything kept, read in pages, without a gap or a repeat.
        let (mut after, mut expect) = (0, first);
        loop {
            let page = log.read(after, 0, 7).unwrap();
            let Some(last) = page.last() else { break };
            for e in &page {
                assert_eq!(e.offset, expect);
                expect += 1;
            }
            after = last.offset;
        }
        assert_eq!(after, 1000);
    }

    #[test]
    fn nothing_is_written_after_the_final_entry() {
        let d = dir();
        let log = RunLog::open(d.path(), 1 << 20).unwrap();
        let rx = log.subscribe();
        log.append(1, Kind::Marker(Marker::Deleted), b"", 0)
            .unwrap();
        assert!(rx.has_changed().unwrap());
        assert!(log.ended());
        assert_eq!(log.append(1, Kind::Stdout, b"late", 0).unwrap(), None);
        drop(log);
        let log = RunLog::open(d.path(), 1 << 20).unwrap();
        assert!(log.ended());
        assert_eq!(log.tip(), 1);
        log.remove().unwrap();
        assert!(!d.path().exists());
    }
}
