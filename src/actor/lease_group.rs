//! Leases acquired together (`LeaseManager::acquire_all`): the loss of one
//! is the loss of all, as docs/multi-key.md says. Once a group's leases are
//! all granted, the handle binds them (`Command::BindGroup`): each one's
//! `Binding` keeps the group's members, and the group lives in this actor
//! only.

use std::sync::Arc;

use uuid::Uuid;

use super::Actor;
use super::command::{PlacedKey, Reply};
use crate::status::LossReason;

/// The members of a group: each lease's key and lease id.
pub(super) type Group = Arc<[(PlacedKey, Uuid)]>;

impl Actor {
    /// Binds `members` into one group if every one of them is still held
    /// here; answers whether they were (nothing is bound otherwise, and the
    /// handle gives them back).
    pub(super) fn on_bind_group(
        &mut self,
        members: Vec<(PlacedKey, Uuid)>,
        respond_to: Reply<bool>,
    ) {
        let all_held = members
            .iter()
            .all(|(key, lease_id)| self.held_lease(key, *lease_id).is_some());
        if all_held {
            let group: Group = members.into();
            for (_, lease_id) in group.iter() {
                self.bindings.entry(*lease_id).or_default().group = Some(group.clone());
            }
        }
        let _ = respond_to.send(Ok(all_held));
    }

    /// A member of `group`, on `lost`, ended for `reason`: if its holder did
    /// not end it, every other member still held ends too, and is released.
    pub(super) fn end_group(&mut self, group: &Group, lost: &PlacedKey, reason: &LossReason) {
        if !ends_group(reason) {
            return;
        }
        for (key, lease_id) in group.iter().filter(|(key, _)| key != lost) {
            let reason = LossReason::GroupLost {
                key: lost.key.clone(),
                reason: Box::new(reason.clone()),
            };
            let Some(held) = self.take_held(key, *lease_id, reason) else {
                continue;
            };
            tracing::warn!(%key, token = held.token, lost = %lost, "lease ended with its group: releasing it");
            self.spawn_release(
                key.clone(),
                held.lease_id,
                held.kind,
                held.acquired_at,
                None,
            );
        }
    }
}

/// Whether a member's end for `reason` ends its group: an end its holder
/// did not choose, other than its group's (which the first one decided).
fn ends_group(reason: &LossReason) -> bool {
    reason.is_involuntary() && !matches!(reason, LossReason::GroupLost { .. })
}
