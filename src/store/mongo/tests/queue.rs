use mongodb::bson::DateTime;

use std::time::Duration;

use super::*;
use crate::store::AcquireOutcome;
use crate::store::replies::held_for_queue;

fn at(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

#[test]
fn a_free_key_kept_for_the_queue_head_is_held_by_it_until_its_registration_expires() {
    let doc = doc! {
        "now": at(10_000),
        field::QUEUE: [
            { field::OWNER: "dead", field::REGISTRATION_EXPIRES: at(9_000) },
            { field::OWNER: "head", field::REGISTRATION_EXPIRES: at(12_500) },
            { field::OWNER: "me", field::REGISTRATION_EXPIRES: at(13_000) },
        ],
    };
    let free = AcquireOutcome::Held {
        ahead: 0,
        holder: "old".into(),
        remaining: Some(Duration::ZERO),
        token: Some(41),
    };
    assert_eq!(
        held_for_queue(free.clone(), &doc, "me"),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "head".into(),
            remaining: Some(Duration::from_millis(2_500)),
            token: Some(41),
        },
        "the last lease's token is kept"
    );
    // The head itself, and a key still held, are left as they are.
    assert_eq!(held_for_queue(free.clone(), &doc, "head"), free);
    let held = AcquireOutcome::Held {
        ahead: 0,
        holder: "old".into(),
        remaining: Some(Duration::from_millis(700)),
        token: Some(41),
    };
    assert_eq!(held_for_queue(held.clone(), &doc, "me"), held);
}

#[test]
fn a_registration_keeps_the_place_of_the_owners_entry_and_appends_a_new_one() {
    let reg = registered("$me", Bson::Null, 30_000, 3_000, None);
    let text = reg.to_string();
    assert!(text.contains("$literal"), "owner ids are literals: {text}");
    assert!(text.contains("$concatArrays"), "{text}");
    assert!(
        text.contains(&format!("\"{}\": 3000", field::HANDED_TTL)),
        "{text}"
    );
}

#[test]
fn a_release_picks_only_on_an_exclusive_key_without_a_hold_ahead() {
    let text = pick_stage().to_string();
    assert!(
        text.contains(&format!("\"$isArray\": \"${}\"", field::HOLDERS)),
        "{text}"
    );
    assert!(text.contains(&format!("${}", field::HOLD_UNTIL)), "{text}");
    let [handoff, unset] = handoff_stages();
    assert_eq!(unset, doc! { "$unset": [HANDED] });
    assert!(
        handoff
            .get_document("$set")
            .unwrap()
            .contains_key(field::TOKEN)
    );
}
