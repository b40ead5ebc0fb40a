//! In-document leases: opening the place of a user collection (one store
//! per collection and lock field, kept for the manager's life), and writing
//! a held document under its lease (`DocumentLease::update`, and `commit`,
//! which also releases it in the same write).

use mongodb::bson::Document;
use std::sync::Arc;
use tokio::time::Instant;
use uuid::Uuid;

use super::command::{Place, PlacedKey, Reply};
use super::release::Holding;
use super::{Actor, PlaceState};
use crate::error::{Error, Result};
use crate::kind::LeaseKind;
use crate::lock_id_fields::LockIdFields;
use crate::status::LossReason;
use crate::store::DocumentWrite;

/// Most places of in-document leases one manager opens (the lock
/// collection is one more).
const MAX_DOCUMENT_PLACES: usize = 1_000;

impl Actor {
    /// [`Command::OpenDocuments`](super::command::Command::OpenDocuments):
    /// answers with the place [`Actor::open_documents`] finds or opens.
    pub(super) fn on_open_documents(
        &mut self,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<LockIdFields>>,
        respond_to: Reply<Place>,
    ) {
        let _ = respond_to.send(self.open_documents(collection, field, lock_id));
    }

    /// The place of in-document leases on `collection` with the lock fields
    /// under `field` (and `LockId` / `LockTime` at the top with `lock_id`):
    /// the one opened before, or a new one. A place opened before with
    /// other top-level fields is refused.
    pub(super) fn open_documents(
        &mut self,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<LockIdFields>>,
    ) -> Result<Place> {
        if let Some(index) = self.places.iter().position(|p| {
            p.profile.place.field.as_deref() == Some(field)
                && p.profile.place.collection == collection
        }) {
            let opened = self.places[index].profile.lock_id_fields.clone();
            if opened.as_deref() != lock_id.as_deref() {
                return Err(Error::InvalidConfig {
                    reason: format!(
                        "in-document leases on {collection:?} under {field:?} are already \
                         open with other LockId / LockTime fields ({opened:?}): every handle \
                         on one collection must use the same fields"
                    ),
                });
            }
            return Ok(Place(index as u16));
        }
        if collection == self.profile(Place::LOCKS).place.collection {
            // Its documents are lock documents: a user's document there would
            // be a foreign holder's lock to the lock-collection leases.
            return Err(Error::InvalidConfig {
                reason: format!(
                    "{collection:?} is the lock collection: in-document leases need a \
                     collection of their own"
                ),
            });
        }
        if self.places.len() > MAX_DOCUMENT_PLACES {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "one manager serves in-document leases on at most {MAX_DOCUMENT_PLACES} \
                     collections and lock fields"
                ),
            });
        }
        let store = self
            .store(Place::LOCKS)
            .documents(collection, field, lock_id)?;
        let place = Place(self.places.len() as u16);
        self.places.push(PlaceState::new(store));
        tracing::debug!(
            collection,
            field,
            place = place.0,
            "in-document leases opened"
        );
        Ok(place)
    }

    pub(super) fn on_write_document(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        mut write: DocumentWrite,
        respond_to: Reply<Document>,
    ) {
        let Some(held) = self.held_lease(&key, lease_id) else {
            let _ = respond_to.send(Err(Error::LeaseLost { key: key.key }));
            return;
        };
        let (token, acquired_at, lease) = (held.token, held.acquired_at, held.lease_ref(&key.key));
        write.too_young_to_delete = acquired_at + crate::store::DELETE_DELAY > Instant::now();
        let release = write.release;
        let mut follow_up = None;
        if release {
            // Delete mode's follow-up of a commit, scheduled once it is confirmed.
            follow_up = self.follow_up_due(key.place, acquired_at);
            // Like a release: no acquire attempt of the key starts until the
            // write is answered, and the lease is no longer renewed.
            self.take_held(&key, lease_id, LossReason::Released);
            if let Some(state) = self.keys.get_mut(&key) {
                state.releases_in_flight += 1;
            }
        }
        let operation = self.store(key.place).write_document(lease, token, write);
        self.spawn_store(operation, move |actor, result| {
            actor.on_document_written(key, lease_id, (release, follow_up), respond_to, result)
        });
    }

    pub(super) fn on_document_written(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        (release, follow_up): (bool, Option<Instant>),
        respond_to: Reply<Document>,
        result: Result<Option<Document>>,
    ) {
        if release && let Some(state) = self.keys.get_mut(&key) {
            state.releases_in_flight -= 1;
        }
        let reply = match result {
            Ok(Some(document)) => {
                if let Some(at) = follow_up {
                    self.schedule_follow_up(key.place, vec![key.key.clone()], at);
                }
                Ok(document)
            }
            Ok(None) => {
                self.lose_found_gone(key.clone(), lease_id, "a write under the lease");
                Err(Error::LeaseLost {
                    key: key.key.clone(),
                })
            }
            Err(error) => {
                if release {
                    // The write's outcome is unknown: release under the
                    // lease id (a no-op if the commit did land), then the
                    // commit's follow-up, due at acquisition +
                    // `DELETE_DELAY` (not `spawn_release`, which would time
                    // it from now).
                    tracing::warn!(%key, %error, "commit failed; releasing the lease");
                    let _ = respond_to.send(Err(error));
                    if let Some(state) = self.keys.get_mut(&key) {
                        state.releases_in_flight += 1;
                    }
                    let lease = self.lease_ref(&key, lease_id, LeaseKind::Exclusive);
                    self.send_release(key, lease, Holding::NotKnown, None, follow_up);
                    return;
                }
                Err(error)
            }
        };
        let _ = respond_to.send(reply);
        self.serve_next(&key);
    }
}
