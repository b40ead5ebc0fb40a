//! The twin's light release of one exclusive lease, grouped as by
//! `MongoStore` (`mongo::light`, `mongo::light::batched`): releases of
//! string keys asked for while one light release of this store is in
//! flight queue in a [`Batcher`] and go together once it returns.
//!
//! - It applies where `MongoStore`'s does: one lease, a release that does
//!   not delete first (keep mode, or delete mode's `release_young`), in the
//!   lock collection, not a lease of a shared or semaphore key (its
//!   [`LeaseRef::kind`]), not a key [`Contended`] lately: one whose exclusive
//!   acquire by this store was not a new acquisition (`MongoStore`'s
//!   light acquire did not apply: a retry, a held key, a minimum hold,
//!   an error), whose handoff did not acquire, or whose light release did
//!   not release.
//! - **The light statement** (`mongo::light`'s `release_update`) on a
//!   document: if it holds the lease (its `aid` and `lid`) and has no
//!   queue, no waiting mark (`wt`), no minimum hold (`hl`), no holders and
//!   no permits, the release rule ([`release_doc`]: `exp = min(exp, now)`,
//!   `lid` removed), announced as a release; any other document unchanged.
//! - **A batch of one** is the light release alone: one call, released if
//!   the statement applied, else not applied; a failed call is the
//!   release's error (the twin does not model `MongoStore`'s retries of
//!   its own command, see the module docs of `memory`).
//! - **A batch of more** is one call that applies the statement to each
//!   lease's document and counts those modified; unless all were, it reads
//!   the documents (in the same call: the twin's read sees no write in
//!   between, a subset of what the server's `find` may see) and decides
//!   with the shared [`release_outcomes`]. A failed call leaves every lease
//!   to the general release, as `MongoStore`'s batch (not "unknown": a
//!   lease the general release no longer finds is reported lost).
//! - Not released, or unknown: the general release follows, and a lease
//!   it no longer finds after an unknown outcome counts as released, as in
//!   `MongoStore::release_light`.
//!
//! Each call is one [`Op::Release`] for the fault plan and the counters.

use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;

use super::control::Op;
use super::db::{MemoryDb, lock};
use super::rules::{Collection, release_doc};
use super::store::MemoryStore;
use crate::config::ReleaseMode;
use crate::error::Result;
use crate::key::LeaseKey;
use crate::random::HashMap;
use crate::store::light_release::{CONTENDED_FOR, LightRelease, Read, release_outcomes};
use crate::store::{AcquireOutcome, LeaseRef};

/// The keys whose writes go to the general release for
/// [`CONTENDED_FOR`] (tokio's clock), as `MongoStore`'s `Contended`
/// (shared by a store's clones).
#[derive(Clone, Default)]
pub(super) struct Contended(Arc<Mutex<HashMap<LeaseKey, Instant>>>);

impl Contended {
    /// Whether `key` was remembered within [`CONTENDED_FOR`].
    pub(super) fn contains(&self, key: &LeaseKey) -> bool {
        lock(&self.0)
            .get(key)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    /// Remembers `key` now.
    pub(super) fn insert(&self, key: &LeaseKey) {
        let mut keys = lock(&self.0);
        keys.retain(|_, at| at.elapsed() < CONTENDED_FOR);
        keys.insert(key.clone(), Instant::now());
    }
}

/// Applies the light release statement of `owner` to `lease`'s document
/// at `now`; whether it modified it.
fn light_release(
    coll: &mut Collection,
    db: &MemoryDb,
    lease: &LeaseRef,
    owner: &str,
    now: tokio::time::Instant,
    yield_window: std::time::Duration,
) -> bool {
    let Some(doc) = coll.docs.get_mut(&lease.key) else {
        return false;
    };
    let applies = doc.owner == owner
        && doc.lease_id == Some(lease.lease_id)
        && doc.queue.is_empty()
        && doc.waiting_since.is_none()
        && doc.hold_until.is_none()
        && doc.holders.is_empty()
        && doc.permits.is_none();
    if applies {
        release_doc(doc, now, yield_window);
        db.announce_release(&lease.key);
    }
    applies
}

impl MemoryStore {
    /// The lease of `leases` whose release in `mode` goes by the light form
    /// first (see the module docs), if any.
    pub(super) fn light_release_of<'a>(
        &self,
        leases: &'a [LeaseRef],
        mode: ReleaseMode,
    ) -> Option<&'a LeaseRef> {
        match leases {
            [lease]
                if mode == ReleaseMode::Keep
                    && self.place.is_none()
                    && !lease.kind.is_multi_holder()
                    && !self.contended.contains(&lease.key) =>
            {
                Some(lease)
            }
            _ => None,
        }
    }

    /// Remembers `key` as [`Contended`] after an exclusive acquire by this
    /// store (of a `plain` lease: no minimum hold) that was not a new
    /// acquisition: `outcome` and whether it was a retry under the same
    /// lease id, `None` after an error. There `MongoStore`'s light acquire
    /// did not apply and its general acquire was sent.
    pub(super) fn note_acquire(
        &self,
        key: &LeaseKey,
        outcome: Option<(&AcquireOutcome, bool)>,
        plain: bool,
    ) {
        let new = matches!(outcome, Some((AcquireOutcome::Acquired { .. }, false)));
        if !(new && plain) {
            self.contended.insert(key);
        }
    }

    /// The release of `lease` by its light form, grouped with others if its
    /// key is a string, then by the general form if it did not release it:
    /// the count of leases released, as `MongoStore::release_light`.
    pub(super) fn release_light(&self, lease: LeaseRef) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            let retried = match store.release_light_grouped(&lease).await {
                LightRelease::Released => return Ok(1),
                LightRelease::NotApplied => false,
                LightRelease::Unknown => true,
                LightRelease::Failed(e) => return Err(e),
            };
            store.contended.insert(&lease.key);
            let count = store
                .release_general(vec![lease], ReleaseMode::Keep)
                .await?;
            // A light write whose outcome was unknown may have landed.
            Ok(if retried { count.max(1) } else { count })
        }
        .boxed()
    }

    /// The light release of `lease`, in this store's group commit if its
    /// key is a string.
    async fn release_light_grouped(&self, lease: &LeaseRef) -> LightRelease {
        if lease.key.as_str().is_none() {
            return self.release_light_alone(lease.clone()).await;
        }
        let store = self.clone();
        let send = move |leases: Vec<LeaseRef>| {
            let store = store.clone();
            async move {
                match <[LeaseRef; 1]>::try_from(leases) {
                    Ok([lease]) => vec![store.release_light_alone(lease).await],
                    Err(leases) => store.release_light_batch(leases).await,
                }
            }
        };
        self.light_releases.submit(lease.clone(), send).await
    }

    /// The light release's own call for `lease`.
    async fn release_light_alone(&self, lease: LeaseRef) -> LightRelease {
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        let call = self.run(Op::Release, vec![lease.key.clone()], move |coll, now| {
            Ok(light_release(coll, &db, &lease, &owner, now, yield_window))
        });
        match call.await {
            Ok(true) => LightRelease::Released,
            Ok(false) => LightRelease::NotApplied,
            Err(e) => LightRelease::Failed(e),
        }
    }

    /// The light releases of `leases` (of distinct keys) in one call (see
    /// the module docs); one answer each, in order.
    async fn release_light_batch(&self, leases: Vec<LeaseRef>) -> Vec<LightRelease> {
        let n = leases.len();
        let all = |outcome: fn() -> LightRelease| (0..n).map(|_| outcome()).collect();
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        let call = self.run(Op::Release, keys, move |coll, now| {
            let modified = leases
                .iter()
                .filter(|lease| light_release(coll, &db, lease, &owner, now, yield_window))
                .count() as u64;
            if modified == leases.len() as u64 {
                return Ok(None);
            }
            let read: Vec<Read> = leases
                .iter()
                .map(|lease| match coll.docs.get(&lease.key) {
                    Some(doc) if doc.lease_id == Some(lease.lease_id) => Read::Kept,
                    _ => Read::Gone,
                })
                .collect();
            Ok(Some((read, modified)))
        });
        match call.await {
            Ok(None) => all(|| LightRelease::Released),
            Ok(Some((read, modified))) => release_outcomes(read, modified),
            // Not known to have released: left to the general release.
            Err(_) => all(|| LightRelease::NotApplied),
        }
    }
}
