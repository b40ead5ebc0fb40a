//! Cooperative revocation ("Revocation" in `store`): a request that the
//! holders of a key release it, announced by the change stream of writes,
//! reaches the followers of this manager's leases of that key as
//! [`LeaseEvent::RevocationRequested`](crate::LeaseEvent::RevocationRequested).
//! While a place has no stream open (merely holding leases opens none, see
//! `write_stream.rs`), the heartbeat reads the requests of the keys whose
//! leases someone follows and was not told yet (`Actor::poll_revocations`):
//! a request then arrives within one heartbeat interval.

use super::Actor;
use super::command::{Place, PlacedKey};
use super::write_stream::WriteStream;
use crate::error::Result;
use crate::key::LeaseKey;

impl Actor {
    /// The stream of writes of `place` opened: the requests written before
    /// it were not announced, so the keys held there are read for them
    /// (one read, only if a lease is held there).
    pub(super) fn read_revocations(&mut self, place: Place) {
        let held: Vec<LeaseKey> = self
            .keys
            .iter()
            .filter(|(target, state)| target.place == place && !state.holders.is_empty())
            .map(|(target, _)| target.key.clone())
            .collect();
        if held.is_empty() {
            return;
        }
        let read = self.store(place).revocations(held);
        self.spawn_store(read, move |actor, result| {
            actor.on_revocations(place, result)
        });
    }

    /// Heartbeat: for each place without a stream of writes it reads (the
    /// heartbeat has just closed those nothing needs, and resumed the
    /// others), reads
    /// the requests to release the keys held there whose leases someone
    /// follows and was not told of one yet (one read per place, none if
    /// there is no such key).
    pub(super) fn poll_revocations(&mut self) {
        for index in 0..self.places.len() {
            if matches!(
                self.places[index].write_stream,
                WriteStream::Open {
                    paused_at: None,
                    ..
                }
            ) {
                continue;
            }
            let place = Place(index as u16);
            let followed: Vec<LeaseKey> = self
                .keys
                .iter()
                .filter(|(target, state)| {
                    target.place == place
                        && state
                            .holders
                            .iter()
                            .any(|held| !held.revocation_told && held.state.is_followed())
                })
                .map(|(target, _)| target.key.clone())
                .collect();
            if followed.is_empty() {
                continue;
            }
            let read = self.store(place).revocations(followed);
            self.spawn_store(read, move |actor, result| {
                actor.on_revocations(place, result)
            });
        }
    }

    /// The requests [`Actor::read_revocations`] found (an error is dropped:
    /// the stream announces the requests from now on).
    pub(super) fn on_revocations(&mut self, place: Place, result: Result<Vec<(LeaseKey, String)>>) {
        for (key, by) in result.unwrap_or_default() {
            self.on_revoked(place, key, &by);
        }
    }

    /// The holders of `key` in `place` were asked to release it by owner id
    /// `by`: each of this manager's leases of the key tells its followers.
    pub(super) fn on_revoked(&mut self, place: Place, key: LeaseKey, by: &str) {
        let target = PlacedKey { place, key };
        let Some(state) = self.keys.get_mut(&target) else {
            return;
        };
        for held in &mut state.holders {
            tracing::debug!(key = %target.key, by, "release requested");
            held.state.revocation_requested(by);
            held.revocation_told |= held.state.is_followed();
        }
    }
}
