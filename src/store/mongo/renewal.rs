//! The renewal of a batch of plain exclusive leases, the heartbeat's one
//! `updateMany` for up to `renewal_batch_size` leases, sent as a plain
//! command (`plain`): its filter names every key and lease id of the batch, and
//! built as a [`Document`] (a `Bson` value and a copy of each key) it took
//! several times its encoded size, twice per batch in flight, which the
//! allocator then kept (the RSS per held lease of `benches/memory.rs`).
//! Encoded directly, it is one buffer of its encoded size. The filter and
//! update are those of [`exclusive_filter`](super::kinds::exclusive_filter)
//! and [`renew_exclusive_update`](super::kinds::renew_exclusive_update).

use mongodb::bson::{Bson, RawArrayBuf, RawBson, RawDocumentBuf, rawdoc};

use super::handle::MongoStore;
use super::kinds::renew_exclusive_update;
use super::plain::{update_command, update_counts};
use crate::error::{Error, Result};
use crate::store::{LeaseRef, field};

/// [`exclusive_filter`](super::kinds::exclusive_filter) of `owner` and
/// `leases`, encoded without building its `Document`.
///
/// # Errors
///
/// [`Error::InvalidKey`] if a key cannot be encoded (it was encoded when
/// acquired, so in practice never).
pub(super) fn raw_exclusive_filter(owner: &str, leases: &[LeaseRef]) -> Result<RawDocumentBuf> {
    let mut keys = RawArrayBuf::new();
    let mut ids = RawArrayBuf::new();
    for lease in leases {
        match lease.key.as_bson() {
            Bson::String(key) => keys.push(key.as_str()),
            other => {
                keys.push(
                    RawBson::try_from(other.clone()).map_err(|e| Error::InvalidKey {
                        reason: format!("cannot be encoded as BSON: {e}"),
                    })?,
                )
            }
        }
        ids.push(RawBson::Binary(mongodb::bson::Binary {
            subtype: mongodb::bson::spec::BinarySubtype::Uuid,
            bytes: lease.lease_id.as_bytes().to_vec(),
        }));
    }
    let mut filter = RawDocumentBuf::new();
    filter.append(field::ID, rawdoc! { "$in": keys });
    filter.append(field::LEASE_ID, rawdoc! { "$in": ids });
    filter.append(field::OWNER, rawdoc! { "$eq": owner });
    Ok(filter)
}

impl MongoStore {
    /// The renewal of the plain exclusive `leases` by TTL `ttl_ms`, one
    /// `update` command with `multi` (an `updateMany`, not a retryable
    /// write either way): the count of documents matched. `None` if the
    /// server reported write errors: the caller then sends the same
    /// renewal through the driver's `updateMany` (idempotent), which
    /// reports them as it always did.
    ///
    /// # Errors
    ///
    /// As the command's; a write concern error is [`Error::Unreachable`],
    /// an unknown outcome (the renewal may have applied).
    pub(super) async fn renew_exclusive_raw(
        &self,
        leases: &[LeaseRef],
        ttl_ms: i64,
    ) -> Result<Option<u64>> {
        let mut update = RawArrayBuf::new();
        for stage in renew_exclusive_update(ttl_ms) {
            update.push(RawDocumentBuf::from_document(&stage).map_err(|e| {
                Error::InvalidConfig {
                    reason: format!("the renewal cannot be encoded: {e}"),
                }
            })?);
        }
        let filter = raw_exclusive_filter(self.owner(), leases)?;
        let command = update_command(self.coll().name(), filter, update, true);
        let reply = self.plain_command(command).await?;
        Ok(update_counts(&reply).map(|(matched, _)| matched))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mongodb::bson::{Document, doc};
    use uuid::Uuid;

    use super::*;
    use crate::store::mongo::kinds::exclusive_filter;

    #[test]
    fn the_raw_filter_is_the_exclusive_filter() {
        let leases: Vec<LeaseRef> = [
            Bson::from("k-1"),
            Bson::from(7_i32),
            Bson::from(doc! { "a": 1 }),
            Bson::from("k-2"),
        ]
        .into_iter()
        .map(|key| LeaseRef {
            key: key.into(),
            lease_id: Uuid::new_v4(),
        })
        .collect();
        let raw = raw_exclusive_filter("me", &leases).unwrap();
        assert_eq!(raw.to_document().unwrap(), exclusive_filter("me", &leases));
    }

    #[tokio::test]
    async fn the_encoded_renewal_renews_and_tells_lost_leases_and_the_servers_refusal() {
        let db = super::super::handle::shared_test_db().await;
        let (name, store) =
            super::super::handle::test_store(&db, "renewal", Duration::from_secs(60));
        let mut leases = Vec::new();
        for key in ["k1", "k2", "k3"] {
            let lease = LeaseRef {
                key: key.into(),
                lease_id: Uuid::new_v4(),
            };
            let token = store
                .acquire_light(&lease.key, lease.lease_id, 60_000)
                .await
                .unwrap();
            assert!(token.is_some(), "{key} acquired");
            leases.push(lease);
        }
        let coll = db.collection::<Document>(&name);
        let ts = |doc: Option<Document>| *doc.unwrap().get_datetime(field::RENEWED_AT).unwrap();
        let before = ts(coll.find_one(doc! { "_id": "k1" }).await.unwrap());
        // `$$NOW` has millisecond resolution: let it move past the acquisition.
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(
            store
                .renew_batch(leases.clone(), 60_000)
                .await
                .unwrap()
                .is_empty()
        );
        let after = ts(coll.find_one(doc! { "_id": "k1" }).await.unwrap());
        assert!(after > before, "renewed: ts {before} -> {after}");

        // A lease whose document is gone is reported lost, the others not.
        coll.delete_one(doc! { "_id": "k2" }).await.unwrap();
        let lost = store.renew_batch(leases.clone(), 60_000).await.unwrap();
        assert_eq!(lost, vec![leases[1].clone()]);

        // A validator that refuses every later renewal: the server's write
        // error, as the driver reports it (DocumentValidationFailure).
        let now = mongodb::bson::DateTime::now();
        db.run_command(doc! {
            "collMod": &name,
            "validator": { "$expr": { "$lt": [format!("${}", field::RENEWED_AT), now] } },
            "validationLevel": "strict",
            "validationAction": "error",
        })
        .await
        .unwrap();
        match store.renew_batch(leases.clone(), 60_000).await {
            Err(Error::Database(e)) => {
                assert_eq!(super::super::handle::command_code(&e), Some(121), "{e}")
            }
            other => panic!("expected the validator's refusal, got {other:?}"),
        }
        coll.drop().await.unwrap();
    }
}
