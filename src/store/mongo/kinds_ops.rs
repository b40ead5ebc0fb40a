//! The operations of [`MongoStore`] that only leases of another kind than a
//! plain exclusive one need: the acquisition of any shape and a holder's
//! payload, sending what [`kinds`](super::kinds) builds.

use uuid::Uuid;

use super::handle::MongoStore;
use super::kinds::{
    holder_payload_filter, holder_payload_update, multi_acquire_pipeline, multi_acquire_projection,
};
use super::ops::ttl_ms;
use crate::LeaseKind;
use crate::error::Result;
use crate::key::LeaseKey;
use crate::kind::LeaseShape;
use crate::store::replies::classify_multi;
use crate::store::{AcquireOutcome, LeaseRef};

impl MongoStore {
    /// An acquisition of `shape`: exclusive (held at least its
    /// `hold_at_least`, if any) through the exclusive pipeline; a shared
    /// lease or a permit through [`multi_acquire_pipeline`]. One round trip.
    pub(super) async fn acquire_shape(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl_ms: i64,
        shape: LeaseShape,
    ) -> Result<AcquireOutcome> {
        shape.kind.validate()?;
        let kind = shape.kind;
        if kind == LeaseKind::Exclusive {
            let hold_ms = shape.hold_at_least.map(self::ttl_ms);
            return self
                .acquire_once(key, lease_id, waiting, ttl_ms, hold_ms)
                .await;
        }
        if shape.hold_at_least.is_some() {
            return Err(crate::Error::InvalidConfig {
                reason: format!(
                    "hold_at_least applies to exclusive leases only, not to a {kind} lease"
                ),
            });
        }
        let update = multi_acquire_pipeline(self.owner(), ttl_ms, lease_id, kind, waiting);
        let projection = multi_acquire_projection(self.owner(), lease_id);
        self.acquire_by(key, update, projection, |key, doc| {
            classify_multi(key, kind, doc)
        })
        .await
    }

    /// Sets the payload of `lease` as a holder of a shared or semaphore key
    /// (its entry's `data`); `false` if it is not one (any more).
    pub(super) async fn set_holder_payload(
        &self,
        lease: LeaseRef,
        payload: mongodb::bson::Document,
    ) -> Result<bool> {
        let result = self
            .bounded(self.coll().update_one(
                holder_payload_filter(self.owner(), &lease),
                holder_payload_update(payload),
            ))
            .await?;
        Ok(result.matched_count == 1)
    }
}
