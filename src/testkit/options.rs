//! [`ReplicaSetOptions`]: how a test replica set is started, with defaults
//! tuned for tests (fast elections, a small journal, a busy TTL monitor).

use std::time::Duration;

use super::TestkitError;
#[cfg(doc)]
use super::{FaultProxy, ReplicaSet};

/// Options for [`ReplicaSet::start`].
///
/// Construct with [`Default::default`] and adjust with the chainable
/// setters (or assign the public fields):
///
/// ```no_run
/// # use mongo_lease::testkit::ReplicaSetOptions;
/// let opts = ReplicaSetOptions::default().members(3).set_name("failover");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplicaSetOptions {
    /// Number of members (default 1). Members beyond the seventh are added
    /// as non-voting, priority-0 members.
    pub members: usize,
    /// `ttlMonitorSleepSecs` server parameter: how often the TTL monitor
    /// deletes expired documents (default 1; MongoDB's default is 60).
    pub ttl_monitor_sleep_secs: u32,
    /// Use fast elections (default `true`): `electionTimeoutMillis: 1000`,
    /// `heartbeatIntervalMillis: 500` instead of MongoDB's 10 000 / 2 000.
    pub fast_elections: bool,
    /// Replica set name (default `"rs0"`).
    pub set_name: String,
    /// Upper bound for [`ReplicaSet::start`] (and for
    /// [`ReplicaSet::restart`]) to reach a healthy state (default 60 s).
    pub startup_timeout: Duration,
    /// Upper bound for the operations that need the primary
    /// ([`ReplicaSet::step_down`], [`ReplicaSet::step_down_for`]) to find
    /// one when none is seen (during an election, a priority takeover, ...)
    /// and to retry when it changes under them (default 30 s).
    pub primary_timeout: Duration,
    /// Use a 10 MB, non-preallocated journal (default `true`). WiredTiger
    /// otherwise preallocates ~300 MB of journal files per member.
    pub small_journal: bool,
    /// Extra command-line arguments appended to every `mongod` invocation.
    pub extra_args: Vec<String>,
    /// Extra environment variables of every member's `mongod` (besides
    /// the test process's own), e.g. an `LD_PRELOAD` shim and its settings.
    pub env: Vec<(String, String)>,
    /// Extra environment variables of one member's `mongod`: `(index,
    /// name, value)`, set after [`env`](Self::env), so that one member
    /// differs from the others (its clock, for one).
    pub member_env: Vec<(usize, String, String)>,
    /// Put a [`FaultProxy`] in front of every member (default `false`). The
    /// replica set configuration then names each member by its proxy's
    /// address, so *all* traffic to a member goes through its proxy: from
    /// clients (which discover the members from that configuration), and from
    /// the other members (replication, heartbeats, elections). Inject faults
    /// with [`ReplicaSet::proxy`]. The test kit's own polling bypasses the
    /// proxies.
    pub proxied: bool,
    /// Start with access control (default `None`): `Some((user, password))`
    /// starts every member with a generated `--keyFile` (which implies
    /// `--auth`) and creates `user` with the `root` role through the
    /// localhost exception. [`ReplicaSet::uri`] and [`ReplicaSet::client`]
    /// then carry these credentials.
    pub auth: Option<(String, String)>,
}

impl Default for ReplicaSetOptions {
    fn default() -> Self {
        ReplicaSetOptions {
            members: 1,
            ttl_monitor_sleep_secs: 1,
            fast_elections: true,
            set_name: "rs0".to_owned(),
            startup_timeout: Duration::from_secs(60),
            primary_timeout: Duration::from_secs(30),
            small_journal: true,
            extra_args: Vec::new(),
            env: Vec::new(),
            member_env: Vec::new(),
            proxied: false,
            auth: None,
        }
    }
}

impl ReplicaSetOptions {
    /// Sets [`members`](Self::members).
    pub fn members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Sets [`set_name`](Self::set_name).
    pub fn set_name(mut self, name: impl Into<String>) -> Self {
        self.set_name = name.into();
        self
    }

    /// Sets [`primary_timeout`](Self::primary_timeout).
    pub fn primary_timeout(mut self, timeout: Duration) -> Self {
        self.primary_timeout = timeout;
        self
    }

    /// Appends one extra `mongod` argument (see
    /// [`extra_args`](Self::extra_args)).
    pub fn extra_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Adds an environment variable of every member's `mongod` (see
    /// [`env`](Self::env)).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Adds an environment variable of member `index`'s `mongod` alone
    /// (see [`member_env`](Self::member_env)).
    pub fn member_env(
        mut self,
        index: usize,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.member_env.push((index, name.into(), value.into()));
        self
    }

    /// Sets [`proxied`](Self::proxied).
    pub fn proxied(mut self, proxied: bool) -> Self {
        self.proxied = proxied;
        self
    }

    /// Sets [`auth`](Self::auth): access control with one `root` user.
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some((user.into(), password.into()));
        self
    }

    pub(super) fn validate(&self) -> Result<(), TestkitError> {
        if self.members == 0 {
            return Err(TestkitError::InvalidOptions(
                "members must be at least 1".into(),
            ));
        }
        if self.members > 50 {
            return Err(TestkitError::InvalidOptions(format!(
                "members is {}, MongoDB allows at most 50",
                self.members
            )));
        }
        if let Some((index, name, _)) = self.member_env.iter().find(|(i, ..)| *i >= self.members) {
            return Err(TestkitError::InvalidOptions(format!(
                "member_env names member {index} ({name}), but the set has {} member(s)",
                self.members
            )));
        }
        if self.set_name.is_empty()
            || self
                .set_name
                .chars()
                .any(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(TestkitError::InvalidOptions(format!(
                "set_name {:?} must be non-empty and contain only [A-Za-z0-9_-]",
                self.set_name
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
