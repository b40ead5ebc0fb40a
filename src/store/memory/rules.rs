//! The protocol's rules applied to a [`Collection`]: acquire, the lease
//! filter, release, and delete mode's follow-up delete (those of shared and
//! semaphore keys' holders are in [`kinds`](super::kinds)).

use crate::random::{HashMap, HashSet};
use std::time::Duration;

use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use super::db::MemoryDb;
use super::doc::{Doc, Registration};
use super::kinds;
use crate::config::{DELETE_MIN_TOKEN_AGE, ReleaseMode};
use crate::error::Result;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, HandoffOutcome, replies};
use crate::token::TOKEN_TIME_SHIFT;

/// The documents of a [`MemoryDb`], as its operations see them.
#[derive(Default, Clone)]
pub(crate) struct Collection {
    pub(super) docs: HashMap<LeaseKey, Doc>,
    /// Keys occupied by a foreign holder's lock document, as stored (`_id`
    /// included, dates in server time): never modified while live by its
    /// own rule (`crate::foreign`), except deleted by a force release; an
    /// acquisition takes it over once expired by that rule.
    pub(super) foreign: HashMap<LeaseKey, Document>,
    /// The server's clock's epoch (its instant, and the wall-clock time
    /// then), as its [`MemoryDb`]'s: the token rule's time part
    /// ([`Collection::token_floor`]).
    pub(super) epoch: Option<(Instant, std::time::SystemTime)>,
    /// In a place of in-document leases: user documents that do not exist
    /// ([`MemoryDb::remove_user_document`]); every other one does.
    pub(super) missing: HashSet<LeaseKey>,
    /// A place of in-document leases ([`MemoryDb::documents`]): no queue of
    /// waiting owners, as in `DocumentStore`.
    pub(super) in_documents: bool,
    /// In a place of in-document leases with `LockId` / `LockTime`: their
    /// clients' `max_duration` (`lock_id`).
    pub(super) lock_id_max: Option<Duration>,
    /// There: the documents another client locked by `LockId` / `LockTime`
    /// (`lock_id`).
    pub(super) their_locks: HashMap<LeaseKey, super::lock_id::TheirLock>,
}

impl Collection {
    /// What a new document starts from at `now`: no token. Nothing of a
    /// deleted document is remembered, as on MongoDB: the token rule's time
    /// part alone keeps a new document's token above a deleted one's.
    pub(super) fn vacant(&self, now: Instant) -> Doc {
        Doc::vacant(now, 0)
    }

    /// The token rule's time part at server time `now`: `ms($$NOW) *
    /// 2^20` (`src/token.rs`; `MongoStore`'s `next_token`). A server clock
    /// that steps back lowers it.
    pub(super) fn token_floor(&self, now: Instant) -> u64 {
        let Some((at, wall)) = self.epoch else {
            return 0;
        };
        let wall = match now.checked_duration_since(at) {
            Some(after) => wall + after,
            None => wall - at.duration_since(now),
        };
        let ms = wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        ms << TOKEN_TIME_SHIFT
    }

    /// The token rule, `max(tok + 1, ms($$NOW) * 2^20)`, after `previous`
    /// at server time `now`.
    pub(super) fn next_token(&self, previous: u64, now: Instant) -> u64 {
        (previous + 1).max(self.token_floor(now))
    }

    /// Delete mode's token-age test (`MongoStore`'s `token_older_than`):
    /// `ms($$NOW) * 2^20 >= tok + DELETE_MIN_TOKEN_AGE * 2^20`.
    pub(super) fn token_older_than_min_age(&self, token: u64, now: Instant) -> bool {
        let age = (DELETE_MIN_TOKEN_AGE.as_millis() as u64) << TOKEN_TIME_SHIFT;
        self.token_floor(now) >= token.saturating_add(age)
    }
}

/// The acquire rule, applied at server time `now`, for an acquisition of
/// `shape` (the rules of shared and semaphore keys are in
/// [`kinds`](super::kinds)).
///
/// A foreign holder's lock is held until its expiry by its own rule (the
/// rules of `db`, read by `replies::classify`), then taken over as a new
/// document, as the acquire pipelines' first stage does.
///
/// The queue of waiting owners (not in a place of in-document leases): a
/// free key is kept for the head of its queue, and a waiting attempt that
/// loses to another owner (or to the head) registers by `registration`
/// (its window, and the queue's bound), with the payload it acquires with
/// (`payload`), which a handoff to it writes.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_acquire(
    db: &MemoryDb,
    coll: &mut Collection,
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    ttl: Duration,
    waiting: bool,
    shape: LeaseShape,
    now: Instant,
    registration: Registration,
    payload: Option<&mongodb::bson::Document>,
) -> Result<AcquireOutcome> {
    let queues = !coll.in_documents;
    if let Some(outcome) = coll.acquire_over_their_lock(db, key, owner, lease_id, now) {
        return Ok(outcome);
    }
    if let Some(foreign) = coll.foreign.get(key) {
        let date = db.date(now);
        if !db.foreign_rules().free(foreign, false, date) {
            // Held by its own rule: read as `MongoStore` reads it.
            let projected = db.project_foreign(foreign, date);
            return Ok(replies::classify(key, owner, lease_id, &projected));
        }
        // Expired by its own rule: taken over in this write (the acquire
        // pipeline's first stage), as a new document.
        coll.foreign.remove(key);
    }
    let hold = shape.hold_at_least;
    let multi = shape.kind.is_multi_holder();
    // An acquisition under a lease id an operator's release by owner id
    // ended (`xl`), landing late, takes no place again: answered as a read
    // of the key answers it, as `MongoStore`'s, whose write changes nothing.
    let ended = |doc: &Doc| doc.holders.iter().any(|h| h.ended == Some(lease_id));
    if let Some(stored) = coll.docs.get(key).filter(|doc| multi && ended(doc)) {
        let date = |at: Instant| mongodb::bson::DateTime::from_system_time(db.system_time(at));
        let read = super::reply::multi(stored, owner, lease_id, now, date);
        return Ok(crate::store::replies::classify_multi(
            key, shape.kind, &read,
        ));
    }
    let floor = coll.token_floor(now);
    match coll.docs.get_mut(key) {
        None => {
            let mut doc = coll.vacant(now);
            let outcome = if multi {
                kinds::acquire_holder(&mut doc, owner, lease_id, ttl, shape, waiting, (now, floor))
            } else {
                AcquireOutcome::Acquired {
                    token: doc.take(owner, lease_id, ttl, hold, (now, floor)),
                }
            };
            coll.docs.insert(key.clone(), doc);
            Ok(outcome)
        }
        Some(doc) if multi => Ok(kinds::acquire_holder(
            doc,
            owner,
            lease_id,
            ttl,
            shape,
            waiting,
            (now, floor),
        )),
        Some(doc) if doc.lease_id == Some(lease_id) && doc.owner == owner => {
            // A retry of an acquisition that landed: same token, an expiry
            // never back (`expiry_after`). (A document rewritten to another
            // owner is not ours any more.) Its minimum hold: the one it
            // has, or from now if a handoff left none.
            if let Some(hold) = hold {
                doc.hold_until.get_or_insert(now + hold);
            }
            doc.exp = doc.floor(doc.exp.max(now + ttl));
            doc.renewed = now;
            doc.revocation = None;
            doc.leave_queue(owner, now);
            Ok(AcquireOutcome::Acquired { token: doc.token })
        }
        Some(doc) => match doc.live_kind(now) {
            Some(stored @ LeaseKind::Permit { .. }) => Ok(AcquireOutcome::Mismatch { stored }),
            Some(LeaseKind::Shared) => Ok(kinds::exclusive_waits(doc, owner, ttl, waiting, now)),
            _ if doc.exp <= now
                && !doc.yielded_by(owner, now)
                && (!queues || doc.queue_allows(owner, now)) =>
            {
                Ok(AcquireOutcome::Acquired {
                    token: doc.take(owner, lease_id, ttl, hold, (now, floor)),
                })
            }
            _ => {
                let held_by_other = doc.lease_id.is_some() && doc.exp > now && doc.owner != owner;
                let kept_for_queue = queues && !doc.queue_allows(owner, now);
                if waiting && (held_by_other || kept_for_queue) {
                    doc.waiting_since.get_or_insert(now);
                    if queues {
                        doc.register(owner, (lease_id, payload), ttl, registration, now);
                    }
                }
                let until = match doc.yield_until {
                    Some(until) if doc.owner == owner => doc.exp.max(until),
                    _ => doc.exp,
                };
                let head = doc.live_queue(now).next().filter(|w| w.owner != owner);
                // Other owners' live entries before this owner's (all of
                // them if it has none), as `replies::with_ahead` counts.
                let ahead = doc.live_queue(now).take_while(|w| w.owner != owner).count() as u32;
                Ok(match head {
                    // Free, but kept for the head of the queue.
                    Some(head) if until <= now => AcquireOutcome::Held {
                        ahead,
                        holder: head.owner.clone(),
                        remaining: Some(head.re.saturating_duration_since(now)),
                        token: Some(doc.token),
                    },
                    _ => AcquireOutcome::Held {
                        ahead,
                        holder: doc.owner.clone(),
                        remaining: Some(until.saturating_duration_since(now)),
                        token: Some(doc.token),
                    },
                })
            }
        },
    }
}

/// The `_id $in keys, lid $in ids, aid = owner` filter of
/// `MongoStore::lease_filter`.
pub(super) fn lease_matches(
    key: &LeaseKey,
    doc: &Doc,
    owner: &str,
    keys: &HashSet<&LeaseKey>,
    ids: &HashSet<Uuid>,
) -> bool {
    keys.contains(key) && doc.lease_id.is_some_and(|id| ids.contains(&id)) && doc.owner == owner
}

/// The release rule on one matching document at `now` (`exp` kept at
/// least `hl`).
pub(super) fn release_doc(doc: &mut Doc, now: Instant, yield_window: Duration) {
    doc.exp = doc.floor(doc.exp.min(now));
    doc.lease_id = None;
    if doc.waiting_since.take().is_some() {
        doc.yield_until = Some(now + yield_window);
    }
}

/// The release rule of an exclusive lease with the handoff of "Queue of
/// waiting owners": the first live entry of another owner, if the key has
/// no holders nor minimum hold ahead, becomes the holder (the token rule's
/// token after the last, `floor` its time part at `now`, `exp =
/// now + hx`, no `yu` nor `hl`, the entry's `data`) and leaves the queue; otherwise
/// [`release_doc`], dead entries dropped. Returns the new holder's owner id,
/// lease id and token.
pub(super) fn release_or_hand_over(
    doc: &mut Doc,
    (now, floor): (Instant, u64),
    yield_window: Duration,
) -> Option<(String, Uuid, u64)> {
    let hold_ahead = doc.hold_until.is_some_and(|until| until > now) || doc.delayed_at(now);
    let next = (doc.holders.is_empty() && !hold_ahead)
        .then(|| doc.live_queue(now).find(|w| w.owner != doc.owner).cloned())
        .flatten();
    release_doc(doc, now, yield_window);
    doc.queue.retain(|w| w.re > now);
    let next = next?;
    doc.queue.retain(|w| w.owner != next.owner);
    doc.transitions = doc.transitions_after(&next.owner);
    doc.owner = next.owner.clone();
    doc.lease_id = Some(next.lease_id);
    doc.token = (doc.token + 1).max(floor);
    doc.acquired = now;
    doc.renewed = now;
    doc.exp = now + next.hx;
    doc.yield_until = None;
    doc.hold_until = None;
    doc.payload = next.payload.clone();
    doc.revocation = None;
    Some((next.owner, next.lease_id, doc.token))
}

/// The handoff rule ("Handoff to a local waiter" in `store`) at `now`:
/// `from` of `owner`, live, becomes `to`'s new acquisition (next token,
/// `exp = now + ttl`, no payload, marks or minimum hold) unless another
/// owner waits or a minimum hold is live, which releases it instead (as
/// [`release_doc`], announced as a release). The acquisition is announced
/// as MongoDB's change stream shows it here: a write that sets `lid`
/// (a replacement, with `aid`; docs/mongodb-behaviour.md, B22).
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_handoff(
    coll: &mut Collection,
    db: &MemoryDb,
    key: &LeaseKey,
    owner: &str,
    (from, to): (Uuid, Uuid),
    ttl: Duration,
    yield_window: Duration,
    now: Instant,
) -> HandoffOutcome {
    let floor = coll.token_floor(now);
    let Some(doc) = coll.docs.get_mut(key) else {
        return HandoffOutcome::Lost;
    };
    if doc.lease_id != Some(from) || doc.owner != owner || doc.exp <= now {
        return HandoffOutcome::Lost;
    }
    let registered = doc.live_queue(now).any(|w| w.owner != owner);
    if registered || doc.waiting_since.is_some() || doc.hold_until.is_some_and(|until| until > now)
    {
        // Released, or handed to the first registered owner.
        match release_or_hand_over(doc, (now, floor), yield_window) {
            Some((next, lease_id, token)) => db.announce_acquisition(key, &next, lease_id, token),
            None => db.announce_release(key),
        }
        return HandoffOutcome::Released;
    }
    let token = doc.take(owner, to, ttl, None, (now, floor));
    db.announce_acquisition(key, owner, to, token);
    HandoffOutcome::Acquired { token }
}

impl Collection {
    /// The release rule on the documents of `keys` for which `matches` holds,
    /// at `now`, in `mode`: in delete mode a document nobody waited for
    /// (`wt` unset) whose token is at least
    /// [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) old by the
    /// server's clock is deleted (the token-age rule), every other one is marked released
    /// ([`release_or_hand_over`]: a release that hands the key over is
    /// announced as an acquisition). Announces each key; returns `(deleted,
    /// marked)`.
    pub(super) fn release_where(
        &mut self,
        db: &MemoryDb,
        matches: impl Fn(&LeaseKey, &Doc) -> bool,
        now: Instant,
        yield_window: Duration,
        mode: ReleaseMode,
    ) -> (u64, u64) {
        let keys: Vec<LeaseKey> = self
            .docs
            .iter()
            .filter(|(k, d)| matches(k, d))
            .map(|(k, _)| k.clone())
            .collect();
        let (mut deleted, mut marked) = (0, 0);
        let floor = self.token_floor(now);
        for key in keys {
            let old_enough = self.token_older_than_min_age(self.docs[&key].token, now);
            let doc = self.docs.get_mut(&key).expect("listed above");
            let deletable = mode == ReleaseMode::Delete
                && doc.waiting_since.is_none()
                && doc.queue.is_empty()
                && doc.hold_until.is_none_or(|until| until <= now)
                && !doc.delayed_at(now)
                && old_enough;
            if deletable {
                self.docs.remove(&key).expect("listed above");
                deleted += 1;
                db.announce_release(&key);
            } else {
                match release_or_hand_over(doc, (now, floor), yield_window) {
                    Some((owner, lease_id, token)) => {
                        db.announce_acquisition(&key, &owner, lease_id, token)
                    }
                    None => db.announce_release(&key),
                }
                marked += 1;
            }
        }
        (deleted, marked)
    }

    /// Delete mode's follow-up: deletes the released documents (no lease
    /// id, not yielded at `now`) for which `matches` holds, whose token is at
    /// least [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) old by
    /// the server's clock. Returns how many.
    pub(super) fn delete_released_where(
        &mut self,
        db: &MemoryDb,
        matches: impl Fn(&LeaseKey, &Doc) -> bool,
        now: Instant,
    ) -> u64 {
        let keys: Vec<LeaseKey> = self
            .docs
            .iter()
            .filter(|(k, d)| {
                matches(k, d)
                    && d.lease_id.is_none()
                    && d.queue.is_empty()
                    // As `released_filter`: no `hs` at all, even of
                    // expired holders.
                    && d.holders.is_empty()
                    && d.yield_until.is_none_or(|until| until <= now)
                    && d.hold_until.is_none_or(|until| until <= now)
                    && !d.delayed_at(now)
                    && self.token_older_than_min_age(d.token, now)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            self.docs.remove(key).expect("listed above");
            db.announce_release(key);
        }
        keys.len() as u64
    }
}
