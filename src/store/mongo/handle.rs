//! The [`MongoStore`] value: the lock collection's handle (with the concerns
//! the protocol needs), the store's settings, the operation timeout, and how
//! the server's errors are read.
//! It holds nothing that changes: what a command needs beyond its settings
//! (a lease's kind, whether its key was contended) comes with the request.
//! Also here: the `_id` index's name ([`id_index`]), and [`retried`] for
//! this store's writes (`crate::store::retried`).

use super::light_forms::LightForms;
use crate::config::{DELETE_MIN_TOKEN_AGE, ReleaseMode};
use crate::error::{Error, Result};
use crate::foreign::ForeignRules;
use crate::key::LeaseKey;
use crate::store::field;
use mongodb::bson::{Document, doc};
use mongodb::options::{
    CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria, WriteConcern,
};
use mongodb::{Collection, Database};
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;
/// The lock protocol on MongoDB. Cheap to clone (the collection handle is shared).
#[derive(Clone)]
pub(crate) struct MongoStore {
    /// The lock collection's database (in-document leases use its collections).
    pub(super) database: Database,
    coll: Collection<Document>,
    owner: String,
    /// The manager's TTL: the default of the test-only `StoreExt::attempt` and
    /// `StoreExt::renew` (the actor always passes each lease's TTL).
    #[cfg_attr(not(test), allow(dead_code))]
    ttl_ms: i64,
    /// How long a release that another owner waited for keeps this owner
    /// from taking the key back (see "Fairness" in the module docs of `store`).
    pub(super) yield_ms: i64,
    /// The manager's safety margin, part of the registration window (see
    /// "Queue of waiting owners" in the module docs of `store`).
    safety_margin: Duration,
    /// The lock-delay an involuntary end writes (force release, release by
    /// owner id; "Lock-delay" in the module docs of `store`), in ms.
    pub(super) lock_delay_ms: i64,
    /// How long one operation may take before it counts as failed.
    pub(super) operation_timeout: Duration,
    /// Whether releases keep or delete the lock document.
    pub(super) release_mode: ReleaseMode,
    /// The foreign lock layouts of the collection and their expiry rules
    /// (fixed at `connect`).
    foreign: ForeignRules,
    /// The light forms of `owner`, encoded once.
    pub(super) light: Arc<LightForms>,
}

/// The server's error code and message of a command or write error.
pub(super) fn server_error(e: &mongodb::error::Error) -> Option<(i32, &str)> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*e.kind {
        ErrorKind::Command(c) => Some((c.code, &c.message)),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some((w.code, &w.message)),
        _ => None,
    }
}

/// The server's error code of a command or write error.
pub(super) fn command_code(e: &mongodb::error::Error) -> Option<i32> {
    server_error(e).map(|(code, _)| code)
}

/// E11000: a write would duplicate a unique index's key.
pub(super) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    command_code(e) == Some(11000)
}

/// Whether a duplicate-key error is on the `_id` index: two upserts raced to
/// insert the same key, and the other one won (docs/mongodb-behaviour.md, B1).
/// The server names the index in the message: `... index: _id_ dup key: { _id: "k1" }`.
fn is_on_id_index(e: &mongodb::error::Error) -> bool {
    server_error(e).is_some_and(|(_, message)| message.contains("index: _id_ "))
}

/// What the failure `e` of an acquiring upsert of `key` means: `Ok` if the
/// document is to be re-read, or the error to report. A duplicate key on
/// `_id` is a concurrent upsert that won (B1); on another unique index it
/// would fail the same way every time, and is reported as `refused` says.
/// A transient error is an unknown outcome, resolved by re-reading, never
/// by assuming (docs/mongodb-behaviour.md, B7).
pub(super) fn reread_after(
    key: &LeaseKey,
    e: Error,
    refused: impl FnOnce(mongodb::error::Error) -> Error,
) -> Result<()> {
    match e {
        Error::Database(e) if is_duplicate_key(&e) && is_on_id_index(&e) => Ok(()),
        Error::Database(e) if is_duplicate_key(&e) => Err(refused(e)),
        e if e.is_transient() => {
            tracing::debug!(%key, error = %e, "acquire outcome unknown; re-reading");
            Ok(())
        }
        e => Err(e),
    }
}

pub(super) use crate::store::retried::{WRITE_ATTEMPTS, retried};

/// A TTL in milliseconds, as the pipelines add it to `$$NOW` (TTLs are
/// validated far below `i64::MAX` ms).
pub(super) fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}

/// [`DELETE_MIN_TOKEN_AGE`] in milliseconds.
pub(super) fn min_token_age_ms() -> i64 {
    ttl_ms(DELETE_MIN_TOKEN_AGE)
}

/// Majority write and read concern and primary reads, whatever the client's
/// defaults (only majority-acknowledged writes survive a failover:
/// docs/mongodb-behaviour.md, B8).
fn majority() -> CollectionOptions {
    CollectionOptions::builder()
        .write_concern(WriteConcern::majority())
        .read_concern(ReadConcern::majority())
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .build()
}

/// The hint that goes with [`list_min`](super::read::list_min): the `_id` index.
pub(super) fn id_index() -> Document {
    doc! { field::ID: 1 }
}

impl MongoStore {
    /// A store on `database.collection`, with [`majority`] concerns.
    pub(crate) fn new(
        database: &Database,
        collection: &str,
        owner: String,
        ttl: Duration,
        yield_window: Duration,
        operation_timeout: Duration,
    ) -> Self {
        let light = Arc::new(LightForms::new(&owner));
        MongoStore {
            database: database.clone(),
            coll: database.collection_with_options(collection, majority()),
            owner,
            ttl_ms: ttl_ms(ttl),
            yield_ms: ttl_ms(yield_window),
            safety_margin: Duration::ZERO,
            lock_delay_ms: 0,
            operation_timeout,
            release_mode: ReleaseMode::Keep,
            foreign: ForeignRules::default(),
            light,
        }
    }

    /// This store with the foreign lock layouts `rules` (default: the
    /// built-in layouts, `{_id, ts, aid}` never expiring).
    pub(crate) fn with_foreign(mut self, rules: ForeignRules) -> Self {
        self.foreign = rules;
        self
    }

    /// The foreign lock layouts of its collection.
    pub(crate) fn foreign(&self) -> &ForeignRules {
        &self.foreign
    }

    /// The fields the reads of a lock document project for a foreign
    /// holder's lock ([`ForeignRules::projection`]).
    pub(super) fn foreign_projection(&self) -> Document {
        self.foreign.projection(super::rules::our_layout())
    }

    /// `projection` with [`foreign_projection`](Self::foreign_projection)'s fields.
    pub(super) fn with_foreign_fields(&self, mut projection: Document) -> Document {
        projection.extend(self.foreign_projection());
        projection
    }

    /// This store with releases in `mode` (default [`ReleaseMode::Keep`]).
    pub(crate) fn with_release_mode(mut self, mode: ReleaseMode) -> Self {
        self.release_mode = mode;
        self
    }

    /// This store with the manager's safety margin (default zero), which
    /// its registration window includes
    /// ([`registration_window`](crate::store::registration_window)).
    pub(crate) fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// This store with a lock-delay of `delay` (default zero) after the
    /// involuntary ends it writes ("Lock-delay" in `store`).
    pub(crate) fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay_ms = ttl_ms(delay);
        self
    }

    /// The lock collection (majority write and read concern, primary reads).
    pub(super) fn coll(&self) -> &Collection<Document> {
        &self.coll
    }

    /// Another collection of the lock collection's database, with the same
    /// concerns.
    pub(super) fn sibling(&self, collection: &str) -> Collection<Document> {
        self.database
            .collection_with_options(collection, majority())
    }

    /// This manager's owner id (`aid`).
    pub(super) fn owner(&self) -> &str {
        &self.owner
    }

    /// The manager's lease TTL, in milliseconds.
    #[cfg(test)]
    pub(super) fn ttl_ms(&self) -> i64 {
        self.ttl_ms
    }

    /// How long this owner's registration in a key's queue lasts:
    /// [`registration_window`](crate::store::registration_window) of its
    /// `retry_max` (the yield window) and its safety margin.
    pub(super) fn registration(&self) -> Duration {
        let retry_max = Duration::from_millis(self.yield_ms.max(0) as u64);
        crate::store::registration_window(retry_max, self.safety_margin)
    }

    /// [`MongoStore::registration`] in milliseconds.
    pub(super) fn registration_ms(&self) -> i64 {
        ttl_ms(self.registration())
    }

    /// Bounds `op` by the operation timeout; a timeout is reported as
    /// [`Error::Unreachable`], which the callers treat as "outcome unknown".
    pub(super) async fn bounded<T>(
        &self,
        op: impl IntoFuture<Output = mongodb::error::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(result) => result.map_err(Error::from),
            Err(_) => Err(Error::Unreachable {
                waited: self.operation_timeout,
                reason: "operation timed out before the driver reported a cause (it says why \
                         no server can be selected only once the client's \
                         serverSelectionTimeoutMS, 30 s by default, has passed)"
                    .into(),
                source: None,
            }),
        }
    }
}
