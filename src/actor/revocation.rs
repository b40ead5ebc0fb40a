//! Cooperative revocation ("Revocation" in `store`): a request that the
//! holders of a key release it, announced by the change stream of writes,
//! reaches the followers of this manager's leases of that key as
//! [`LeaseEvent::RevocationRequested`](crate::LeaseEvent::RevocationRequested).

use super::command::{Place, Target};
use super::{Actor, Event};
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
        self.spawn_store(read, move |result| Event::Revocations { place, result });
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
        let target = Target { place, key };
        let Some(state) = self.keys.get(&target) else {
            return;
        };
        for held in &state.holders {
            tracing::debug!(key = %target.key, by, "release requested");
            held.state.revocation_requested(by);
        }
    }
}
