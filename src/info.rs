//! What a read of a key shows, as data: [`LeaseInfo`] (the key, with
//! the server's times), [`HolderInfo`] (one holder of a shared or
//! semaphore key) and [`WaitingOwner`] (a manager waiting for the key). The store builds them from lock documents; the handles
//! hand them to callers.

use std::time::{Duration, SystemTime};

use mongodb::bson::Document;

use crate::key::LeaseKey;

/// What the lock collection says about one key, read with the server's
/// clock: returned by [`LeaseManager::inspect`], [`LeaseManager::list`] and
/// [`LeaseManager::observe`].
///
/// Every time is **server time** (MongoDB's `$$NOW`, millisecond precision),
/// as a [`SystemTime`]; compare them with [`LeaseInfo::server_time`], never
/// with the local clock. [`LeaseInfo::time_to_expiry`] and [`LeaseInfo::age`]
/// do that for you.
///
/// [`LeaseManager::inspect`]: crate::LeaseManager::inspect
/// [`LeaseManager::list`]: crate::LeaseManager::list
/// [`LeaseManager::observe`]: crate::LeaseManager::observe
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The lease key (`_id`).
    pub key: LeaseKey,
    /// Owner id of the manager that holds, or last held, the lease (`aid`).
    pub owner_id: String,
    /// Fencing token of the current (or last) acquisition (`tok`).
    pub fencing_token: u64,
    /// Server time of the acquisition (`acq`).
    pub acquired_at: SystemTime,
    /// Server time of the last renewal, or of the acquisition (`ts`).
    pub renewed_at: SystemTime,
    /// Server time at which the lease expires, or expired (`exp`); the
    /// release time for a released lease.
    pub expires_at: SystemTime,
    /// The server's `$$NOW` when this state was read, or the server's wall
    /// clock time of the write that produced it (for a state observed through
    /// a change stream).
    pub server_time: SystemTime,
    /// The payload set by the holder with [`Lease::set_payload`](crate::Lease::set_payload) (`data`).
    pub payload: Option<Document>,
    /// `true` if the lease was held at [`LeaseInfo::server_time`]: not
    /// released (or released before its minimum hold,
    /// [`LeaseInfo::hold_until`]) and `expires_at > server_time`. For a foreign
    /// holder's lock ([`LeaseInfo::foreign`]): until its expiry by its own
    /// rule, or always if it has none.
    pub held: bool,
    /// `true` if the key is held by a **foreign holder**: its document was
    /// not written by `mongo-lease` (it has no int64 `tok` or no date `exp`),
    /// another application's lock document (docs/sharing.md lists the
    /// layouts recognised, each with its owner field and expiry rule:
    /// `{_id, ts, aid}`, `{_id, value, ttl, obtained_at}`, `{_id, ExpireAt}`,
    /// a bare `{_id}`, and
    /// [`LeaseManagerOptions::foreign_lock`](crate::LeaseManagerOptions::foreign_lock)).
    /// `mongo-lease` never modifies it while it is live by its own rule (only
    /// [`LeaseManager::force_release`] deletes it); an acquisition takes it
    /// over once it has expired by that rule. The other fields then mean:
    ///
    /// - `owner_id`: its owner field (`aid`, `value`, ...; `aid` for a
    ///   document of no recognised layout) if a string; another BSON type as
    ///   canonical Extended JSON; empty if it has none;
    /// - `acquired_at` and `renewed_at`: the date its expiry counts from
    ///   (`ts`, `obtained_at`), else its `ts` if a date, else `server_time`;
    /// - `fencing_token`: 0, not a fence issued by `mongo-lease` (a `tok` it
    ///   carries, as one left by a lease of ours it took over in place, is
    ///   not its own);
    /// - `expires_at`: its expiry by its own rule; for a lock without one
    ///   (a bare `{_id}`, `{_id, ts, aid}` without a TTL index on `ts`, a
    ///   document of no recognised layout) unknown, so `server_time`, and
    ///   [`LeaseInfo::time_to_expiry`] is [`Duration::MAX`];
    /// - `payload`: `None` (its fields are not interpreted);
    /// - `held`: `true` until its expiry (always without one).
    ///
    /// [`LeaseManager::force_release`]: crate::LeaseManager::force_release
    pub foreign: bool,
    /// How the key is held ([`LeaseKind`](crate::LeaseKind)): exclusively
    /// (the fields above describe the holder), shared or as permits of a
    /// semaphore (the holders are in [`LeaseInfo::holders`]; the fields
    /// above then describe the key: `owner_id` and `fencing_token` of its
    /// latest acquisition, `expires_at` the latest expiry of its holders,
    /// `held` whether any holder is live). [`LeaseKind::Exclusive`](crate::LeaseKind::Exclusive)
    /// for a foreign holder's lock.
    pub kind: crate::kind::LeaseKind,
    /// The live holders of a shared or semaphore key (at
    /// [`LeaseInfo::server_time`]), oldest acquisition first; empty for an
    /// exclusive key.
    pub holders: Vec<HolderInfo>,
    /// Set while the key's minimum hold lasts (it was acquired with
    /// [`Acquire::hold_at_least`](crate::Acquire::hold_at_least)),
    /// before or after its release: the server time until which no
    /// acquisition can take it (`hl`).
    /// `None` once that time has passed, or without `hold_at_least`.
    pub hold_until: Option<SystemTime>,
    /// The owners (managers) waiting for the key at
    /// [`LeaseInfo::server_time`], first to be served first: the live
    /// entries of the key's queue of waiting owners (`q`), then an exclusive
    /// waiter's live mark on a shared key (`xw`). Read-only: see
    /// [`WaitingOwner`] for who appears. Empty for a foreign holder's lock.
    pub waiters: Vec<WaitingOwner>,
    /// Leader transitions, as the Kubernetes Lease's `leaseTransitions`:
    /// how many acquisitions took the key from another owner id than the
    /// key's previous acquisition's, since its lock document was created
    /// (0 for its first holder). The same owner taking it again (after its
    /// release or expiry, or another local caller of the same manager) is
    /// no transition; every kind counts. It starts again from 0 if the
    /// document is deleted (by the TTL index after the GC grace, or by a
    /// release in [`ReleaseMode::Delete`](crate::ReleaseMode::Delete)).
    /// 0 for a foreign holder's lock, and for a document last acquired by
    /// a version that did not count them.
    pub transitions: u64,
    /// An exclusive lease of our layout whose lease id (`lid`) is gone: a
    /// release (an expiry keeps it). Tells a lost lease's reason
    /// (`actor::loss::judge`).
    pub(crate) released: bool,
}

/// One holder of a shared or semaphore key, as read by
/// [`LeaseManager::inspect`](crate::LeaseManager::inspect) and
/// [`LeaseManager::list`](crate::LeaseManager::list) ([`LeaseInfo::holders`]).
/// Times are the server's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// Owner id of the manager that holds it.
    pub owner_id: String,
    /// Its fencing token.
    pub fencing_token: u64,
    /// Server time of its acquisition.
    pub acquired_at: SystemTime,
    /// Server time of its last renewal (or of its acquisition).
    pub renewed_at: SystemTime,
    /// Server time at which it expires unless renewed.
    pub expires_at: SystemTime,
    /// How many permits of a semaphore key it takes
    /// ([`Acquire::permits`](crate::Acquire::permits));
    /// 1 for a shared holder.
    pub permits: u32,
}

/// A *waiting owner*: another manager (process) waiting for a key, as
/// read by [`LeaseManager::inspect`](crate::LeaseManager::inspect),
/// [`LeaseManager::list`](crate::LeaseManager::list) and
/// [`LeaseManager::observe`](crate::LeaseManager::observe)
/// ([`LeaseInfo::waiters`]). Times are the server's.
///
/// Only what the key's document records appears, one entry per manager
/// (never per task: a manager's own waiters queue in the manager):
///
/// - a manager whose waiting exclusive acquisition found the key held by
///   another owner (or another owner ahead in the queue) registers in the
///   key's queue of waiting owners, in the same write, and is served in that
///   order ([`registered_at`](WaitingOwner::registered_at) is set); its
///   entry lasts its registration window (about `2 * retry_max + 1 s +
///   safety_margin`), refreshed while it keeps waiting, so a waiter that
///   died stays listed until then;
/// - an exclusive acquisition waiting for shared holders leaves a waiting
///   mark instead (the last one; `registered_at` is `None`), live for the
///   waiter's TTL;
/// - a [`try_acquire`](crate::LeaseManager::try_acquire), a waiter for a
///   shared lease or a permit, and the holder's own manager do not
///   register, and in-document leases have no queue: they never appear.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitingOwner {
    /// Owner id of the waiting manager.
    pub owner_id: String,
    /// The kind of lease it waits for (every waiter that registers waits for
    /// an exclusive lease).
    pub kind: crate::kind::LeaseKind,
    /// Server time of its first registration in the queue (its place in
    /// line); `None` for an exclusive waiter's mark on a shared key.
    pub registered_at: Option<SystemTime>,
    /// Server time at which its entry lapses unless it tries again.
    pub expires_at: SystemTime,
}

impl LeaseInfo {
    /// How long the lease stays valid after [`LeaseInfo::server_time`] unless
    /// renewed, by the server's clock; zero if it is not held.
    /// [`Duration::MAX`] for a held foreign holder's lock ([`LeaseInfo::foreign`])
    /// whose expiry is unknown: it lasts until its owner or a TTL index
    /// deletes it.
    pub fn time_to_expiry(&self) -> Duration {
        if !self.held {
            return Duration::ZERO;
        }
        if self.foreign && self.expires_at <= self.server_time {
            return Duration::MAX;
        }
        self.expires_at
            .duration_since(self.server_time)
            .unwrap_or(Duration::ZERO)
    }

    /// How long the current (or last) acquisition had lasted at
    /// [`LeaseInfo::server_time`], by the server's clock.
    pub fn age(&self) -> Duration {
        self.server_time
            .duration_since(self.acquired_at)
            .unwrap_or(Duration::ZERO)
    }

    /// How long ago (at [`LeaseInfo::server_time`]) the lease was last renewed
    /// or acquired, by the server's clock.
    pub fn since_renewal(&self) -> Duration {
        self.server_time
            .duration_since(self.renewed_at)
            .unwrap_or(Duration::ZERO)
    }
}
