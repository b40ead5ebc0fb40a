//! What a release ends, and what it did: [`Release`], the selection the
//! caller chose ([`Store::release`](super::Store::release)), and
//! [`Released`], its answer. One verb for every release, one wire form per
//! selection; the caller (the actor, or the manager for an operator's
//! override) is the one place that chooses it, and schedules the later
//! delete of delete mode: the store never waits.

use super::{LeaseRef, OverrideEnd};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;

/// What a release ends. Every selection but the operator's overrides
/// matches a lease by its lease id and this owner id ("Late writes" in
/// `store`: a late one matches nothing).
#[derive(Debug, Clone)]
pub(crate) enum Release {
    /// These leases of this manager, by the general form (only those
    /// still held under their lease id); in delete mode the documents whose
    /// token is old enough are deleted, the others marked released.
    /// [`Released::count`]: how many were still held.
    Leases(Vec<LeaseRef>),
    /// One lease of this manager acquired less than
    /// [`DELETE_DELAY`](super::DELETE_DELAY) ago (by the caller's clock,
    /// from the acquire's reply), in a store that removes on release: its
    /// token is too young for delete mode's delete, so a store may skip
    /// that delete and only mark the lease released, leaving the document
    /// to the follow-up delete ([`Release::ReleasedDocuments`]; see
    /// "Delete-on-release mode"). Both outcomes are the protocol's; a store
    /// without the shortcut releases it as [`Release::Leases`] does.
    LeaseTooYoungToDelete(LeaseRef),
    /// Delete mode's follow-up to a release of leases too young to delete:
    /// the released documents of these keys (no lease id, not yielded)
    /// whose token is at least
    /// [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) old by the
    /// server's clock are deleted. A document acquired again meanwhile is
    /// never deleted. [`Released::count`]: how many; nothing in keep
    /// mode.
    ReleasedDocuments(Vec<LeaseKey>),
    /// Delete mode's follow-up to [`Release::OwnerLeases`]: as
    /// [`Release::ReleasedDocuments`], for the released documents of
    /// owner id `owner`.
    ReleasedDocumentsOf(String),
    /// An operator's override: every lease document of `owner` (any
    /// manager's) that is not released yet, of our layout only.
    /// [`Released::count`]: how many. In delete mode, documents it could
    /// only mark released are left to the follow-up delete
    /// ([`Released::follow_up_due`]). A live lease it ends keeps its key
    /// until `end` says ("Lock-delay").
    OwnerLeases { owner: String, end: OverrideEnd },
    /// An operator's override: `key`, whoever holds it. As a release, `exp`
    /// moves to now and `lid` is removed; every holder of a shared or
    /// semaphore key, a minimum hold (`hl`) and an exclusive waiter's mark
    /// go too. A foreign holder's lock is deleted instead, only if it is
    /// still the document read (same `aid` and `ts`). [`Released::was`]:
    /// the lease as it was, if it was held. The key stays unavailable until
    /// `end` says ("Lock-delay"); with [`OverrideEnd::Immediately`] a key
    /// that an earlier override left waiting (`nb` ahead, no lease) is
    /// freed after the lock-delay too.
    ForcedKey { key: LeaseKey, end: OverrideEnd },
}

/// What a [`Release`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Released {
    /// How many leases it ended (lease documents for
    /// [`Release::OwnerLeases`], documents deleted for
    /// [`Release::ReleasedDocuments`]).
    pub count: u64,
    /// [`Release::ForcedKey`]: the lease as it was, if it was held (a
    /// foreign holder's lock it deleted included).
    pub was: Option<LeaseInfo>,
    /// [`Release::OwnerLeases`] in delete mode: it left documents marked
    /// released (their token too young to delete, or their key kept until
    /// a lock-delay or a lease's expiry), which the caller deletes with
    /// [`Release::ReleasedDocumentsOf`] [`DELETE_DELAY`](super::DELETE_DELAY)
    /// later, once their token is old enough.
    pub follow_up_due: bool,
}

impl Released {
    /// `count` leases ended.
    pub(crate) fn count(count: u64) -> Self {
        Released {
            count,
            ..Default::default()
        }
    }
}
