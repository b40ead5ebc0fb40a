//! Faults on a running [`ReplicaSet`]: kill, stop and restart members,
//! find the primary, step it down; each operation that needs a target
//! waits for it within a bound (see the [module docs](super)).

use std::process::Child;
use std::time::{Duration, Instant};

use mongodb::Client;
use mongodb::bson::doc;
use mongodb::error::ErrorKind;

#[cfg(doc)]
use super::ReplicaSetOptions;
use super::TestkitError;
use super::member::{ListenError, POLL, PORT_ATTEMPTS};
use super::probe::{MemberState, MemberStatus, Probe, describe, pick_primary, probe};
use super::replica_set::ReplicaSet;

impl ReplicaSet {
    /// Kills member `i` with `SIGKILL` (a crash: no clean shutdown) and
    /// waits until the process is gone, bounded by
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout). Its port and
    /// data directory are kept for [`restart`](Self::restart). Killing an
    /// already killed member is a no-op.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchMember`] if `i` is out of range;
    /// [`TestkitError::Io`] if the process cannot be waited for;
    /// [`TestkitError::Timeout`] if it has not exited in time (a process
    /// stuck in the kernel).
    pub async fn kill(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        if let Some(mut child) = member.take_child() {
            let _ = child.kill();
            if !self.exited(&mut child).await? {
                return Err(self.timeout(format!("member {i} to exit after SIGKILL")));
            }
            tracing::debug!(member = i, "killed mongod");
        }
        Ok(())
    }

    /// Stops member `i` cleanly (`SIGTERM`: a primary steps down first, data
    /// is flushed) and waits until the process has exited, bounded by
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout) (then it is
    /// killed). Its port and data directory are kept for
    /// [`restart`](Self::restart). Stopping a member that is not running is a
    /// no-op.
    ///
    /// This sends a signal rather than the `shutdown` command, so a primary
    /// without a caught-up secondary (or one that stops being primary
    /// meanwhile) still shuts down: it tries to step down for at most 1 s
    /// (`shutdownTimeoutMillisForSignaledShutdown`), then exits anyway.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchMember`] if `i` is out of range;
    /// [`TestkitError::Timeout`] if the process did not exit in time.
    pub async fn stop(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        let Some(mut child) = member.take_child() else {
            return Ok(());
        };
        #[cfg(unix)]
        // SAFETY: signalling our own, not yet reaped child.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            // A frozen member handles the signal once resumed.
            libc::kill(child.id() as libc::pid_t, libc::SIGCONT);
        }
        if !self.exited(&mut child).await? {
            let _ = child.kill();
            let _ = child.wait();
            return Err(self.timeout(format!("member {i} to shut down after SIGTERM")));
        }
        tracing::debug!(member = i, "stopped mongod");
        Ok(())
    }

    /// Waits until `child` has exited: `false` if it has not within
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout).
    async fn exited(&self, child: &mut Child) -> Result<bool, TestkitError> {
        let deadline = Instant::now() + self.opts.startup_timeout;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(true),
                Ok(None) if Instant::now() >= deadline => return Ok(false),
                Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => return Err(TestkitError::io("waiting for a mongod to exit", e)),
            }
        }
    }

    /// Restarts member `i` on the same port and data directory, killing it
    /// first (`SIGKILL`) if it is running, and waits (bounded by
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout)) until it
    /// reports itself as primary or secondary again (after recovering,
    /// rolling back or catching up, as the set requires).
    ///
    /// If another process is listening on the member's port (the port must
    /// stay the same: the replica set configuration names it), the start is
    /// retried after a pause, up to 5 times within the bound.
    ///
    /// # Errors
    ///
    /// [`TestkitError::PortConflict`] if the port stayed taken;
    /// [`TestkitError::MongodExited`] if `mongod` exits while starting;
    /// [`TestkitError::Timeout`] naming the member's last state if it is not
    /// primary or secondary in time.
    pub async fn restart(&self, i: usize) -> Result<(), TestkitError> {
        self.kill(i).await?;
        let member = self.member(i)?;
        let timeout = self.opts.startup_timeout;
        let deadline = Instant::now() + timeout;
        let mut attempts = 0;
        loop {
            attempts += 1;
            member
                .spawn(&self.mongod, &self.opts, self.key_file().as_deref())
                .await?;
            match member.wait_listening(deadline, timeout).await {
                Ok(()) => break,
                Err(ListenError::Other(e)) => return Err(e),
                Err(ListenError::AddrInUse) => {
                    // Reap the exited process before trying again.
                    let _ = self.kill(i).await;
                    let pause = POLL * (1 << attempts.min(4));
                    if attempts >= PORT_ATTEMPTS || Instant::now() + pause >= deadline {
                        return Err(TestkitError::PortConflict {
                            member: i,
                            attempts,
                        });
                    }
                    tracing::debug!(member = i, port = member.port(), "port taken, retrying");
                    tokio::time::sleep(pause).await;
                }
            }
        }
        let client = self.direct_client(i).await?;
        loop {
            if let Some(status) = member.exit_status() {
                return Err(member.exited_error(status));
            }
            let seen = probe(member, &client).await;
            if matches!(
                seen.status.state,
                MemberState::Primary | MemberState::Secondary { .. }
            ) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(format!(
                    "restarted member {i} to become PRIMARY or SECONDARY (last seen: {})",
                    seen.status
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Freezes member `i` with `SIGSTOP`: the process stays alive, keeps
    /// its connections open and answers nothing (a long GC or VM pause, a
    /// hung disk) until [`thaw`](Self::thaw) resumes it with `SIGCONT`. A
    /// frozen primary is replaced by an election after the election timeout
    /// (about 1 s with fast elections) and steps down once thawed; clients
    /// waiting on it see nothing until their own timeouts. Dropping the set
    /// kills frozen members as any other. Freezing a member that is not
    /// running is a no-op.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchMember`] if `i` is out of range.
    pub fn freeze(&self, i: usize) -> Result<(), TestkitError> {
        if self.member(i)?.set_frozen(true) {
            tracing::debug!(member = i, "froze mongod (SIGSTOP)");
        }
        Ok(())
    }

    /// Resumes member `i` after [`freeze`](Self::freeze) (`SIGCONT`). A
    /// no-op for a member that is not frozen or not running.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoSuchMember`] if `i` is out of range.
    pub fn thaw(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        if member.is_frozen() && member.set_frozen(false) {
            tracing::debug!(member = i, "thawed mongod (SIGCONT)");
        }
        Ok(())
    }

    /// One concurrent round of `hello` on every member, through `clients`
    /// (from [`direct_clients`](Self::direct_clients)).
    pub(super) async fn probe_all(&self, clients: &[Client]) -> Vec<Probe> {
        futures::future::join_all(self.members.iter().zip(clients).map(|(m, c)| probe(m, c))).await
    }

    /// What each member says about itself right now: one concurrent round
    /// of `hello`, through direct connections that bypass any proxy (a
    /// member that does not answer within about 2 s is
    /// [unreachable](MemberState::Unreachable)).
    ///
    /// # Errors
    ///
    /// [`TestkitError::Driver`] if a client cannot be created.
    pub async fn member_states(&self) -> Result<Vec<MemberStatus>, TestkitError> {
        let clients = self.direct_clients().await?;
        Ok(self
            .probe_all(&clients)
            .await
            .into_iter()
            .map(|p| p.status)
            .collect())
    }

    /// Index of the current writable primary among the running members,
    /// if any (one round of `hello`; if two members claim to be primary,
    /// the one elected last). Use
    /// [`wait_for_primary`](Self::wait_for_primary) to wait for one.
    ///
    /// `None` also when the direct clients of the members cannot be created
    /// (an error [`member_states`](Self::member_states) would report).
    pub async fn primary(&self) -> Option<usize> {
        let clients = self.direct_clients().await.ok()?;
        self.find_primary(&clients).await
    }

    /// One round of `hello` through `clients`: the primary, if any.
    pub(super) async fn find_primary(&self, clients: &[Client]) -> Option<usize> {
        pick_primary(&self.probe_all(clients).await)
    }

    /// Polls `hello` on the members every 50 ms until one of them is a
    /// writable primary and returns its index (if two members claim to be
    /// primary, the one elected last).
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoPrimary`] after `timeout`, with what each member
    /// said last.
    pub async fn wait_for_primary(&self, timeout: Duration) -> Result<usize, TestkitError> {
        let clients = self.direct_clients().await?;
        let (primary, _) = self
            .await_primary(&clients, "wait_for_primary", Instant::now(), timeout)
            .await?;
        Ok(primary)
    }

    /// Polls until a member is a writable primary, or `timeout` after
    /// `began`. Returns its index and the round of probes that found it.
    async fn await_primary(
        &self,
        clients: &[Client],
        what: &str,
        began: Instant,
        timeout: Duration,
    ) -> Result<(usize, Vec<Probe>), TestkitError> {
        loop {
            let probes = self.probe_all(clients).await;
            if let Some(primary) = pick_primary(&probes) {
                return Ok((primary, probes));
            }
            if began.elapsed() >= timeout {
                return Err(TestkitError::NoPrimary {
                    what: what.to_owned(),
                    waited: began.elapsed(),
                    members: probes.into_iter().map(|p| p.status).collect(),
                    log_tail: self.logs_tail(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Asks the current primary to step down (`replSetStepDown` with
    /// `stepDownSecs: 60`, `secondaryCatchUpPeriodSecs: 10`; on a
    /// single-member set `secondaryCatchUpPeriodSecs: 0, force: true`) and
    /// returns the index of the old primary.
    /// Does not wait for a new primary: use
    /// [`wait_for_primary`](Self::wait_for_primary).
    ///
    /// The old primary cannot be re-elected for 60 s (so a single-member
    /// set has no primary for that long); afterwards member 0, having the
    /// highest priority, takes over again. See
    /// [`step_down_for`](Self::step_down_for) to choose the duration, and
    /// for how it copes with elections in progress.
    ///
    /// # Errors
    ///
    /// As [`step_down_for`](Self::step_down_for).
    pub async fn step_down(&self) -> Result<usize, TestkitError> {
        self.step_down_for(Duration::from_secs(60)).await
    }

    /// Like [`step_down`](Self::step_down), with `stepDownSecs` set to
    /// `ineligible` (rounded up to whole seconds, at least 1 s) and
    /// `secondaryCatchUpPeriodSecs` to half of that, at most 10 s (0 on a
    /// single-member set).
    ///
    /// The primary is looked for right away, and waited for if there is
    /// none (an election in progress, member 0's priority takeover). If the
    /// member stops being primary before the command reaches it, or no
    /// secondary caught up in time, or another election or step-down is in
    /// progress, the primary is looked for again and the step-down retried.
    /// All of this is bounded by
    /// [`primary_timeout`](ReplicaSetOptions::primary_timeout) (default
    /// 30 s). An answer lost with its connection is settled by asking the
    /// member whether it is still primary.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NoPrimary`] if no member was primary within the
    /// bound, with what each member said last; [`TestkitError::Driver`] if
    /// `replSetStepDown` failed for another reason, or kept failing until
    /// the bound (its context then names the attempts and the members'
    /// states).
    pub async fn step_down_for(&self, ineligible: Duration) -> Result<usize, TestkitError> {
        let began = Instant::now();
        let bound = self.opts.primary_timeout;
        let clients = self.direct_clients().await?;
        let secs = ineligible.as_secs_f64().ceil().max(1.0) as i64;
        let single = self.members.len() == 1;
        // Must be shorter than stepDownSecs; a single member has nobody to
        // wait for (and needs `force`).
        let catch_up = if single { 0 } else { (secs / 2).min(10) };
        let cmd = doc! {
            "replSetStepDown": secs,
            "secondaryCatchUpPeriodSecs": catch_up,
            "force": single,
        };
        let mut attempts = 0;
        loop {
            let (primary, probes) = self
                .await_primary(&clients, "replSetStepDown", began, bound)
                .await?;
            attempts += 1;
            let error = match clients[primary]
                .database("admin")
                .run_command(cmd.clone())
                .await
            {
                Ok(_) => {
                    tracing::debug!(member = primary, attempts, "primary stepped down");
                    return Ok(primary);
                }
                Err(e) => e,
            };
            let settled = match classify_step_down(&error) {
                StepDownFailure::Retry => false,
                StepDownFailure::Fatal => {
                    return Err(TestkitError::driver(
                        format!("running replSetStepDown on member {primary}"),
                        error,
                    ));
                }
                StepDownFailure::Ambiguous => {
                    // Stepped down unless it is still primary of the same
                    // election.
                    let before = probes[primary].election_id;
                    let now = probe(&self.members[primary], &clients[primary]).await;
                    !(now.is_primary() && now.election_id == before)
                }
            };
            if settled {
                tracing::debug!(member = primary, attempts, error = %error, "primary stepped down");
                return Ok(primary);
            }
            if began.elapsed() >= bound {
                let seen: Vec<MemberStatus> = self
                    .probe_all(&clients)
                    .await
                    .into_iter()
                    .map(|p| p.status)
                    .collect();
                return Err(TestkitError::driver(
                    format!(
                        "running replSetStepDown (gave up after {attempts} attempt(s) in {:?}, \
                         the last one on member {primary}; members last seen: {})",
                        began.elapsed(),
                        describe(&seen)
                    ),
                    error,
                ));
            }
            tracing::debug!(member = primary, attempts, error = %error, "step-down failed, retrying");
            tokio::time::sleep(POLL).await;
        }
    }
}

/// How a failed `replSetStepDown` is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepDownFailure {
    /// The command did not step the member down, but trying again may: it
    /// is no longer primary (look for the new one), no secondary caught up
    /// in time, another election or step-down is in progress, or the member
    /// could not be reached before sending.
    Retry,
    /// The answer was lost with its connection, or the command was
    /// interrupted by a change of role: ask the member whether it is still
    /// primary.
    Ambiguous,
    /// Anything else (bad command, authorization, ...): give up.
    Fatal,
}

/// Server error codes after which a step-down is tried again.
const RETRY_CODES: &[i32] = &[
    6,     // HostUnreachable
    24,    // LockTimeout: the step-down could not take the global lock yet
    50,    // MaxTimeMSExpired
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    117,   // ConflictingOperationInProgress: an election or step-down under way
    189,   // PrimarySteppedDown
    262,   // ExceededTimeLimit: no electable secondary caught up in time
    9001,  // SocketException
    10058, // LegacyNotPrimary
    10107, // NotWritablePrimary: it stopped being primary after `hello`
    11600, // InterruptedAtShutdown
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// `InterruptedDueToReplStateChange`: the member changed role while
/// running the command (often the very step-down it asked for).
const INTERRUPTED_BY_ROLE_CHANGE: i32 = 11602;

fn classify_step_down(error: &mongodb::error::Error) -> StepDownFailure {
    match &*error.kind {
        ErrorKind::Command(c) if c.code == INTERRUPTED_BY_ROLE_CHANGE => StepDownFailure::Ambiguous,
        ErrorKind::Command(c) if RETRY_CODES.contains(&c.code) => StepDownFailure::Retry,
        // The connection broke: before or after the member stepped down.
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => StepDownFailure::Ambiguous,
        // Nothing was sent.
        ErrorKind::ServerSelection { .. } => StepDownFailure::Retry,
        _ => StepDownFailure::Fatal,
    }
}

#[cfg(test)]
mod tests;
