//! The twin's re-read of a key after an acquire whose outcome is unknown,
//! as `MongoStore` does it: the key's document rendered as BSON in the
//! layout of the acquire projections (`mongo::acquire::acquire_projection`,
//! `mongo::acquire::multi_acquire_projection`), then judged by the same
//! functions ([`replies`]), and worth only what a read proves
//! ([`replies::from_reread`]).

use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};
use tokio::time::Instant;
use uuid::Uuid;

use super::control::Op;
use super::db::MemoryDb;
use super::doc::Doc;
use super::rules::Collection;
use super::store::MemoryStore;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::store::replies::{self, FIRST_EXPIRY, LIVE, MINE, NOW, YIELDED};
use crate::store::{AcquireOutcome, field};

/// A lease id as stored in `lid`: a BSON UUID.
fn lid(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

/// The top fields every acquire projection has: `aid`, `lid`, `tok`,
/// `exp`, `pm`, and the server's now.
fn top(stored: &Doc, now: Instant, date: impl Fn(Instant) -> DateTime) -> Document {
    let mut doc = doc! {
        field::OWNER: &stored.owner,
        field::TOKEN: stored.token as i64,
        field::EXPIRES_AT: date(stored.exp),
        NOW: date(now),
    };
    if let Some(id) = stored.lease_id {
        doc.insert(field::LEASE_ID, lid(id));
    }
    if let Some(permits) = stored.permits {
        doc.insert(field::PERMITS, i32::try_from(permits).unwrap_or(i32::MAX));
    }
    doc
}

/// `stored` as the exclusive acquire projection returns it: the top
/// fields, `yu`, `xw.aid`, and `q`'s `aid` and `re`.
fn exclusive(stored: &Doc, now: Instant, date: impl Fn(Instant) -> DateTime) -> Document {
    let mut doc = top(stored, now, &date);
    if let Some(until) = stored.yield_until {
        doc.insert(field::YIELD_UNTIL, date(until));
    }
    if let Some((waiter, _)) = &stored.exclusive_waiter {
        doc.insert(field::EXCLUSIVE_WAITER, doc! { field::OWNER: waiter });
    }
    if !stored.queue.is_empty() {
        let queue: Vec<Document> = stored
            .queue
            .iter()
            .map(|w| doc! { field::OWNER: &w.owner, field::REGISTRATION_EXPIRES: date(w.re) })
            .collect();
        doc.insert(field::QUEUE, queue);
    }
    doc
}

/// `stored` as the shared and permit acquire projection returns it for
/// `lease_id` of `owner`: the top fields, `hl`, another owner's live
/// waiting mark, this acquisition's entry, the other live entries' count
/// and earliest expiry, and `yu` if this owner yielded the key.
pub(super) fn multi(
    stored: &Doc,
    owner: &str,
    lease_id: Uuid,
    now: Instant,
    date: impl Fn(Instant) -> DateTime,
) -> Document {
    let mut doc = top(stored, now, &date);
    if let Some(until) = stored.hold_until {
        doc.insert(field::HOLD_UNTIL, date(until));
    }
    if let Some((waiter, exp)) = &stored.exclusive_waiter
        && *exp > now
        && waiter != owner
    {
        doc.insert(
            field::EXCLUSIVE_WAITER,
            doc! { field::OWNER: waiter, field::EXPIRES_AT: date(*exp) },
        );
    }
    let is_mine = |h: &&super::doc::Holder| h.lease_id == Some(lease_id) && h.owner == owner;
    if let Some(mine) = stored.holders.iter().find(is_mine) {
        doc.insert(
            MINE,
            doc! {
                field::OWNER: &mine.owner,
                field::LEASE_ID: lid(lease_id),
                field::TOKEN: mine.token as i64,
                field::ACQUIRED_AT: date(mine.acquired),
                field::RENEWED_AT: date(mine.renewed),
                field::EXPIRES_AT: date(mine.exp),
            },
        );
    }
    let others: Vec<Instant> = stored
        .holders
        .iter()
        .filter(|h| h.exp > now && !is_mine(h))
        .map(|h| h.exp)
        .collect();
    doc.insert(LIVE, others.len() as i32);
    if let Some(first) = others.iter().min() {
        doc.insert(FIRST_EXPIRY, date(*first));
    }
    if let Some(until) = stored.yield_until
        && stored.owner == owner
        && until > now
    {
        doc.insert(YIELDED, date(until));
    }
    doc
}

impl MemoryStore {
    /// What the re-read after an unknown outcome of an acquisition of
    /// `shape` by this owner under `lease_id` (for `ttl`) answers now, as
    /// `MongoStore::reread_acquire`.
    pub(crate) async fn reread_acquire(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        ttl: Duration,
        shape: crate::kind::LeaseShape,
    ) -> Result<AcquireOutcome> {
        self.reread(key, lease_id, ttl, shape.kind, true).await
    }

    /// The re-read of `key` after an acquisition of `kind` by this owner
    /// under `lease_id` (for `ttl`) whose outcome is unknown, as
    /// `MongoStore`'s and `DocumentStore`'s: an [`Op::Inspect`] call (with
    /// its latency and faults) that renders the document as the acquire
    /// projections do and judges it by [`replies`]. A foreign holder's lock
    /// is judged too; no document is the error of a document that vanished
    /// (in a place of in-document leases: a user document without the lock
    /// field is free now, and one that does not exist is `DocumentNotFound`
    /// unless the acquisition `creates` it).
    pub(super) async fn reread(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        ttl: Duration,
        kind: LeaseKind,
        creates: bool,
    ) -> Result<AcquireOutcome> {
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let read = self.run(Op::Inspect, vec![key.clone()], move |coll, now| {
            if coll.missing.contains(&key) {
                return match creates {
                    false => Err(Error::DocumentNotFound { id: key }),
                    true => Ok(None),
                };
            }
            Ok(verdict(&db, coll, now, &key, &owner, lease_id, ttl, kind))
        });
        read.await?.ok_or_else(|| Error::Unreachable {
            waited: Duration::ZERO,
            reason: "lock document vanished during acquire".into(),
            source: None,
        })
    }
}

/// The verdict on `key` as a read finds it in `coll` at `now`, for an
/// acquisition of `kind` by `owner` under `lease_id` (for `ttl`): `None`
/// without a document (nor a foreign holder's lock, nor a place of
/// in-document leases).
#[allow(clippy::too_many_arguments)]
fn verdict(
    db: &MemoryDb,
    coll: &Collection,
    now: Instant,
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    ttl: Duration,
    kind: LeaseKind,
) -> Option<AcquireOutcome> {
    let date = |at: Instant| DateTime::from_system_time(db.system_time(at));
    let outcome = if let Some(view) = coll.their_lock_at(db, key, now) {
        replies::in_document(key, owner, lease_id, Some(&view))
    } else if let Some(foreign) = coll.foreign.get(key) {
        let doc = db.project_foreign(foreign, date(now));
        replies::classify(key, owner, lease_id, &doc)
    } else if let Some(stored) = coll.docs.get(key) {
        if kind.is_multi_holder() {
            replies::classify_multi(key, kind, &multi(stored, owner, lease_id, now, date))
        } else if coll.in_documents {
            replies::in_document(key, owner, lease_id, Some(&exclusive(stored, now, date)))
        } else {
            let ttl_ms = ttl.as_millis().min(i64::MAX as u128) as i64;
            replies::exclusive(key, owner, lease_id, ttl_ms, &exclusive(stored, now, date))
        }
    } else if coll.in_documents {
        // A user document without the lock field.
        replies::in_document(key, owner, lease_id, None)
    } else {
        return None;
    };
    Some(replies::from_reread(outcome))
}
