use super::*;

#[test]
fn the_filter_names_the_live_lease_of_our_layout() {
    let from = Uuid::new_v4();
    let filter = handoff_filter(&"k".into(), "a", from);
    assert_eq!(filter.get_str(field::ID).unwrap(), "k");
    assert_eq!(read_lease_id(filter.get(field::LEASE_ID)), Some(from));
    assert_eq!(
        filter.get_document(field::OWNER).unwrap(),
        &doc! { "$eq": "a" }
    );
    assert_eq!(
        filter.get_document("$expr").unwrap(),
        &doc! { "$gt": ["$exp", "$$NOW"] }
    );
}

#[test]
fn the_update_is_one_set_stage_between_the_queues_pick_and_handoff_and_removes_the_waiting_mark() {
    let update = handoff_update(Uuid::new_v4(), 1000, 500);
    assert_eq!(
        update.len(),
        5,
        "pick, the handoff or release, the queue's handoff, cleanup, restatement"
    );
    assert_eq!(update[0], crate::store::mongo::handoff::pick_stage());
    assert_eq!(update[2..4], crate::store::mongo::handoff::handoff_stages());
    assert_eq!(
        update[4],
        crate::store::mongo::rules::restated(),
        "the handed-over lease's `ts` and `exp` restated last"
    );
    let set = update[1].get_document("$set").unwrap();
    assert_eq!(set.get_str(field::WAITING_SINCE).unwrap(), "$$REMOVE");
    for name in [
        field::LEASE_ID,
        field::TOKEN,
        field::ACQUIRED_AT,
        field::RENEWED_AT,
        field::EXPIRES_AT,
        field::PAYLOAD,
        field::HOLD_UNTIL,
        field::YIELD_UNTIL,
    ] {
        assert!(
            set.get_document(name).unwrap().contains_key("$cond"),
            "{name}"
        );
    }
    assert!(!set.contains_key(field::OWNER), "the owner id is unchanged");
}

#[test]
fn a_reply_under_the_new_lease_id_is_an_acquisition_else_a_release() {
    let to = Uuid::new_v4();
    let acquired = doc! { field::LEASE_ID: bson_lease_id(to), field::TOKEN: 7_i64 };
    assert_eq!(
        classify_handoff(&acquired, to),
        HandoffOutcome::Acquired { token: 7 }
    );
    let released = doc! { field::TOKEN: 7_i64 };
    assert_eq!(classify_handoff(&released, to), HandoffOutcome::Released);
}
