//! Unit tests of the commands' BSON and of their replies, without a
//! server, and the light forms' tests on a real `mongod`.

use mongodb::bson::{Bson, Document, doc};
use std::time::Duration;

use mongodb::Database;
use uuid::Uuid;

use super::MongoStore;
use super::acquire::*;
use super::document::DocumentStore;
use super::handle::*;
use super::handoff::*;
use super::light_forms::*;
use super::payload::*;
use super::raw::*;
use super::read::*;
use super::release::*;
use super::renew::*;
use super::rules::*;
use super::watch::*;
use crate::error::Result;
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, replies};
use crate::store::{LeaseRef, field};

mod kinds;
mod light;
mod light_unit;
mod pipeline;
mod queue;
mod raw;
mod renewal;
/// For the tests of this store on a real `mongod`: a store of owner `a`
/// with TTL `ttl` (a yield window of 1 s, an operation timeout of 30 s) on
/// a new collection of `db` named after `prefix`, and that name.
pub(super) fn test_store(db: &Database, prefix: &str, ttl: Duration) -> (String, MongoStore) {
    let collection = crate::testkit::unique_name(prefix);
    let store = MongoStore::new(
        db,
        &collection,
        "a".into(),
        ttl,
        Duration::from_secs(1),
        Duration::from_secs(30),
    );
    (collection, store)
}

/// The contract tests' database on the shared deployment
/// (`testkit::shared_uri`).
pub(super) async fn shared_test_db() -> Database {
    mongodb::Client::with_uri_str(crate::testkit::shared_uri())
        .await
        .expect("a client of the shared deployment")
        .database("mongo_lease_contract")
}

/// The store contract's views of the re-read paths.
impl MongoStore {
    /// What the re-read after an unknown outcome of an acquisition of
    /// `shape` by this owner under `lease_id` (for `ttl`) answers now: the
    /// store contract's view of that path.
    pub(crate) async fn reread_acquire(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        ttl: std::time::Duration,
        shape: crate::kind::LeaseShape,
    ) -> Result<AcquireOutcome> {
        let kind = shape.kind;
        if kind.is_multi_holder() {
            let projection = multi_acquire_projection(self.owner(), lease_id);
            return self
                .reread(key, projection, |key, doc| {
                    replies::classify_multi(key, kind, doc)
                })
                .await;
        }
        let ttl_ms = ttl_ms(ttl);
        self.reread(key, acquire_projection(), |key, doc| {
            replies::exclusive(key, self.owner(), lease_id, ttl_ms, doc)
        })
        .await
    }

    /// What the re-read after an unknown outcome of an acquisition of the
    /// document `key` of `collection` (lock field `field`) by this owner
    /// under `lease_id` answers now: the store contract's view of that
    /// path.
    pub(crate) async fn reread_document(
        &self,
        collection: &str,
        field: &str,
        key: LeaseKey,
        lease_id: Uuid,
    ) -> Result<AcquireOutcome> {
        let store = DocumentStore::new(self, collection, field, None)?;
        Ok(store.reread(key, lease_id, true).await?.0)
    }
}
