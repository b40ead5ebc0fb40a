//! [`MongoStore`]: the lock protocol on a real MongoDB deployment, one file
//! per lease verb (as the driver's `operation/` files keep a command's
//! build, reply and retryability together); the files, and the
//! [`Store`](super::Store) implementation below: ARCHITECTURE.md,
//! "`src/store/mongo/`".

mod acquire;
mod document;
mod handle;
mod handoff;
mod light_forms;
mod payload;
mod permits;
mod prepare;
mod raw;
mod read;
mod release;
mod renew;
mod revocation;
mod rules;
mod transaction;
mod watch;

#[cfg(test)]
mod tests;

pub(crate) use handle::MongoStore;
pub(crate) use transaction::{LeaseCheck, run_fenced};

use self::handle::ttl_ms;
use self::rules::keys_filter;
use self::watch::observe;
use crate::config::ReleaseMode;
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::{
    AcquireOutcome, AcquireRequest, Announced, Announcement, Handoff, HandoffOutcome, LeaseRef,
    Release, Released, Store, StoreProfile,
};
use crate::store::{
    light_acquire::{LightAcquire, LightAcquired},
    light_release::{LightForms, LightRelease},
};
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mongodb::bson::{Document, doc};
use std::sync::Arc;
use std::time::Duration;

/// The one place each verb is chosen: the actor's request, by kind and by
/// what the actor knows of the key, to the verb's file.
impl Store for MongoStore {
    fn profile(&self) -> StoreProfile {
        StoreProfile {
            place: Arc::new(crate::store::LockPlace {
                database: self.coll().namespace().db,
                collection: self.coll().name().to_string(),
                field: None,
                lock_id: None,
            }),
            light_forms: LightForms {
                acquire: true,
                release: true,
                handoff: true,
            },
            removes_on_release: self.release_mode == ReleaseMode::Delete,
            registration_window: self.registration(),
            queue_bound: crate::store::MAX_QUEUE,
            lock_delay: Duration::from_millis(self.lock_delay_ms as u64),
            lock_id_fields: None,
            #[cfg(test)]
            ttl: Duration::from_millis(self.ttl_ms().max(0) as u64),
        }
    }

    fn acquire_light(&self, requests: Vec<LightAcquire>) -> BoxFuture<'static, Vec<LightAcquired>> {
        let store = self.clone();
        async move { store.light_acquires(requests).await }.boxed()
    }

    fn release_light(
        &self,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    ) -> BoxFuture<'static, Vec<LightRelease>> {
        let store = self.clone();
        async move { store.light_releases(leases, hands_over).await }.boxed()
    }

    fn documents(
        &self,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<crate::lock_id_fields::LockIdFields>>,
    ) -> Result<Arc<dyn Store>> {
        let store = document::DocumentStore::new(self, collection, field, lock_id)?;
        Ok(Arc::new(store))
    }

    fn watch_releases(&self, announced: Announced) -> BoxStream<'static, Result<Announcement>> {
        self.release_events(announced)
    }

    fn acquire(
        &self,
        request: AcquireRequest,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>> {
        let store = self.clone();
        async move { Ok((store.acquire_shape(request).await?, None)) }.boxed()
    }

    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseRef>>> {
        let store = self.clone();
        async move { store.renew_batch(leases, ttl_ms(ttl)).await }.boxed()
    }

    /// Each selection to its form in `release`: the general release (a
    /// lease too young to delete skips delete mode's delete), the follow-up
    /// delete, the release by owner id, the force release.
    fn release(&self, release: Release) -> BoxFuture<'static, Result<Released>> {
        let store = self.clone();
        async move {
            let count = match release {
                Release::Leases(leases) => store.release_leases(leases, true).await?,
                Release::LeaseTooYoungToDelete(lease) => {
                    store.release_leases(vec![lease], false).await?
                }
                Release::ReleasedDocuments(keys) => {
                    if keys.is_empty() || store.release_mode != ReleaseMode::Delete {
                        return Ok(Released::count(0));
                    }
                    store.delete_released_matching(keys_filter(&keys)).await?
                }
                Release::ReleasedDocumentsOf(owner) => {
                    if store.release_mode != ReleaseMode::Delete {
                        return Ok(Released::count(0));
                    }
                    let filter = doc! { crate::store::field::OWNER: owner };
                    store.delete_released_matching(filter).await?
                }
                Release::OwnerLeases { owner, end } => {
                    let (deleted, marked) = store.release_owner_leases(owner, end).await?;
                    return Ok(Released {
                        count: deleted + marked,
                        follow_up_due: store.release_mode == ReleaseMode::Delete && marked > 0,
                        ..Default::default()
                    });
                }
                Release::ForcedKey { key, end } => {
                    let was = store.force_release_key(key, end).await?;
                    return Ok(Released {
                        count: u64::from(was.is_some()),
                        was,
                        ..Default::default()
                    });
                }
            };
            Ok(Released::count(count))
        }
        .boxed()
    }

    /// The form the actor chose: the light handoff, or the general one.
    fn handoff(&self, handoff: Handoff) -> BoxFuture<'static, Result<HandoffOutcome>> {
        let store = self.clone();
        async move {
            match handoff.light {
                true => store.handoff_light_once(&handoff).await,
                false => store.handoff_general(&handoff).await,
            }
        }
        .boxed()
    }

    fn leave_queues(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move { store.leave_queues_of(keys).await }.boxed()
    }

    fn inspect(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.inspect_key(key).await }.boxed()
    }

    fn list(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>> {
        let store = self.clone();
        async move { store.list_page(after, limit).await }.boxed()
    }

    fn set_permits(
        &self,
        key: LeaseKey,
        permits: u32,
    ) -> BoxFuture<'static, Result<crate::kind::PermitsChange>> {
        let store = self.clone();
        async move { store.set_permits_of(key, permits).await }.boxed()
    }

    fn request_release(&self, key: LeaseKey) -> BoxFuture<'static, Result<bool>> {
        let store = self.clone();
        async move { store.request_release_of(key).await }.boxed()
    }

    fn revocations(
        &self,
        keys: Vec<LeaseKey>,
    ) -> BoxFuture<'static, Result<Vec<(LeaseKey, String)>>> {
        let store = self.clone();
        async move { store.revocations_of(keys).await }.boxed()
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        let store = self.clone();
        async move { store.set_payload_of(lease, payload).await }.boxed()
    }

    fn observe(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        observe(self.clone(), key)
    }
}
