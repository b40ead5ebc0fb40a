//! Distributed leases (renewable locks) on MongoDB, for tokio programs.
//!
//! `mongo-lease` gives long-running workers exclusive, renewable leases on
//! named keys, stored in a MongoDB lock collection: one document per key,
//! shared by every process that uses the collection. A key can also be held
//! as one permit of a semaphore or as a shared lease (the shared side of a
//! read/write lock), and an exclusive lease can keep its key for a minimum
//! time ([Kinds of lease](#kinds-of-lease)).
//!
//! ```no_run
//! use mongo_lease::{LeaseManager, LeaseManagerOptions};
//!
//! # async fn demo() -> mongo_lease::Result<()> {
//! let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:27017/?replicaSet=rs0").await?;
//! let manager = LeaseManager::connect(
//!     LeaseManagerOptions::builder()
//!         .database(client.database("app"))
//!         .collection("workitem.lock")
//!         .build(),
//! )
//! .await?;
//!
//! let lease = manager.acquire("workitem-17").await?;
//! tokio::select! {
//!     _ = lease.status().lost() => eprintln!("lease lost: stop writing"),
//!     _ = process(17, lease.fencing_token()) => {}
//! }
//! lease.release().await?;
//! manager.shutdown().await?;
//! # Ok(()) }
//! # async fn process(_item: u32, _fencing_token: u64) {}
//! ```
//!
//! # Keys
//!
//! A key is a [`LeaseKey`]: a string (`manager.acquire("job-1")`), or any
//! BSON value MongoDB accepts as `_id`, stored unchanged as the lock
//! document's `_id`. To lock a document of another collection the way other
//! applications do (`workitem.lock` beside `workitem`), use its `_id`:
//!
//! ```no_run
//! # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
//! use mongodb::bson::oid::ObjectId;
//!
//! let item: ObjectId = "5087b72181a445980ae47d13".parse().unwrap();
//! let lease = manager.acquire(item).await?; // `_id: ObjectId("5087b7...")`
//! # Ok(()) }
//! ```
//!
//! Every application that locks that `ObjectId` in the collection is then
//! excluded, whatever its language. Integers (`i32`, `i64`), UUIDs, dates,
//! binary data and embedded documents work the same way; arrays, regular
//! expressions, `undefined` and `$`-prefixed field names, which MongoDB
//! refuses as `_id`, the empty string and keys longer than [`MAX_KEY_LEN`]
//! are refused with [`Error::InvalidKey`] before any round trip. Numbers of equal value
//! are one key (`1_i32` and `1_i64`), as in MongoDB's `_id` index. Non-string
//! keys are shown as MongoDB Extended JSON (`{"$oid":"5087b72181a445980ae47d13"}`),
//! which [`LeaseKey::from_extended_json`] and the CLI's `--key-json` read.
//!
//! # In-document leases
//!
//! When the locked thing is a document of the application's own
//! collection, the lock can live inside it, under one field
//! ([`DEFAULT_LEASE_FIELD`], `_lease`): [`LeaseManager::documents`] gives
//! [`DocumentLeases`], whose acquires return a [`DocumentLease`] with the
//! document read in the same round trip (optionally creating it:
//! [`AcquireDocument::create`]). [`DocumentLease::commit`] writes the
//! document's new state and releases the lease in one atomic write, so the
//! state write is fenced by construction; [`DocumentLease::update`] writes
//! under the lease and keeps it. The same manager drives these leases (the
//! same heartbeat, fencing-token rule and lost-lease token); see the
//! [`DocumentLeases`] for the schema.
//!
//! ```no_run
//! # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
//! use mongodb::bson::{doc, Document};
//!
//! let items = manager.documents::<Document>("workitem").await?;
//! let item = items.acquire("item-17").create(doc! { "runs": 0 }).await?;
//! item.commit(doc! { "$inc": { "runs": 1 } }).await?; // new state + release
//! # Ok(()) }
//! ```
//!
//! # Kinds of lease
//!
//! A key is held in one of three ways ([`LeaseKind`], whose documentation
//! gives the rules between kinds): [`LeaseKind::Exclusive`] (the default),
//! [`LeaseKind::Shared`] ([`Acquire::shared`]: any number of shared holders,
//! no exclusive one; a waiting exclusive acquirer stops new shared
//! acquisitions, so it is not starved) or [`LeaseKind::Permit`] (a
//! [`Semaphore`]: at most `permits` holders, a number stored with the key).
//! [`Acquire::hold_at_least`] keeps an exclusive lease's key held until its
//! acquisition time plus that duration, by the server's clock, even if it is
//! released earlier: a job guarded by it runs at most once per interval
//! across processes.
//!
//! ```no_run
//! use std::time::Duration;
//! use mongo_lease::Semaphore;
//!
//! # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
//! let encoders = Semaphore::new(&manager, "encoders", 4)?;
//! let encoder = encoders.acquire().await?; // one of 4 holders
//! let reader = manager.acquire("catalog").shared().await?; // beside other shared holders
//!
//! let once = manager.try_acquire("hourly-digest").hold_at_least(Duration::from_secs(600));
//! if let Some(digest) = once.await? {
//!     digest.release().await?; // the key stays held 10 min after its acquisition
//! }
//! encoder.release().await?;
//! reader.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Following a lease
//!
//! Every holder ([`Lease`], [`LeaseGroup`], [`Leadership`], [`LeaderContext`],
//! [`DocumentLease`]) hands out its [`LeaseStatus`] (`status()`). Its
//! [`CancellationToken`](tokio_util::sync::CancellationToken)
//! ([`LeaseStatus::lost`], [`LeaseStatus::cancellation_token`]) stays the
//! simple path: it fires when the lease is no longer held. To know more:
//!
//! - [`LeaseStatus::lost_reason`] says why ([`LossReason`]): expired,
//!   taken, deleted, force released, released or shut down.
//! - [`LeaseStatus::events`] streams [`LeaseEvent`]s: `Renewed`, `AtRisk`
//!   (a renewal failed), and `Lost(reason)`, the last one.
//! - [`LeaseStatus::is_lost`] and [`LeaseStatus::deadline`] read the local
//!   deadline without the manager task, so a frozen or starved process
//!   still reads its lease lost once the deadline has passed.
//!
//! The reason is recorded before the token fires, and the token fires
//! before the `Lost` event is sent.
//!
//! ```no_run
//! use mongo_lease::{LeaseEvent, LossReason};
//!
//! # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
//! let lease = manager.acquire("report").await?;
//! let mut events = lease.status().events();
//! while let Some(event) = events.recv().await {
//!     match event {
//!         LeaseEvent::AtRisk { error, .. } => eprintln!("renewal failed: {error}"),
//!         LeaseEvent::Lost(LossReason::Taken { owner_id, .. }) => eprintln!("taken by {owner_id}"),
//!         LeaseEvent::Lost(reason) => eprintln!("lost: {reason}"),
//!         _ => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! The server must be MongoDB 5.0 or later (the manager's writes use `let`
//! variables and `$unsetField`).
//!
//! - **Mutual exclusion**: at most one live exclusive lease per key at any
//!   instant, across tasks and processes, and no shared or semaphore holder
//!   beside it; at most `permits` live holders of a semaphore key, and no
//!   exclusive holder beside shared ones; as long as the deployment keeps
//!   majority-acknowledged writes (every write of the manager uses
//!   `w: majority`).
//! - **Server-clock expiry**: a lease expires when the *server's* `$$NOW` passes
//!   its expiry; client clocks are never compared. An expired lease is taken
//!   over at once, without waiting for MongoDB's TTL monitor.
//! - **Fencing tokens**: each acquisition gets a token strictly greater than
//!   every earlier one for that key, also after an expiry takeover, after
//!   the lock document was garbage-collected, and in the delete-on-release
//!   mode ([`ReleaseMode::Delete`]).
//! - **Renewal**: a heartbeat renews every held lease in batched commands (one
//!   `updateMany` per [`DEFAULT_RENEWAL_BATCH_SIZE`] leases and per distinct
//!   lease TTL: [`Acquire::ttl`] sets one lease's TTL), whatever their
//!   kinds: one command renews exclusive leases, shared leases and permits
//!   together.
//! - **Every kind is a lease**, with the guarantees above ([`LeaseKind`]
//!   says so and gives the rules between kinds). A key held with
//!   [`Acquire::hold_at_least`] stays held until acquisition + that
//!   duration by the server's clock, through a release or a crash; only
//!   [`LeaseManager::force_release`] frees it earlier.
//! - **Lost-lease signal**: each [`Lease`] carries a
//!   [`CancellationToken`](tokio_util::sync::CancellationToken) that fires when
//!   a renewal finds the lease gone, and also when renewal cannot be confirmed
//!   before a local deadline on the monotonic clock that comes *before*
//!   another owner can acquire the key. On a replica set, a write by someone
//!   else that may have taken a held lease (its document deleted, or its
//!   `lid` or `aid` rewritten) makes the manager renew that lease at once, so
//!   the token fires within milliseconds (measured on a single-node replica
//!   set: p50 1.3-1.6 ms, p95 at most 3.1 ms), not at the next heartbeat.
//! - **Safe release**: releases, renewals and payload writes match owner id
//!   and lease id, so a stale holder never releases its successor's lease.
//!   Only the operator calls [`LeaseManager::force_release`] and
//!   [`LeaseManager::release_owner`] (logged at `warn`) release another
//!   holder's lease.
//! - **Fair waiting**: local waiters are served first in, first out, and one
//!   retry loop per key (jittered exponential backoff) talks to MongoDB.
//!   Across processes, managers waiting for an exclusive key register in its
//!   queue of waiting owners (in the lock document, by their failed
//!   attempt's own write) and are handed the key in that order, in the
//!   releasing write itself; a waiter that died holds a handed key at most
//!   its short registration (`2 * retry_max + 1 s + safety_margin`). A release that another
//!   manager waited for without a live registration yields the key to it
//!   (for up to the releasing manager's `retry_max`), so a manager whose
//!   tasks keep re-acquiring a key cannot starve the others.
//! - **Other applications' locks are respected**: a document in the lock
//!   collection that `mongo-lease` did not write (no int64 `tok` or no date
//!   `exp`, such as another application's `{_id, ts, aid}` lock document) is
//!   a lock held by a *foreign holder*. It is never taken, renewed, released
//!   or marked: [`LeaseManager::try_acquire`] returns `Ok(None)`,
//!   [`LeaseManager::acquire`] waits until its owner (or a TTL index) deletes
//!   it, and reads show it with [`LeaseInfo::foreign`]. Only
//!   [`LeaseManager::force_release`] deletes it. (The GC TTL index on `exp`
//!   deletes any document whose `exp` is a date, foreign or not.)
//! - **The collection is checked**: [`LeaseManager::connect`] refuses, with
//!   [`Error::UnusableCollection`] and creating nothing, a collection whose
//!   TTL indexes could delete a held lease (one on `ts` whose
//!   `expireAfterSeconds` is not longer than the heartbeat interval plus the
//!   safety margin; one on `acq`, `wt`, `yu` or `data`), and, before creating
//!   its own TTL index, a collection holding documents that are not lock
//!   documents (a data collection named by mistake). An accepted TTL index
//!   on `ts` with `expireAfterSeconds` *E* shorter than the TTL caps each
//!   local deadline at *start of the last confirmed renewal + E − safety
//!   margin*, so the token still fires before MongoDB may delete the
//!   document.
//! - **In-document leases** have the guarantees above, per document of the
//!   user collection, and: acquire, renewal and release write only the lock
//!   field, never the user's other fields; [`DocumentLease::update`] and
//!   [`DocumentLease::commit`] apply the user's update in the same
//!   conditional write that checks the lease (lease id, owner id, and expiry
//!   by the server's `$$NOW`), so an update is written only under a held
//!   lease, and a `commit` writes the new state and releases, or does
//!   neither ([`Error::LeaseLost`]); concurrent acquires that create a
//!   missing document create it once.
//! - **Fenced writes to other data**: [`Lease::with_transaction`] commits
//!   the caller's writes, in one MongoDB transaction, only if the lease is
//!   held by the server's clock when the transaction commits (the lease is
//!   renewed by a write inside the transaction, which a takeover conflicts
//!   with), and otherwise writes nothing ([`Error::LeaseLost`]); [`Fence`]
//!   makes one single-document write apply only if the document's stored
//!   token is absent or not greater than the lease's.
//!
//! # Non-guarantees
//!
//! - First-come order *between tasks* of different processes: the order
//!   across processes is by manager (its first registration), not by task;
//!   shared and semaphore keys and in-document leases have no queue (there
//!   the first to retry after a release wins); an expired lease (a holder
//!   that died) is taken by the head of the queue at its next attempt, not
//!   handed over; a handoff reaches the waiter through its change stream (a
//!   few milliseconds on a replica set), or its next poll on a standalone
//!   server.
//! - A lease taken away by another application's write (its document
//!   deleted, or its `aid` or `lid` rewritten) is noticed within milliseconds
//!   on a replica set, through the manager's change stream; on a standalone
//!   server, when the stream fails, or for a write in the milliseconds before
//!   the stream opens (when a manager that held nothing acquires), only at
//!   the next heartbeat. Such a write takes the lease away at once: the
//!   holder is told, but may act in between; the fencing token covers that
//!   only at resources that check it. Other applications sharing the
//!   collection must follow the same protocol, and never write a manager's
//!   owner id as their `aid`.
//! - A lease is only as safe as its fencing: a holder paused for longer than
//!   the safety margin (GC, swapping) can act after its token fired. Check the
//!   fencing token at the resource.
//! - Fencing tokens after garbage collection assume the servers' clocks are not
//!   stepped back by more than the GC grace period. In
//!   [`ReleaseMode::Delete`] they assume that the server's `$$NOW` never
//!   steps back by [`DELETE_MIN_TOKEN_AGE`] (1 s) or more between a delete
//!   and the next acquisition (also across a failover: members' clocks
//!   synchronised within 1 s; see its docs), and that one key sees fewer
//!   than 2^20 acquisitions per millisecond.
//! - Kinds: shared leases, permits and `hold_at_least` need
//!   [`ReleaseMode::Keep`] and the lock collection (in-document leases are
//!   exclusive). The waiting mark of an exclusive waiter that died blocks
//!   new shared acquirers for up to that waiter's TTL.
//! - In-document leases: a `commit` or `update` whose reply is lost has an
//!   unknown outcome, like any MongoDB write ([`DocumentLease::commit`]);
//!   writes to the document by other code that ignores the lock field are
//!   not excluded.
//! - Fenced writes: [`Lease::with_transaction`] needs a replica set or a
//!   sharded cluster, and a [`Fence`] protects only documents that store
//!   the token, against writes that carry it (see each for its limits).
//!
//! # Metrics and health
//!
//! The library records metrics through the [`metrics`] crate facade and
//! depends on no exporter: install the recorder you like (for example
//! `metrics-exporter-prometheus`, as the CLI's `--http` does); without one,
//! recording costs next to nothing. Each event costs O(1); the renewal lag
//! and [`Health`] come from the heartbeat's own pass over the held leases.
//! The names are the `pub const`s of [`telemetry`]. Durations are in
//! seconds, as Prometheus does; gauges of several managers in one process
//! add up.
//!
//! | name | type | unit | labels | meaning |
//! |---|---|---|---|---|
//! | `mongo_lease_acquisitions_total` | counter | | `kind`, `outcome` | acquisitions asked for, by kind (`exclusive`, `shared`, `permit`) and how they ended (`acquired`, `not_acquired`: a try found the key held, `timed_out`: the caller stopped waiting, `failed`: an error) |
//! | `mongo_lease_acquire_wait_seconds` | histogram | s | `kind` | from the caller's request to the lease handed over |
//! | `mongo_lease_waiters` | gauge | | | acquisitions in progress: the local queues' depth |
//! | `mongo_lease_held_leases` | gauge | | | leases held |
//! | `mongo_lease_renewal_duration_seconds` | histogram | s | | round trip of one renewal batch |
//! | `mongo_lease_renewal_failures_total` | counter | | | renewal batches that failed (retried) |
//! | `mongo_lease_renewal_lag_seconds` | gauge | s | `owner_id` | at each heartbeat, the age of the oldest confirmed renewal among the held leases: about one heartbeat interval when all is well, a lease is lost when it reaches `ttl − safety_margin`; alert above twice the heartbeat interval |
//! | `mongo_lease_leases_ended_total` | counter | | `reason` | held leases that ended, by [`LossReason::as_str`]; alert on the involuntary ones (`expired`, `taken`, `deleted`, `force_released`) |
//! | `mongo_lease_change_stream_restarts_total` | counter | | `place` | change streams of writes reopened after a failure (`locks` or `documents`) |
//!
//! Tracing: each acquisition runs in an `acquire` span (key, kind, owner
//! id), and each held lease has a `lease` span (key, owner id, fencing
//! token) that the log lines about it (its end, its loss) are in; neither
//! allocates when no subscriber wants it.
//!
//! [`LeaseManager::health`] tells a liveness probe whether renewals are on
//! time, without a round trip and without the manager task (a starved task
//! reads unhealthy once a held lease's local deadline has passed): see
//! [`Health`] for the rule, after Kubernetes' leader-election
//! `HealthzAdaptor`, and what a probe should do with it.
//!
//! ```no_run
//! # async fn demo(manager: mongo_lease::LeaseManager) {
//! let health = manager.health();
//! let status = if health.is_healthy() { 200 } else { 503 };
//! println!("{status}: {} leases, oldest renewal {:?} ago", health.held_leases, health.oldest_renewal_age);
//! # }
//! ```
//!
//! # Map of the API
//!
//! Every public item is at the crate root, except the metrics' names
//! ([`telemetry`]), the markers of a request that waits or not
//! ([`request::Wait`], [`request::NoWait`]) and the features' modules
//! (`testkit`, `sim`).
//!
//! | concept | items |
//! |---|---|
//! | the manager | [`LeaseManager`], the cloneable handle (never touches MongoDB); [`LeaseManagerOptions`], [`ReleaseMode`] and the `DEFAULT_*` constants; [`Health`], what [`LeaseManager::health`] reads |
//! | keys and kinds | [`LeaseKey`] (any BSON type MongoDB accepts as `_id`); [`LeaseKind`] (exclusive, shared, or one permit of a semaphore: the rules between kinds) and [`MAX_PERMITS`] |
//! | requests | [`Acquire`] (the options of an acquisition: TTL, shared, permits, payload, holder, minimum and maximum hold), [`AcquireDocument`], [`OpenDocuments`], [`List`], [`ForceRelease`], [`ReleaseOwner`]: chained, then awaited |
//! | a held lease | [`Lease`]: key, owner, fencing token, payload, release; [`LeaseStatus`] (lost or held, why, its deadline, cancellation token and events), [`LossReason`], [`LeaseEvent`] and [`LeaseEvents`] |
//! | reading leases | [`LeaseInfo`] and [`HolderInfo`] (a key as read with server time), [`LeaseObserver`] |
//! | in-document leases | [`DocumentLeases`] (acquire a document's lease by its `_id`, optionally creating it; the schema), [`DocumentLease`] (the document, `update`, `commit`, `release`), [`DocumentUpdate`] |
//! | fenced writes | [`Lease::with_transaction`] (writes committed only while the lease is held) and [`Fence`] (a single-document write refused under a smaller token) |
//! | semaphores | [`Semaphore`]; the shared side of a read/write key is [`Acquire::shared`] |
//! | elections | [`Election`]: campaign, resign, the current leader ([`LeaderInfo`]), the candidates ([`Candidates`]), observe, `run_as_leader` |
//! | errors | [`Error`], [`Operation`] and [`Result`] |
//! | metrics | [`telemetry`]: the metrics' names (`mongo_lease_*`), recorded through the [`metrics`] facade |
//! | `testkit` (feature `testkit`) | throwaway real `mongod` replica sets for tests, no Docker |
//! | `sim` (feature `sim`) | deterministic simulation of the real manager over the in-memory twin |
//!
//! See `ARCHITECTURE.md` in the repository for the invariants and where each
//! is enforced.

#![deny(missing_docs)]

mod actor;
mod backoff;
mod caller;
mod config;
mod document;
mod document_update;
mod election;
mod error;
mod fence;
mod foreign;
mod health;
mod info;
mod key;
mod kind;
#[cfg(test)]
mod layers;
mod lease;
mod lease_group;
mod lock_id_fields;
mod manager;
mod random;
pub mod request;
mod semaphore;
#[cfg(feature = "sim")]
pub mod sim;
mod status;
mod store;
pub mod telemetry;
mod token;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use caller::CallerId;
pub use config::MAX_LOCK_DELAY;
pub use config::{
    DEFAULT_CLOCK_SKEW, DEFAULT_GC_GRACE, DEFAULT_HEARTBEAT_DIVISOR, DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_RELEASE_MODE, DEFAULT_RENEWAL_BATCH_SIZE, DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX,
    DEFAULT_SAFETY_MARGIN_DIVISOR, DEFAULT_TTL, DELETE_MIN_TOKEN_AGE, LeaseManagerOptions,
    MAX_CLOCK_SKEW, MAX_OWNER_ID_LEN, ReleaseMode,
};
pub use document::{DEFAULT_LEASE_FIELD, DocumentLease, DocumentLeases};
pub use document_update::DocumentUpdate;
pub use election::{Candidates, Election, LeaderContext, LeaderInfo, LeaderObserver, Leadership};
pub use error::{Error, Operation, Result};
pub use fence::Fence;
pub use foreign::{ForeignExpiry, ForeignLockRule};
pub use health::Health;
pub use info::{HolderInfo, LeaseInfo, WaitingOwner};
pub use key::{InvalidKey, LeaseKey, MAX_KEY_LEN};
pub use kind::{LeaseKind, MAX_PERMITS, PermitsChange};
pub use lease::{Lease, LeaseObserver, MAX_PAYLOAD_LEN};
pub use lease_group::LeaseGroup;
pub use lock_id_fields::LockIdFields;
pub use manager::LeaseManager;
pub use manager::operator::{ForceRelease, ReleaseOwner};
pub use request::{Acquire, AcquireDocument, List, OpenDocuments};
pub use semaphore::Semaphore;
pub use status::{
    LEASE_EVENTS_CAPACITY, LeaseEvent, LeaseEvents, LeaseStatus, LossReason, ReleaseOutcome,
};

/// The code examples of the README and of the guides in `docs/`, compiled
/// as doctests, so that they stay true to the API. A guide that gains a
/// Rust example is listed here.
#[cfg(doctest)]
pub mod doc_examples {
    #[doc = include_str!("../README.md")]
    pub struct Readme;
    #[doc = include_str!("../docs/kinds.md")]
    pub struct Kinds;
    #[doc = include_str!("../docs/sharing.md")]
    pub struct Sharing;
    #[doc = include_str!("../docs/in-document.md")]
    pub struct InDocument;
    #[doc = include_str!("../docs/fenced-writes.md")]
    pub struct FencedWrites;
    #[doc = include_str!("../docs/observability.md")]
    pub struct Observability;
    #[doc = include_str!("../docs/election.md")]
    pub struct Election;
    #[doc = include_str!("../docs/testing.md")]
    pub struct Testing;
    #[doc = include_str!("../docs/reentrancy.md")]
    pub struct Reentrancy;
    #[doc = include_str!("../docs/multi-key.md")]
    pub struct MultiKey;
    #[doc = include_str!("../docs/duration.md")]
    pub struct Duration;
}
