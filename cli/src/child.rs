//! Running the command under a lease: environment, signal forwarding, and
//! termination when the lease is lost (of the command's whole process
//! group, `group.rs`).

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::SelectAll;
use mongo_lease::LeaseKind;
use tokio::sync::watch;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::group::Group;
use crate::output::kind_name;
use crate::{Failure, exit};

/// How the command ended.
pub enum ChildOutcome {
    /// It exited on its own with this code (128+N if killed by signal N).
    Exited(u8),
    /// The lease was lost: its process group was terminated (SIGTERM, then
    /// SIGKILL).
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

/// The lease the command runs under, as its environment tells it.
pub struct LeaseEnv<'a> {
    /// `MONGO_LEASE_KEY`: the key as a string (a non-string key as
    /// canonical Extended JSON).
    pub key: &'a str,
    /// `MONGO_LEASE_TOKEN`: the fencing token (an election's term); one
    /// per key, one per line, for several keys.
    pub tokens: &'a [u64],
    /// `MONGO_LEASE_OWNER`: the owner id of this process's leases.
    pub owner_id: &'a str,
    /// `MONGO_LEASE_KIND` (`exclusive`, `shared` or `permit`), and
    /// `MONGO_LEASE_PERMITS` for a permit.
    pub kind: LeaseKind,
}

impl LeaseEnv<'_> {
    fn apply(&self, cmd: &mut std::process::Command) {
        cmd.env("MONGO_LEASE_KEY", self.key)
            .env("MONGO_LEASE_TOKEN", lines(self.tokens))
            .env("MONGO_LEASE_OWNER", self.owner_id)
            .env("MONGO_LEASE_KIND", kind_name(self.kind))
            // Not inherited from an outer mongo-lease's command.
            .env_remove("MONGO_LEASE_PERMITS");
        if let LeaseKind::Permit { permits } = self.kind {
            cmd.env("MONGO_LEASE_PERMITS", permits.to_string());
        }
    }
}

/// `values`, one per line.
fn lines(values: &[u64]) -> String {
    let lines: Vec<String> = values.iter().map(u64::to_string).collect();
    lines.join("\n")
}

/// The events of the leases held (several keys: one lease each), merged,
/// and the signal that a request to release any of them
/// (`LeaseEvent::RevocationRequested`) sends to the command's group
/// (`exec --on-revocation`).
pub type OnRevocation = Option<(SelectAll<mongo_lease::LeaseEvents>, i32)>;

/// The signal of the next request to release a lease held, from `revocation`;
/// never without one.
async fn next_revocation(revocation: &mut OnRevocation) -> i32 {
    if let Some((events, signal)) = revocation {
        while let Some(event) = events.next().await {
            if let mongo_lease::LeaseEvent::RevocationRequested { by } = event {
                tracing::info!(
                    by,
                    signal = *signal,
                    "release requested: signalling the command"
                );
                return *signal;
            }
        }
    }
    std::future::pending().await
}

/// Holds the lease, with no command (`lock`, `elect`), until SIGTERM or
/// SIGINT (also one received since `signals` started listening) or a
/// request to release it (`revocation`, as the signal it would send a
/// command), which end it with exit code 0, or until `lost` completes.
pub async fn hold(
    lost: WaitForCancellationFutureOwned,
    signals: &Signals,
    mut revocation: OnRevocation,
) -> ChildOutcome {
    // A clone of the receiver that has marked nothing seen: any signal
    // since `Signals::listen` counts, also one that came in while the
    // key and token were printed.
    let mut received = signals.received.clone();
    let signal = async {
        if received.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = lost => ChildOutcome::Lost,
        () = signal => ChildOutcome::Exited(0),
        _ = next_revocation(&mut revocation) => ChildOutcome::Exited(0),
    }
}

/// Runs `command` with the lease in its environment, in a process group of
/// its own (see `group.rs`), until it exits, or until `lost` (the lease's or
/// leadership's `lost()` future) completes: then the group gets SIGTERM,
/// and SIGKILL after `grace`. Forwards SIGTERM and SIGINT to the group, and
/// `revocation`'s signal on each request to release the lease.
/// Whatever the command leaves running in its group when it exits ends the
/// same way, before this returns (and so before the lease is released).
pub async fn run(
    command: &[String],
    lease: &LeaseEnv<'_>,
    lost: WaitForCancellationFutureOwned,
    grace: Duration,
    signals: &Signals,
    mut revocation: OnRevocation,
) -> ChildOutcome {
    let (key, token) = (lease.key, lines(lease.tokens));
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    lease.apply(&mut cmd);
    let mut group = match Group::spawn(cmd) {
        Ok(group) => group,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            return ChildOutcome::SpawnFailed(code, format!("cannot run {:?}: {e}", command[0]));
        }
    };
    let mut lost = std::pin::pin!(lost);
    let exited = loop {
        tokio::select! {
            status = group.leader_exit() => break Some(status),
            _ = &mut lost => break None,
            signal = signals.next() => {
                group.signal(signal);
                // A stopped process (SIGTTIN: it read the terminal from
                // its background group) acts on the signal once continued.
                group.signal(libc::SIGCONT);
            }
            signal = next_revocation(&mut revocation) => {
                group.signal(signal);
                group.signal(libc::SIGCONT);
            }
        }
    };
    if exited.is_none() {
        tracing::warn!(key, %token, "lease lost: terminating the command");
    }
    if !group.end(grace).await {
        tracing::warn!(
            key,
            ?grace,
            "the command did not exit after SIGTERM: SIGKILL"
        );
    }
    match exited {
        Some(status) => ChildOutcome::Exited(exit_code(status)),
        None => ChildOutcome::Lost,
    }
}
