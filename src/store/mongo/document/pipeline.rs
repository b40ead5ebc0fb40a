//! The BSON of the acquire, renewal and release commands
//! [`DocumentStore`](super::DocumentStore) sends, where a user's document
//! differs from a lock document (see `document`); tested against a real
//! `mongod` (`tests/document_lease/protocol.rs`).

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::super::rules::{LockPath, bson_lease_id};
use super::top_lock::TopLock;
use crate::store::{LeaseRef, field};

/// The acquire update of a user's document: one `findAndModify` on `_id`
/// alone (never an `$expr` in an upsert filter, docs/mongodb-behaviour.md,
/// B1), with the lock collection's win rule and token rule applied to the
/// lock field `lock_field` ([`LockPath::wins`], [`LockPath::acquired`]).
/// Winning merges the new `F` into the document; losing leaves the document
/// as it is (no write, docs/mongodb-behaviour.md, B2), except that a
/// `waiting` attempt marks (`F.wt`) a live lease of another owner once.
///
/// With `create` (the upsert's fields), a document that has only `_id` (the
/// one an upsert starts from) first gets `create`'s fields, as literals.
///
/// With `top` (`LockId` / `LockTime` kept at the top), the win rule is
/// [`TopLock::wins`] and winning also writes [`TopLock::acquired`].
pub(super) fn acquire_pipeline(
    lock_field: &str,
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    waiting: bool,
    create: Option<&Document>,
    top: Option<&TopLock>,
) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    let lid = bson_lease_id(lease_id);
    let mut wins = at.wins(owner, &lid, None);
    let mut lock = doc! { lock_field: at.acquired(owner, &lid, ttl_ms) };
    let mut held_by_other = at.held_by_other(owner);
    if let Some(top) = top {
        wins = top.wins(lock_field, wins);
        lock.extend(top.acquired(&lid));
        held_by_other = top.marks(lock_field, held_by_other);
    }
    let took = doc! { "$mergeObjects": ["$$ROOT", lock] };
    let lost = if waiting {
        let marked = doc! { "$mergeObjects": ["$$ROOT", { lock_field: { "$mergeObjects": [
            format!("${lock_field}"),
            { field::WAITING_SINCE: at.waiting_since() },
        ]}}]};
        Bson::from(doc! { "$cond": [held_by_other, marked, "$$ROOT"] })
    } else {
        Bson::from("$$ROOT")
    };
    let mut stages = Vec::with_capacity(2);
    if let Some(create) = create {
        let only_id = doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] };
        stages.push(doc! { "$replaceWith": { "$cond": [
            only_id,
            { "$mergeObjects": ["$$ROOT", { "$literal": create.clone() }] },
            "$$ROOT",
        ]}});
    }
    stages.push(doc! { "$replaceWith": { "$cond": [wins, took, lost] } });
    stages
}

/// The field of [`acquire_projection`] that holds the whole document.
pub(super) const DOCUMENT: &str = "doc";

/// The projection of an acquire: the whole document as stored (`doc`) and
/// the server's `$$NOW` (`now`), so that a held lease's remaining time is
/// computed on the server's clock (docs/mongodb-behaviour.md, B11).
pub(super) fn acquire_projection() -> Document {
    doc! { field::ID: 0, DOCUMENT: "$$ROOT", "now": "$$NOW" }
}

/// The lock field `lock_field` of `document` as the lock collection's readers
/// (`classify`, `lease_info`) read a lock document, with `now`: `F`'s fields
/// if it is a document; otherwise (a value of foreign layout) a document
/// without our fields, which they read as a foreign holder's lock. `None`
/// if the document has no `F`. An empty `F` (`{}`) is a foreign holder's.
pub(super) fn lock_view(lock_field: &str, document: &Document, now: Bson) -> Option<Document> {
    let mut view = match document.get(lock_field)? {
        Bson::Document(lock) => lock.clone(),
        _ => Document::new(),
    };
    view.insert("now", now);
    Some(view)
}

/// The projection of `inspect`: the lock field and the server's `$$NOW`.
pub(super) fn info_projection(lock_field: &str) -> Document {
    doc! { lock_field: 1, "now": "$$NOW" }
}

/// The documents of `leases` of `owner`: `_id` among their keys, `F.lid`
/// among their lease ids and `F.aid` the owner id (`exclusive_filter` of
/// the lock collection).
pub(super) fn lease_filter(lock_field: &str, owner: &str, leases: &[LeaseRef]) -> Document {
    let at = LockPath::under(lock_field);
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        at.at(field::LEASE_ID): { "$in": ids },
        at.at(field::OWNER): { "$eq": owner },
    }
}

/// The renewal: `F.ts = $$NOW`, `F.exp = max(F.exp, $$NOW + ttl_ms)`
/// (never back, `LockPath::renewed_expiry`); nothing else changes.
pub(super) fn renew_update(lock_field: &str, ttl_ms: i64) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    vec![doc! { "$set": {
        at.at(field::RENEWED_AT): "$$NOW",
        at.at(field::EXPIRES_AT): at.renewed_expiry(ttl_ms),
    }}]
}

/// The released state (`release_update` of the lock collection, under `F`):
/// `F.exp` moves to now, `F.lid` and `F.wt` are removed, and `F.yu` is set
/// to now + `yield_ms` if another owner waited (`F.wt`). The next acquire
/// takes it over with the next token.
pub(super) fn release_update(lock_field: &str, yield_ms: i64) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    vec![
        doc! { "$set": {
            at.at(field::EXPIRES_AT): { "$min": [at.var(field::EXPIRES_AT), "$$NOW"] },
            at.at(field::YIELD_UNTIL): at.yield_if_waited(yield_ms),
        }},
        doc! { "$unset": [at.at(field::LEASE_ID), at.at(field::WAITING_SINCE)] },
    ]
}

/// Removes the lock field: what "delete" means for in-document leases.
pub(super) fn remove_update(lock_field: &str) -> Document {
    doc! { "$unset": { lock_field: "" } }
}

/// Sets the payload `F.data`; nothing else changes.
pub(super) fn payload_update(lock_field: &str, payload: Document) -> Document {
    doc! { "$set": { LockPath::under(lock_field).at(field::PAYLOAD): payload } }
}

#[cfg(test)]
pub(super) mod fixtures {
    use crate::store::LeaseRef;
    use uuid::Uuid;

    /// The lease id of [`lease`].
    pub(in crate::store::mongo::document) const LID: Uuid =
        Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

    /// The lock field of the unit tests.
    pub(in crate::store::mongo::document) const LOCK_FIELD: &str = "_lease";

    /// The lease `LID` of key `"k"`.
    pub(in crate::store::mongo::document) fn lease() -> LeaseRef {
        LeaseRef {
            key: "k".into(),
            lease_id: LID,
            kind: crate::kind::LeaseKind::Exclusive,
        }
    }
}

#[cfg(test)]
mod tests;
