//! **Payload**: a holder's payload write, conditional on its lease id and
//! owner id: the top-level `data` of an exclusive lease
//! ([`payload_update`]), a holder's entry of a shared or semaphore key
//! ([`holder_payload_update`]).

use super::handle::MongoStore;
use super::rules::{bson_lease_id, payload_filter};
use crate::error::Result;
use crate::store::{LeaseRef, field};
use mongodb::bson::{Document, doc};
/// The document of `lease` of `owner` as a holder in `hs`: the filter of a
/// holder's payload write, with [`holder_payload_update`].
pub(super) fn holder_payload_filter(owner: &str, lease: &LeaseRef) -> Document {
    doc! {
        field::ID: &lease.key,
        field::HOLDERS: { "$elemMatch": {
            field::LEASE_ID: bson_lease_id(lease.lease_id),
            field::OWNER: { "$eq": owner },
        }},
    }
}

/// Sets the payload of the entry matched by [`holder_payload_filter`].
pub(super) fn holder_payload_update(payload: Document) -> Document {
    doc! { "$set": { format!("{}.$.{}", field::HOLDERS, field::PAYLOAD): payload } }
}

/// Sets the payload; nothing else changes.
pub(super) fn payload_update(payload: Document) -> Document {
    doc! { "$set": { field::PAYLOAD: payload } }
}

impl MongoStore {
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

    pub(super) async fn set_payload_of(&self, lease: LeaseRef, payload: Document) -> Result<bool> {
        let result = self
            .bounded(self.coll().update_one(
                payload_filter(self.owner(), &lease),
                payload_update(payload.clone()),
            ))
            .await?;
        if result.matched_count == 1 {
            return Ok(true);
        }
        // Not an exclusive lease (any more): a holder of a shared or
        // semaphore key, if still one.
        self.set_holder_payload(lease, payload).await
    }
}
