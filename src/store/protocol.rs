//! The [`Store`] trait: the lock protocol as the actor sees it; the methods
//! cite the sections of docs/protocol.md that specify them by title.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mongodb::bson::Document;

use super::{
    AcquireOutcome, AcquireRequest, Announced, Announcement, DocumentWrite, Handoff,
    HandoffOutcome, LeaseRef, Release, Released, StoreProfile,
};
use super::{
    light_acquire::{LightAcquire, LightAcquired},
    light_release::LightRelease,
};
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::PermitsChange;

/// The lock protocol, as seen by the actor. Every method returns a `'static`
/// future so the actor can run many of them at once without borrowing itself.
///
/// Each operation is idempotent for a given lease id, so the actor may retry
/// it after an ambiguous failure.
pub(crate) trait Store: Send + Sync + 'static {
    /// What this store is: where its locks live and the settings the
    /// actor plans with ([`StoreProfile`]), fixed when it was made. The
    /// actor reads it once, when it takes the store on.
    fn profile(&self) -> StoreProfile;

    /// The light acquires `requests` (of distinct keys, at most
    /// [`MOST_PER_COMMAND`](super::light_release::MOST_PER_COMMAND)): one
    /// command for one, one batch for more; one answer each, in order (a
    /// batch decided by
    /// [`light_acquire::acquired`](super::light_acquire::acquired)). A
    /// request neither [`LightAcquired::Acquired`] nor
    /// [`LightAcquired::AcquiredShort`] goes on to the general
    /// acquire under the same lease id. The default (a store without the
    /// light acquire): none applied, nothing sent.
    fn acquire_light(&self, requests: Vec<LightAcquire>) -> BoxFuture<'static, Vec<LightAcquired>> {
        let answers = requests.iter().map(|_| LightAcquired::NotApplied).collect();
        Box::pin(futures::future::ready(answers))
    }

    /// The light releases of `leases` (exclusive leases of distinct keys,
    /// at most [`MOST_PER_COMMAND`](super::light_release::MOST_PER_COMMAND)):
    /// one command for one, one batch for more; one answer each, in order
    /// (a batch decided by
    /// [`release_outcomes`](super::light_release::release_outcomes)). A
    /// lease not [`LightRelease::Released`] goes on to the general
    /// [`Store::release`]. With `hands_over`, the form that also hands a
    /// key to the first registered owner of another manager, as the
    /// general release would; without, the form that applies only where
    /// nobody waits, lighter for the server to parse ("Light forms" in
    /// `store`). The default (a store without the light release): none
    /// applied, nothing sent.
    fn release_light(
        &self,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    ) -> BoxFuture<'static, Vec<LightRelease>> {
        let _ = hands_over;
        let answers = leases.iter().map(|_| LightRelease::NotApplied).collect();
        Box::pin(futures::future::ready(answers))
    }

    /// One acquire attempt of the general form (see "Document schema" to
    /// "Queue of waiting owners"), expiring `request.ttl` after the server's
    /// now. A key yielded by this owner is reported `Held`
    /// by this owner until the end of the yield window. Also returns the
    /// document as the acquire left it (in-document leases: the user's
    /// document, lock field included; `None` in the lock collection). In-document
    /// leases refuse any shape but a plain one with
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    fn acquire(
        &self,
        request: AcquireRequest,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>>;

    /// Extends every lease in `leases` to `ttl` from the server's now
    /// (`exp = $$NOW + ttl`), in as few commands as the batch allows (one
    /// `updateMany` on MongoDB, whatever the leases' kinds): the caller
    /// groups leases by TTL. Returns the leases that are no longer held
    /// (several leases of one key, e.g. two permits of a semaphore, are
    /// told apart by lease id).
    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseRef>>>;

    /// Releases what `release` selects, each selection by its own wire
    /// form, chosen by the caller ([`Release`]: these leases of this
    /// manager, one too young for delete mode's delete, delete mode's
    /// follow-up delete, an operator's override of an owner's leases or of
    /// a key).
    fn release(&self, release: Release) -> BoxFuture<'static, Result<Released>>;

    /// Releases the lease `handoff.from` of `handoff.key` and, in the same
    /// write, makes `handoff.to` (a local waiter's acquisition of a plain
    /// lease) its holder, as "Handoff to a local waiter" says, by the
    /// form the actor chose ([`Handoff::light`]); only for plain
    /// leases of the lock collection, which the actor alone hands over. The
    /// default (a store that has no handoff): refused.
    fn handoff(&self, handoff: Handoff) -> BoxFuture<'static, Result<HandoffOutcome>> {
        let reason = format!("no handoff of {} here", handoff.key);
        Box::pin(futures::future::ready(Err(
            crate::error::Error::Unsupported { reason },
        )))
    }

    /// Removes this manager's entries from the queues of waiting owners of
    /// `keys` ("Queue of waiting owners"), so that no release hands one of
    /// them to it any more (shutdown: a manager that stops waiting must not
    /// be handed a key it would hold, unconfirmed, until the handed lease
    /// expires). Returns how many documents it changed. The default (a
    /// store whose waiters never register) changes nothing.
    fn leave_queues(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        let _ = keys;
        Box::pin(async { Ok(0) })
    }

    /// Reads `key` with the server's now. `Ok(None)` if it has no document;
    /// a document of foreign layout (a bare `{_id}` too) is a lock held by a
    /// foreign holder ([`LeaseInfo::foreign`]).
    fn inspect(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>>;

    /// The leases among the next `limit` lock documents with keys greater
    /// than `after`, in key order (documents of foreign layout are foreign
    /// holders' locks, [`LeaseInfo::foreign`]),
    /// and the last key scanned if there may be more.
    fn list(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>>;

    /// Changes the number of permits (`pm`) of the semaphore key `key` to
    /// `permits`, only if its live holders take no more than that, in one
    /// conditional write that also sets `rl` (announced, so that waiters
    /// try again at once); see "Shared and semaphore keys". A key without
    /// live holders is left as it is
    /// ([`PermitsChange::NothingHeld`](crate::PermitsChange::NothingHeld));
    /// a key held as another kind is
    /// [`Error::KindMismatch`](crate::Error::KindMismatch). The lock
    /// collection only: by default
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    fn set_permits(
        &self,
        key: LeaseKey,
        permits: u32,
    ) -> BoxFuture<'static, Result<PermitsChange>> {
        let reason = format!(
            "set_permits of {key} is not available here: semaphores live in the lock collection"
        );
        let _ = permits;
        Box::pin(futures::future::ready(Err(
            crate::error::Error::Unsupported { reason },
        )))
    }

    /// Asks the holders of `key` to release it ("Revocation"): writes `rv
    /// = {aid: this owner, at: $$NOW}` if a lease of our layout holds it
    /// now, changing no lease field. `Ok(false)` if nothing holds it. The
    /// default (a store without revocation): `Ok(false)`, nothing sent.
    fn request_release(&self, key: LeaseKey) -> BoxFuture<'static, Result<bool>> {
        let _ = key;
        Box::pin(futures::future::ready(Ok(false)))
    }

    /// The requests on `keys` ("Revocation"): each key with `rv`, and the
    /// owner id that asked; read when a change stream of writes opens,
    /// since the writes before it are not announced. The default: none.
    fn revocations(
        &self,
        keys: Vec<LeaseKey>,
    ) -> BoxFuture<'static, Result<Vec<(LeaseKey, String)>>> {
        let _ = keys;
        Box::pin(futures::future::ready(Ok(Vec::new())))
    }

    /// Sets the payload of `lease` if it is still held under its lease id.
    /// `Ok(false)` if it is not.
    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>>;

    /// The states of `key`, starting with the current one, then every change
    /// in order; `None` while the key has no document. Transient errors are
    /// retried inside; a permanent error is the last item.
    fn observe(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>>;

    /// Writes to lock documents that may change who holds them, by any
    /// owner, for waking local waiters at once instead of at their next poll
    /// and for noticing at once a held lease taken away by someone else's
    /// write: deletes, inserts, replacements, updates that set or remove
    /// `lid` or `aid`, and releases of holders of shared or semaphore keys
    /// (`rl` set); never renewals, payload writes, waiting marks (`wt`,
    /// `xw`) or a holder's acquisition beside others (`hs` changed without
    /// `rl`). With [`Announced::Waits`], of those only the writes that
    /// may free a key or make this owner its holder, and revocation
    /// requests ([`Announcement::is_announced`]); in-document places
    /// (no queue, no handoff) announce the same writes either way.
    /// Starts with [`Announcement::Opened`] once the stream is open.
    /// Expiries are not reported (no write happens). Best effort: the
    /// stream ends, or yields an error, when the deployment has no change
    /// streams or the stream broke; the actor then keeps polling.
    fn watch_releases(&self, announced: Announced) -> BoxStream<'static, Result<Announcement>>;

    /// A store for in-document leases on `collection` (same database, same
    /// owner id, TTL and timeouts as this one), with the lock fields under
    /// `field`, and with `lock_id` the lease id and last renewal also in
    /// top-level `LockId` / `LockTime` fields that other clients lock the
    /// documents with ([`LockIdFields`](crate::LockIdFields)). Sends nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an empty or
    /// invalid collection or field name, or a store that has no database
    /// (the in-memory twin).
    fn documents(
        &self,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<crate::lock_id_fields::LockIdFields>>,
    ) -> Result<Arc<dyn Store>> {
        let _ = (collection, field, lock_id);
        Err(crate::error::Error::InvalidConfig {
            reason: "in-document leases need a MongoDB store".into(),
        })
    }

    /// Applies `write.update` to the document of `lease` if the lease is
    /// still held under its lease id and owner id by the server's clock, in
    /// one conditional write, releasing it too if `write.release`. Returns
    /// the document after the write (lock field included), or `Ok(None)`
    /// if the lease was not held: then nothing was written. `token` is the
    /// lease's fencing token.
    fn write_document(
        &self,
        lease: LeaseRef,
        token: u64,
        write: DocumentWrite,
    ) -> BoxFuture<'static, Result<Option<Document>>> {
        let _ = (lease, token, write);
        Box::pin(async {
            Err(crate::error::Error::InvalidConfig {
                reason: "not an in-document lease".into(),
            })
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
