//! Why a lease was lost, when the server tells only that it is gone.
//!
//! Where the actor ends a lease itself, it knows why: a release, a drop, a
//! commit or `release_all` ([`LossReason::Released`]), shutdown
//! ([`LossReason::Shutdown`]), this manager's force release
//! ([`LossReason::ForceReleased`]), a local deadline that passed
//! ([`LossReason::Expired`]). When a write under the lease (a renewal, a
//! payload write, an in-document write) finds it no longer held, the
//! server says only that: nothing matched. The actor then reads the key
//! once ([`Store::inspect`](crate::store::Store::inspect)) and ends the
//! lease with the reason that read shows ([`judge`]); the token fires when
//! the read is answered, one round trip after the write's answer, with the
//! reason already recorded. Meanwhile the lease is not renewed again (it
//! counts as being renewed), and its local deadline still applies: if it
//! comes first, the lease ends [`LossReason::Expired`] then. A failed read
//! ends it [`LossReason::Expired`] too. An event never settles the reason
//! ("An event never decides a loss by itself" in ARCHITECTURE.md).

use uuid::Uuid;

use super::Actor;
use super::command::PlacedKey;
use crate::info::LeaseInfo;
use crate::kind::LeaseKind;
use crate::status::LossReason;

impl Actor {
    /// The server no longer holds lease `lease_id` of `key` (`write`, a
    /// write under it, matched nothing): reads the key once, then ends the
    /// lease with the reason the read shows ([`Actor::on_loss_judged`]).
    /// Nothing if the lease is not held any more.
    pub(super) fn lose_found_gone(&mut self, key: PlacedKey, lease_id: Uuid, write: &str) {
        let owner_id = self.owner_id.clone();
        let Some(held) = self
            .keys
            .get_mut(&key)
            .and_then(|state| state.holder_mut(lease_id))
        else {
            return;
        };
        let (token, kind) = (held.token, held.kind);
        tracing::debug!(%key, token, "{write} found the lease gone or taken: reading why");
        // No heartbeat renews it while its verdict is read.
        held.renewing += 1;
        let read = self.store(key.place).inspect(key.key.clone());
        self.spawn_store(read, move |actor, result| {
            let reason = match result {
                Ok(info) => judge(info.as_ref(), &owner_id, token, kind),
                Err(error) => {
                    tracing::debug!(%error, "reading a lost lease's key failed");
                    LossReason::Expired
                }
            };
            actor.on_loss_judged(key, lease_id, reason)
        });
    }

    /// The read of [`Actor::lose_found_gone`] was answered: the lease ends
    /// for `reason` (unless it already ended, e.g. at its local deadline),
    /// and the key's next waiter is served.
    pub(super) fn on_loss_judged(&mut self, key: PlacedKey, lease_id: Uuid, reason: LossReason) {
        let Some(held) = self.take_held(&key, lease_id, reason.clone()) else {
            return;
        };
        tracing::warn!(%key, token = held.token, %reason, "lease lost: the server no longer holds it");
        self.serve_next(&key);
    }
}

/// Why a lease of `owner_id` with fencing token `token` and kind `kind` is
/// no longer held, from its key as read after the server said so:
///
/// - no document (or, for an in-document lease, no lock field):
///   [`LossReason::Deleted`];
/// - a foreign holder's lock, or another acquisition (another fencing token,
///   or another owner id): [`LossReason::Taken`] with the owner id and token
///   read (for a holder of a shared or semaphore key, only a live holder of
///   another kind counts);
/// - still this acquisition's document, without its lease id (`lid`): released
///   by someone else, since this manager did not (a force release or a
///   release by owner id, of this manager when it did not hold the lease
///   locally any more, or of another): [`LossReason::ForceReleased`] (in
///   delete mode a release by owner id may delete the document instead:
///   [`LossReason::Deleted`]);
/// - otherwise (it expired on the server, which keeps `lid`, or a holder's
///   entry of a shared or semaphore key is gone): [`LossReason::Expired`].
///   (A renewal does not check `exp`, so an exclusive lease that expired on
///   the server is found lost only once someone took it: `Taken`.)
pub(crate) fn judge(
    info: Option<&LeaseInfo>,
    owner_id: &str,
    token: u64,
    kind: LeaseKind,
) -> LossReason {
    let Some(info) = info else {
        return LossReason::Deleted;
    };
    let taken = || LossReason::Taken {
        owner_id: info.owner_id.clone(),
        fencing_token: info.fencing_token,
    };
    if info.foreign {
        return taken();
    }
    if kind.is_multi_holder() {
        return if info.held && info.kind != kind && info.fencing_token != token {
            taken()
        } else {
            LossReason::Expired
        };
    }
    if info.fencing_token != token || info.owner_id != owner_id {
        return taken();
    }
    if info.released {
        LossReason::ForceReleased
    } else {
        LossReason::Expired
    }
}

#[cfg(test)]
mod tests;
