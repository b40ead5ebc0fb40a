//! The operator's overrides, as requests awaited directly: [`ForceRelease`]
//! and [`ReleaseOwner`].

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use super::LeaseManager;
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::OverrideEnd;

/// A force release of one key, from [`LeaseManager::force_release`],
/// awaited directly.
///
/// By default the key of the live lease it ends is granted again only at
/// that lease's expiry (and the
/// [`lock_delay`](field@crate::LeaseManagerOptions::lock_delay)), by which
/// its holder has stopped, whether or not it heard of the override;
/// [`immediately`](Self::immediately) frees it after the lock-delay alone
/// (`docs/lock-delay.md`).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// // The holder may still be running: the key is free once its lease
/// // could no longer be live.
/// manager.force_release("job-1").await?;
/// // The holder's machine is known to be off: free the key now (after the
/// // lock-delay).
/// manager.force_release("job-2").immediately().await?;
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is awaited"]
pub struct ForceRelease<'a> {
    pub(super) manager: &'a LeaseManager,
    pub(super) key: LeaseKey,
    pub(super) end: OverrideEnd,
}

impl ForceRelease<'_> {
    /// The holder is known to be gone (its process stopped, its machine
    /// off): the key is free after the lock-delay alone, not at the ended
    /// lease's expiry (also a key an earlier override left waiting). If the
    /// holder is in fact still running, it keeps working until its next
    /// renewal while the next holder already works, and an acquisition of
    /// it still in flight may take the key again: use it only when you know.
    pub fn immediately(mut self) -> Self {
        self.end = OverrideEnd::Immediately;
        self
    }
}

impl<'a> IntoFuture for ForceRelease<'a> {
    type Output = Result<Option<LeaseInfo>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.manager.force_release_key(self.key, self.end))
    }
}

/// A release of every lease of an owner id, from
/// [`LeaseManager::release_owner`], awaited directly; its keys are free
/// again as [`ForceRelease`] says.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// // The process that used owner id "worker-7" was killed: free its keys
/// // now instead of at their expiry.
/// let released = manager.release_owner("worker-7").immediately().await?;
/// println!("released {released} leases of worker-7");
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is awaited"]
pub struct ReleaseOwner<'a> {
    pub(super) manager: &'a LeaseManager,
    pub(super) owner_id: &'a str,
    pub(super) end: OverrideEnd,
}

impl ReleaseOwner<'_> {
    /// Every holder under the owner id is known to be gone, as
    /// [`ForceRelease::immediately`] says of one.
    pub fn immediately(mut self) -> Self {
        self.end = OverrideEnd::Immediately;
        self
    }
}

impl<'a> IntoFuture for ReleaseOwner<'a> {
    type Output = Result<u64>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.manager.release_owner_leases(self.owner_id, self.end))
    }
}
