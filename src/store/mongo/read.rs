//! **Read and list**: `inspect` and `list` of lock documents with the
//! server's now ([`info_projection`], [`projected_info`]), and the read of
//! many keys' documents after a grouped light write
//! ([`MongoStore::read_keys`]). A document of foreign layout is a foreign
//! holder's lock (`store::read`).

use super::handle::{MongoStore, id_index};
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::{field, lease_info};
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{FindOptions, Hint};
use std::collections::HashMap;
/// The projection of reads that report a [`LeaseInfo`]: every field of the
/// schema and the server's `$$NOW` (docs/mongodb-behaviour.md, B11).
pub(super) fn info_projection() -> Document {
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::ACQUIRED_AT: 1,
        field::OTHER_OWNER: 1, field::RENEWED_AT: 1, field::EXPIRES_AT: 1, field::PAYLOAD: 1, "now": "$$NOW",
        field::HOLDERS: 1, field::PERMITS: 1, field::HOLD_UNTIL: 1, field::NOT_BEFORE: 1,
        field::QUEUE: 1, field::EXCLUSIVE_WAITER: 1, field::TRANSITIONS: 1,
    }
}

/// Reads a document projected with [`info_projection`] into a [`LeaseInfo`]
/// judged at its `now` (a foreign holder's lock for a document of foreign
/// shape, a bare `{_id}` included). `None` without `now`.
pub(super) fn projected_info(key: &LeaseKey, doc: &Document) -> Option<LeaseInfo> {
    let now = doc.get_datetime("now").ok()?.to_system_time();
    Some(lease_info(key, doc, now))
}

/// The `min` bound of a page of `list` after `after`, with the `_id` index
/// as hint: unlike `{_id: {$gt: after}}`, which only matches keys of
/// `after`'s type (docs/mongodb-behaviour.md, B10), an index bound crosses
/// types in MongoDB's BSON order. It is inclusive: the page skips `after`.
pub(super) fn list_min(after: &LeaseKey) -> Document {
    doc! { field::ID: after }
}

impl MongoStore {
    /// The documents of the string keys `keys`, read on the primary (read
    /// concern `local`: a majority-acknowledged write of this store is
    /// there) with `projection`, by key; `None` if the read failed.
    pub(super) async fn read_keys(
        &self,
        keys: &[&str],
        projection: Document,
    ) -> Option<HashMap<String, Document>> {
        let command = doc! {
            "find": self.coll().name(),
            "filter": { field::ID: { "$in": keys } },
            "projection": projection,
            "batchSize": keys.len() as i64,
            "singleBatch": true,
            "readConcern": { "level": "local" },
        };
        let reply = self
            .bounded(self.database.run_command(command))
            .await
            .ok()?;
        let batch = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .ok()?;
        Some(
            batch
                .iter()
                .filter_map(|d| d.as_document())
                .filter_map(|d| Some((d.get_str(field::ID).ok()?.to_owned(), d.clone())))
                .collect(),
        )
    }

    /// [`info_projection`] with the fields of a foreign holder's lock
    /// (`crate::foreign`).
    pub(super) fn info_projection(&self) -> Document {
        self.with_foreign_fields(info_projection())
    }

    pub(super) async fn inspect_key(&self, key: LeaseKey) -> Result<Option<LeaseInfo>> {
        let found = self.read_key(&key, self.info_projection()).await?;
        Ok(found.and_then(|doc| projected_info(&key, &doc)))
    }

    pub(super) async fn list_page(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> Result<(Vec<LeaseInfo>, Option<LeaseKey>)> {
        if after.as_ref().is_some_and(|a| a.to_bson() == Bson::MaxKey) {
            // Nothing sorts after MaxKey (and MongoDB refuses it as `min`).
            return Ok((Vec::new(), None));
        }
        // One more than `limit` when the inclusive `min` bound returns `after`.
        let fetch = limit.saturating_add(usize::from(after.is_some()));
        let mut options = FindOptions::builder()
            .sort(doc! { field::ID: 1 })
            .limit(fetch.min(i64::MAX as usize) as i64)
            .projection(self.info_projection())
            .build();
        if let Some(after) = &after {
            options.min = Some(list_min(after));
            options.hint = Some(Hint::Keys(id_index()));
        }
        let mut docs: Vec<Document> = self
            .bounded(async {
                self.coll()
                    .find(doc! {})
                    .with_options(options)
                    .await?
                    .try_collect()
                    .await
            })
            .await?;
        if after.is_some() && docs.len() < fetch {
            // A `min` bound's index scan stops before a `MaxKey` `_id`
            // (docs/mongodb-behaviour.md, B10): read it apart, on the last page.
            let max_key = self
                .bounded(
                    self.coll()
                        .find_one(doc! { field::ID: Bson::MaxKey })
                        .projection(self.info_projection()),
                )
                .await?;
            docs.extend(max_key);
        }
        let id = |d: &Document| d.get(field::ID).cloned().map(LeaseKey::from);
        if after.is_some() && docs.first().and_then(id) == after {
            docs.remove(0);
        }
        docs.truncate(limit);
        let next = docs.last().filter(|_| docs.len() == limit).and_then(id);
        let page = docs
            .iter()
            .filter_map(|doc| projected_info(&id(doc)?, doc))
            .collect();
        Ok((page, next))
    }
}
