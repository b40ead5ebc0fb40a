//! The store contract: one suite of scenarios over the [`Store`] trait, each
//! run against [`MemoryStore`](super::memory::MemoryStore)
//! (`store::tests::contract::memory::*`) and against
//! [`MongoStore`](super::MongoStore) on a real `mongod` from the test kit
//! (`store::tests::contract::mongo::*`), so that the twin the actor's timing tests
//! rely on follows the rules the real store follows.
//!
//! A scenario only uses the trait, plus a [`Fixture`] for what only a test
//! can do: make a lease expire on the server, delete a document as the TTL
//! monitor would, plant a document of foreign layout, read the raw state.
//! Each MongoDB test gets a fresh collection on the process's shared replica
//! set (`MONGODB_URI` if set), dropped at the end of a scenario that passed
//! (a failed one leaves it for inspection).

//!
//! - [`fixtures`]: the [`Fixture`] of each store;
//! - [`acquire`], [`renewal`], [`release`], [`reads`]: the scenarios, by
//!   the operation they are about, each generic over the fixture;
//! - [`keys`]: keys of any BSON type (identity, order of `list`);
//! - [`foreign`]: other applications' lock documents (foreign holders);
//!   [`read_by_others`]: our lease documents as another pattern's clients
//!   read them;
//! - [`compat`]: delete-on-release mode and release by owner id;
//! - [`documents`]: in-document leases ([`Store::documents`]);
//! - [`kinds`]: shared and semaphore keys; [`permits`]: several permits in
//!   one lease; [`hold`]: `hold_at_least`;
//! - [`queue`]: the queue of waiting owners (registration, handoff in the
//!   releasing write, the head's claim on a free key, its bound); [`waiters`]: what
//!   a read shows of them; [`transitions`]: the count of changes of owner;
//! - [`handoff`]: the handoff to a local waiter in the releasing write;
//! - [`light`]: the light forms (a grouped light acquire);
//! - [`payload_acquire`]: the payload written with the acquisition.
//! - [`lock_delay`]: the lock-delay after a force release or a release by
//!   owner id; [`revocation`]: a request that the holders release a key.

mod acquire;
mod compat;
mod documents;
mod fixtures;
mod foreign;
mod handoff;
mod hold;
mod keys;
mod kinds;
mod lease_ttl;
mod light;
mod lock_delay;
mod lock_id;
mod loss_detection;
mod payload_acquire;
mod permits;
mod queue;
mod read_by_others;
mod reads;
mod release;
mod renewal;
mod reread;
mod revocation;
mod transitions;
mod waiters;

use crate::store::StoreExt;
use std::time::Duration;

use mongodb::bson::Document;
use uuid::Uuid;

use crate::key::LeaseKey;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, LeaseRef, Store};

/// Lease TTL of every store in the scenarios: far longer than a scenario.
const TTL: Duration = Duration::from_secs(30);
/// Yield window of every store in the scenarios.
const YIELD: Duration = Duration::from_secs(20);
/// Safety margin of every store in the scenarios (part of its registration
/// window, [`registration_window`](super::registration_window)).
const MARGIN: Duration = Duration::from_secs(2);
/// Lock field of the in-document leases in the scenarios.
const FIELD: &str = "lock";

/// The state of one lock document, as stored, judged at the server's now.
#[derive(Debug, Clone, PartialEq)]
struct Raw {
    /// `aid`.
    owner: String,
    /// `lid`; `None` once released.
    lease_id: Option<Uuid>,
    /// `tok`.
    token: u64,
    /// `exp <= now`.
    expired: bool,
    /// `wt` is set.
    waiting: bool,
    /// `yu` is set and later than now.
    yielded: bool,
    /// `data`.
    payload: Option<Document>,
}

/// A field of a planted foreign lock document ([`Fixture::put_foreign_doc`]).
#[derive(Debug, Clone)]
enum Planted {
    /// This value.
    Value(mongodb::bson::Bson),
    /// A date: the server's now plus this many ms (negative: in the past).
    At(i64),
}

/// What a scenario needs besides the [`Store`] trait: a fresh lock
/// collection, stores (managers) on it, and the test-only operations.
trait Fixture: Sized {
    type Store: Store + Clone;

    /// A fresh, empty lock collection.
    async fn new() -> Self;

    /// A store on this collection for the owner id `owner` (TTL [`TTL`],
    /// yield window [`YIELD`], safety margin [`MARGIN`]).
    async fn store(&self, owner: &str) -> Self::Store;

    /// As [`Fixture::store`], with releases in
    /// [`ReleaseMode::Delete`](crate::ReleaseMode::Delete).
    async fn delete_mode_store(&self, owner: &str) -> Self::Store;

    /// As [`Fixture::store`], with a lock-delay of `delay` after its force
    /// releases and releases by owner id ("Lock-delay" in `store`).
    async fn delaying_store(&self, owner: &str, delay: Duration) -> Self::Store;

    /// Makes the lease on `key` expired by server time, keeping its lease id
    /// (a holder whose renewals stopped reaching the server).
    async fn expire(&self, key: impl Into<LeaseKey>);

    /// Deletes the document of `key` as the TTL monitor would: only once its
    /// `exp` has passed (expire or release it first), hence after every
    /// earlier acquisition's server time.
    async fn delete(&self, key: impl Into<LeaseKey>);

    /// Writes another application's lock document under `key`: `{_id: key,
    /// ts: now, aid: owner}` (a foreign holder's lock).
    async fn put_foreign(&self, key: impl Into<LeaseKey>, owner: &str);

    /// Another application locks `key` by an upsert of its `_id` alone,
    /// leaving a bare `{_id: key}` (a foreign holder's lock with neither `aid`
    /// nor `ts`; [`Fixture::foreign_unchanged`] checks it too).
    async fn put_bare(&self, key: impl Into<LeaseKey>);

    /// Whether `key` still has the foreign holder's lock document written
    /// by [`Fixture::put_foreign`], unchanged.
    async fn foreign_unchanged(&self, key: impl Into<LeaseKey>) -> bool;

    /// A store as [`Fixture::store`] whose collection's foreign lock layouts
    /// are `rules` (as `connect` gives them to `MongoStore`).
    async fn store_with_rules(
        &self,
        owner: &str,
        rules: crate::foreign::ForeignRules,
    ) -> Self::Store;

    /// Writes another application's lock document under `key`: `{_id: key}`
    /// then `fields` in order, a [`Planted::At`] as a date at the server's
    /// now plus its offset in ms ([`Fixture::foreign_unchanged`] checks it).
    async fn put_foreign_doc(&self, key: impl Into<LeaseKey>, fields: Vec<(&str, Planted)>);

    /// Another application deletes the document of `key`, whatever its state.
    async fn delete_now(&self, key: impl Into<LeaseKey>);

    /// Another application rewrites the owner id of `key` (`$set: {aid}`).
    async fn rewrite_owner(&self, key: impl Into<LeaseKey>, owner: &str);

    /// A client of the `{_id, value, ttl, obtained_at}` lock pattern locks
    /// `key` as `value` for `ttl_secs`, by that pattern's commands: a read;
    /// nothing there, an upsert matching `{_id, value}`; a lock past
    /// `obtained_at + ttl` seconds, an upsert guarded by the `value` and
    /// `obtained_at` read. Returns whether it locked it (an E11000, or a
    /// lock not expired by that rule: not).
    async fn pattern2_lock(&self, key: impl Into<LeaseKey>, value: &str, ttl_secs: i32) -> bool;

    /// That client's release, `deleteOne({_id, value})`: whether it deleted.
    async fn pattern2_unlock(&self, key: impl Into<LeaseKey>, value: &str) -> bool;

    /// The document of `key`, if any.
    async fn raw(&self, key: impl Into<LeaseKey>) -> Option<Raw>;

    /// `exp − ts` of the document of `key` (which must exist): the TTL its
    /// last acquire or renewal wrote.
    async fn lifetime(&self, key: impl Into<LeaseKey>) -> Duration;

    /// The in-document leases of the owner id `owner` on this fixture's
    /// user collection, lock field [`FIELD`]: [`Store::documents`] of
    /// [`Fixture::store`].
    async fn documents(&self, owner: &str) -> std::sync::Arc<dyn Store>;

    /// The in-document leases of the owner id `owner` on this fixture's
    /// user collection of documents locked by `LockId` / `LockTime` (another
    /// one than [`Fixture::documents`]'s), lock field [`FIELD`], with the
    /// other client's `max` as `max_duration`.
    async fn documents_with_lock_id(&self, owner: &str, max: Duration)
    -> std::sync::Arc<dyn Store>;

    /// The other client's lock of the document `key` there, at its clock's
    /// now (the server's, moved by `ahead_ms`), by its exact command
    /// (`LockIdFields`' docs): its `LockId`, or `None` ("already locked").
    async fn client_lock(
        &self,
        key: impl Into<LeaseKey>,
        ahead_ms: i64,
        max: Duration,
    ) -> Option<Uuid>;

    /// That client's unlock of `key` under `lock_id` (`LockId: null,
    /// LockTime: null` where `LockId` is still `lock_id`): whether it matched.
    async fn client_unlock(&self, key: impl Into<LeaseKey>, lock_id: Uuid) -> bool;

    /// Makes the holder `lease_id` of the shared or semaphore key `key`
    /// expired by server time (a holder whose renewals stopped), keeping
    /// its entry; the key's `exp` becomes its live holders' latest.
    async fn expire_holder(&self, key: impl Into<LeaseKey>, lease_id: Uuid);

    /// Makes the exclusive waiter's mark on `key` (`xw`) expired by server
    /// time (a waiter that stopped retrying).
    async fn expire_mark(&self, key: impl Into<LeaseKey>);

    /// Makes the minimum hold of `key` (`hl`) pass by server time, and its
    /// `exp` not later than now (`hold_at_least` and the TTL both elapsed).
    async fn expire_hold(&self, key: impl Into<LeaseKey>);

    /// Moves the `exp` of the released key `key` (no `lid`) `ahead` past
    /// the server's now: what a release leaves when its `$$NOW` ran ahead
    /// of the next write's (docs/mongodb-behaviour.md, B3), here longer.
    async fn run_ahead(&self, key: impl Into<LeaseKey>, ahead: std::time::Duration);

    /// As [`Fixture::expire`], for the in-document lease on the document
    /// `key` of [`Fixture::documents`]'s collection.
    async fn expire_document(&self, key: impl Into<LeaseKey>);

    /// Makes every registration in the queue of `key` (`q`) expired by
    /// server time (waiters that stopped retrying).
    async fn lapse_registrations(&self, key: impl Into<LeaseKey>);

    /// The owner ids of the live entries of the queue of `key`, in order
    /// (empty without a document or a queue).
    async fn queue(&self, key: impl Into<LeaseKey>) -> Vec<String>;

    /// What `store`'s re-read after an acquire of `shape` under `lease_id`
    /// (the store's TTL) whose outcome is unknown answers now
    /// (`MongoStore::reread_acquire`, `MemoryStore::reread_acquire`).
    async fn reread(
        &self,
        store: &Self::Store,
        key: impl Into<LeaseKey>,
        lease_id: Uuid,
        shape: LeaseShape,
    ) -> AcquireOutcome;

    /// What the re-read after an acquire of the document `key` of
    /// [`Fixture::documents`]'s collection by `owner` under `lease_id`
    /// (the store's TTL) whose outcome is unknown answers now
    /// (`DocumentStore`'s re-read, `MemoryStore::reread_acquire` of the
    /// twin's in-document leases).
    async fn reread_document(
        &self,
        owner: &str,
        key: impl Into<LeaseKey>,
        lease_id: Uuid,
    ) -> AcquireOutcome;

    /// Removes what [`Fixture::new`] created (the MongoDB collections), once
    /// the scenario has passed.
    async fn cleanup(self);
}

// ----- helpers ----------------------------------------------------------------

fn lease(key: impl Into<LeaseKey>, lease_id: Uuid) -> LeaseRef {
    let key = &key.into();
    LeaseRef {
        key: key.clone(),
        lease_id,
        kind: crate::kind::LeaseKind::Exclusive,
    }
}

/// Acquires `key` under a new lease id, which must succeed; returns the
/// lease and its token.
async fn take(store: &impl Store, key: impl Into<LeaseKey>) -> (LeaseRef, u64) {
    let key = &key.into();
    let lease_id = Uuid::new_v4();
    match store.attempt(key.clone(), lease_id, false).await {
        Ok(AcquireOutcome::Acquired { token }) => (lease(key, lease_id), token),
        other => panic!("acquiring {key:?}: {other:?}"),
    }
}

/// Stores (managers) on `f`'s collection for the owner ids `owners`, in
/// order.
async fn stores<F: Fixture, const N: usize>(f: &F, owners: [&str; N]) -> [F::Store; N] {
    let mut stores = Vec::with_capacity(N);
    for owner in owners {
        stores.push(f.store(owner).await);
    }
    stores
        .try_into()
        .unwrap_or_else(|_| unreachable!("one store per owner id"))
}

/// Acquires `lease` again under its lease id (a retry), not waiting, as
/// `shape` with the store's TTL; the outcome, which must not be an error.
async fn retry_as(store: &impl Store, lease: &LeaseRef, shape: LeaseShape) -> AcquireOutcome {
    store
        .acquire_shaped(
            lease.key.clone(),
            lease.lease_id,
            false,
            store.default_ttl(),
            shape,
        )
        .await
        .unwrap()
}

/// Acquires `key` under a new lease id, which must find it held by `holder`;
/// returns the remaining time reported.
async fn held(
    store: &impl Store,
    key: impl Into<LeaseKey>,
    waiting: bool,
    holder: &str,
) -> Duration {
    let key = &key.into();
    match store.attempt(key.clone(), Uuid::new_v4(), waiting).await {
        Ok(AcquireOutcome::Held {
            holder: h,
            remaining: Some(remaining),
            ..
        }) if h == holder => remaining,
        other => panic!("acquiring {key:?} held by {holder:?}: {other:?}"),
    }
}

/// The document of `key`, which must exist.
async fn raw(f: &impl Fixture, key: impl Into<LeaseKey>) -> Raw {
    let key = &key.into();
    f.raw(key)
        .await
        .unwrap_or_else(|| panic!("no document for {key:?}"))
}

/// The keys of the writes that freed a key (releases, deletes), from an
/// announcement stream.
fn freed_keys(
    announcements: futures::stream::BoxStream<
        'static,
        crate::error::Result<crate::store::Announcement>,
    >,
) -> futures::stream::BoxStream<'static, crate::error::Result<LeaseKey>> {
    use futures::StreamExt;
    announcements
        .filter_map(|item| async move {
            match item {
                Ok(crate::store::Announcement::Write(write)) if write.freed => Some(Ok(write.key)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        })
        .boxed()
}

/// What a release of a lease another owner waited for leaves: the lease of
/// `owner` with `token` released (no lease id, expired), the waiting mark
/// gone, the key yielded to the waiting owner.
fn yielded(owner: &str, token: u64) -> Raw {
    Raw {
        owner: owner.to_string(),
        lease_id: None,
        token,
        expired: true,
        waiting: false,
        yielded: true,
        payload: None,
    }
}

/// Asserts that `raw` is a live lease of `owner` under `lease`, unmarked.
fn assert_held(raw: &Raw, owner: &str, lease: &LeaseRef, token: u64) {
    assert_eq!(
        raw,
        &Raw {
            owner: owner.to_string(),
            lease_id: Some(lease.lease_id),
            token,
            expired: false,
            waiting: false,
            yielded: false,
            payload: raw.payload.clone(),
        }
    );
}

/// Runs each scenario (named with its file) against both stores:
/// `memory::<scenario>` and `mongo::<scenario>`, each on a fresh fixture that
/// is cleaned up once the scenario has passed.
macro_rules! contract {
    ($($module:ident::$scenario:ident),* $(,)?) => {
        mod memory {
            use super::Fixture;

            $(
                #[tokio::test]
                async fn $scenario() {
                    let fixture = super::fixtures::MemoryFixture::new().await;
                    super::$module::$scenario(&fixture).await;
                    fixture.cleanup().await;
                }
            )*
        }
        mod mongo {
            use super::Fixture;

            $(
                #[tokio::test]
                async fn $scenario() {
                    let fixture = super::fixtures::MongoFixture::new().await;
                    super::$module::$scenario(&fixture).await;
                    fixture.cleanup().await;
                }
            )*
        }
    };
}

contract!(
    acquire::acquire_free_key_takes_it,
    acquire::acquire_held_key_returns_held,
    acquire::acquire_expired_key_takes_it_with_a_greater_token,
    acquire::acquire_yielded_key_is_refused_to_the_yielding_owner_only,
    acquire::fencing_tokens_strictly_increase_also_after_a_delete,
    acquire::a_document_of_foreign_shape_is_never_taken,
    foreign::a_live_foreign_lock_of_each_shape_is_held_until_its_own_expiry,
    foreign::a_foreign_lock_expired_by_its_own_rule_is_taken_over,
    foreign::a_foreign_lock_without_an_expiry_is_never_taken,
    renewal::renewal_reports_exactly_the_lost_keys,
    renewal::payload_is_set_only_under_the_holding_lease_id,
    release::release_of_an_unmarked_lease_does_not_yield,
    release::release_clears_the_lease_id_and_yields_only_when_marked,
    release::force_release_releases_a_live_lease_of_any_owner,
    release::releases_and_deletes_are_announced_expiries_and_renewals_are_not,
    reads::list_pages_through_leases_in_key_order,
    light::a_grouped_light_acquire_counts_only_the_new_acquisitions_it_wrote,
    // Keys of any BSON type.
    keys::keys_of_any_type_are_listed_once_in_mongodbs_order,
    keys::numbers_of_equal_value_are_one_key,
    // Other applications' lock documents.
    foreign::inspect_and_list_show_a_foreign_lock_as_held_by_its_foreign_holder,
    foreign::force_release_deletes_a_foreign_lock,
    foreign::release_owner_never_touches_a_foreign_document_with_the_same_aid,
    foreign::a_bare_id_document_is_a_foreign_holders_lock_of_every_kind,
    foreign::a_bare_id_document_of_any_key_type_is_held_beside_a_users_rule,
    read_by_others::a_live_lease_reads_as_held_to_the_value_pattern,
    read_by_others::a_released_lease_is_free_to_the_value_pattern_at_once,
    read_by_others::an_expired_lease_taken_over_by_the_value_pattern_is_its_lock,
    // Delete-on-release mode and release by owner.
    compat::delete_mode_release_deletes_the_document_once_its_token_is_old_enough,
    compat::delete_mode_release_of_a_lost_lease_deletes_nothing,
    compat::delete_mode_release_of_a_young_lease_only_marks_it_released,
    compat::delete_mode_tokens_strictly_increase_over_tight_acquire_release_cycles,
    compat::delete_mode_release_of_a_waited_for_lease_yields_instead,
    compat::release_owner_releases_every_lease_of_that_owner_only,
    // Loss detection and renewal by owner.
    loss_detection::renewal_reports_a_lease_lost_whose_owner_id_was_rewritten,
    loss_detection::an_acquire_retry_under_a_lease_id_whose_owner_id_was_rewritten_finds_it_held,
    loss_detection::foreign_deletes_and_owner_rewrites_are_announced_renewals_are_not,
    // Shared and semaphore keys.
    // Lock-delay.
    lock_delay::a_force_release_keeps_the_key_from_every_kind_until_the_lock_delay_ends,
    lock_delay::an_override_keeps_the_key_until_the_ended_lease_expires_unless_immediate,
    lock_delay::an_immediate_release_by_owner_id_of_kept_places_keeps_the_earlier_wait,
    lock_delay::a_release_by_owner_id_keeps_joiners_out_of_the_places_it_kept_until_the_lock_delay_ends,
    lock_delay::releases_by_owner_id_one_owner_at_a_time_delay_the_key_they_end,
    lock_delay::an_immediate_release_by_owner_id_of_only_kept_places_writes_no_lock_delay,
    lock_delay::release_owner_delays_the_live_leases_it_ends_only,
    lock_delay::a_zero_lock_delay_frees_the_key_at_once,
    revocation::a_release_request_is_announced_and_changes_no_lease,
    kinds::a_semaphore_admits_n_holders_then_is_held_until_the_earliest_expiry,
    kinds::a_crashed_holders_permit_comes_back_after_its_ttl,
    kinds::a_semaphore_of_another_number_or_kind_is_a_mismatch,
    kinds::fencing_tokens_strictly_increase_across_permits_and_after_all_were_released,
    kinds::a_retry_under_the_same_lease_id_gets_the_same_permit_back,
    kinds::renewal_of_two_permits_of_one_key_reports_exactly_the_one_taken_over,
    kinds::release_of_one_permit_keeps_the_other,
    kinds::a_shared_key_admits_many_holders_and_excludes_an_exclusive_one,
    kinds::a_waiting_exclusive_mark_blocks_new_shared_holders_until_it_expires,
    kinds::release_owner_and_force_release_of_multi_holder_keys,
    kinds::inspect_and_list_show_each_kind_with_its_holders,
    kinds::a_holders_release_is_announced_its_renewal_and_acquisition_are_not,
    kinds::a_holders_payload_is_written_only_while_it_holds,
    kinds::delete_mode_never_deletes_a_key_with_live_holders,
    kinds::racing_acquisitions_never_admit_more_than_n_permits,
    kinds::a_waiting_shared_acquirer_makes_the_exclusive_holders_release_yield,
    kinds::a_bad_shape_is_refused_with_a_clear_error_and_nothing_written,
    kinds::a_released_key_whose_expiry_ran_ahead_is_free_for_a_permit_not_a_mismatch,
    kinds::an_owners_own_exclusive_mark_never_blocks_its_shared_acquisition,
    // Holding at least.
    hold::a_lease_released_early_stays_held_until_its_minimum_hold,
    hold::a_lease_held_at_least_is_free_once_its_hold_has_passed,
    hold::renewal_never_lowers_the_expiry_below_the_minimum_hold,
    hold::force_release_frees_a_lease_held_at_least,
    hold::delete_mode_never_deletes_a_key_before_its_minimum_hold,
    // The handoff to a local waiter.
    handoff::a_handoff_makes_the_waiter_the_holder_with_a_greater_token,
    handoff::a_handoff_of_a_lease_taken_over_or_expired_is_lost,
    handoff::a_handoff_of_a_lease_another_owner_waits_for_yields_to_it,
    handoff::a_handoff_within_a_minimum_hold_releases_and_keeps_the_hold,
    handoff::a_handoff_is_announced_as_a_new_lease_not_as_a_release,
    handoff::a_handoff_in_delete_mode_keeps_the_document,
    // Per-lease TTL.
    lease_ttl::an_acquire_with_a_ttl_stores_exp_that_far_after_ts,
    lease_ttl::a_renewal_batch_with_a_ttl_keeps_exp_that_far_after_ts,
    payload_acquire::an_acquisition_with_a_payload_writes_it_in_the_same_write,
    payload_acquire::a_payload_with_a_shared_or_document_acquisition_is_refused,
    payload_acquire::a_key_handed_to_a_waiting_owner_carries_the_payload_it_registered_with,
    // In-document leases.
    documents::acquiring_a_free_document_takes_it_and_a_second_owner_finds_it_held,
    documents::document_renewal_reports_exactly_the_leases_taken_over,
    documents::a_released_document_lease_is_taken_with_a_greater_token_also_after_its_removal,
    documents::a_document_write_applies_only_under_the_held_lease,
    lock_id::documents_locked_by_lock_id_exclude_the_other_client_both_ways,
    lock_id::a_client_lock_expired_by_its_rule_is_taken_over_and_a_client_takeover_ends_our_lease,
    // The queue of waiting owners.
    queue::waiting_owners_are_handed_the_key_in_arrival_order_with_greater_tokens,
    queue::an_owner_that_leaves_the_queues_is_never_handed_a_key_and_the_others_keep_their_places,
    queue::a_free_key_is_kept_for_the_head_of_the_queue_and_lapsed_registrations_are_skipped,
    queue::a_handed_lease_never_confirmed_expires_and_the_next_owner_takes_it,
    queue::try_acquire_and_foreign_documents_never_register,
    queue::release_owner_hands_over_and_force_release_frees_the_key_for_the_head,
    queue::a_local_handoff_goes_to_the_first_registered_owner_instead,
    queue::delete_mode_hands_over_instead_of_deleting,
    queue::a_handoff_is_announced_with_the_new_holders_owner_and_lease_ids,
    queue::an_acquisition_is_announced_with_its_token,
    queue::a_waiters_stream_announces_frees_and_handoffs_to_its_owner_alone,
    queue::beyond_the_bound_a_waiting_owner_does_not_register_until_an_entry_leaves,
    queue::a_waiting_attempt_is_told_how_many_owners_are_ahead_of_it,
    // What a re-read after an unknown outcome proves.
    reread::a_handed_lease_confirmed_only_by_a_read_is_never_acquired,
    reread::an_expired_entry_of_ours_in_a_multi_holder_key_is_not_acquired,
    reread::a_held_answer_from_a_read_carries_no_token,
    reread::an_in_document_lease_confirmed_only_by_a_read_is_never_acquired,
    // What a read shows of the waiting owners.
    waiters::a_read_shows_the_registered_owners_in_order_then_an_exclusive_mark,
    // Leader transitions.
    transitions::transitions_count_the_acquisitions_by_another_owner,
    // Several permits in one lease.
    permits::a_lease_takes_k_permits_all_or_none,
    permits::the_number_of_permits_changes_only_when_no_more_are_held,
    permits::a_retry_after_the_number_of_permits_changed_is_refused_while_others_hold,
);
