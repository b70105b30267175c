//! Starting a process with as few system calls as possible, because inside gVisor each one is
//! expensive: ~70 µs under the ptrace platform on these machines (a `getpid` loop), against
//! well under 1 µs natively.
//!
//! glibc's `posix_spawn` (what `std::process::Command` uses) is a vfork, but its child walks
//! every signal with two `sigaction` calls each (~65 calls) and the parent sizes the child's
//! stack with `prlimit` and maps and unmaps it: about 80 system calls, ~5 ms of every exec of
//! `true` under ptrace (runsc's `--strace` of the agent shows them). Here the child is a
//! `clone(CLONE_VM | CLONE_VFORK)` on a stack kept for it, and does only what an exec needs:
//! default dispositions for the two signals the agent itself handles or ignores (SIGCHLD,
//! SIGPIPE), its own process group, its stdio, its working directory, an empty signal mask,
//! and `execve` along `PATH`. A failure in the child is handed back through shared memory.
//!
//! Children are reaped by one thread blocked in `waitpid(-1)`, so every child of the worker
//! must be started here (a `tokio::process` child would be reaped from under tokio).

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, Once, OnceLock};

use nix::libc::{self, c_char, c_int, c_void};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// The program and its arguments; a program without `/` is looked up along `PATH` (the
    /// child's, as `env` leaves it).
    pub argv: Vec<OsString>,
    /// Variables set (or replaced) on top of the agent's own environment.
    pub env: Vec<(OsString, OsString)>,
    /// Working directory.
    pub cwd: Option<OsString>,
    /// A pipe for stdin (else `/dev/null`).
    pub stdin: bool,
    /// Run it on a new pseudo-terminal of this size (rows, columns) instead of pipes: it
    /// leads a new session whose controlling terminal that is, and the terminal is its stdin,
    /// stdout and stderr ([`Child::pty`]).
    pub tty: Option<(u16, u16)>,
}

impl Spec {
    /// `argv` as given.
    pub fn new<S: AsRef<OsStr>>(argv: impl IntoIterator<Item = S>) -> Self {
        Spec {
            argv: argv.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            ..Default::default()
        }
    }
}

/// Why a spawn failed: in the child's working directory or at the program.
#[derive(Debug)]
pub enum SpawnError {
    /// `chdir` to the working directory failed.
    Cwd(io::Error),
    /// The program could not be run (`NotFound`, `PermissionDenied`, ENOEXEC for a script
    /// without `#!`, …), or the pipes could not be made.
    Exec(io::Error),
}

/// A started process: its group id is its pid. Dropped before it was reaped, it is killed.
#[derive(Debug)]
pub struct Child {
    pid: i32,
    /// The write end of its stdin, if [`Spec::stdin`].
    pub stdin: Option<pipe::Sender>,
    /// The read end of its stdout.
    pub stdout: Option<pipe::Receiver>,
    /// The read end of its stderr.
    pub stderr: Option<pipe::Receiver>,
    /// The master side of its terminal, if [`Spec::tty`].
    pub pty: Option<Arc<Pty>>,
    exit: Option<oneshot::Receiver<c_int>>,
}

/// The master side of a pseudo-terminal, non-blocking on the runtime. Reading it gives what
/// the process wrote to the terminal (after the line discipline: `\n` becomes `\r\n`, echo);
/// writing it is typing.
#[derive(Debug)]
pub struct Pty {
    fd: AsyncFd<OwnedFd>,
    /// The session on it (its leader's pid).
    session: i32,
}

impl Pty {
    /// Sets the terminal's size, and signals SIGWINCH to the process groups on it. Linux
    /// signals the foreground group itself; gVisor changes the size but signals nobody, and
    /// does not tell the master its foreground group, so every group of the session gets it
    /// (SIGWINCH is ignored unless handled: a program that does not care never sees it, one
    /// that does looks at the size again).
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        set_size(self.fd.get_ref(), rows, cols)?;
        for pg in self.groups() {
            // SAFETY: kill(2) of a process group; a group that is gone is ESRCH.
            unsafe { libc::kill(-pg, libc::SIGWINCH) };
        }
        Ok(())
    }

    /// The process groups on the terminal: its foreground group where the master tells it,
    /// else every group of its session (from `/proc`; the session's own group first).
    pub fn groups(&self) -> Vec<i32> {
        // SAFETY: tcgetpgrp(3) on a descriptor we own.
        let fg = unsafe { libc::tcgetpgrp(self.fd.get_ref().as_raw_fd()) };
        if fg > 0 {
            return if fg == self.session {
                vec![fg]
            } else {
                vec![self.session, fg]
            };
        }
        let mut groups = vec![self.session];
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid pgrp session ...`; comm may hold anything but `)` ends it.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            let (Some(pgrp), Some(sid)) = (f.get(2), f.get(3)) else {
                continue;
            };
            if let (Ok(pg), Ok(sid)) = (pgrp.parse::<i32>(), sid.parse::<i32>()) {
                if sid == self.session && !groups.contains(&pg) {
                    groups.push(pg);
                }
            }
        }
        groups
    }

    /// The terminal's end-of-file character (^D unless the program changed it).
    pub fn eof_char(&self) -> u8 {
        // SAFETY: tcgetattr(3) into a zeroed termios, on a descriptor we own.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(self.fd.get_ref().as_raw_fd(), &mut t) == 0
                && t.c_cc[libc::VEOF] != 0
            {
                t.c_cc[libc::VEOF]
            } else {
                4
            }
        }
    }

    /// A reader of the terminal's output: the end is the terminal's hang-up (every process
    /// holding it has closed it), which the master reads as EIO.
    pub fn reader(self: &Arc<Self>) -> PtyIo {
        PtyIo(self.clone())
    }

    /// A writer of the terminal's input.
    pub fn writer(self: &Arc<Self>) -> PtyIo {
        PtyIo(self.clone())
    }
}

/// Reads or writes a [`Pty`].
#[derive(Debug, Clone)]
pub struct PtyIo(Arc<Pty>);

impl tokio::io::AsyncRead for PtyIo {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        loop {
            let mut guard = match self.0.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            let r = guard.try_io(|fd| {
                // SAFETY: read(2) into the unfilled part of the buffer.
                let n = unsafe {
                    libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len())
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // The other side hung up: the end of the output.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl tokio::io::AsyncWrite for PtyIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        use std::task::Poll;
        loop {
            let mut guard = match self.0.fd.poll_write_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let r = guard.try_io(|fd| {
                // SAFETY: write(2) of the caller's bytes.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

fn set_size(fd: &OwnedFd, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ with a valid winsize, on a terminal descriptor we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new pseudo-terminal of `rows` x `cols`: its master (non-blocking) and slave, both
/// closed on exec.
fn open_pty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt(3), grantpt(3), unlockpt(3), ptsname_r(3) and open(2) on what they
    // return; every descriptor is owned at once.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(io::Error::last_os_error());
        }
        let master = OwnedFd::from_raw_fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut name = [0 as c_char; 128];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let slave = OwnedFd::from_raw_fd(s);
        set_size(&master, rows, cols)?;
        set_nonblocking(&master)?;
        Ok((master, slave))
    }
}

impl Child {
    /// Its pid (and process group id).
    pub fn id(&self) -> i32 {
        self.pid
    }

    /// Waits until it has exited and is reaped.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let rx = self
            .exit
            .as_mut()
            .ok_or_else(|| io::Error::other("already waited for"))?;
        let status = rx
            .await
            .map_err(|_| io::Error::other("the reaper stopped"))?;
        self.exit = None;
        Ok(ExitStatus::from_raw(status))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exit.is_some() {
            let mut slots = slots();
            // Reaped meanwhile: the status is in the channel, nothing to kill.
            if matches!(slots.get(&self.pid), Some(Slot::Waiting(_))) {
                slots.insert(self.pid, Slot::Abandoned);
                // SAFETY: kill(2) on a pid that is ours and not yet reaped.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
            }
        }
    }
}

/// A child's entry in the reaper's table.
enum Slot {
    /// Someone waits for its status.
    Waiting(oneshot::Sender<c_int>),
    /// Its `Child` was dropped: reap it and forget it.
    Abandoned,
    /// Reaped before its `Child` was registered (the reaper thread ran in between).
    Exited(c_int),
}

fn slots() -> std::sync::MutexGuard<'static, HashMap<i32, Slot>> {
    static SLOTS: OnceLock<Mutex<HashMap<i32, Slot>>> = OnceLock::new();
    SLOTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// How many children were ever started, and the reaper thread's wake-up. The reaper sleeps
/// only after `waitpid` said there are no children at all (ECHILD) and no child was started
/// since: it counts nothing, so a child some other code in the process reaped (a test's
/// `std::process::Command`) can never make it miss one of ours.
static STARTED_N: Mutex<u64> = Mutex::new(0);
static STARTED_CHANGED: Condvar = Condvar::new();

/// Counts a new child, starting the reaper thread with the first.
fn count_child() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(reaper)
            .expect("start the reaper thread");
    });
    *STARTED_N.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    STARTED_CHANGED.notify_one();
}

/// Reaps every child as it exits (a blocking `waitpid(-1)`, so no signal handling) and hands
/// each status to its waiter.
fn reaper() {
    // The count of started children up to which waitpid found none left.
    let mut drained = 0;
    loop {
        let started = {
            let mut n = STARTED_N.lock().unwrap_or_else(|p| p.into_inner());
            while *n == drained {
                n = STARTED_CHANGED.wait(n).unwrap_or_else(|p| p.into_inner());
            }
            *n
        };
        let mut status: c_int = 0;
        // SAFETY: waitpid(2) with a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid <= 0 {
            if errno() != libc::EINTR {
                // No children at all: sleep until one is started after `started`.
                drained = started;
            }
            continue;
        }
        let mut slots = slots();
        match slots.remove(&pid) {
            Some(Slot::Waiting(tx)) => {
                let _ = tx.send(status);
            }
            Some(Slot::Abandoned) => {}
            Some(Slot::Exited(_)) | None => {
                slots.insert(pid, Slot::Exited(status));
            }
        }
    }
}

/// The descriptor every child without stdin reads: `/dev/null`, opened once.
fn dev_null() -> io::Result<RawFd> {
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_raw_fd());
    }
    let f = std::fs::File::open("/dev/null")?;
    Ok(NULL.get_or_init(|| f.into()).as_raw_fd())
}

/// The size of an exec's stdout pipe.
const OUTPUT_PIPE_BYTES: libc::c_int = 256 << 10;

/// A pipe whose `parent` end is non-blocking (for tokio) and whose `child` end is not; both
/// close on exec.
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2(2) with a valid array of two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just made and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl(2) on a descriptor we own. A pipe end's only status flag is its access
    // mode, which F_SETFL ignores.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The agent's environment with `overrides` applied, as `K=V` strings.
fn environment(overrides: &[(OsString, OsString)]) -> io::Result<Vec<CString>> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in overrides {
        match vars.iter_mut().find(|(name, _)| name == k) {
            Some(slot) => slot.1 = v.clone(),
            None => vars.push((k.clone(), v.clone())),
        }
    }
    vars.into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        })
        .collect()
}

/// Where to look for `program`: itself if it names a path, else each `PATH` entry.
fn candidates(program: &OsStr, overrides: &[(OsString, OsString)]) -> io::Result<Vec<CString>> {
    if program.as_bytes().contains(&b'/') {
        return Ok(vec![cstring(program)?]);
    }
    let path = overrides
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    path.as_bytes()
        .split(|&b| b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() { &b"."[..] } else { dir };
            let mut p = dir.to_vec();
            p.push(b'/');
            p.extend_from_slice(program.as_bytes());
            CString::new(p).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        })
        .collect()
}

/// What the child needs, all prepared by the parent (the child must not allocate).
struct ChildArgs {
    argv: *const *const c_char,
    envp: *const *const c_char,
    paths: *const *const c_char,
    npaths: usize,
    cwd: *const c_char,
    /// Descriptors to become 0, 1 and 2.
    stdio: [c_int; 3],
    /// They are a terminal: lead a new session with it as the controlling terminal.
    tty: bool,
    /// Set by the child: the errno of what failed, and where (1 = chdir, 2 = exec, 3 = setup).
    errno: AtomicI32,
    stage: AtomicI32,
}

const STAGE_CWD: i32 = 1;
const STAGE_EXEC: i32 = 2;
const STAGE_SETUP: i32 = 3;

/// The child's stack: the parent is suspended until the child execs or exits (CLONE_VFORK),
/// and spawns are serialised by this lock, so one stack serves every spawn.
static STACK: Mutex<Option<Box<[u128]>>> = Mutex::new(None);
const STACK_WORDS: usize = 64 * 1024 / 16;

fn errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The child, on its own stack, in the parent's memory. Only async-signal-safe calls.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's ChildArgs, alive while the parent is suspended.
    let a = unsafe { &*(arg as *const ChildArgs) };
    let fail = |stage: i32, e: c_int| -> c_int {
        a.errno.store(e, Ordering::Relaxed);
        a.stage.store(stage, Ordering::Relaxed);
        // SAFETY: _exit(2) ends only this child.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: plain system calls on values the parent prepared.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in [libc::SIGPIPE, libc::SIGCHLD] {
            if libc::sigaction(sig, &dfl, std::ptr::null_mut()) != 0 {
                return fail(STAGE_SETUP, errno());
            }
        }
        let own = if a.tty {
            libc::setsid()
        } else {
            libc::setpgid(0, 0)
        };
        if own < 0 {
            return fail(STAGE_SETUP, errno());
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            let target = target as c_int;
            let r = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if r < 0 {
                return fail(STAGE_SETUP, errno());
            }
        }
        if a.tty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
            return fail(STAGE_SETUP, errno());
        }
        if !a.cwd.is_null() && libc::chdir(a.cwd) != 0 {
            return fail(STAGE_CWD, errno());
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let mut denied = false;
        for i in 0..a.npaths {
            libc::execve(*a.paths.add(i), a.argv, a.envp);
            match errno() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => denied = true,
                e => return fail(STAGE_EXEC, e),
            }
        }
        fail(STAGE_EXEC, if denied { libc::EACCES } else { libc::ENOENT })
    }
}

fn null_terminated(v: &[CString]) -> Vec<*const c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Starts `spec` in its own process group, with piped stdout and stderr. Must run on a tokio
/// runtime (the pipes are registered with it).
pub fn spawn(spec: &Spec) -> Result<Child, SpawnError> {
    let exec = SpawnError::Exec;
    let program = spec
        .argv
        .first()
        .ok_or_else(|| exec(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| cstring(a))
        .collect::<io::Result<_>>()
        .map_err(exec)?;
    let envp = environment(&spec.env).map_err(exec)?;
    let paths = candidates(program, &spec.env).map_err(exec)?;
    let cwd = spec.cwd.as_deref().map(cstring).transpose().map_err(exec)?;
    let io = if let Some((rows, cols)) = spec.tty {
        let (master, slave) = open_pty(rows, cols).map_err(exec)?;
        Io::Tty { master, slave }
    } else {
        let (out_r, out_w) = pipe_pair().map_err(exec)?;
        let (err_r, err_w) = pipe_pair().map_err(exec)?;
        // Room for a few output chunks, so that the process rarely waits on its pipe while
        // the agent forwards the previous chunk (best effort: the default size works too).
        // SAFETY: fcntl(2) on a descriptor we own.
        unsafe { libc::fcntl(out_r.as_raw_fd(), libc::F_SETPIPE_SZ, OUTPUT_PIPE_BYTES) };
        let stdin = if spec.stdin {
            let (r, w) = pipe_pair().map_err(exec)?;
            // Room for a whole stdin frame, so that the agent writes it in one call.
            // SAFETY: fcntl(2) on a descriptor we own (best effort).
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, OUTPUT_PIPE_BYTES) };
            Some((r, w))
        } else {
            None
        };
        Io::Pipes {
            out: (out_r, out_w),
            err: (err_r, err_w),
            stdin,
        }
    };
    let stdio = match &io {
        Io::Tty { slave, .. } => [slave.as_raw_fd(); 3],
        Io::Pipes { out, err, stdin } => [
            match stdin {
                Some((r, _)) => r.as_raw_fd(),
                None => dev_null().map_err(exec)?,
            },
            out.1.as_raw_fd(),
            err.1.as_raw_fd(),
        ],
    };
    let (argv_p, envp_p, paths_p) = (
        null_terminated(&argv),
        null_terminated(&envp),
        null_terminated(&paths),
    );
    let args = ChildArgs {
        argv: argv_p.as_ptr(),
        envp: envp_p.as_ptr(),
        paths: paths_p.as_ptr(),
        npaths: paths.len(),
        cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        stdio,
        tty: spec.tty.is_some(),
        errno: AtomicI32::new(0),
        stage: AtomicI32::new(0),
    };
    let pid = {
        let mut stack = STACK.lock().unwrap_or_else(|p| p.into_inner());
        let stack = stack.get_or_insert_with(|| vec![0u128; STACK_WORDS].into_boxed_slice());
        // SAFETY: the top of a 16-byte aligned buffer we hold the lock on; the stack grows down.
        let top = unsafe { stack.as_mut_ptr().add(stack.len()) } as *mut c_void;
        // SAFETY: signals are blocked around the clone so that no handler of the agent runs
        // on the child's stack in the parent's memory; the child restores an empty mask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::clone(
                child_main,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                &args as *const ChildArgs as *mut c_void,
            );
            let e = errno();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if pid < 0 {
                return Err(exec(io::Error::from_raw_os_error(e)));
            }
            pid
        }
    };
    // The child has exec'd or exited: its ends are its own now.
    let io = io.parent_ends();
    count_child();
    let stage = args.stage.load(Ordering::Relaxed);
    if stage != 0 {
        // It exited with 127 before exec: the reaper collects it.
        let mut slots = slots();
        if !matches!(slots.remove(&pid), Some(Slot::Exited(_))) {
            slots.insert(pid, Slot::Abandoned);
        }
        let e = io::Error::from_raw_os_error(args.errno.load(Ordering::Relaxed));
        return Err(if stage == STAGE_CWD {
            SpawnError::Cwd(e)
        } else {
            exec(e)
        });
    }
    let (tx, rx) = oneshot::channel();
    {
        let mut slots = slots();
        match slots.remove(&pid) {
            Some(Slot::Exited(status)) => {
                let _ = tx.send(status);
            }
            _ => {
                slots.insert(pid, Slot::Waiting(tx));
            }
        }
    }
    let child = Child {
        pid,
        stdin: None,
        stdout: None,
        stderr: None,
        pty: None,
        exit: Some(rx),
    };
    finish(child, io).map_err(exec)
}

/// A child's stdio while it is being started: both ends of its pipes, or of its terminal.
enum Io {
    Pipes {
        out: (OwnedFd, OwnedFd),
        err: (OwnedFd, OwnedFd),
        stdin: Option<(OwnedFd, OwnedFd)>,
    },
    Tty {
        master: OwnedFd,
        slave: OwnedFd,
    },
}

/// The parent's ends once the child has its own: stdout, stderr, stdin, or the master.
enum ParentIo {
    Pipes(OwnedFd, OwnedFd, Option<OwnedFd>),
    Tty(OwnedFd),
}

impl Io {
    fn parent_ends(self) -> ParentIo {
        match self {
            Io::Pipes { out, err, stdin } => ParentIo::Pipes(out.0, err.0, stdin.map(|(_, w)| w)),
            Io::Tty { master, .. } => ParentIo::Tty(master),
        }
    }
}

/// Puts the parent's ends on the runtime.
fn finish(mut child: Child, io: ParentIo) -> io::Result<Child> {
    match io {
        ParentIo::Pipes(out, err, stdin) => {
            set_nonblocking(&out)?;
            set_nonblocking(&err)?;
            child.stdout = Some(pipe::Receiver::from_owned_fd_unchecked(out)?);
            child.stderr = Some(pipe::Receiver::from_owned_fd_unchecked(err)?);
            if let Some(w) = stdin {
                set_nonblocking(&w)?;
                child.stdin = Some(pipe::Sender::from_owned_fd_unchecked(w)?);
            }
        }
        ParentIo::Tty(master) => {
            // SAFETY: an OwnedFd's descriptor stays open and the same until it is dropped.
            let fd = unsafe { AsyncFd::register(master) }.map_err(|e| e.into_parts().1)?;
            child.pty = Some(Arc::new(Pty {
                fd,
                session: child.pid,
            }));
        }
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn output(mut c: Child) -> (ExitStatus, String, String) {
        let (mut o, mut e) = (String::new(), String::new());
        let mut out = c.stdout.take().unwrap();
        let mut err = c.stderr.take().unwrap();
        let (r1, r2, status) = tokio::join!(
            out.read_to_string(&mut o),
            err.read_to_string(&mut e),
            c.wait()
        );
        r1.unwrap();
        r2.unwrap();
        (status.unwrap(), o, e)
    }

    fn sh(script: &str) -> Spec {
        Spec::new(["sh", "-c", script])
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_child_gets_its_argv_env_cwd_stdio_and_a_clean_signal_state() {
        // As in the agent (Rust's runtime does it for every program).
        // SAFETY: signal(2) with SIG_IGN.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("pwd; echo \"$A $PATH_SEEN\"; echo oops >&2; \
             grep -E '^Sig(Blk|Ign)' /proc/self/status; \
             echo pgid=$(cut -d' ' -f5 /proc/self/stat) pid=$$; exit 3");
        spec.env = vec![
            ("A".into(), "one two".into()),
            ("PATH_SEEN".into(), "x".into()),
        ];
        spec.cwd = Some(dir.path().into());
        let c = spawn(&spec).map_err(|e| format!("{e:?}")).unwrap();
        let pid = c.id();
        let (status, out, err) = output(c).await;
        assert_eq!(status.code(), Some(3));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            std::fs::canonicalize(dir.path()).unwrap().to_str().unwrap()
        );
        assert_eq!(lines[1], "one two x");
        // The signal state std's Command gives a child: no mask, and what this process
        // ignores (a CI shell's background job ignores SIGINT and SIGQUIT, say) minus SIGPIPE,
        // which goes back to its default. Read from this process, not from a std child: the
        // reaper's waitpid(-1) may take any child of the process.
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        let own_ignored = own
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:\t"))
            .unwrap()
            .to_string();
        assert_eq!(lines[2], "SigBlk:\t0000000000000000");
        // glibc's own signals (32, 33) aside, which its posix_spawn sets to SIG_IGN.
        let ignored = |l: &str| {
            u64::from_str_radix(l.trim_start_matches("SigIgn:\t"), 16).unwrap() & 0xffff_ffff
        };
        let want = ignored(&own_ignored) & !(1 << (libc::SIGPIPE - 1));
        assert_eq!(ignored(lines[3]), want);
        assert_eq!(
            ignored(lines[3]) & (1 << (libc::SIGPIPE - 1)),
            0,
            "SIGPIPE ignored"
        );
        assert_eq!(lines[4], format!("pgid={pid} pid={pid}"));
        assert_eq!(err, "oops\n");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn failures_say_which_step_failed() {
        match spawn(&Spec::new(["no-such-program-here"])) {
            Err(SpawnError::Exec(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        let mut spec = Spec::new(["true"]);
        spec.cwd = Some("/no/such/dir".into());
        match spawn(&spec) {
            Err(SpawnError::Cwd(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "echo hi\n").unwrap();
        match spawn(&Spec::new([&script])) {
            Err(SpawnError::Exec(e)) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied),
            other => panic!("{other:?}"),
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        match spawn(&Spec::new([&script])) {
            Err(SpawnError::Exec(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOEXEC)),
            other => panic!("{other:?}"),
        }
        // PATH from the overrides is the one searched.
        let mut spec = Spec::new(["script"]);
        spec.env = vec![("PATH".into(), dir.path().into())];
        match spawn(&spec) {
            Err(SpawnError::Exec(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOEXEC)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn stdin_is_piped_and_many_children_are_each_reaped_with_their_status() {
        let mut spec = Spec::new(["cat"]);
        spec.stdin = true;
        let mut c = spawn(&spec).map_err(|e| format!("{e:?}")).unwrap();
        let mut w = c.stdin.take().unwrap();
        w.write_all(b"through stdin").await.unwrap();
        drop(w);
        let (status, out, _) = output(c).await;
        assert!(status.success());
        assert_eq!(out, "through stdin");

        let children: Vec<Child> = (0..40)
            .map(|i| {
                spawn(&sh(&format!("exit {i}")))
                    .map_err(|e| format!("{e:?}"))
                    .unwrap()
            })
            .collect();
        let mut codes = Vec::new();
        for c in children {
            codes.push(output(c).await.0.code().unwrap());
        }
        assert_eq!(codes, (0..40).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_tty_child_leads_a_session_on_its_terminal_which_resizes_and_hangs_up_at_the_end() {
        let mut spec = sh("stty size; [ -t 0 ] && [ -t 2 ] && echo tty; \
             [ \"$(cut -d' ' -f6 /proc/self/stat)\" = \"$(cut -d' ' -f5 /proc/self/stat)\" ] && echo leader; \
             read line; echo \"got $line\"; trap 'stty size' WINCH; \
             read again; echo done");
        spec.tty = Some((30, 100));
        let mut c = spawn(&spec).map_err(|e| format!("{e:?}")).unwrap();
        assert!(c.stdout.is_none() && c.stderr.is_none() && c.stdin.is_none());
        let pty = c.pty.take().unwrap();
        let mut r = pty.reader();
        let mut w = pty.writer();
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        async fn until(r: &mut PtyIo, seen: &mut String, want: &str) {
            let mut buf = [0u8; 4096];
            while !seen.contains(want) {
                let n = tokio::time::timeout(Duration::from_secs(5), r.read(&mut buf))
                    .await
                    .expect("output in time")
                    .unwrap();
                assert!(n > 0, "ended before {want:?}: {seen:?}");
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
        until(&mut r, &mut seen, "leader\r\n").await;
        assert!(seen.starts_with("30 100\r\ntty\r\n"), "{seen:?}");
        // Typed input is echoed by the line discipline, then read by the process.
        w.write_all(b"hello\n").await.unwrap();
        until(&mut r, &mut seen, "got hello\r\n").await;
        assert!(seen.contains("hello\r\ngot hello"), "{seen:?}");
        // The trap is set once `got` is out; a resize reaches it as SIGWINCH.
        tokio::time::sleep(Duration::from_millis(100)).await;
        pty.resize(40, 120).unwrap();
        until(&mut r, &mut seen, "40 120\r\n").await;
        w.write_all(b"x\n").await.unwrap();
        until(&mut r, &mut seen, "done\r\n").await;
        assert!(c.wait().await.unwrap().success());
        // Every holder of the terminal is gone: the master reads its end.
        // The line discipline may still hand over an echo it committed late
        // (`x\r\n` after `done`), so drain to the end rather than expect it next.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let n = tokio::time::timeout_at(deadline, r.read(&mut buf))
                .await
                .expect("the terminal ends in time")
                .unwrap();
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            assert!(seen.len() < 4096, "output goes on after the end: {seen:?}");
        }
        assert!(seen.contains("x\r\n"), "{seen:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_child_is_killed_and_reaped() {
        let c = spawn(&Spec::new(["sleep", "30"]))
            .map_err(|e| format!("{e:?}"))
            .unwrap();
        let pid = c.id();
        drop(c);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // Gone from the process table once the reaper has collected it.
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(std::time::Instant::now() < deadline, "{pid} still there");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!slots().contains_key(&pid));
    }
}
