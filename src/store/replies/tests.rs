use mongodb::bson::doc;

use super::*;

const LID: Uuid = Uuid::from_u128(0x1234);

fn lid(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

fn date(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

#[test]
fn a_read_confirms_no_acquisition_orders_no_handoff_and_refuses_no_kind() {
    assert_eq!(
        from_reread(AcquireOutcome::Acquired { token: 7 }),
        AcquireOutcome::Unconfirmed { token: 7 }
    );
    assert_eq!(
        from_reread(AcquireOutcome::Held {
            ahead: 0,
            holder: "b".into(),
            remaining: Some(Duration::from_secs(3)),
            token: Some(9),
        }),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "b".into(),
            remaining: Some(Duration::from_secs(3)),
            token: None,
        }
    );
    // Only the write's own reply proves that it did not land.
    let mismatch = AcquireOutcome::Mismatch {
        stored: LeaseKind::Shared,
    };
    assert_eq!(
        from_reread(mismatch),
        AcquireOutcome::Held {
            ahead: 0,
            holder: String::new(),
            remaining: Some(Duration::ZERO),
            token: None,
        }
    );
}

#[test]
fn an_expired_lease_of_ours_is_not_acquired() {
    let key: LeaseKey = "k".into();
    let ours = |exp: i64| {
        doc! {
            "aid": "me", "lid": lid(LID), "tok": 7_i64, "exp": date(exp), "now": date(1_000),
        }
    };
    assert_eq!(
        classify(&key, "me", LID, &ours(1_001)),
        AcquireOutcome::Acquired { token: 7 }
    );
    assert_eq!(
        classify(&key, "me", LID, &ours(1_000)),
        AcquireOutcome::Unconfirmed { token: 7 }
    );
    let entry = |exp: i64| {
        doc! {
            "aid": "x", "tok": 9_i64, "exp": date(50_000), "now": date(1_000), "live": 1, "pm": 2,
            MINE: { "aid": "me", "lid": lid(LID), "tok": 7_i64, "exp": date(exp) },
        }
    };
    let permit = LeaseKind::Permit { permits: 2 };
    assert_eq!(
        classify_multi(&key, permit, &entry(1_001)),
        AcquireOutcome::Acquired { token: 7 }
    );
    assert_eq!(
        classify_multi(&key, permit, &entry(999)),
        AcquireOutcome::Unconfirmed { token: 7 }
    );
}
