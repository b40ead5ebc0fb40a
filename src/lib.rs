#![doc = include_str!("../README.md")]
//!
//! # Where each topic is documented
//!
//! Keys of any BSON type: [`LeaseKey`]. The rules between kinds:
//! [`LeaseKind`]. Following a lease (its lost-lease token, why it ended, its
//! events): [`LeaseStatus`]. In-document leases and their schema:
//! [`DocumentLeases`]. Every guarantee, what it assumes and how it is
//! checked: `docs/safety.md`. Metrics, tracing and health: [`telemetry`]
//! and [`Health`].
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
pub use foreign::ForeignLockRule;
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
