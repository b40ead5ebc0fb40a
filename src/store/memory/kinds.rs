//! The rules of shared and semaphore keys ("Shared and semaphore keys" in
//! `store`), applied to the twin's documents: a holder's acquisition, an
//! exclusive acquisition that waits for shared holders (its mark, `xw`), the
//! renewal and release of holders in `hs`, and a force release that frees
//! the key whole.

use crate::random::HashSet;
use std::time::Duration;

use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use super::db::MemoryDb;
use super::doc::{Doc, Holder};
use super::rules::Collection;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::{LeaseShape, PermitsChange};
use crate::store::AcquireOutcome;

/// An acquisition of `kind` (shared, or a permit) by `owner` under
/// `lease_id` at `now`:
///
/// - a retry (an entry of `hs` with this lease id and owner id) refreshes
///   that entry's expiry and keeps its token;
/// - a key held exclusively (or by a minimum hold, `hl`: an `exp` ahead
///   without live holders, with `lid` or a live `hl`) is held for a shared
///   acquisition (which writes no `xw` mark; a waiting one marks another
///   owner's exclusive lease waited for, `wt`) and a
///   [`Mismatch`](AcquireOutcome::Mismatch) for a permit; an `exp` ahead
///   without either is free for any kind (nobody holds it); a key held by
///   permits is a mismatch for anything but a permit of the same number,
///   and one held shared a mismatch for a permit;
/// - a permit taking `k` permits is held while the live holders take
///   more than `permits - k`, until the earliest of their expiries; a shared acquisition while an exclusive
///   waiter's mark is live, until the mark's expiry;
/// - as an exclusive acquisition, a key this owner yielded is held by it
///   until the end of the yield window, and a `waiting` shared acquisition
///   that finds another owner's live exclusive lease marks it waited for
///   (`wt`), so that its release yields;
/// - otherwise it wins: the expired entries are dropped, its own is
///   appended with the token rule's token (`max(tok + 1, ms($$NOW) * 2^20)`), and the top fields describe the key
///   (no lease id, its owner, token and time, `exp` the latest holder's,
///   `pm` for permits; no payload, `wt`, `yu`, `hl` or queue `q`).
pub(super) fn acquire_holder(
    doc: &mut Doc,
    owner: &str,
    lease_id: Uuid,
    ttl: Duration,
    shape: LeaseShape,
    waiting: bool,
    (now, floor): (Instant, u64),
) -> AcquireOutcome {
    let (kind, taken) = (shape.kind, shape.taken());
    let mine = |h: &Holder| h.lease_id == Some(lease_id) && h.owner == owner;
    let others_live = doc.live_holders(now).any(|h| !mine(h));
    // A retry wins only on a key still held as its kind, or alone (as
    // MongoStore's `mine_wins`).
    if doc.holders.iter().any(mine) && others_live && doc.stored_kind() != kind {
        return AcquireOutcome::OursAsAnotherKind {
            stored: doc.stored_kind(),
        };
    }
    if let Some(at) = doc.holders.iter().position(mine) {
        // Renewed and moved last, the expired entries dropped, as the
        // pipeline's `live ++ [entry]`.
        let mut holder = doc.holders.remove(at);
        holder.exp = holder.exp.max(now + ttl);
        holder.renewed = now;
        let token = holder.token;
        doc.holders.retain(|h| h.exp > now);
        doc.holders.push(holder);
        doc.renewed = now;
        doc.revocation = None;
        doc.exp = latest(doc).unwrap_or(now);
        doc.permits = match kind {
            LeaseKind::Permit { permits } => Some(permits),
            _ => None,
        };
        return AcquireOutcome::Acquired { token };
    }
    let live = doc.live_holders(now).count();
    // An exclusive holder: a lease (`lid`) or a minimum hold (`hl`). An
    // `exp` ahead without either is the release of the key's last holder on
    // a server clock that read ahead (docs/mongodb-behaviour.md, B3): as
    // MongoStore, nobody holds the key, so it is free for any kind.
    let exclusive = doc.lease_id.is_some() || doc.hold_until.is_some_and(|until| until > now);
    if live == 0 && doc.exp > now && exclusive {
        // A mismatch for a permit; held for a shared acquisition.
        return match kind {
            LeaseKind::Shared => {
                let held_by_other = doc.lease_id.is_some() && doc.owner != owner;
                if waiting && held_by_other && doc.waiting_since.is_none() {
                    doc.waiting_since = Some(now);
                }
                held(doc.owner.clone(), doc.exp, doc.token, now)
            }
            _ => AcquireOutcome::Mismatch {
                stored: LeaseKind::Exclusive,
            },
        };
    }
    // A lock-delay keeps the key from every kind ("Lock-delay" in `store`),
    // also beside the places of the holders a release by owner id ended
    // and kept until their expiry; after an exclusive holder's (a minimum
    // hold kept by a release by owner id), as MongoStore reads it.
    if doc.delayed_at(now) {
        return held(doc.owner.clone(), doc.exp, doc.token, now);
    }
    if let Some(until) = doc
        .yield_until
        .filter(|_| live == 0 && doc.yielded_by(owner, now))
    {
        return held(doc.owner.clone(), until, doc.token, now);
    }
    if live > 0 && doc.stored_kind() != kind {
        return AcquireOutcome::Mismatch {
            stored: doc.stored_kind(),
        };
    }
    match kind {
        LeaseKind::Permit { permits } if doc.permits_used(now) + taken > permits => {
            let first = doc.live_holders(now).map(|h| h.exp).min().unwrap_or(now);
            return held(doc.owner.clone(), first, doc.token, now);
        }
        LeaseKind::Shared => {
            // Another owner's live mark (an owner's own is of a waiter that left).
            let mark = doc.exclusive_waiter.as_ref();
            if let Some((waiter, until)) = mark.filter(|(w, e)| *e > now && w != owner) {
                return held(waiter.clone(), *until, doc.token, now);
            }
        }
        _ => {}
    }
    doc.holders.retain(|h| h.exp > now);
    // The token rule (`Collection::next_token`).
    let token = (doc.token + 1).max(floor);
    doc.holders.push(Holder {
        owner: owner.to_string(),
        lease_id: Some(lease_id),
        ended: None,
        token,
        acquired: now,
        renewed: now,
        exp: now + ttl,
        payload: None,
        permits: taken,
    });
    doc.transitions = doc.transitions_after(owner);
    doc.owner = owner.to_string();
    doc.lease_id = None;
    doc.token = token;
    doc.acquired = now;
    doc.renewed = now;
    doc.exp = latest(doc).unwrap_or(now);
    doc.permits = match kind {
        LeaseKind::Permit { permits } => Some(permits),
        _ => None,
    };
    doc.payload = None;
    doc.waiting_since = None;
    doc.yield_until = None;
    doc.hold_until = None;
    // As MongoStore's, whose pipeline rewrites the document without `q`.
    doc.queue.clear();
    doc.not_before = None;
    doc.revocation = None;
    AcquireOutcome::Acquired { token }
}

/// An exclusive acquisition by `owner` that found live shared holders: a
/// waiting one (re)writes its mark, `xw = (owner, now + ttl)`, and is told
/// to retry within half its TTL, so that the mark stays live while it waits.
pub(super) fn exclusive_waits(
    doc: &mut Doc,
    owner: &str,
    ttl: Duration,
    waiting: bool,
    now: Instant,
) -> AcquireOutcome {
    if waiting {
        doc.exclusive_waiter = Some((owner.to_string(), now + ttl));
    }
    // As MongoStore: capped whenever the mark is this owner's.
    let marked = doc
        .exclusive_waiter
        .as_ref()
        .is_some_and(|(o, _)| o == owner);
    let until = if marked {
        doc.exp.min(now + ttl / 2)
    } else {
        doc.exp
    };
    held(doc.owner.clone(), until, doc.token, now)
}

/// Held by `holder` until `until`, the key's top token being `token` (as
/// `MongoStore` reports it: the `tok` of the document read).
fn held(holder: String, until: Instant, token: u64, now: Instant) -> AcquireOutcome {
    AcquireOutcome::Held {
        ahead: 0,
        holder,
        remaining: Some(until.saturating_duration_since(now)),
        token: Some(token),
    }
}

/// The latest `exp` of the key's holders in `hs`.
fn latest(doc: &Doc) -> Option<Instant> {
    doc.holders.iter().map(|h| h.exp).max()
}

/// Renews the entries of `hs` of `owner` whose lease id is in `ids` (expiry
/// not checked, as on the server): `exp = max(exp, now + ttl)`, and the top
/// `ts`, and `exp = max(exp, ...)`. Returns their lease ids.
pub(super) fn renew_holders(
    doc: &mut Doc,
    owner: &str,
    ids: &HashSet<Uuid>,
    ttl: Duration,
    now: Instant,
) -> Vec<Uuid> {
    let mut renewed = Vec::new();
    for holder in &mut doc.holders {
        if let Some(id) = holder
            .lease_id
            .filter(|id| holder.owner == owner && ids.contains(id))
        {
            holder.exp = holder.exp.max(now + ttl);
            holder.renewed = now;
            renewed.push(id);
        }
    }
    if !renewed.is_empty() {
        doc.renewed = now;
        doc.exp = doc.exp.max(now + ttl);
    }
    renewed
}

/// Sets the payload of the entry of `hs` with this lease id and owner id.
/// `false` if there is none.
pub(super) fn set_holder_payload(
    doc: &mut Doc,
    owner: &str,
    lease_id: Uuid,
    payload: Document,
) -> bool {
    let mut holders = doc.holders.iter_mut();
    let mine = holders.find(|h| h.lease_id == Some(lease_id) && h.owner == owner);
    mine.map(|holder| holder.payload = Some(payload)).is_some()
}

/// The change of a semaphore key's number of permits to `permits` at
/// `now`, as `MongoStore`'s: with live holders of permits that take at
/// most `permits`, `pm = permits` and `rl = now` (announced by the caller);
/// without live holders, nothing; live holders of another kind (or a live
/// exclusive lease or minimum hold), a mismatch.
pub(super) fn set_permits(
    doc: &mut Doc,
    permits: u32,
    now: Instant,
) -> Result<PermitsChange, LeaseKind> {
    match doc.live_kind(now) {
        None => Ok(PermitsChange::NothingHeld),
        Some(LeaseKind::Permit { .. }) => {
            let held = doc.permits_used(now);
            if held > permits {
                return Ok(PermitsChange::TooManyHeld { held });
            }
            doc.permits = Some(permits);
            doc.released_at = Some(now);
            Ok(PermitsChange::Set)
        }
        Some(stored) => Err(stored),
    }
}

/// Frees a key whole (a force release): `hs`, `pm`, `xw` and `hl`
/// removed, `rl = now`. The caller moves `exp`.
pub(super) fn drop_holders(doc: &mut Doc, now: Instant) {
    doc.holders.clear();
    doc.permits = None;
    doc.exclusive_waiter = None;
    doc.hold_until = None;
    doc.released_at = Some(now);
}

impl Collection {
    /// An operator's release by owner id that waits for the holders
    /// (`OverrideEnd::AtExpiry`), on the entries of `hs` of `owner`: each
    /// live one stays, without its lease id, until its expiry (its holder,
    /// told at its next renewal, may still work), the expired ones go, `rl
    /// = now`, and the top `exp` is the latest entry's (or `nb`), as
    /// `MongoStore`'s `release_any_update`. Each key written is announced
    /// as freed. Returns from how many documents.
    pub(super) fn keep_places_of(&mut self, db: &MemoryDb, owner: &str, now: Instant) -> u64 {
        let mut documents = 0;
        for (key, doc) in self.docs.iter_mut() {
            let ends = doc
                .holders
                .iter()
                .any(|h| h.owner == owner && h.lease_id.is_some());
            if !ends {
                continue;
            }
            doc.holders.retain(|h| h.exp > now);
            for holder in doc.holders.iter_mut().filter(|h| h.owner == owner) {
                holder.ended = holder.lease_id.take().or(holder.ended);
            }
            documents += 1;
            doc.released_at = Some(now);
            match latest(doc) {
                Some(exp) => doc.exp = doc.floor(exp),
                None => {
                    doc.exp = doc.floor(now);
                    doc.permits = None;
                }
            }
            db.announce_release(key);
        }
        documents
    }

    /// The release rule for holders of shared and semaphore keys: removes
    /// the entries of `hs` for which `matches` holds (with the expired
    /// ones), sets `rl = now`, and moves the top `exp` to the latest
    /// remaining holder's, or to now if none remains (then `hs` and `pm`
    /// are removed). Each key written is announced as freed (MongoDB's
    /// change stream shows `rl`). Returns how many entries were removed, and
    /// from how many documents.
    pub(super) fn release_holders_where(
        &mut self,
        db: &MemoryDb,
        matches: impl Fn(&LeaseKey, &Holder) -> bool,
        now: Instant,
    ) -> (u64, u64) {
        let (mut removed, mut documents) = (0, 0);
        for (key, doc) in self.docs.iter_mut() {
            let before = doc.holders.len();
            let mine = doc.holders.iter().filter(|h| matches(key, h)).count();
            if mine == 0 {
                continue;
            }
            doc.holders.retain(|h| !matches(key, h) && h.exp > now);
            removed += mine as u64;
            documents += 1;
            debug_assert!(doc.holders.len() < before);
            doc.released_at = Some(now);
            match latest(doc) {
                Some(exp) => doc.exp = exp,
                None => {
                    doc.exp = doc.floor(now);
                    doc.permits = None;
                }
            }
            db.announce_release(key);
        }
        (removed, documents)
    }
}
