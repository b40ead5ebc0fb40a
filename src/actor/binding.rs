//! What a held lease is bound to beyond itself, for the few that are: its
//! named holder and its re-entries (`reentry.rs`), its group
//! (`lease_group.rs`). Kept in `Actor::bindings` by lease id rather than in
//! `Held`, so that a lease bound to nothing costs nothing more; an entry goes with
//! its lease (`Actor::take_held`, `Actor::take_all_held`).

use super::lease_group::Group;
use crate::caller::CallerId;

/// One held lease's binding.
#[derive(Default)]
pub(super) struct Binding {
    /// The holder it was acquired for, if named.
    pub(super) holder: Option<CallerId>,
    /// Its entries besides the first, not released yet: the lease is
    /// released with its last entry.
    pub(super) reentries: u32,
    /// The leases it was acquired with, if any.
    pub(super) group: Option<Group>,
}
