//! [`LeaseGroup`]: leases on several keys held together; the manager binds
//! them (`src/actor/lease_group.rs`).

use std::fmt;

use crate::actor::command::AcquireMode;
use crate::config::AcquireOptions;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::manager::LeaseManager;
use crate::status::{LeaseStatus, ReleaseOutcome};

/// Leases on several keys held together, from [`LeaseManager::acquire_all`]
/// or [`LeaseManager::try_acquire_all`].
///
/// Every key is held, or the group is lost: when one of its leases is lost,
/// the manager ends the others at once
/// ([`LossReason::GroupLost`](crate::LossReason::GroupLost)), and the
/// group's [`status`](LeaseGroup::status) reads lost. Dropping the group
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
///     _ = group.status().lost() => eprintln!("lost: {:?}", group.status().lost_reason()),
///     _ = transfer() => {}
/// }
/// group.release().await?;
/// # Ok(()) }
/// # async fn transfer() {}
/// ```
pub struct LeaseGroup {
    /// In key order; never empty.
    leases: Vec<Lease>,
    status: LeaseStatus,
}

impl LeaseGroup {
    /// Binds `leases` (in key order) into a group, or gives them back and
    /// returns `None` if one of them was lost meanwhile.
    async fn bind(leases: Vec<Lease>) -> Result<Option<LeaseGroup>> {
        let members = leases.iter().map(|lease| lease.member().0).collect();
        let mailbox = leases[0].member().1.clone();
        if mailbox.bind_group(members).await? {
            let states = leases.iter().map(|lease| lease.status().state().clone());
            let status = LeaseStatus::of_group(states.collect());
            Ok(Some(LeaseGroup { leases, status }))
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

    /// How the group stands ([`LeaseStatus`]): lost once any of its
    /// leases is, for the reason of the lease lost first.
    pub fn status(&self) -> LeaseStatus {
        self.status.clone()
    }

    /// Releases every lease of the group, together, and waits for MongoDB
    /// to confirm: [`ReleaseOutcome::AlreadyLost`] if any had been lost,
    /// [`ReleaseOutcome::StillHeld`] if every one stays held by other
    /// entries, else [`ReleaseOutcome::Released`].
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
        let outcomes = outcomes.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(if outcomes.contains(&ReleaseOutcome::AlreadyLost) {
            ReleaseOutcome::AlreadyLost
        } else if outcomes.contains(&ReleaseOutcome::Released) {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::StillHeld
        })
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
fn canonical(mut keys: Vec<LeaseKey>, options: &AcquireOptions) -> Result<Vec<LeaseKey>> {
    if options.reentrant {
        return Err(Error::InvalidConfig {
            reason: "acquire_all does not re-enter: drop reentrant()".into(),
        });
    }
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

/// Acquires every key of `keys` with `options` ([`LeaseManager::acquire_all`],
/// [`LeaseManager::try_acquire_all`]); `None` from a try as soon as a key is
/// held, and from a wait once the manager has shut down.
pub(crate) async fn acquire_all(
    manager: &LeaseManager,
    keys: Vec<LeaseKey>,
    mode: AcquireMode,
    options: &AcquireOptions,
) -> Result<Option<LeaseGroup>> {
    let keys = canonical(keys, options)?;
    loop {
        let mut leases = Vec::with_capacity(keys.len());
        for key in &keys {
            match manager.acquire_key(key.clone(), mode, options).await {
                Ok(Some(lease)) => leases.push(lease),
                other => {
                    give_back(leases).await;
                    return other.map(|_| None);
                }
            }
        }
        let group = LeaseGroup::bind(leases).await?;
        if group.is_some() || mode == AcquireMode::Try {
            return Ok(group);
        }
        tracing::debug!("a lease of the group was lost before all were held: starting over");
    }
}
