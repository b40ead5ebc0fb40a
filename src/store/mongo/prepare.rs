//! Preparing the lock collection: checks that the deployment answers and the
//! collection is usable (not capped, not a view, no unique index but `_id`,
//! no non-TTL index on `exp`), and creates the TTL index that
//! garbage-collects lock documents and the owner index of `release_all`.

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::doc;
use mongodb::options::IndexOptions;

use super::handle::{MongoStore, command_code};
use crate::error::{Error, Result, is_transient_db_error};
use crate::store::field;

/// Name of the TTL index that garbage-collects lock documents.
pub(crate) const GC_INDEX_NAME: &str = "mongo_lease_gc";
/// Name of the index that serves `release_all` (by owner id).
pub(crate) const OWNER_INDEX_NAME: &str = "mongo_lease_owner";

impl MongoStore {
    /// Checks that the deployment answers and the collection is usable, and
    /// creates the indexes the protocol needs (idempotent).
    ///
    /// # Errors
    /// [`Error::Unreachable`] if no server answers within the operation timeout,
    /// [`Error::UnusableCollection`] for a capped collection or a non-TTL index on
    /// `exp`, [`Error::Database`] for anything else the server refuses.
    pub(crate) async fn prepare(&self, gc_grace: Duration) -> Result<()> {
        let waited = self.operation_timeout();
        let unreachable = |e: Error| match e {
            Error::Database(db) if is_transient_db_error(&db) => Error::Unreachable {
                waited,
                reason: db.to_string(),
            },
            other => other,
        };
        let db = self.coll().namespace().db;
        let name = self.coll().name().to_string();
        let database = self.coll().client().database(&db);
        self.bounded(database.run_command(doc! { "ping": 1 }))
            .await
            .map_err(unreachable)?;

        let collections: Vec<_> = self
            .bounded(async {
                database
                    .list_collections()
                    .filter(doc! { "name": &name })
                    .await?
                    .try_collect()
                    .await
            })
            .await
            .map_err(unreachable)?;
        if let Some(spec) = collections.first() {
            if spec.options.capped == Some(true) {
                return Err(Error::UnusableCollection {
                    reason: format!(
                        "{db}.{name} is a capped collection; leases need deletes and \
                         size-changing updates"
                    ),
                });
            }
            if spec.collection_type != mongodb::results::CollectionType::Collection {
                return Err(Error::UnusableCollection {
                    reason: format!("{db}.{name} is a view or timeseries, not a collection"),
                });
            }
        }

        let existing: Vec<IndexModel> = if collections.is_empty() {
            Vec::new()
        } else {
            self.bounded(async { self.coll().list_indexes().await?.try_collect().await })
                .await
                .map_err(unreachable)?
        };
        // A unique index on anything but `_id` would make leases of different
        // keys collide (E11000 on insert): refuse the collection up front.
        if let Some(index) = existing.iter().find(|index| {
            index.keys != doc! { field::ID: 1 }
                && index.options.as_ref().and_then(|o| o.unique) == Some(true)
        }) {
            return Err(Error::UnusableCollection {
                reason: format!(
                    "{db}.{name} has a unique index on {}; lock documents of different keys \
                     would collide. Drop it or use another collection",
                    index.keys
                ),
            });
        }
        let gc_index = existing
            .iter()
            .find(|index| index.keys == doc! { field::EXPIRES_AT: 1 });
        match gc_index {
            Some(index) => {
                let ttl = index.options.as_ref().and_then(|o| o.expire_after);
                if ttl.is_none() {
                    return Err(Error::UnusableCollection {
                        reason: format!(
                            "{db}.{name} has an index on `exp` that is not a TTL index \
                             (expireAfterSeconds); drop it or use another collection"
                        ),
                    });
                }
                if ttl != Some(gc_grace) {
                    tracing::debug!(existing = ?ttl, wanted = ?gc_grace, "keeping the existing TTL index on `exp`");
                }
            }
            None => {
                let model = IndexModel::builder()
                    .keys(doc! { field::EXPIRES_AT: 1 })
                    .options(
                        IndexOptions::builder()
                            .name(GC_INDEX_NAME.to_string())
                            .expire_after(gc_grace)
                            .build(),
                    )
                    .build();
                if !self.create_index(model).await.map_err(unreachable)? {
                    self.require_gc_index().await.map_err(unreachable)?;
                }
            }
        }
        if !existing.iter().any(|i| i.keys == doc! { field::OWNER: 1 }) {
            let model = IndexModel::builder()
                .keys(doc! { field::OWNER: 1 })
                .options(
                    IndexOptions::builder()
                        .name(OWNER_INDEX_NAME.to_string())
                        .build(),
                )
                .build();
            self.create_index(model).await.map_err(unreachable)?;
        }
        Ok(())
    }

    /// Creates `model`; `Ok(false)` if an index with the same name or keys but
    /// other options exists (IndexOptionsConflict / IndexKeySpecsConflict), for
    /// example created by another manager meanwhile: the caller checks it.
    async fn create_index(&self, model: IndexModel) -> Result<bool> {
        match self.bounded(self.coll().create_index(model)).await {
            Ok(_) => Ok(true),
            Err(Error::Database(e)) if matches!(command_code(&e), Some(85 | 86)) => {
                tracing::debug!(error = %e, "a conflicting index exists");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// After a conflict creating the TTL index: there must now be a TTL index
    /// on `exp` (another manager's), not just an index that took its name.
    async fn require_gc_index(&self) -> Result<()> {
        let indexes: Vec<IndexModel> = self
            .bounded(async { self.coll().list_indexes().await?.try_collect().await })
            .await?;
        let ttl_on_exp = indexes.iter().any(|index| {
            index.keys == doc! { field::EXPIRES_AT: 1 }
                && index
                    .options
                    .as_ref()
                    .and_then(|o| o.expire_after)
                    .is_some()
        });
        if ttl_on_exp {
            return Ok(());
        }
        let ns = self.coll().namespace();
        Err(Error::UnusableCollection {
            reason: format!(
                "{ns} has an index named {GC_INDEX_NAME:?} that is not a TTL index on `exp`; \
                 lock documents would never be deleted. Drop it or use another collection"
            ),
        })
    }
}
