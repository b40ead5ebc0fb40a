//! The server's `failCommand` fail point, set on every member of a
//! [`ReplicaSet`] at once.
//!
//! `failCommand` makes a member answer chosen commands with an error, a
//! write concern error, a closed connection or a delay, for the commands of
//! chosen clients (`appName`). It exists only on members started with test
//! commands enabled:
//! `ReplicaSetOptions::default().extra_arg("--setParameter").extra_arg("enableTestCommands=1")`.
//! Commands of the members among themselves (replication, heartbeats,
//! elections) are never failed (`failInternalCommands` is left false).

use std::time::Instant;

use mongodb::bson::{Bson, Document, doc};
use mongodb::error::ErrorKind;

use super::TestkitError;
use super::member::POLL;
use super::replica_set::ReplicaSet;

impl ReplicaSet {
    /// Sets the `failCommand` fail point on every running member that is
    /// not [frozen](Self::freeze), with `mode` (`"alwaysOn"`, `"off"`,
    /// `{times: n}`, `{skip: n}`, `{activationProbability: p}`) and `data`
    /// (`failCommands`, `errorCode`, `errorLabels`, `closeConnection`,
    /// `blockConnection` with `blockTimeMS`, `writeConcernError`, `appName`;
    /// see the server's documentation of the fail point). Returns the
    /// indices of the members it was set on. A member that does not answer
    /// (just thawed or restarted) is tried again every 50 ms within
    /// [`primary_timeout`](super::ReplicaSetOptions::primary_timeout).
    ///
    /// A member frozen now keeps the fail point it had: set the fail point
    /// again after [`thaw`](Self::thaw).
    ///
    /// # Errors
    ///
    /// [`TestkitError::Driver`] if a member refuses the command (test
    /// commands not enabled, bad `data`) or keeps failing until the bound.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
    /// # async fn demo() -> Result<(), mongo_lease::testkit::TestkitError> {
    /// use mongodb::bson::doc;
    /// let rs = ReplicaSet::start(
    ///     ReplicaSetOptions::default()
    ///         .members(3)
    ///         .extra_arg("--setParameter")
    ///         .extra_arg("enableTestCommands=1"),
    /// )
    /// .await?;
    /// // The next two `findAndModify` of the client named "w1" fail with
    /// // HostUnreachable, without the RetryableWriteError label.
    /// let data = doc! {
    ///     "failCommands": ["findAndModify"], "appName": "w1",
    ///     "errorCode": 6, "errorLabels": [],
    /// };
    /// rs.fail_command(doc! { "times": 2 }.into(), data).await?;
    /// rs.clear_fail_command().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fail_command(
        &self,
        mode: Bson,
        data: Document,
    ) -> Result<Vec<usize>, TestkitError> {
        let command = doc! {
            "configureFailPoint": "failCommand",
            "mode": mode,
            "data": data,
        };
        let mut set = Vec::new();
        for (i, member) in self.members().iter().enumerate() {
            if !member.is_running() || member.is_frozen() {
                continue;
            }
            let client = self.direct_client(i).await?;
            let began = Instant::now();
            loop {
                match client.database("admin").run_command(command.clone()).await {
                    Ok(_) => break,
                    // An answer is final; no answer (a member starting or
                    // just resumed) is asked again.
                    Err(e)
                        if !matches!(*e.kind, ErrorKind::Command(_))
                            && began.elapsed() < self.options().primary_timeout =>
                    {
                        tokio::time::sleep(POLL).await;
                    }
                    Err(e) => {
                        return Err(TestkitError::driver(
                            format!("setting failCommand on member {i}: {command}"),
                            e,
                        ));
                    }
                }
            }
            set.push(i);
        }
        Ok(set)
    }

    /// Turns the `failCommand` fail point off on every running member that
    /// is not frozen ([`fail_command`](Self::fail_command) with mode
    /// `"off"`).
    ///
    /// # Errors
    ///
    /// As [`fail_command`](Self::fail_command).
    pub async fn clear_fail_command(&self) -> Result<Vec<usize>, TestkitError> {
        self.fail_command(Bson::from("off"), Document::new()).await
    }
}
