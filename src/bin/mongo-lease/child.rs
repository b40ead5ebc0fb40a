//! Running the command under a lease: environment, signal forwarding, and
//! termination when the lease is lost.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use mongo_lease::LeaseKind;
use tokio::sync::watch;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::output::kind_name;
use crate::{Failure, exit};

/// How the command ended.
pub enum ChildOutcome {
    /// It exited on its own with this code (128+N if killed by signal N).
    Exited(u8),
    /// The lease was lost: it was terminated (SIGTERM, then SIGKILL).
    Lost,
    /// It could not be started: exit code and message.
    SpawnFailed(u8, String),
}

/// SIGTERM and SIGINT received by this process, as `(count, signal)`.
pub struct Signals {
    received: watch::Receiver<(u64, i32)>,
}

impl Signals {
    /// Starts listening (the default action, exiting, is replaced).
    pub fn listen() -> Result<Signals, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        let failure = |e: io::Error| Failure {
            code: exit::UNAVAILABLE,
            message: format!("cannot listen for signals: {e}"),
        };
        let mut term = signal(SignalKind::terminate()).map_err(failure)?;
        let mut int = signal(SignalKind::interrupt()).map_err(failure)?;
        let (tx, received) = watch::channel((0, 0));
        tokio::spawn(async move {
            loop {
                let signal = tokio::select! {
                    Some(()) = term.recv() => libc::SIGTERM,
                    Some(()) = int.recv() => libc::SIGINT,
                    else => return,
                };
                tx.send_modify(|(count, last)| {
                    *count += 1;
                    *last = signal;
                });
            }
        });
        Ok(Signals { received })
    }

    /// The next signal received after this call.
    pub async fn next(&self) -> i32 {
        let mut received = self.received.clone();
        received.borrow_and_update();
        match received.changed().await {
            Ok(()) => received.borrow().1,
            Err(_) => std::future::pending().await,
        }
    }

    /// The last signal received, if any.
    pub fn received(&self) -> Option<i32> {
        let (count, signal) = *self.received.borrow();
        (count > 0).then_some(signal)
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        (None, None) => 1,
    }
}

fn kill(pid: Option<u32>, signal: i32) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    }
}

/// The lease the command runs under, as its environment tells it.
pub struct LeaseEnv<'a> {
    /// `MONGO_LEASE_KEY`: the key as a string (a non-string key as
    /// canonical Extended JSON).
    pub key: &'a str,
    /// `MONGO_LEASE_TOKEN`: the fencing token (an election's term).
    pub token: u64,
    /// `MONGO_LEASE_OWNER`: the owner id of this process's leases.
    pub owner_id: &'a str,
    /// `MONGO_LEASE_KIND` (`exclusive`, `shared` or `permit`), and
    /// `MONGO_LEASE_PERMITS` for a permit.
    pub kind: LeaseKind,
}

impl LeaseEnv<'_> {
    fn apply(&self, cmd: &mut tokio::process::Command) {
        cmd.env("MONGO_LEASE_KEY", self.key)
            .env("MONGO_LEASE_TOKEN", self.token.to_string())
            .env("MONGO_LEASE_OWNER", self.owner_id)
            .env("MONGO_LEASE_KIND", kind_name(self.kind))
            // Not inherited from an outer mongo-lease's command.
            .env_remove("MONGO_LEASE_PERMITS");
        if let LeaseKind::Permit { permits } = self.kind {
            cmd.env("MONGO_LEASE_PERMITS", permits.to_string());
        }
    }
}

/// Runs `command` with the lease in its environment until it exits, or until
/// `lost` (the lease's or leadership's `lost()` future) completes: then
/// SIGTERM, and SIGKILL after `grace`. Forwards SIGTERM and SIGINT.
pub async fn run(
    command: &[String],
    lease: &LeaseEnv<'_>,
    lost: WaitForCancellationFutureOwned,
    grace: Duration,
    signals: &Signals,
) -> ChildOutcome {
    let (key, token) = (lease.key, lease.token);
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    lease.apply(&mut cmd);
    #[cfg(target_os = "linux")]
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // If mongo-lease dies (even by SIGKILL), its lease expires and
            // someone else may take over: the command must not outlive it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            return ChildOutcome::SpawnFailed(code, format!("cannot run {:?}: {e}", command[0]));
        }
    };
    let pid = child.id();
    let mut lost = std::pin::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(status) => ChildOutcome::Exited(exit_code(status)),
                    Err(e) => ChildOutcome::SpawnFailed(exit::CANNOT_EXECUTE, format!("waiting for the command: {e}")),
                };
            }
            _ = &mut lost => break,
            signal = signals.next() => kill(pid, signal),
        }
    }
    tracing::warn!(key, token, "lease lost: terminating the command");
    kill(pid, libc::SIGTERM);
    tokio::select! {
        _ = child.wait() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(key, ?grace, "the command did not exit after SIGTERM: SIGKILL");
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
    ChildOutcome::Lost
}
