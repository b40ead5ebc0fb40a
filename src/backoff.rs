//! Jittered exponential backoff for retries against MongoDB.

use std::time::Duration;

/// Delay before retry number `attempt` (0-based): exponential from `initial`,
/// capped at `max`, with "equal jitter" (a uniform pick in the upper half of the
/// step, so waiters on different machines fall out of lockstep but never retry
/// at once), then capped by `remaining` (the holder's remaining lease time, when
/// known) plus up to `initial` of jitter, so a waiter tries again right when an
/// expired lease can be taken over.
pub(crate) fn retry_delay(
    attempt: u32,
    initial: Duration,
    max: Duration,
    remaining: Option<Duration>,
) -> Duration {
    let step = initial
        .checked_mul(1u32.checked_shl(attempt.min(30)).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max);
    let half = step / 2;
    let delay = half + crate::random::random_range(Duration::ZERO..=step - half);
    match remaining {
        Some(remaining) => {
            delay.min(remaining + crate::random::random_range(Duration::ZERO..=initial))
        }
        None => delay,
    }
}

#[cfg(test)]
mod tests {
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
}
