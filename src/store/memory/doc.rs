//! The twin's lock document ([`Doc`]), the holders of a shared or semaphore
//! key in it ([`Holder`]).

use std::time::Duration;

use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use crate::kind::LeaseKind;

/// One lock document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Doc {
    /// `aid`: owner id of the holder (or last holder).
    pub owner: String,
    /// `lid`: lease id of the current acquisition; `None` once released.
    pub lease_id: Option<Uuid>,
    /// `tok`: fencing token of the current (or last) acquisition.
    pub token: u64,
    /// `exp`: server time at which the lease expires.
    pub exp: Instant,
    /// `acq`: server time of the acquisition.
    pub acquired: Instant,
    /// `ts`: server time of the last acquire or renewal.
    pub renewed: Instant,
    /// `data`: the holder's payload.
    pub payload: Option<Document>,
    /// `wt`: when another owner first waited for the current lease.
    pub waiting_since: Option<Instant>,
    /// `yu`: until when the last holder yielded the key to waiting owners.
    pub yield_until: Option<Instant>,
    /// `hs`: the holders of a shared or semaphore key, oldest first (empty:
    /// no `hs`; an exclusive key). The top fields then describe the key:
    /// no lease id, the latest holder acquisition's owner, token and time,
    /// `exp` at least the latest holder's.
    pub holders: Vec<Holder>,
    /// `pm`: a semaphore key's number of permits, while it has holders.
    pub permits: Option<u32>,
    /// `hl`: the key stays held until then (an exclusive acquisition's
    /// `hold_at_least`): `exp` never goes below it.
    pub hold_until: Option<Instant>,
    /// `rl`: when a holder was last removed from `hs`.
    pub released_at: Option<Instant>,
    /// `xw`: an exclusive waiter's mark on a shared key, `(aid, exp)`: no
    /// shared acquisition succeeds while it is live.
    pub exclusive_waiter: Option<(String, Instant)>,
    /// `q`: the owners waiting for an exclusive key, in arrival order (see
    /// "Queue of waiting owners" in `store`).
    pub queue: Vec<Waiting>,
    /// `tr`: leader transitions ("Leader transitions" in `store`).
    pub transitions: u64,
    /// `nb`: the end of a lock-delay (a force release or a release by owner
    /// id of a live lease; "Lock-delay" in `store`): `exp` never goes
    /// below it, and no kind is granted before it.
    pub not_before: Option<Instant>,
    /// `rv`: a cooperative revocation's request, `(aid, at)` ("Revocation"
    /// in `store`); cleared by a new acquisition and a handoff.
    pub revocation: Option<(String, Instant)>,
}

/// An entry of `q`: an owner waiting for an exclusive key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waiting {
    /// `aid`: the waiting owner.
    pub owner: String,
    /// `lid`: the lease id its next acquisition carries.
    pub lease_id: Uuid,
    /// `at`: when it first registered.
    pub at: Instant,
    /// `re`: when its registration expires.
    pub re: Instant,
    /// `hx`: how long a lease handed to it lasts unconfirmed.
    pub hx: Duration,
    /// `data`: the payload it acquires with, written by a handoff to it.
    pub payload: Option<Document>,
}

/// How a losing waiting attempt registers in `q` ("Queue of waiting owners"
/// in `store`): for how long (`re = now + window`), and while fewer than
/// `bound` entries are live (`store::MAX_QUEUE`, unless
/// [`MemoryStore::with_queue_bound`](super::MemoryStore::with_queue_bound)
/// sets a smaller one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Registration {
    /// The registering manager's registration window (`R`).
    pub window: Duration,
    /// The most live entries `q` may hold for a new one to be appended.
    pub bound: usize,
}

/// One holder of a shared or semaphore key: an entry of `hs`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Holder {
    /// `aid`.
    pub owner: String,
    /// `lid`; `None` for the place of a holder an operator's release by
    /// owner id ended, kept until its expiry (no write of its matches it).
    pub lease_id: Option<Uuid>,
    /// `xl`: that ended holder's lease id (an acquisition under it takes no
    /// place again).
    pub ended: Option<Uuid>,
    /// `tok`: also the key's top `tok` when it was acquired.
    pub token: u64,
    /// `acq`.
    pub acquired: Instant,
    /// `ts`.
    pub renewed: Instant,
    /// `exp`.
    pub exp: Instant,
    /// `data`: this holder's payload.
    pub payload: Option<Document>,
    /// `n`: how many permits it takes (1 for a shared holder).
    pub permits: u32,
}

impl Doc {
    /// A document held by `owner` from now for `ttl`, with token `token`.
    pub fn held(owner: &str, token: u64, ttl: Duration) -> Doc {
        let now = Instant::now();
        Doc::fresh(owner, Some(Uuid::new_v4()), token, now, now + ttl)
    }

    /// A released document with token `token` (what an upsert starts from).
    pub(super) fn vacant(now: Instant, token: u64) -> Doc {
        Doc::fresh("", None, token, now, now)
    }

    /// A new exclusive acquisition by `owner` under `lease_id` at `now`:
    /// the token rule's token (`max(tok + 1, floor)`, `floor` the rule's
    /// time part at `now`, `Collection::token_floor`), `exp = max(now + ttl, hl)` with `hl = now + hold` if
    /// `hold` is given, no payload, no holders and no fairness marks.
    /// Returns the token.
    pub(super) fn take(
        &mut self,
        owner: &str,
        lease_id: Uuid,
        ttl: Duration,
        hold: Option<Duration>,
        (now, floor): (Instant, u64),
    ) -> u64 {
        let queue = std::mem::take(&mut self.queue);
        let transitions = self.transitions_after(owner);
        let token = (self.token + 1).max(floor);
        *self = Doc::fresh(owner, Some(lease_id), token, now, now + ttl);
        self.queue = queue;
        self.transitions = transitions;
        self.leave_queue(owner, now);
        self.hold_until = hold.map(|hold| now + hold);
        self.exp = self.floor(self.exp);
        self.token
    }

    /// The leader transitions after a new acquisition by `owner`: 0 for a
    /// new document (no owner), one more if the last acquisition was
    /// another owner's.
    pub(super) fn transitions_after(&self, owner: &str) -> u64 {
        match self.owner.as_str() {
            "" => 0,
            last if last == owner => self.transitions,
            _ => self.transitions + 1,
        }
    }

    /// The live entries of `q` at `now` (`re > now`), in order.
    pub fn live_queue(&self, now: Instant) -> impl Iterator<Item = &Waiting> {
        self.queue.iter().filter(move |w| w.re > now)
    }

    /// Whether `owner` may take a free key as far as the queue is
    /// concerned: no live entry, or the first live entry is `owner`'s.
    pub fn queue_allows(&self, owner: &str, now: Instant) -> bool {
        self.live_queue(now).next().is_none_or(|w| w.owner == owner)
    }

    /// The queue an acquisition by `owner` leaves: the other owners' live
    /// entries.
    pub(super) fn leave_queue(&mut self, owner: &str, now: Instant) {
        self.queue.retain(|w| w.re > now && w.owner != owner);
    }

    /// A losing waiting attempt's registration: `owner`'s entry refreshed
    /// in place (`at` kept) if it names another lease id or expires within
    /// half of the window, or appended while fewer than the bound are live;
    /// dead entries dropped.
    pub(super) fn register(
        &mut self,
        owner: &str,
        (lease_id, payload): (Uuid, Option<&Document>),
        ttl: Duration,
        Registration { window, bound }: Registration,
        now: Instant,
    ) {
        self.queue.retain(|w| w.re > now);
        let registered = self.queue.iter().any(|w| w.owner == owner);
        if !registered && self.queue.len() >= bound {
            // Beyond the bound: no new entry ("Bound" in `store`).
            return;
        }
        let fresh = |w: &Waiting| {
            w.lease_id == lease_id && w.re >= now + window / 2 && w.payload.as_ref() == payload
        };
        if self.queue.iter().any(|w| w.owner == owner && fresh(w)) {
            return;
        }
        let at = self
            .queue
            .iter()
            .find(|w| w.owner == owner)
            .map_or(now, |w| w.at);
        let entry = Waiting {
            owner: owner.to_string(),
            lease_id,
            at,
            re: now + window,
            hx: ttl.min(window),
            payload: payload.cloned(),
        };
        match self.queue.iter_mut().find(|w| w.owner == owner) {
            Some(mine) => *mine = entry,
            None => self.queue.push(entry),
        }
    }

    /// A document acquired (or released) at `now`, with no payload and no
    /// fairness marks.
    pub(super) fn fresh(
        owner: &str,
        lease_id: Option<Uuid>,
        token: u64,
        now: Instant,
        exp: Instant,
    ) -> Doc {
        Doc {
            owner: owner.to_string(),
            lease_id,
            token,
            exp,
            acquired: now,
            renewed: now,
            payload: None,
            waiting_since: None,
            yield_until: None,
            holders: Vec::new(),
            permits: None,
            hold_until: None,
            released_at: None,
            exclusive_waiter: None,
            queue: Vec::new(),
            transitions: 0,
            not_before: None,
            revocation: None,
        }
    }

    /// The lease as observers compare it, as `MongoStore`'s: without the
    /// fairness marks (`wt`, `yu`, `xw`) nor the last release of a holder
    /// (`rl`); the queue of waiting owners (`q`) is kept, so that its
    /// changes are states of their own (`LeaseInfo::waiters`).
    pub(super) fn observed(&self) -> Doc {
        Doc {
            waiting_since: None,
            yield_until: None,
            exclusive_waiter: None,
            released_at: None,
            ..self.clone()
        }
    }

    /// `exp` raised to `hl` and `nb` if the key must stay held until later.
    pub(super) fn floor(&self, exp: Instant) -> Instant {
        let exp = self.hold_until.map_or(exp, |until| exp.max(until));
        self.not_before.map_or(exp, |nb| exp.max(nb))
    }

    /// A lock-delay ahead at `now` (`nb > now`).
    pub fn delayed_at(&self, now: Instant) -> bool {
        self.not_before.is_some_and(|nb| nb > now)
    }
}

impl Doc {
    /// Free by the protocol's rule: `exp <= now`.
    pub fn is_free_at(&self, now: Instant) -> bool {
        self.exp <= now
    }

    /// Yielded by `owner` to waiting owners: `owner` cannot take it back yet.
    pub fn yielded_by(&self, owner: &str, now: Instant) -> bool {
        self.owner == owner && self.yield_until.is_some_and(|until| until > now)
    }

    /// How many permits the holders live at `now` take.
    pub fn permits_used(&self, now: Instant) -> u32 {
        self.live_holders(now).map(|h| h.permits).sum()
    }

    /// The holders of `hs` live at `now` (`exp > now`), oldest first.
    pub fn live_holders(&self, now: Instant) -> impl Iterator<Item = &Holder> {
        self.holders.iter().filter(move |h| h.exp > now)
    }

    /// The kind the key is held as at `now`: exclusive (a lease id, or a
    /// minimum hold ahead, with `exp > now`), shared or permits (live
    /// holders in `hs`), or `None`.
    pub fn live_kind(&self, now: Instant) -> Option<LeaseKind> {
        let hold = self.hold_until.is_some_and(|until| until > now);
        if (self.lease_id.is_some() || hold) && self.exp > now {
            Some(LeaseKind::Exclusive)
        } else if self.live_holders(now).next().is_some() {
            Some(self.stored_kind())
        } else {
            None
        }
    }

    /// The kind as stored (`store::stored_kind`): permits with `pm`, shared
    /// with `hs` alone, otherwise exclusive.
    pub fn stored_kind(&self) -> LeaseKind {
        match (self.holders.is_empty(), self.permits) {
            (true, _) => LeaseKind::Exclusive,
            (false, Some(permits)) => LeaseKind::Permit { permits },
            (false, None) => LeaseKind::Shared,
        }
    }
}
