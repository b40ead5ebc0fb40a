//! The operations of [`MongoStore`]: its [`Store`] implementation (acquire,
//! renewal, release, release by owner, inspect and list, force release,
//! payload, change streams), sending what [`pipeline`](super::pipeline)
//! builds and resolving ambiguous outcomes.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use mongodb::bson::{Document, doc};
use mongodb::options::ReturnDocument;
use uuid::Uuid;

use super::handle::{MongoStore, is_duplicate_key, is_on_id_index};
use super::observe::observe;
use super::pipeline::{
    acquire_pipeline, acquire_projection, classify, force_release_filter, info_projection,
    key_filter, lease_filter, list_filter, owner_filter, payload_filter, payload_update,
    projected_info, release_events_pipeline, release_update, renew_update,
};
use crate::error::{Error, Result};
use crate::lease::LeaseInfo;
use crate::store::{AcquireOutcome, LeaseRef, Store, field};

/// How many times a failed idempotent write is tried in all.
const WRITE_ATTEMPTS: u32 = 3;

impl MongoStore {
    async fn read_lease(&self, key: &str) -> Result<Option<Document>> {
        self.bounded(
            self.coll()
                .find_one(key_filter(key))
                .projection(acquire_projection()),
        )
        .await
    }

    async fn acquire_once(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
        ttl_ms: i64,
    ) -> Result<AcquireOutcome> {
        let attempt = self
            .bounded(
                self.coll()
                    .find_one_and_update(
                        key_filter(&key),
                        acquire_pipeline(self.owner(), ttl_ms, lease_id, waiting),
                    )
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .projection(acquire_projection()),
            )
            .await;
        match attempt {
            Ok(Some(doc)) => return classify(&key, self.owner(), lease_id, &doc),
            Ok(None) => {}
            // A duplicate-key error from a concurrent upsert means "held": re-read.
            Err(Error::Database(e)) if is_duplicate_key(&e) && is_on_id_index(&e) => {}
            // On another unique index it would fail the same way every time.
            Err(Error::Database(e)) if is_duplicate_key(&e) => {
                return Err(Error::UnusableCollection {
                    reason: format!(
                        "a unique index other than `_id` refused the lease for {key:?}: {e}"
                    ),
                });
            }
            // Outcome unknown (network, failover, timeout): resolve by re-reading,
            // never by assuming (docs/mongodb-behaviour.md, B7).
            Err(e) if e.is_transient() => {
                tracing::debug!(key, error = %e, "acquire outcome unknown; re-reading");
            }
            Err(e) => return Err(e),
        }
        match self.read_lease(&key).await? {
            Some(doc) => classify(&key, self.owner(), lease_id, &doc),
            // The document vanished between the write and the read: try again.
            None => Err(Error::Unreachable {
                waited: self.operation_timeout(),
                reason: "lock document vanished during acquire".into(),
                source: None,
            }),
        }
    }

    async fn renew_batch(&self, leases: Vec<LeaseRef>, ttl_ms: i64) -> Result<Vec<String>> {
        let filter = lease_filter(&leases);
        let update = renew_update(ttl_ms);
        // updateMany is not a retryable write; it is idempotent, so the actor retries
        // it. Judge by matchedCount: modifiedCount is lower when a renewal lands in
        // the same millisecond as the previous one (docs/mongodb-behaviour.md, B4).
        let result = self
            .bounded(self.coll().update_many(filter.clone(), update))
            .await?;
        if result.matched_count as usize == leases.len() {
            return Ok(Vec::new());
        }
        // Some leases are gone; the result does not say which, so ask.
        let kept: HashSet<String> = self
            .bounded(async {
                self.coll()
                    .find(filter)
                    .projection(doc! { field::ID: 1 })
                    .await?
                    .try_collect::<Vec<Document>>()
                    .await
            })
            .await?
            .into_iter()
            .filter_map(|d| d.get_str(field::ID).ok().map(str::to_string))
            .collect();
        Ok(leases
            .into_iter()
            .filter(|l| !kept.contains(&l.key))
            .map(|l| l.key)
            .collect())
    }

    /// Releases the leases matching `filter` ([`release_update`]); `single` for
    /// one lease, which uses `updateOne` so that the driver's retryable writes
    /// report the original outcome. The write is idempotent, so a transient
    /// failure is also retried here (up to [`WRITE_ATTEMPTS`] in all). After
    /// such a failure an earlier attempt may have applied: a single lease that
    /// the retry no longer finds counts as released by us (the caller only
    /// releases leases whose local deadline has not passed, so nobody else can
    /// have taken it by expiry).
    async fn release_matching(&self, filter: Document, single: bool) -> Result<u64> {
        let mut attempt = 1;
        loop {
            let update = release_update(self.yield_ms());
            let result = if single {
                self.bounded(self.coll().update_one(filter.clone(), update))
                    .await
            } else {
                self.bounded(self.coll().update_many(filter.clone(), update))
                    .await
            };
            match result {
                Ok(result) if single && attempt > 1 => return Ok(result.matched_count.max(1)),
                Ok(result) => return Ok(result.matched_count),
                Err(e) if e.is_transient() && attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "release outcome unknown; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn inspect_key(&self, key: String) -> Result<Option<LeaseInfo>> {
        let found = self
            .bounded(
                self.coll()
                    .find_one(key_filter(&key))
                    .projection(info_projection()),
            )
            .await?;
        match found {
            None => Ok(None),
            Some(doc) => match projected_info(&key, &doc) {
                Some(info) => Ok(Some(info)),
                None => Err(Error::ForeignDocument { key }),
            },
        }
    }

    async fn list_page(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<LeaseInfo>, Option<String>)> {
        let filter = list_filter(after.as_deref());
        let docs: Vec<Document> = self
            .bounded(async {
                self.coll()
                    .find(filter)
                    .sort(doc! { field::ID: 1 })
                    .limit(limit.min(i64::MAX as usize) as i64)
                    .projection(info_projection())
                    .await?
                    .try_collect()
                    .await
            })
            .await?;
        let next = if docs.len() == limit {
            docs.last()
                .and_then(|d| d.get_str(field::ID).ok())
                .map(str::to_string)
        } else {
            None
        };
        let page = docs
            .iter()
            .filter_map(|doc| projected_info(doc.get_str(field::ID).ok()?, doc))
            .collect();
        Ok((page, next))
    }

    /// One `findAndModify` (a retryable write) that releases `key` if a lease
    /// of our shape holds it now, whoever the owner; returns it as it was.
    async fn force_release_key(&self, key: String) -> Result<Option<LeaseInfo>> {
        let before = self
            .bounded(
                self.coll()
                    .find_one_and_update(
                        force_release_filter(&key),
                        release_update(self.yield_ms()),
                    )
                    .return_document(ReturnDocument::Before)
                    .projection(info_projection()),
            )
            .await?;
        Ok(before.and_then(|doc| projected_info(&key, &doc)))
    }

    async fn set_payload_of(&self, lease: LeaseRef, payload: Document) -> Result<bool> {
        let result = self
            .bounded(
                self.coll()
                    .update_one(payload_filter(&lease), payload_update(payload)),
            )
            .await?;
        Ok(result.matched_count == 1)
    }

    /// A change stream of releases and deletes ([`release_events_pipeline`]),
    /// reduced to the key. Opening it is part of the stream's first poll, so
    /// the caller never waits for it.
    fn release_events(&self) -> BoxStream<'static, Result<String>> {
        let store = self.clone();
        futures::stream::once(async move {
            store
                .bounded(store.coll().watch().pipeline(release_events_pipeline()))
                .await
        })
        .map(|opened| match opened {
            Ok(stream) => stream
                .filter_map(|event| async move {
                    match event {
                        Ok(event) => event
                            .document_key
                            .and_then(|k| k.get_str(field::ID).ok().map(str::to_string))
                            .map(Ok),
                        Err(e) => Some(Err(Error::from(e))),
                    }
                })
                .boxed(),
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        })
        .flatten()
        .boxed()
    }
}

impl Store for MongoStore {
    fn watch_releases(&self) -> BoxStream<'static, Result<String>> {
        self.release_events()
    }

    fn acquire_with_ttl(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let store = self.clone();
        async move {
            store
                .acquire_once(key, lease_id, waiting, ttl_ms(ttl))
                .await
        }
        .boxed()
    }

    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<String>>> {
        let store = self.clone();
        async move { store.renew_batch(leases, ttl_ms(ttl)).await }.boxed()
    }

    #[cfg(test)]
    fn default_ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms().max(0) as u64)
    }

    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            if leases.is_empty() {
                return Ok(0);
            }
            store
                .release_matching(lease_filter(&leases), leases.len() == 1)
                .await
        }
        .boxed()
    }

    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            let filter = owner_filter(store.owner(), &except);
            store.release_matching(filter, false).await
        }
        .boxed()
    }

    fn inspect(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.inspect_key(key).await }.boxed()
    }

    fn list(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<String>)>> {
        let store = self.clone();
        async move { store.list_page(after, limit).await }.boxed()
    }

    fn force_release(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.force_release_key(key).await }.boxed()
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        let store = self.clone();
        async move { store.set_payload_of(lease, payload).await }.boxed()
    }

    fn observe(&self, key: String) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        observe(self.clone(), key)
    }
}

/// A TTL in milliseconds, as the pipelines add it to `$$NOW` (TTLs are
/// validated far below `i64::MAX` ms).
fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}
