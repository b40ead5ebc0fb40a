//! The lock protocol: how leases are stored and changed in MongoDB.
//!
//! [`MongoStore`] is the only code in the crate that issues MongoDB commands,
//! and only the actor calls it. The actor sees it through the narrow [`Store`]
//! trait, so its timing logic can also be tested under tokio's paused clock
//! against [`memory::MemoryStore`], an in-memory twin that follows the same
//! rules (used only by those unit tests, never as a stand-in for MongoDB).
//!
//! # Document schema
//!
//! One document per key in the lock collection:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `_id` | string | the lease key |
//! | `aid` | string | owner id of the manager that holds (or last held) the lease |
//! | `lid` | UUID (binary subtype 4) | lease id of the current acquisition; absent once released |
//! | `tok` | int64 | fencing token of the current acquisition |
//! | `ts` | date | server time (`$$NOW`) of the last acquire or renewal |
//! | `exp` | date | server time at which the lease expires (`ts + ttl`, or the release time) |
//!
//! A lease is free when `exp <= $$NOW` on the server. A TTL index on `exp`
//! (`expireAfterSeconds` = the manager's GC grace) deletes released and
//! abandoned documents; takeover never waits for it.
//!
//! # Fencing tokens
//!
//! `tok = max(previous tok + 1, ms($$NOW) * 2^20)`. The first term makes tokens
//! strictly increase while the document exists (also across expiry
//! takeovers); the second makes a token issued after the document was deleted
//! by the TTL monitor larger than every token issued before: the deletion
//! happens after `exp`, which is later than the server time of every earlier
//! acquisition. `$$NOW` alone is not a fence: concurrent writes to one document
//! can observe it going backwards by a few milliseconds (MONGODB-FACTS Q3).

pub(crate) mod mongo;

#[cfg(test)]
pub(crate) mod memory;

use std::time::Duration;

use futures::future::BoxFuture;
use uuid::Uuid;

use crate::error::Result;

pub(crate) use mongo::MongoStore;

/// Field names of the lock document.
pub(crate) mod field {
    pub const ID: &str = "_id";
    pub const OWNER: &str = "aid";
    pub const LEASE_ID: &str = "lid";
    pub const TOKEN: &str = "tok";
    pub const RENEWED_AT: &str = "ts";
    pub const EXPIRES_AT: &str = "exp";
}

/// Multiplier of the server time (ms) in a fencing token: tokens issued within
/// one millisecond of server time may grow by up to 2^20 before the time part
/// catches up, far more than one key can be acquired in a millisecond.
pub(crate) const TOKEN_TIME_SHIFT: u32 = 20;

/// The owner id and lease id that identify one acquisition of a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LeaseRef {
    pub key: String,
    pub lease_id: Uuid,
}

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lease is ours, with this fencing token.
    Acquired { token: u64 },
    /// Another acquisition holds the key for at most `remaining` more (server time).
    Held { holder: String, remaining: Duration },
}

/// The lock protocol, as seen by the actor. Every method returns a `'static`
/// future so the actor can run many of them at once without borrowing itself.
///
/// Each operation is idempotent for a given lease id, so the actor may retry
/// it after an ambiguous failure.
pub(crate) trait Store: Send + Sync + 'static {
    /// Takes `key` for `lease_id` if it is free (or already ours under this lease id).
    fn acquire(&self, key: String, lease_id: Uuid) -> BoxFuture<'static, Result<AcquireOutcome>>;

    /// Extends every lease in `leases` by the TTL from the server's now, in as
    /// few commands as the batch allows. Returns the keys that are no longer held.
    fn renew(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<Vec<String>>>;

    /// Releases the given leases (only those still held under their lease id).
    /// Returns how many were still held.
    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>>;

    /// Releases every lease held under this manager's owner id, except those
    /// with a lease id in `except` (acquisitions in flight). Returns how many.
    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>>;
}
