//! What the store contract's scenarios and the unit tests call on a
//! [`Store`]: its requests spelled out.

use std::time::Duration;

use futures::future::BoxFuture;
use mongodb::bson::Document;
use uuid::Uuid;

use super::Store;
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::LeaseShape;
use crate::store::{
    AcquireOutcome, AcquireRequest, Handoff, HandoffOutcome, LeaseRef, OverrideEnd, Release,
    Released,
};

/// The acquire forms the store contract's scenarios and the unit tests
/// call: [`Store::acquire`] with its request spelled out.
pub(crate) trait StoreExt: Store {
    /// The manager's TTL, which the store contract's acquires and renewals
    /// use ([`StoreProfile::ttl`](crate::store::StoreProfile::ttl)).
    fn default_ttl(&self) -> Duration {
        self.profile().ttl
    }

    /// [`Store::renew_with_ttl`] with the store's default TTL (the
    /// manager's), returning the keys of the leases no longer held; for the
    /// store contract's scenarios.
    fn renew(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<Vec<LeaseKey>>> {
        let renew = self.renew_with_ttl(leases, self.default_ttl());
        Box::pin(async move { Ok(renew.await?.into_iter().map(|l| l.key).collect()) })
    }

    /// [`Release::Leases`]: how many were still held.
    fn release_by_id(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        count(self.release(Release::Leases(leases)))
    }

    /// [`Release::LeaseTooYoungToDelete`]: 1 if it was still held.
    fn release_too_young_to_delete(&self, lease: LeaseRef) -> BoxFuture<'static, Result<u64>> {
        count(self.release(Release::LeaseTooYoungToDelete(lease)))
    }

    /// [`Release::ReleasedDocuments`]: how many documents were deleted.
    fn delete_released(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        count(self.release(Release::ReleasedDocuments(keys)))
    }

    /// [`Release::OwnerLeases`], then, as its caller does, the follow-up
    /// delete [`DELETE_DELAY`](crate::store::DELETE_DELAY) later if it is
    /// due: how many lease documents were released.
    fn release_owner(&self, owner: String, end: OverrideEnd) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            let release = Release::OwnerLeases {
                owner: owner.clone(),
                end,
            };
            let released = self.release(release).await?;
            if released.follow_up_due {
                tokio::time::sleep(crate::store::DELETE_DELAY).await;
                self.release(Release::ReleasedDocumentsOf(owner)).await?;
            }
            Ok(released.count)
        })
    }

    /// [`Release::ForcedKey`]: the lease as it was, if it was held.
    fn force_release(
        &self,
        key: LeaseKey,
        end: OverrideEnd,
    ) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let release = self.release(Release::ForcedKey { key, end });
        Box::pin(async move { Ok(release.await?.was) })
    }

    /// [`Store::handoff`] as the actor sends it: the light form first if
    /// `light` and the store has it, then, if it did not apply, the
    /// general form.
    fn handoff_to(
        &self,
        key: LeaseKey,
        (from, to): (Uuid, Uuid),
        ttl: Duration,
        light: bool,
    ) -> BoxFuture<'_, Result<HandoffOutcome>> {
        Box::pin(async move {
            let light = light && self.profile().light_forms.handoff;
            let handoff = Handoff {
                key,
                from,
                to,
                ttl,
                light,
            };
            match self.handoff(handoff.clone()).await? {
                HandoffOutcome::NotApplied => {
                    self.handoff(Handoff {
                        light: false,
                        ..handoff
                    })
                    .await
                }
                outcome => Ok(outcome),
            }
        })
    }

    /// An exclusive acquire with the store's default TTL (the manager's).
    fn attempt(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        self.acquire_with_ttl(key, lease_id, waiting, self.default_ttl())
    }

    /// An exclusive acquire expiring `ttl` after the server's now.
    fn acquire_with_ttl(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        self.acquire_shaped(key, lease_id, waiting, ttl, LeaseShape::default())
    }

    /// An acquire of any kind and minimum hold.
    fn acquire_shaped(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
        shape: LeaseShape,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let request = AcquireRequest {
            key,
            lease_id,
            waiting,
            ttl,
            shape,
            create: None,
            payload: None,
        };
        let acquire = self.acquire(request);
        Box::pin(async move { acquire.await.map(|(outcome, _)| outcome) })
    }

    /// An exclusive acquire creating a missing user document with `create`.
    fn acquire_document(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
        create: Option<Document>,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>> {
        let shape = LeaseShape::default();
        self.acquire(AcquireRequest {
            key,
            lease_id,
            waiting,
            ttl,
            shape,
            create,
            payload: None,
        })
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// The count of a release's answer.
fn count(release: BoxFuture<'static, Result<Released>>) -> BoxFuture<'static, Result<u64>> {
    Box::pin(async move { Ok(release.await?.count) })
}
