//! Preparing the lock collection: checks that the deployment answers and the
//! collection is usable, and creates the TTL index that garbage-collects
//! lock documents and the owner index of a release by owner id. What is
//! refused, and the accepted examples: docs/sharing.md, "What `connect`
//! checks".
//!
//! # TTL indexes of other applications
//!
//! MongoDB deletes a document once the indexed date is `expireAfterSeconds`
//! (E) in the past, never earlier (docs/mongodb-behaviour.md, B5):
//!
//! - on `ts` (set to `$$NOW` by the acquire and by every renewal): a lease
//!   confirmed by a renewal sent at local time *s* has `ts >= s`, so it is
//!   deleted no earlier than *s + E*. The index is accepted only if
//!   `heartbeat_interval < E − safety_margin` (the rule
//!   [`Timing`](crate::config::Timing) applies to the TTL, applied to E),
//!   and the TTL of local deadlines is then capped by E
//!   (`CollectionFacts::ttl_cap`): a holder whose renewals fail gives up
//!   by *s + min(ttl, E) − safety_margin*, before its document may go.
//! - on `acq`, `wt`, `yu` or a path inside the payload (`data.…`): dates that
//!   no renewal moves. Always refused.
//! - on `exp`: deletion at *exp + E* is never before the lease ended.
//!   Accepted; one that covers every document is replaced by one that
//!   spares other applications' locks ("Garbage collection" in `store`).

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::{Document, doc};
use mongodb::options::IndexOptions;

use super::handle::{MongoStore, command_code, server_error};
use super::rules::our_layout;
use crate::config::{DELETE_MIN_TOKEN_AGE, Timing};
use crate::error::{Error, Result, is_transient_db_error, unreachable_from};
use crate::foreign::ForeignRules;
use crate::store::field;

/// Name of the TTL index that garbage-collects lock documents.
pub(crate) const GC_INDEX_NAME: &str = "mongo_lease_gc";
/// Name of the index that serves a release by owner id (an operator's).
pub(crate) const OWNER_INDEX_NAME: &str = "mongo_lease_owner";

/// What [`MongoStore::prepare`] found in the collection that the manager must
/// respect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CollectionFacts {
    /// The shortest `expireAfterSeconds` of the accepted TTL indexes on `ts`:
    /// MongoDB may delete a lease that long after its last renewal, so local
    /// deadlines use `min(lease TTL, it)` (see the module docs). Kept also
    /// when it is not shorter than the manager's TTL: a lease acquired with
    /// a longer TTL of its own (`Acquire::ttl`) is capped by it.
    pub ttl_cap: Option<Duration>,
    /// The collection is shared with other applications' lock clients: it
    /// holds a foreign holder's lock a rule describes (`crate::foreign`), or has a TTL index on `ts` (the insert pattern's)
    /// or on `ExpireAt` (the `$setOnInsert` pattern's).
    pub shared: bool,
}

impl MongoStore {
    /// Checks that the deployment answers and the collection is usable, and
    /// creates the indexes the protocol needs (idempotent).
    ///
    /// # Errors
    /// [`Error::Unreachable`] if no server answers within the operation timeout,
    /// [`Error::Unsupported`] for a server older than MongoDB 5.0,
    /// [`Error::UnusableCollection`] for a capped collection, a non-TTL index on
    /// `exp`, a TTL index that could delete a live lease, or (when the TTL
    /// index must be created) a document that is not a lock document;
    /// [`Error::Database`] for anything else the server refuses. Nothing is
    /// created unless every check passed.
    pub(crate) async fn prepare(
        &self,
        gc_grace: Duration,
        timing: &Timing,
    ) -> Result<CollectionFacts> {
        let waited = self.operation_timeout;
        let unreachable = |e: Error| match e {
            Error::Database(db) if is_transient_db_error(&db) => unreachable_from(waited, db),
            other => other,
        };
        let db = self.coll().namespace().db;
        let name = self.coll().name().to_string();
        let database = self.coll().client().database(&db);
        let build = self
            .bounded(database.run_command(doc! { "buildInfo": 1 }))
            .await
            .map_err(unreachable)?;
        check_server_version(&build)?;
        self.check_foreign_rule().await.map_err(unreachable)?;

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
        let mut facts = CollectionFacts::default();
        for index in &existing {
            if let Some(cap) = check_ttl_index(index, timing, &format!("{db}.{name}"))? {
                facts.ttl_cap = Some(facts.ttl_cap.map_or(cap, |c| c.min(cap)));
            }
        }
        let on_exp: Vec<&IndexModel> = existing
            .iter()
            .filter(|index| index.keys == doc! { field::EXPIRES_AT: 1 })
            .collect();
        if on_exp.iter().any(|index| expire_after(index).is_none()) {
            return Err(Error::UnusableCollection {
                reason: format!(
                    "{db}.{name} has an index on `exp` that is not a TTL index \
                     (expireAfterSeconds); drop it or use another collection"
                ),
            });
        }
        let (spares, deletes_all): (Vec<&IndexModel>, Vec<&IndexModel>) =
            on_exp.into_iter().partition(|index| is_gc_index(index));
        if let Some(index) = spares.first() {
            let ttl = expire_after(index);
            if ttl != Some(gc_grace) {
                tracing::debug!(existing = ?ttl, wanted = ?gc_grace, "keeping the existing TTL index on `exp`");
            }
        } else {
            if deletes_all.is_empty() && !collections.is_empty() {
                self.refuse_other_documents().await.map_err(unreachable)?;
            }
            // A TTL index on `exp` for every document (an earlier release's,
            // or the user's) would delete another application's lock that
            // took a lease document of ours over in place: replaced by one
            // that spares them, keeping its grace ("Garbage collection").
            let grace = deletes_all
                .iter()
                .find_map(|index| expire_after(index))
                .unwrap_or(gc_grace);
            for index in &deletes_all {
                self.replace_gc_index(index).await.map_err(unreachable)?;
            }
            let model = IndexModel::builder()
                .keys(doc! { field::EXPIRES_AT: 1 })
                .options(
                    IndexOptions::builder()
                        .name(GC_INDEX_NAME.to_string())
                        .expire_after(grace.max(DELETE_MIN_TOKEN_AGE))
                        .partial_filter_expression(crate::store::gc_filter())
                        .build(),
                )
                .build();
            if !self.create_index(model).await.map_err(unreachable)? {
                self.require_gc_index().await.map_err(unreachable)?;
            }
        }
        facts.shared = facts.ttl_cap.is_some()
            || existing
                .iter()
                .any(|index| index.keys == doc! { "ExpireAt": 1 } && expire_after(index).is_some());
        if !facts.shared && !collections.is_empty() {
            facts.shared = self.holds_a_foreign_lock().await.map_err(unreachable)?;
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
        Ok(facts)
    }

    /// Checks each expression of the user's foreign lock rule against the
    /// server, in an aggregation that reads nothing and writes nothing: an
    /// expression the server cannot parse is [`Error::InvalidConfig`] naming
    /// its field (`foreign_lock.held: Unrecognized expression '$foo'`).
    async fn check_foreign_rule(&self) -> Result<()> {
        let Some(rule) = self.foreign().custom.as_ref() else {
            return Ok(());
        };
        for (name, expression) in rule.expressions() {
            let pipeline = [
                doc! { "$match": { field::ID: { "$exists": false } } },
                doc! { "$set": { "x": expression.clone() } },
            ];
            let checked = self
                .bounded(async {
                    self.coll()
                        .aggregate(pipeline)
                        .await?
                        .try_collect::<Vec<_>>()
                        .await
                })
                .await;
            match checked {
                Err(Error::Database(e)) if !is_transient_db_error(&e) => {
                    // The server's own words, without its stage's prefix
                    // (`Invalid $set :: caused by :: `).
                    let message = server_error(&e).map_or_else(
                        || e.to_string(),
                        |(_, m)| {
                            m.rsplit(" :: caused by :: ")
                                .next()
                                .unwrap_or(m)
                                .to_string()
                        },
                    );
                    return Err(Error::InvalidConfig {
                        reason: format!("foreign_lock.{name}: {message}"),
                    });
                }
                other => other.map(drop)?,
            }
        }
        Ok(())
    }

    /// Whether the collection holds a foreign holder's lock a rule describes
    /// (one indexed-less read, which may scan the collection once).
    async fn holds_a_foreign_lock(&self) -> Result<bool> {
        let filter = doc! { "$expr": self.foreign().described_expr(our_layout()) };
        let found = self
            .bounded(
                self.coll()
                    .find_one(filter)
                    .projection(doc! { field::ID: 1 }),
            )
            .await?;
        Ok(found.is_some())
    }

    /// Refuses the collection if it holds a document that is not a lock
    /// document (see "Documents other than lock documents" in the module docs).
    async fn refuse_other_documents(&self) -> Result<()> {
        let found = self
            .bounded(
                self.coll()
                    .find_one(not_a_lock_document(self.foreign()))
                    .projection(doc! { field::ID: 1 }),
            )
            .await?;
        let Some(document) = found else {
            return Ok(());
        };
        let id = document
            .get(field::ID)
            .map_or_else(|| "(none)".to_string(), |id| id.to_string());
        Err(Error::UnusableCollection {
            reason: format!(
                "{} is expected to be a lock collection (documents {{_id, aid, ts, ...}}, or \
                 another application's locks: {{_id, ts, aid}}, {{_id, value, ttl, \
                 obtained_at}}, {{_id, ExpireAt}}, {{_id}}, or a document the foreign_lock rule \
                 describes), but it holds a document that is not a lock document (_id: {id}); the TTL \
                 index on `exp` would delete such documents when they carry an `exp` date. \
                 Nothing was created: point the manager at a collection of its own (e.g. \
                 \"<name>.lock\")",
                self.coll().namespace()
            ),
        })
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

    /// After a conflict creating the TTL index: there must now be the TTL
    /// index on `exp` that spares other applications' locks (another
    /// manager's), not just an index that took its name.
    async fn require_gc_index(&self) -> Result<()> {
        let indexes: Vec<IndexModel> = self
            .bounded(async { self.coll().list_indexes().await?.try_collect().await })
            .await?;
        if indexes.iter().any(is_gc_index) {
            return Ok(());
        }
        let ns = self.coll().namespace();
        Err(Error::UnusableCollection {
            reason: format!(
                "{ns} has an index named {GC_INDEX_NAME:?} that is not the TTL index on `exp` \
                 sparing other applications' locks (partialFilterExpression {}); lock \
                 documents would never be deleted, or another application's would. Drop it \
                 or use another collection",
                crate::store::gc_filter()
            ),
        })
    }

    /// Drops `index`, a TTL index on `exp` that covers every document, before
    /// the one that spares other applications' locks replaces it. Logged at
    /// `info`; refused by the server (a user without `dropIndex`), it is
    /// reported as an unusable collection, nothing else changed.
    async fn replace_gc_index(&self, index: &IndexModel) -> Result<()> {
        let Some(name) = index.options.as_ref().and_then(|o| o.name.clone()) else {
            return Ok(());
        };
        tracing::info!(
            index = name,
            "replacing the TTL index on `exp` by one that spares other applications' locks"
        );
        match self.bounded(self.coll().drop_index(name.as_str())).await {
            Ok(()) => Ok(()),
            // Dropped meanwhile by another manager doing the same.
            Err(Error::Database(e)) if command_code(&e) == Some(27) => Ok(()),
            Err(Error::Database(e)) if !is_transient_db_error(&e) => {
                Err(Error::UnusableCollection {
                    reason: format!(
                        "{} has a TTL index on `exp` ({name:?}) that would delete another \
                         application's lock taken over from a lease of ours, and dropping it \
                         to put one that spares them in its place was refused: {e}. Drop it \
                         (the next connect creates the right one) or use another collection",
                        self.coll().namespace()
                    ),
                })
            }
            Err(e) => Err(e),
        }
    }
}

/// The filter of a document that is neither of this crate's layout (`tok`
/// int64 and `exp` date) nor a foreign holder's lock a rule of `rules`
/// describes (`crate::foreign`: `{_id, ts, aid}`, `{_id, value, ttl,
/// obtained_at}`, `{_id, ExpireAt}`, a bare `{_id}`, the user's rule).
fn not_a_lock_document(rules: &ForeignRules) -> Document {
    doc! { "$nor": [
        { field::TOKEN: { "$type": "long" }, field::EXPIRES_AT: { "$type": "date" } },
        { "$expr": rules.described_expr(our_layout()) },
    ] }
}

/// The oldest MongoDB release the manager's writes run on: they use `let`
/// variables and `$unsetField`, both from 5.0.
const MIN_SERVER_MAJOR: i64 = 5;

/// Refuses a server older than [`MIN_SERVER_MAJOR`], from its `buildInfo`
/// reply `build` (its `versionArray`); a reply without one is accepted.
///
/// # Errors
///
/// [`Error::Unsupported`] naming the server's version.
fn check_server_version(build: &Document) -> Result<()> {
    let major = build
        .get_array("versionArray")
        .ok()
        .and_then(|v| v.first())
        .and_then(|m| m.as_i64().or_else(|| m.as_i32().map(i64::from)));
    match major {
        Some(major) if major < MIN_SERVER_MAJOR => Err(Error::Unsupported {
            reason: format!(
                "MongoDB {} is too old: the manager's writes need MongoDB \
                 {MIN_SERVER_MAJOR}.0 or later (`let` variables, `$unsetField`)",
                build.get_str("version").unwrap_or("of this major version")
            ),
        }),
        _ => Ok(()),
    }
}

/// An index's `expireAfterSeconds`: `Some` for a TTL index.
fn expire_after(index: &IndexModel) -> Option<Duration> {
    index.options.as_ref().and_then(|o| o.expire_after)
}

/// Whether `index` is the garbage-collection index: a TTL index on `exp`
/// that spares other applications' locks (`store::gc_filter`).
fn is_gc_index(index: &IndexModel) -> bool {
    let partial = index
        .options
        .as_ref()
        .and_then(|o| o.partial_filter_expression.as_ref());
    index.keys == doc! { field::EXPIRES_AT: 1 }
        && expire_after(index).is_some()
        && partial == Some(&crate::store::gc_filter())
}

/// Checks one index of the collection against the lock documents (see "TTL
/// indexes of other applications" in the module docs). `Ok(Some(e))` for an
/// accepted TTL index on `ts`: local deadlines must not pass `e` after a
/// renewal, whatever the lease's TTL.
fn check_ttl_index(index: &IndexModel, timing: &Timing, ns: &str) -> Result<Option<Duration>> {
    let Some(expire_after) = expire_after(index) else {
        return Ok(None);
    };
    // A TTL index has a single key (MongoDB ignores or refuses the option on
    // compound indexes).
    let Some(path) = index.keys.keys().next().filter(|_| index.keys.len() == 1) else {
        return Ok(None);
    };
    let name = index
        .options
        .as_ref()
        .and_then(|o| o.name.clone())
        .unwrap_or_default();
    let described = format!(
        "{ns} has a TTL index {name:?} on {} with expireAfterSeconds {}",
        index.keys,
        expire_after.as_secs_f64()
    );
    let refuse = |why: String| {
        Err(Error::UnusableCollection {
            reason: format!(
                "{described}: {why}. Nothing was created; drop the index or use another collection"
            ),
        })
    };
    match path.as_str() {
        field::RENEWED_AT => {
            let needed = timing.heartbeat_interval + timing.unsafe_time();
            if expire_after <= needed {
                return refuse(format!(
                    "MongoDB may delete a lease {:?} after its last renewal, which is not \
                     longer than heartbeat_interval + safety_margin + clock_skew ({needed:?}): live leases \
                     would be deleted between renewals",
                    expire_after
                ));
            }
            // Returned even when not shorter than the manager's TTL: a lease's
            // own TTL (`Acquire::ttl`) may be longer.
            Ok(Some(expire_after))
        }
        field::ACQUIRED_AT | field::WAITING_SINCE | field::YIELD_UNTIL => refuse(format!(
            "`{path}` is a date no renewal moves, so MongoDB would delete a lease {:?} after \
             it, however often it is renewed",
            expire_after
        )),
        p if p.starts_with(&format!("{}.", field::PAYLOAD)) => refuse(format!(
            "`{path}` is inside the lease payload, which no renewal moves: a date there would \
             get a held lease deleted"
        )),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests;
