use super::*;
use crate::store::light_release::LightAcquire;
use std::time::Instant;
use uuid::Uuid;

#[test]
fn the_acquires_bound_counts_only_the_time_before_the_finds_send() {
    let sent = Instant::now();
    let ms = std::time::Duration::from_millis;
    assert_eq!(elapsed_before_find(sent, sent + ms(7)), 8);
    assert_eq!(
        elapsed_before_find(sent, sent + ms(7) + std::time::Duration::from_micros(900)),
        8
    );
    assert_eq!(elapsed_before_find(sent, sent), 1);
}

#[test]
fn a_batched_acquire_counts_only_a_lease_that_lasts_its_ttl_from_the_send() {
    let lease_id = Uuid::new_v4();
    let request = LightAcquire {
        key: "k".into(),
        lease_id,
        ttl: std::time::Duration::from_secs(10),
    };
    let now = mongodb::bson::DateTime::from_millis(1_000_000);
    let doc = |owner: &str, id: Uuid, left_ms: i64| {
        doc! {
            field::OWNER: owner, field::LEASE_ID: bson_lease_id(id), field::TOKEN: 9_i64,
            field::EXPIRES_AT: mongodb::bson::DateTime::from_millis(1_000_000 + left_ms),
            "now": now,
        }
    };
    // 5 ms passed since the send: at least 9 995 ms must be left.
    assert_eq!(
        fresh_token(&doc("a", lease_id, 9_995), &request, "a", 5),
        Some(9)
    );
    assert_eq!(
        fresh_token(&doc("a", lease_id, 9_994), &request, "a", 5),
        None
    );
    assert_eq!(
        fresh_token(&doc("b", lease_id, 10_000), &request, "a", 5),
        None
    );
    let other = Uuid::new_v4();
    assert_eq!(
        fresh_token(&doc("a", other, 10_000), &request, "a", 5),
        None
    );
}
