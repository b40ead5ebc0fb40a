//! The payload of a held lease (`Lease::set_payload`): a write conditional
//! on its lease id, like a release; a write that misses marks the lease
//! lost.

use mongodb::bson::Document;
use uuid::Uuid;

use super::Actor;
use super::command::{PlacedKey, Reply};
use crate::error::{Error, Result};

impl Actor {
    pub(super) fn on_set_payload(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        payload: Document,
        respond_to: Reply<()>,
    ) {
        let Some(held) = self.held_lease(&key, lease_id) else {
            let _ = respond_to.send(Err(Error::LeaseLost { key: key.key }));
            return;
        };
        let write = self
            .store(key.place)
            .set_payload(held.lease_ref(&key.key), payload);
        self.spawn_store(write, move |actor, result| {
            actor.on_payload_set(key, lease_id, respond_to, result)
        });
    }

    pub(super) fn on_payload_set(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        respond_to: Reply<()>,
        result: Result<bool>,
    ) {
        if let Ok(false) = result {
            self.lose_found_gone(key.clone(), lease_id, "setting the payload");
        }
        let lost = Error::LeaseLost { key: key.key };
        let _ = respond_to.send(result.and_then(|set| set.then_some(()).ok_or(lost)));
    }
}
