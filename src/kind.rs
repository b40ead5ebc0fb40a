//! Kinds of lease on a key: exclusive, shared, or one permit of a semaphore.

use std::time::Duration;

/// A kind no lease can have (a semaphore of 0 permits, or too many): why,
/// as [`Error::InvalidConfig`](crate::Error::InvalidConfig) gives it.
#[derive(Debug)]
pub(crate) struct InvalidKind(pub(crate) String);

/// The largest number of permits a semaphore key can have.
pub const MAX_PERMITS: u32 = 10_000;

/// How one acquisition holds its key: exclusively (the default), shared with
/// other shared holders, or as one of `permits` permits of a semaphore.
///
/// # Rules between kinds
///
/// A key of the lock collection is held one way at a time (see each
/// variant). An acquisition of another kind (or number of permits) than the
/// key is held as fails with [`Error::KindMismatch`](crate::Error::KindMismatch);
/// once every holder is gone, any kind can take it. Every kind keeps the
/// guarantees of an exclusive lease, and exclusive waiters are never
/// starved by shared holders (docs/kinds.md).
///
/// # Examples
///
/// ```no_run
/// use mongo_lease::{LeaseKind, LeaseManager, Semaphore};
///
/// # async fn demo(manager: LeaseManager) -> mongo_lease::Result<()> {
/// // At most two holders of "db-migrations-pool" at a time, across processes.
/// let pool = Semaphore::new(&manager, "db-migrations-pool", 2)?;
/// let lease = pool.acquire().await?;
/// assert_eq!(lease.kind(), LeaseKind::Permit { permits: 2 });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseKind {
    /// One holder at a time; excludes shared holders too (the exclusive
    /// side of a read/write key).
    #[default]
    Exclusive,
    /// Shared with other shared holders; excludes an exclusive holder (the
    /// read side of a read/write key).
    Shared,
    /// One of `permits` permits of a semaphore key (1 to [`MAX_PERMITS`]),
    /// a number stored with the key while any permit is held.
    Permit {
        /// How many holders the key admits at a time.
        permits: u32,
    },
}

impl LeaseKind {
    /// Whether a key can have several holders of this kind at once
    /// ([`LeaseKind::Shared`], [`LeaseKind::Permit`]).
    pub fn is_multi_holder(self) -> bool {
        !matches!(self, LeaseKind::Exclusive)
    }

    /// Checks the kind before any round trip.
    ///
    /// # Errors
    ///
    /// [`InvalidKind`] for a semaphore of 0 permits or more than
    /// [`MAX_PERMITS`].
    pub(crate) fn validate(self) -> Result<(), InvalidKind> {
        match self {
            LeaseKind::Permit { permits } if permits == 0 || permits > MAX_PERMITS => {
                Err(InvalidKind(format!(
                    "a semaphore key needs 1 to {MAX_PERMITS} permits, got {permits}"
                )))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for LeaseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseKind::Exclusive => f.write_str("exclusive"),
            LeaseKind::Shared => f.write_str("shared"),
            LeaseKind::Permit { permits } => write!(f, "permit of {permits}"),
        }
    }
}

/// What [`Semaphore::set_permits`](crate::Semaphore::set_permits) did to a
/// semaphore key's number of permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PermitsChange {
    /// The key's live holders take no more than the new number: it is
    /// stored, and acquisitions asking for it are admitted at once.
    Set,
    /// No permit is held: nothing is stored (the number lives with the
    /// key's holders), and the next acquisition stores its own number.
    NothingHeld,
    /// The live holders take more permits than the new number: nothing was
    /// changed. Try again once enough of them are released.
    TooManyHeld {
        /// How many permits the live holders take.
        held: u32,
    },
}

/// What one acquisition asks the store for, besides its key, lease id and
/// TTL: its kind and how long the key stays held at least.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeaseShape {
    pub kind: LeaseKind,
    /// The key stays held until acquisition + this, by the server's clock,
    /// even if released (or abandoned) earlier.
    pub hold_at_least: Option<Duration>,
    /// How many permits of a semaphore key the lease takes at once
    /// ([`Acquire::permits`](crate::Acquire::permits));
    /// `None`: one.
    pub permits_taken: Option<u32>,
}

impl LeaseShape {
    /// How many permits the lease takes: 1 unless set (also for the other
    /// kinds, where it is not stored).
    pub fn taken(&self) -> u32 {
        self.permits_taken.unwrap_or(1)
    }

    /// A plain lease: exclusive, with no minimum hold (ARCHITECTURE.md,
    /// "Glossary"): what in-document leases and every store support.
    pub fn is_plain(&self) -> bool {
        self.kind == LeaseKind::Exclusive && self.hold_at_least.is_none()
    }
}
