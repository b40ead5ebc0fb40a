//! Re-entry: a second acquisition of a key by the holder of a lease on it
//! (`Acquire::caller`, `Lease::reenter`) never waits on itself
//! (docs/reentrancy.md says what each one gets). A lease acquired for a
//! named holder keeps that holder (its `Binding`); one that arrives while
//! its holder's first acquisition still waits queues as any waiter, and is
//! answered as soon as that one is granted ([`Actor::held_by`]). Entries
//! are counted per held lease (`Binding::reentries`). Nothing of this is
//! stored in MongoDB.

use uuid::Uuid;

use super::Actor;
use super::command::{Granted, GrantedLease, PlacedKey, Waiter};
use super::mailbox::Mailbox;
use crate::caller::CallerId;
use crate::error::{Error, Result};

impl Actor {
    /// Answers `waiter` at once if its holder holds a lease on `key` here
    /// (re-entered, or refused); otherwise gives it back to be queued.
    pub(super) fn reenter_or_refuse(&mut self, key: &PlacedKey, waiter: Waiter) -> Option<Waiter> {
        let Some(holder) = waiter.holder else {
            return Some(waiter);
        };
        let held = self.keys.get(key).and_then(|state| {
            state.holders.iter().find(|h| {
                let binding = self.bindings.get(&h.lease_id);
                binding.is_some_and(|b| b.holder == Some(holder))
            })
        });
        let Some(held) = held else {
            return Some(waiter);
        };
        let reenters = waiter.reentrant && held.kind == waiter.shape.kind;
        let reply = self.enter(key, held.lease_id, reenters);
        let _ = waiter.respond_to.send(reply);
        None
    }

    /// Lease `lease_id` of `key` was just granted to `holder`: it keeps
    /// that holder, and the waiters of that holder behind it (which asked
    /// while it waited) are answered now, as if they had asked after the
    /// grant.
    pub(super) fn held_by(&mut self, key: &PlacedKey, lease_id: Uuid, holder: CallerId) {
        self.bindings.entry(lease_id).or_default().holder = Some(holder);
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let Some(kind) = state.holder(lease_id).map(|h| h.kind) else {
            return;
        };
        let (same, others) = std::mem::take(&mut state.waiters)
            .into_iter()
            .partition::<Vec<_>, _>(|w| w.holder == Some(holder));
        state.waiters = others.into();
        for waiter in same {
            let reenters = waiter.reentrant && waiter.shape.kind == kind;
            let reply = self.enter(key, lease_id, reenters);
            let _ = waiter.respond_to.send(reply);
        }
    }

    /// A new entry of the held lease `lease_id` of `key` if `reenters`,
    /// else [`Error::AlreadyHeld`]. A grant dropped unread releases its
    /// entry, as any grant does.
    fn enter(
        &mut self,
        key: &PlacedKey,
        lease_id: Uuid,
        reenters: bool,
    ) -> Result<Option<Granted>> {
        if !reenters {
            tracing::debug!(%key, "acquisition refused: its holder holds the key");
            return Err(Error::AlreadyHeld {
                key: key.key.clone(),
            });
        }
        let Some(mailbox) = self.sender.upgrade().map(Mailbox::new) else {
            return Err(Error::Shutdown);
        };
        let place = self.profile(key.place).place.clone();
        let owner_id = self.owner_id.clone();
        let held = self
            .keys
            .get(key)
            .and_then(|state| state.holder(lease_id))
            .expect("re-entry of a held lease");
        let binding = self.bindings.entry(lease_id).or_default();
        binding.reentries += 1;
        let entries = binding.reentries + 1;
        tracing::debug!(%key, token = held.token, entries, "lease re-entered");
        Ok(Some(Granted {
            lease: Some(GrantedLease {
                key: key.clone(),
                place,
                owner_id,
                lease_id,
                fencing_token: held.token,
                ttl: held.ttl,
                kind: held.kind,
                state: held.state.clone(),
                mailbox,
            }),
            document: None,
        }))
    }

    /// `Lease::reenter`: one more entry of `lease_id`, if still held (a
    /// lost lease's new entry is lost with it, and its release is answered
    /// as lost).
    pub(super) fn on_reenter(&mut self, key: &PlacedKey, lease_id: Uuid) {
        if self.held_lease(key, lease_id).is_some() {
            self.bindings.entry(lease_id).or_default().reentries += 1;
        }
    }

    /// Ends one entry of lease `lease_id` of `key` if it is not the last:
    /// `true` then, and the lease stays held. `false` for the last entry
    /// (the caller releases the lease) and for a lease no longer held.
    pub(super) fn leave_entry(&mut self, key: &PlacedKey, lease_id: Uuid) -> bool {
        if self.held_lease(key, lease_id).is_none() {
            return false;
        }
        let Some(binding) = self
            .bindings
            .get_mut(&lease_id)
            .filter(|binding| binding.reentries > 0)
        else {
            return false;
        };
        binding.reentries -= 1;
        true
    }
}
