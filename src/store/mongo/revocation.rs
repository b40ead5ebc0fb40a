//! **Revocation**: the request that the holders of a key release it
//! ("Revocation" in `store`), one `updateOne` (a retryable write) of a key
//! held now that sets `rv` and changes no lease field; the holders' managers
//! see it in their change stream of writes (`watch::revocation`).

use super::handle::{MongoStore, retried};
use super::rules::f;
use crate::error::Result;
use crate::key::LeaseKey;
use crate::store::field;
use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use mongodb::options::{CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria};

/// `key` if a lease of our layout holds it now: an exclusive lease (`lid`)
/// or holders in `hs`, with `exp > $$NOW`.
pub(super) fn revocable_filter(key: &LeaseKey) -> Document {
    doc! {
        field::ID: key,
        field::TOKEN: { "$type": "long" },
        field::OTHER_OWNER: { "$exists": false },
        "$or": [
            { field::LEASE_ID: { "$exists": true } },
            { field::HOLDERS: { "$exists": true } },
        ],
        "$expr": { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    }
}

/// The request's update: `rv = {aid: by, at: $$NOW}`.
pub(super) fn revocation_update(by: &str) -> Vec<Document> {
    vec![doc! { "$set": { field::REVOCATION: {
        field::OWNER: { "$literal": by },
        "at": "$$NOW",
    }}}]
}

impl MongoStore {
    /// The requests on `keys` (a place's held keys, read when its change
    /// stream opens, since writes before it are not announced): each key
    /// with `rv`, and the owner id that asked.
    pub(super) async fn revocations_of(
        &self,
        keys: Vec<LeaseKey>,
    ) -> Result<Vec<(LeaseKey, String)>> {
        let filter = doc! {
            field::ID: { "$in": keys.iter().map(LeaseKey::to_bson).collect::<Vec<_>>() },
            field::REVOCATION: { "$exists": true },
        };
        // Local read concern on the primary: a request the stream's start
        // left out (its write before the start) may not be majority
        // committed yet; a hint read from a write later rolled back is
        // harmless.
        let options = CollectionOptions::builder()
            .read_concern(ReadConcern::local())
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .build();
        let coll = self
            .database
            .collection_with_options::<Document>(self.coll().name(), options);
        let pipeline = [
            doc! { "$match": filter },
            doc! { "$project": { field::REVOCATION: 1 } },
        ];
        let found = self
            .bounded(async { coll.aggregate(pipeline).await?.try_collect().await })
            .await?;
        let found: Vec<Document> = found;
        Ok(found
            .iter()
            .filter_map(|doc| {
                let key = LeaseKey::from(doc.get(field::ID)?.clone());
                let by = doc
                    .get_document(field::REVOCATION)
                    .ok()?
                    .get_str(field::OWNER)
                    .ok()?;
                Some((key, by.to_string()))
            })
            .collect())
    }

    /// Asks the holders of `key` to release it: whether a lease held it.
    pub(super) async fn request_release_of(&self, key: LeaseKey) -> Result<bool> {
        let filter = revocable_filter(&key);
        let matched = retried("request release", || async {
            let update = self
                .coll()
                .update_one(filter.clone(), revocation_update(self.owner()));
            Ok(self.bounded(update).await?.matched_count)
        })
        .await?;
        Ok(matched > 0)
    }
}
