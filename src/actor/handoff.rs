//! Handoff to a local waiter: the release of an exclusive lease whose key a
//! local caller waits for makes that caller the holder in the releasing
//! write itself (`Store::hand_over`, "Handoff to a local waiter" in
//! `store`), one round trip instead of a release and then an acquire.
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

use super::command::{Place, Reply, Target};
use super::{Actor, Attempt, Event, Held, Sent};
use crate::error::Result;
use crate::kind::LeaseKind;
use crate::status::ReleaseOutcome;
use crate::store::{AcquireOutcome, HandOver};

impl Actor {
    /// Whether the release of `held` (just taken from `key`) can hand the
    /// key to its first local waiter: a plain exclusive lease of the lock
    /// collection, a first waiter asking for a plain exclusive lease, and
    /// nothing else in flight for the key (no attempt, release, nor unknown
    /// outcome).
    pub(super) fn can_hand_over(&mut self, key: &Target, held: &Held) -> bool {
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
            .is_some_and(|w| w.is_plain() && state.can_start(&w.shape))
            && state.unseen.is_none()
    }

    /// Sends the handoff of the lease `from` of `key` (acquired at
    /// `acquired_at`, see `Held::acquired_at`) to the first waiter; its
    /// answer comes back as [`Event::HandedOver`]. Only after
    /// [`Actor::can_hand_over`] said yes.
    pub(super) fn spawn_hand_over(
        &mut self,
        key: Target,
        from: Uuid,
        acquired_at: Instant,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        let follow_up = self.follow_up_due(key.place, acquired_at);
        let state = self.keys.get_mut(&key).expect("checked by can_hand_over");
        let waiter = state.waiters.front().expect("checked by can_hand_over");
        let sent = Sent {
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
        let light = !self.is_contended(&key);
        let hand_over = self.store(key.place).hand_over(
            key.key.clone(),
            from,
            sent.lease_id,
            sent.ttl,
            sent.shape,
            light,
        );
        self.spawn_store(hand_over, move |result| Event::HandedOver {
            key,
            sent,
            light,
            follow_up,
            respond_to,
            result,
        });
    }

    /// The handoff's answer: the releasing caller gets `Released` once the
    /// write is confirmed (`AlreadyLost` if the lease was lost); the key
    /// goes to the first waiter still waiting, or, if it was released
    /// instead, that waiter's attempt starts.
    pub(super) fn on_handed_over(
        &mut self,
        key: Target,
        (sent, light): (Sent, bool),
        follow_up: Option<Instant>,
        respond_to: Option<Reply<ReleaseOutcome>>,
        result: Result<HandOver>,
    ) {
        // The general form went (it was not tried light, or the light form
        // did not hand the key over): the key skips the light forms.
        if !light || !matches!(result, Ok(HandOver::Acquired { .. })) {
            self.note_contended(&key);
        }
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        if let Ok(HandOver::Acquired { token }) = result {
            tracing::debug!(%key, token, "lease handed over to a local waiter");
            state.releases_in_flight -= 1;
            if let Some(respond_to) = respond_to {
                let _ = respond_to.send(Ok(ReleaseOutcome::Released));
            }
            let acquired = Ok((AcquireOutcome::Acquired { token }, None));
            self.on_acquired(key, sent, acquired);
            return;
        }
        state.attempt = Attempt::Idle;
        state.note_unanswered(sent.lease_id, sent.ttl, None, None);
        // A handoff whose outcome stayed unknown may have landed under the
        // next lease id: its next attempt recognises it as a retry.
        if result.as_ref().is_err_and(|e| e.is_transient()) {
            state.unseen = Some(sent.shape);
        }
        let released = result.map(|outcome| u64::from(!matches!(outcome, HandOver::Lost)));
        self.on_released(key, respond_to, follow_up, released);
    }
}
