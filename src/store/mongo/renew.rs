//! **Renew**: the heartbeat's renewal of a batch of leases, one `updateMany`
//! whatever their kinds ([`MongoStore::renew_batch`] picks the form by the
//! kinds the actor sends with the leases).
//!
//! - Plain exclusive leases only: [`renewal_command`], the filter naming
//!   every key and lease id of the batch ([`exclusive_filter`],
//!   [`renew_exclusive_update`]), serialized in one pass into the one
//!   buffer the driver is handed and sent as a raw command. Built as a
//!   `Document` it took several times its encoded size, and as nested raw
//!   documents it was copied once per level (the RSS per held lease of
//!   `benches/memory.rs`).
//! - Any kind ([`holder_filter`], [`renew_any_update`]): a lease matched by
//!   `lid` at the top or in `hs` with its owner id; the entry's `ts` and
//!   `exp` and the top `ts` and `exp = max(exp, ...)` set, `exp` at least
//!   `hl` ("Shared and semaphore keys", "Holding at least" in `store`).
//!
//! The leases not renewed are read back ([`MongoStore::unrenewed`]) so that
//! the actor learns which are no longer held.

use super::handle::{MongoStore, retried};
use super::raw::update_counts;
use super::rules::{
    LockPath, bson_lease_id, entries, entry_among, entry_is, entry_live, f, has_holders, lease_ids,
    read_lease_id, restated_seconds, this,
};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::store::{LeaseRef, field};
use futures::TryStreamExt;
use mongodb::Collection;
use mongodb::bson::{Bson, Document, RawDocumentBuf, bson, doc};
use mongodb::options::UpdateModifications;
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use std::collections::HashSet;
use uuid::Uuid;
/// The documents holding any of `leases` of `owner`: `_id` among their
/// keys (one indexed `$in`), and either the top `lid` (an exclusive lease)
/// or an entry of `hs` (a shared or permit holder) among their lease ids,
/// with `owner`'s owner id. The filter of renewals and releases.
pub(super) fn holder_filter(owner: &str, leases: &[LeaseRef]) -> Document {
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        "$or": top_or_entry(owner, doc! { "$in": ids }),
        field::OTHER_OWNER: { "$exists": false },
    }
}

/// The `$or` of the lock of `owner` under `lease_id` (a value or a query
/// operator): at the top (`lid`), or an entry of `hs`.
fn top_or_entry(owner: &str, lease_id: impl Into<Bson>) -> Bson {
    let lease_id = lease_id.into();
    bson!([
        { field::LEASE_ID: lease_id.clone(), field::OWNER: { "$eq": owner } },
        { field::HOLDERS: { "$elemMatch": {
            field::LEASE_ID: lease_id,
            field::OWNER: { "$eq": owner },
        }}},
    ])
}

/// The lock of `key` still under `lease_id` of `owner` and live by the
/// server's clock: an exclusive lease (`lid` at the top) or a holder of a
/// shared or semaphore key (an entry of `hs`). The transaction helper's
/// check (whose write sets `ts` alone: `transaction::check_update`).
pub(super) fn holder_check_filter(key: &LeaseKey, owner: &str, lease_id: Uuid) -> Document {
    let lid = bson_lease_id(lease_id);
    let live_entry = doc! { "$anyElementTrue": [{ "$map": { "input": entries(), "in": { "$and": [
        entry_is(owner, lease_id),
        entry_live(),
    ]}}}]};
    doc! {
        field::ID: key,
        "$or": top_or_entry(owner, lid.clone()),
        field::OTHER_OWNER: { "$exists": false },
        "$expr": { "$or": [
            { "$and": [
                { "$eq": [f(field::LEASE_ID), lid] },
                { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
            ]},
            live_entry,
        ]},
    }
}

/// The documents of exclusive leases among `leases` of `owner`: `_id`
/// among their keys, `lid` among their lease ids (one `$in` each, one
/// indexed query) and `aid` the owner id. The filter of a renewal batch
/// with no holder of a shared or semaphore key.
pub(super) fn exclusive_filter(owner: &str, leases: &[LeaseRef]) -> Document {
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        field::LEASE_ID: { "$in": ids },
        field::OWNER: { "$eq": owner },
        field::OTHER_OWNER: { "$exists": false },
    }
}

/// The renewal of exclusive leases ([`exclusive_filter`]): `ts = $$NOW`,
/// `exp = max(exp, $$NOW + ttl_ms)` (never back: a renewal that lands
/// late cuts nothing, `LockPath::renewed_expiry`), then `exp = max(exp,
/// hl)` (a second stage, so that the first is the renewal alone); nothing
/// else changes.
pub(super) fn renew_exclusive_update(ttl_ms: i64) -> Vec<Document> {
    let expires = doc! { "$max": [f(field::EXPIRES_AT), f(field::HOLD_UNTIL)] };
    vec![
        doc! { "$set": {
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: LockPath::TOP.renewed_expiry(ttl_ms),
            field::OBTAINED_AT: "$$NOW",
        }},
        doc! { "$set": {
            field::EXPIRES_AT: expires.clone(),
            field::TTL_SECONDS: restated_ttl(expires),
        }},
    ]
}

/// The renewal of a batch of any kinds (the leases `ids` of `owner`), one
/// `updateMany` with [`holder_filter`]: `ts = $$NOW`; an exclusive lease's
/// `exp = max(exp, $$NOW + ttl_ms, hl)`; a holder's entry `ts` and `exp =
/// max(exp, $$NOW + ttl_ms)`, and the top `exp` the latest of the
/// entries'. No `exp` moves back (`LockPath::renewed_expiry`). The first
/// stage renews as the renewal of plain leases does, the second
/// raises `exp` to `hl` or the latest entry's.
pub(super) fn renew_any_update(owner: &str, ids: &[Uuid], ttl_ms: i64) -> Vec<Document> {
    let expires = LockPath::TOP.renewed_expiry(ttl_ms);
    let entry_expires = doc! { "$max": [this(field::EXPIRES_AT), { "$add": ["$$NOW", ttl_ms] }] };
    let renewed = doc! { "$map": { "input": f(field::HOLDERS), "in": { "$cond": [
        entry_among(owner, ids),
        { "$mergeObjects": ["$$this", { field::RENEWED_AT: "$$NOW", field::EXPIRES_AT: entry_expires }] },
        "$$this",
    ]}}};
    let latest = doc! { "$max": [
        f(field::EXPIRES_AT),
        f(field::HOLD_UNTIL),
        { "$max": format!("${}.{}", field::HOLDERS, field::EXPIRES_AT) },
    ]};
    vec![
        doc! { "$set": {
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: expires,
            field::HOLDERS: { "$cond": [has_holders(), renewed, "$$REMOVE"] },
            field::OBTAINED_AT: "$$NOW",
        }},
        doc! { "$set": {
            field::EXPIRES_AT: latest.clone(),
            field::TTL_SECONDS: restated_ttl(latest),
        }},
    ]
}

/// The restated `ttl` of a renewal, whose filter matches only leases of
/// ours (so no layout test, unlike `rules::restated`): `rules::restated_seconds`
/// of `expires` (the stage's new `exp`) from `ts` (the first stage's
/// `$$NOW`) ("Read by other clients" in `store`).
fn restated_ttl(expires: Document) -> Document {
    restated_seconds(expires, f(field::RENEWED_AT), f(field::TOKEN))
}

/// The lease ids a document read by [`MongoStore::renew_matching`] holds:
/// the one at `path` (a dotted path), and those of the entries of `hs`.
pub(super) fn held_lease_ids(doc: &Document, path: &str) -> Vec<Uuid> {
    let mut value = Some(Bson::Document(doc.clone()));
    for part in path.split('.') {
        value = match value {
            Some(Bson::Document(d)) => d.get(part).cloned(),
            _ => None,
        };
    }
    let mut ids: Vec<Uuid> = read_lease_id(value.as_ref()).into_iter().collect();
    if let Ok(entries) = doc.get_array(field::HOLDERS) {
        ids.extend(
            entries
                .iter()
                .filter_map(|e| read_lease_id(e.as_document()?.get(field::LEASE_ID))),
        );
    }
    ids
}

/// The `update` command of one statement, `{ q: filter, u: update, multi:
/// true }`, renewing the plain `leases` of `owner` on `collection`
/// by `update`, with majority write concern, in the order
/// [`update_statements`](super::raw::update_statements) and
/// [`raw_command`](MongoStore::raw_command) give it.
pub(super) struct RenewalCommand<'a> {
    collection: &'a str,
    filter: Filter<'a>,
    update: &'a [Document],
}

impl Serialize for RenewalCommand<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut command = serializer.serialize_map(Some(3))?;
        command.serialize_entry("update", self.collection)?;
        command.serialize_entry("updates", &[Statement(self)])?;
        command.serialize_entry("writeConcern", &OneField("w", "majority"))?;
        command.end()
    }
}

/// The command's one statement.
pub(super) struct Statement<'a, 'b>(&'b RenewalCommand<'a>);

impl Serialize for Statement<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut statement = serializer.serialize_map(Some(3))?;
        statement.serialize_entry("q", &self.0.filter)?;
        statement.serialize_entry("u", self.0.update)?;
        statement.serialize_entry("multi", &true)?;
        statement.end()
    }
}

/// [`exclusive_filter`](super::renew::exclusive_filter) of `owner` and
/// `leases`.
pub(super) struct Filter<'a> {
    owner: &'a str,
    leases: &'a [LeaseRef],
}

impl Serialize for Filter<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut filter = serializer.serialize_map(Some(4))?;
        filter.serialize_entry(field::ID, &OneField("$in", Keys(self.leases)))?;
        filter.serialize_entry(field::LEASE_ID, &OneField("$in", LeaseIds(self.leases)))?;
        filter.serialize_entry(field::OWNER, &OneField("$eq", self.owner))?;
        filter.serialize_entry(field::OTHER_OWNER, &OneField("$exists", false))?;
        filter.end()
    }
}

/// A document of one field, `{ name: value }` (an operator, or the write concern).
pub(super) struct OneField<T>(&'static str, T);

impl<T: Serialize> Serialize for OneField<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut document = serializer.serialize_map(Some(1))?;
        document.serialize_entry(self.0, &self.1)?;
        document.end()
    }
}

/// The keys of the leases, each as stored (a string key as its text).
pub(super) struct Keys<'a>(&'a [LeaseRef]);

impl Serialize for Keys<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut keys = serializer.serialize_seq(Some(self.0.len()))?;
        for lease in self.0 {
            match lease.key.as_str() {
                Some(key) => keys.serialize_element(key)?,
                None => keys.serialize_element(&lease.key.to_bson())?,
            }
        }
        keys.end()
    }
}

/// The lease ids of the leases, as BSON UUIDs (binary subtype 4).
pub(super) struct LeaseIds<'a>(&'a [LeaseRef]);

impl Serialize for LeaseIds<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut ids = serializer.serialize_seq(Some(self.0.len()))?;
        for lease in self.0 {
            ids.serialize_element(&mongodb::bson::Uuid::from_bytes(
                lease.lease_id.into_bytes(),
            ))?;
        }
        ids.end()
    }
}

/// The renewal command of `owner`'s plain `leases` on
/// `collection` by TTL `ttl_ms`, serialized in one pass.
///
/// # Errors
///
/// [`Error::InvalidKey`] if a key cannot be encoded (it was encoded when
/// acquired, so in practice never).
pub(super) fn renewal_command(
    collection: &str,
    owner: &str,
    leases: &[LeaseRef],
    ttl_ms: i64,
) -> Result<RawDocumentBuf> {
    let update = renew_exclusive_update(ttl_ms);
    let command = RenewalCommand {
        collection,
        filter: Filter { owner, leases },
        update: &update,
    };
    let invalid = |e: &dyn std::fmt::Display| Error::InvalidKey {
        reason: format!("cannot be encoded as BSON: {e}"),
    };
    let bytes = mongodb::bson::to_vec(&command).map_err(|e| invalid(&e))?;
    RawDocumentBuf::from_bytes(bytes).map_err(|e| invalid(&e))
}

impl MongoStore {
    /// One `updateMany` for the batch: the renewal of plain leases
    /// when every lease of the batch is exclusive (its [`LeaseRef::kind`],
    /// encoded directly, [`renewal_command`]), else the renewal of any kinds.
    pub(super) async fn renew_batch(
        &self,
        leases: Vec<LeaseRef>,
        ttl_ms: i64,
    ) -> Result<Vec<LeaseRef>> {
        let owner = self.owner();
        // updateMany is not a retryable write; it is idempotent, so the actor retries
        // it. Judge by matchedCount: modifiedCount is lower when a renewal lands in
        // the same millisecond as the previous one (docs/mongodb-behaviour.md, B4).
        if leases.iter().any(|l| l.kind.is_multi_holder()) {
            let filter = |leases: &[LeaseRef]| holder_filter(owner, leases);
            let update = renew_any_update(owner, &lease_ids(&leases), ttl_ms);
            return self
                .renew_matching(self.coll(), filter, update, leases, field::LEASE_ID)
                .await;
        }
        let filter = |leases: &[LeaseRef]| exclusive_filter(owner, leases);
        match self.renew_exclusive_raw(&leases, ttl_ms).await? {
            Some(matched) => {
                self.unrenewed(self.coll(), filter, leases, field::LEASE_ID, matched)
                    .await
            }
            None => {
                let update = renew_exclusive_update(ttl_ms);
                self.renew_matching(self.coll(), filter, update, leases, field::LEASE_ID)
                    .await
            }
        }
    }

    /// Renews `leases` by `update` on the documents of `coll` that match
    /// `filter(leases)` (one `updateMany`); returns those no longer held
    /// ([`MongoStore::unrenewed`]). The filter (a copy of every key and
    /// lease id of the batch, several times the batch's own size) is built
    /// again for that read rather than kept or cloned, so one lives at a
    /// time. Also the in-document store's (`super::document`), on the
    /// user's collection, whose lease ids are at `lease_id_path`.
    pub(super) async fn renew_matching(
        &self,
        coll: &Collection<Document>,
        filter: impl Fn(&[LeaseRef]) -> Document,
        update: Vec<Document>,
        leases: Vec<LeaseRef>,
        lease_id_path: &str,
    ) -> Result<Vec<LeaseRef>> {
        let result = self
            .bounded(coll.update_many(filter(&leases), update))
            .await?;
        self.unrenewed(coll, filter, leases, lease_id_path, result.matched_count)
            .await
    }

    /// The leases of a renewal of `leases` (by `filter`, on `coll`) that
    /// `matched` documents matched which are no longer held: none if it
    /// matched one document per lease (a document has one key, so the
    /// batch then names each key once, and every one matched); otherwise
    /// (some leases gone, or several leases of one key, which one document
    /// matches once) those a read of the matching documents' lease ids (at
    /// `lease_id_path`, and in the entries of `hs`) does not find.
    pub(super) async fn unrenewed(
        &self,
        coll: &Collection<Document>,
        filter: impl Fn(&[LeaseRef]) -> Document,
        leases: Vec<LeaseRef>,
        lease_id_path: &str,
        matched: u64,
    ) -> Result<Vec<LeaseRef>> {
        // No set of the batch's keys is built to tell that they are
        // distinct: the documents matched have distinct keys among them.
        if matched as usize == leases.len() {
            return Ok(Vec::new());
        }
        let holders = format!("{}.{}", field::HOLDERS, field::LEASE_ID);
        let kept: HashSet<(LeaseKey, Uuid)> = self
            .bounded(async {
                coll.find(filter(&leases))
                    .projection(doc! { field::ID: 1, lease_id_path: 1, holders: 1 })
                    .await?
                    .try_collect::<Vec<Document>>()
                    .await
            })
            .await?
            .into_iter()
            .flat_map(|d| {
                let key = d.get(field::ID).cloned().map(LeaseKey::from);
                held_lease_ids(&d, lease_id_path)
                    .into_iter()
                    .filter_map(move |id| Some((key.clone()?, id)))
            })
            .collect();
        Ok(leases
            .into_iter()
            .filter(|l| !kept.contains(&(l.key.clone(), l.lease_id)))
            .collect())
    }

    /// Applies `update` to the documents of `coll` matching `filter`
    /// (`updateOne` for a `single` lease, a retryable write; else
    /// `updateMany`), [`retried`]: the last attempt's matched count. Also the
    /// in-document store's (`super::document`), on the user's collection.
    pub(super) async fn update_matching(
        &self,
        coll: &Collection<Document>,
        what: &str,
        filter: &Document,
        update: impl Fn() -> UpdateModifications,
        single: bool,
    ) -> Result<u64> {
        retried(what, || async {
            let result = if single {
                self.bounded(coll.update_one(filter.clone(), update()))
                    .await
            } else {
                self.bounded(coll.update_many(filter.clone(), update()))
                    .await
            };
            result.map(|r| r.matched_count)
        })
        .await
    }

    /// The renewal of the plain `leases` by TTL `ttl_ms`, one
    /// `update` command with `multi` (an `updateMany`, not a retryable
    /// write either way): the count of documents matched. `None` if the
    /// server reported write errors: the caller then sends the same
    /// renewal through the driver's `updateMany` (idempotent), which
    /// reports them as it always did.
    ///
    /// # Errors
    ///
    /// As the command's; a write concern error is [`Error::Unreachable`],
    /// an unknown outcome (the renewal may have applied).
    pub(super) async fn renew_exclusive_raw(
        &self,
        leases: &[LeaseRef],
        ttl_ms: i64,
    ) -> Result<Option<u64>> {
        let command = renewal_command(self.coll().name(), self.owner(), leases, ttl_ms)?;
        let reply = self.send_raw(command).await?;
        Ok(update_counts(&reply).map(|(matched, _)| matched))
    }
}
