//! The light forms ("Light forms for keys nobody waits for" in `store`):
//! when the actor tries one, the group commit of their writes, and the
//! memory of the keys where they do not apply.
//!
//! **When.** A light acquire for a plain exclusive lease, a light release
//! for an exclusive lease not deleted at once (keep mode, or a lease too
//! young for delete mode's delete), a light handoff, where the place's
//! store has the form (`StoreProfile::light_forms`) and the key is not contended: the
//! general form was sent for it, or a light form did not apply to it,
//! less than `Timing::contended_for` ago
//! ([`CONTENDED_FOR`](crate::config::CONTENDED_FOR) but in
//! the simulation; [`Actor::contended`], the actor's clock). A contended
//! key goes straight to the general form, so it costs no light write that
//! would not apply.
//!
//! **Group commit.** Per place and per form (acquire, release), at most
//! one light store call is in flight. A light write asked for while none
//! of its form is in flight goes at once, alone: a lone caller waits for no
//! one. Those asked for meanwhile queue here, and go together once it
//! returns, at most [`MOST_PER_COMMAND`] per call, so the server's cost
//! per command (parsing, the majority wait, the reply: most of a small
//! write's cost, docs/mongodb-behaviour.md, B27) is shared: a database's
//! group commit on the client's side. A key that is not a string goes
//! alone at once, outside the queue (a grouped command matches the
//! documents it reads back to the requests by `_id`, exact for strings).
//!
//! **Answers.** An acquire the light form acquired is granted as any
//! acquire's answer (`Actor::on_acquired`; its local deadline counts from
//! the attempt's start, before the light write was sent); one it did not
//! goes on to the general acquire under the same lease id, which decides
//! (and recognises a landed light write as a retry). A release the light
//! form released is answered released; one it did not goes on to the
//! general release, which decides; after an unknown outcome
//! ([`LightRelease::Unknown`]) a lease the general release no longer finds
//! counts as released by the light write. A grouped release's answers are
//! decided by the store with [`release_outcomes`](crate::store::light_release::release_outcomes).

use std::mem;

use tokio::time::Instant;

use super::command::{Place, Reply, Target};
use super::{Actor, Event, Sent};
use crate::error::Result;
use crate::kind::LeaseKind;
use crate::status::ReleaseOutcome;
use crate::store::{AcquireOutcome, LeaseRef};
use crate::store::{
    light_acquire::{LightAcquire, LightAcquired},
    light_release::{LightRelease, MOST_PER_COMMAND},
};

/// The light writes of one form of one place: whether a grouped call is
/// in flight, and those queued behind it.
pub(super) struct Queue<T> {
    in_flight: bool,
    queued: Vec<T>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            in_flight: false,
            queued: Vec::new(),
        }
    }
}

impl<T> Queue<T> {
    /// The batch to send now for `request`, and whether it holds the slot
    /// (`grouped`): itself alone if `alone` (a key that is not a string);
    /// itself, grouped, if nothing of its form is in flight; else nothing,
    /// and it waits.
    fn submit(&mut self, request: T, alone: bool) -> Option<(Vec<T>, bool)> {
        if alone {
            return Some((vec![request], false));
        }
        if self.in_flight {
            self.queued.push(request);
            return None;
        }
        self.in_flight = true;
        Some((vec![request], true))
    }

    /// The grouped call in flight returned: the next batch to send, if
    /// any queued (the slot stays taken), else the slot is freed.
    fn next(&mut self) -> Option<Vec<T>> {
        if self.queued.is_empty() {
            self.in_flight = false;
            return None;
        }
        let n = self.queued.len().min(MOST_PER_COMMAND);
        let rest = self.queued.split_off(n);
        Some(mem::replace(&mut self.queued, rest))
    }
}

/// A place's group commits of the light acquire and release.
#[derive(Default)]
pub(super) struct GroupCommit {
    acquires: Queue<(Target, Sent)>,
    releases: Queue<PendingRelease>,
}

/// A release of one lease waiting for its light form's answer.
pub(super) struct PendingRelease {
    pub(super) key: Target,
    pub(super) lease: LeaseRef,
    pub(super) respond_to: Option<Reply<ReleaseOutcome>>,
    /// As `Event::Released::follow_up`.
    pub(super) follow_up: Option<Instant>,
}

impl Actor {
    /// Whether `key` went to the general form lately (see the module docs).
    pub(super) fn is_contended(&self, key: &Target) -> bool {
        self.contended
            .get(key)
            .is_some_and(|at| at.elapsed() < self.timing.contended_for)
    }

    /// Remembers that `key` went to the general form now.
    pub(super) fn note_contended(&mut self, key: &Target) {
        self.contended.insert(key.clone(), Instant::now());
    }

    /// Forgets the keys contended longer ago than `Timing::contended_for`
    /// (at each heartbeat).
    pub(super) fn prune_contended(&mut self) {
        let contended_for = self.timing.contended_for;
        self.contended.retain(|_, at| at.elapsed() < contended_for);
    }

    /// Whether the attempt `sent` of `key` tries the light acquire first.
    pub(super) fn tries_light_acquire(&self, key: &Target, sent: &Sent) -> bool {
        sent.shape.is_plain()
            && sent.payload.is_none()
            && self.profile(key.place).light_forms.acquire
            && !self.is_contended(key)
    }

    /// Where the store has no light acquire (the in-memory twin), the
    /// general acquire's answer for an exclusive lease tells whether
    /// `MongoStore`'s would have applied: only to a plain lease it
    /// acquired. Where it has one, the general acquire of an exclusive
    /// lease is itself the sign (`Actor::start_attempt`).
    pub(super) fn note_general_acquire(&mut self, key: &Target, sent: &Sent, acquired: bool) {
        if sent.shape.kind == LeaseKind::Exclusive
            && !self.profile(key.place).light_forms.acquire
            && !(acquired && sent.shape.is_plain())
        {
            self.note_contended(key);
        }
    }

    /// The light acquire of the attempt `sent` of `key` (see the module
    /// docs): at once, alone or grouped.
    pub(super) fn submit_light_acquire(&mut self, key: Target, sent: Sent) {
        let (place, alone) = (key.place, key.key.as_str().is_none());
        if let Some((batch, grouped)) = self.group(place).acquires.submit((key, sent), alone) {
            self.send_light_acquires(place, batch, grouped);
        }
    }

    fn group(&mut self, place: Place) -> &mut GroupCommit {
        &mut self.places[usize::from(place.0)].group_commit
    }

    fn send_light_acquires(&mut self, place: Place, batch: Vec<(Target, Sent)>, grouped: bool) {
        let requests = batch
            .iter()
            .map(|(key, sent)| LightAcquire {
                key: key.key.clone(),
                lease_id: sent.lease_id,
                ttl: sent.ttl,
                started: sent.sent_at,
            })
            .collect();
        let call = self.store(place).acquire_light(requests);
        self.spawn_store(call, move |answers| Event::LightAcquired {
            place,
            batch,
            grouped,
            answers,
        });
    }

    /// The answers of a light acquire call: the next group goes, then each
    /// attempt is granted, or goes on to the general acquire.
    pub(super) fn on_light_acquired(
        &mut self,
        place: Place,
        batch: Vec<(Target, Sent)>,
        grouped: bool,
        answers: Vec<LightAcquired>,
    ) {
        if grouped && let Some(next) = self.group(place).acquires.next() {
            self.send_light_acquires(place, next, true);
        }
        let mut answers = answers.into_iter();
        for (key, sent) in batch {
            match answers.next().unwrap_or_default() {
                LightAcquired::Acquired(token) => self.on_light_granted(key, sent, token),
                LightAcquired::AcquiredShort { token, counts_from } => {
                    // Its local deadline counts from `counts_from`.
                    let sent_at = sent.sent_at.min(counts_from);
                    self.on_light_granted(key, Sent { sent_at, ..sent }, token);
                }
                LightAcquired::NotApplied => {
                    self.note_contended(&key);
                    self.send_general_acquire(key, sent, None);
                }
                LightAcquired::Failed(error) => self.on_acquired(key, sent, Err(error)),
            }
        }
    }

    /// A light acquire granted `key` with `token`, its local deadline
    /// counting from `sent.sent_at`.
    fn on_light_granted(&mut self, key: Target, sent: Sent, token: u64) {
        self.health.server_answered();
        let acquired = Ok((AcquireOutcome::Acquired { token }, None));
        self.on_acquired(key, sent, acquired);
    }

    /// Whether the release of `lease` of `key` (`too_young_to_delete`:
    /// acquired too lately for delete mode's delete) tries the light release
    /// first.
    pub(super) fn tries_light_release(
        &self,
        key: &Target,
        lease: &LeaseRef,
        too_young_to_delete: bool,
    ) -> bool {
        lease.kind == LeaseKind::Exclusive
            && self.profile(key.place).light_forms.release
            && (too_young_to_delete || !self.profile(key.place).removes_on_release)
            && !self.is_contended(key)
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
        let call = self.store(place).release_light(leases);
        self.spawn_store(call, move |answers| Event::LightReleased {
            place,
            batch,
            grouped,
            answers,
        });
    }

    /// The answers of a light release call: the next group goes, then each
    /// release is answered, or goes on to the general release.
    pub(super) fn on_light_released(
        &mut self,
        place: Place,
        batch: Vec<PendingRelease>,
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
            let unknown = match answers.next().unwrap_or_default() {
                LightRelease::Released => {
                    self.on_released(key, respond_to, follow_up, Ok(1));
                    continue;
                }
                LightRelease::Failed(error) => {
                    self.on_released(key, respond_to, follow_up, Err(error));
                    continue;
                }
                LightRelease::NotApplied => false,
                LightRelease::Unknown => true,
            };
            self.note_contended(&key);
            let release = self.general_release(key.place, lease, follow_up.is_some());
            // A light write whose outcome was unknown may have landed: a
            // lease the general release no longer finds counts as released.
            self.spawn_store(release, move |result: Result<u64>| Event::Released {
                result: result.map(|count| if unknown { count.max(1) } else { count }),
                key,
                respond_to,
                follow_up,
            });
        }
    }
}
