//! The actor's per-key state: the local waiters of a key, the leases
//! held on it, and its one retry loop against MongoDB (`KeyState`, one
//! entry of `Actor::keys` per key in use, removed when idle).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::delay_queue;
use uuid::Uuid;

use super::AcquireSent;
use super::command::{Granted, Waiter};
use crate::error::Result;
use crate::key::LeaseKey;
use crate::kind::{LeaseKind, LeaseShape};
use crate::status::LeaseState;
use crate::store::LeaseRef;

/// A lease this manager holds.
pub(super) struct Held {
    pub(super) lease_id: Uuid,
    pub(super) token: u64,
    /// Shared with the caller's `Lease`: its token, its local deadline as
    /// the handle reads it, and why it was lost.
    pub(super) state: Arc<LeaseState>,
    /// The lease's TTL: its renewals set `exp = $$NOW + ttl`.
    pub(super) ttl: Duration,
    /// The heartbeat renews it; `false` for a lease held at most its TTL
    /// (`Acquire::hold_at_most`), never renewed nor checked by a
    /// renewal.
    pub(super) renews: bool,
    /// Start of the last confirmed renewal (or of the acquire) + ttl − safety margin.
    pub(super) deadline: Instant,
    /// How many renewals of this lease are in flight or scheduled for retry:
    /// the heartbeat's, and the checks of [`Actor::check_held`] (which renew
    /// a lease at once even while the heartbeat's renewal is in flight, as
    /// that one may have been sent before the write). The heartbeat skips a
    /// lease while it is not zero; each confirmed renewal counts one down.
    pub(super) renewing: u32,
    /// How it holds its key (several leases of a key are held at once only
    /// when their kinds allow it, see [`KeyState::admits`]).
    pub(super) kind: LeaseKind,
    /// Its followers were told of a request to release its key: the
    /// heartbeat's read of requests (`Actor::poll_revocations`) skips it.
    pub(super) revocation_told: bool,
    /// When the reply of the acquire that took it arrived (local clock): its
    /// fencing token's millisecond, the server's time of the write, is no
    /// later than this (on one clock; `DELETE_DELAY`'s margin covers the
    /// server's steps back). In delete mode, whether its document can be
    /// deleted at release (see [`Actor::follow_up_due`]). Not the
    /// time the acquire was sent: under load a request may reach the server
    /// long after it was sent, and the token would then still be too young
    /// at a follow-up timed from the send.
    pub(super) acquired_at: Instant,
    /// Its tracing span (key, owner id, fencing token), if a subscriber
    /// wanted one when it was acquired.
    pub(super) span: Option<Box<tracing::Span>>,
}

impl Held {
    /// This lease as the store names it (`key`: its key).
    pub(super) fn lease_ref(&self, key: &LeaseKey) -> LeaseRef {
        LeaseRef {
            key: key.clone(),
            lease_id: self.lease_id,
            kind: self.kind,
        }
    }
}

/// The state of a key's one retry loop against MongoDB.
#[derive(Clone, Copy)]
pub(super) enum Attempt {
    /// None in flight nor scheduled.
    Idle,
    /// One in flight under `KeyState::next_lease_id` (an acquire, or a
    /// handoff to the first local waiter), with what the change stream of
    /// writes announced since it was sent.
    InFlight(Meanwhile),
    /// The next one starts when `timer` fires.
    Scheduled {
        timer: delay_queue::Key,
        /// The last attempt found this owner behind others in the key's
        /// queue where no release or handoff is for it soon
        /// (`Actor::on_acquired`): the key needs no change stream while it
        /// waits (`Actor::pause_write_stream_if_unneeded`; "Queue of
        /// waiting owners" in `store`).
        far_behind: bool,
    },
}

/// What the change stream of writes announced about a key while its
/// attempt was in flight: the attempt may have read the key before.
#[derive(Clone, Copy, Default)]
pub(super) struct Meanwhile {
    /// A write that may take the key from the acquisition in flight (its
    /// event may come before the acquire reply): the lease is checked as
    /// soon as it is granted.
    pub(super) may_take: bool,
    /// The key was announced free (a release, a delete, a handoff to this
    /// owner, or a stream that opened): the attempt may have read it before,
    /// so a `Held` answer is stale and the key is tried again at once
    /// instead of after its backoff.
    pub(super) freed: bool,
}

/// A key's standing in its queue of waiting owners under
/// `KeyState::next_lease_id` ("Queue of waiting owners" in `store`, the
/// actor's side in `queue`), as its attempts and the change stream of
/// writes left it, and so what its next attempt is for. Set by the
/// transitions of [`KeyState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    /// Not registered: no attempt registered yet, an answer that registers
    /// nothing (not a waiting exclusive attempt of the lock collection, a
    /// foreign holder's lock, one's own), an acquisition, or the queue left
    /// at shutdown.
    Unregistered,
    /// The last attempt registered this manager in the key's queue (or may
    /// have: a waiting exclusive attempt whose outcome is unknown counts as
    /// registered, so that shutdown or a waiter leaving leaves that queue).
    Registered,
    /// A release handed the key to that registration (announced by the
    /// change stream of writes): the next attempt confirms it; should every
    /// waiter leave first, the handed lease is given back at once
    /// (`Actor::remember_registration`).
    Handed,
    /// Handed, then shutdown left the key's queue
    /// (`Actor::leave_queues_at_shutdown`, which also releases what was
    /// handed): not counted registered any more, but an attempt in flight
    /// then that may still have registered makes it `Handed` again.
    HandedThenLeft,
    /// The next attempt was scheduled at once to confirm a lease of this
    /// key's lease id that only a read found
    /// ([`AcquireOutcome::Unconfirmed`](crate::store::AcquireOutcome::Unconfirmed)):
    /// should it be answered so again, the one after waits for the backoff.
    /// Lasts until that attempt's answer, whatever happens meanwhile.
    ConfirmingFound,
}

impl Standing {
    /// Whether this manager counts itself in the key's queue: shutdown, or
    /// every waiter leaving, leaves it (`Actor::leave_queues_at_shutdown`,
    /// `Actor::remember_registration`), and a handoff announced to it is
    /// granted on the event or confirmed (`Actor::on_handoff`).
    pub(super) fn is_registered(self) -> bool {
        matches!(self, Standing::Registered | Standing::Handed)
    }
}

/// The leases held on one key: one inline (the common case: an exclusive
/// lease), more on the heap (shared and semaphore keys). Inline, a held
/// lease costs no allocation of its own beside its key's boxed state.
pub(super) type Holders = smallvec::SmallVec<[Held; 1]>;

/// Everything the actor knows about one key. Removed when idle.
pub(super) struct KeyState {
    /// The leases held here: at most one exclusive lease, or any number of
    /// shared leases, or up to `permits` permits of a semaphore.
    pub(super) holders: Holders,
    pub(super) waiters: VecDeque<Waiter>,
    pub(super) attempt: Attempt,
    /// Releases of this key in flight; no acquire attempt starts meanwhile.
    pub(super) releases_in_flight: u32,
    /// Lease id of the next acquisition, kept across retries so that an
    /// attempt whose outcome was unknown is recognised as ours on the next try.
    pub(super) next_lease_id: Uuid,
    /// The shape of an attempt under `next_lease_id` whose outcome is
    /// unknown (it may have landed unseen, or land later, whatever the
    /// later attempts' answers): every later attempt under that lease id
    /// must ask for the same shape, or the lease id is given back.
    pub(super) unknown_outcome: Option<LeaseShape>,
    /// Attempts since the last acquisition (the backoff exponent).
    pub(super) failures: u32,
    /// Its standing in the key's queue of waiting owners, and what its next
    /// attempt is for.
    pub(super) standing: Standing,
    /// What the answers of attempts that did not acquire tell about a lease
    /// written under their lease id (see [`Misses`]); boxed, as only
    /// keys waiting for another holder have one.
    pub(super) misses: Option<Box<Misses>>,
}

/// The attempts of one key under one lease id that did not acquire (its
/// misses), as a
/// lease announced under that lease id needs them to be granted on the
/// event, without another attempt (`Actor::on_handoff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Misses {
    /// The lease id they were sent under.
    pub(super) lease_id: Uuid,
    /// The shortest TTL any of them asked for. A lease written under
    /// `lease_id` lasts at least `min(shortest_ttl, R)` from its write (R:
    /// the registration window): one of them acquired it (for its TTL), or
    /// a release handed it to the registration one of them wrote (for its
    /// `hx = min(ttl, R)`, "Queue of waiting owners" in `store`).
    pub(super) shortest_ttl: Duration,
    /// The last of them registered this manager in the key's queue of
    /// waiting owners (see [`Registration`]).
    pub(super) registered: Option<Registration>,
    /// The payload the last of them acquires with, as [`payload_hash`]:
    /// a lease handed to its registration carries it.
    pub(super) payload: Option<u64>,
}

/// A digest of an attempt's payload (`Acquire::payload`), to tell
/// whether two attempts under one lease id asked for the same one.
pub(super) fn payload_hash(payload: Option<&mongodb::bson::Document>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let bytes = mongodb::bson::to_vec(payload?).unwrap_or_default();
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    Some(hasher.finish())
}

/// An attempt that registered its manager in a key's queue of waiting
/// owners, as [`Misses`] keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Registration {
    /// When it was sent.
    pub(super) sent_at: Instant,
    /// How long its answer took: a renewal, sent at once by a lease granted
    /// on the event, takes about as long.
    pub(super) round_trip: Duration,
    /// The fencing token it found on the key. A write that shows the
    /// attempt's lease id with a greater token came after it ran, as tokens
    /// only grow, and so after it was sent (on one clock; the same
    /// assumption as every local deadline).
    pub(super) token: u64,
}

/// How many round trips of its last registering attempt a lease granted on
/// the event of its handoff must have left before its local deadline: its
/// renewal, sent at once, must land well before it (the fault scenarios
/// give a heartbeat's renewal ten majority writes in the same way).
pub(super) const GRANT_ROUND_TRIPS: u32 = 10;

impl Misses {
    /// The local deadline of a lease shown written under `lease_id` with
    /// fencing `token`, for a waiter asking for `ttl`, if it leaves time
    /// for its renewal at `now`: the last registering attempt's send + the
    /// validity of `min(ttl, shortest_ttl, window)` (`validity`: the TTL
    /// minus the safety margin). `None` when these attempts were under
    /// another lease id, none registered last, the token is not greater
    /// than the one it found (the write may predate that attempt: an old
    /// event), or the deadline is less than [`GRANT_ROUND_TRIPS`] of that
    /// attempt's round trips away.
    pub(super) fn deadline(
        &self,
        lease_id: Uuid,
        token: u64,
        ttl: Duration,
        window: Duration,
        validity: impl Fn(Duration) -> Duration,
        now: Instant,
    ) -> Option<Instant> {
        let registered = self.registered?;
        if self.lease_id != lease_id || token <= registered.token {
            return None;
        }
        let deadline = registered.sent_at + validity(ttl.min(self.shortest_ttl).min(window));
        let renewal = registered.round_trip.saturating_mul(GRANT_ROUND_TRIPS);
        (deadline > now + renewal).then_some(deadline)
    }
}

impl KeyState {
    pub(super) fn new() -> Self {
        KeyState {
            holders: Holders::new(),
            waiters: VecDeque::new(),
            attempt: Attempt::Idle,
            releases_in_flight: 0,
            next_lease_id: crate::random::uuid(),
            unknown_outcome: None,
            failures: 0,
            standing: Standing::Unregistered,
            misses: None,
        }
    }

    /// Records the answer of an attempt under `lease_id` asking for `ttl`
    /// that did not acquire (see [`Misses`]), and whether it registered
    /// in the key's queue of waiting owners (`None` also when the token it
    /// found is unknown: such a registration cannot be ordered against a
    /// handoff).
    pub(super) fn note_miss(
        &mut self,
        lease_id: Uuid,
        ttl: Duration,
        registered: Option<Registration>,
        payload: Option<u64>,
    ) {
        let fresh = Misses {
            lease_id,
            shortest_ttl: ttl,
            registered: None,
            payload,
        };
        let record = self.misses.get_or_insert_with(|| Box::new(fresh));
        if record.lease_id != lease_id {
            **record = fresh;
        }
        record.shortest_ttl = record.shortest_ttl.min(ttl);
        record.registered = registered;
        record.payload = payload;
    }

    /// [`note_miss`](Self::note_miss) of the attempt `sent`.
    pub(super) fn note_miss_of(&mut self, sent: &AcquireSent, registered: Option<Registration>) {
        let payload = payload_hash(sent.payload.as_ref());
        self.note_miss(sent.lease_id, sent.ttl, registered, payload);
    }

    pub(super) fn is_idle(&self) -> bool {
        self.holders.is_empty()
            && self.waiters.is_empty()
            && matches!(self.attempt, Attempt::Idle)
            && self.releases_in_flight == 0
    }

    /// The held lease `lease_id` of this key.
    pub(super) fn holder(&self, lease_id: Uuid) -> Option<&Held> {
        self.holders.iter().find(|h| h.lease_id == lease_id)
    }

    /// The held lease `lease_id` of this key, to change.
    pub(super) fn holder_mut(&mut self, lease_id: Uuid) -> Option<&mut Held> {
        self.holders.iter_mut().find(|h| h.lease_id == lease_id)
    }

    /// Whether an acquisition of `shape` can start beside the leases held
    /// here: an exclusive one only when none is held, a shared one beside
    /// shared ones, a permit beside fewer than `permits` permits of the same
    /// number. The store has the last word (other processes' holders).
    pub(super) fn admits(&self, shape: &LeaseShape) -> bool {
        match shape.kind {
            LeaseKind::Permit { permits } => {
                self.holders.iter().all(|h| h.kind == shape.kind)
                    && self.holders.len() < permits as usize
            }
            LeaseKind::Shared => self.holders.iter().all(|h| h.kind == LeaseKind::Shared),
            _ => self.holders.is_empty(),
        }
    }

    /// Whether an attempt for `shape` can start now as far as this key goes:
    /// its holders admit it, and no attempt or release of it is under way.
    pub(super) fn can_start(&self, shape: &LeaseShape) -> bool {
        self.admits(shape) && self.releases_in_flight == 0 && matches!(self.attempt, Attempt::Idle)
    }

    /// The kind the leases held here have, if a waiter asking for `kind`
    /// cannot get it while they are held: a semaphore's permits and another
    /// kind (or another number of permits), either way. The store would
    /// answer [`AcquireOutcome::Mismatch`] (these leases are live there), so
    /// such a waiter is answered at once instead of blocking the waiters
    /// behind it until they are released.
    pub(super) fn mismatch(&self, kind: LeaseKind) -> Option<LeaseKind> {
        let stored = self.holders.first()?.kind;
        let semaphore =
            matches!(stored, LeaseKind::Permit { .. }) || matches!(kind, LeaseKind::Permit { .. });
        (semaphore && stored != kind).then_some(stored)
    }

    /// Drops waiters whose acquire future is gone.
    pub(super) fn prune_waiters(&mut self) {
        self.waiters.retain(|w| !w.respond_to.is_closed());
    }

    /// Answers each waiter `answer` has an answer for; the others still
    /// waiting keep their order.
    pub(super) fn answer_waiters(
        &mut self,
        mut answer: impl FnMut(&Waiter) -> Option<Result<Option<Granted>>>,
    ) {
        for waiter in std::mem::take(&mut self.waiters) {
            match answer(&waiter) {
                Some(reply) => {
                    let _ = waiter.respond_to.send(reply);
                }
                None if !waiter.respond_to.is_closed() => self.waiters.push_back(waiter),
                None => {}
            }
        }
    }

    /// An attempt under `next_lease_id` starts: writes announced before
    /// concern earlier attempts.
    pub(super) fn begin_attempt(&mut self) {
        self.attempt = Attempt::InFlight(Meanwhile::default());
    }

    /// The attempt in flight was answered (or, for a handoff, answered as a
    /// release): what was announced while it was in flight.
    pub(super) fn end_attempt(&mut self) -> Meanwhile {
        match std::mem::replace(&mut self.attempt, Attempt::Idle) {
            Attempt::InFlight(meanwhile) => meanwhile,
            _ => Meanwhile::default(),
        }
    }

    /// The acquire attempt's answer arrived: whether it was the attempt
    /// scheduled to confirm a lease found by a read
    /// ([`Standing::ConfirmingFound`]), which its answer ends.
    pub(super) fn take_confirming(&mut self) -> bool {
        let confirming = self.standing == Standing::ConfirmingFound;
        if confirming {
            self.standing = Standing::Unregistered;
        }
        confirming
    }

    /// The next attempt starts when `timer` fires (`far_behind`: see
    /// [`Attempt::Scheduled`]).
    pub(super) fn schedule(&mut self, timer: delay_queue::Key, far_behind: bool) {
        self.attempt = Attempt::Scheduled { timer, far_behind };
    }

    /// The scheduled attempt is called off: its timer, to remove, if one was
    /// scheduled.
    pub(super) fn unschedule(&mut self) -> Option<delay_queue::Key> {
        match self.attempt {
            Attempt::Scheduled { timer, .. } => {
                self.attempt = Attempt::Idle;
                Some(timer)
            }
            _ => None,
        }
    }

    /// The attempt's answer found a lease of `next_lease_id` by a read only
    /// (`AcquireOutcome::Unconfirmed`): it registers nothing, and whatever
    /// was handed to a registration is that lease.
    pub(super) fn found_by_read(&mut self) {
        self.standing = Standing::Unregistered;
    }

    /// The next attempt, at `timer` (at once), confirms the lease a read
    /// found ([`Standing::ConfirmingFound`]).
    pub(super) fn confirm_found(&mut self, timer: delay_queue::Key) {
        self.standing = Standing::ConfirmingFound;
        self.schedule(timer, false);
    }

    /// The attempt's answer found the key held by another: it registered
    /// this manager in the key's queue (`registered`) or not.
    pub(super) fn held_elsewhere(&mut self, registered: bool) {
        self.standing = if registered {
            Standing::Registered
        } else {
            Standing::Unregistered
        };
    }

    /// The outcome of a waiting exclusive attempt is unknown: it may have
    /// registered, so it counts as registered (a key handed to an earlier
    /// registration stays handed).
    pub(super) fn may_have_registered(&mut self) {
        self.standing = match self.standing {
            Standing::Handed | Standing::HandedThenLeft => Standing::Handed,
            Standing::Unregistered | Standing::Registered | Standing::ConfirmingFound => {
                Standing::Registered
            }
        };
    }

    /// The change stream announced a release that handed the key to this
    /// registration (only while registered): the next attempt confirms it.
    pub(super) fn handed(&mut self) {
        self.standing = Standing::Handed;
    }

    /// Shutdown leaves the key's queue: whether this manager counted itself
    /// in it (it is left once; see [`Standing::HandedThenLeft`]).
    pub(super) fn leave_queue(&mut self) -> bool {
        self.standing = match self.standing {
            Standing::Registered => Standing::Unregistered,
            Standing::Handed => Standing::HandedThenLeft,
            _ => return false,
        };
        true
    }

    /// The key was acquired under `next_lease_id`: the backoff, the
    /// registration and the missed attempts start over, under a new
    /// lease id.
    pub(super) fn acquired(&mut self) {
        self.failures = 0;
        self.standing = Standing::Unregistered;
        self.misses = None;
        self.unknown_outcome = None;
        self.next_lease_id = crate::random::uuid();
    }

    /// The key, handed to this registration, is granted on the event
    /// (`Actor::grant_handed`): its scheduled attempt is called off (the
    /// caller removes its timer), and the key starts over as after any
    /// acquisition.
    pub(super) fn acquired_on_event(&mut self) {
        self.attempt = Attempt::Idle;
        self.acquired();
    }

    /// Gives up `next_lease_id` (its lease is being given back): the next
    /// attempt goes under a new one.
    pub(super) fn new_lease_id(&mut self) -> Uuid {
        self.unknown_outcome = None;
        std::mem::replace(&mut self.next_lease_id, crate::random::uuid())
    }
}
