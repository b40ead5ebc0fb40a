use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::*;
use crate::error::Error;

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
    let db = super::shared_test_db().await;
    let (name, store) = super::test_store(&db, "renewal", Duration::from_secs(60));
    let mut leases = Vec::new();
    for key in ["k1", "k2", "k3"] {
        let lease = LeaseRef {
            key: key.into(),
            lease_id: Uuid::new_v4(),
            kind: crate::kind::LeaseKind::Exclusive,
        };
        let request = crate::store::light_acquire::LightAcquire {
            key: lease.key.clone(),
            lease_id: lease.lease_id,
            ttl: Duration::from_secs(60),
            started: tokio::time::Instant::now(),
        };
        let answer = store.light_acquires(vec![request]).await.pop();
        assert!(
            matches!(
                answer,
                Some(crate::store::light_acquire::LightAcquired::Acquired(_))
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
