use mongodb::bson::Bson;

use super::*;

fn place(field: Option<&str>) -> LockPlace {
    LockPlace {
        database: "app".into(),
        collection: "workitem".into(),
        field: field.map(str::to_string),
        lock_id: None,
    }
}

fn check<'a>(place: &'a LockPlace, key: &'a LeaseKey) -> LeaseCheck<'a> {
    LeaseCheck {
        place,
        key,
        lease_id: Uuid::nil(),
        owner: "me",
    }
}

#[test]
fn check_of_the_lock_collection_names_top_level_fields() {
    let place = place(None);
    let key = LeaseKey::from("k");
    let check = check(&place, &key);
    let filter = check_filter(&check);
    assert_eq!(filter.get("_id"), Some(&Bson::from("k")));
    assert_eq!(
        filter.get_array("$or").unwrap()[0],
        Bson::from(doc! { "lid": bson_lease_id(Uuid::nil()), "aid": { "$eq": "me" } }),
        "an exclusive lease, or a holder's entry"
    );
    assert_eq!(
        filter,
        crate::store::mongo::renew::holder_check_filter(&key, "me", Uuid::nil())
    );
    assert_eq!(
        check_update(&check),
        vec![
            doc! { "$set": { "ts": { "$max": ["$$NOW", { "$add": ["$ts", 1_i64] }] } } },
            crate::store::mongo::rules::restated(),
        ],
        "a write that proves the lease, not a renewal; `obtained_at` follows `ts`"
    );
}

#[test]
fn check_of_an_in_document_lease_names_the_lock_field() {
    let place = place(Some("_lease"));
    let key = LeaseKey::from(7_i64);
    let check = check(&place, &key);
    assert_eq!(
        check_filter(&check),
        doc! {
            "_id": 7_i64,
            "_lease.lid": bson_lease_id(Uuid::nil()),
            "_lease.aid": { "$eq": "me" },
            "$expr": { "$gt": ["$_lease.exp", "$$NOW"] },
        }
    );
    assert_eq!(
        check_update(&check),
        vec![
            doc! { "$set": { "_lease.ts": { "$max": ["$$NOW", { "$add": ["$_lease.ts", 1_i64] }] } } }
        ]
    );
}

#[test]
fn attempt_bounds_are_the_documented_ones() {
    // `Lease::with_transaction` documents them.
    assert_eq!((TRANSACTION_ATTEMPTS, COMMIT_ATTEMPTS), (10, 5));
}

#[test]
fn backoff_stays_within_the_drivers_bounds() {
    for attempt in 0..40 {
        let cap = (5.0 * 1.5_f64.powi(attempt as i32)).min(500.0);
        let d = backoff(attempt);
        assert!(d.as_secs_f64() * 1000.0 <= cap + 1e-6, "{attempt}: {d:?}");
    }
}
