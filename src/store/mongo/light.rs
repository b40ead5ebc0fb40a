//! The light forms of the acquire, the release and the local handoff
//! ("Light forms for keys nobody waits for" in `store`): the same writes
//! for the common case of a key that nobody else waits for, in one small
//! stage instead of the general pipeline of every case.
//!
//! The general pipelines ([`acquire_pipeline`](super::pipeline::acquire_pipeline),
//! [`release_any_update`](super::kinds::release_any_update),
//! [`light_hand_over_update`](super::handoff::hand_over_update)) carry every case
//! in one command: retries under the same lease id, the queue of waiting
//! owners, waiting marks, minimum holds, shared and semaphore keys. Over
//! 400 expression nodes each, the server parses and evaluates them for
//! every write, which costs more than the write itself
//! (docs/mongodb-behaviour.md, B25). A light form applies only where its
//! result is the general form's, and tells when it did not apply:
//!
//! * **acquire**: the upsert on `{_id, _ins: null}` (B1, B29) of a new document, or of
//!   an expired one of our shape with no queue, no holders, no permits, no
//!   exclusive waiter's mark, not under another lease id of ours and not
//!   yielded by this owner: the general pipeline's "wins" narrowed, with
//!   the same document written (a new acquisition). Otherwise the document
//!   is returned unchanged, and the general pipeline is sent;
//! * **release** of one exclusive lease: if the document holds it, with
//!   no queue, no waiting mark, no minimum hold, no holders and no
//!   permits, the general release's result in that case (`exp =
//!   min(exp, $$NOW)`, `lid` removed). Not applied (`nModified`
//!   0), it is followed by the general release, whose answer counts;
//! * **handoff** to a local waiter: the same narrowing of the handoff's
//!   conditions, and the general update's acquisition branch.
//!
//! The release and the handoff filter on `_id` alone (the server's fast
//! path, B26), the acquire on `{_id, _ins: null}` (B29); each carries
//! its conditions in one `$replaceWith` that leaves any other document
//! unchanged; the lease ids are `let` variables, so a grouped command
//! encodes its update once ([`encode_pipeline`]).
//!
//! The actor decides when a light form is tried: not for a key where one
//! did not apply (or that the general form was sent for) lately
//! ([`CONTENDED_FOR`](crate::store::light_release::CONTENDED_FOR)), so a
//! contended key costs no extra round trip. It groups the light acquires
//! and releases of string keys asked for while one of their form is in
//! flight (its `group_commit`); this store sends a group as one batch (the
//! commands in `batched`), and one request alone as its own command here.

use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, Document, RawArrayBuf, RawBinaryRef, RawDocumentBuf, doc};
use uuid::Uuid;

use super::handle::{MongoStore, is_duplicate_key};
use super::ops::{retried, ttl_ms};
use super::pipeline::{key_filter, upsert_filter};
use super::plain::{update_command, update_counts};
use super::rules::{bson_lease_id, inserted, next_token, our_shape};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::store::light_release::{LightAcquire, LightAcquired, LightRelease};
use crate::store::{LeaseRef, field};

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

/// The conditions (expressions) that none of [`OTHERS_WAIT`] is present.
fn nobody_else_waits() -> impl Iterator<Item = Bson> {
    OTHERS_WAIT
        .into_iter()
        .map(|name| Bson::Document(missing(name)))
}

/// `$and` of the lease `lease_id` (an expression) of `owner` being the
/// document's and of [`nobody_else_waits`], with `more` conditions.
fn ours_and_nobody_else_waits(owner: &str, lease_id: &str, more: Vec<Document>) -> Document {
    let mut all: Vec<Bson> = vec![
        Bson::Document(doc! { "$eq": [f(field::OWNER), { "$literal": owner }] }),
        Bson::Document(doc! { "$eq": [f(field::LEASE_ID), lease_id] }),
    ];
    all.extend(more.into_iter().map(Bson::Document));
    all.extend(nobody_else_waits());
    doc! { "$and": all }
}

/// `$$ROOT` with the fields of `set` set and those of `unset` removed.
fn root_with(set: Document, unset: &[&str]) -> Document {
    let mut out = doc! { "$mergeObjects": ["$$ROOT", set] };
    for name in unset {
        out = doc! { "$unsetField": { "field": name, "input": out } };
    }
    out
}

/// The variable of the light acquire's command (`let`) holding the
/// attempt's lease id, so that its update is the same for every attempt
/// of one owner and TTL, and encoded once per command ([`encode_pipeline`]).
const LID: &str = "$$lid";

/// The light acquire's update: a new acquisition by `owner` under the
/// lease id `$$lid` (expiring `ttl_ms` after `$$NOW`, the next token) of a
/// new document or of an expired one that nobody else waits for; any
/// other document unchanged.
pub(super) fn light_acquire_update(owner: &str, ttl_ms: i64) -> Vec<Document> {
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
        { "$or": [inserted(), free] },
        acquired,
        "$$ROOT",
    ]}}]
}

/// What the light acquire's and handoff's replies are read with: the
/// server's `$$NOW` too.
pub(super) fn light_projection() -> Document {
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

/// The `let` variables of the light handoff: the lease handed over, and
/// the next one.
const FROM: &str = "$$from";
const TO: &str = "$$to";

/// The light release's update, of the document of the released lease's
/// key (its `_id` alone, B26): if it is the exclusive lease `$$lid` of
/// `owner` and nobody else waits, no minimum hold, no holders and no
/// permits, `exp = min(exp, $$NOW)` and `lid` removed; any other document
/// unchanged (`nModified` 0).
pub(super) fn light_release_update(owner: &str) -> Vec<Document> {
    let released = root_with(
        doc! { field::EXPIRES_AT: { "$min": [f(field::EXPIRES_AT), "$$NOW"] } },
        &[field::LEASE_ID],
    );
    vec![doc! { "$replaceWith": { "$cond": [
        ours_and_nobody_else_waits(owner, LID, vec![]),
        released,
        "$$ROOT",
    ]}}]
}

/// The light handoff's update, of the document of the key (its `_id`
/// alone, B26): if it holds the live lease `$$from` of `owner`
/// ([`hand_over_filter`](super::handoff::hand_over_filter)'s conditions)
/// and nobody else waits and no minimum hold is live, a new acquisition
/// under `$$to`, expiring `ttl_ms` after `$$NOW`, with the next token,
/// without the payload and the yield; any other document unchanged.
pub(super) fn light_hand_over_update(owner: &str, ttl_ms: i64) -> Vec<Document> {
    let live = vec![
        doc! { "$eq": [{ "$type": f(field::TOKEN) }, "long"] },
        doc! { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    ];
    let handed = root_with(
        doc! {
            field::LEASE_ID: TO,
            field::TOKEN: next_token(),
            field::ACQUIRED_AT: "$$NOW",
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
        },
        &[field::PAYLOAD, field::YIELD_UNTIL],
    );
    vec![doc! { "$replaceWith": { "$cond": [
        ours_and_nobody_else_waits(owner, FROM, live),
        handed,
        "$$ROOT",
    ]}}]
}

/// A light update's stages, encoded (the lease ids are `let` variables, so
/// a grouped command encodes it once and copies its bytes into each
/// statement).
fn encode_pipeline(stages: Vec<Document>) -> Result<RawArrayBuf> {
    let mut update = RawArrayBuf::new();
    for stage in stages {
        update.push(RawDocumentBuf::from_document(&stage).map_err(encoding)?);
    }
    Ok(update)
}

/// The `_id` filter of `key`, encoded.
fn raw_key_filter(key: &LeaseKey) -> Result<RawDocumentBuf> {
    RawDocumentBuf::from_document(&key_filter(key)).map_err(encoding)
}

/// [`upsert_filter`] of `key`, encoded: the light acquire's filter.
fn raw_upsert_filter(key: &LeaseKey) -> Result<RawDocumentBuf> {
    RawDocumentBuf::from_document(&upsert_filter(key)).map_err(encoding)
}

/// The `let` variables `vars` (name, lease id), encoded.
fn raw_lets(vars: &[(&str, Uuid)]) -> RawDocumentBuf {
    let mut lets = RawDocumentBuf::new();
    for (name, id) in vars {
        let id = RawBinaryRef {
            subtype: BinarySubtype::Uuid,
            bytes: id.as_bytes(),
        };
        lets.append_ref(&name[2..], id);
    }
    lets
}

/// [`light_projection`], encoded.
fn raw_light_projection() -> RawDocumentBuf {
    RawDocumentBuf::from_document(&light_projection()).expect("a constant document encodes")
}

/// A document this store built that BSON cannot encode (a key too large).
fn encoding(e: mongodb::bson::raw::Error) -> Error {
    Error::InvalidKey {
        reason: format!("cannot be encoded as BSON: {e}"),
    }
}

/// The document a plain `findAndModify` command's `reply` returned (`value`).
fn reply_value(mut reply: Document) -> Option<Document> {
    match reply.remove("value") {
        Some(Bson::Document(value)) => Some(value),
        _ => None,
    }
}

impl MongoStore {
    /// The light `findAndModify` of `key`'s document (an upsert on
    /// `{_id, _ins: null}` if `upsert`, else on `_id`) with the encoded
    /// `update` and the `let` variables `lets`, returning the document after
    /// the write with [`light_projection`].
    async fn find_and_modify_light(
        &self,
        key: &LeaseKey,
        upsert: bool,
        update: RawArrayBuf,
        lets: &[(&str, Uuid)],
    ) -> Result<Option<Document>> {
        let mut command = RawDocumentBuf::new();
        command.append("findAndModify", self.coll().name());
        let query = if upsert {
            raw_upsert_filter(key)?
        } else {
            raw_key_filter(key)?
        };
        command.append("query", query);
        command.append("update", update);
        command.append("fields", raw_light_projection());
        command.append("new", true);
        command.append("upsert", upsert);
        command.append("let", raw_lets(lets));
        self.plain_command(command).await.map(reply_value)
    }

    /// The light release's `update` of `lease`'s document
    /// ([`light_release_update`]): 1 if it released the lease, 0 if it did not
    /// apply; 0 after a write error too, so that the general release that
    /// follows decides, and reports the error if the server refuses it
    /// again. Idempotent: the first write that lands removes `lid`.
    async fn release_light_command(&self, lease: &LeaseRef) -> Result<u64> {
        let update = encode_pipeline(light_release_update(self.owner()))?;
        let mut command = update_command(
            self.coll().name(),
            raw_key_filter(&lease.key)?,
            update,
            false,
        );
        command.append("let", raw_lets(&[(LID, lease.lease_id)]));
        let reply = self.plain_command(command).await?;
        Ok(update_counts(&reply).map_or(0, |(_, modified)| modified))
    }

    /// The light handoff of `key`'s lease `from` to `to` (TTL `ttl_ms`):
    /// the new token if it applied; `None` if it did not (the general
    /// handoff decides then).
    ///
    /// # Errors
    ///
    /// As the write's: a transient error is an unknown outcome (the write
    /// may have applied, under `to`).
    pub(super) async fn hand_over_light(
        &self,
        key: &LeaseKey,
        from: Uuid,
        to: Uuid,
        ttl_ms: i64,
    ) -> Result<Option<u64>> {
        let lets = [(FROM, from), (TO, to)];
        let doc = self
            .find_and_modify_light(
                key,
                false,
                encode_pipeline(light_hand_over_update(self.owner(), ttl_ms))?,
                &lets,
            )
            .await?;
        Ok(doc.and_then(|doc| acquired_token(&doc, self.owner(), to)))
    }

    /// The light acquires `requests` (of distinct keys; string keys if
    /// more than one): the light form's own command for one, one batch
    /// for more (`batched`); one answer each, in order.
    pub(super) async fn light_acquires(&self, requests: Vec<LightAcquire>) -> Vec<LightAcquired> {
        match &requests[..] {
            [request] => vec![self.acquire_light_alone(request).await],
            _ => self.acquire_light_batch(&requests).await,
        }
    }

    /// The light releases of `leases` (exclusive, of distinct keys; string
    /// keys if more than one): the light form's own command for one, one
    /// batch for more (`batched`); one answer each, in order.
    pub(super) async fn light_releases(&self, leases: Vec<LeaseRef>) -> Vec<LightRelease> {
        match &leases[..] {
            [lease] => vec![self.release_light_alone(lease).await],
            _ => self.release_light_batch(&leases).await,
        }
    }

    /// The light release's own command for `lease`, retried after a
    /// transient failure.
    async fn release_light_alone(&self, lease: &LeaseRef) -> LightRelease {
        match retried("release", || self.release_light_command(lease)).await {
            Ok((count, _)) if count > 0 => LightRelease::Released,
            Ok((_, false)) => LightRelease::NotApplied,
            Ok((_, true)) => LightRelease::Unknown,
            Err(e) => LightRelease::Failed(e),
        }
    }

    /// The light acquire's own command (`findAndModify`) for `request`:
    /// not applied after a transient error (its outcome unknown: the
    /// general acquire under the same lease id recognises a landed one as
    /// a retry, B7) or a duplicate key (a racing upsert).
    async fn acquire_light_alone(&self, request: &LightAcquire) -> LightAcquired {
        let LightAcquire { key, lease_id, ttl } = request;
        let (lease_id, ttl_ms) = (*lease_id, ttl_ms(*ttl));
        let update = match encode_pipeline(light_acquire_update(self.owner(), ttl_ms)) {
            Ok(update) => update,
            Err(e) => return LightAcquired::Failed(e),
        };
        let attempt = self
            .find_and_modify_light(key, true, update, &[(LID, lease_id)])
            .await;
        let token = match attempt {
            Ok(doc) => doc.and_then(|doc| acquired_token(&doc, self.owner(), lease_id)),
            Err(e) if e.is_transient() => None,
            Err(Error::Database(e)) if is_duplicate_key(&e) => None,
            Err(e) => return LightAcquired::Failed(e),
        };
        token.map_or(LightAcquired::NotApplied, LightAcquired::Acquired)
    }
}

mod batched;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn the_light_acquire_is_one_small_stage() {
        let update = light_acquire_update("a", 1000);
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
    fn the_light_updates_apply_only_without_any_sign_of_another_waiter() {
        for update in [light_release_update("a"), light_hand_over_update("a", 1000)] {
            let stage = update[0].get_document("$replaceWith").unwrap();
            let branches = stage.get_array("$cond").unwrap();
            let applies = branches[0].as_document().unwrap();
            let all = applies.get_array("$and").unwrap();
            for name in [
                field::QUEUE,
                field::WAITING_SINCE,
                field::HOLD_UNTIL,
                field::HOLDERS,
                field::PERMITS,
            ] {
                assert!(all.contains(&Bson::Document(missing(name))), "{name}");
            }
            assert_eq!(branches[2], Bson::from("$$ROOT"), "else unchanged");
        }
    }

    #[test]
    fn the_let_variables_hold_the_lease_ids_as_stored() {
        let (from, to) = (Uuid::new_v4(), Uuid::new_v4());
        let lets = raw_lets(&[(FROM, from), (TO, to)]).to_document().unwrap();
        assert_eq!(
            lets,
            doc! { "from": bson_lease_id(from), "to": bson_lease_id(to) }
        );
        assert_eq!(
            raw_light_projection().to_document().unwrap(),
            light_projection()
        );
    }
}
