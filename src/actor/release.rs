//! Releasing: one lease (explicit, dropped, or after a lost deadline),
//! `release_all` by lease id, the leases an operator's force release ended,
//! a lease given back at once, and the light release (`group_commit`).

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;
use uuid::Uuid;

use std::collections::BTreeMap;

use super::command::{Place, PlacedKey, Reply};
use super::group_commit::PendingRelease;
use super::{Actor, KeyState};
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::status::LossReason;
use crate::status::ReleaseOutcome;
use crate::store::light_release::LightRelease;
use crate::store::{DELETE_DELAY, LeaseRef, Release};

impl Actor {
    pub(super) fn on_release(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        if self.leave_entry(&key, lease_id) {
            if let Some(respond_to) = respond_to {
                let _ = respond_to.send(Ok(ReleaseOutcome::StillHeld));
            }
            return;
        }
        let Some(held) = self.take_held(&key, lease_id, LossReason::Released) else {
            // Already lost (its token has fired) or already released by the manager.
            if let Some(respond_to) = respond_to {
                let _ = respond_to.send(Ok(ReleaseOutcome::AlreadyLost));
            }
            return;
        };
        tracing::debug!(%key, token = held.token, "releasing lease");
        if self.can_handoff(&key, &held) {
            self.spawn_handoff(key, held.lease_id, held.acquired_at, respond_to);
            return;
        }
        if held.kind.is_multi_holder() {
            // A place freed on a shared or semaphore key by this very
            // manager: its waiter's next attempt starts once the release is
            // confirmed (`on_released`), not at its backoff (no change
            // stream may tell it).
            let state = self.keys.get_mut(&key).expect("held above");
            if let Some(timer) = state.unschedule() {
                self.timers.remove(&timer);
            }
        }
        self.spawn_release(key, held.lease_id, held.kind, held.acquired_at, respond_to);
    }

    /// Releases every lease this manager holds, by lease id, in each place
    /// (the lock collection, each user collection of in-document leases).
    /// Never by owner id: such a write, given up by its caller and landing
    /// later, would end leases acquired after it ("Late writes" in
    /// `store`), while one by lease id then matches nothing.
    pub(super) fn on_release_all(&mut self, respond_to: Reply<u64>) {
        self.delete_young_held_when_old_enough();
        let held = self.held_by_place();
        let keys = self.take_all_held(LossReason::Released);
        let mut releases = Vec::new();
        // In batches, as shutdown does: one command per batch keeps each
        // `$in` list within the renewal batch size.
        for (place, leases) in held {
            for batch in leases.chunks(self.timing.renewal_batch_size) {
                releases.push(self.store(place).release(Release::Leases(batch.to_vec())));
            }
        }
        // Every place's release runs to its end even if another fails (a
        // `try_join_all` would drop the others unsent or half-way); the
        // first error is the reply.
        let release = async move {
            let mut released = 0;
            for result in futures::future::join_all(releases).await {
                released += result?.count;
            }
            Ok(released)
        }
        .boxed();
        self.spawn_store(release, |actor, result| {
            actor.on_released_many(keys, Some(respond_to), result)
        });
    }

    /// Gives back `lease_id` of `key`, which nobody holds locally, at once.
    pub(super) fn give_back(&mut self, key: &PlacedKey, lease_id: Uuid, kind: LeaseKind) {
        let follow_up = self.follow_up_due(key.place, Instant::now());
        self.count_release(key);
        let lease = self.lease_ref(key, lease_id, kind);
        self.send_release(key.clone(), lease, Holding::NotKnown, None, follow_up);
    }

    /// Releases one lease this manager held, whose acquire's reply arrived
    /// at `acquired_at` (local clock; see `Held::acquired_at`).
    pub(super) fn spawn_release(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        kind: LeaseKind,
        acquired_at: Instant,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        let follow_up = self.follow_up_due(key.place, acquired_at);
        self.count_release(&key);
        let lease = self.lease_ref(&key, lease_id, kind);
        self.send_release(key, lease, Holding::Held, respond_to, follow_up);
    }

    /// Counts a release of `key` in flight (`KeyState::releases_in_flight`).
    pub(super) fn count_release(&mut self, key: &PlacedKey) {
        self.keys
            .entry(key.clone())
            .or_insert_with(|| Box::new(KeyState::new()))
            .releases_in_flight += 1;
    }

    /// The store's reference to `lease_id` of `key`.
    pub(super) fn lease_ref(&self, key: &PlacedKey, lease_id: Uuid, kind: LeaseKind) -> LeaseRef {
        LeaseRef {
            key: key.key.clone(),
            lease_id,
            kind,
        }
    }

    /// Sends the release of one lease to its place's store; the outcome
    /// comes back to [`Actor::on_released`], which schedules `follow_up` (delete
    /// mode's follow-up delete, due then) once the release is confirmed. The
    /// caller counts it in `releases_in_flight`.
    pub(super) fn send_release(
        &mut self,
        key: PlacedKey,
        lease: LeaseRef,
        holding: Holding,
        respond_to: Option<Reply<ReleaseOutcome>>,
        follow_up: Option<Instant>,
    ) {
        // A follow-up is due: the lease is too young for delete mode's delete.
        let too_young_to_delete = follow_up.is_some();
        if self.tries_light_release(&key, &lease, holding, too_young_to_delete) {
            self.submit_light_release(PendingRelease {
                key,
                lease,
                respond_to,
                follow_up,
            });
            return;
        }
        let release = self.general_release(key.place, lease, too_young_to_delete);
        self.spawn_store(release, move |actor, result| {
            actor.on_released(key, respond_to, follow_up, result)
        });
    }

    /// The general release of `lease` of `place` (`too_young_to_delete`:
    /// acquired too lately for delete mode's delete to match it); how many
    /// leases it ended.
    pub(super) fn general_release(
        &self,
        place: Place,
        lease: LeaseRef,
        too_young_to_delete: bool,
    ) -> BoxFuture<'static, Result<u64>> {
        let release = self.store(place).release(match too_young_to_delete {
            true => Release::LeaseTooYoungToDelete(lease),
            false => Release::Leases(vec![lease]),
        });
        async move { Ok(release.await?.count) }.boxed()
    }

    pub(super) fn on_released(
        &mut self,
        key: PlacedKey,
        respond_to: Option<Reply<ReleaseOutcome>>,
        follow_up: Option<Instant>,
        result: Result<u64>,
    ) {
        if let Some(state) = self.keys.get_mut(&key) {
            state.releases_in_flight -= 1;
        }
        if let (Some(at), Ok(_)) = (follow_up, &result) {
            self.schedule_follow_up(key.place, vec![key.key.clone()], at);
        }
        let outcome = match result {
            Ok(0) => Ok(ReleaseOutcome::AlreadyLost),
            Ok(_) => Ok(ReleaseOutcome::Released),
            Err(error) => {
                tracing::warn!(%key, %error, "release failed; the lease will expire after its TTL");
                Err(error)
            }
        };
        if let Some(respond_to) = respond_to {
            let _ = respond_to.send(outcome);
        }
        self.serve_next(&key);
    }

    /// Leases released together are confirmed (or failed); a `release_all`
    /// (`respond_to`) is answered.
    pub(super) fn on_released_many(
        &mut self,
        keys: Vec<PlacedKey>,
        respond_to: Option<Reply<u64>>,
        result: Result<u64>,
    ) {
        for key in &keys {
            if let Some(state) = self.keys.get_mut(key) {
                state.releases_in_flight -= 1;
            }
        }
        if let Err(error) = &result {
            tracing::warn!(%error, "releasing leases failed; they will expire after their TTL");
            if let Some(closing) = &mut self.closing {
                closing.error.get_or_insert_with(|| error.clone());
            }
        }
        if let Some(respond_to) = respond_to {
            let _ = respond_to.send(result);
        }
        for key in &keys {
            self.serve_next(key);
        }
    }

    /// When the follow-up delete of a lease of `place` acquired at
    /// `acquired_at` is due, if a release sent now needs one.
    ///
    /// In delete mode, a release deletes the lock document only if its token
    /// is at least [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) old
    /// (by the server's clock), and otherwise marks it released. For leases
    /// whose acquire's reply arrived less than [`DELETE_DELAY`] before now
    /// (`acquired_at`, local clock: the token's millisecond is no later),
    /// the follow-up delete of their released documents is due at
    /// `acquired_at + DELETE_DELAY`: the server's time then is at least that
    /// much past the acquisition's (minus the small steps back of `$$NOW`,
    /// which `DELETE_DELAY` covers), however long the acquire took to reach
    /// the server. A single lease's release schedules it once the release is
    /// confirmed (a follow-up that ran before a late release landed would
    /// find nothing to delete). A document acquired again meanwhile is not
    /// deleted; one whose release is not confirmed by then, or whose token
    /// the server still finds too young (its time part ahead of the server's
    /// clock, e.g. after a failover to a member whose clock is behind), stays
    /// until the TTL monitor deletes it. In-document leases (whose release
    /// removes the lock field) follow the same rule, with "delete" meaning
    /// "remove the lock field".
    pub(super) fn follow_up_due(&self, place: Place, acquired_at: Instant) -> Option<Instant> {
        let at = acquired_at + DELETE_DELAY;
        (self.profile(place).removes_on_release && at > Instant::now()).then_some(at)
    }

    /// Deletes the released documents of `keys` at `at` (or at once if it
    /// has passed), in [`Actor::tasks`], so shutdown waits for it.
    pub(super) fn schedule_follow_up(&mut self, place: Place, keys: Vec<LeaseKey>, at: Instant) {
        let store = self.store(place).clone();
        let delete = async move {
            tokio::time::sleep_until(at).await;
            store.release(Release::ReleasedDocuments(keys)).await
        }
        .boxed();
        self.spawn_store(delete, |_, result| match result {
            Ok(deleted) => {
                tracing::debug!(deleted = deleted.count, "released lock documents deleted")
            }
            Err(error) => tracing::debug!(
                %error,
                "deleting released lock documents failed; the TTL monitor will"
            ),
        });
    }

    /// The follow-up deletes ([`Actor::follow_up_due`]) of every held lease
    /// about to be released together (`release_all`, shutdown): one per
    /// place for those acquired less than [`DELETE_DELAY`] ago.
    pub(super) fn delete_young_held_when_old_enough(&mut self) {
        let mut young: BTreeMap<Place, (Vec<LeaseKey>, Instant)> = BTreeMap::new();
        for (key, state) in &self.keys {
            for held in &state.holders {
                let Some(at) = self.follow_up_due(key.place, held.acquired_at) else {
                    continue;
                };
                let (keys, latest) = young.entry(key.place).or_insert((Vec::new(), at));
                keys.push(key.key.clone());
                *latest = (*latest).max(at);
            }
        }
        for (place, (keys, at)) in young {
            self.schedule_follow_up(place, keys, at);
        }
    }

    /// An operator's force release of `key` ended `was` (logged by the
    /// manager, which sent it): if it was one of ours, it is lost now; so
    /// are all our holders of a shared or semaphore key, which a force
    /// release frees whole.
    pub(super) fn on_force_released(
        &mut self,
        key: LeaseKey,
        was: LeaseInfo,
        respond_to: Reply<()>,
    ) {
        self.lose_force_released(key, was);
        let _ = respond_to.send(Ok(()));
    }

    /// The leases of ours a force release ended are lost (see above).
    fn lose_force_released(&mut self, key: LeaseKey, was: LeaseInfo) {
        if was.foreign {
            return;
        }
        let target = PlacedKey::lock(key);
        let ours: Vec<Uuid> = self
            .keys
            .get(&target)
            .into_iter()
            .flat_map(|s| &s.holders)
            .filter(|h| {
                h.kind.is_multi_holder()
                    || (was.owner_id == *self.owner_id && h.token == was.fencing_token)
            })
            .map(|h| h.lease_id)
            .collect();
        for lease_id in &ours {
            self.take_held(&target, *lease_id, LossReason::ForceReleased);
        }
        if !ours.is_empty() {
            self.serve_next(&target);
        }
    }

    /// Whether the release of `lease` of `key` (`too_young_to_delete`:
    /// acquired too lately for delete mode's delete) tries the light release
    /// first (`group_commit`'s module docs say when).
    pub(super) fn tries_light_release(
        &self,
        key: &PlacedKey,
        lease: &LeaseRef,
        holding: Holding,
        too_young_to_delete: bool,
    ) -> bool {
        lease.kind == LeaseKind::Exclusive
            && self.profile(key.place).light_forms.release
            && (too_young_to_delete || !self.profile(key.place).removes_on_release)
            && !self.light_release_missed(key)
            && (holding == Holding::Held || !self.is_contended(key))
    }

    /// The light release of `pending` (see the module docs): at once,
    /// alone or grouped.
    pub(super) fn submit_light_release(&mut self, pending: PendingRelease) {
        let (place, alone) = (pending.key.place, pending.key.key.as_str().is_none());
        if let Some((batch, grouped)) = self.group(place).releases.submit(pending, alone) {
            self.send_light_releases(place, batch, grouped);
        }
    }

    fn send_light_releases(&mut self, place: Place, batch: Vec<PendingRelease>, grouped: bool) {
        let leases = batch.iter().map(|p| p.lease.clone()).collect();
        // The form that hands a key over where one of them may have a
        // registered owner: a contended key (`group_commit`).
        let hands_over = batch.iter().any(|p| self.is_contended(&p.key));
        let call = self.store(place).release_light(leases, hands_over);
        self.spawn_store(call, move |actor, answers| {
            actor.on_light_released(place, (batch, hands_over), grouped, answers)
        });
    }

    /// The answers of a light release call: the next group goes, then each
    /// release is answered, or goes on to the general release.
    pub(super) fn on_light_released(
        &mut self,
        place: Place,
        (batch, hands_over): (Vec<PendingRelease>, bool),
        grouped: bool,
        answers: Vec<LightRelease>,
    ) {
        if grouped && let Some(next) = self.group(place).releases.next() {
            self.send_light_releases(place, next, true);
        }
        let mut answers = answers.into_iter();
        for pending in batch {
            let PendingRelease {
                key,
                lease,
                respond_to,
                follow_up,
            } = pending;
            match answers.next().unwrap_or_default() {
                LightRelease::Released => {
                    self.on_released(key, respond_to, follow_up, Ok(1));
                    continue;
                }
                LightRelease::Failed(error) => {
                    self.on_released(key, respond_to, follow_up, Err(error));
                    continue;
                }
                LightRelease::NotApplied => {}
            }
            // The form that hands over missed too: the key goes to the
            // general release for a while; the other form may have missed
            // only a registered owner, which that one serves.
            match hands_over {
                true => self.note_light_release_missed(&key),
                false => self.note_contended(&key),
            }
            // The general release decides: a lease it no longer finds is
            // lost, whether or not a light write of unknown outcome ended it
            // (property 7: a doubt reports a loss, never the reverse).
            let release = self.general_release(key.place, lease, follow_up.is_some());
            self.spawn_store(release, move |actor, result: Result<u64>| {
                actor.on_released(key, respond_to, follow_up, result)
            });
        }
    }
}

/// Whether the manager held the lease it releases: a lease it gives back
/// (an acquisition of unknown outcome, or one nobody waits for any more)
/// may be held by nobody, and tries the light release only where the other
/// light forms would (`group_commit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holding {
    Held,
    NotKnown,
}
