//! Faults on a running [`ReplicaSet`]: kill, stop and restart members,
//! find the primary, step it down.

use std::time::{Duration, Instant};

use mongodb::Client;
use mongodb::bson::doc;

#[cfg(doc)]
use super::ReplicaSetOptions;
use super::TestkitError;
use super::member::{ListenError, POLL};
use super::replica_set::{ReplicaSet, Role, error_code, hello_role};

impl ReplicaSet {
    /// Kills member `i` with `SIGKILL` (a crash: no clean shutdown) and
    /// waits until the process is gone. Its port and data directory are
    /// kept for [`restart`](Self::restart). Killing an already killed
    /// member is a no-op.
    pub async fn kill(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        if let Some(mut child) = member.take_child() {
            let _ = child.kill();
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(e) => return Err(TestkitError::io("waiting for a killed mongod", e)),
                }
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
    pub async fn stop(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        let Some(mut child) = member.take_child() else {
            return Ok(());
        };
        #[cfg(unix)]
        // SAFETY: signalling our own, not yet reaped child.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + self.opts.startup_timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    tracing::debug!(member = i, %status, "stopped mongod");
                    return Ok(());
                }
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(self.timeout(format!("member {i} to shut down after SIGTERM")));
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => return Err(TestkitError::io("waiting for a stopped mongod", e)),
            }
        }
    }

    /// Restarts member `i` on the same port and data directory, killing it
    /// first (`SIGKILL`) if it is running, and waits (bounded by
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout)) until it
    /// reports itself as primary or secondary again.
    pub async fn restart(&self, i: usize) -> Result<(), TestkitError> {
        self.kill(i).await?;
        let member = self.member(i)?;
        let deadline = Instant::now() + self.opts.startup_timeout;
        member
            .spawn(&self.mongod, &self.opts, self.key_file().as_deref())
            .await?;
        match member
            .wait_listening(deadline, self.opts.startup_timeout)
            .await
        {
            Ok(()) => {}
            Err(ListenError::AddrInUse) => {
                let _ = self.kill(i).await;
                return Err(TestkitError::PortConflict {
                    member: i,
                    attempts: 1,
                });
            }
            Err(ListenError::Other(e)) => return Err(e),
        }
        let client = self.direct_client(i).await?;
        loop {
            if let Some(status) = member.exit_status() {
                return Err(member.exited_error(status));
            }
            if matches!(
                hello_role(&client).await,
                Some(Role::Primary | Role::Secondary)
            ) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(format!(
                    "restarted member {i} to become PRIMARY or SECONDARY"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Index of the current writable primary among the running members,
    /// if any (one round of `hello`).
    pub async fn primary(&self) -> Option<usize> {
        let clients = self.direct_clients().await.ok()?;
        self.find_primary(&clients).await
    }

    /// One concurrent round of `hello` on the running members.
    pub(super) async fn find_primary(&self, clients: &[Client]) -> Option<usize> {
        let roles =
            futures::future::join_all(self.members.iter().zip(clients).map(|(m, c)| async move {
                if m.is_running() {
                    hello_role(c).await
                } else {
                    None
                }
            }))
            .await;
        roles.iter().position(|r| *r == Some(Role::Primary))
    }

    /// Polls `hello` on the running members every 50 ms until one of them
    /// is a writable primary, and returns its index.
    pub async fn wait_for_primary(&self, timeout: Duration) -> Result<usize, TestkitError> {
        let deadline = Instant::now() + timeout;
        let clients = self.direct_clients().await?;
        loop {
            if let Some(i) = self.find_primary(&clients).await {
                return Ok(i);
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout {
                    what: "a writable primary".into(),
                    timeout,
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
    /// [`step_down_for`](Self::step_down_for) to choose the duration.
    pub async fn step_down(&self) -> Result<usize, TestkitError> {
        self.step_down_for(Duration::from_secs(60)).await
    }

    /// Like [`step_down`](Self::step_down), with `stepDownSecs` set to
    /// `ineligible` (rounded up to whole seconds, at least 1 s) and
    /// `secondaryCatchUpPeriodSecs` to half of that, at most 10 s (0 on a
    /// single-member set).
    pub async fn step_down_for(&self, ineligible: Duration) -> Result<usize, TestkitError> {
        let primary = self.primary().await.ok_or(TestkitError::NoPrimary)?;
        let secs = ineligible.as_secs_f64().ceil().max(1.0) as i64;
        let client = self.direct_client(primary).await?;
        let single = self.members.len() == 1;
        // Must be shorter than stepDownSecs; a single member has nobody to
        // wait for (and needs `force`).
        let catch_up = if single { 0 } else { (secs / 2).min(10) };
        let cmd = doc! {
            "replSetStepDown": secs,
            "secondaryCatchUpPeriodSecs": catch_up,
            "force": single,
        };
        match client.database("admin").run_command(cmd).await {
            Ok(_) => {}
            // Older servers close the connection / interrupt the command
            // while stepping down; that still means success.
            Err(e)
                if matches!(*e.kind, mongodb::error::ErrorKind::Io(_))
                    || error_code(&e) == Some(11602) => {}
            Err(e) => {
                return Err(TestkitError::driver(
                    format!("running replSetStepDown on member {primary}"),
                    e,
                ));
            }
        }
        tracing::debug!(member = primary, "primary stepped down");
        Ok(primary)
    }
}
