//! The renewal of a batch of plain exclusive leases, the heartbeat's one
//! `updateMany` for up to `renewal_batch_size` leases, sent as a plain
//! command (`plain`). Its filter names every key and lease id of the batch:
//! built as a [`Document`](mongodb::bson::Document) (a `Bson` value and a
//! copy of each key) it took several times its encoded size, and built as
//! nested raw documents it was copied once per level (filter, statement,
//! command, write concern), twice per batch in flight, and the allocator
//! kept part of those copies (the RSS per held lease of
//! `benches/memory.rs`). It is serialized in one pass instead, into the one
//! buffer the driver is handed. The filter and update are those of
//! [`exclusive_filter`](super::kinds::exclusive_filter) and
//! [`renew_exclusive_update`](super::kinds::renew_exclusive_update).

use mongodb::bson::{Document, RawDocumentBuf};
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};

use super::handle::MongoStore;
use super::kinds::renew_exclusive_update;
use super::plain::update_counts;
use crate::error::{Error, Result};
use crate::store::{LeaseRef, field};

/// The `update` command renewing the plain exclusive `leases` of `owner` on
/// `collection` by `update`, with majority write concern, in the order
/// [`update_command`](super::plain::update_command) and
/// [`plain_command`](MongoStore::plain_command) give it.
struct RenewalCommand<'a> {
    collection: &'a str,
    owner: &'a str,
    leases: &'a [LeaseRef],
    update: &'a [Document],
}

impl Serialize for RenewalCommand<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let statement = Statement(self);
        let mut command = serializer.serialize_map(Some(3))?;
        command.serialize_entry("update", self.collection)?;
        command.serialize_entry("updates", &[statement])?;
        command.serialize_entry("writeConcern", &OneField("w", "majority"))?;
        command.end()
    }
}

/// The command's one statement: `{ q: filter, u: update, multi: true }`.
struct Statement<'a, 'b>(&'b RenewalCommand<'a>);

impl Serialize for Statement<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let RenewalCommand {
            owner,
            leases,
            update,
            ..
        } = self.0;
        let mut statement = serializer.serialize_map(Some(3))?;
        statement.serialize_entry("q", &Filter { owner, leases })?;
        statement.serialize_entry("u", update)?;
        statement.serialize_entry("multi", &true)?;
        statement.end()
    }
}

/// [`exclusive_filter`](super::kinds::exclusive_filter) of `owner` and
/// `leases`.
struct Filter<'a> {
    owner: &'a str,
    leases: &'a [LeaseRef],
}

impl Serialize for Filter<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut filter = serializer.serialize_map(Some(3))?;
        filter.serialize_entry(field::ID, &OneField("$in", Keys(self.leases)))?;
        filter.serialize_entry(field::LEASE_ID, &OneField("$in", LeaseIds(self.leases)))?;
        filter.serialize_entry(field::OWNER, &OneField("$eq", self.owner))?;
        filter.end()
    }
}

/// A document of one field, `{ name: value }` (an operator, or the write concern).
struct OneField<T>(&'static str, T);

impl<T: Serialize> Serialize for OneField<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut document = serializer.serialize_map(Some(1))?;
        document.serialize_entry(self.0, &self.1)?;
        document.end()
    }
}

/// The keys of the leases, each as stored (a string key as its text).
struct Keys<'a>(&'a [LeaseRef]);

impl Serialize for Keys<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut keys = serializer.serialize_seq(Some(self.0.len()))?;
        for lease in self.0 {
            match lease.key.as_str() {
                Some(key) => keys.serialize_element(key)?,
                None => keys.serialize_element(&lease.key.to_bson())?,
            }
        }
        keys.end()
    }
}

/// The lease ids of the leases, as BSON UUIDs (binary subtype 4).
struct LeaseIds<'a>(&'a [LeaseRef]);

impl Serialize for LeaseIds<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut ids = serializer.serialize_seq(Some(self.0.len()))?;
        for lease in self.0 {
            ids.serialize_element(&mongodb::bson::Uuid::from_bytes(
                lease.lease_id.into_bytes(),
            ))?;
        }
        ids.end()
    }
}

/// The renewal command of `owner`'s plain exclusive `leases` on
/// `collection` by TTL `ttl_ms`, serialized in one pass.
///
/// # Errors
///
/// [`Error::InvalidKey`] if a key cannot be encoded (it was encoded when
/// acquired, so in practice never).
pub(super) fn renewal_command(
    collection: &str,
    owner: &str,
    leases: &[LeaseRef],
    ttl_ms: i64,
) -> Result<RawDocumentBuf> {
    let update = renew_exclusive_update(ttl_ms);
    let command = RenewalCommand {
        collection,
        owner,
        leases,
        update: &update,
    };
    let invalid = |e: &dyn std::fmt::Display| Error::InvalidKey {
        reason: format!("cannot be encoded as BSON: {e}"),
    };
    let bytes = mongodb::bson::to_vec(&command).map_err(|e| invalid(&e))?;
    RawDocumentBuf::from_bytes(bytes).map_err(|e| invalid(&e))
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
        let command = renewal_command(self.coll().name(), self.owner(), leases, ttl_ms)?;
        let reply = self.send_plain(command).await?;
        Ok(update_counts(&reply).map(|(matched, _)| matched))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mongodb::bson::{Bson, Document, doc};
    use uuid::Uuid;

    use super::*;
    use crate::store::mongo::kinds::exclusive_filter;

    #[test]
    fn the_serialized_renewal_is_the_update_command_of_the_exclusive_filter() {
        let leases: Vec<LeaseRef> = [
            Bson::from("k-1"),
            Bson::from(7_i32),
            Bson::from(7_000_000_000_i64),
            Bson::from(doc! { "a": 1, "b": { "c": "d" } }),
            Bson::ObjectId("5087b72181a445980ae47d13".parse().unwrap()),
            Bson::from(mongodb::bson::Uuid::new()),
            Bson::DateTime(mongodb::bson::DateTime::from_millis(1_704_067_200_000)),
            Bson::Symbol("s".into()),
            Bson::Double(1.5),
            Bson::from("k-2"),
        ]
        .into_iter()
        .map(|key| LeaseRef {
            key: key.into(),
            lease_id: Uuid::new_v4(),
            kind: crate::kind::LeaseKind::Exclusive,
        })
        .collect();
        let command = renewal_command("locks", "me", &leases, 60_000).unwrap();
        let filter = exclusive_filter("me", &leases);
        let expected = doc! {
            "update": "locks",
            "updates": [{ "q": filter, "u": renew_exclusive_update(60_000), "multi": true }],
            "writeConcern": { "w": "majority" },
        };
        assert_eq!(command.to_document().unwrap(), expected);
        // The order of the fields, too (a BSON comparison of `_id`s is by type first).
        assert_eq!(
            command.as_bytes(),
            mongodb::bson::to_vec(&expected).unwrap()
        );
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
                kind: crate::kind::LeaseKind::Exclusive,
            };
            let request = crate::store::light_release::LightAcquire {
                key: lease.key.clone(),
                lease_id: lease.lease_id,
                ttl: Duration::from_secs(60),
            };
            let answer = store.light_acquires(vec![request]).await.pop();
            assert!(
                matches!(
                    answer,
                    Some(crate::store::light_release::LightAcquired::Acquired(_))
                ),
                "{key} acquired: {answer:?}"
            );
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
