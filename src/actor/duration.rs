//! Duration control: a held lease's TTL changed by a renewal to the new TTL
//! at once (`Lease::set_ttl`). A lease held at most a duration
//! (`Acquire::hold_at_most`, `Held::renews` false) is left out of
//! every renewal (`renewal::add_renewal`) and ends at its local deadline.

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::Actor;
use super::command::{PlacedKey, Reply};
use crate::error::{Error, Result};
use crate::store::LeaseRef;

impl Actor {
    /// Renews the lease `lease_id` of `key` at once to `ttl` (one renewal
    /// of that lease, `exp = max(exp, $$NOW + ttl)`), which the heartbeat
    /// uses from now on; the caller is answered once the server confirmed
    /// it, and the local deadline then counts from its send with `ttl`.
    ///
    /// A longer or a shorter TTL is the lease's at once: under one lease id
    /// the server's expiry never moves back, so a renewal of the old TTL
    /// that lands after this one (or this one, landing after later ones)
    /// cuts nothing a confirmed write gave, and each confirmed write's
    /// deadline holds ("Late writes" in `store`). A shorter TTL therefore
    /// does not bring the deadline forward: the lease stays as long as
    /// its last confirmed write gave it, then renews to the new TTL. The
    /// heartbeat skips a lease while a renewal of it is in flight.
    pub(super) fn on_set_ttl(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        ttl: Duration,
        respond_to: Reply<()>,
    ) {
        let top = self.profile(key.place).lock_id_fields.clone();
        if let Err(error) = self
            .timing
            .renewed_ttl(ttl)
            .and_then(|_| top.map_or(Ok(()), |fields| fields.check_ttl(ttl)))
        {
            let _ = respond_to.send(Err(error));
            return;
        }
        let now = Instant::now();
        let Some(held) = self
            .keys
            .get_mut(&key)
            .and_then(|state| state.holder_mut(lease_id))
            .filter(|held| held.deadline > now)
        else {
            let _ = respond_to.send(Err(Error::LeaseLost { key: key.key }));
            return;
        };
        if !held.renews {
            let _ = respond_to.send(Err(Error::InvalidConfig {
                reason: "the lease was acquired with hold_at_most: it is never renewed, \
                         and its TTL cannot change"
                    .into(),
            }));
            return;
        }
        held.renewing += 1;
        held.ttl = ttl;
        let lease: LeaseRef = held.lease_ref(&key.key);
        let renew = self.store(key.place).renew_with_ttl(vec![lease], ttl);
        let bound = self.timing.heartbeat_interval;
        let renew = async move {
            tokio::time::timeout(bound, renew)
                .await
                .unwrap_or_else(|_elapsed| {
                    Err(Error::Unreachable {
                        waited: bound,
                        reason: "renewal to a new TTL timed out".into(),
                        source: None,
                    })
                })
        };
        self.spawn_store(Box::pin(renew), move |actor, result| {
            actor.on_ttl_set(key, lease_id, (ttl, now), respond_to, result)
        });
    }

    /// The renewal of [`Actor::on_set_ttl`] was answered: confirmed, it
    /// moves the deadline as a heartbeat's renewal does and answers `Ok`;
    /// matching nothing, the lease is lost; failed, the caller gets the
    /// error and the heartbeat renews the lease to the new TTL.
    pub(super) fn on_ttl_set(
        &mut self,
        key: PlacedKey,
        lease_id: Uuid,
        (ttl, sent_at): (Duration, Instant),
        respond_to: Reply<()>,
        result: Result<Vec<LeaseRef>>,
    ) {
        let answer = match result {
            Ok(lost) => {
                let lost_now = !lost.is_empty();
                let gone = Error::LeaseLost {
                    key: key.key.clone(),
                };
                self.confirm_renewal(key.clone(), lease_id, (sent_at, ttl), lost_now);
                // Confirmed after the deadline passed: the lease reads lost.
                let held = self.held_lease(&key, lease_id);
                match held.filter(|held| held.deadline > Instant::now()) {
                    Some(_) if !lost_now => Ok(()),
                    _ => Err(gone),
                }
            }
            Err(error) => {
                // Its outcome is unknown, and it may still land: harmless
                // whenever it does. The heartbeat renews to the new TTL.
                if let Some(held) = self
                    .keys
                    .get_mut(&key)
                    .and_then(|state| state.holder_mut(lease_id))
                {
                    held.renewing = held.renewing.saturating_sub(1);
                    held.state.at_risk(&error);
                }
                Err(error)
            }
        };
        let _ = respond_to.send(answer);
    }
}
