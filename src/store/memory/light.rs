//! The twin's light forms of the acquire and the release, one call per
//! group as `MongoStore`'s (`mongo::acquire`, `mongo::release`): the
//! actor groups the light writes asked for while one of their form is in
//! flight and tries a light form where `MongoStore`'s may apply (its
//! `group_commit`), in the lock collection only
//! ([`LightForms`](crate::store::light_release::LightForms)).
//!
//! **Acquire.**
//! - **The light statement** (`mongo::acquire`'s `light_acquire_update`) on a key:
//!   a new acquisition (the acquire rule's, `Doc::take`: token + 1, `exp =
//!   now + ttl`, no payload, no fairness marks) of a new document, or of
//!   an expired one with no queue, no holders, no permits, no exclusive
//!   waiter's mark (`xw`), not under the request's lease id and not
//!   yielded by this owner; announced as an acquisition. Any other
//!   document, and a foreign holder's lock, unchanged.
//! - **A batch of one** is the light acquire alone (a `findAndModify`):
//!   one call, acquired if the statement applied, else not applied; a
//!   transient failure is not applied too (the general acquire under the
//!   same lease id decides, and recognises a landed write as a retry).
//! - **A batch of more** is two calls, as `MongoStore`'s `update` and
//!   `find`: one applies the statement to each key, the next reads each
//!   key's document (owner id, lease id, token, `exp - now` at that
//!   call's server time), and the shared decision
//!   ([`acquired`](crate::store::light_acquire::acquired)) answers each
//!   request from what it read and the local time from the request's
//!   attempt's start to the second call's issue
//!   ([`elapsed_before_find`](crate::store::light_acquire::elapsed_before_find)).
//!   A failed call leaves
//!   every request to the general acquire. The read is an
//!   [`Op::Acquire`] call too (for the fault plan: it may fail or arrive
//!   late, not read a stale snapshot: the server's `find` reads the
//!   primary's documents).
//!
//! **Release.**
//! - **The light statement** (`mongo::release`'s `light_release_update`) on a
//!   document: if it holds the lease (its `aid` and `lid`) and has no
//!   minimum hold (`hl`), holders nor permits, and either no queue and no
//!   waiting mark (`wt`), or, in the form that hands over, no lock-delay
//!   (`nb`) and a live entry of another owner in its queue, the general
//!   release's rule ([`release_or_hand_over`]: handed to that entry,
//!   announced as its acquisition; else `exp = min(exp, now)`, `lid`
//!   removed, announced as a release); any other document unchanged.
//! - **A batch of one** is the light release alone: one call, sent again
//!   after a transient failure as `MongoStore`'s (`store::retried`);
//!   released if the statement applied, else not applied, and not applied
//!   after a resend that found nothing (`lone_release_answer`).
//! - **A batch of more** is one call that applies the statement to each
//!   lease's document and counts those modified; unless all were, it reads
//!   the documents (in the same call: the twin's read sees no write in
//!   between, a subset of what the server's `find` may see) and decides
//!   with the shared [`release_outcomes`]. A failed call leaves every lease
//!   to the general release, as `MongoStore`'s batch (not "unknown": a
//!   lease the general release no longer finds is reported lost).
//! - Not released, or unknown: the actor sends the general release,
//!   which reports a lease it no longer finds lost (property 7 of
//!   docs/safety.md: a doubt reports a loss, never the reverse).
//!
//! Each acquire call is one [`Op::Acquire`], each release call one
//! [`Op::Release`], for the fault plan and the counters.

use tokio::time::Instant;

use super::control::Op;
use super::db::MemoryDb;
use super::rules::{Collection, release_or_hand_over};
use super::store::MemoryStore;
use crate::error::Error;
use crate::kind::LeaseKind;
use crate::store::LeaseRef;
use crate::store::light_acquire::{Found, acquired};
use crate::store::{
    light_acquire::{LightAcquire, LightAcquired},
    light_release::{LightRelease, Read, lone_release_answer, release_outcomes},
    retried::retried,
};

/// Applies the light acquire statement of `owner` to `request`'s key at
/// `now`; the new token if it applied.
fn light_acquire(
    coll: &mut Collection,
    db: &MemoryDb,
    request: &LightAcquire,
    owner: &str,
    now: Instant,
) -> Option<u64> {
    let key = &request.key;
    if coll.foreign.contains_key(key) {
        return None;
    }
    let had_lease_id = match coll.docs.get(key) {
        None => {
            let vacant = coll.vacant(now);
            coll.docs.insert(key.clone(), vacant);
            None
        }
        Some(doc) => {
            let free = doc.exp <= now
                && doc.queue.is_empty()
                && doc.holders.is_empty()
                && doc.permits.is_none()
                && doc.exclusive_waiter.is_none()
                && doc.lease_id != Some(request.lease_id)
                && !doc.yielded_by(owner, now);
            if !free {
                return None;
            }
            Some(doc.lease_id.is_some())
        }
    };
    let floor = coll.token_floor(now);
    let doc = coll.docs.get_mut(key).expect("present");
    let token = doc.take(owner, request.lease_id, request.ttl, None, (now, floor));
    let ids = (request.lease_id, token);
    db.announce_taken(key, owner, ids, LeaseKind::Exclusive, had_lease_id);
    Some(token)
}

/// Applies the light release statement of `owner` (the form that
/// `hands_over`, or not) to `lease`'s document at `now`; whether it
/// modified it.
fn light_release(
    coll: &mut Collection,
    db: &MemoryDb,
    (lease, owner): (&LeaseRef, &str),
    hands_over: bool,
    now: tokio::time::Instant,
    yield_window: std::time::Duration,
) -> bool {
    let floor = coll.token_floor(now);
    let Some(doc) = coll.docs.get_mut(&lease.key) else {
        return false;
    };
    let ours = doc.owner == owner
        && doc.lease_id == Some(lease.lease_id)
        && doc.hold_until.is_none()
        && doc.holders.is_empty()
        && doc.permits.is_none();
    let nobody_waits = doc.queue.is_empty() && doc.waiting_since.is_none();
    let registered =
        hands_over && doc.not_before.is_none() && doc.live_queue(now).any(|w| w.owner != doc.owner);
    if !ours || !(nobody_waits || registered) {
        return false;
    }
    match release_or_hand_over(doc, (now, floor), yield_window) {
        Some((next, lease_id, token)) => {
            db.announce_acquisition(&lease.key, &next, lease_id, token)
        }
        None => db.announce_release(&lease.key),
    }
    true
}

impl MemoryStore {
    /// The light acquires `requests` (of distinct keys): the light
    /// acquire's own call for one, two calls for more; one answer each, in
    /// order (see the module docs).
    pub(super) async fn light_acquires(self, requests: Vec<LightAcquire>) -> Vec<LightAcquired> {
        match <[LightAcquire; 1]>::try_from(requests) {
            Ok([request]) => vec![self.acquire_light_alone(request).await],
            Err(requests) => self.acquire_light_batch(requests).await,
        }
    }

    /// The light acquire's own call for `request`.
    async fn acquire_light_alone(&self, request: LightAcquire) -> LightAcquired {
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let keys = vec![request.key.clone()];
        let call = self.run(Op::Acquire, keys, move |coll, now| {
            Ok(light_acquire(coll, &db, &request, &owner, now))
        });
        match call.await {
            Ok(Some(token)) => LightAcquired::Acquired(token),
            Ok(None) => LightAcquired::NotApplied,
            Err(e) if e.is_transient() => LightAcquired::NotApplied,
            Err(e) => LightAcquired::Failed(e),
        }
    }

    /// The light acquires `requests` (of distinct keys) in two calls (see
    /// the module docs); one answer each, in order.
    async fn acquire_light_batch(&self, requests: Vec<LightAcquire>) -> Vec<LightAcquired> {
        let not_applied = |n: usize| (0..n).map(|_| LightAcquired::NotApplied).collect();
        let n = requests.len();
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let keys: Vec<_> = requests.iter().map(|r| r.key.clone()).collect();
        let update = self.run(Op::Acquire, keys.clone(), {
            let requests = requests.clone();
            move |coll, now| {
                for request in &requests {
                    light_acquire(coll, &db, request, &owner, now);
                }
                Ok(())
            }
        });
        if update.await.is_err() {
            return not_applied(n);
        }
        let find_sent = Instant::now();
        let owner = self.owner.clone();
        let find = self.run(Op::Acquire, keys, move |coll, now| {
            Ok::<_, Error>(
                requests
                    .iter()
                    .map(|request| {
                        let found = coll.docs.get(&request.key).map(|doc| Found {
                            owner: Some(doc.owner.as_str()),
                            lease_id: doc.lease_id,
                            token: doc.token,
                            left_ms: millis_between(now, doc.exp),
                        });
                        let found = found.filter(|_| !coll.foreign.contains_key(&request.key));
                        acquired(found, request, &owner, find_sent)
                    })
                    .collect::<Vec<_>>(),
            )
        });
        find.await.unwrap_or_else(|_| not_applied(n))
    }

    /// The light releases of `leases` (exclusive, of distinct keys): the
    /// light release's own call for one, one call for more; one answer
    /// each, in order (see the module docs).
    pub(super) async fn light_releases(
        self,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    ) -> Vec<LightRelease> {
        match <[LeaseRef; 1]>::try_from(leases) {
            Ok([lease]) => vec![self.release_light_alone(lease, hands_over).await],
            Err(leases) => self.release_light_batch(leases, hands_over).await,
        }
    }

    /// The light release's own call for `lease`, sent again after a
    /// transient failure, as `MongoStore`'s.
    async fn release_light_alone(&self, lease: LeaseRef, hands_over: bool) -> LightRelease {
        let yield_window = self.yield_window;
        let call = || {
            let (db, owner, lease) = (self.db.clone(), self.owner.clone(), lease.clone());
            let call = self.run(Op::Release, vec![lease.key.clone()], move |coll, now| {
                let lease = (&lease, owner.as_str());
                Ok(light_release(
                    coll,
                    &db,
                    lease,
                    hands_over,
                    now,
                    yield_window,
                ))
            });
            async move { call.await.map(u64::from) }
        };
        lone_release_answer(retried("release", call).await)
    }

    /// The light releases of `leases` (of distinct keys) in one call (see
    /// the module docs); one answer each, in order.
    async fn release_light_batch(
        &self,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    ) -> Vec<LightRelease> {
        let n = leases.len();
        let all = |outcome: fn() -> LightRelease| (0..n).map(|_| outcome()).collect();
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        let call = self.run(Op::Release, keys, move |coll, now| {
            let modified = leases
                .iter()
                .filter(|lease| {
                    let lease = (*lease, owner.as_str());
                    light_release(coll, &db, lease, hands_over, now, yield_window)
                })
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

/// `to - from` in whole milliseconds, as the server's dates (rounded down:
/// negative once `to` is before `from`).
fn millis_between(from: Instant, to: Instant) -> i64 {
    if to >= from {
        (to - from).as_millis() as i64
    } else {
        -((from - to).as_nanos().div_ceil(1_000_000) as i64)
    }
}
