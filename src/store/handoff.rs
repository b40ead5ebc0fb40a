//! The handoff to a local waiter, as the [`Store`](super::Store) trait
//! speaks it (the rule is "Handoff to a local waiter" in the `store` module
//! docs): [`Handoff`], the request with the form the actor chose, and
//! [`HandoffOutcome`], its answer.

use std::time::Duration;

use uuid::Uuid;

use crate::key::LeaseKey;

/// A handoff of the plain lease `from` of `key` to a local
/// waiter's acquisition `to` ([`Store::handoff`](super::Store::handoff)),
/// in the form the actor chose.
#[derive(Debug, Clone)]
pub(crate) struct Handoff {
    pub key: LeaseKey,
    /// The releasing lease, of this owner.
    pub from: Uuid,
    /// The waiter's acquisition, a plain lease expiring `ttl`
    /// after the server's now.
    pub to: Uuid,
    pub ttl: Duration,
    /// The light form ("Light forms"), sent only
    /// where the store has it
    /// ([`StoreProfile::light_forms`](super::StoreProfile::light_forms))
    /// and the key was not contended lately: it hands the key over or
    /// writes nothing ([`HandoffOutcome::NotApplied`]), and the actor then
    /// sends the general form, which decides.
    pub light: bool,
}

/// What a handoff to a local waiter did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffOutcome {
    /// The waiter's lease (`to`) holds the key, with this fencing token.
    Acquired { token: u64 },
    /// Released as a release would: another owner waits (the key is
    /// yielded, or handed to the first registered owner), or a minimum hold
    /// is live.
    Released,
    /// The lease `from` was no longer held (taken over, or expired by the
    /// server's clock): nothing was written.
    Lost,
    /// The light form did not apply (also after an unknown outcome that a
    /// re-read found `from` still holding the key): nothing was written;
    /// the general form decides.
    NotApplied,
}
