//! A write sent again after a transient failure ([`retried`]), by both
//! stores' releases, so that the twin meets the doubts `mongod` gives: a
//! write sent again may find nothing because its first send landed, or
//! because an operator ended the lease before it. Its callers read nothing
//! found as "not by this write" (property 7 of docs/safety.md: a doubt
//! reports a loss, never the reverse).

use crate::error::Result;

/// How many times an idempotent write is sent in all.
pub(crate) const WRITE_ATTEMPTS: u32 = 3;

/// Runs the idempotent write `op` (which returns a count), trying again
/// after a transient failure, up to [`WRITE_ATTEMPTS`] in all. Returns the
/// last attempt's count: an earlier one may have applied, so a count of
/// nothing found after a retry proves nothing.
///
/// # Errors
///
/// The last attempt's error, or the first one that is not transient.
pub(crate) async fn retried<Fut>(what: &str, op: impl Fn() -> Fut) -> Result<u64>
where
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(count) => return Ok(count),
            Err(e) if e.is_transient() && attempt < WRITE_ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "{what} outcome unknown; retrying");
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
