use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};

use super::*;

fn at(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

const T: i64 = 1_700_000_000_000;

fn rules() -> ForeignRules {
    ForeignRules {
        custom: None,
        ts_expire_after: Some(Duration::from_secs(30)),
    }
}

#[test]
fn each_built_in_shape_has_its_owner_and_expiry() {
    let p1 = rules().annotate(
        &doc! { "_id": "k", "ts": at(T), "aid": "app" },
        false,
        at(T),
    );
    assert_eq!(p1.get(EXPIRY), Some(&Bson::DateTime(at(T + 30_000))));
    assert_eq!(p1.get_str(OWNER), Ok("app"));
    assert_eq!(p1.get_bool(HELD), Ok(true));

    let p2 = doc! { "_id": "k", "value": "v1", "ttl": 10, "obtained_at": at(T) };
    let p2 = rules().annotate(&p2, false, at(T + 10_000));
    // Its clients' strict `>`: free 1 ms after `obtained_at + ttl`.
    assert_eq!(p2.get(EXPIRY), Some(&Bson::DateTime(at(T + 10_001))));
    assert_eq!(p2.get_str(OWNER), Ok("v1"));
    assert_eq!(p2.get_bool(HELD), Ok(true));

    let p3 = rules().annotate(&doc! { "_id": "k", "ExpireAt": at(T) }, false, at(T));
    assert_eq!(p3.get(EXPIRY), Some(&Bson::DateTime(at(T))));
    assert_eq!(p3.get(OWNER), None);
    assert_eq!(p3.get_bool(HELD), Ok(false), "free at its ExpireAt");

    let bare = rules().annotate(&doc! { "_id": "k" }, false, at(T));
    assert_eq!(
        bare,
        doc! { "_id": "k", HELD: true },
        "held, no expiry, no owner"
    );
}

#[test]
fn ts_never_expires_without_a_ttl_index_and_ours_is_never_foreign() {
    let p1 = doc! { "_id": "k", "ts": at(T), "aid": "app" };
    let never = ForeignRules {
        custom: None,
        ts_expire_after: None,
    }
    .annotate(&p1, false, at(i64::MAX));
    assert_eq!(never.get(EXPIRY), None);
    assert_eq!(never.get_str(OWNER), Ok("app"));
    assert!(
        !ForeignRules {
            custom: None,
            ts_expire_after: None
        }
        .free(&p1, false, at(i64::MAX))
    );
    assert_eq!(
        rules().annotate(&p1, true, at(T)),
        p1,
        "our layout: as it is"
    );
    assert!(rules().free(&p1, false, at(T + 30_000)));
    assert!(!rules().free(&p1, false, at(T + 29_999)));
}

#[test]
fn an_npm_lock_whose_ttl_is_no_finite_number_of_seconds_is_held_with_no_expiry() {
    // A user's rule reads every other document: it must not read these.
    let rules = ForeignRules {
        custom: Some(ForeignLockRule::builder().held(false).build()),
        ts_expire_after: None,
    };
    for ttl in [
        Bson::Double(f64::NAN),
        Bson::Double(f64::INFINITY),
        Bson::Int64(i64::MAX),
        Bson::Double(1e300),
        Bson::String("10".into()),
    ] {
        let doc = doc! { "_id": "k", "value": "v", "ttl": ttl.clone(), "obtained_at": at(T) };
        let read = rules.annotate(&doc, false, at(T));
        assert_eq!(read.get_bool(HELD), Ok(true), "{ttl:?}");
        assert_eq!(read.get_str(OWNER), Ok("v"), "{ttl:?}");
        assert!(read.get_datetime(EXPIRY).is_err(), "{ttl:?}: no expiry");
    }
}

#[test]
fn a_users_rule_reads_what_no_built_in_rule_describes() {
    // `{_id, locked, owner, created, expire: date|null}` (docs/sharing.md).
    let rules = ForeignRules {
        custom: Some(crate::sim::others::Schema::Locked.rule()),
        ts_expire_after: None,
    };
    let held =
        doc! { "_id": "k", "locked": true, "owner": "w1", "created": at(T), "expire": Bson::Null };
    let read = rules.annotate(&held, false, at(T));
    assert_eq!(
        read.get_bool(HELD),
        Ok(true),
        "a null expiry: held until released"
    );
    assert_eq!(read.get_str(OWNER), Ok("w1"));
    let released = doc! { "_id": "k", "locked": false, "owner": Bson::Null, "created": Bson::Null, "expire": Bson::Null };
    assert!(rules.free(&released, false, at(T)));
    let expiring =
        doc! { "_id": "k", "locked": true, "owner": "w1", "created": at(T), "expire": at(T + 5) };
    assert!(!rules.free(&expiring, false, at(T + 4)));
    assert!(rules.free(&expiring, false, at(T + 5)));
    // A built-in shape is read by its own rule first.
    let bare = rules.annotate(&doc! { "_id": "k" }, false, at(T));
    assert_eq!(bare.get_bool(HELD), Ok(true));
}

#[test]
fn a_rule_reads_from_a_document_and_refuses_other_fields() {
    let read = |d: Document| mongodb::bson::from_document::<ForeignLockRule>(d);
    let held = doc! { "$gt": ["$expire", { "$toLong": "$$NOW" }] };
    let rule = read(doc! { "held": held.clone(), "expires_at": { "$toDate": "$expire" } });
    let rule = rule.expect("a rule");
    assert_eq!((rule.held, rule.owner), (held.into(), None));
    // `null` is absent: a `describes` of null describes what a rule
    // without one does.
    let nulls = doc! { "held": true, "owner": null, "expires_at": null, "describes": null };
    let rule = read(nulls).expect("a rule");
    assert_eq!(rule, ForeignLockRule::builder().held(true).build());
    for (bad, says) in [
        (doc! { "owner": "$o" }, "missing field `held`"),
        (doc! { "held": true, "hold": 1 }, "unknown field `hold`"),
    ] {
        let error = read(bad).expect_err(says).to_string();
        assert!(error.contains(says), "{error}");
    }
}

#[test]
fn the_twin_refuses_a_rule_with_an_operator_it_does_not_evaluate() {
    let rule = ForeignLockRule::builder()
        .held(doc! { "$regexMatch": { "input": "$o", "regex": "^w" } })
        .build();
    let error = crate::store::memory::MemoryDb::new()
        .with_foreign_rules(ForeignRules {
            custom: Some(rule),
            ts_expire_after: None,
        })
        .err()
        .expect("refused");
    assert!(
        matches!(&error, crate::Error::InvalidConfig { reason } if reason.contains("$regexMatch")),
        "{error:?}"
    );
}

#[test]
fn a_document_whose_describes_fails_in_the_twin_is_held() {
    // MongoDB fails the command; the twin reads the lock as held, rather
    // than passing it on to the rules after.
    let failing = ForeignLockRule::builder()
        .held(true)
        .describes(doc! { "$eq": [{ "$toDate": "$at" }, "$$NOW"] })
        .build();
    let rules = ForeignRules {
        custom: Some(failing),
        ts_expire_after: None,
    };
    let doc = doc! { "_id": "k", "at": "not a date", "locked": false };
    assert_eq!(rules.annotate(&doc, false, at(T)).get_bool(HELD), Ok(true));
    assert!(!rules.free(&doc, false, at(T)));
}
