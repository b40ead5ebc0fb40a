//! **Set permits**: the change of a semaphore key's number of permits
//! (`pm`), one `findOneAndUpdate` conditional on its live holders taking
//! no more than the new number ([`set_permits_update`]), and how its reply
//! is read ([`classify_set_permits`]); "Shared and semaphore keys" in
//! `store`.

use super::acquire::{permits_used, stored_permits};
use super::handle::MongoStore;
use super::rules::{entries, entry_live, f, key_filter, our_layout};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::PermitsChange;
use crate::store::field;
use crate::store::read::{int, stored_kind};
use mongodb::bson::{Document, doc};
use mongodb::options::ReturnDocument;

/// Field of the reply: the permits the live holders take.
const USED: &str = "used";
/// Field of the reply: how many live holders the key has.
const LIVE: &str = "live";
/// Field of the reply: whether a live exclusive lease or minimum hold
/// holds the key.
const EXCLUSIVE: &str = "excl";

/// The live entries of `hs` (an expression).
fn live_entries() -> Document {
    doc! { "$filter": { "input": entries(), "cond": entry_live() } }
}

/// The update: on a document of our layout holding live permits of a
/// semaphore (`pm` set, live entries in `hs`) that take at most `permits`,
/// `pm = permits` and `rl = $$NOW` (announced to the waiters, B19); any
/// other document unchanged (no write, B2).
pub(super) fn set_permits_update(permits: u32) -> Vec<Document> {
    let applies = doc! { "$let": {
        "vars": { "hs": live_entries() },
        "in": { "$and": [
            our_layout(),
            { "$ne": [{ "$type": f(field::PERMITS) }, "missing"] },
            { "$gt": [{ "$size": "$$hs" }, 0] },
            { "$lte": [permits_used("$$hs"), i64::from(permits)] },
        ]},
    }};
    vec![doc! { "$replaceWith": { "$cond": [
        applies,
        { "$mergeObjects": ["$$ROOT", {
            field::PERMITS: stored_permits(permits),
            field::RELEASED_AT: "$$NOW",
        }]},
        "$$ROOT",
    ]}}]
}

/// The projection of the reply (the document after the write): its kind
/// (`hs`, `pm`), the permits its live holders take, and whether a live
/// exclusive lease or minimum hold holds it.
pub(super) fn set_permits_projection() -> Document {
    doc! {
        field::PERMITS: 1,
        field::HOLDERS: { "$cond": [{ "$isArray": f(field::HOLDERS) }, [], "$$REMOVE"] },
        USED: permits_used(live_entries()),
        LIVE: { "$size": live_entries() },
        EXCLUSIVE: { "$and": [
            { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
            { "$or": [
                { "$ne": [{ "$type": f(field::LEASE_ID) }, "missing"] },
                { "$gt": [f(field::HOLD_UNTIL), "$$NOW"] },
            ]},
        ]},
    }
}

/// What the reply says, for a request of `permits`: set (`pm` is now
/// `permits` with live holders), too many held, nothing held, or a key
/// held as another kind.
pub(super) fn classify_set_permits(doc: Option<&Document>, permits: u32) -> Result<PermitsChange> {
    let Some(doc) = doc else {
        return Ok(PermitsChange::NothingHeld);
    };
    let live = int(doc.get(LIVE)).unwrap_or(0);
    let requested = LeaseKind::Permit { permits };
    if live == 0 {
        if doc.get_bool(EXCLUSIVE) == Ok(true) {
            return Err(Error::KindMismatch {
                stored: LeaseKind::Exclusive,
                requested,
            });
        }
        return Ok(PermitsChange::NothingHeld);
    }
    match stored_kind(doc) {
        LeaseKind::Permit { permits: stored } if stored == permits => Ok(PermitsChange::Set),
        LeaseKind::Permit { .. } => Ok(PermitsChange::TooManyHeld {
            held: u32::try_from(int(doc.get(USED)).unwrap_or(0)).unwrap_or(u32::MAX),
        }),
        stored => Err(Error::KindMismatch { stored, requested }),
    }
}

impl MongoStore {
    /// [`set_permits_update`] of `key`'s document (no upsert), read by
    /// [`classify_set_permits`]. Not retried here: it is idempotent, and an
    /// unknown outcome is the caller's error to retry.
    pub(super) async fn set_permits_of(
        &self,
        key: LeaseKey,
        permits: u32,
    ) -> Result<PermitsChange> {
        crate::kind::LeaseKind::Permit { permits }.validate()?;
        let found = self
            .bounded(
                self.coll()
                    .find_one_and_update(key_filter(&key), set_permits_update(permits))
                    .return_document(ReturnDocument::After)
                    .projection(set_permits_projection()),
            )
            .await?;
        classify_set_permits(found.as_ref(), permits)
    }
}
