//! The release family of [`MongoStore`]: releasing leases by lease id or by
//! owner id, marking them released or, in delete mode, deleting those whose
//! token is old enough (see "Fencing tokens" in `store`), and delete mode's
//! follow-up delete. Each write is idempotent and retried here after a
//! transient failure (`ops`' `retried`).

use mongodb::bson::{Document, doc};

use super::handle::MongoStore;
use super::kinds::{Released, holder_filter, lease_ids, owner_holders_filter, release_any_update};
use super::ops::retried;
use super::pipeline::{deletable_filter, owner_leases_filter, released_filter};
use crate::config::{DELETE_MIN_TOKEN_AGE, ReleaseMode};
use crate::error::Result;
use crate::store::{DELETE_DELAY, LeaseRef, field};

/// [`DELETE_MIN_TOKEN_AGE`] in milliseconds.
fn min_token_age_ms() -> i64 {
    DELETE_MIN_TOKEN_AGE.as_millis() as i64
}

impl MongoStore {
    /// Marks the leases matching `filter` released ([`release_any_update`]
    /// of `released`): `updateOne` for a `single` lease (a retryable write),
    /// else `updateMany`.
    async fn mark_released(
        &self,
        filter: &Document,
        released: &Released<'_>,
        single: bool,
    ) -> Result<(u64, bool)> {
        let update = || release_any_update(released, self.yield_ms()).into();
        self.update_matching(self.coll(), "release", filter, update, single)
            .await
    }

    /// Deletes the documents matching `filter`: `deleteOne` for a `single`
    /// lease (a retryable write), else `deleteMany` (idempotent).
    async fn delete_matching(&self, filter: &Document, single: bool) -> Result<(u64, bool)> {
        retried("delete", move || async move {
            let result = if single {
                self.bounded(self.coll().delete_one(filter.clone())).await
            } else {
                self.bounded(self.coll().delete_many(filter.clone())).await
            };
            result.map(|r| r.deleted_count)
        })
        .await
    }

    /// Releases the leases matching `filter`; `single` for one lease, which
    /// uses `updateOne` / `deleteOne` so that the driver's retryable writes
    /// report the original outcome. The writes are idempotent, so a transient
    /// failure is also retried here (up to [`WRITE_ATTEMPTS`](super::ops::WRITE_ATTEMPTS) in all). After
    /// such a failure an earlier attempt may have applied: a single lease that
    /// the retry no longer finds counts as released by us (the caller only
    /// releases leases whose local deadline has not passed, so nobody else can
    /// have taken it by expiry).
    ///
    /// In [`ReleaseMode::Delete`] and with `delete_first`, the documents
    /// whose token is at least [`DELETE_MIN_TOKEN_AGE`] old and that nobody
    /// waited for are deleted first ([`deletable_filter`]); the rest are
    /// marked released as in keep mode. Returns how many were deleted and
    /// how many marked released.
    async fn release_parts(
        &self,
        filter: Document,
        released: &Released<'_>,
        single: bool,
        delete_first: bool,
    ) -> Result<(u64, u64)> {
        let mut ambiguous = false;
        let mut deleted = 0;
        if delete_first && self.release_mode() == ReleaseMode::Delete {
            let deletable = deletable_filter(filter.clone(), min_token_age_ms());
            let (count, retried) = self.delete_matching(&deletable, single).await?;
            if single && count > 0 {
                return Ok((count, 0));
            }
            deleted = count;
            ambiguous |= retried;
        }
        let (mut marked, retried) = self.mark_released(&filter, released, single).await?;
        ambiguous |= retried;
        if single && ambiguous && deleted + marked == 0 {
            marked = 1;
        }
        Ok((deleted, marked))
    }

    pub(super) async fn release_matching(
        &self,
        filter: Document,
        released: &Released<'_>,
        single: bool,
        delete_first: bool,
    ) -> Result<u64> {
        let (deleted, marked) = self
            .release_parts(filter, released, single, delete_first)
            .await?;
        Ok(deleted + marked)
    }

    /// Releases `leases` (of any kinds): one command for a batch whose keys
    /// are distinct, else one per round of distinct keys (several holders
    /// of one key, which one document matches once), so that the count is
    /// of leases. `delete_first` as in [`MongoStore::release_parts`].
    pub(super) async fn release_leases(
        &self,
        leases: Vec<LeaseRef>,
        delete_first: bool,
    ) -> Result<u64> {
        let mut rounds: Vec<Vec<LeaseRef>> = Vec::new();
        for lease in leases {
            match rounds
                .iter_mut()
                .find(|round| round.iter().all(|l| l.key != lease.key))
            {
                Some(round) => round.push(lease),
                None => rounds.push(vec![lease]),
            }
        }
        let mut count = 0;
        for round in rounds {
            let released = Released::Leases {
                owner: self.owner(),
                ids: lease_ids(&round),
            };
            let filter = holder_filter(self.owner(), &round);
            count += self
                .release_matching(filter, &released, round.len() == 1, delete_first)
                .await?;
        }
        Ok(count)
    }

    /// Delete mode's follow-up: deletes the released documents among
    /// `filter`'s whose token is now old enough ([`released_filter`]).
    pub(super) async fn delete_released_matching(&self, filter: Document) -> Result<u64> {
        let filter = released_filter(filter, min_token_age_ms());
        Ok(self.delete_matching(&filter, false).await?.0)
    }

    /// Releases every lease document of `owner` not released yet
    /// ([`owner_leases_filter`]), whoever's manager holds it. In delete mode,
    /// the documents it could only mark released (tokens younger than
    /// [`DELETE_MIN_TOKEN_AGE`]) are deleted once they are old enough, before
    /// this returns.
    pub(super) async fn release_leases_of(&self, owner: String) -> Result<u64> {
        let filter =
            doc! { "$or": [owner_leases_filter(&owner), owner_holders_filter(&owner, &[])] };
        let released = Released::Owner {
            owner: &owner,
            except: Vec::new(),
        };
        let (deleted, marked) = self.release_parts(filter, &released, false, true).await?;
        if self.release_mode() == ReleaseMode::Delete && marked > 0 {
            tokio::time::sleep(DELETE_DELAY).await;
            self.delete_released_matching(doc! { field::OWNER: &owner })
                .await?;
        }
        Ok(deleted + marked)
    }
}
