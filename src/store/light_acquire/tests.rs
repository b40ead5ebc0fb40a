use super::*;

#[test]
fn the_bound_counts_only_the_time_before_the_reads_send() {
    let sent = Instant::now();
    let ms = Duration::from_millis;
    assert_eq!(elapsed_before_find(sent, sent + ms(7)), 8);
    assert_eq!(
        elapsed_before_find(sent, sent + ms(7) + Duration::from_micros(900)),
        8
    );
    assert_eq!(elapsed_before_find(sent, sent), 1);
}

#[test]
fn a_grouped_acquire_counts_only_a_lease_that_lasts_its_ttl_from_the_send() {
    let lease_id = Uuid::new_v4();
    let request = LightAcquire {
        key: "k".into(),
        lease_id,
        ttl: Duration::from_secs(10),
    };
    let token = |owner: &str, id: Uuid, left_ms: i64| {
        let found = Found {
            owner: Some(owner),
            lease_id: Some(id),
            token: 9,
            left_ms,
        };
        match acquired(Some(found), &request, "a", 5) {
            LightAcquired::Acquired(token) => Some(token),
            _ => None,
        }
    };
    // 5 ms passed since the send: at least 9 995 ms must be left.
    assert_eq!(token("a", lease_id, 9_995), Some(9));
    assert_eq!(token("a", lease_id, 9_994), None);
    assert_eq!(token("a", lease_id, -1), None);
    assert_eq!(token("b", lease_id, 10_000), None);
    assert_eq!(token("a", Uuid::new_v4(), 10_000), None);
    let released = Found {
        owner: Some("a"),
        lease_id: None,
        token: 9,
        left_ms: 10_000,
    };
    assert!(matches!(
        acquired(Some(released), &request, "a", 5),
        LightAcquired::NotApplied
    ));
    assert!(matches!(
        acquired(None, &request, "a", 5),
        LightAcquired::NotApplied
    ));
}
