//! [`LockIdFields`]: the top-level `LockId` / `LockTime` fields with which
//! other applications lock their own documents, which in-document leases
//! can keep true (`OpenDocuments::lock_id`). A data module:
//! the fields and their checks, made before anything is sent.

use std::time::Duration;

use typed_builder::TypedBuilder;

use crate::document_update::check_field;
use crate::error::{Error, Result};

/// The longest [`LockIdFields::max_duration`] accepted: one year.
const MAX_DURATION_LIMIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A document layout shared with clients that lock a document by two
/// top-level fields of its own, a lock id (`LockId`, a UUID) and the time it
/// was taken (`LockTime`, a date), and take a lock over after `max_duration`.
/// In-document leases opened with these fields
/// ([`OpenDocuments::lock_id`](crate::OpenDocuments::lock_id), which has an
/// example) keep them true, as docs/in-document.md ("Documents locked by
/// LockId and LockTime") says; a lease's TTL must not exceed
/// `max_duration`.
#[derive(Debug, Clone, PartialEq, Eq, TypedBuilder)]
#[non_exhaustive]
pub struct LockIdFields {
    /// The top-level field holding the lock id (a UUID). Default `LockId`.
    #[builder(default = "LockId".to_string(), setter(into))]
    pub lock_id: String,
    /// The top-level field holding the time the lock was taken (a date).
    /// Default `LockTime`.
    #[builder(default = "LockTime".to_string(), setter(into))]
    pub lock_time: String,
    /// How long after `LockTime` a lock is taken over, at least 1 ms and at
    /// most a year; no lease on these documents may have a longer TTL.
    pub max_duration: Duration,
}

impl LockIdFields {
    /// Checks the names and the duration, and that neither name is
    /// `lease_field` (the field of the other lock fields).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a name that is not a top-level field name
    /// other than `_id`, two equal names, or a `max_duration` under 1 ms or
    /// over a year.
    pub(crate) fn check(&self, lease_field: &str) -> Result<()> {
        check_field(&self.lock_id)?;
        check_field(&self.lock_time)?;
        let names = [lease_field, &self.lock_id, &self.lock_time];
        if names[0] == names[1] || names[0] == names[2] || names[1] == names[2] {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the lease field, the lock id field and the lock time field must differ; \
                     got {lease_field:?}, {:?}, {:?}",
                    self.lock_id, self.lock_time
                ),
            });
        }
        if self.max_duration < Duration::from_millis(1) || self.max_duration > MAX_DURATION_LIMIT {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "max_duration must be between 1 ms and a year; got {:?}",
                    self.max_duration
                ),
            });
        }
        Ok(())
    }

    /// Checks that a lease with `ttl` expires to mongo-lease no later than
    /// to the other clients.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a `ttl` over `max_duration`.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl > self.max_duration {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "a lease's TTL ({ttl:?}) must not exceed the max_duration of the {} / {} \
                     fields ({:?}): the lease would outlive their clients' rule",
                    self.lock_id, self.lock_time, self.max_duration
                ),
            });
        }
        Ok(())
    }

    /// `max_duration` in milliseconds, rounded up (a lock is never taken
    /// over before its clients' rule allows).
    pub(crate) fn max_ms(&self) -> i64 {
        let ms = self.max_duration.as_nanos().div_ceil(1_000_000);
        i64::try_from(ms).unwrap_or(i64::MAX)
    }
}
