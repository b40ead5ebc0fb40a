//! [`StoreProfile`]: what a store is, as opposed to what it does. Fixed
//! when the store is made, read by the actor once, when it takes the store
//! on ([`Store::profile`](super::Store::profile)).

use std::sync::Arc;
use std::time::Duration;

use super::LockPlace;
use super::light_release::LightForms;
use crate::lock_id_fields::LockIdFields;

/// A store's fixed facts: where its locks live and the settings of its
/// protocol that the actor plans with. Plain data; the store itself holds
/// nothing that changes.
#[derive(Debug, Clone)]
pub(crate) struct StoreProfile {
    /// Where this store's locks live.
    pub place: Arc<LockPlace>,
    /// Which light forms this store has ("Light forms"): the actor tries
    /// [`Store::acquire_light`](super::Store::acquire_light)
    /// and [`Store::release_light`](super::Store::release_light) first only
    /// where the store has them.
    pub light_forms: LightForms,
    /// Whether a release removes the lock (the lock collection's
    /// [`ReleaseMode::Delete`](crate::ReleaseMode::Delete), and always for
    /// in-document leases, whose release removes the lock field): the actor
    /// then runs the follow-up delete ([`Release::ReleasedDocuments`](super::Release::ReleasedDocuments))
    /// for leases released less than [`DELETE_DELAY`](super::DELETE_DELAY)
    /// after their acquisition.
    pub removes_on_release: bool,
    /// How long this owner's registration in a key's queue lasts, `R` of
    /// "Queue of waiting owners" ([`registration_window`](super::registration_window)
    /// of the store's yield window, the manager's `retry_max`, and its
    /// safety margin); a lease handed to it lasts `min(ttl, R)`
    /// unconfirmed.
    pub registration_window: Duration,
    /// The most live entries a key's queue of waiting owners holds
    /// ("Bound" in "Queue of waiting owners"): a waiting attempt answered
    /// `Held` with at least this many `ahead` is not registered, and is
    /// neither handed the key nor finds it free before the queue drains.
    /// [`MAX_QUEUE`](super::MAX_QUEUE) but in the twin's tests.
    pub queue_bound: usize,
    /// The lock-delay that this store's force releases and releases by
    /// owner id write ("Lock-delay"); none for in-document leases. Read
    /// by the simulation (the store applies its own).
    #[cfg_attr(not(any(test, feature = "sim")), allow(dead_code))]
    pub lock_delay: Duration,
    /// The top-level `LockId` / `LockTime` fields this store keeps
    /// ([`Store::documents`](super::Store::documents)); no lease here may
    /// have a TTL over their `max_duration`.
    pub lock_id_fields: Option<Arc<LockIdFields>>,
    /// The TTL of the store contract's acquires and renewals: the manager's.
    #[cfg(test)]
    pub ttl: Duration,
}
