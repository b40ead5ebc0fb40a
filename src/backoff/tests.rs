use super::*;

const MS: Duration = Duration::from_millis(1);

#[test]
fn grows_exponentially_within_jitter_bounds() {
    for attempt in 0..6 {
        let step = 10 * MS * 2u32.pow(attempt);
        for _ in 0..200 {
            let d = retry_delay(attempt, 10 * MS, Duration::from_secs(10), None);
            assert!(
                d >= step / 2 && d <= step,
                "attempt {attempt}: {d:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
    }
}

#[test]
fn capped_by_max_and_by_remaining_lease_time() {
    for _ in 0..200 {
        let d = retry_delay(40, 10 * MS, 200 * MS, None);
        assert!(d >= 100 * MS && d <= 200 * MS, "{d:?}");
        let d = retry_delay(40, 10 * MS, 200 * MS, Some(3 * MS));
        assert!(
            d <= 13 * MS,
            "{d:?} should be capped by remaining 3 ms + 10 ms jitter"
        );
    }
}

#[test]
fn jitter_spreads_waiters() {
    let picks: std::collections::HashSet<_> = (0..50)
        .map(|_| retry_delay(3, 10 * MS, Duration::from_secs(1), None))
        .collect();
    assert!(
        picks.len() > 10,
        "jitter should spread delays, got {} distinct",
        picks.len()
    );
}
