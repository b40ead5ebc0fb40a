//! The light release's answer ([`LightRelease`]), the decision on a grouped
//! light release ([`release_outcomes`]; "Grouped" in `store`, made once for
//! both stores as ARCHITECTURE.md's "What a reply means" says), and
//! [`LightForms`], which of the light forms a store has.
//!
//! **The decision.** After the batch, each lease's document reads:
//! - still under the lease's id ([`Read::Kept`]): not released (someone
//!   else waits, or a write error); the general release decides;
//! - anything else ([`Read::Gone`]: no lease id, another lease id, no
//!   document): no longer held, by this batch's release or by another
//!   write before it. A document without a lease id and of this owner does
//!   not tell which: a force release and a release by owner id also
//!   remove `lid` and keep `aid`. The modified count does, when it matches
//!   all of these leases (the batch released them all; the ones under
//!   another lease id were taken since) or none (all were lost before it:
//!   the general release finds them gone and reports them lost). If it
//!   matches neither, all of them are reported lost: possibly a release
//!   reported as a loss, never the reverse. For the same reason a batch
//!   whose command failed, and a lone light release whose write was sent
//!   again after a transient failure, leave their leases to the general
//!   release as not applied: one it no longer finds is reported lost.

use crate::error::{Error, Result};

/// Most light writes in one store call; more queued go in further calls.
pub(crate) const MOST_PER_COMMAND: usize = 256;

/// Which light forms a store has ([`StoreProfile::light_forms`](super::StoreProfile::light_forms)):
/// the actor tries a light form first only where the store has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LightForms {
    /// [`Store::acquire_light`](super::Store::acquire_light).
    pub acquire: bool,
    /// [`Store::release_light`](super::Store::release_light).
    pub release: bool,
    /// The light form of [`Store::handoff`](super::Store::handoff)
    /// ([`Handoff::light`](super::Handoff::light)).
    pub handoff: bool,
}

/// What a light release did.
#[derive(Debug, Default)]
pub(crate) enum LightRelease {
    /// It released the lease.
    Released,
    /// It did not release it (another owner waits, or it was lost), or
    /// may not have (its write's outcome is unknown, or a request whose
    /// batch never answered): the general release decides. A lease that
    /// the general release no longer finds is then reported lost, even if
    /// this write released it: a doubt reports a loss, never the reverse
    /// (property 7 of docs/safety.md; an operator may have ended it).
    #[default]
    NotApplied,
    /// The light form's own command failed (a batch of one).
    Failed(Error),
}

/// A lone light release's answer, from its write sent again after a
/// transient failure ([`retried`](super::retried::retried)): released if
/// it modified the lease's document, otherwise not applied (after a retry
/// too: nothing found then proves nothing, and the general release
/// decides). Both stores answer by it.
pub(crate) fn lone_release_answer(result: Result<u64>) -> LightRelease {
    match result {
        Ok(count) if count > 0 => LightRelease::Released,
        Ok(_) => LightRelease::NotApplied,
        Err(e) => LightRelease::Failed(e),
    }
}

/// A released lease's document as the read after a grouped light release
/// found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// It still holds the lease: not released.
    Kept,
    /// No longer held (no lease id, another lease id, or no document):
    /// released by this batch, or lost before it (taken, force released,
    /// released by owner id).
    Gone,
}

/// The answers of a grouped light release whose documents read `read`
/// (one per lease, in the batch's order) after the batch modified
/// `modified` of them (see the module docs): [`LightRelease::Released`]
/// or [`LightRelease::NotApplied`], one per lease, in order.
pub(crate) fn release_outcomes(read: Vec<Read>, modified: u64) -> Vec<LightRelease> {
    let gone = read.iter().filter(|r| **r == Read::Gone).count() as u64;
    // A lease still held was not modified: the modified count is that of
    // the leases gone that the batch released. All of them, or else each
    // is taken as lost.
    let gone_released = modified == gone;
    read.into_iter()
        .map(|read| match read {
            Read::Gone if gone_released => LightRelease::Released,
            Read::Kept | Read::Gone => LightRelease::NotApplied,
        })
        .collect()
}

#[cfg(test)]
mod tests;
