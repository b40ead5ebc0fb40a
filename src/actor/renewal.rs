//! Renewing: the heartbeat's batched renewals of every held lease, their
//! results and retries, and the local deadlines (a min-heap with one entry
//! per held lease, `Actor::deadlines`) that mark a lease lost when no renewal
//! was confirmed in time.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use uuid::Uuid;

use super::command::{Place, PlacedKey};
use super::{Actor, Event, Held, Timer};
use crate::backoff::retry_delay;
use crate::error::{Error, Result};
use crate::random::HashSet;
use crate::status::{LossReason, server_expiry};
use crate::store::LeaseRef;

/// The heartbeat's renewal batches in flight at once; the others wait for
/// it to be answered (a check of leases a write may have taken away goes
/// beside it, [`Actor::spawn_renewals`]). What a batch in flight holds:
/// docs/performance.md, "Memory". With two in flight, 10 000 held leases
/// read up to 1 006 B of RSS each during a renewal; with one, up to 906 B.
/// One at a time
/// renews 100 000 leases about 2 s after the tick (1.4 s two at a time,
/// `benches/scale.rs`), in the same 20 commands, well inside a heartbeat
/// interval.
pub(super) const RENEWALS_IN_FLIGHT: usize = 1;

/// Leases of one place renewed to one TTL in one store call.
pub(super) struct Batch {
    pub(super) place: Place,
    pub(super) leases: Vec<LeaseRef>,
    /// The TTL the batch renews its leases to.
    pub(super) ttl: Duration,
    /// How many times it failed before (the retry's backoff exponent).
    pub(super) attempt: u32,
}

/// Held leases to renew, grouped by place and TTL.
pub(super) type ByTtl = BTreeMap<(Place, Duration), Vec<LeaseRef>>;

/// Adds `held` of `key` to `by_ttl`, counting one more renewal of it in
/// flight, unless it is held at most its TTL (never renewed).
pub(super) fn add_renewal(by_ttl: &mut ByTtl, key: &PlacedKey, held: &mut Held) {
    if !held.renews {
        return;
    }
    held.renewing += 1;
    let lease = held.lease_ref(&key.key);
    by_ttl.entry((key.place, held.ttl)).or_default().push(lease);
}

impl Actor {
    /// Heartbeat: renew every held lease not already being renewed, in
    /// batches of leases with one TTL (one store call per distinct TTL and
    /// batch).
    ///
    /// Each batch is filled in place, its room for at most
    /// `renewal_batch_size` leases allocated once: no list of every held
    /// lease is built first and copied into batches (at 100 000 leases
    /// that list and its copies were several megabytes at each heartbeat,
    /// which the allocator keeps; `benches/memory.rs`).
    pub(super) fn renew_all(&mut self) {
        let size = self.timing.renewal_batch_size;
        // An upper bound of the leases still to add: no batch is given
        // room for more.
        let mut left: usize = self.keys.values().map(|state| state.holders.len()).sum();
        let mut filling: BTreeMap<(Place, Duration), Vec<LeaseRef>> = BTreeMap::new();
        let mut full = Vec::new();
        for (key, state) in &mut self.keys {
            for held in state.holders.iter_mut() {
                left -= 1;
                if held.renewing > 0 || !held.renews {
                    continue;
                }
                held.renewing += 1;
                let group = (key.place, held.ttl);
                let leases = filling
                    .entry(group)
                    .or_insert_with(|| Vec::with_capacity(size.min(left + 1)));
                leases.push(held.lease_ref(&key.key));
                if leases.len() == size {
                    let leases = std::mem::replace(leases, Vec::with_capacity(size.min(left)));
                    full.push((group, leases));
                }
            }
        }
        let partial = filling.into_iter().filter(|(_, leases)| !leases.is_empty());
        for ((place, ttl), leases) in full.into_iter().chain(partial) {
            self.spawn_renewal(Batch {
                place,
                leases,
                ttl,
                attempt: 0,
            });
        }
    }

    /// Checks `by_ttl` (leases a write may have taken away) by renewing
    /// them in one store call per place, distinct TTL and batch: at once
    /// even while a batch of the heartbeat is in flight (up to
    /// [`RENEWALS_IN_FLIGHT`] + 1 calls in flight), so that a lease taken
    /// away is found within a round trip; else before the heartbeat's
    /// batches still waiting.
    pub(super) fn spawn_renewals(&mut self, by_ttl: ByTtl) {
        let mut waiting = Vec::new();
        for ((place, ttl), leases) in by_ttl {
            for batch in leases.chunks(self.timing.renewal_batch_size) {
                let batch = Batch {
                    place,
                    leases: batch.to_vec(),
                    ttl,
                    attempt: 0,
                };
                if self.renewals.len() <= RENEWALS_IN_FLIGHT {
                    self.send_renewal(batch);
                } else {
                    waiting.push(batch);
                }
            }
        }
        for batch in waiting.into_iter().rev() {
            self.renewals_waiting.push_front(batch);
        }
    }

    /// Renews `batch` in one store call: at once while fewer than
    /// [`RENEWALS_IN_FLIGHT`] are in flight, else once one is answered
    /// ([`Actor::send_waiting_renewals`]).
    pub(super) fn spawn_renewal(&mut self, batch: Batch) {
        if self.renewals.len() >= RENEWALS_IN_FLIGHT {
            self.renewals_waiting.push_back(batch);
        } else {
            self.send_renewal(batch);
        }
    }

    /// Sends the waiting renewal batches, oldest first, while fewer than
    /// [`RENEWALS_IN_FLIGHT`] are in flight.
    pub(super) fn send_waiting_renewals(&mut self) {
        while self.renewals.len() < RENEWALS_IN_FLIGHT {
            let Some(batch) = self.renewals_waiting.pop_front() else {
                return;
            };
            self.send_renewal(batch);
        }
    }

    /// Sends the renewal of `batch`, bounded by the heartbeat interval
    /// from now: a renewal that hangs longer is abandoned and retried, so
    /// it cannot hold back the next ones until the lease's deadline.
    fn send_renewal(&mut self, batch: Batch) {
        let sent_at = Instant::now();
        let bound = self.timing.heartbeat_interval;
        let renew = self
            .store(batch.place)
            .renew_with_ttl(batch.leases.clone(), batch.ttl);
        let renew = tokio::time::timeout(bound, renew);
        self.renewals.push(
            async move {
                let result = renew.await.unwrap_or_else(|_elapsed| {
                    Err(Error::Unreachable {
                        waited: bound,
                        reason: "renewal timed out".into(),
                        source: None,
                    })
                });
                Box::new(move |actor: &mut Actor| actor.on_renewal_answered(batch, sent_at, result))
                    as Event
            }
            .boxed(),
        );
    }

    /// The lease `lease` of `place`, if it is still held.
    pub(super) fn held_in(&self, place: Place, lease: &LeaseRef) -> Option<&Held> {
        let key = PlacedKey {
            place,
            key: lease.key.clone(),
        };
        self.held_lease(&key, lease.lease_id)
    }

    /// A renewal batch was answered: its leases
    /// confirmed or lost, the next waiting batch sent, the health board
    /// told.
    pub(super) fn on_renewal_answered(
        &mut self,
        batch: Batch,
        sent_at: Instant,
        result: Result<Vec<LeaseRef>>,
    ) {
        self.renewal_answered(sent_at, result.is_ok());
        self.on_renewed(batch, sent_at, result);
        self.send_waiting_renewals();
        self.renewals_settled();
    }

    /// A failed renewal batch is due again ([`Timer::RenewRetry`]): it is
    /// sent again with the leases of it still held.
    pub(super) fn on_renewal_retry_due(&mut self, mut batch: Batch) {
        let place = batch.place;
        batch.leases.retain(|l| self.held_in(place, l).is_some());
        if !batch.leases.is_empty() {
            self.spawn_renewal(batch);
        }
    }

    fn on_renewed(&mut self, mut batch: Batch, sent_at: Instant, result: Result<Vec<LeaseRef>>) {
        let lost = match result {
            Ok(lost) => lost.into_iter().collect::<HashSet<_>>(),
            Err(error) => {
                // Outcome unknown: renewing again is idempotent and its matched
                // count tells the truth. The local deadline stays where the last
                // confirmed renewal put it.
                let place = batch.place;
                batch.leases.retain(|lease| {
                    let held = self.held_in(place, lease);
                    // Still held until its deadline: its followers hear of it.
                    if let Some(held) = held {
                        held.state.at_risk(&error);
                    }
                    held.is_some()
                });
                let (leases, attempt) = (batch.leases.len(), batch.attempt);
                tracing::warn!(%error, leases, attempt, "renewal failed; retrying");
                if leases > 0 {
                    let delay = retry_delay(
                        attempt,
                        self.timing.retry_initial,
                        self.timing.heartbeat_interval / 2,
                        None,
                    );
                    batch.attempt = attempt.saturating_add(1);
                    self.timers.insert(Timer::RenewRetry(batch), delay);
                }
                return;
            }
        };
        for lease in batch.leases {
            let lost_now = lost.contains(&lease);
            let key = PlacedKey {
                place: batch.place,
                key: lease.key,
            };
            self.confirm_renewal(key, lease.lease_id, (sent_at, batch.ttl), lost_now);
        }
    }

    /// A renewal of `lease_id` of `key` to `ttl`, sent at `sent_at`, was
    /// answered: the lease is lost if `lost_now` (the renewal matched
    /// nothing), else its local deadline moves to the send + the validity
    /// of `ttl` if that is later. Whatever other write of the lease lands
    /// after it, sooner or later, with whatever TTL, leaves the server's
    /// expiry at least there: under one lease id `exp` never moves back
    /// ("Late writes" in `store`).
    pub(super) fn confirm_renewal(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        (sent_at, ttl): (Instant, Duration),
        lost_now: bool,
    ) {
        let now = Instant::now();
        let Some(held) = self
            .keys
            .get_mut(&key)
            .and_then(|state| state.holder_mut(lease_id))
        else {
            return;
        };
        let deadline = sent_at + self.timing.validity_for(ttl);
        held.renewing = held.renewing.saturating_sub(1);
        if lost_now {
            self.lose_found_gone(key, lease_id, "renewal");
        } else if deadline > held.deadline && held.deadline > now {
            // The heap entry is re-armed lazily when it comes due. A
            // renewal confirmed after the deadline passed moves nothing:
            // the lease read lost then (`LeaseStatus::is_lost`), and is.
            held.deadline = deadline;
            let (token, acquired_at) = (held.token, held.acquired_at);
            held.state
                .renewed(deadline, || server_expiry(token, acquired_at, sent_at, ttl));
        }
    }

    /// The earliest entry of the deadline heap came due: the lease it names is
    /// lost if its deadline really passed; if a renewal moved the deadline,
    /// the entry is pushed again at the new one; if the lease is gone, the
    /// entry is dropped. So the heap holds one entry per held lease, and a
    /// renewal costs no heap operation.
    pub(super) fn on_deadline_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((due, _, _))) = self.deadlines.peek() {
            if *due > now {
                break;
            }
            let Reverse((_, key, lease_id)) = self.deadlines.pop().expect("peeked");
            let Some(held) = self.keys.get(&key).and_then(|s| s.holder(lease_id)) else {
                continue;
            };
            if held.deadline > now {
                let deadline = held.deadline;
                self.deadlines.push(Reverse((deadline, key, lease_id)));
                continue;
            }
            self.on_deadline(key, lease_id);
        }
    }

    fn on_deadline(&mut self, key: PlacedKey, lease_id: Uuid) {
        let Some(held) = self.take_held(&key, lease_id, LossReason::Expired) else {
            return;
        };
        let _entered = held.enter_span();
        if held.renews {
            tracing::warn!(
                %key,
                token = held.token,
                "lease lost: renewal not confirmed before the local deadline"
            );
        } else {
            // Never renewed: its end was known from its acquisition.
            tracing::info!(
                %key,
                token = held.token,
                "lease ended: the local deadline of its hold_at_most passed"
            );
        }
        // It may still be ours on the server: free it now rather than at expiry.
        self.spawn_release(key, held.lease_id, held.kind, held.acquired_at, None);
    }
}

/// Sleeps until the earliest local deadline, or forever if no lease is held.
pub(super) async fn sleep_until_deadline(next: Option<&Reverse<(Instant, PlacedKey, Uuid)>>) {
    match next {
        Some(Reverse((deadline, _, _))) => tokio::time::sleep_until(*deadline).await,
        None => std::future::pending().await,
    }
}
