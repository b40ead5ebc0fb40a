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
mod tests;
