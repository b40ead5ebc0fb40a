//! The twin's re-read of a key after an acquire whose outcome is unknown,
//! as `MongoStore` does it: the key's document rendered as BSON in the
//! shape of the acquire projections (`mongo::acquire::acquire_projection`,
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
use crate::LeaseKind;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::store::replies::{self, FIRST_EXPIRY, LIVE, MINE, NOW, YIELDED};
use crate::store::{AcquireOutcome, field};

/// A lease id as stored in `lid`: a BSON UUID.
fn lid(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

/// One attempt's re-read: who asked, for what.
pub(super) struct Reread<'a> {
    pub key: &'a LeaseKey,
    pub owner: &'a str,
    pub lease_id: Uuid,
    pub ttl: Duration,
    pub kind: LeaseKind,
}

impl Reread<'_> {
    /// The verdict on `key` as a read finds it in `coll` at `now`: `None`
    /// without a document (a foreign holder's lock is one).
    pub(super) fn verdict(
        &self,
        db: &MemoryDb,
        coll: &Collection,
        now: Instant,
    ) -> Option<AcquireOutcome> {
        let date = |at: Instant| DateTime::from_system_time(db.system_time(at));
        let Reread {
            key,
            owner,
            lease_id,
            kind,
            ..
        } = *self;
        if let Some(foreign) = coll.foreign.get(key) {
            let mut doc = Document::new();
            if let Some(owner) = &foreign.owner {
                doc.insert(field::OWNER, owner);
            }
            if let Some(written) = foreign.written {
                doc.insert(field::RENEWED_AT, date(written));
            }
            return Some(replies::from_reread(replies::classify(
                key, owner, lease_id, &doc,
            )));
        }
        let stored = coll.docs.get(key)?;
        let outcome = if kind.is_multi_holder() {
            replies::classify_multi(key, kind, &multi(stored, owner, lease_id, now, date))
        } else {
            let doc = exclusive(stored, now, date);
            if coll.in_documents {
                replies::in_document(key, owner, lease_id, Some(&doc))
            } else {
                let ttl_ms = self.ttl.as_millis().min(i64::MAX as u128) as i64;
                replies::exclusive(key, owner, lease_id, ttl_ms, &doc)
            }
        };
        Some(replies::from_reread(outcome))
    }
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
fn multi(
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
    let is_mine = |h: &&super::doc::Holder| h.lease_id == lease_id && h.owner == owner;
    if let Some(mine) = stored.holders.iter().find(is_mine) {
        doc.insert(
            MINE,
            doc! {
                field::OWNER: &mine.owner,
                field::LEASE_ID: lid(mine.lease_id),
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

/// The error of a re-read that found no document, as `MongoStore`'s.
pub(super) fn vanished() -> Error {
    Error::Unreachable {
        waited: Duration::ZERO,
        reason: "lock document vanished during acquire".into(),
        source: None,
    }
}

/// Resolves an acquire of `key` whose write failed with `error` as
/// `MongoStore` does: a transient error (an unknown outcome) by
/// [`reread`]; any other error is returned as it is.
pub(super) async fn after_failure(
    store: &MemoryStore,
    key: LeaseKey,
    error: Error,
    verdict: impl FnOnce(&MemoryDb, &Collection, Instant) -> Result<Option<AcquireOutcome>>
    + Send
    + 'static,
) -> Result<AcquireOutcome> {
    if !error.is_transient() {
        return Err(error);
    }
    tracing::debug!(%key, %error, "acquire outcome unknown; re-reading");
    reread(store, key, verdict).await
}

/// A re-read of `key` (an [`Op::Inspect`] call of `store`, with its
/// latency and faults), judged by `verdict`; [`vanished`] without a
/// document.
pub(super) async fn reread(
    store: &MemoryStore,
    key: LeaseKey,
    verdict: impl FnOnce(&MemoryDb, &Collection, Instant) -> Result<Option<AcquireOutcome>>
    + Send
    + 'static,
) -> Result<AcquireOutcome> {
    let db = store.db.clone();
    store
        .run(Op::Inspect, vec![key], move |coll, now| {
            verdict(&db, coll, now)
        })
        .await?
        .ok_or_else(vanished)
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
        let owner = self.owner.clone();
        reread(self, key.clone(), move |db, coll, now| {
            let reread = Reread {
                key: &key,
                owner: &owner,
                lease_id,
                ttl,
                kind: shape.kind,
            };
            Ok(reread.verdict(db, coll, now))
        })
        .await
    }
}
