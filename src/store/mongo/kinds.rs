//! The BSON of shared and semaphore keys and of minimum holds ("Shared and
//! semaphore keys" and "Holding at least" in `store`): the acquire pipeline
//! of a shared lease or a permit and the reading of its outcome, the waiting
//! mark of an exclusive acquirer, and the renewal, release and force release
//! of any kind in one command. Pure functions, unit-tested without a server
//! like [`pipeline`](super::pipeline)'s; what the server does with them is
//! tested by the store contract (`store::contract::kinds`, `hold`).

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::rules::{bson_lease_id, inserted, next_token, our_shape};
use crate::LeaseKind;
use crate::key::LeaseKey;
use crate::store::replies::{FIRST_EXPIRY, LIVE, MINE, YIELDED};
use crate::store::{LeaseRef, field};

/// `$name`: the value of field `name`.
fn f(name: &str) -> String {
    format!("${name}")
}

/// `$$this.name`: field `name` of the array element at hand.
fn this(name: &str) -> String {
    format!("$$this.{name}")
}

/// Whether the document has holders (`hs` is an array).
fn has_holders() -> Document {
    doc! { "$isArray": f(field::HOLDERS) }
}

/// The entries of `hs` (empty if it is not an array).
fn entries() -> Document {
    doc! { "$cond": [has_holders(), f(field::HOLDERS), []] }
}

/// Whether the entry at hand is live by the server's clock.
fn entry_live() -> Document {
    doc! { "$gt": [this(field::EXPIRES_AT), "$$NOW"] }
}

/// Whether the entry at hand is the acquisition `lease_id` of `owner`.
fn entry_is(owner: &str, lease_id: Uuid) -> Document {
    doc! { "$and": [
        { "$eq": [this(field::LEASE_ID), bson_lease_id(lease_id)] },
        { "$eq": [this(field::OWNER), { "$literal": owner }] },
    ]}
}

/// Whether the entry at hand is one of `ids` of `owner`.
fn entry_among(owner: &str, ids: &[Uuid]) -> Document {
    let ids: Vec<Bson> = ids.iter().copied().map(bson_lease_id).collect();
    doc! { "$and": [
        { "$in": [this(field::LEASE_ID), ids] },
        { "$eq": [this(field::OWNER), { "$literal": owner }] },
    ]}
}

/// Whether the entry at hand is `owner`'s, with a lease id not in `except`.
fn entry_of_owner(owner: &str, except: &[Uuid]) -> Document {
    let except: Vec<Bson> = except.iter().copied().map(bson_lease_id).collect();
    doc! { "$and": [
        { "$eq": [this(field::OWNER), { "$literal": owner }] },
        { "$not": [{ "$in": [this(field::LEASE_ID), except] }] },
    ]}
}

/// The live entries of `hs` other than `lease_id` of `owner`.
fn live_others(owner: &str, lease_id: Uuid) -> Document {
    doc! { "$filter": { "input": entries(), "cond": { "$and": [
        entry_live(),
        { "$not": [entry_is(owner, lease_id)] },
    ]}}}
}

/// Whether the key has a live exclusive waiter's mark (`xw`) of another
/// owner than `owner` (an owner's own mark is of a waiter that left: its
/// manager serves its waiters in order, so it asks for a shared lease only
/// when no exclusive waiter of its own is ahead).
fn other_owners_mark(owner: &str) -> Document {
    doc! { "$and": [
        { "$gt": [format!("${}.{}", field::EXCLUSIVE_WAITER, field::EXPIRES_AT), "$$NOW"] },
        { "$ne": [format!("${}.{}", field::EXCLUSIVE_WAITER, field::OWNER), { "$literal": owner }] },
    ]}
}

/// A semaphore's number of permits as stored in `pm`.
fn stored_permits(permits: u32) -> i32 {
    i32::try_from(permits).unwrap_or(i32::MAX)
}

/// The acquire update of a shared lease or a permit ([`LeaseKind::Shared`],
/// [`LeaseKind::Permit`]): one `$replaceWith` over the key's document, as
/// the exclusive acquire (an upsert on `upsert_filter`,
/// docs/mongodb-behaviour.md, B1, B29), that appends this holder's entry
/// `{aid, lid, tok, acq, ts, exp}` to `hs` if it wins (see "Shared and semaphore keys" in `store`), dropping the
/// expired entries, and otherwise returns the document unchanged (no write,
/// B2). A retry (an entry of this lease id and owner id) renews that entry
/// and keeps its token. The top fields then describe the key: `aid`, `tok`,
/// `acq` of this acquisition, `ts` now, `exp` the latest entry's; `lid`,
/// `wt`, `yu`, `data` and `hl` of an earlier exclusive holder are gone.
///
/// As an exclusive acquisition ("Fairness between owners" in `store`), it
/// never takes a key this owner yielded (`yu`) before the end of the yield
/// window, and a `waiting` shared acquisition that finds another owner's
/// live exclusive lease marks it waited for (`wt`, once per holding period),
/// so that its release yields.
pub(in crate::store::mongo) fn multi_acquire_pipeline(
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    kind: LeaseKind,
    waiting: bool,
) -> Vec<Document> {
    let mine = doc! { "$gt": [{ "$size": "$$mine" }, 0] };
    let no_live = doc! { "$eq": [{ "$size": "$$live" }, 0] };
    // An exclusive holder: a lease (`lid`) or a minimum hold (`hl`). A key
    // whose last holder left has neither, and an `exp` of that release that
    // a later `$$NOW` may still be below (docs/mongodb-behaviour.md, B3).
    let exclusive_holder = doc! { "$or": [
        { "$ne": [{ "$type": f(field::LEASE_ID) }, "missing"] },
        { "$gt": [f(field::HOLD_UNTIL), "$$NOW"] },
    ]};
    let exclusive_held = doc! { "$and": [
        { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
        no_live.clone(),
        { "$not": [mine.clone()] },
        exclusive_holder,
    ]};
    let has_permits = doc! { "$ne": [{ "$type": f(field::PERMITS) }, "missing"] };
    let kind_admits = match kind {
        LeaseKind::Permit { permits } => doc! { "$or": [
            no_live.clone(),
            { "$and": [
                { "$eq": [f(field::PERMITS), stored_permits(permits)] },
                { "$lt": [{ "$size": "$$live" }, i64::from(permits)] },
            ]},
        ]},
        _ => doc! { "$and": [
            { "$or": [no_live, { "$not": [has_permits] }] },
            { "$not": [other_owners_mark(owner)] },
        ]},
    };
    let wins = doc! { "$or": [
        inserted(),
        mine.clone(),
        { "$and": [
            our_shape(),
            { "$not": [exclusive_held] },
            kind_admits,
            { "$not": [yielded_by(owner)] },
        ]},
    ]};
    let lost = if waiting && kind == LeaseKind::Shared {
        let held_by_other = doc! { "$and": [
            our_shape(),
            { "$eq": [{ "$type": f(field::LEASE_ID) }, "binData"] },
            { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
            { "$ne": [f(field::OWNER), { "$literal": owner }] },
        ]};
        let marked = doc! { "$mergeObjects": ["$$ROOT", {
            field::WAITING_SINCE: { "$ifNull": [f(field::WAITING_SINCE), "$$NOW"] },
        }]};
        Bson::from(doc! { "$cond": [held_by_other, marked, "$$ROOT"] })
    } else {
        Bson::from("$$ROOT")
    };
    let expires = doc! { "$add": ["$$NOW", ttl_ms] };
    let new_entry = doc! {
        field::OWNER: { "$literal": owner },
        field::LEASE_ID: bson_lease_id(lease_id),
        field::TOKEN: next_token(),
        field::ACQUIRED_AT: "$$NOW",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: expires.clone(),
    };
    let entry = doc! { "$cond": [
        mine,
        { "$mergeObjects": [
            { "$first": "$$mine" },
            { field::RENEWED_AT: "$$NOW", field::EXPIRES_AT: expires },
        ]},
        new_entry,
    ]};
    let mut acquired = doc! {
        field::ID: "$_id",
        field::OWNER: { "$literal": owner },
        field::TOKEN: { "$max": [f(field::TOKEN), "$$entry.tok"] },
        field::ACQUIRED_AT: "$$entry.acq",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$max": [{ "$max": "$$live.exp" }, "$$entry.exp"] },
        field::HOLDERS: { "$concatArrays": ["$$live", ["$$entry"]] },
    };
    if let LeaseKind::Permit { permits } = kind {
        acquired.insert(field::PERMITS, stored_permits(permits));
    }
    acquired.insert(field::RELEASED_AT, f(field::RELEASED_AT));
    acquired.insert(field::EXCLUSIVE_WAITER, f(field::EXCLUSIVE_WAITER));
    let mine_entries =
        doc! { "$filter": { "input": entries(), "cond": entry_is(owner, lease_id) } };
    vec![doc! { "$replaceWith": { "$let": {
        "vars": { "live": live_others(owner, lease_id), "mine": mine_entries },
        "in": { "$cond": [
            wins,
            { "$let": { "vars": { "entry": entry }, "in": acquired } },
            lost,
        ]},
    }}}]
}

/// Whether `owner` yielded the key to another owner's waiter and the yield
/// window is not over (`aid` is `owner`, `yu > $$NOW`).
fn yielded_by(owner: &str) -> Document {
    doc! { "$and": [
        { "$eq": [f(field::OWNER), { "$literal": owner }] },
        { "$gt": [f(field::YIELD_UNTIL), "$$NOW"] },
    ]}
}

/// The projection of the reads that decide a shared or permit acquisition
/// (the reply of [`multi_acquire_pipeline`], or a re-read): the top fields,
/// the exclusive waiter's mark, and, computed on the server
/// (docs/mongodb-behaviour.md, B11) rather than the whole `hs`, this
/// acquisition's entry, the number of other live entries and the earliest
/// of their expiries.
pub(in crate::store::mongo) fn multi_acquire_projection(owner: &str, lease_id: Uuid) -> Document {
    let mine = doc! { "$filter": { "input": entries(), "cond": entry_is(owner, lease_id) } };
    let live = live_others(owner, lease_id);
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::EXPIRES_AT: 1,
        field::PERMITS: 1, field::HOLD_UNTIL: 1, "now": "$$NOW",
        field::EXCLUSIVE_WAITER: { "$cond": [
            other_owners_mark(owner), f(field::EXCLUSIVE_WAITER), "$$REMOVE",
        ]},
        MINE: { "$first": mine },
        LIVE: { "$size": live.clone() },
        FIRST_EXPIRY: { "$min": { "$map": { "input": live, "in": this(field::EXPIRES_AT) } } },
        YIELDED: { "$cond": [yielded_by(owner), f(field::YIELD_UNTIL), "$$REMOVE"] },
    }
}

/// The waiting mark of an exclusive acquirer (`xw`): the condition "the
/// document has live shared holders (not permits)" and the document with
/// the mark `{aid: owner, exp: $$NOW + ttl_ms}` written over an older one.
/// Part of a losing waiting exclusive attempt ([`acquire_pipeline`](super::pipeline::acquire_pipeline)).
pub(in crate::store::mongo) fn exclusive_waiter_mark(
    owner: &str,
    ttl_ms: i64,
) -> (Document, Document) {
    let shared_live = doc! { "$and": [
        our_shape(),
        has_holders(),
        { "$eq": [{ "$type": f(field::PERMITS) }, "missing"] },
        { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    ]};
    let marked = doc! { "$mergeObjects": ["$$ROOT", { field::EXCLUSIVE_WAITER: {
        field::OWNER: { "$literal": owner },
        field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
    }}]};
    (shared_live, marked)
}

/// The documents holding any of `leases` of `owner`: `_id` among their
/// keys (one indexed `$in`), and either the top `lid` (an exclusive lease)
/// or an entry of `hs` (a shared or permit holder) among their lease ids,
/// with `owner`'s owner id. The filter of renewals and releases.
pub(in crate::store::mongo) fn holder_filter(owner: &str, leases: &[LeaseRef]) -> Document {
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        "$or": [
            { field::LEASE_ID: { "$in": ids.clone() }, field::OWNER: { "$eq": owner } },
            { field::HOLDERS: { "$elemMatch": {
                field::LEASE_ID: { "$in": ids },
                field::OWNER: { "$eq": owner },
            }}},
        ],
    }
}

/// The lock of `key` still under `lease_id` of `owner` and live by the
/// server's clock: an exclusive lease (`lid` at the top) or a holder of a
/// shared or semaphore key (an entry of `hs`). The transaction helper's
/// check (whose write sets `ts` alone: `transaction::check_update`).
pub(in crate::store::mongo) fn holder_check_filter(
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
) -> Document {
    let lid = bson_lease_id(lease_id);
    let live_entry = doc! { "$anyElementTrue": [{ "$map": { "input": entries(), "in": { "$and": [
        entry_is(owner, lease_id),
        entry_live(),
    ]}}}]};
    doc! {
        field::ID: key,
        "$or": [
            { field::LEASE_ID: lid.clone(), field::OWNER: { "$eq": owner } },
            { field::HOLDERS: { "$elemMatch": {
                field::LEASE_ID: lid.clone(),
                field::OWNER: { "$eq": owner },
            }}},
        ],
        "$expr": { "$or": [
            { "$and": [
                { "$eq": [f(field::LEASE_ID), lid] },
                { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
            ]},
            live_entry,
        ]},
    }
}

/// The documents of exclusive leases among `leases` of `owner`: `_id`
/// among their keys, `lid` among their lease ids (one `$in` each, one
/// indexed query) and `aid` the owner id. The filter of a renewal batch
/// with no holder of a shared or semaphore key.
pub(in crate::store::mongo) fn exclusive_filter(owner: &str, leases: &[LeaseRef]) -> Document {
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        field::LEASE_ID: { "$in": ids },
        field::OWNER: { "$eq": owner },
    }
}

/// The renewal of exclusive leases ([`exclusive_filter`]): `ts = $$NOW`,
/// `exp = $$NOW + ttl_ms`, then `exp = max(exp, hl)` (a second stage, so
/// that the first is the renewal as it always was); nothing else changes.
pub(in crate::store::mongo) fn renew_exclusive_update(ttl_ms: i64) -> Vec<Document> {
    vec![
        doc! { "$set": {
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
        }},
        doc! { "$set": {
            field::EXPIRES_AT: { "$max": [f(field::EXPIRES_AT), f(field::HOLD_UNTIL)] },
        }},
    ]
}

/// The lease ids of `leases`.
pub(in crate::store::mongo) fn lease_ids(leases: &[LeaseRef]) -> Vec<Uuid> {
    leases.iter().map(|l| l.lease_id).collect()
}

/// The renewal of a batch of any kinds (the leases `ids` of `owner`), one
/// `updateMany` with [`holder_filter`]: `ts = $$NOW`; an exclusive lease's
/// `exp = max($$NOW + ttl_ms, hl)`; a holder's entry `ts` and `exp =
/// $$NOW + ttl_ms`, and the top `exp` the latest of the entries'. The
/// first stage sets `exp = $$NOW + ttl_ms` as the plain renewal does, the
/// second raises it to `hl` or the latest entry's.
pub(in crate::store::mongo) fn renew_any_update(
    owner: &str,
    ids: &[Uuid],
    ttl_ms: i64,
) -> Vec<Document> {
    let expires = doc! { "$add": ["$$NOW", ttl_ms] };
    let renewed = doc! { "$map": { "input": f(field::HOLDERS), "in": { "$cond": [
        entry_among(owner, ids),
        { "$mergeObjects": ["$$this", { field::RENEWED_AT: "$$NOW", field::EXPIRES_AT: expires.clone() }] },
        "$$this",
    ]}}};
    vec![
        doc! { "$set": {
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: expires,
            field::HOLDERS: { "$cond": [has_holders(), renewed, "$$REMOVE"] },
        }},
        doc! { "$set": { field::EXPIRES_AT: { "$max": [
            f(field::EXPIRES_AT),
            f(field::HOLD_UNTIL),
            { "$max": format!("${}.{}", field::HOLDERS, field::EXPIRES_AT) },
        ]}}},
    ]
}

/// Which leases a release takes away: those of a batch (`ids` of `owner`),
/// or every lease of an owner (with a lease id not in `except`).
pub(in crate::store::mongo) enum Released<'a> {
    /// The leases `ids` of `owner`.
    Leases { owner: &'a str, ids: Vec<Uuid> },
    /// Every lease of `owner`, except the lease ids `except`.
    Owner { owner: &'a str, except: Vec<Uuid> },
}

/// The release of any kinds, one update over every matched document: an
/// exclusive lease as before (`exp = max(min(exp, $$NOW), hl)`, `lid` and
/// `wt` removed, `yu` if another owner waited); a document with holders
/// loses the released entries and the expired ones, gets `rl = $$NOW` (what
/// the change stream of releases announces) and `exp` = the latest
/// remaining entry's, or now if none remains (then `hs` and `pm` go too).
/// An exclusive key with another owner's live entry in its queue is handed
/// to the first one instead ([`pick_stage`](super::queue::pick_stage),
/// [`handoff_stages`](super::queue::handoff_stages)).
pub(in crate::store::mongo) fn release_any_update(
    released: &Released<'_>,
    yield_ms: i64,
) -> Vec<Document> {
    let selected = match released {
        Released::Leases { owner, ids } => entry_among(owner, ids),
        Released::Owner { owner, except } => entry_of_owner(owner, except),
    };
    let waited = doc! { "$ne": [{ "$type": f(field::WAITING_SINCE) }, "missing"] };
    let remain =
        doc! { "$cond": [has_holders(), { "$gt": [{ "$size": f(field::HOLDERS) }, 0] }, false] };
    let [handoff, cleanup] = super::queue::handoff_stages();
    vec![
        super::queue::pick_stage(),
        doc! { "$set": {
            field::EXPIRES_AT: { "$cond": [
                has_holders(),
                f(field::EXPIRES_AT),
                { "$max": [{ "$min": [f(field::EXPIRES_AT), "$$NOW"] }, f(field::HOLD_UNTIL)] },
            ]},
            field::YIELD_UNTIL: { "$cond": [
                waited,
                { "$add": ["$$NOW", yield_ms] },
                f(field::YIELD_UNTIL),
            ]},
            field::RELEASED_AT: { "$cond": [has_holders(), "$$NOW", f(field::RELEASED_AT)] },
            field::HOLDERS: { "$cond": [
                has_holders(),
                { "$filter": { "input": f(field::HOLDERS), "cond": { "$and": [
                    entry_live(),
                    { "$not": [selected] },
                ]}}},
                "$$REMOVE",
            ]},
        }},
        doc! { "$set": {
            field::EXPIRES_AT: { "$cond": [
                has_holders(),
                { "$ifNull": [{ "$max": format!("${}.{}", field::HOLDERS, field::EXPIRES_AT) }, "$$NOW"] },
                f(field::EXPIRES_AT),
            ]},
            field::PERMITS: { "$cond": [remain.clone(), f(field::PERMITS), "$$REMOVE"] },
            field::HOLDERS: { "$cond": [remain, f(field::HOLDERS), "$$REMOVE"] },
        }},
        doc! { "$unset": [field::LEASE_ID, field::WAITING_SINCE] },
        handoff,
        cleanup,
    ]
}

/// Every document with a holder entry of `owner` (a lease id not in
/// `except`), of our shape: the multi-holder side of a release by owner id.
pub(in crate::store::mongo) fn owner_holders_filter(owner: &str, except: &[Uuid]) -> Document {
    let except: Vec<Bson> = except.iter().copied().map(bson_lease_id).collect();
    doc! {
        field::HOLDERS: { "$elemMatch": {
            field::OWNER: { "$eq": owner },
            field::LEASE_ID: { "$nin": except },
        }},
        field::TOKEN: { "$type": "long" },
        field::EXPIRES_AT: { "$type": "date" },
    }
}

/// `key` if held now by anything of our shape: an exclusive lease, holders
/// in `hs`, or a minimum hold (`exp > $$NOW` covers them all).
pub(in crate::store::mongo) fn force_release_any_filter(key: &LeaseKey) -> Document {
    doc! {
        field::ID: key,
        field::TOKEN: { "$type": "long" },
        "$or": [
            { field::LEASE_ID: { "$exists": true } },
            { field::HOLDERS: { "$exists": true } },
            { field::HOLD_UNTIL: { "$exists": true } },
        ],
        "$expr": { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    }
}

/// A force release: the key is free at once, whoever holds it and however:
/// `exp` moves to now, `rl = $$NOW`, and the exclusive holder (`lid`,
/// `wt`), every holder in `hs` (with `pm`), the minimum hold (`hl`) and the
/// exclusive waiter's mark (`xw`) are removed; `yu` as in a release.
pub(in crate::store::mongo) fn force_release_update(yield_ms: i64) -> Vec<Document> {
    let waited = doc! { "$ne": [{ "$type": f(field::WAITING_SINCE) }, "missing"] };
    vec![
        doc! { "$set": {
            field::EXPIRES_AT: { "$min": [f(field::EXPIRES_AT), "$$NOW"] },
            field::YIELD_UNTIL: { "$cond": [
                waited,
                { "$add": ["$$NOW", yield_ms] },
                f(field::YIELD_UNTIL),
            ]},
            field::RELEASED_AT: "$$NOW",
        }},
        doc! { "$unset": [
            field::LEASE_ID, field::WAITING_SINCE, field::HOLDERS, field::PERMITS,
            field::HOLD_UNTIL, field::EXCLUSIVE_WAITER,
        ]},
    ]
}

/// The document of `lease` of `owner` as a holder in `hs`: the filter of a
/// holder's payload write, with [`holder_payload_update`].
pub(in crate::store::mongo) fn holder_payload_filter(owner: &str, lease: &LeaseRef) -> Document {
    doc! {
        field::ID: &lease.key,
        field::HOLDERS: { "$elemMatch": {
            field::LEASE_ID: bson_lease_id(lease.lease_id),
            field::OWNER: { "$eq": owner },
        }},
    }
}

/// Sets the payload of the entry matched by [`holder_payload_filter`].
pub(in crate::store::mongo) fn holder_payload_update(payload: Document) -> Document {
    doc! { "$set": { format!("{}.$.{}", field::HOLDERS, field::PAYLOAD): payload } }
}

#[cfg(test)]
mod tests;
