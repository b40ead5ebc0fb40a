//! Acquiring: the FIFO queue of local waiters per key, the key's one attempt
//! against the store at a time (`KeyState::attempt`), its jittered retries,
//! and handing a fresh acquisition to the first waiter still waiting (or
//! giving it back at once if nobody waits any more).

use std::cmp::Reverse;
use std::time::Duration;

use std::sync::Arc;
use tokio::time::Instant;

use mongodb::bson::Document;

use super::command::{AcquireMode, Granted, GrantedLease, Place, PlacedKey, WaiterId};
use super::key_state::{Registration, payload_hash};
use super::mailbox::Mailbox;
use super::telemetry;
use super::write_stream::wake_jitter;
use super::{AcquireSent, Actor, Attempt, Held, KeyState, Timer, Waiter};
use crate::backoff::retry_delay;
use crate::error::{Error, Result};
use crate::kind::LeaseKind;
use crate::status::LeaseState;
use crate::store::light_acquire::{LightAcquire, LightAcquired};
use crate::store::{AcquireOutcome, AcquireRequest};

impl Actor {
    pub(super) fn on_acquire(&mut self, key: PlacedKey, waiter: Waiter) {
        let Some(waiter) = self.reenter_or_refuse(&key, waiter) else {
            return;
        };
        let state = self
            .keys
            .entry(key.clone())
            .or_insert_with(|| Box::new(KeyState::new()));
        state.prune_waiters();
        if let Some(stored) = state.mismatch(waiter.shape.kind) {
            let _ = waiter.respond_to.send(Err(Error::KindMismatch {
                stored,
                requested: waiter.shape.kind,
            }));
            return;
        }
        let busy = !state.waiters.is_empty() || !state.can_start(&waiter.shape);
        if waiter.mode == AcquireMode::Try && busy {
            let _ = waiter.respond_to.send(Ok(None));
            self.forget_if_idle(&key);
            return;
        }
        if state.waiters.capacity() == 0 {
            // Room for one: most keys never have a second waiter.
            state.waiters.reserve_exact(1);
        }
        state.waiters.push_back(waiter);
        if !busy {
            self.start_attempt(&key);
        }
    }

    pub(super) fn on_cancel_waiter(&mut self, key: &PlacedKey, waiter: WaiterId) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.waiters.retain(|w| w.id != waiter);
        state.prune_waiters();
        if state.waiters.is_empty() {
            if let Some(timer) = state.unschedule() {
                self.timers.remove(&timer);
            }
        }
        // The waiter that went away may have been the head that the local
        // holders did not admit (an exclusive one behind shared leases): the
        // next one may start now.
        self.serve_next(key);
    }

    /// Starts the key's next attempt if it is free locally and someone waits.
    pub(super) fn serve_next(&mut self, key: &PlacedKey) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.prune_waiters();
        // Waiters at the head that the local holders' kind refuses.
        while let Some(stored) = state
            .waiters
            .front()
            .and_then(|w| state.mismatch(w.shape.kind))
        {
            let waiter = state.waiters.pop_front().expect("a front waiter");
            let _ = waiter.respond_to.send(Err(Error::KindMismatch {
                stored,
                requested: waiter.shape.kind,
            }));
        }
        let ready = state
            .waiters
            .front()
            .is_some_and(|w| state.can_start(&w.shape));
        if ready {
            self.start_attempt(key);
        } else {
            self.forget_if_idle(key);
        }
    }

    fn start_attempt(&mut self, key: &PlacedKey) {
        let state = self.keys.get_mut(key).expect("attempt for a known key");
        // The attempt is the first waiter's: its kind, its TTL (if it goes
        // away meanwhile, `grant` adjusts to the next one's, and hands the
        // lease to a waiter of this shape only), and its fields to create a
        // missing document with (created for a caller that asked for it,
        // never handed to one that did not).
        let first = state.waiters.front();
        let shape = first.map(|w| w.shape).unwrap_or_default();
        let ttl = first.map_or(self.timing.ttl, |w| w.ttl);
        let create = first.and_then(|w| w.create.clone());
        let payload = first.and_then(|w| w.payload.clone());
        let at_most = first.is_some_and(|w| w.at_most);
        // An attempt with a payload retries no attempt under this lease
        // id: one that landed unseen (perhaps another waiter's, without
        // that payload) would show this acquisition without its payload
        // until the retry lands.
        let unseen = state.unknown_outcome;
        // Nor one whose attempts registered with another payload: a release
        // may hand the key to that registration, with that payload.
        let other_payload = state.misses.as_deref().is_some_and(|u| {
            u.lease_id == state.next_lease_id && u.payload != payload_hash(payload.as_ref())
        });
        if other_payload {
            let lease_id = state.new_lease_id();
            self.give_back(key, lease_id, shape.kind);
            return;
        }
        if let Some(sent) = unseen.filter(|sent| *sent != shape || payload.is_some()) {
            // An attempt of another shape under this lease id may have
            // landed unseen (its waiter left): a retry of this shape would
            // not recognise it as ours and would wait for it to expire. Give
            // it back; the attempt starts under a new lease id once the
            // release is confirmed (`on_released`).
            let lease_id = state.new_lease_id();
            self.give_back(key, lease_id, sent.kind);
            return;
        }
        state.begin_attempt();
        let sent = AcquireSent {
            lease_id: state.next_lease_id,
            sent_at: Instant::now(),
            ttl,
            shape,
            waiting: state.waiters.iter().any(|w| w.mode != AcquireMode::Try),
            payload,
            at_most,
        };
        let key = key.clone();
        if self.tries_light_acquire(&key, &sent) {
            self.submit_light_acquire(key, sent);
        } else {
            if shape.kind == LeaseKind::Exclusive && self.profile(key.place).light_forms.acquire {
                // The general form goes for an exclusive lease: the key
                // skips the light forms for a while (`group_commit`).
                self.note_contended(&key);
            }
            self.send_general_acquire(key, sent, create);
        }
    }

    /// The key's scheduled attempt is due ([`Timer::Retry`]): it starts if
    /// the key is free locally and someone waits.
    pub(super) fn on_retry_due(&mut self, key: &PlacedKey) {
        if let Some(state) = self.keys.get_mut(key) {
            state.attempt = Attempt::Idle;
        }
        self.serve_next(key);
    }

    /// Sends the general acquire of the attempt `sent` of `key` (with
    /// `create`, the fields of a missing user document); its answer comes
    /// back to [`Actor::on_general_acquire_answered`].
    pub(super) fn send_general_acquire(
        &mut self,
        key: PlacedKey,
        sent: AcquireSent,
        create: Option<Document>,
    ) {
        let acquire = self.store(key.place).acquire(AcquireRequest {
            key: key.key.clone(),
            lease_id: sent.lease_id,
            waiting: sent.waiting,
            ttl: sent.ttl,
            shape: sent.shape,
            create,
            payload: sent.payload.clone(),
        });
        self.spawn_store(acquire, move |actor, result| {
            actor.on_general_acquire_answered(key, sent, result)
        });
    }

    /// The general acquire's answer: the server
    /// answered (if it did), whether the light form would have applied is
    /// noted, then it is an acquire's answer.
    pub(super) fn on_general_acquire_answered(
        &mut self,
        key: PlacedKey,
        sent: AcquireSent,
        result: Result<(AcquireOutcome, Option<Document>)>,
    ) {
        if result.is_ok() {
            self.health.server_answered();
        }
        let acquired = matches!(result, Ok((AcquireOutcome::Acquired { .. }, _)));
        self.note_general_acquire(&key, &sent, acquired);
        self.on_acquired(key, sent, result)
    }

    /// An acquire attempt's answer: the general acquire's, a light
    /// acquire's, or a handoff's that acquired.
    pub(super) fn on_acquired(
        &mut self,
        key: PlacedKey,
        sent: AcquireSent,
        result: Result<(AcquireOutcome, Option<Document>)>,
    ) {
        let may_register = self.may_register(&key, &sent);
        let queue_bound = self.profile(key.place).queue_bound;
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        let meanwhile = state.end_attempt();
        let confirming = state.take_confirming();
        let lease_id = sent.lease_id;
        // A send whose outcome is unknown may land at any time later, even
        // after a later attempt under the lease id was answered ("Late
        // writes" in `store`): its shape stays with the lease id until the
        // id changes (`KeyState::acquired`, `new_lease_id`).
        let may_land = match &result {
            Err(error) => error.is_transient(),
            // A re-read's answer (a `Held` read carries no token,
            // `replies::from_reread`): the write it stands for may still
            // land, so a retry of another shape must not reuse this lease id.
            Ok((AcquireOutcome::Held { token: None, .. }, _)) => true,
            _ => false,
        };
        if may_land {
            state.unknown_outcome = Some(sent.shape);
        }
        match result {
            Ok((AcquireOutcome::Acquired { token }, _))
                if sent.sent_at + self.timing.validity_for(sent.ttl) <= Instant::now() =>
            {
                // Answered after its local deadline (counted from the send,
                // as the write may have landed then), e.g. by a server that
                // was frozen: such a lease would be lost as soon as it is
                // handed out. Give it back and try again under a new lease
                // id; a try gets `None`.
                tracing::warn!(%key, token, "acquired too late to be safe; giving it back");
                state.new_lease_id();
                state.answer_waiters(answer_tries);
                // Its confirmation starts the next attempt (`on_released`).
                self.give_back(&key, lease_id, sent.shape.kind);
            }
            Ok((AcquireOutcome::Acquired { token }, document)) => {
                state.acquired();
                self.grant(&key, sent, token, document, meanwhile.may_take);
            }
            Ok((AcquireOutcome::Unconfirmed { token }, _)) => {
                // Our lease, found by a read: its expiry is unknown (a
                // handoff's `hx`, an earlier attempt's TTL), so it is not
                // granted, and the answer registers nothing. A retry under
                // the same lease id (of the same shape, `unseen`) renews it
                // and is granted from its own send.
                tracing::debug!(%key, token, "lease found by a read: confirming it at once");
                state.note_miss_of(&sent, None);
                state.unknown_outcome = Some(sent.shape);
                state.found_by_read();
                state.prune_waiters();
                if state.waiters.is_empty() {
                    // Nobody to give it to: give it back at once.
                    state.new_lease_id();
                    self.give_back(&key, lease_id, sent.shape.kind);
                } else if confirming {
                    // Confirmed by a read again: the writes keep failing.
                    self.schedule_retry(&key, None, false, false);
                } else {
                    let timer = self
                        .timers
                        .insert(Timer::Retry(key.clone()), Duration::ZERO);
                    state.confirm_found(timer);
                }
            }
            Ok((AcquireOutcome::OursAsAnotherKind { stored }, _)) => {
                // An earlier attempt under this lease id landed unseen, and
                // the key's number of permits changed since: give its entry
                // back (the next attempt goes under a new lease id once the
                // release is confirmed, `on_released`), and answer as a
                // mismatch.
                let requested = sent.shape.kind;
                tracing::debug!(%key, %stored, %requested, "our entry on a key now held as another kind");
                let mismatch = Error::KindMismatch { stored, requested };
                state
                    .answer_waiters(|w| (w.shape.kind == requested).then(|| Err(mismatch.clone())));
                state.new_lease_id();
                self.give_back(&key, lease_id, requested);
            }
            Ok((AcquireOutcome::Mismatch { stored }, _)) => {
                state.note_miss_of(&sent, None);
                // The answer for every waiter asking for this kind; the
                // others' attempts follow.
                let requested = sent.shape.kind;
                tracing::debug!(%key, %stored, %requested, "key held as another kind");
                let mismatch = Error::KindMismatch { stored, requested };
                state
                    .answer_waiters(|w| (w.shape.kind == requested).then(|| Err(mismatch.clone())));
                self.serve_next(&key);
            }
            Ok((
                AcquireOutcome::Held {
                    ahead,
                    holder,
                    remaining,
                    token,
                },
                _,
            )) => {
                let foreign = remaining.is_none();
                tracing::trace!(%key, holder, ?remaining, foreign, ahead, "key is held");
                // No release or handoff is for this owner soon, so the key
                // needs no change stream (`Attempt::Scheduled::far_behind`;
                // ARCHITECTURE.md, "At most one change stream of writes per
                // place"; `ahead` counts every live entry when this owner
                // has none).
                let previous = state
                    .misses
                    .as_ref()
                    .filter(|u| u.lease_id == lease_id)
                    .and_then(|u| u.registered);
                let beyond_queue = usize::try_from(ahead).is_ok_and(|a| a >= queue_bound);
                let far_behind = beyond_queue
                    || ahead > 0
                        && previous.is_some_and(|p| {
                            Some(p.token) == token
                                && sent.sent_at.saturating_duration_since(p.sent_at)
                                    >= self.timing.retry_max / 2
                        });
                // A waiting exclusive attempt in the lock collection
                // registered in the key's queue, with or without a minimum
                // hold (not on a foreign holder's lock, nor on one's own
                // yield; in-document leases have no queue). A key handed
                // to a registration with a minimum hold is confirmed by an
                // attempt, never granted on the event (`grant_handed`).
                let registered = may_register && !foreign && holder != *self.owner_id;
                state.held_elsewhere(registered);
                let registration = token.filter(|_| registered).map(|token| Registration {
                    sent_at: sent.sent_at,
                    round_trip: sent.sent_at.elapsed(),
                    token,
                });
                state.note_miss_of(&sent, registration);
                state.answer_waiters(answer_tries);
                if state.waiters.is_empty() {
                } else if meanwhile.freed {
                    // Freed after this attempt read it: its answer is stale.
                    tracing::trace!(%key, "freed while the attempt was in flight: retrying now");
                    self.schedule_wake(&key, far_behind);
                } else if far_behind {
                    // No release or handoff is for this owner soon: its
                    // next attempts tell when one may be, without a
                    // stream meanwhile (checked before the stream, which
                    // may be open for other keys).
                    if registered {
                        self.schedule_refresh(&key, remaining, far_behind);
                    } else {
                        self.schedule_retry(&key, remaining, false, far_behind);
                    }
                } else if registered && self.hears_handoffs(key.place) {
                    // The change stream announces the handoff (or a
                    // release), read again if it was paused: poll only to
                    // refresh the registration.
                    self.open_write_stream(key.place);
                    self.schedule_refresh(&key, remaining, far_behind);
                } else {
                    // Capped by the time left (a foreign holder's lock: by
                    // its own rule); without one, a foreign holder's lock is
                    // polled with the backoff alone, and its deletion wakes
                    // the waiters.
                    self.schedule_retry(&key, remaining, true, far_behind);
                }
                if far_behind {
                    self.pause_write_stream_if_unneeded(key.place);
                }
                if self.closing.is_some() {
                    // Registered by an attempt that was in flight when
                    // shutdown began: leave that queue too.
                    self.leave_queues_at_shutdown();
                }
            }
            Err(error) => {
                state.note_miss_of(&sent, None);
                let transient = error.is_transient();
                // A waiting exclusive attempt whose outcome is unknown may
                // have registered in the key's queue: count it registered,
                // so that shutdown (or a waiter leaving) leaves that queue
                // (leaving a queue one is not in changes nothing).
                if transient && may_register {
                    state.may_have_registered();
                }
                // A missing document: the answer for the callers that gave
                // no fields to create it (the attempt was sent with the
                // first one's); the others' attempt follows at once.
                let not_found = matches!(error, Error::DocumentNotFound { .. });
                state.answer_waiters(|w| {
                    let retries = (not_found && w.create.is_some())
                        || (transient && w.mode != AcquireMode::Try);
                    (!retries).then(|| Err(error.clone()))
                });
                if not_found {
                    self.serve_next(&key);
                } else if !state.waiters.is_empty() {
                    tracing::warn!(%key, %error, "acquire attempt failed; retrying");
                    self.schedule_retry(&key, None, false, false);
                } else if transient {
                    // The write may have landed unseen: give it back rather than
                    // leave the key blocked until the lease expires.
                    state.new_lease_id();
                    self.give_back(&key, lease_id, sent.shape.kind);
                }
                if transient && may_register && self.closing.is_some() {
                    // Perhaps registered by an attempt that was in flight
                    // when shutdown began (sent again meanwhile,
                    // `replies::sent_again_once`): leave that queue too.
                    self.leave_queues_at_shutdown();
                }
            }
        }
        self.forget_if_idle(&key);
    }

    /// Hands a fresh acquisition to the first waiter still waiting, or gives it
    /// back at once if nobody waits any more (a cancelled acquire never leaks).
    ///
    /// `written_ttl` is the TTL the acquire wrote. The lease gets its waiter's
    /// TTL (its renewals set it), and until the first renewal its deadline
    /// follows the shorter of the two, as the document expires `written_ttl`
    /// after the acquire.
    ///
    /// `check`: a write announced while the attempt was in flight may have
    /// taken the key (`Meanwhile::may_take`): the lease granted is checked
    /// at once.
    pub(super) fn grant(
        &mut self,
        key: &PlacedKey,
        sent: AcquireSent,
        token: u64,
        document: Option<Document>,
        check: bool,
    ) {
        let AcquireSent {
            lease_id,
            sent_at,
            ttl: written_ttl,
            shape,
            payload,
            at_most,
            ..
        } = sent;
        let state = self.keys.get_mut(key).expect("grant for a known key");
        while let Some(waiter) = state.waiters.pop_front() {
            if waiter.respond_to.is_closed() {
                continue;
            }
            // A lease held at most its TTL must have been written with it.
            let at_most_differs =
                waiter.at_most != at_most || (at_most && waiter.ttl != written_ttl);
            if waiter.shape != shape || waiter.payload != payload || at_most_differs {
                // The waiter it was for went away and the next one asked for
                // another kind (payload, duration): give it back, then serve
                // that one.
                state.waiters.push_front(waiter);
                break;
            }
            let Some(mailbox) = self.sender.upgrade().map(Mailbox::new) else {
                break;
            };
            let deadline = sent_at + self.timing.validity_for(waiter.ttl.min(written_ttl));
            let lease_state = Arc::new(LeaseState::new(deadline));
            let span = telemetry::lease_started(
                &self.health,
                &self.owner_id,
                key,
                token,
                (sent_at, deadline),
            );
            self.deadlines
                .push(Reverse((deadline, key.clone(), lease_id)));
            // One holder is the common case, kept inline (see `Holders`).
            state.holders.push(Held {
                lease_id,
                token,
                state: lease_state.clone(),
                ttl: waiter.ttl,
                renews: !at_most,
                deadline,
                renewing: 0,
                kind: shape.kind,
                revocation_told: false,
                acquired_at: Instant::now(),
                span,
            });
            tracing::debug!(%key, token, kind = %shape.kind, "lease acquired");
            let lease = Some(GrantedLease {
                key: key.clone(),
                place: self.places[usize::from(key.place.0)].profile.place.clone(),
                owner_id: self.owner_id.clone(),
                lease_id,
                fencing_token: token,
                ttl: waiter.ttl,
                kind: shape.kind,
                state: lease_state,
                mailbox,
            });
            // If the caller went away just now, the returned grant is dropped
            // here, and its drop queues its release.
            let _ = waiter
                .respond_to
                .send(Ok(Some(Granted { lease, document })));
            if state.waiters.is_empty() {
                // A held key stays in `keys`: keep no empty queue's buffer.
                state.waiters.shrink_to_fit();
            }
            if check {
                self.check_held([key.clone()].into_iter().collect());
            }
            if let Some(holder) = waiter.holder {
                self.held_by(key, lease_id, holder);
            }
            if self.timing.watch_held_leases {
                // Writes to held leases by others are noticed through it.
                self.open_write_stream(key.place);
            }
            if shape.kind.is_multi_holder() {
                // The next waiter may share the key too.
                self.serve_next(key);
            }
            return;
        }
        self.give_back(key, lease_id, shape.kind);
    }

    /// Whether the attempt `sent` of `key` may register in the key's queue
    /// of waiting owners: a waiting exclusive attempt in the lock collection
    /// (in-document leases have no queue).
    fn may_register(&self, key: &PlacedKey, sent: &AcquireSent) -> bool {
        self.profile(key.place).place.field.is_none()
            && sent.waiting
            && sent.shape.kind == LeaseKind::Exclusive
    }

    /// Schedules the key's next attempt within [`wake_jitter`] (capped
    /// by the initial retry delay), as for a waiter woken by a release: the
    /// jitter keeps waiters in several processes from arriving in the same
    /// instant. The backoff is not advanced (`far_behind`: see
    /// `Attempt::Scheduled`).
    fn schedule_wake(&mut self, key: &PlacedKey, far_behind: bool) {
        let jitter = wake_jitter(self.timing.retry_initial);
        let timer = self.timers.insert(Timer::Retry(key.clone()), jitter);
        let state = self.keys.get_mut(key).expect("wake for a known key");
        state.schedule(timer, far_behind);
        self.open_write_stream(key.place);
    }

    /// Schedules the key's next attempt after the backoff, capped by the
    /// holder's `remaining` time if known; `held`: the key is held by another
    /// holder, so a release or delete of it should wake the retry;
    /// `far_behind`: see `Attempt::Scheduled`.
    fn schedule_retry(
        &mut self,
        key: &PlacedKey,
        remaining: Option<Duration>,
        held: bool,
        far_behind: bool,
    ) {
        let state = self.keys.get_mut(key).expect("retry for a known key");
        let delay = retry_delay(
            state.failures,
            self.timing.retry_initial,
            self.timing.retry_max,
            remaining,
        );
        state.failures = state.failures.saturating_add(1);
        let timer = self.timers.insert(Timer::Retry(key.clone()), delay);
        state.schedule(timer, far_behind);
        if held {
            self.open_write_stream(key.place);
        }
    }

    /// Schedules the next attempt of a registered key whose handoff the
    /// change stream announces: only to refresh the registration (and as a
    /// fallback should an event be missed), at the backoff's longest step,
    /// `retry_max`, which the registration window allows for; capped by the
    /// holder's `remaining` time as any retry (`far_behind`: see
    /// [`Attempt::Scheduled`]).
    pub(super) fn schedule_refresh(
        &mut self,
        key: &PlacedKey,
        remaining: Option<Duration>,
        far_behind: bool,
    ) {
        let delay = retry_delay(
            u32::MAX,
            self.timing.retry_initial,
            self.timing.retry_max,
            remaining,
        );
        let timer = self.timers.insert(Timer::Retry(key.clone()), delay);
        if let Some(state) = self.keys.get_mut(key) {
            state.schedule(timer, far_behind);
        }
    }

    /// Whether the attempt `sent` of `key` tries the light acquire first.
    pub(super) fn tries_light_acquire(&self, key: &PlacedKey, sent: &AcquireSent) -> bool {
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
    pub(super) fn note_general_acquire(
        &mut self,
        key: &PlacedKey,
        sent: &AcquireSent,
        acquired: bool,
    ) {
        if sent.shape.kind == LeaseKind::Exclusive
            && !self.profile(key.place).light_forms.acquire
            && !(acquired && sent.shape.is_plain())
        {
            self.note_contended(key);
        }
    }

    /// The light acquire of the attempt `sent` of `key` (see the module
    /// docs): at once, alone or grouped.
    pub(super) fn submit_light_acquire(&mut self, key: PlacedKey, sent: AcquireSent) {
        let (place, alone) = (key.place, key.key.as_str().is_none());
        if let Some((batch, grouped)) = self.group(place).acquires.submit((key, sent), alone) {
            self.send_light_acquires(place, batch, grouped);
        }
    }

    fn send_light_acquires(
        &mut self,
        place: Place,
        batch: Vec<(PlacedKey, AcquireSent)>,
        grouped: bool,
    ) {
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
        self.spawn_store(call, move |actor, answers| {
            actor.on_light_acquired(place, batch, grouped, answers)
        });
    }

    /// The answers of a light acquire call: the next group goes, then each
    /// attempt is granted, or goes on to the general acquire.
    pub(super) fn on_light_acquired(
        &mut self,
        place: Place,
        batch: Vec<(PlacedKey, AcquireSent)>,
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
                    self.on_light_granted(key, AcquireSent { sent_at, ..sent }, token);
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
    fn on_light_granted(&mut self, key: PlacedKey, sent: AcquireSent, token: u64) {
        self.health.server_answered();
        let acquired = Ok((AcquireOutcome::Acquired { token }, None));
        self.on_acquired(key, sent, acquired);
    }
}

/// The answer for the tries among a key's waiters when the key is not
/// acquired now: `None`, and the others keep waiting.
fn answer_tries(waiter: &Waiter) -> Option<Result<Option<Granted>>> {
    (waiter.mode == AcquireMode::Try).then_some(Ok(None))
}
