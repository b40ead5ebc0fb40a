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
    /// Sets the payload of `lease`: as an exclusive lease, else as a holder
    /// of a shared or semaphore key (its entry's `data`); `false` if it is
    /// neither (any more).
    pub(super) async fn set_payload_of(&self, lease: LeaseRef, payload: Document) -> Result<bool> {
        let owner = self.owner();
        let writes = [
            (
                payload_filter(owner, &lease),
                payload_update(payload.clone()),
            ),
            (
                holder_payload_filter(owner, &lease),
                holder_payload_update(payload),
            ),
        ];
        for (filter, update) in writes {
            let result = self.bounded(self.coll().update_one(filter, update)).await?;
            if result.matched_count == 1 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
