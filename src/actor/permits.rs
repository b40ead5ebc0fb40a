//! The change of a semaphore key's number of permits
//! (`Semaphore::set_permits`): one store write; once it is set, the permits
//! this manager holds on the key count as permits of the new number, so
//! that its own acquisitions asking for that number are not refused as
//! another kind.

use super::Actor;
use super::command::{Place, PlacedKey, Reply};
use crate::error::Result;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::PermitsChange;

impl Actor {
    pub(super) fn on_set_permits(
        &mut self,
        key: LeaseKey,
        permits: u32,
        respond_to: Reply<PermitsChange>,
    ) {
        let write = self.store(Place::LOCKS).set_permits(key.clone(), permits);
        self.spawn_store(write, move |actor, result| {
            actor.on_permits_set(key, permits, respond_to, result)
        });
    }

    pub(super) fn on_permits_set(
        &mut self,
        key: LeaseKey,
        permits: u32,
        respond_to: Reply<PermitsChange>,
        result: Result<PermitsChange>,
    ) {
        if let Ok(PermitsChange::Set) = result
            && let Some(state) = self.keys.get_mut(&PlacedKey::lock(key))
        {
            for held in state.holders.iter_mut() {
                if matches!(held.kind, LeaseKind::Permit { .. }) {
                    held.kind = LeaseKind::Permit { permits };
                }
            }
        }
        let _ = respond_to.send(result);
    }
}
