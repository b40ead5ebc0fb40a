//! Handoff to a local waiter (`Store::handoff`, "Handoff to a local
//! waiter" and, for its form, "Light forms" in `store`).
//!
//! The handoff is the key's one attempt (`Attempt::InFlight`, under
//! `KeyState::next_lease_id`, sent with the first waiter's TTL and shape)
//! and one of its releases in flight, so no other attempt starts
//! meanwhile. Its answer: `Acquired` is an acquire's answer
//! (`Actor::on_acquired`: the first waiter still waiting gets the lease,
//! or it is given back); `Released` (another owner waits, which the yield
//! serves first) and `Lost` are a release's answer (`Actor::on_released`:
//! the waiter's attempt starts as after any release).

use tokio::time::Instant;
use uuid::Uuid;

use super::command::{Place, PlacedKey, Reply};
use super::{AcquireSent, Actor, Held};
use crate::error::Result;
use crate::kind::LeaseKind;
use crate::status::ReleaseOutcome;
use crate::store::{AcquireOutcome, Handoff, HandoffOutcome};

impl Actor {
    /// Whether the release of `held` (just taken from `key`) can hand the
    /// key to its first local waiter: an exclusive lease of the lock
    /// collection, a first waiter a lease can be handed to
    /// ([`Waiter::can_be_handed`](super::command::Waiter::can_be_handed)), and
    /// nothing else in flight for the key (no attempt, release, nor unknown
    /// outcome).
    pub(super) fn can_handoff(&mut self, key: &PlacedKey, held: &Held) -> bool {
        if key.place != Place::LOCKS || held.kind != LeaseKind::Exclusive {
            return false;
        }
        let Some(state) = self.keys.get_mut(key) else {
            return false;
        };
        state.prune_waiters();
        state
            .waiters
            .front()
            .is_some_and(|w| w.can_be_handed() && state.can_start(&w.shape))
            && state.unknown_outcome.is_none()
    }

    /// Sends the handoff of the lease `from` of `key` (acquired at
    /// `acquired_at`, see `Held::acquired_at`) to the first waiter; its
    /// answer comes back to [`Actor::on_handoff_answered`]. Only after
    /// [`Actor::can_handoff`] said yes.
    pub(super) fn spawn_handoff(
        &mut self,
        key: PlacedKey,
        from: Uuid,
        acquired_at: Instant,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        let follow_up = self.follow_up_due(key.place, acquired_at);
        let contended = self.is_contended(&key);
        let light = self.profile(key.place).light_forms.handoff && !contended;
        let state = self.keys.get_mut(&key).expect("checked by can_handoff");
        let waiter = state.waiters.front().expect("checked by can_handoff");
        let sent = AcquireSent {
            lease_id: state.next_lease_id,
            sent_at: Instant::now(),
            ttl: waiter.ttl,
            shape: waiter.shape,
            waiting: true,
            payload: None,
            at_most: false,
        };
        state.begin_attempt();
        state.releases_in_flight += 1;
        // The light form first, unless the key went to the general form
        // lately (`group_commit`).
        let handoff = Handoff {
            key: key.key.clone(),
            from,
            to: sent.lease_id,
            ttl: sent.ttl,
            light,
        };
        self.send_handoff(
            key,
            HandoffSent {
                handoff,
                sent,
                contended,
                follow_up,
            },
            respond_to,
        );
    }

    /// Sends `handoff.handoff` to the store of `key`.
    fn send_handoff(
        &mut self,
        key: PlacedKey,
        handoff: HandoffSent,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        let write = self.store(key.place).handoff(handoff.handoff.clone());
        self.spawn_store(write, move |actor, result| {
            actor.on_handoff_answered(key, handoff, respond_to, result)
        });
    }

    /// The handoff's answer: a light form that did not apply goes on to
    /// the general form; otherwise the releasing caller gets `Released`
    /// once the write is confirmed (`AlreadyLost` if the lease was lost);
    /// the key goes to the first waiter still waiting, or, if it was
    /// released instead, that waiter's attempt starts.
    pub(super) fn on_handoff_answered(
        &mut self,
        key: PlacedKey,
        handoff: HandoffSent,
        respond_to: Option<Reply<ReleaseOutcome>>,
        result: Result<HandoffOutcome>,
    ) {
        if let Ok(HandoffOutcome::NotApplied) = result {
            // The general form decides; the key skips the light forms.
            self.note_contended(&key);
            let general = Handoff {
                light: false,
                ..handoff.handoff
            };
            let handoff = HandoffSent {
                handoff: general,
                ..handoff
            };
            self.send_handoff(key, handoff, respond_to);
            return;
        }
        let HandoffSent {
            handoff,
            sent,
            contended,
            follow_up,
        } = handoff;
        // The general form went: the key skips the light forms. Where the
        // store has no light handoff (the in-memory twin), the general
        // form's answer tells whether one would have applied: only to a
        // handoff it acquired, of a key not contended.
        let acquired = matches!(result, Ok(HandoffOutcome::Acquired { .. }));
        let light_would_do =
            handoff.light || (!self.profile(key.place).light_forms.handoff && !contended);
        if !(acquired && light_would_do) {
            self.note_contended(&key);
        }
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        if let Ok(HandoffOutcome::Acquired { token }) = result {
            tracing::debug!(%key, token, "handoff to a local waiter");
            state.releases_in_flight -= 1;
            if let Some(respond_to) = respond_to {
                let _ = respond_to.send(Ok(ReleaseOutcome::Released));
            }
            let acquired = Ok((AcquireOutcome::Acquired { token }, None));
            self.on_acquired(key, sent, acquired);
            return;
        }
        // Answered as a release: what was announced meanwhile matters only
        // to an acquisition's answer.
        state.end_attempt();
        state.note_miss(sent.lease_id, sent.ttl, None, None);
        // A handoff whose outcome stayed unknown may have landed under the
        // next lease id: its next attempt recognises it as a retry.
        if result.as_ref().is_err_and(|e| e.is_transient()) {
            state.unknown_outcome = Some(sent.shape);
        }
        let released = result.map(|outcome| u64::from(outcome != HandoffOutcome::Lost));
        self.on_released(key, respond_to, follow_up, released);
    }
}

/// A handoff in flight: the request sent, and what its answer needs.
pub(super) struct HandoffSent {
    handoff: Handoff,
    /// The waiter's acquisition it makes.
    sent: AcquireSent,
    /// The key was contended (`group_commit`) when the handoff was sent.
    contended: bool,
    /// As [`Actor::send_release`]'s `follow_up`, if it released instead.
    follow_up: Option<Instant>,
}
