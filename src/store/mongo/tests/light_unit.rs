use super::*;

#[test]
fn the_light_acquire_is_one_small_stage() {
    let update = light_acquire_update("a");
    assert_eq!(update.len(), 1, "one stage, restating in its acquisition");
    let branches = update[0]
        .get_document("$replaceWith")
        .unwrap()
        .get_array("$cond")
        .unwrap();
    let acquired = branches[1].as_document().unwrap();
    assert_eq!(acquired.get("obtained_at"), Some(&Bson::from("$$NOW")));
    assert_eq!(
        acquired.get("ttl"),
        Some(&Bson::from(restated_seconds(
            doc! { "$add": ["$$NOW", "$$ttl"] },
            "$$NOW",
            super::super::rules::next_token(),
        )))
    );
    let general =
        super::super::acquire::acquire_pipeline("a", 1000, Uuid::new_v4(), true, None, 1000, None);
    assert_eq!(
        general.last(),
        Some(&restated()),
        "the general form restates last"
    );
    let encoded = |stages: &[Document]| mongodb::bson::to_vec(&doc! { "u": stages }).unwrap().len();
    let size = encoded(&update);
    let general = encoded(&general[..general.len() - 1]);
    assert!(size * 3 < general, "{size} bytes vs {general}");
}

#[test]
fn a_reply_is_an_acquisition_only_under_our_lease_id_and_owner_id() {
    let id = Uuid::new_v4();
    let now = mongodb::bson::DateTime::now();
    let ours = doc! {
        field::OWNER: "a", field::LEASE_ID: bson_lease_id(id), field::TOKEN: 9_i64,
        field::RENEWED_AT: now, "now": now,
    };
    assert_eq!(acquired_token(&ours, "a", id), Some(9));
    assert_eq!(acquired_token(&ours, "b", id), None);
    assert_eq!(acquired_token(&ours, "a", Uuid::new_v4()), None);
    let mut earlier = ours.clone();
    earlier.insert(
        field::RENEWED_AT,
        mongodb::bson::DateTime::from_millis(now.timestamp_millis() - 1),
    );
    assert_eq!(
        acquired_token(&earlier, "a", id),
        None,
        "an earlier attempt's"
    );
    let held = doc! { field::OWNER: "b", field::TOKEN: 9_i64 };
    assert_eq!(acquired_token(&held, "a", id), None);
}

#[test]
fn the_light_handoff_applies_only_without_any_sign_of_another_waiter() {
    let update = light_handoff_update("a");
    let stage = update[0].get_document("$replaceWith").unwrap();
    let branches = stage.get_array("$cond").unwrap();
    let applies = branches[0].as_document().unwrap();
    let all = applies.get_array("$and").unwrap();
    for name in [
        field::QUEUE,
        field::WAITING_SINCE,
        field::HOLD_UNTIL,
        field::HOLDERS,
        field::PERMITS,
    ] {
        assert!(all.contains(&Bson::Document(missing(name))), "{name}");
    }
    assert_eq!(branches[2], Bson::from("$$ROOT"), "else unchanged");
}

#[test]
fn the_let_variables_hold_the_lease_ids_as_stored() {
    let (from, to) = (Uuid::new_v4(), Uuid::new_v4());
    let lets = raw_lets(&[(FROM, from), (TO, to)]).to_document().unwrap();
    assert_eq!(
        lets,
        doc! { "from": bson_lease_id(from), "to": bson_lease_id(to) }
    );
    let lets = raw_lets_with_ttl(&[(LID, from)], Duration::from_millis(1500));
    assert_eq!(
        lets.to_document().unwrap(),
        doc! { "lid": bson_lease_id(from), "ttl": 1500_i64 },
        "the TTL in whole milliseconds, an int64 as the general forms write it"
    );
}

#[test]
fn the_light_forms_are_encoded_once_as_their_builders_make_them() {
    let forms = LightForms::new("a");
    let decoded = |stages: &mongodb::bson::RawArrayBuf| -> Vec<Document> {
        stages
            .into_iter()
            .map(|stage| Document::try_from(stage.unwrap().as_document().unwrap()).unwrap())
            .collect()
    };
    assert_eq!(decoded(&forms.acquire), light_acquire_update("a"));
    assert_eq!(
        decoded(forms.release(false)),
        light_release_update("a", false)
    );
    assert_eq!(
        decoded(forms.release(true)),
        light_release_update("a", true)
    );
    assert_eq!(decoded(&forms.handoff), light_handoff_update("a"));
    assert_eq!(forms.projection.to_document().unwrap(), light_projection());
}
