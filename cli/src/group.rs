//! The command's process group: every process the command starts is
//! signalled with it, reaped, and killed if `mongo-lease` dies.
//!
//! The command is spawned as the leader of a new process group, and every
//! signal `mongo-lease` sends (a forwarded SIGTERM or SIGINT, the SIGTERM
//! and SIGKILL of a lost lease) goes to the whole group, so a wrapper (`sh
//! -c`, a script, `make`, `npm run`) and what it started get it alike.
//! `mongo-lease` is a child subreaper (Linux): a process of the group whose
//! parent exits is re-parented to it rather than to init, so it can be
//! reaped here, and the group is known to be gone when no process is left
//! in it. If `mongo-lease` itself dies, even by SIGKILL, a watchdog (a
//! forked process in a group of its own, blocked on a pipe whose only
//! writer is `mongo-lease`) sees the pipe close and kills the group with
//! SIGKILL. The watchdog is forked before the command, and the command's
//! leader writes its pid (the group's id) to it between fork and exec, so
//! no code of the command runs before the watchdog can kill its group.
//!
//! What escapes: a process that leaves the group (`setsid`, `setpgid`, as
//! daemons do when they double-fork) is neither signalled nor waited for.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

/// How often the group is looked at while waiting for it to end, besides
/// each SIGCHLD: a process whose parent is neither in the group nor
/// `mongo-lease` tells nobody here when it exits.
const RECHECK: Duration = Duration::from_millis(50);

/// A command running as the leader of its own process group.
pub struct Group {
    /// The leader's pid, which is also the group's id.
    pid: libc::pid_t,
    /// The leader's exit status, once reaped.
    status: Option<ExitStatus>,
    /// SIGCHLD, listened to before the command was spawned.
    children: Signal,
    /// Kills the group if this process dies; `None` once the group ended.
    watchdog: Option<Watchdog>,
}

impl Group {
    /// Spawns `cmd` as the leader of a new process group, with a watchdog.
    ///
    /// # Errors
    ///
    /// Those of [`Command::spawn`], and the failure to listen for SIGCHLD or
    /// to start the watchdog (then the command is killed).
    pub fn spawn(mut cmd: Command) -> io::Result<Group> {
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(2) with integer arguments.
        unsafe {
            // Idempotent: the orphans of each command are re-parented here.
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        }
        let children = signal(SignalKind::child())?;
        let watchdog = Watchdog::start()?;
        let announce = watchdog.pipe.as_raw_fd();
        cmd.process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // The leader of its own group (again: idempotent), which
                // the watchdog learns before the command runs.
                libc::setpgid(0, 0);
                let pid = libc::getpid().to_ne_bytes();
                if libc::write(announce, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                    return Err(io::Error::last_os_error());
                }
                // The leader dies with this process too (the main thread:
                // the runtime is single-threaded).
                #[cfg(target_os = "linux")]
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // A failed spawn drops the watchdog: it reads the end of the pipe
        // before any pid, and exits without killing anything.
        let child = cmd.spawn()?;
        Ok(Group {
            pid: child.id() as libc::pid_t,
            status: None,
            children,
            watchdog: Some(watchdog),
        })
    }

    /// Sends `signal` to every process of the group.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(-self.pid, signal);
        }
    }

    /// Waits for the leader (the command itself) to exit; its status.
    pub async fn leader_exit(&mut self) -> ExitStatus {
        loop {
            self.reap();
            if let Some(status) = self.status {
                return status;
            }
            // The leader is a child of this process: its exit sends SIGCHLD.
            if self.children.recv().await.is_none() {
                tokio::time::sleep(RECHECK).await;
            }
        }
    }

    /// Ends whatever is left of the group: SIGTERM (and SIGCONT, for a
    /// stopped process to act on it), SIGKILL `grace` later if a process
    /// is left; returns once none is, and `false` if SIGKILL was needed.
    pub async fn end(&mut self, grace: Duration) -> bool {
        let graceful = self.is_empty() || {
            self.signal(libc::SIGTERM);
            self.signal(libc::SIGCONT);
            self.wait_empty(Some(Instant::now() + grace)).await
        };
        if !graceful {
            self.signal(libc::SIGKILL);
            self.wait_empty(None).await;
        }
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop();
        }
        graceful
    }

    /// Waits until no process is left in the group, or until `deadline`;
    /// `true` if none is.
    async fn wait_empty(&mut self, deadline: Option<Instant>) -> bool {
        loop {
            if self.is_empty() {
                return true;
            }
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = self.children.recv() => {}
                _ = tokio::time::sleep(RECHECK) => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => return self.is_empty(),
            }
        }
    }

    /// `true` once no process is left in the group (zombies of this process
    /// are reaped first: they still count as members).
    fn is_empty(&mut self) -> bool {
        self.reap();
        // SAFETY: kill(2) with signal 0 only checks that a target exists.
        let found = unsafe { libc::kill(-self.pid, 0) } == 0;
        !found && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }

    /// Reaps every exited child of this process: the leader (its status is
    /// kept), orphans re-parented here, a stopped watchdog. The only
    /// children of `mongo-lease` are its command and these.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid(2) writes the status into a local.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == self.pid {
                self.status = Some(ExitStatus::from_raw(status));
            }
        }
    }
}

impl Drop for Group {
    /// A group dropped before it ended (its future cancelled) is killed.
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            self.signal(libc::SIGKILL);
            watchdog.stop();
        }
    }
}

/// A forked process that kills the group with SIGKILL once `mongo-lease`
/// is gone, unless told first that the group ended.
struct Watchdog {
    /// The pipe's write end; the watchdog reads the other one. Its last
    /// copy closes when this process dies, however it dies.
    pipe: OwnedFd,
}

impl Watchdog {
    fn start() -> io::Result<Watchdog> {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) and fcntl(2) on the descriptors just made; the
        // child of fork(2) runs only async-signal-safe calls (`watch`).
        unsafe {
            if libc::pipe(fds.as_mut_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let (read, write) = (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]));
            // Not inherited by the commands spawned later (it would keep
            // the pipe open after this process died).
            for fd in [&read, &write] {
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC);
            }
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => watch(read.as_raw_fd()),
                _ => Ok(Watchdog { pipe: write }),
            }
        }
    }

    /// Tells the watchdog the group ended: it exits without killing (and is
    /// reaped with the other children).
    fn stop(self) {
        // SAFETY: write(2) of one byte from a local.
        unsafe {
            libc::write(self.pipe.as_raw_fd(), [0u8].as_ptr().cast(), 1);
        }
    }
}

/// The watchdog's life, in the forked child: async-signal-safe calls only.
/// In a group of its own (a signal to the group of `mongo-lease`, such as a
/// shell's `kill -9 %1`, does not reach it) and deaf to the signals that
/// end processes politely, it reads the group's id from the pipe (written
/// by the command's leader before exec; the end of the pipe before it: the
/// command never started), then waits on the pipe: a byte means the group
/// ended; end of file means every writer is gone, `mongo-lease` died, and
/// the group gets SIGKILL.
unsafe fn watch(read: libc::c_int) -> ! {
    // SAFETY: async-signal-safe system calls on integers and a local byte.
    unsafe {
        libc::setpgid(0, 0);
        for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // Keep the read end alone, as descriptor 0: the copy of the write
        // end inherited here must go (or the pipe never reaches its end of
        // file), and so must the sockets and pipes of `mongo-lease`.
        libc::dup2(read, 0);
        close_from(1);
        let mut pid = [0u8; size_of::<libc::pid_t>()];
        let mut got = 0;
        while got < pid.len() {
            match libc::read(0, pid[got..].as_mut_ptr().cast(), pid.len() - got) {
                0 => libc::_exit(0),
                n if n > 0 => got += n as usize,
                _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                _ => libc::_exit(1),
            }
        }
        let group = libc::pid_t::from_ne_bytes(pid);
        let mut byte = 0u8;
        loop {
            match libc::read(0, (&raw mut byte).cast(), 1) {
                0 => {
                    libc::kill(-group, libc::SIGKILL);
                    libc::_exit(0);
                }
                1 => libc::_exit(0),
                _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                _ => libc::_exit(1),
            }
        }
    }
}

/// Closes every descriptor from `first` on (async-signal-safe).
unsafe fn close_from(first: libc::c_int) {
    // SAFETY: close_range(2) and close(2) on integers.
    unsafe {
        #[cfg(target_os = "linux")]
        if libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        ) == 0
        {
            return;
        }
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let last = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(65_536) as libc::c_int
        } else {
            1024
        };
        for fd in first..last {
            libc::close(fd);
        }
    }
}
