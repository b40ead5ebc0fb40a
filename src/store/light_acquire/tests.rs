use super::*;

/// A request under `lease_id` with a 10 s TTL whose attempt started at
/// `started`.
fn request(lease_id: Uuid, started: Instant) -> LightAcquire {
    LightAcquire {
        key: "k".into(),
        lease_id,
        ttl: Duration::from_secs(10),
        started,
    }
}

/// A document of `owner` under `id`, token 9, with `left_ms` left.
fn found(owner: &str, id: Uuid, left_ms: i64) -> Found<'_> {
    Found {
        owner: Some(owner),
        lease_id: Some(id),
        token: 9,
        left_ms,
    }
}

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
fn a_grouped_acquire_counts_only_a_lease_that_lasts_its_ttl_from_the_attempts_start() {
    let lease_id = Uuid::new_v4();
    let started = Instant::now();
    let request = request(lease_id, started);
    // The find went 4 ms after the attempt started: e = 5 ms.
    let find_sent = started + Duration::from_millis(4);
    let token = |owner: &str, id: Uuid, left_ms: i64| match acquired(
        Some(found(owner, id, left_ms)),
        &request,
        "a",
        find_sent,
    ) {
        LightAcquired::Acquired(token) => Some(token),
        _ => None,
    };
    // At least 9 995 ms must be left to count from the start.
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
        acquired(Some(released), &request, "a", find_sent),
        LightAcquired::NotApplied
    ));
    assert!(matches!(
        acquired(None, &request, "a", find_sent),
        LightAcquired::NotApplied
    ));
}

#[test]
fn a_grouped_acquire_found_short_counts_from_earlier_by_the_shortfall_down_to_half_the_ttl() {
    let lease_id = Uuid::new_v4();
    // An instant with room before it on any clock.
    let started = Instant::now() + Duration::from_secs(60);
    let request = request(lease_id, started);
    // e = 5 ms: 9 995 ms left is the bound.
    let find_sent = started + Duration::from_millis(4);
    let answer = |left_ms: i64| {
        acquired(
            Some(found("a", lease_id, left_ms)),
            &request,
            "a",
            find_sent,
        )
    };
    let counts_from = |left_ms: i64| match answer(left_ms) {
        LightAcquired::AcquiredShort {
            token: 9,
            counts_from,
        } => Some(counts_from),
        _ => None,
    };
    let ms = Duration::from_millis;
    assert_eq!(counts_from(9_994), Some(started - ms(1)));
    assert_eq!(counts_from(9_000), Some(started - ms(995)));
    // Whatever the shortfall, the lease lasts its TTL from that instant
    // by the bound: counting from it, e grows by the shortfall.
    for left in [5_000, 7_321, 9_994] {
        let from = counts_from(left).expect("acquired short");
        let e = elapsed_before_find(from, find_sent);
        assert_eq!(left, 10_000 - e, "left {left}");
    }
    assert_eq!(counts_from(5_000), Some(started - ms(4_995)));
    // Less than half the TTL left: the general acquire renews it.
    assert!(matches!(answer(4_999), LightAcquired::NotApplied));
    assert!(matches!(answer(9_995), LightAcquired::Acquired(9)));
}
