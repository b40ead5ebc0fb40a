//! Unit tests of the builders of shared and semaphore keys and of minimum holds: the structure of the BSON and the
//! reading of sample documents, without a server.

use mongodb::bson::DateTime;

use super::*;
use crate::kind::LeaseKind;
use std::time::Duration;

use crate::store::AcquireOutcome;
use crate::store::replies::{cap_for_mark, classify, classify_multi};

/// A lease of `kind` taking one permit, without a minimum hold.
fn shape(kind: LeaseKind) -> crate::kind::LeaseShape {
    crate::kind::LeaseShape {
        kind,
        ..Default::default()
    }
}

const LID: Uuid = Uuid::from_u128(0x1234);

fn bson(d: Document) -> Bson {
    Bson::Document(d)
}

/// The value at a dotted path (array indexes as numbers).
fn at<'a>(doc: &'a Document, path: &str) -> &'a Bson {
    let mut parts = path.split('.');
    let mut value = doc.get(parts.next().unwrap()).expect(path);
    for part in parts {
        value = match value {
            Bson::Document(d) => d.get(part),
            Bson::Array(a) => a.get(part.parse::<usize>().expect(path)),
            _ => None,
        }
        .unwrap_or_else(|| panic!("{path} in {doc}"));
    }
    value
}

fn date(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

#[test]
fn a_permit_wins_on_a_new_document_a_retry_or_a_free_place_of_the_same_number() {
    let pipeline = multi_acquire_pipeline(
        "me",
        30_000,
        LID,
        shape(LeaseKind::Permit { permits: 3 }),
        true,
    );
    assert_eq!(
        pipeline.len(),
        2,
        "one stage and the restatement, one round trip"
    );
    assert_eq!(pipeline[1], crate::store::mongo::rules::restated());
    let body = pipeline[0].get_document("$replaceWith").unwrap();
    assert_eq!(
        at(body, "$let.vars.live"),
        &bson(live_others("me", LID)),
        "the other live entries: the expired ones are dropped"
    );
    let cond = at(body, "$let.in.$cond").as_array().unwrap();
    let guarded = cond[0].as_document().unwrap();
    assert_eq!(
        at(guarded, "$and.0"),
        &bson(doc! { "$not": [{ "$in": [
            bson_lease_id(LID),
            { "$ifNull": ["$hs.xl", []] },
        ]}]}),
        "never under a lease id an operator's release by owner id ended"
    );
    let wins = at(guarded, "$and.1").as_document().unwrap();
    assert_eq!(at(wins, "$or.0"), &bson(inserted()));
    assert_eq!(
        at(wins, "$or.1"),
        &bson(doc! { "$and": [
            our_layout(),
            { "$gt": [{ "$size": "$$mine" }, 0] },
            { "$or": [
                { "$eq": [{ "$size": "$$live" }, 0] },
                { "$eq": ["$pm", 3] },
            ]},
        ]}),
        "a retry, on a key still of its number of permits or alone"
    );
    assert_eq!(at(wins, "$or.2.$and.0"), &bson(our_layout()));
    assert_eq!(
        at(wins, "$or.2.$and.2.$or.1"),
        &bson(doc! { "$and": [
            { "$eq": ["$pm", 3] },
            { "$lte": [{ "$add": [permits_used("$$live"), 1_i64] }, 3_i64] },
        ]})
    );
    assert_eq!(cond[2], Bson::from("$$ROOT"), "else nothing written");
    let acquired = at(cond[1].as_document().unwrap(), "$let.in")
        .as_document()
        .unwrap();
    assert_eq!(
        acquired.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "_id", "aid", "tok", "acq", "ts", "exp", "hs", "pm", "rl", "xw", "tr"
        ],
        "no lid, wt, yu, data nor hl"
    );
    assert_eq!(at(acquired, "pm"), &Bson::Int32(3));
    let mine = doc! { "$gt": [{ "$size": "$$mine" }, 0] };
    assert_eq!(
        at(acquired, "aid"),
        &bson(doc! { "$cond": [mine, "$aid", { "$literal": "me" }] }),
        "a retry keeps the latest acquisition's owner"
    );
    assert_eq!(
        at(acquired, "hs"),
        &bson(doc! { "$concatArrays": ["$$live", ["$$entry"]] })
    );
    let entry = at(cond[1].as_document().unwrap(), "$let.vars.entry.$cond")
        .as_array()
        .unwrap();
    let new_entry = entry[2].as_document().unwrap();
    assert_eq!(at(new_entry, "tok"), &bson(next_token()));
    assert_eq!(at(new_entry, "lid"), &bson_lease_id(LID));
    assert_eq!(
        at(new_entry, "exp"),
        &bson(doc! { "$add": ["$$NOW", 30_000_i64] })
    );
}

#[test]
fn a_shared_lease_never_wins_over_live_permits_or_a_live_exclusive_waiters_mark() {
    let pipeline = multi_acquire_pipeline("me", 30_000, LID, shape(LeaseKind::Shared), true);
    let body = pipeline[0].get_document("$replaceWith").unwrap();
    let admits = at(body, "$let.in.$cond.0.$and.1.$or.2.$and.2")
        .as_document()
        .unwrap();
    assert_eq!(
        admits,
        &doc! { "$and": [
            { "$or": [
                { "$eq": [{ "$size": "$$live" }, 0] },
                { "$not": [{ "$ne": [{ "$type": "$pm" }, "missing"] }] },
            ]},
            { "$not": [{ "$and": [
                { "$gt": ["$xw.exp", "$$NOW"] },
                { "$ne": ["$xw.aid", { "$literal": "me" }] },
            ]}] },
        ]}
    );
    let acquired = at(body, "$let.in.$cond.1.$let.in").as_document().unwrap();
    assert!(!acquired.contains_key("pm"));
}

fn projected(live: i32, exp_ms: i64, now_ms: i64) -> Document {
    doc! {
        "_id": "k", "aid": "them", "tok": 9_i64, "exp": date(exp_ms),
        "now": date(now_ms), "live": live,
    }
}

#[test]
fn a_retry_reads_its_own_entrys_token_and_a_foreign_document_is_held_with_no_expiry() {
    let key: LeaseKey = "k".into();
    let mut retry = projected(2, 50_000, 1_000);
    retry.insert(
        "me",
        doc! { "tok": 7_i64, "lid": bson_lease_id(LID), "exp": date(30_000) },
    );
    retry.insert("pm", 3);
    let permit = LeaseKind::Permit { permits: 3 };
    assert_eq!(
        classify_multi(&key, permit, &retry),
        AcquireOutcome::Acquired { token: 7 }
    );
    // Its entry on a key whose number changed since, with other holders.
    retry.insert("pm", 4);
    assert_eq!(
        classify_multi(&key, permit, &retry),
        AcquireOutcome::OursAsAnotherKind {
            stored: LeaseKind::Permit { permits: 4 }
        }
    );
    retry.insert("live", 0);
    assert_eq!(
        classify_multi(&key, permit, &retry),
        AcquireOutcome::Acquired { token: 7 },
        "alone on the key: a retry as on a free key"
    );
    let foreign = doc! { "_id": "k", "aid": "java", "ts": date(5) };
    assert_eq!(
        classify_multi(&key, permit, &foreign),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "java".into(),
            remaining: None,
            token: None,
        }
    );
}

#[test]
fn a_full_semaphore_is_held_until_its_earliest_live_holders_expiry() {
    let mut full = projected(2, 50_000, 1_000);
    full.insert("pm", 2);
    full.insert("first", date(11_000));
    assert_eq!(
        classify_multi(&"k".into(), LeaseKind::Permit { permits: 2 }, &full),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "them".into(),
            remaining: Some(Duration::from_secs(10)),
            token: Some(9),
        }
    );
}

#[test]
fn live_holders_of_another_kind_are_a_mismatch() {
    let key: LeaseKey = "k".into();
    let mut permits = projected(1, 50_000, 1_000);
    permits.insert("pm", 2);
    let two = LeaseKind::Permit { permits: 2 };
    for asked in [LeaseKind::Permit { permits: 3 }, LeaseKind::Shared] {
        assert_eq!(
            classify_multi(&key, asked, &permits),
            AcquireOutcome::Mismatch { stored: two }
        );
    }
    let shared = projected(1, 50_000, 1_000);
    assert_eq!(
        classify_multi(&key, two, &shared),
        AcquireOutcome::Mismatch {
            stored: LeaseKind::Shared
        }
    );
    // A live exclusive holder: a mismatch for a permit; shared waits.
    let mut exclusive = projected(0, 50_000, 1_000);
    exclusive.insert("lid", bson_lease_id(Uuid::from_u128(5)));
    assert_eq!(
        classify_multi(&key, two, &exclusive),
        AcquireOutcome::Mismatch {
            stored: LeaseKind::Exclusive
        }
    );
    // Released, and still held for its minimum hold: a mismatch too.
    let mut hold = projected(0, 50_000, 1_000);
    hold.insert("hl", date(50_000));
    assert_eq!(
        classify_multi(&key, two, &hold),
        AcquireOutcome::Mismatch {
            stored: LeaseKind::Exclusive
        }
    );
    // No exclusive lease: the last holder's release ran on a `$$NOW` 2 ms
    // ahead of this read's (B3); held for those 2 ms, not a mismatch.
    let released = projected(0, 1_002, 1_000);
    assert_eq!(
        classify_multi(&key, two, &released),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "them".into(),
            remaining: Some(Duration::from_millis(2)),
            token: Some(9),
        }
    );
    assert_eq!(
        classify_multi(&key, LeaseKind::Shared, &exclusive),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "them".into(),
            remaining: Some(Duration::from_secs(49)),
            token: Some(9),
        }
    );
    // An exclusive acquisition finds live permits: a mismatch.
    let mut stored = projected(1, 50_000, 1_000);
    stored.insert("pm", 2);
    stored.insert("lid", bson_lease_id(Uuid::from_u128(5)));
    assert_eq!(
        classify(&key, "me", LID, &stored),
        AcquireOutcome::Mismatch { stored: two }
    );
    stored.insert("exp", date(500));
    assert!(matches!(
        classify(&key, "me", LID, &stored),
        AcquireOutcome::Held { .. }
    ));
}

#[test]
fn a_shared_acquisition_is_held_by_a_live_exclusive_waiter_until_its_mark_ends() {
    let mut marked = projected(1, 50_000, 1_000);
    marked.insert("xw", doc! { "aid": "writer", "exp": date(4_000) });
    let held_by_writer = AcquireOutcome::Held {
        ahead: 0,
        holder: "writer".into(),
        remaining: Some(Duration::from_secs(3)),
        token: Some(9),
    };
    assert_eq!(
        classify_multi(&"k".into(), LeaseKind::Shared, &marked),
        held_by_writer
    );
    marked.insert("live", 0);
    marked.insert("exp", date(1_000));
    assert_eq!(
        classify_multi(&"k".into(), LeaseKind::Shared, &marked),
        held_by_writer
    );
    marked.insert("xw", doc! { "aid": "writer", "exp": date(900) });
    assert_eq!(
        classify_multi(&"k".into(), LeaseKind::Shared, &marked),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "them".into(),
            remaining: Some(Duration::ZERO),
            token: Some(9),
        },
        "an expired mark blocks nobody: try again at once"
    );
}

#[test]
fn the_projection_computes_this_entry_the_live_count_and_the_first_expiry_on_the_server() {
    let projection = multi_acquire_projection("me", LID);
    assert_eq!(at(&projection, "now"), &Bson::from("$$NOW"));
    assert_eq!(
        at(&projection, "live"),
        &bson(doc! { "$size": live_others("me", LID) })
    );
    assert_eq!(
        at(&projection, "me.$first.$filter.cond"),
        &bson(entry_is("me", LID))
    );
    assert!(!projection.contains_key("hs"), "never the whole array");
}

#[test]
fn a_waiting_exclusive_attempt_marks_only_live_shared_holders_and_retries_within_half_its_ttl() {
    let (shared_live, marked) = exclusive_waiter_mark("me", 8_000);
    assert_eq!(
        shared_live,
        doc! { "$and": [
            our_layout(),
            { "$isArray": "$hs" },
            { "$eq": [{ "$type": "$pm" }, "missing"] },
            { "$gt": ["$exp", "$$NOW"] },
        ]}
    );
    assert_eq!(
        marked,
        doc! { "$mergeObjects": ["$$ROOT", { "xw": {
            "aid": { "$literal": "me" },
            "exp": { "$add": ["$$NOW", 8_000_i64] },
        }}]}
    );
    let held = |remaining| AcquireOutcome::Held {
        ahead: 0,
        holder: "reader".into(),
        remaining: Some(remaining),
        token: Some(3),
    };
    let ours = doc! { "xw": { "aid": "me" } };
    let theirs = doc! { "xw": { "aid": "other" } };
    let long = Duration::from_secs(20);
    assert_eq!(
        cap_for_mark(held(long), &ours, "me", 8_000),
        held(Duration::from_secs(4))
    );
    assert_eq!(cap_for_mark(held(long), &theirs, "me", 8_000), held(long));
    assert_eq!(cap_for_mark(held(long), &doc! {}, "me", 8_000), held(long));
}

#[test]
fn an_exclusive_acquisition_held_at_least_writes_hl_and_never_expires_before_it() {
    let plain = acquire_pipeline("me", 30_000, LID, false, None, 3_000, None);
    let acquired = at(&plain[0], "$replaceWith.$cond.1").as_document().unwrap();
    assert!(!acquired.contains_key("hl"), "a new acquisition removes hl");
    let held = acquire_pipeline("me", 30_000, LID, false, Some(90_000), 3_000, None);
    let acquired = at(&held[0], "$replaceWith.$cond.1").as_document().unwrap();
    let mine = at(&held[0], "$replaceWith.$cond.0.$or.1");
    let hold_until = doc! { "$cond": [
        mine.clone(),
        { "$ifNull": ["$hl", { "$add": ["$$NOW", 90_000_i64] }] },
        { "$add": ["$$NOW", 90_000_i64] },
    ]};
    assert_eq!(at(acquired, "hl"), &bson(hold_until.clone()));
    let expires = doc! { "$cond": [
        mine.clone(),
        { "$max": ["$exp", { "$add": ["$$NOW", 30_000_i64] }] },
        { "$add": ["$$NOW", 30_000_i64] },
    ]};
    assert_eq!(
        at(acquired, "exp"),
        &bson(doc! { "$max": [expires, hold_until] })
    );
}

fn leases() -> Vec<LeaseRef> {
    vec![
        LeaseRef {
            key: "a".into(),
            lease_id: LID,
            kind: crate::kind::LeaseKind::Exclusive,
        },
        LeaseRef {
            key: "b".into(),
            lease_id: Uuid::from_u128(7),
            kind: crate::kind::LeaseKind::Exclusive,
        },
    ]
}

#[test]
fn renewals_and_releases_match_a_lease_at_the_top_or_as_an_entry_of_its_owner() {
    let ids = vec![bson_lease_id(LID), bson_lease_id(Uuid::from_u128(7))];
    assert_eq!(
        holder_filter("me", &leases()),
        doc! {
            "_id": { "$in": ["a", "b"] },
            "$or": [
                { "lid": { "$in": ids.clone() }, "aid": { "$eq": "me" } },
                { "hs": { "$elemMatch": { "lid": { "$in": ids }, "aid": { "$eq": "me" } } } },
            ],
            "value": { "$exists": false },
        }
    );
    assert_eq!(
        owner_holders_filter("me"),
        doc! {
            "hs": { "$elemMatch": { "aid": { "$eq": "me" } } },
            "tok": { "$type": "long" },
            "exp": { "$type": "date" },
            "value": { "$exists": false },
        }
    );
}

#[test]
fn renewal_keeps_exp_at_least_hl_and_renews_only_the_batchs_entries() {
    let ids = lease_ids(&leases());
    let update = renew_any_update("me", &ids, 5_000);
    assert_eq!(update.len(), 2);
    let set = update[0].get_document("$set").unwrap();
    assert_eq!(at(set, "ts"), &Bson::from("$$NOW"));
    assert_eq!(
        at(set, "exp"),
        &bson(doc! { "$max": ["$exp", { "$add": ["$$NOW", 5_000_i64] }] }),
        "first as the plain renewal, never back"
    );
    assert_eq!(
        at(set, "hs.$cond.1.$map.in.$cond.0"),
        &bson(entry_among("me", &ids))
    );
    assert_eq!(at(set, "hs.$cond.2"), &Bson::from("$$REMOVE"));
    assert_eq!(
        at(set, "hs.$cond.1.$map.in.$cond.1.$mergeObjects.1.exp"),
        &bson(doc! { "$max": ["$$this.exp", { "$add": ["$$NOW", 5_000_i64] }] }),
        "an entry's expiry never back either"
    );
    let latest = doc! { "$max": ["$exp", "$hl", { "$max": "$hs.exp" }] };
    assert_eq!(
        update[1],
        doc! { "$set": {
            "exp": latest.clone(),
            "ttl": restated_seconds(latest, "$ts", "$tok"),
        }},
        "then at least hl, or the latest holder's; restated"
    );
    assert_eq!(at(set, "obtained_at"), &Bson::from("$$NOW"));
}

#[test]
fn release_removes_the_entries_sets_rl_and_keeps_an_exclusive_lease_until_hl() {
    let selection = Selection::Leases {
        owner: "me",
        ids: vec![LID],
    };
    let update = release_any_update(&selection, 2_000);
    assert_eq!(
        update.len(),
        7,
        "pick, release (3 stages), handoff, cleanup, restatement"
    );
    assert_eq!(update[6], crate::store::mongo::rules::restated());
    let first = update[1].get_document("$set").unwrap();
    assert_eq!(
        at(first, "exp.$cond.2"),
        &bson(doc! { "$max": [{ "$min": ["$exp", "$$NOW"] }, "$hl"] })
    );
    assert_eq!(
        at(first, "rl"),
        &bson(doc! { "$cond": [{ "$isArray": "$hs" }, "$$NOW", "$rl"] })
    );
    assert_eq!(
        at(first, "hs.$cond.1.$filter.cond"),
        &bson(doc! { "$and": [
            { "$gt": ["$$this.exp", "$$NOW"] },
            { "$not": [entry_among("me", &[LID])] },
        ]})
    );
    let second = update[2].get_document("$set").unwrap();
    assert_eq!(
        at(second, "exp.$cond.1"),
        &bson(doc! { "$ifNull": [{ "$max": "$hs.exp" }, "$$NOW"] })
    );
    assert_eq!(update[3], doc! { "$unset": ["lid", "wt"] });
}

#[test]
fn force_release_frees_every_holder_the_minimum_hold_and_the_waiting_mark() {
    use crate::store::OverrideEnd::{AtExpiry, Immediately};
    assert_eq!(
        force_release_any_filter(&"k".into(), AtExpiry),
        doc! {
            "_id": "k",
            "tok": { "$type": "long" },
            "value": { "$exists": false },
            "$or": [
                { "lid": { "$exists": true } },
                { "hs": { "$exists": true } },
                { "hl": { "$exists": true } },
            ],
            "$expr": { "$gt": ["$exp", "$$NOW"] },
        }
    );
    // An override the operator marks immediate also shortens the wait an
    // earlier one left (`nb` ahead).
    assert_eq!(
        at(&force_release_any_filter(&"k".into(), Immediately), "$or.3"),
        &bson(doc! { "nb": { "$exists": true } })
    );
    let update = force_release_update(2_000, 0, Immediately);
    assert_eq!(
        at(&update[0], "$set.exp"),
        &bson(doc! { "$min": ["$exp", "$$NOW"] })
    );
    // By default, not before the lease's expiry: its holder has stopped
    // by then, told or not.
    let waits = force_release_update(2_000, 0, AtExpiry);
    let until = bson(doc! { "$max": ["$exp", { "$add": ["$$NOW", 0_i64] }] });
    assert_eq!(at(&waits[0], "$set.exp"), &until);
    assert_eq!(at(&waits[0], "$set.nb"), &until);
    assert_eq!(at(&update[0], "$set.rl"), &Bson::from("$$NOW"));
    assert_eq!(
        update[1],
        doc! { "$unset": ["lid", "wt", "hs", "pm", "hl", "xw"] }
    );
    assert_eq!(update.len(), 3);
    assert_eq!(update[2], crate::store::mongo::rules::restated());
}

#[test]
fn a_holders_payload_is_written_in_its_own_entry() {
    assert_eq!(
        holder_payload_filter("me", &leases()[0]),
        doc! { "_id": "a", "hs": { "$elemMatch": { "lid": bson_lease_id(LID), "aid": { "$eq": "me" } } } }
    );
    assert_eq!(
        holder_payload_update(doc! { "x": 1 }),
        doc! { "$set": { "hs.$.data": { "x": 1 } } }
    );
}

#[test]
fn a_batch_of_exclusive_leases_keeps_the_plain_renewal_never_below_hl() {
    let ids = vec![bson_lease_id(LID), bson_lease_id(Uuid::from_u128(7))];
    assert_eq!(
        exclusive_filter("me", &leases()),
        doc! {
            "_id": { "$in": ["a", "b"] },
            "lid": { "$in": ids },
            "aid": { "$eq": "me" },
            "value": { "$exists": false },
        }
    );
    assert_eq!(
        renew_exclusive_update(7_000),
        vec![
            doc! { "$set": {
                "ts": "$$NOW",
                "exp": { "$max": ["$exp", { "$add": ["$$NOW", 7_000_i64] }] },
                "obtained_at": "$$NOW",
            }},
            doc! { "$set": {
                "exp": { "$max": ["$exp", "$hl"] },
                "ttl": restated_seconds(doc! { "$max": ["$exp", "$hl"] }, "$ts", "$tok"),
            }},
        ],
        "restated in the renewal itself (its filter matches leases of ours only)"
    );
}
