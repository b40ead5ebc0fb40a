//! The light forms of the acquire, the release and the local handoff
//! ("Light forms for keys nobody waits for" in `store`): the same writes
//! for the common case of a key that nobody else waits for, in one small
//! stage instead of the general pipeline of every case, and the memory of
//! the keys where they do not apply.
//!
//! The general pipelines ([`acquire_pipeline`](super::pipeline::acquire_pipeline),
//! [`release_any_update`](super::kinds::release_any_update),
//! [`hand_over_update`](super::handoff::hand_over_update)) carry every case
//! in one command: retries under the same lease id, the queue of waiting
//! owners, waiting marks, minimum holds, shared and semaphore keys. Over
//! 400 expression nodes each, the server parses and evaluates them for
//! every write, which costs more than the write itself
//! (docs/mongodb-behaviour.md, B25). A light form applies only where its
//! result is the general form's, and tells when it did not apply:
//!
//! * **acquire**: the upsert on `_id` alone (B1) of a new document, or of
//!   an expired one of our shape with no queue, no holders, no permits, no
//!   exclusive waiter's mark, not under another lease id of ours and not
//!   yielded by this owner: the general pipeline's "wins" narrowed, with
//!   the same document written (a new acquisition). Otherwise the document
//!   is returned unchanged, and the general pipeline is sent;
//! * **release** of one exclusive lease: the filter also asks for no
//!   queue, no waiting mark, no minimum hold, no holders and no permits,
//!   and the update is the general one's result in that case (`exp =
//!   min(exp, $$NOW)`, `lid` removed). Matching nothing, it is followed by
//!   the general release, whose answer counts;
//! * **handoff** to a local waiter: the same narrowing of the filter, and
//!   the general update's acquisition branch.
//!
//! A key where a light form did not apply (or that the general form was
//! sent for) is remembered for [`CONTENDED_FOR`]: its writes go straight
//! to the general form meanwhile, so a contended key costs no extra round
//! trip.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{Bson, Document, RawArrayBuf, RawDocumentBuf, doc, rawdoc};
use uuid::Uuid;

use super::handle::{MongoStore, is_duplicate_key};
use super::kinds::{Released, holder_filter};
use super::pipeline::{bson_lease_id, fresh_document, key_filter, next_token, our_shape};
use crate::config::ReleaseMode;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::store::{LeaseRef, field};

/// How long a key stays on the general forms after one was sent for it.
pub(super) const CONTENDED_FOR: Duration = Duration::from_secs(10);

/// Keys remembered before the expired ones are dropped.
const PRUNE_AT: usize = 1024;

/// `$name`: the value of field `name`.
fn f(name: &str) -> String {
    format!("${name}")
}

/// `name` is missing (an expression).
fn missing(name: &str) -> Document {
    doc! { "$eq": [{ "$type": f(name) }, "missing"] }
}

/// The fields whose presence says that someone else waits for a key
/// (its queue, a waiting mark), or that its lease is not a plain exclusive
/// one (a minimum hold, holders, permits): the light release and handoff
/// apply only without them.
const OTHERS_WAIT: [&str; 5] = [
    field::QUEUE,
    field::WAITING_SINCE,
    field::HOLD_UNTIL,
    field::HOLDERS,
    field::PERMITS,
];

/// `filter` narrowed to documents without any of [`OTHERS_WAIT`].
fn nobody_else_waits(filter: &mut Document) {
    for name in OTHERS_WAIT {
        filter.insert(name, doc! { "$exists": false });
    }
}

/// The variable of the light acquire's command (`let`) holding the
/// attempt's lease id, so that its update is the same for every attempt
/// of one owner and TTL, and encoded once ([`AcquireUpdates`]).
const LID: &str = "$$lid";

/// The light acquire's update: a new acquisition by `owner` under the
/// lease id `$$lid` (expiring `ttl_ms` after `$$NOW`, the next token) of a
/// new document or of an expired one that nobody else waits for; any
/// other document unchanged.
pub(super) fn acquire_update(owner: &str, ttl_ms: i64) -> Vec<Document> {
    let lid = LID;
    let free = doc! { "$and": [
        our_shape(),
        { "$lte": [f(field::EXPIRES_AT), "$$NOW"] },
        missing(field::QUEUE),
        missing(field::HOLDERS),
        missing(field::PERMITS),
        missing(field::EXCLUSIVE_WAITER),
        { "$ne": [f(field::LEASE_ID), lid] },
        { "$not": [{ "$and": [
            { "$eq": [f(field::OWNER), { "$literal": owner }] },
            { "$gt": [f(field::YIELD_UNTIL), "$$NOW"] },
        ]}]},
    ]};
    let acquired = doc! {
        field::ID: f(field::ID),
        field::OWNER: { "$literal": owner },
        field::LEASE_ID: lid,
        field::TOKEN: next_token(),
        field::ACQUIRED_AT: "$$NOW",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
    };
    vec![doc! { "$replaceWith": { "$cond": [
        { "$or": [fresh_document(), free] },
        acquired,
        "$$ROOT",
    ]}}]
}

/// What the light acquire's reply is read with: the server's `$$NOW` too.
pub(super) fn acquire_projection() -> Document {
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::RENEWED_AT: 1,
        "now": "$$NOW",
    }
}

/// The token of the light acquire's reply if this very write made `owner`
/// the holder under `lease_id` (its `ts` is the write's `$$NOW`); `None`
/// if the light form did not apply. A document an earlier attempt under
/// the same lease id left (its outcome unknown, B7) is not this write's:
/// the general form renews it as a retry.
pub(super) fn acquired_token(doc: &Document, owner: &str, lease_id: Uuid) -> Option<u64> {
    let ours = doc.get(field::LEASE_ID) == Some(&bson_lease_id(lease_id))
        && doc.get_str(field::OWNER) == Ok(owner)
        && doc.get_datetime(field::RENEWED_AT).is_ok()
        && doc.get_datetime(field::RENEWED_AT).ok() == doc.get_datetime("now").ok();
    ours.then(|| doc.get_i64(field::TOKEN).ok())
        .flatten()
        .map(|token| token as u64)
}

/// The light release's filter: the exclusive lease `lease` of `owner`,
/// nobody else waiting, no minimum hold, no holders and no permits.
pub(super) fn release_filter(owner: &str, lease: &LeaseRef) -> Document {
    let mut filter = doc! {
        field::ID: &lease.key,
        field::LEASE_ID: bson_lease_id(lease.lease_id),
        field::OWNER: { "$eq": owner },
    };
    nobody_else_waits(&mut filter);
    filter
}

/// The light release's update: `exp = min(exp, $$NOW)`, `lid` removed.
pub(super) fn release_update() -> Vec<Document> {
    vec![doc! { "$set": {
        field::EXPIRES_AT: { "$min": [f(field::EXPIRES_AT), "$$NOW"] },
        field::LEASE_ID: "$$REMOVE",
    }}]
}

/// The light handoff's filter: [`hand_over_filter`](super::handoff::hand_over_filter)
/// (the live lease `from` of `owner`) with nobody else waiting and no
/// minimum hold.
pub(super) fn hand_over_filter(key: &LeaseKey, owner: &str, from: Uuid) -> Document {
    let mut filter = super::handoff::hand_over_filter(key, owner, from);
    nobody_else_waits(&mut filter);
    filter
}

/// The light handoff's update: a new acquisition under `to`, expiring
/// `ttl_ms` after `$$NOW`, with the next token, without the payload and
/// the yield.
pub(super) fn hand_over_update(to: Uuid, ttl_ms: i64) -> Vec<Document> {
    vec![doc! { "$set": {
        field::LEASE_ID: bson_lease_id(to),
        field::TOKEN: next_token(),
        field::ACQUIRED_AT: "$$NOW",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
        field::PAYLOAD: "$$REMOVE",
        field::YIELD_UNTIL: "$$REMOVE",
    }}]
}

/// The light acquire's update per TTL, encoded (the owner id is the
/// store's): one copy of its bytes per command instead of building and
/// encoding the pipeline's documents at each attempt.
#[derive(Clone, Default)]
pub(super) struct AcquireUpdates(Arc<Mutex<Vec<(i64, RawArrayBuf)>>>);

impl AcquireUpdates {
    /// The encoded [`acquire_update`] of `owner` and `ttl_ms`.
    fn get(&self, owner: &str, ttl_ms: i64) -> Result<RawArrayBuf> {
        let mut updates = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, update)) = updates.iter().find(|(ttl, _)| *ttl == ttl_ms) {
            return Ok(update.clone());
        }
        let mut update = RawArrayBuf::new();
        for stage in acquire_update(owner, ttl_ms) {
            update.push(RawDocumentBuf::from_document(&stage).map_err(encoding)?);
        }
        // A handful of TTLs in practice; bounded all the same.
        if updates.len() >= PRUNE_AT {
            updates.clear();
        }
        updates.push((ttl_ms, update.clone()));
        Ok(update)
    }
}

/// A document this store built that BSON cannot encode (a key too large).
fn encoding(e: mongodb::bson::raw::Error) -> Error {
    Error::InvalidKey {
        reason: format!("cannot be encoded as BSON: {e}"),
    }
}

/// The document a plain `findAndModify` command's `reply` returned
/// (`value`), or an unknown outcome ([`Error::Unreachable`], after
/// `waited`) if it carries a write concern error (the write may have
/// applied).
fn reply_value(mut reply: Document, waited: Duration) -> Result<Option<Document>> {
    if let Ok(error) = reply.get_document("writeConcernError") {
        return Err(Error::Unreachable {
            waited,
            reason: format!("a majority did not acknowledge the write: {error}"),
            source: None,
        });
    }
    Ok(match reply.remove("value") {
        Some(Bson::Document(value)) => Some(value),
        _ => None,
    })
}

/// The keys the general forms were sent for, with when (local clock).
#[derive(Clone, Default)]
pub(super) struct Contended(Arc<Mutex<HashMap<LeaseKey, Instant>>>);

impl Contended {
    /// Whether the general forms were sent for `key` within [`CONTENDED_FOR`].
    pub(super) fn contains(&self, key: &LeaseKey) -> bool {
        let keys = self.0.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(key).is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    /// Remembers that the general forms were sent for `key` now.
    pub(super) fn insert(&self, key: &LeaseKey) {
        let mut keys = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if keys.len() >= PRUNE_AT && !keys.contains_key(key) {
            keys.retain(|_, at| at.elapsed() < CONTENDED_FOR);
        }
        keys.insert(key.clone(), Instant::now());
    }
}

impl MongoStore {
    /// One `findAndModify` of the lock collection returning the document
    /// after the write, projected with `fields`, sent as a plain command:
    /// not a retryable write, so the server keeps no image of the document
    /// for a retry to return (docs/mongodb-behaviour.md, B25). The callers
    /// resolve an unknown outcome themselves (B7). A write concern error
    /// (the write may have applied) is reported as [`Error::Unreachable`],
    /// an unknown outcome.
    pub(super) async fn find_and_modify(
        &self,
        query: Document,
        update: Vec<Document>,
        fields: Document,
        upsert: bool,
    ) -> Result<Option<Document>> {
        let command = doc! {
            "findAndModify": self.coll().name(),
            "query": query,
            "update": update,
            "fields": fields,
            "new": true,
            "upsert": upsert,
            "writeConcern": { "w": "majority" },
        };
        let reply = self
            .bounded(self.coll_database().run_command(command))
            .await?;
        reply_value(reply, self.operation_timeout())
    }

    /// The light acquire's `findAndModify`, encoded by hand from the
    /// cached update ([`AcquireUpdates`]) and sent as a plain command, as
    /// [`MongoStore::find_and_modify`] sends its own.
    async fn acquire_light_command(
        &self,
        key: &LeaseKey,
        lease_id: Uuid,
        ttl_ms: i64,
    ) -> Result<Option<Document>> {
        let mut command = RawDocumentBuf::new();
        command.append("findAndModify", self.coll().name());
        command.append(
            "query",
            RawDocumentBuf::from_document(&key_filter(key)).map_err(encoding)?,
        );
        command.append("update", self.acquire_updates().get(self.owner(), ttl_ms)?);
        command.append(
            "fields",
            RawDocumentBuf::from_document(&acquire_projection()).map_err(encoding)?,
        );
        command.append("new", true);
        command.append("upsert", true);
        command.append(
            "let",
            RawDocumentBuf::from_document(&doc! { &LID[2..]: bson_lease_id(lease_id) })
                .map_err(encoding)?,
        );
        command.append("writeConcern", rawdoc! { "w": "majority" });
        let reply = self
            .bounded(self.coll_database().run_raw_command(command))
            .await?;
        reply_value(reply, self.operation_timeout())
    }

    /// Whether the light forms may be tried for `key` (see [`Contended`]).
    pub(super) fn light_applies(&self, key: &LeaseKey) -> bool {
        !self.contended().contains(key)
    }

    /// The release of the one lease `lease` by its light form, followed by
    /// the general one ([`release_any_update`]) if the light form matched
    /// nothing: the count of leases released, as
    /// [`MongoStore::release_parts`] counts them. `None` where the light
    /// form does not apply: a contended key, a lease this store holds on a
    /// shared or semaphore key, a delete-mode release that deletes first.
    pub(super) async fn release_light(
        &self,
        lease: &LeaseRef,
        delete_first: bool,
    ) -> Result<Option<u64>> {
        if (delete_first && self.release_mode() == ReleaseMode::Delete)
            || self.holder_ids().contains_key(&lease.lease_id)
            || !self.light_applies(&lease.key)
        {
            return Ok(None);
        }
        let filter = release_filter(self.owner(), lease);
        let (count, retried) = self
            .update_matching(
                self.coll(),
                "release",
                &filter,
                || release_update().into(),
                true,
            )
            .await?;
        if count > 0 {
            return Ok(Some(count));
        }
        self.contended().insert(&lease.key);
        let released = Released::Leases {
            owner: self.owner(),
            ids: vec![lease.lease_id],
        };
        let filter = holder_filter(self.owner(), std::slice::from_ref(lease));
        let count = self
            .release_matching(filter, &released, true, delete_first)
            .await?;
        // A light write whose outcome was unknown may have landed: a lease
        // the general release no longer finds counts as released by us, as
        // in `release_parts`.
        Ok(Some(if retried { count.max(1) } else { count }))
    }

    /// The light acquire of `key` by this owner under `lease_id`: the
    /// token if it acquired it; `None` if the light form did not apply or
    /// its outcome is unknown (the general acquire that follows, under the
    /// same lease id, recognises a landed one as a retry: B7). The key is
    /// then remembered as contended.
    pub(super) async fn acquire_light(
        &self,
        key: &LeaseKey,
        lease_id: Uuid,
        ttl_ms: i64,
    ) -> Result<Option<u64>> {
        let attempt = self.acquire_light_command(key, lease_id, ttl_ms).await;
        let token = match attempt {
            Ok(doc) => doc.and_then(|doc| acquired_token(&doc, self.owner(), lease_id)),
            Err(e) if e.is_transient() => None,
            Err(Error::Database(e)) if is_duplicate_key(&e) => None,
            Err(e) => return Err(e),
        };
        if token.is_none() {
            self.contended().insert(key);
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn the_light_acquire_is_one_small_stage() {
        let update = acquire_update("a", 1000);
        assert_eq!(update.len(), 1);
        let size = mongodb::bson::to_vec(&doc! { "u": update }).unwrap().len();
        let general =
            super::super::pipeline::acquire_pipeline("a", 1000, Uuid::new_v4(), true, None, 1000);
        let general = mongodb::bson::to_vec(&doc! { "u": general }).unwrap().len();
        assert!(size * 3 < general, "{size} bytes vs {general}");
    }

    #[test]
    fn a_reply_is_an_acquisition_only_under_our_lease_id_and_owner_id() {
        let id = Uuid::new_v4();
        let now = mongodb::bson::DateTime::now();
        let ours = doc! {
            field::OWNER: "a", field::LEASE_ID: bson_lease_id(id), field::TOKEN: 9_i64,
            field::RENEWED_AT: now, "now": now,
        };
        assert_eq!(acquired_token(&ours, "a", id), Some(9));
        assert_eq!(acquired_token(&ours, "b", id), None);
        assert_eq!(acquired_token(&ours, "a", Uuid::new_v4()), None);
        let mut earlier = ours.clone();
        earlier.insert(
            field::RENEWED_AT,
            mongodb::bson::DateTime::from_millis(now.timestamp_millis() - 1),
        );
        assert_eq!(
            acquired_token(&earlier, "a", id),
            None,
            "an earlier attempt's"
        );
        let held = doc! { field::OWNER: "b", field::TOKEN: 9_i64 };
        assert_eq!(acquired_token(&held, "a", id), None);
    }

    #[test]
    fn the_light_filters_exclude_every_sign_of_another_waiter() {
        let lease = LeaseRef {
            key: "k".into(),
            lease_id: Uuid::new_v4(),
        };
        let release = release_filter("a", &lease);
        let hand_over = hand_over_filter(&"k".into(), "a", lease.lease_id);
        for filter in [release, hand_over] {
            for name in [
                field::QUEUE,
                field::WAITING_SINCE,
                field::HOLD_UNTIL,
                field::HOLDERS,
                field::PERMITS,
            ] {
                assert_eq!(
                    filter.get_document(name).unwrap(),
                    &doc! { "$exists": false },
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn a_contended_key_is_remembered_for_a_while() {
        let contended = Contended::default();
        let key: LeaseKey = "k".into();
        assert!(!contended.contains(&key));
        contended.insert(&key);
        assert!(contended.contains(&key));
        assert!(!contended.contains(&"other".into()));
    }
}
