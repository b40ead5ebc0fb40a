use std::time::Duration;

use mongodb::bson::{Bson, DateTime, doc};

use super::*;

fn at(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

fn rules() -> ForeignRules {
    ForeignRules::new(None).with_ts_expiry(Some(Duration::from_secs(30)))
}

#[test]
fn each_built_in_shape_has_its_owner_and_expiry() {
    let t = 1_700_000_000_000;
    let p1 = rules().annotate(&doc! { "_id": "k", "ts": at(t), "aid": "app" }, false);
    assert_eq!(p1.get(EXPIRY), Some(&Bson::DateTime(at(t + 30_000))));
    assert_eq!(p1.get_str(OWNER), Ok("app"));
    assert_eq!(p1.get(TAKEN_AT), Some(&Bson::DateTime(at(t))));

    let p2 = doc! { "_id": "k", "value": "v1", "ttl": 10, "obtained_at": at(t) };
    let p2 = rules().annotate(&p2, false);
    // Its clients' strict `>`: free 1 ms after `obtained_at + ttl`.
    assert_eq!(p2.get(EXPIRY), Some(&Bson::DateTime(at(t + 10_001))));
    assert_eq!(p2.get_str(OWNER), Ok("v1"));

    let p3 = rules().annotate(&doc! { "_id": "k", "ExpireAt": at(t) }, false);
    assert_eq!(p3.get(EXPIRY), Some(&Bson::DateTime(at(t))));
    assert_eq!(p3.get(OWNER), None);

    let bare = rules().annotate(&doc! { "_id": "k" }, false);
    assert_eq!(bare, doc! { "_id": "k" }, "held, no expiry, no owner");
}

#[test]
fn ts_never_expires_without_a_ttl_index_and_ours_is_never_foreign() {
    let t = 1_700_000_000_000;
    let p1 = doc! { "_id": "k", "ts": at(t), "aid": "app" };
    let never = ForeignRules::new(None).annotate(&p1, false);
    assert_eq!(never.get(EXPIRY), None);
    assert_eq!(never.get_str(OWNER), Ok("app"));
    assert!(!ForeignRules::new(None).expired(&p1, false, at(i64::MAX)));
    assert_eq!(rules().annotate(&p1, true), p1, "our layout: as it is");
    assert!(rules().expired(&p1, false, at(t + 30_000)));
    assert!(!rules().expired(&p1, false, at(t + 29_999)));
}

#[test]
fn a_ttl_that_is_no_finite_number_of_seconds_gives_no_expiry() {
    let t = 1_700_000_000_000;
    for ttl in [
        Bson::Double(f64::NAN),
        Bson::Double(f64::INFINITY),
        Bson::Int64(i64::MAX),
        Bson::Double(1e300),
    ] {
        let doc = doc! { "_id": "k", "value": "v", "ttl": ttl.clone(), "obtained_at": at(t) };
        assert_eq!(rules().annotate(&doc, false).get(EXPIRY), None, "{ttl:?}");
    }
    // A double is truncated to whole ms, as `$convert` to a long does.
    let doc = doc! { "_id": "k", "value": "v", "ttl": 0.0015, "obtained_at": at(t) };
    assert_eq!(
        rules().annotate(&doc, false).get(EXPIRY),
        Some(&Bson::DateTime(at(t + 2)))
    );
    // Not a number: not this layout (held, no expiry).
    let doc = doc! { "_id": "k", "value": "v", "ttl": "10", "obtained_at": at(t) };
    assert_eq!(rules().annotate(&doc, false), doc);
}

#[test]
fn a_users_rule_comes_first_and_is_validated() {
    let t = 1_700_000_000_000;
    let rule = ForeignLockRule::new(
        ["holder", "since", "secs"],
        ForeignExpiry::AfterSeconds {
            since: "since".into(),
            seconds: "secs".into(),
        },
    )
    .owner("holder");
    rule.validate().unwrap();
    let rules = ForeignRules::new(Some(rule));
    let doc = doc! { "_id": "k", "holder": "h", "since": at(t), "secs": 2, "ExpireAt": at(0) };
    let read = rules.annotate(&doc, false);
    assert_eq!(read.get(EXPIRY), Some(&Bson::DateTime(at(t + 2_000))));
    assert_eq!(read.get_str(OWNER), Ok("h"));

    let bad = [
        ForeignLockRule::new(Vec::<String>::new(), ForeignExpiry::Never),
        ForeignLockRule::new(["_id"], ForeignExpiry::Never),
        ForeignLockRule::new(["a.b"], ForeignExpiry::Never),
        ForeignLockRule::new(["$a"], ForeignExpiry::Never),
        ForeignLockRule::new([""], ForeignExpiry::Never),
        ForeignLockRule::new(["a"], ForeignExpiry::At { field: "b".into() }),
        ForeignLockRule::new(["a"], ForeignExpiry::Never).owner("b"),
        ForeignLockRule::new(
            ["a"],
            ForeignExpiry::After {
                since: "a".into(),
                ttl: Duration::from_secs(u64::MAX),
            },
        ),
    ];
    for rule in bad {
        let error = rule.validate().expect_err("refused");
        assert!(
            matches!(&error, Error::InvalidConfig { reason } if reason.starts_with("foreign_lock: ")),
            "{rule:?}: {error:?}"
        );
    }
}
