//! Distributed leases (renewable locks) on MongoDB, for tokio programs.
//!
//! `mongo-lease` gives long-running workers exclusive, renewable leases on
//! named keys, stored in a MongoDB lock collection: one document per key,
//! shared by every process that uses the collection.
//!
//! ```no_run
//! use mongo_lease::{LockManager, LockManagerOptions};
//!
//! # async fn demo() -> mongo_lease::Result<()> {
//! let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:27017/?replicaSet=rs0").await?;
//! let manager = LockManager::connect(
//!     LockManagerOptions::builder()
//!         .database(client.database("app"))
//!         .collection("workitem.lock")
//!         .build(),
//! )
//! .await?;
//!
//! let lease = manager.acquire("workitem-17").await?;
//! tokio::select! {
//!     _ = lease.lost() => eprintln!("lease lost: stop writing"),
//!     _ = process(17, lease.fencing_token()) => {}
//! }
//! lease.release().await?;
//! manager.shutdown().await?;
//! # Ok(()) }
//! # async fn process(_item: u32, _fencing_token: u64) {}
//! ```
//!
//! # Guarantees
//!
//! - **Mutual exclusion**: at most one live lease per key at any instant, across
//!   tasks and processes, as long as the deployment keeps majority-acknowledged
//!   writes (every write of the manager uses `w: majority`).
//! - **Server-clock expiry**: a lease expires when the *server's* `$$NOW` passes
//!   its expiry; client clocks are never compared. An expired lease is taken
//!   over at once, without waiting for MongoDB's TTL monitor.
//! - **Fencing tokens**: each acquisition gets a token strictly greater than
//!   every earlier one for that key, also after an expiry takeover and after
//!   the lock document was garbage-collected.
//! - **Renewal**: a heartbeat renews every held lease in batched commands (one
//!   `updateMany` per [`DEFAULT_RENEWAL_BATCH_SIZE`] leases).
//! - **Lost-lease signal**: each [`Lease`] carries a
//!   [`CancellationToken`](tokio_util::sync::CancellationToken) that fires when
//!   a renewal finds the lease gone, and also when renewal cannot be confirmed
//!   before a local deadline on the monotonic clock that comes *before*
//!   another owner can acquire the key.
//! - **Safe release**: releases match owner id and lease id, so a stale holder
//!   never releases its successor's lease.
//! - **Fair waiting**: local waiters are served first in, first out, and one
//!   retry loop per key (jittered exponential backoff) talks to MongoDB. A
//!   release that another manager waited for yields the key to it (for up to
//!   the releasing manager's `retry_max`), so a manager whose tasks keep
//!   re-acquiring a key cannot starve the others.
//!
//! # Non-guarantees
//!
//! - First-come order *between* processes: a waiter is woken by another
//!   process's release through a change stream (a few milliseconds on a
//!   replica set; jittered polling on a standalone server or when the stream
//!   fails). No queue of remote waiters is stored: with several processes
//!   waiting, the first to retry after a release wins, and a yielded key goes
//!   back to its last holder if no other manager takes it within the yield
//!   window.
//! - A lease is only as safe as its fencing: a holder paused for longer than
//!   the safety margin (GC, swapping) can act after its token fired. Check the
//!   fencing token at the resource.
//! - Fencing tokens after garbage collection assume the servers' clocks are not
//!   stepped back by more than the GC grace period.
//!
//! # Module map
//!
//! | module | concept |
//! |---|---|
//! | [`manager`] | [`LockManager`], the public cloneable handle (never touches MongoDB) |
//! | [`lease`] | [`Lease`]: key, owner, fencing token, cancellation token, payload, release; [`LeaseInfo`] (a key as read with server time) and [`LeaseObserver`] |
//! | [`election`] | [`Election`]: campaign, resign, the current leader ([`LeaderInfo`]), observe, `run_as_leader` |
//! | [`config`] | [`LockManagerOptions`] and the `DEFAULT_*` constants |
//! | [`error`] | [`Error`] and [`Result`] |
//! | `actor` (private) | the manager task: state, the one `select!` loop, one file per concept (acquire, renewal and deadlines, release, release watch, shutdown, observers); `Command`s and the handles' `Mailbox` |
//! | `store` (private) | the lock protocol on MongoDB: schema, indexes, acquire/renew/release, reads, observing a key (change stream or polling); the only code that issues MongoDB commands |
//! | `backoff` (private) | jittered exponential backoff |
//! | `testkit` (feature `testkit`) | throwaway real `mongod` replica sets for tests, no Docker |
//!
//! See `ARCHITECTURE.md` in the repository for the invariants and where each
//! is enforced.

#![deny(missing_docs)]

mod actor;
mod backoff;
pub mod config;
pub mod election;
pub mod error;
pub mod lease;
pub mod manager;
mod store;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use config::{
    AcquireOptions, DEFAULT_GC_GRACE, DEFAULT_HEARTBEAT_DIVISOR, DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_RENEWAL_BATCH_SIZE, DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX,
    DEFAULT_SAFETY_MARGIN_DIVISOR, DEFAULT_TTL, LockManagerOptions, MAX_KEY_LEN, MAX_OWNER_ID_LEN,
};
pub use election::{Election, LeaderContext, LeaderInfo, LeaderObserver, Leadership};
pub use error::{Error, Result};
pub use lease::{Lease, LeaseInfo, LeaseObserver, MAX_PAYLOAD_LEN, ReleaseOutcome};
pub use manager::LockManager;

/// The README's code examples, compiled as doctests, so that they stay true
/// to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
