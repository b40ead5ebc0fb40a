//! The actor's side of the queue of waiting owners ("Queue of waiting
//! owners" in `store`): which keys this manager is registered for, the
//! handoff announced by the change stream of writes (`Standing::Handed`),
//! and the give-back of a key handed to a registration whose waiters all left.

use std::time::Duration;

use futures::FutureExt;

use tokio::time::Instant;
use tokio_util::time::delay_queue;
use uuid::Uuid;

use super::command::{Place, PlacedKey};
use super::key_state::Standing;
use super::write_stream::WriteStream;
use super::{AcquireSent, Actor, Attempt};
use crate::kind::LeaseKind;
use crate::store::{KeyWrite, LeaseRef, Release};

impl Actor {
    /// The key's state is about to be forgotten (nobody waits): if it was
    /// registered, a release may still hand it to that registration until
    /// it lapses, so its lease id is remembered that long
    /// ([`Actor::on_handoff`] gives such a key back at once). Returns the
    /// lease id to give back now if the handoff was already announced.
    pub(super) fn remember_registration(&mut self, key: &PlacedKey) -> Option<Uuid> {
        let state = self.keys.get(key).filter(|s| s.standing.is_registered())?;
        if state.standing == Standing::Handed {
            return Some(state.next_lease_id);
        }
        // The registration was written by an attempt that missed: under
        // the misses' lease id, which a transient error's give-back has
        // already replaced in `next_lease_id`.
        let lease_id = state
            .misses
            .as_ref()
            .map_or(state.next_lease_id, |m| m.lease_id);
        let lapses = Instant::now() + self.profile(key.place).registration_window;
        self.gave_up.insert(key.clone(), (lease_id, lapses));
        None
    }

    /// Whether a registered waiter of `place` can rely on the change stream
    /// of writes to learn of a handoff or a release (open, or opening: once
    /// open, every waiting key retries; or paused, to be read again, which
    /// announces the writes made meanwhile).
    pub(super) fn hears_handoffs(&self, place: Place) -> bool {
        matches!(
            self.places[usize::from(place.0)].write_stream,
            WriteStream::Open { .. }
        )
    }

    /// Heartbeat: forgets the registrations of keys nobody waits for any
    /// more once they have lapsed.
    pub(super) fn prune_gave_up(&mut self) {
        let now = Instant::now();
        self.gave_up.retain(|_, (_, lapses)| *lapses > now);
    }

    /// A write that makes this owner the holder of `key` under a lease id
    /// it did not acquire itself yet: a handoff to its registration. With
    /// waiters, the first one is granted the lease on the event when
    /// [`Actor::grant_handed`] can, else the key's attempt runs at once (no
    /// wake jitter: the key is ours, nobody races for it) and, under the
    /// same lease id, confirms the lease; without (they left), the handed
    /// lease is given back at once, which hands the key to the next
    /// registered owner. Returns whether the write was such a handoff.
    pub(super) fn on_handoff(&mut self, key: &PlacedKey, write: &KeyWrite) -> bool {
        let (Some(lease_id), Some(owner)) = (write.lease_id, write.owner.as_deref()) else {
            return false;
        };
        if write.freed || owner != &*self.owner_id {
            return false;
        }
        let Some(state) = self.keys.get_mut(key) else {
            return self.give_back_handed(key, lease_id);
        };
        if state.next_lease_id != lease_id {
            return false;
        }
        match &mut state.attempt {
            // Its answer may have been read before the handoff.
            Attempt::InFlight(meanwhile) => meanwhile.freed = true,
            Attempt::Scheduled { timer, .. } if state.standing.is_registered() => {
                let timer = *timer;
                if self.grant_handed(key, lease_id, write.token, timer) {
                    return true;
                }
                tracing::trace!(%key, "handed over by a release: confirming now");
                let state = self.keys.get_mut(key).expect("checked above");
                state.handed();
                self.timers.reset(&timer, Duration::ZERO);
            }
            _ => return false,
        }
        true
    }

    /// Grants the lease `lease_id` of `key`, which the change stream shows
    /// handed to this manager's registration with fencing `token`, to the
    /// first waiter on the event itself, without a confirming attempt: the
    /// handoff is majority-committed (change streams return only such
    /// writes), and its token, greater than the one the last registering
    /// attempt found, orders it after that attempt, so the handed lease
    /// lasts at least [`Misses::deadline`] locally, if that leaves its
    /// renewal time enough (ten round trips of that attempt's). The lease is renewed
    /// at once ([`Actor::check_held`]), which sets its expiry to its TTL
    /// and reports it lost if it was not ours any more. Returns `false`,
    /// changing nothing, when that cannot be told (no token shown, a token
    /// not greater, a deadline too close, a first waiter that is not a
    /// waiter a lease can be handed to (`Waiter::can_be_handed`), shutdown or `release_all` under way): the
    /// attempt confirms the lease then.
    ///
    /// [`Misses::deadline`]: super::key_state::Misses::deadline
    fn grant_handed(
        &mut self,
        key: &PlacedKey,
        lease_id: Uuid,
        token: Option<u64>,
        timer: delay_queue::Key,
    ) -> bool {
        let window = self.profile(key.place).registration_window;
        let timing = &self.timing;
        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        state.prune_waiters();
        let (Some(token), Some(waiter), Some(misses)) =
            (token, state.waiters.front(), state.misses.as_deref())
        else {
            return false;
        };
        let Some(deadline) = misses.deadline(
            lease_id,
            token,
            waiter.ttl,
            window,
            |ttl| timing.validity_for(ttl),
            Instant::now(),
        ) else {
            return false;
        };
        // A registration written with a payload hands the key with it: only
        // an attempt, which gives such a lease back, may take it for a
        // waiter without one.
        if !waiter.can_be_handed() || misses.payload.is_some() || self.closing.is_some() {
            return false;
        }
        let registered = misses.registered.expect("a deadline");
        let sent = AcquireSent {
            lease_id,
            sent_at: registered.sent_at,
            ttl: misses.shortest_ttl.min(window),
            shape: waiter.shape,
            waiting: true,
            payload: None,
            at_most: false,
        };
        tracing::debug!(%key, token, ?deadline, "handed over by a release: granted on the event");
        self.timers.remove(&timer);
        state.acquired_on_event();
        // No check on the grant: it is checked at once anyway, below.
        self.grant(key, sent, token, None, false);
        // Its expiry to its TTL now: the handoff wrote it only for `hx`.
        self.check_held([key.clone()].into_iter().collect());
        self.forget_if_idle(key);
        true
    }

    /// Gives back `lease_id` of `key` if it is the registration of a key
    /// whose waiters all left.
    fn give_back_handed(&mut self, key: &PlacedKey, lease_id: Uuid) -> bool {
        match self.gave_up.get(key) {
            Some((registered, _)) if *registered == lease_id => {
                self.gave_up.remove(key);
                tracing::debug!(%key, "handed a key nobody waits for any more: giving it back");
                self.give_back(key, lease_id, LeaseKind::Exclusive);
                true
            }
            _ => false,
        }
    }

    /// Shutdown: this manager stops waiting, so it leaves every queue of
    /// waiting owners it is registered in (`Store::leave_queues`), then,
    /// unless it left every one of them (a handoff removes the entry it
    /// hands the key to), releases what a release may have handed to those
    /// registrations meanwhile (a release under each registered lease id;
    /// also when leaving failed, as its outcome is unknown). Without it, a
    /// key handed to a stopped manager would stay held, unconfirmed, until
    /// the handed lease expires. Runs in `tasks`, so shutdown waits for it.
    pub(super) fn leave_queues_at_shutdown(&mut self) {
        let gave_up = self
            .gave_up
            .drain()
            .map(|(key, (lease_id, _))| (key, lease_id));
        let registered: Vec<LeaseRef> = self
            .keys
            .iter_mut()
            .filter(|(key, _)| key.place == Place::LOCKS)
            // Left once: a later call (an attempt in flight at the
            // beginning of shutdown registered) leaves only new ones.
            .filter_map(|(key, state)| {
                state
                    .leave_queue()
                    .then(|| (key.clone(), state.next_lease_id))
            })
            .chain(gave_up.filter(|(key, _)| key.place == Place::LOCKS))
            .map(|(key, lease_id)| LeaseRef {
                key: key.key,
                lease_id,
                kind: LeaseKind::Exclusive,
            })
            .collect();
        if registered.is_empty() {
            return;
        }
        let store = self.store(Place::LOCKS).clone();
        let leave = async move {
            let left = store
                .leave_queues(registered.iter().map(|l| l.key.clone()).collect())
                .await;
            if left.is_ok_and(|left| usize::try_from(left).is_ok_and(|l| l == registered.len())) {
                // Every entry was still there: a handoff removes the entry
                // it hands the key to, in the same write, so none happened.
                return Ok(0);
            }
            // Some entry was gone, or the outcome is unknown (an error
            // after the write may have applied): release under each lease
            // id, which changes nothing where this owner holds none. An
            // attempt whose outcome was unknown counts as registered, so
            // this also releases what it may have acquired.
            Ok(store.release(Release::Leases(registered)).await?.count)
        }
        .boxed();
        self.spawn_store(leave, |actor, result| {
            actor.on_released_many(Vec::new(), None, result)
        });
    }
}
