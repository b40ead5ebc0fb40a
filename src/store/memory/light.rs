//! The twin's light release of exclusive leases, one call per group as
//! `MongoStore`'s (`mongo::release`): the actor
//! groups the releases asked for while one is in flight and tries the
//! light form where `MongoStore`'s may apply (its `group_commit`), in the
//! lock collection only ([`LightForms`](crate::store::light_release::LightForms)).
//! - **The light statement** (`mongo::release`'s `light_release_update`) on a
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
//! - Not released, or unknown: the actor sends the general release, and
//!   counts a lease it no longer finds after an unknown outcome as
//!   released.
//!
//! Each call is one [`Op::Release`] for the fault plan and the counters.

use super::control::Op;
use super::db::MemoryDb;
use super::rules::{Collection, release_doc};
use super::store::MemoryStore;
use crate::store::LeaseRef;
use crate::store::light_release::{LightRelease, Read, release_outcomes};

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
    /// The light releases of `leases` (exclusive, of distinct keys): the
    /// light release's own call for one, one call for more; one answer
    /// each, in order (see the module docs).
    pub(super) async fn light_releases(&self, leases: Vec<LeaseRef>) -> Vec<LightRelease> {
        match <[LeaseRef; 1]>::try_from(leases) {
            Ok([lease]) => vec![self.release_light_alone(lease).await],
            Err(leases) => self.release_light_batch(leases).await,
        }
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
