//! [`LeaseGroup`]: leases on several keys, taken and held together
//! ([`LeaseManager::acquire_all`]).
//!
//! The keys are taken one at a time in one canonical order, [`LeaseKey`]'s
//! (MongoDB's order of `_id` values), whatever order the caller gives them
//! in: two callers that want overlapping keys then take them in the same
//! order, and neither can hold a key the other waits for while waiting for
//! one it holds (the classic remedy for lock-order deadlock). A key that
//! cannot be taken gives back those already taken. Once all are held, the
//! manager binds them (`src/actor/lease_group.rs`): the loss of one ends
//! the others at once, so the group is held whole or not at all. This
//! follows Redisson's `RedissonMultiLock` and Curator's
//! `InterProcessMultiLock`, which also take their locks one by one and
//! give them back on failure.

use std::fmt;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::AcquireOptions;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::manager::LeaseManager;
use crate::status::{LossReason, ReleaseOutcome};

/// Leases on several keys held together, from [`LeaseManager::acquire_all`]
/// or [`LeaseManager::try_acquire_all`].
///
/// Every key is held, or the group is lost: when one of its leases is lost
/// (expired, taken, deleted, force-released), the manager ends the others at
/// once ([`LossReason::GroupLost`]) and releases them, and the group's
/// [`cancellation_token`](LeaseGroup::cancellation_token) fires. Work under
/// the group stops then, as under a single lease. Dropping the group
/// releases every lease in the background; prefer [`LeaseGroup::release`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// // Transfer between two accounts: both locked, in any order of the call.
/// let group = manager.acquire_all(["account-17", "account-4"]).await?;
/// for lease in group.leases() {
///     println!("{} under fencing token {}", lease.key(), lease.fencing_token());
/// }
/// tokio::select! {
///     _ = group.lost() => eprintln!("lost: {:?}", group.lost_reason()),
///     _ = transfer() => {}
/// }
/// group.release().await?;
/// # Ok(()) }
/// # async fn transfer() {}
/// ```
pub struct LeaseGroup {
    /// In key order; never empty.
    leases: Vec<Lease>,
}

impl LeaseGroup {
    /// Binds `leases` (in key order) into a group, or gives them back and
    /// returns `None` if one of them was lost meanwhile.
    async fn bind(leases: Vec<Lease>) -> Result<Option<LeaseGroup>> {
        let (members, mailbox) = {
            let members: Vec<_> = leases.iter().map(|lease| lease.member().0).collect();
            (members, leases[0].member().1.clone())
        };
        if mailbox.bind_group(members).await? {
            Ok(Some(LeaseGroup { leases }))
        } else {
            give_back(leases).await;
            Ok(None)
        }
    }

    /// The group's leases, one per key, in key order ([`LeaseKey`]'s order).
    /// Each has its own fencing token: pass each resource the token of its key.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The lease on `key`, if the group holds that key.
    pub fn get(&self, key: impl Into<LeaseKey>) -> Option<&Lease> {
        let key = key.into();
        self.leases.iter().find(|lease| *lease.key() == key)
    }

    /// A token cancelled when the group is lost: when any of its leases is
    /// lost (the manager then ends the others with it), or when the manager
    /// releases them ([`LeaseManager::release_all`], shutdown).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.leases[0].cancellation_token()
    }

    /// Completes when the group is lost (see [`LeaseGroup::cancellation_token`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect on the group.
    pub fn lost(&self) -> WaitForCancellationFutureOwned {
        self.leases[0].lost()
    }

    /// `true` once any lease of the group reads lost (see [`Lease::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.leases.iter().any(Lease::is_lost)
    }

    /// Why the group was lost: the reason of the lease lost first (not
    /// [`LossReason::GroupLost`], which the others read); `None` while held.
    pub fn lost_reason(&self) -> Option<LossReason> {
        self.leases
            .iter()
            .filter_map(Lease::lost_reason)
            .map(|reason| match reason {
                LossReason::GroupLost { reason, .. } => *reason,
                reason => reason,
            })
            .next()
    }

    /// Releases every lease of the group, together, and waits for MongoDB
    /// to confirm. [`ReleaseOutcome::AlreadyLost`] if the group had been
    /// lost, [`ReleaseOutcome::Released`] otherwise (or
    /// [`ReleaseOutcome::StillHeld`] if every lease had been re-entered
    /// and stays held by its other entries).
    ///
    /// # Errors
    ///
    /// As [`Lease::release`]: the first error, once every release has run
    /// (the leases whose release failed expire after their TTL).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the first poll still releases every lease.
    pub async fn release(self) -> Result<ReleaseOutcome> {
        let outcomes = futures::future::join_all(self.leases.into_iter().map(Lease::release)).await;
        let mut outcome = ReleaseOutcome::StillHeld;
        for result in outcomes {
            outcome = match (result?, outcome) {
                (ReleaseOutcome::AlreadyLost, _) | (_, ReleaseOutcome::AlreadyLost) => {
                    ReleaseOutcome::AlreadyLost
                }
                (ReleaseOutcome::Released, _) | (_, ReleaseOutcome::Released) => {
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::StillHeld,
            };
        }
        Ok(outcome)
    }
}

impl fmt::Debug for LeaseGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.leases).finish()
    }
}

/// Releases `leases` (an incomplete group) and waits for the answers; a
/// failure is logged by the manager, and that lease expires after its TTL.
async fn give_back(leases: Vec<Lease>) {
    futures::future::join_all(leases.into_iter().map(Lease::release)).await;
}

/// `keys` in canonical order, each checked; no key twice, at least one;
/// options a group can take.
fn canonical<K: Into<LeaseKey>>(
    keys: impl IntoIterator<Item = K>,
    options: &AcquireOptions,
) -> Result<Vec<LeaseKey>> {
    if options.reentrant {
        return Err(Error::InvalidConfig {
            reason: "acquire_all does not re-enter: drop AcquireOptions::reentrant".into(),
        });
    }
    let mut keys: Vec<LeaseKey> = keys.into_iter().map(Into::into).collect();
    for key in &keys {
        key.validate()?;
    }
    keys.sort();
    if keys.is_empty() {
        return Err(Error::InvalidKey {
            reason: "acquire_all needs at least one key".into(),
        });
    }
    if let Some(pair) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(Error::InvalidKey {
            reason: format!("key {} is given twice to acquire_all", pair[0]),
        });
    }
    Ok(keys)
}

impl LeaseManager {
    /// Acquires every key of `keys`, waiting as long as it takes, and holds
    /// them together: all of them, or none.
    ///
    /// The keys are taken one at a time in [`LeaseKey`]'s order (MongoDB's
    /// order), whatever the order given, each as [`LeaseManager::acquire`]
    /// takes one (FIFO among local waiters, fair between managers). So
    /// callers over overlapping keys, in this process or any other, never
    /// deadlock: none holds a key another waits for while it waits for one
    /// that other holds. Keys already taken stay held, and renewed, while
    /// the next one is awaited. If a lease already taken is lost meanwhile,
    /// all are given back and the acquisition starts over.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key refused as by [`LeaseManager::acquire`],
    /// no key, or a key given twice; [`Error::InvalidConfig`] for options
    /// [`LeaseManager::acquire_with`] refuses or with
    /// [`reentrant`](AcquireOptions::reentrant) (all before anything is
    /// sent); [`Error::AlreadyHeld`] if the options' holder already holds
    /// one of the keys; otherwise as [`LeaseManager::acquire`]. On an error
    /// the keys already taken are released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the keys already taken
    /// (in the background) and removes the waiter, so [`tokio::time::timeout`]
    /// bounds the whole acquisition.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    /// let all = manager.acquire_all(["b", "a", "c"]);
    /// match tokio::time::timeout(Duration::from_secs(5), all).await {
    ///     Ok(group) => group?.release().await.map(drop)?,
    ///     Err(_) => eprintln!("not all three within 5 s; none is held"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire_all<K: Into<LeaseKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<LeaseGroup> {
        self.acquire_all_with(keys, &AcquireOptions::default())
            .await
    }

    /// [`LeaseManager::acquire_all`] with `options` for every lease of the
    /// group (TTL, kind, minimum hold, holder).
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire_all`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire_all`].
    pub async fn acquire_all_with<K: Into<LeaseKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: &AcquireOptions,
    ) -> Result<LeaseGroup> {
        let keys = canonical(keys, options)?;
        loop {
            let mut leases = Vec::with_capacity(keys.len());
            for key in &keys {
                match self.acquire_with(key.clone(), options).await {
                    Ok(lease) => leases.push(lease),
                    Err(error) => {
                        give_back(leases).await;
                        return Err(error);
                    }
                }
            }
            if let Some(group) = LeaseGroup::bind(leases).await? {
                return Ok(group);
            }
            tracing::debug!("a lease of the group was lost before all were held: starting over");
        }
    }

    /// One attempt to acquire every key of `keys`, in [`LeaseKey`]'s order:
    /// `Ok(None)` as soon as one of them is held (as
    /// [`LeaseManager::try_acquire`] answers), after releasing the keys
    /// taken before it. Costs one round trip per key taken, plus the
    /// releases.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire_all`] and [`LeaseManager::try_acquire`];
    /// the keys taken are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire_all`].
    pub async fn try_acquire_all<K: Into<LeaseKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Option<LeaseGroup>> {
        self.try_acquire_all_with(keys, &AcquireOptions::default())
            .await
    }

    /// [`LeaseManager::try_acquire_all`] with `options` for every lease.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::try_acquire_all`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire_all`].
    pub async fn try_acquire_all_with<K: Into<LeaseKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: &AcquireOptions,
    ) -> Result<Option<LeaseGroup>> {
        let keys = canonical(keys, options)?;
        let mut leases = Vec::with_capacity(keys.len());
        for key in keys {
            match self.try_acquire_with(key, options).await {
                Ok(Some(lease)) => leases.push(lease),
                other => {
                    give_back(leases).await;
                    return other.map(|_| None);
                }
            }
        }
        LeaseGroup::bind(leases).await
    }
}
