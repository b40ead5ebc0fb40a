//! What a read of a key shows: [`LeaseInfo`], [`HolderInfo`] and
//! [`WaitingOwner`].

use std::time::{Duration, SystemTime};

use mongodb::bson::Document;

use crate::key::LeaseKey;

/// What the lock collection says about one key, read with the server's
/// clock ([`LeaseManager::inspect`](crate::LeaseManager::inspect) and the
/// manager's other reads).
///
/// Every time is **server time** (MongoDB's `$$NOW`, millisecond precision):
/// compare them with [`LeaseInfo::server_time`], never with the local clock
/// ([`LeaseInfo::time_to_expiry`] and [`LeaseInfo::age`] do).
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
    /// released (or within its [`LeaseInfo::hold_until`]) and
    /// `expires_at > server_time`.
    pub held: bool,
    /// `true` if the key is held by a **foreign holder**: another
    /// application's lock document, not written by `mongo-lease`
    /// read by a rule (docs/sharing.md: the built-in rules and
    /// [`ForeignLockRule`](crate::ForeignLockRule)). It is never modified
    /// while its rule says `held` (only [`LeaseManager::force_release`]
    /// deletes it), and taken over once it does not. Then `held` is its
    /// rule's; `owner_id` is its rule's owner (else its `aid`; a non-string
    /// as canonical Extended JSON); `acquired_at` and `renewed_at` are its
    /// `ts` if a date, else `server_time`; `fencing_token` is 0;
    /// `expires_at` is its rule's expiry, `server_time` for a lock of none;
    /// no `payload`.
    ///
    /// [`LeaseManager::force_release`]: crate::LeaseManager::force_release
    pub foreign: bool,
    /// How the key is held ([`LeaseKind`](crate::LeaseKind)). For a shared
    /// or semaphore key the holders are in [`LeaseInfo::holders`], and the
    /// fields above describe the key: its latest acquisition, the latest
    /// expiry of its holders, whether any holder is live.
    pub kind: crate::kind::LeaseKind,
    /// The live holders of a shared or semaphore key (at
    /// [`LeaseInfo::server_time`]), oldest acquisition first; empty for an
    /// exclusive key.
    pub holders: Vec<HolderInfo>,
    /// While the key's minimum hold lasts
    /// ([`Acquire::hold_at_least`](crate::Acquire::hold_at_least)), before
    /// or after its release: the server time until which no acquisition can
    /// take it (`hl`).
    pub hold_until: Option<SystemTime>,
    /// While a lock-delay lasts (docs/lock-delay.md): the server time until
    /// which no acquisition of any kind can take the key, after an
    /// operator's force release or release by owner id ended a lease in it
    /// (`nb`); `None` without one, or once past.
    pub lock_delay_until: Option<SystemTime>,
    /// The owners (managers) waiting for the key at
    /// [`LeaseInfo::server_time`], first to be served first ([`WaitingOwner`]
    /// says who appears).
    pub waiters: Vec<WaitingOwner>,
    /// Leader transitions, as the Kubernetes Lease's `leaseTransitions`:
    /// how many acquisitions took the key from another owner id than the
    /// previous acquisition's, since its lock document was created (0 for a
    /// foreign holder's lock).
    pub transitions: u64,
    /// An exclusive lease of our layout whose lease id (`lid`) is gone: a
    /// release (an expiry keeps it). Tells a lost lease's reason
    /// (`actor::loss::judge`).
    pub(crate) released: bool,
}

/// One holder of a shared or semaphore key ([`LeaseInfo::holders`]). Times
/// are the server's.
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

/// A *waiting owner*: another manager (process) waiting for a key
/// ([`LeaseInfo::waiters`]), one entry per manager. Times are the server's.
///
/// A manager whose waiting exclusive acquisition found the key held by
/// another owner registers in the key's queue, served in that order, for
/// about `2 * retry_max + 1 s + safety_margin`, refreshed while it waits;
/// one waiting for shared holders leaves a waiting mark instead
/// (`registered_at` is `None`). A try, a waiter for a shared lease or a
/// permit, the holder's own manager and in-document leases never appear.
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
    /// renewed, by the server's clock; zero if it is not held,
    /// [`Duration::MAX`] for a foreign holder's lock of unknown expiry.
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
