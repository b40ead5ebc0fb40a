//! Other applications' lock documents: foreign holders' locks are read as
//! held, never modified, and deleted only by a force release.

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use std::time::Duration;

use mongodb::bson::Bson;
use uuid::Uuid;

use super::{Fixture, Planted, TTL, lease, take};
use crate::foreign::{ForeignLockRule, ForeignRules};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, Store};

pub(super) async fn inspect_and_list_show_a_foreign_lock_as_held_by_its_foreign_holder<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.store("a").await;
    f.put_foreign("f", "java-app-1").await;
    let info = a
        .inspect("f".into())
        .await
        .unwrap()
        .expect("a foreign lock");
    assert!(info.held && info.foreign, "{info:?}");
    assert_eq!(
        (
            info.key.as_str().unwrap(),
            info.owner_id.as_str(),
            info.fencing_token
        ),
        ("f", "java-app-1", 0)
    );
    // Its `ts`, written "now" by the other application: a server time near
    // the read's (the bound only turns a wrong field into a failure).
    let skew = |a: std::time::SystemTime, b: std::time::SystemTime| {
        a.duration_since(b)
            .or_else(|_| b.duration_since(a))
            .unwrap()
    };
    assert!(skew(info.renewed_at, info.server_time) < Duration::from_secs(60));
    assert_eq!(info.acquired_at, info.renewed_at);
    assert_eq!(info.expires_at, info.server_time, "expiry unknown");
    assert_eq!(info.time_to_expiry(), Duration::MAX);
    assert_eq!(info.payload, None);

    take(&a, "g").await;
    let (page, next) = a.list(None, 10).await.unwrap();
    assert_eq!(next, None);
    let seen: Vec<_> = page
        .iter()
        .map(|i| {
            (
                i.key.as_str().unwrap(),
                i.owner_id.as_str(),
                i.held,
                i.foreign,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("f", "java-app-1", true, true), ("g", "a", true, false)]
    );
    assert_eq!(page[0].renewed_at, info.renewed_at);
    assert!(f.foreign_unchanged("f").await);
}

pub(super) async fn force_release_deletes_a_foreign_lock<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    f.put_foreign("f", "java-app-1").await;
    let before = a
        .force_release("f".into(), OverrideEnd::Immediately)
        .await
        .unwrap();
    let before = before.expect("the foreign lock, as it was");
    assert!(before.foreign && before.held);
    assert_eq!(before.owner_id, "java-app-1");
    assert_eq!(f.raw("f").await, None);
    assert!(!f.foreign_unchanged("f").await);
    assert_eq!(a.inspect("f".into()).await.unwrap(), None);
    // Free now: the next acquisition is ours.
    take(&a, "f").await;
}

pub(super) async fn release_owner_never_touches_a_foreign_document_with_the_same_aid<F: Fixture>(
    f: &F,
) {
    let a = f.store("java-app-1").await;
    f.put_foreign("f", "java-app-1").await;
    let (l, _) = take(&a, "ours").await;
    let released = a.release_owner("java-app-1".into(), OverrideEnd::Immediately);
    assert_eq!(released.await.unwrap(), 1);
    assert!(f.foreign_unchanged("f").await);
    // Nor do renewal, release and payload under any lease id.
    let stray = lease("f", Uuid::new_v4());
    assert_eq!(a.renew(vec![stray.clone()]).await.unwrap(), ["f"]);
    assert_eq!(a.release_by_id(vec![stray.clone()]).await.unwrap(), 0);
    let payload = mongodb::bson::doc! { "x": 1 };
    assert!(!a.set_payload(stray, payload).await.unwrap());
    assert!(f.foreign_unchanged("f").await);
    assert_eq!(
        a.release_by_id(vec![l]).await.unwrap(),
        0,
        "released already"
    );
}

/// A bare `{_id}` (another application's lock by an upsert of `_id` alone,
/// released by a delete) is never taken, by any kind of acquisition, nor
/// marked; reads show it held by a foreign holder of owner id `""`, and a
/// force release deletes it.
pub(super) async fn a_bare_id_document_is_a_foreign_holders_lock_of_every_kind<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    f.put_bare("b").await;
    let foreign = AcquireOutcome::Held {
        ahead: 0,
        holder: String::new(),
        remaining: None,
        token: None,
    };
    let shapes = [
        LeaseShape::default(),
        LeaseShape {
            kind: LeaseKind::Exclusive,
            hold_at_least: Some(Duration::from_secs(1)),
            permits_taken: None,
        },
        LeaseShape {
            kind: LeaseKind::Shared,
            hold_at_least: None,
            permits_taken: None,
        },
        LeaseShape {
            kind: LeaseKind::Permit { permits: 2 },
            hold_at_least: None,
            permits_taken: None,
        },
    ];
    for shape in shapes {
        for waiting in [false, true] {
            let outcome = a
                .acquire_shaped("b".into(), Uuid::new_v4(), waiting, TTL, shape)
                .await
                .unwrap();
            assert_eq!(outcome, foreign, "{shape:?}, waiting: {waiting}");
            assert!(
                f.foreign_unchanged("b").await,
                "{shape:?}, waiting: {waiting}"
            );
        }
    }
    assert_eq!(
        a.release_owner(String::new(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        a.release_by_id(vec![lease("b", Uuid::new_v4())])
            .await
            .unwrap(),
        0
    );
    assert!(f.foreign_unchanged("b").await);

    let info = a
        .inspect("b".into())
        .await
        .unwrap()
        .expect("a foreign lock");
    assert!(info.held && info.foreign, "{info:?}");
    assert_eq!((info.owner_id.as_str(), info.fencing_token), ("", 0));
    assert_eq!(info.expires_at, info.server_time, "expiry unknown");
    let (page, _) = a.list(None, 10).await.unwrap();
    let seen: Vec<_> = page
        .iter()
        .map(|i| (i.key.clone(), i.owner_id.as_str(), i.held, i.foreign))
        .collect();
    assert_eq!(seen, [(info.key.clone(), "", true, true)]);

    let before = a
        .force_release("b".into(), OverrideEnd::Immediately)
        .await
        .unwrap();
    let before = before.expect("the bare lock, as it was");
    assert!(before.foreign && before.held && before.owner_id.is_empty());
    assert_eq!(f.raw("b").await, None);
    take(&a, "b").await;
}

/// A planted foreign lock's fields ([`Fixture::put_foreign_doc`]).
type Fields = Vec<(&'static str, Planted)>;

/// The foreign lock layouts of the scenarios below: the built-in ones with a
/// TTL index of 30 s on `ts`, and a user's rule for `{_id, holder, until}`.
fn rules() -> ForeignRules {
    let rule = ForeignLockRule::builder()
        .held(mongodb::bson::doc! { "$lt": ["$$NOW", "$until"] })
        .owner("$holder")
        .expires_at("$until")
        .describes(mongodb::bson::doc! { "$eq": [{ "$type": "$until" }, "date"] })
        .build();
    ForeignRules {
        custom: Some(rule),
        ts_expire_after: Some(Duration::from_secs(30)),
    }
}

/// One lock document of each recognised layout, live for about a minute
/// by its own rule (`{_id, ts, aid}`: 30 s), with the owner each shows and
/// its expiry minus when it was taken (`None`: no such date shown).
fn live_locks() -> Vec<(&'static str, Fields, &'static str, Option<u64>)> {
    let v = |b: &str| Planted::Value(Bson::from(b));
    vec![
        (
            "p1",
            vec![("ts", Planted::At(0)), ("aid", v("java-app-1"))],
            "java-app-1",
            Some(30_000),
        ),
        (
            "p2",
            // 59 999.9 ms, then its clients' strict `>`.
            vec![
                ("value", v("node-7")),
                ("ttl", Planted::Value(Bson::Double(59.9999))),
                ("obtained_at", Planted::At(0)),
            ],
            "node-7",
            None,
        ),
        ("p3", vec![("ExpireAt", Planted::At(60_000))], "", None),
        (
            "user",
            vec![("holder", v("batch")), ("until", Planted::At(60_000))],
            "batch",
            None,
        ),
    ]
}

/// Each recognised foreign layout held by its own rule is respected by
/// every kind of acquisition, waiting or not, and left byte for byte as
/// written; the answer names its owner and the time left by that rule
/// (so that waiters retry when it ends), and the reads show the owner and
/// the expiry.
pub(super) async fn a_live_foreign_lock_of_each_shape_is_held_until_its_own_expiry<F: Fixture>(
    f: &F,
) {
    let a = f.store_with_rules("a", rules()).await;
    for (key, fields, owner, lifetime) in live_locks() {
        f.put_foreign_doc(key, fields).await;
        for kind in [
            LeaseKind::Exclusive,
            LeaseKind::Shared,
            LeaseKind::Permit { permits: 2 },
        ] {
            for waiting in [false, true] {
                let shape = LeaseShape {
                    kind,
                    hold_at_least: None,
                    permits_taken: None,
                };
                let outcome = a
                    .acquire_shaped(key.into(), Uuid::new_v4(), waiting, TTL, shape)
                    .await
                    .unwrap();
                let AcquireOutcome::Held {
                    holder,
                    remaining: Some(left),
                    token: None,
                    ..
                } = outcome
                else {
                    panic!("{key}, {kind:?}: {outcome:?}");
                };
                assert_eq!(holder, owner, "{key}");
                // About a minute (30 s for `ts`) by the server's clock; the
                // bounds only turn a wrong rule into a failure.
                let (low, high) = match key {
                    "p1" => (20_000, 30_000),
                    _ => (50_000, 60_001),
                };
                assert!(
                    (low..=high).contains(&(left.as_millis() as u64)),
                    "{key}: {left:?}"
                );
                assert!(f.foreign_unchanged(key).await, "{key}, {kind:?}");
            }
        }
        let info = a
            .inspect(key.into())
            .await
            .unwrap()
            .expect("a foreign lock");
        assert!(info.foreign && info.held, "{key}: {info:?}");
        assert_eq!(info.owner_id, owner, "{key}");
        assert!(info.expires_at > info.server_time, "{key}: {info:?}");
        let left = info.time_to_expiry();
        assert!(
            left > Duration::from_secs(20) && left <= Duration::from_millis(60_001),
            "{key}: {left:?}"
        );
        if let Some(lifetime) = lifetime {
            let counted = info.expires_at.duration_since(info.acquired_at).unwrap();
            assert_eq!(counted, Duration::from_millis(lifetime), "{key}");
        }
    }
    let (page, _) = a.list(None, 10).await.unwrap();
    let seen: Vec<_> = page
        .iter()
        .map(|i| {
            (
                i.key.as_str().unwrap(),
                i.owner_id.as_str(),
                i.held,
                i.foreign,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("p1", "java-app-1", true, true),
            ("p2", "node-7", true, true),
            ("p3", "", true, true),
            ("user", "batch", true, true),
        ]
    );
}

/// Each recognised foreign layout expired by its own rule is taken over by
/// the acquisition's own write, exclusive or shared, and the reads then
/// show our lease. Fencing tokens still strictly increase per key: the
/// key's earlier lease (its document deleted as the TTL monitor does, then
/// the other application's lock inserted) had a smaller token than the
/// takeover's, and the next acquisition's is greater. (On MongoDB the
/// takeover's token is the token rule's from no `tok`, `ms($$NOW) * 2^20`:
/// tests/sharing/patterns.rs checks the value.)
pub(super) async fn a_foreign_lock_expired_by_its_own_rule_is_taken_over<F: Fixture>(f: &F) {
    let a = f.store_with_rules("a", rules()).await;
    let v = |b: &str| Planted::Value(Bson::from(b));
    let expired: Vec<(&str, Fields)> = vec![
        (
            "p1",
            vec![("ts", Planted::At(-30_000)), ("aid", v("java-app-1"))],
        ),
        (
            "p2",
            vec![
                ("value", v("node-7")),
                ("ttl", Planted::Value(Bson::Double(0.5))),
                ("obtained_at", Planted::At(-501)),
            ],
        ),
        ("p3", vec![("ExpireAt", Planted::At(0))]),
        (
            "user",
            vec![("holder", v("batch")), ("until", Planted::At(-1))],
        ),
    ];
    for (i, (key, fields)) in expired.into_iter().enumerate() {
        let (earlier, before) = take(&a, key).await;
        assert_eq!(a.release_by_id(vec![earlier]).await.unwrap(), 1, "{key}");
        f.delete(key).await;
        f.put_foreign_doc(key, fields).await;
        let kind = match i % 2 {
            0 => LeaseKind::Exclusive,
            _ => LeaseKind::Shared,
        };
        let shape = LeaseShape {
            kind,
            hold_at_least: None,
            permits_taken: None,
        };
        let lease_id = Uuid::new_v4();
        let outcome = a
            .acquire_shaped(key.into(), lease_id, true, TTL, shape)
            .await
            .unwrap();
        let AcquireOutcome::Acquired { token } = outcome else {
            panic!("{key}: {outcome:?}");
        };
        assert!(token > before, "{key}: {token} after {before}");
        let info = a.inspect(key.into()).await.unwrap().expect("our lease");
        assert!(info.held && !info.foreign, "{key}: {info:?}");
        assert_eq!(
            (info.owner_id.as_str(), info.fencing_token, info.kind),
            ("a", token, kind),
            "{key}"
        );
        assert!(!f.foreign_unchanged(key).await, "{key}");
        // The next acquisition's token is greater.
        let mut ours = lease(key, lease_id);
        ours.kind = kind;
        assert_eq!(a.release_by_id(vec![ours]).await.unwrap(), 1, "{key}");
        let (_, next) = take(&a, key).await;
        assert!(next > token, "{key}: {next} after {token}");
    }
}

/// `{_id, ts, aid}` expires only by a TTL index on `ts`: without one it is
/// held however old its `ts` (no known remaining time); a bare `{_id}` and
/// a document of no recognised layout never expire either.
pub(super) async fn a_foreign_lock_without_an_expiry_is_never_taken<F: Fixture>(f: &F) {
    let a = f
        .store_with_rules(
            "a",
            ForeignRules {
                custom: None,
                ts_expire_after: None,
            },
        )
        .await;
    let v = |b: &str| Planted::Value(Bson::from(b));
    let locks: Vec<(&str, Fields, &str)> = vec![
        (
            "p1",
            vec![("ts", Planted::At(-3_600_000)), ("aid", v("java-app-1"))],
            "java-app-1",
        ),
        // Not a number: likewise.
        (
            "odd",
            vec![
                ("value", v("node-7")),
                ("ttl", v("10")),
                ("obtained_at", Planted::At(-3_600_000)),
            ],
            "node-7",
        ),
        // No finite number of seconds: the npm shape, held with no expiry.
        (
            "nan",
            vec![
                ("value", v("node-7")),
                ("ttl", Planted::Value(Bson::Double(f64::NAN))),
                ("obtained_at", Planted::At(-3_600_000)),
            ],
            "node-7",
        ),
        (
            "huge",
            vec![
                ("value", v("node-7")),
                ("ttl", Planted::Value(Bson::Int64(i64::MAX))),
                ("obtained_at", Planted::At(-3_600_000)),
            ],
            "node-7",
        ),
        // A user's shape, without the user's rule.
        (
            "user",
            vec![("holder", v("batch")), ("until", Planted::At(-1))],
            "",
        ),
    ];
    for (key, fields, owner) in locks {
        f.put_foreign_doc(key, fields).await;
        let outcome = a.attempt(key.into(), Uuid::new_v4(), true).await.unwrap();
        let held = AcquireOutcome::Held {
            ahead: 0,
            holder: owner.into(),
            remaining: None,
            token: None,
        };
        assert_eq!(outcome, held, "{key}");
        assert!(f.foreign_unchanged(key).await, "{key}");
        let info = a
            .inspect(key.into())
            .await
            .unwrap()
            .expect("a foreign lock");
        assert!(info.held && info.foreign, "{key}");
        assert_eq!(info.time_to_expiry(), Duration::MAX, "{key}");
    }
}

/// A bare `{_id}` under a key of any type (a UUID, a Decimal128, a
/// document holding a UUID) is held beside a user's rule without
/// `describes`, whose `held` would read it as free: the bare rule describes
/// it first, and nothing takes it.
pub(super) async fn a_bare_id_document_of_any_key_type_is_held_beside_a_users_rule<F: Fixture>(
    f: &F,
) {
    let rule = ForeignLockRule::builder()
        .held(mongodb::bson::doc! { "$eq": ["$locked", true] })
        .owner("$owner")
        .build();
    let a = f
        .store_with_rules(
            "a",
            ForeignRules {
                custom: Some(rule),
                ts_expire_after: None,
            },
        )
        .await;
    let uuid = Uuid::from_bytes([7; 16]);
    for key in [
        LeaseKey::from(uuid),
        LeaseKey::from(Bson::Decimal128("4".parse().unwrap())),
        LeaseKey::from(Bson::from(
            mongodb::bson::doc! { "u": LeaseKey::from(uuid).to_bson() },
        )),
    ] {
        f.put_bare(key.clone()).await;
        let info = a
            .inspect(key.clone())
            .await
            .unwrap()
            .expect("the bare lock");
        assert!(info.held && info.foreign, "{key:?}: {info:?}");
        let outcome = a
            .acquire_with_ttl(key.clone(), Uuid::new_v4(), false, TTL)
            .await
            .unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Held { .. }),
            "{key:?}: {outcome:?}"
        );
        assert!(f.foreign_unchanged(key.clone()).await, "{key:?}");
    }
}
