//! What a reply means: the pure functions that turn a lock document, as an
//! acquire's write returned it or as a read found it afterwards, into an
//! [`AcquireOutcome`].
//!
//! Both stores decide with them ("What a reply means is decided once" in
//! ARCHITECTURE.md).
//!
//! **Written or read back.** A document returned by the attempt's own
//! write (`findAndModify` with the new document) shows what that write
//! did: a lease under the attempt's lease id was written, or renewed, by
//! it, from `$$NOW` at the server, so after the attempt was sent, and it
//! lasts the attempt's TTL from there. A document *read* after a write
//! whose outcome is unknown (a transient error, B7) or that failed shows
//! only the state at the read: a lease under the attempt's lease id there
//! may have been written by an earlier attempt, or by a release that
//! handed the key to this owner's registration in the queue of waiting
//! owners for `hx = min(ttl, R)` only ("Queue of waiting owners" in
//! `store`), and the read is a majority snapshot that may predate writes
//! already applied on the primary. [`from_reread`] turns a verdict on such
//! a read into what it is worth: an acquisition becomes
//! [`AcquireOutcome::Unconfirmed`] (the actor retries at once under the
//! same lease id, and that retry's write renews the lease and starts its
//! local deadline from its own send), and a `Held` answer loses its token,
//! so that it never orders a later handoff (grant on the change stream's
//! event, `actor::queue`).

use std::time::{Duration, SystemTime};

use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, DateTime, Document};
use uuid::Uuid;

use super::read::{self, int, permits};
use super::{AcquireOutcome, field, foreign_owner, is_our_layout};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;

/// Field of the shared and permit acquire projection: this acquisition's
/// entry of `hs`, if any.
pub(crate) const MINE: &str = "me";
/// Field of the shared and permit acquire projection: how many other live
/// entries `hs` has.
pub(crate) const LIVE: &str = "live";
/// Field of the shared and permit acquire projection: the earliest `exp`
/// of those.
pub(crate) const FIRST_EXPIRY: &str = "first";
/// Field of the shared and permit acquire projection: `yu` if this owner
/// yielded the key (then it is not this owner's before `yu`).
pub(crate) const YIELDED: &str = "yielded";
/// Field of every acquire projection: the server's `$$NOW`.
pub(crate) const NOW: &str = "now";

/// The verdict on a document that a read found, not the attempt's own
/// write (see the module docs). A key read as held as another kind is
/// `Held` with nothing left to wait: the read does not prove that the
/// write did not land, so the actor retries at once under the same lease
/// id and shape, and that write's own reply decides (else the lease id
/// would go to the next attempt, perhaps for another number of permits;
/// safety.md, property 2).
pub(crate) fn from_reread(outcome: AcquireOutcome) -> AcquireOutcome {
    match outcome {
        AcquireOutcome::Acquired { token } | AcquireOutcome::Unconfirmed { token } => {
            AcquireOutcome::Unconfirmed { token }
        }
        AcquireOutcome::Held {
            holder, remaining, ..
        } => AcquireOutcome::Held {
            ahead: 0,
            holder,
            remaining,
            token: None,
        },
        AcquireOutcome::Mismatch { .. } | AcquireOutcome::OursAsAnotherKind { .. } => {
            AcquireOutcome::Held {
                ahead: 0,
                holder: String::new(),
                remaining: Some(Duration::ZERO),
                token: None,
            }
        }
    }
}

/// An acquisition's write in the lock collection, sent by `send`: once
/// more after a transient error, as the driver retries a retryable write
/// (docs/mongodb-behaviour.md, B7). Unlike a retryable write's, the first
/// send may still land after the second is answered (`MongoStore` sends a
/// plain command), so an answer to a second send is worth only what a
/// read proves: give it to [`answered`] with the flag returned here,
/// whether it was sent again.
pub(crate) async fn sent_again_once<T, F>(send: impl Fn() -> F) -> (crate::error::Result<T>, bool)
where
    F: std::future::Future<Output = crate::error::Result<T>>,
{
    match send().await {
        Err(e) if e.is_transient() => (send().await, true),
        first => (first, false),
    }
}

/// The verdict on an acquisition's answer: as it is, or, for an answer to
/// a write sent again ([`sent_again_once`]), what a read proves
/// ([`from_reread`]), since its first send may land after it.
pub(crate) fn answered(outcome: AcquireOutcome, sent_again: bool) -> AcquireOutcome {
    match sent_again {
        true => from_reread(outcome),
        false => outcome,
    }
}

/// Whether `value` (a document's `lid`) is the lease id `id` (a UUID
/// binary).
fn is_lease_id(value: Option<&Bson>, id: Uuid) -> bool {
    matches!(value, Some(Bson::Binary(b))
        if b.subtype == BinarySubtype::Uuid && b.bytes.as_slice() == id.as_bytes())
}

/// The server's now of a projected document in ms, or `or` without one.
fn now_ms(doc: &Document, or: DateTime) -> i64 {
    doc.get_datetime(NOW)
        .map(|d| d.timestamp_millis())
        .unwrap_or(or.timestamp_millis())
}

/// Milliseconds from `now` to `until` (zero if past).
fn until(until: DateTime, now: i64) -> Duration {
    Duration::from_millis(until.timestamp_millis().saturating_sub(now).max(0) as u64)
}

/// A foreign holder's lock: its owner ([`foreign_owner`]) as holder, no
/// token, and the time left until its expiry by its rule (the projected
/// [`EXPIRY`](crate::foreign::EXPIRY)), or none for a lock with no expiry
/// ahead (a rule without one, or whose `held` outlasts it: the waiter is
/// woken by the lock's change).
fn foreign(key: &LeaseKey, doc: &Document) -> AcquireOutcome {
    tracing::trace!(%key, "held by a foreign holder");
    let remaining = doc
        .get_datetime(crate::foreign::EXPIRY)
        .ok()
        .map(|expiry| until(*expiry, now_ms(doc, *expiry)))
        .filter(|left| !left.is_zero());
    AcquireOutcome::Held {
        ahead: 0,
        holder: foreign_owner(doc),
        remaining,
        token: None,
    }
}

/// Reads what an exclusive acquire attempt (by `owner` under `lease_id`)
/// found out of a document projected with the exclusive acquire
/// projection (`mongo::acquire::acquire_projection`).
///
/// `Acquired` when the document holds `lease_id` of `owner`, live at the
/// projection's `now` (an expired one, which a write of this attempt never
/// returns, is `Unconfirmed`: a retry under that lease id wins and renews
/// it). A document of foreign layout is [`foreign`]; any other `Held`
/// carries the document's `tok`.
pub(crate) fn classify(
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    doc: &Document,
) -> AcquireOutcome {
    let token = doc.get_i64(field::TOKEN);
    let expires = doc.get_datetime(field::EXPIRES_AT);
    let (true, Ok(token), Ok(expires)) = (is_our_layout(doc), token, expires) else {
        return foreign(key, doc);
    };
    let now = now_ms(doc, *expires);
    let holder = doc.get_str(field::OWNER).unwrap_or_default().to_string();
    if is_lease_id(doc.get(field::LEASE_ID), lease_id) && holder == owner {
        let token = token as u64;
        return if expires.timestamp_millis() > now {
            AcquireOutcome::Acquired { token }
        } else {
            AcquireOutcome::Unconfirmed { token }
        };
    }
    // Live permits of a semaphore: never an exclusive acquisition's.
    if let Some(pm) = doc.get(field::PERMITS)
        && expires.timestamp_millis() > now
    {
        return AcquireOutcome::Mismatch {
            stored: LeaseKind::Permit {
                permits: permits(pm),
            },
        };
    }
    // Yielded by this owner: free for others now, for us at `yu`.
    let held_until = match doc.get_datetime(field::YIELD_UNTIL) {
        Ok(yielded) if holder == owner => *expires.max(yielded),
        _ => *expires,
    };
    AcquireOutcome::Held {
        ahead: 0,
        holder,
        remaining: Some(until(held_until, now)),
        token: Some(token as u64),
    }
}

/// The verdict on an exclusive acquire's document (by `owner` under
/// `lease_id`, for `ttl_ms`): [`classify`], then [`held_for_queue`] and
/// [`cap_for_mark`].
pub(crate) fn exclusive(
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    ttl_ms: i64,
    doc: &Document,
) -> AcquireOutcome {
    let outcome = classify(key, owner, lease_id, doc);
    let outcome = held_for_queue(outcome, doc, owner);
    let outcome = cap_for_mark(outcome, doc, owner, ttl_ms);
    with_ahead(outcome, doc, owner)
}

/// A `Held` answer with `ahead`: how many other owners' live entries of
/// `doc`'s `q` (projected with the server's `now`) come before `owner`'s,
/// or all of them if it has none. Other outcomes are returned as they are.
pub(crate) fn with_ahead(outcome: AcquireOutcome, doc: &Document, owner: &str) -> AcquireOutcome {
    let AcquireOutcome::Held {
        holder,
        remaining,
        token,
        ..
    } = outcome
    else {
        return outcome;
    };
    let ahead = doc
        .get_datetime(NOW)
        .ok()
        .map_or(0, |now| queued_ahead(doc, now.to_system_time(), owner));
    AcquireOutcome::Held {
        holder,
        remaining,
        token,
        ahead,
    }
}

/// The live entries of `doc`'s `q` at server time `now` of owners other
/// than `owner` that come before `owner`'s (all of them if it has none).
fn queued_ahead(doc: &Document, now: SystemTime, owner: &str) -> u32 {
    let Ok(queue) = doc.get_array(field::QUEUE) else {
        return 0;
    };
    let live = queue.iter().filter_map(|entry| {
        let entry = entry.as_document()?;
        let expires = entry.get_datetime(field::REGISTRATION_EXPIRES).ok()?;
        (expires.to_system_time() > now).then(|| entry.get_str(field::OWNER).unwrap_or_default())
    });
    live.take_while(|entry_owner| *entry_owner != owner).count() as u32
}

/// The verdict on an in-document acquire's document: the lock field `view`
/// (`mongo::document`'s `lock_view`: the lock field's fields and `now`)
/// read by [`classify`]; without a lock field, only a write in between can
/// have removed it: free now, the next attempt takes it.
pub(crate) fn in_document(
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    view: Option<&Document>,
) -> AcquireOutcome {
    match view {
        Some(view) => classify(key, owner, lease_id, view),
        None => AcquireOutcome::Held {
            ahead: 0,
            holder: String::new(),
            remaining: Some(Duration::ZERO),
            token: None,
        },
    }
}

/// An attempt by `owner` that did not win a key it found free (expired, not
/// yielded to it) waits for the head of the queue (`q` of `doc`, projected
/// with the server's `now`): reported held by that owner until its
/// registration expires, by when it has taken the key or lost its place
/// (the token, `tok` of the document, is kept). Other outcomes are returned
/// as they are.
pub(crate) fn held_for_queue(
    outcome: AcquireOutcome,
    doc: &Document,
    owner: &str,
) -> AcquireOutcome {
    let AcquireOutcome::Held {
        remaining: Some(remaining),
        token,
        ..
    } = &outcome
    else {
        return outcome;
    };
    let token = *token;
    if !remaining.is_zero() {
        return outcome;
    }
    let Ok(now) = doc.get_datetime(NOW).map(|d| d.to_system_time()) else {
        return outcome;
    };
    match live_head(doc, now) {
        Some((head, expires)) if head != owner => AcquireOutcome::Held {
            ahead: 0,
            holder: head,
            remaining: Some(expires.duration_since(now).unwrap_or(Duration::ZERO)),
            token,
        },
        _ => outcome,
    }
}

/// The owner id and registration expiry of the first live entry of `doc`'s
/// `q` at server time `now`.
fn live_head(doc: &Document, now: SystemTime) -> Option<(String, SystemTime)> {
    doc.get_array(field::QUEUE).ok()?.iter().find_map(|entry| {
        let entry = entry.as_document()?;
        let expires = entry
            .get_datetime(field::REGISTRATION_EXPIRES)
            .ok()?
            .to_system_time();
        let owner = entry.get_str(field::OWNER).ok()?;
        (expires > now).then(|| (owner.to_string(), expires))
    })
}

/// An exclusive attempt by `owner` that found live shared holders wrote
/// its waiting mark (`xw`, with its `aid`): it must try again before half
/// its TTL (`ttl_ms`) has passed, so that its mark stays live while it
/// waits. Caps the remaining time of a `Held` answer accordingly.
pub(crate) fn cap_for_mark(
    outcome: AcquireOutcome,
    doc: &Document,
    owner: &str,
    ttl_ms: i64,
) -> AcquireOutcome {
    let marked = doc
        .get_document(field::EXCLUSIVE_WAITER)
        .is_ok_and(|mark| mark.get_str(field::OWNER) == Ok(owner));
    match outcome {
        AcquireOutcome::Held {
            holder,
            remaining: Some(remaining),
            token,
            ..
        } if marked => AcquireOutcome::Held {
            ahead: 0,
            holder,
            remaining: Some(remaining.min(Duration::from_millis((ttl_ms / 2).max(0) as u64))),
            token,
        },
        other => other,
    }
}

/// The exclusive waiter's mark of a projected document, if live at `now`:
/// its owner id and expiry.
fn live_mark(doc: &Document, now: i64) -> Option<(String, Duration)> {
    let mark = doc.get_document(field::EXCLUSIVE_WAITER).ok()?;
    let exp = mark.get_datetime(field::EXPIRES_AT).ok()?;
    (exp.timestamp_millis() > now).then(|| {
        let owner = mark.get_str(field::OWNER).unwrap_or_default().to_string();
        (owner, until(*exp, now))
    })
}

/// Reads what a shared or permit acquisition of `kind` found, out of a
/// document projected with the shared and permit acquire projection
/// (`mongo::acquire::multi_acquire_projection`: the top fields, [`MINE`],
/// [`LIVE`], [`FIRST_EXPIRY`], [`YIELDED`], `now`), by the rules of "Shared
/// and semaphore keys" in `store`: an expired entry of ours is
/// `Unconfirmed`, as in [`classify`]; each `Held` carries the key's top
/// `tok`.
pub(crate) fn classify_multi(key: &LeaseKey, kind: LeaseKind, doc: &Document) -> AcquireOutcome {
    if !is_our_layout(doc) {
        return foreign(key, doc);
    }
    let exp = *doc.get_datetime(field::EXPIRES_AT).expect("our layout");
    let now = now_ms(doc, exp);
    if let Ok(entry) = doc.get_document(MINE) {
        let stored = read_kind(doc);
        if stored != kind && int(doc.get(LIVE)).unwrap_or(0) > 0 {
            return AcquireOutcome::OursAsAnotherKind { stored };
        }
        let token = entry.get_i64(field::TOKEN).unwrap_or(0) as u64;
        let live = entry
            .get_datetime(field::EXPIRES_AT)
            .is_ok_and(|entry_exp| entry_exp.timestamp_millis() > now);
        return if live {
            AcquireOutcome::Acquired { token }
        } else {
            AcquireOutcome::Unconfirmed { token }
        };
    }
    let holder = doc.get_str(field::OWNER).unwrap_or_default().to_string();
    let token = read::token(doc.get(field::TOKEN));
    let held = |holder: String, remaining| AcquireOutcome::Held {
        ahead: 0,
        holder,
        remaining: Some(remaining),
        token,
    };
    let mark = (kind == LeaseKind::Shared)
        .then(|| live_mark(doc, now))
        .flatten();
    if int(doc.get(LIVE)).unwrap_or(0) == 0 {
        if exp.timestamp_millis() > now {
            // Without a live exclusive lease (`lid`) or minimum hold (`hl`),
            // the last holder's release ran on a `$$NOW` a few ms ahead of
            // this one's (docs/mongodb-behaviour.md, B3): held until then.
            let hold = doc.get_datetime(field::HOLD_UNTIL).ok();
            let exclusive = doc.contains_key(field::LEASE_ID)
                || hold.is_some_and(|hl| hl.timestamp_millis() > now);
            if kind == LeaseKind::Shared || !exclusive {
                return held(holder, until(exp, now));
            }
            return AcquireOutcome::Mismatch {
                stored: LeaseKind::Exclusive,
            };
        }
        // Yielded by this owner: not ours before the yield window ends.
        if let Ok(yielded) = doc.get_datetime(YIELDED)
            && yielded.timestamp_millis() > now
        {
            return held(holder, until(*yielded, now));
        }
        return match mark {
            Some((waiter, remaining)) => held(waiter, remaining),
            // Free by now: a write in between; try again at once.
            None => held(holder, Duration::ZERO),
        };
    }
    // A lock-delay beside the places a release by owner id kept: held
    // until `exp`, at least `nb` ("Lock-delay" in `store`).
    if doc
        .get_datetime(field::NOT_BEFORE)
        .is_ok_and(|nb| nb.timestamp_millis() > now)
    {
        return held(holder, until(exp, now));
    }
    let stored = read_kind(doc);
    if stored != kind {
        return AcquireOutcome::Mismatch { stored };
    }
    match (kind, mark) {
        (LeaseKind::Shared, Some((waiter, remaining))) => held(waiter, remaining),
        (LeaseKind::Shared, None) => held(holder, Duration::ZERO),
        _ => {
            let first = doc.get_datetime(FIRST_EXPIRY).map(|d| until(*d, now));
            held(holder, first.unwrap_or(until(exp, now)))
        }
    }
}

/// The kind of a shared or semaphore key with live holders, as `pm` says.
fn read_kind(doc: &Document) -> LeaseKind {
    match int(doc.get(field::PERMITS)) {
        Some(n) => LeaseKind::Permit {
            permits: u32::try_from(n).unwrap_or(0),
        },
        None => LeaseKind::Shared,
    }
}

#[cfg(test)]
mod tests;
