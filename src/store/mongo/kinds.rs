//! The BSON of shared and semaphore keys and of minimum holds ("Shared and
//! semaphore keys" and "Holding at least" in `store`): the acquire pipeline
//! of a shared lease or a permit and the reading of its outcome, the waiting
//! mark of an exclusive acquirer, and the renewal, release and force release
//! of any kind in one command. Pure functions, unit-tested without a server
//! like [`pipeline`](super::pipeline)'s; what the server does with them is
//! tested by the store contract (`store::contract::kinds`, `hold`).

use std::time::Duration;

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::pipeline::{bson_lease_id, fresh_document, next_token, our_shape};
use crate::LeaseKind;
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, LeaseRef, field, foreign_owner, is_our_shape};

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

/// A semaphore's number of permits as stored in `pm`.
fn stored_permits(permits: u32) -> i32 {
    i32::try_from(permits).unwrap_or(i32::MAX)
}

/// The acquire update of a shared lease or a permit ([`LeaseKind::Shared`],
/// [`LeaseKind::Permit`]): one `$replaceWith` over the key's document, as
/// the exclusive acquire (an upsert on `_id` alone, docs/mongodb-behaviour.md,
/// B1), that appends this holder's entry `{aid, lid, tok, acq, ts, exp}` to
/// `hs` if it wins (see "Shared and semaphore keys" in `store`), dropping the
/// expired entries, and otherwise returns the document unchanged (no write,
/// B2). A retry (an entry of this lease id and owner id) renews that entry
/// and keeps its token. The top fields then describe the key: `aid`, `tok`,
/// `acq` of this acquisition, `ts` now, `exp` the latest entry's; `lid`,
/// `wt`, `yu`, `data` and `hl` of an earlier exclusive holder are gone.
pub(in crate::store::mongo) fn multi_acquire_pipeline(
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    kind: LeaseKind,
) -> Vec<Document> {
    let mine = doc! { "$gt": [{ "$size": "$$mine" }, 0] };
    let no_live = doc! { "$eq": [{ "$size": "$$live" }, 0] };
    let exclusive_held = doc! { "$and": [
        { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
        no_live.clone(),
        { "$not": [mine.clone()] },
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
            { "$not": [{ "$gt": [format!("${}.{}", field::EXCLUSIVE_WAITER, field::EXPIRES_AT), "$$NOW"] }] },
        ]},
    };
    let wins = doc! { "$or": [
        fresh_document(),
        mine.clone(),
        { "$and": [our_shape(), { "$not": [exclusive_held] }, kind_admits] },
    ]};
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
            "$$ROOT",
        ]},
    }}}]
}

/// Field of [`multi_acquire_projection`]: this acquisition's entry, if any.
const MINE: &str = "me";
/// Field of [`multi_acquire_projection`]: how many other live entries.
const LIVE: &str = "live";
/// Field of [`multi_acquire_projection`]: the earliest `exp` of those.
const FIRST_EXPIRY: &str = "first";

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
        field::PERMITS: 1, field::EXCLUSIVE_WAITER: 1, "now": "$$NOW",
        MINE: { "$first": mine },
        LIVE: { "$size": live.clone() },
        FIRST_EXPIRY: { "$min": { "$map": { "input": live, "in": this(field::EXPIRES_AT) } } },
    }
}

/// Milliseconds from `now` to `until` (zero if past).
fn until(until: mongodb::bson::DateTime, now: i64) -> Duration {
    Duration::from_millis(until.timestamp_millis().saturating_sub(now).max(0) as u64)
}

/// An integer field of a projected document (int32 or int64).
fn int(doc: &Document, name: &str) -> Option<i64> {
    match doc.get(name)? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

/// The exclusive waiter's mark of a projected document, if live at `now`:
/// its owner id and expiry.
fn live_mark(doc: &Document, now: i64) -> Option<(String, Duration)> {
    let mark = doc.get_document(field::EXCLUSIVE_WAITER).ok()?;
    let exp = mark.get_datetime(field::EXPIRES_AT).ok()?;
    (exp.timestamp_millis() > now).then(|| {
        let owner = mark.get_str(field::OWNER).unwrap_or_default().to_string();
        (owner, until(*exp, now))
    })
}

/// Reads what a shared or permit acquisition of `kind` found, out of a document projected with
/// [`multi_acquire_projection`]: `Acquired` with this entry's token;
/// `Mismatch` for live holders of another kind (a live exclusive holder is
/// a mismatch for a permit; a shared acquirer waits for it); else `Held`
/// until the earliest live permit's expiry (a full semaphore), the
/// exclusive holder's expiry, or the end of a live exclusive waiter's mark
/// (held by that waiter). A document of foreign shape is held by a foreign
/// holder, with no known remaining time.
pub(in crate::store::mongo) fn classify_multi(
    key: &LeaseKey,
    kind: LeaseKind,
    doc: &Document,
) -> AcquireOutcome {
    if !is_our_shape(doc) {
        tracing::trace!(%key, "held by a foreign holder");
        return AcquireOutcome::Held {
            holder: foreign_owner(doc),
            remaining: None,
        };
    }
    if let Ok(entry) = doc.get_document(MINE) {
        return AcquireOutcome::Acquired {
            token: entry.get_i64(field::TOKEN).unwrap_or(0) as u64,
        };
    }
    let exp = *doc.get_datetime(field::EXPIRES_AT).expect("our shape");
    let now = doc
        .get_datetime("now")
        .map(|d| d.timestamp_millis())
        .unwrap_or(exp.timestamp_millis());
    let holder = doc.get_str(field::OWNER).unwrap_or_default().to_string();
    let held = |holder: String, remaining| AcquireOutcome::Held {
        holder,
        remaining: Some(remaining),
    };
    let mark = if kind == LeaseKind::Shared {
        live_mark(doc, now)
    } else {
        None
    };
    if int(doc, LIVE).unwrap_or(0) == 0 {
        if exp.timestamp_millis() > now {
            if kind == LeaseKind::Shared {
                return held(holder, until(exp, now));
            }
            return AcquireOutcome::Mismatch {
                stored: LeaseKind::Exclusive,
            };
        }
        return match mark {
            Some((waiter, remaining)) => held(waiter, remaining),
            // Free by now: a write in between; try again at once.
            None => held(holder, Duration::ZERO),
        };
    }
    let stored = match int(doc, field::PERMITS) {
        Some(n) => LeaseKind::Permit {
            permits: u32::try_from(n).unwrap_or(0),
        },
        None => LeaseKind::Shared,
    };
    if stored != kind {
        return AcquireOutcome::Mismatch { stored };
    }
    match (kind, mark) {
        (LeaseKind::Shared, Some((waiter, remaining))) => held(waiter, remaining),
        (LeaseKind::Shared, None) => held(holder, Duration::ZERO),
        _ => {
            let first = doc.get_datetime(FIRST_EXPIRY).map(|d| until(*d, now));
            held(holder, first.unwrap_or(until(exp, now)))
        }
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

/// A waiting exclusive attempt that found shared holders and left its mark
/// (`xw.aid` is `owner` in the returned document, projected with
/// [`acquire_projection`](super::pipeline::acquire_projection)) retries
/// within half its TTL, so the mark stays live while it waits.
pub(in crate::store::mongo) fn cap_for_mark(
    outcome: AcquireOutcome,
    doc: &Document,
    owner: &str,
    ttl_ms: i64,
) -> AcquireOutcome {
    let marked = doc
        .get_document(field::EXCLUSIVE_WAITER)
        .is_ok_and(|mark| mark.get_str(field::OWNER) == Ok(owner));
    match outcome {
        AcquireOutcome::Held {
            holder,
            remaining: Some(remaining),
        } if marked => AcquireOutcome::Held {
            holder,
            remaining: Some(remaining.min(Duration::from_millis((ttl_ms / 2).max(0) as u64))),
        },
        other => other,
    }
}

/// The documents holding any of `leases` of `owner`: `_id` among their
/// keys (one indexed `$in`), and either the top `lid` (an exclusive lease)
/// or an entry of `hs` (a shared or permit holder) among their lease ids,
/// with `owner`'s owner id. The filter of renewals and releases.
pub(in crate::store::mongo) fn holder_filter(owner: &str, leases: &[LeaseRef]) -> Document {
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.as_bson().clone()).collect();
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

/// The lease ids of `leases`.
pub(in crate::store::mongo) fn lease_ids(leases: &[LeaseRef]) -> Vec<Uuid> {
    leases.iter().map(|l| l.lease_id).collect()
}

/// The renewal of a batch of any kinds (the leases `ids` of `owner`), one
/// `updateMany` with [`holder_filter`]: `ts = $$NOW`; an exclusive lease's
/// `exp = max($$NOW + ttl_ms, hl)`; a holder's entry `ts` and `exp =
/// $$NOW + ttl_ms`, and the top `exp = max(exp, $$NOW + ttl_ms)`.
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
    vec![doc! { "$set": {
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$cond": [
            has_holders(),
            { "$max": [f(field::EXPIRES_AT), expires.clone()] },
            { "$max": [expires, f(field::HOLD_UNTIL)] },
        ]},
        field::HOLDERS: { "$cond": [has_holders(), renewed, "$$REMOVE"] },
    }}]
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
    vec![
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
mod tests {
    use mongodb::bson::DateTime;

    use super::*;
    use crate::store::mongo::pipeline::{acquire_pipeline, classify};

    const LID: Uuid = Uuid::from_u128(0x1234);

    fn bson(d: Document) -> Bson {
        Bson::Document(d)
    }

    /// The value at a dotted path (array indexes as numbers).
    fn at<'a>(doc: &'a Document, path: &str) -> &'a Bson {
        let mut parts = path.split('.');
        let mut value = doc.get(parts.next().unwrap()).expect(path);
        for part in parts {
            value = match value {
                Bson::Document(d) => d.get(part),
                Bson::Array(a) => a.get(part.parse::<usize>().expect(path)),
                _ => None,
            }
            .unwrap_or_else(|| panic!("{path} in {doc}"));
        }
        value
    }

    fn date(ms: i64) -> DateTime {
        DateTime::from_millis(ms)
    }

    #[test]
    fn a_permit_wins_on_a_new_document_a_retry_or_a_free_place_of_the_same_number() {
        let pipeline = multi_acquire_pipeline("me", 30_000, LID, LeaseKind::Permit { permits: 3 });
        assert_eq!(pipeline.len(), 1, "one stage, one round trip");
        let body = pipeline[0].get_document("$replaceWith").unwrap();
        assert_eq!(
            at(body, "$let.vars.live"),
            &bson(live_others("me", LID)),
            "the other live entries: the expired ones are dropped"
        );
        let cond = at(body, "$let.in.$cond").as_array().unwrap();
        let wins = cond[0].as_document().unwrap();
        assert_eq!(at(wins, "$or.0"), &bson(fresh_document()));
        assert_eq!(
            at(wins, "$or.1"),
            &bson(doc! { "$gt": [{ "$size": "$$mine" }, 0] })
        );
        assert_eq!(at(wins, "$or.2.$and.0"), &bson(our_shape()));
        assert_eq!(
            at(wins, "$or.2.$and.2.$or.1"),
            &bson(doc! { "$and": [
                { "$eq": ["$pm", 3] },
                { "$lt": [{ "$size": "$$live" }, 3_i64] },
            ]})
        );
        assert_eq!(cond[2], Bson::from("$$ROOT"), "else nothing written");
        let acquired = at(cond[1].as_document().unwrap(), "$let.in")
            .as_document()
            .unwrap();
        assert_eq!(
            acquired.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "_id", "aid", "tok", "acq", "ts", "exp", "hs", "pm", "rl", "xw"
            ],
            "no lid, wt, yu, data nor hl"
        );
        assert_eq!(at(acquired, "pm"), &Bson::Int32(3));
        assert_eq!(at(acquired, "aid"), &bson(doc! { "$literal": "me" }));
        assert_eq!(
            at(acquired, "hs"),
            &bson(doc! { "$concatArrays": ["$$live", ["$$entry"]] })
        );
        let entry = at(cond[1].as_document().unwrap(), "$let.vars.entry.$cond")
            .as_array()
            .unwrap();
        let new_entry = entry[2].as_document().unwrap();
        assert_eq!(at(new_entry, "tok"), &bson(next_token()));
        assert_eq!(at(new_entry, "lid"), &bson_lease_id(LID));
        assert_eq!(
            at(new_entry, "exp"),
            &bson(doc! { "$add": ["$$NOW", 30_000_i64] })
        );
    }

    #[test]
    fn a_shared_lease_never_wins_over_live_permits_or_a_live_exclusive_waiters_mark() {
        let pipeline = multi_acquire_pipeline("me", 30_000, LID, LeaseKind::Shared);
        let body = pipeline[0].get_document("$replaceWith").unwrap();
        let admits = at(body, "$let.in.$cond.0.$or.2.$and.2")
            .as_document()
            .unwrap();
        assert_eq!(
            admits,
            &doc! { "$and": [
                { "$or": [
                    { "$eq": [{ "$size": "$$live" }, 0] },
                    { "$not": [{ "$ne": [{ "$type": "$pm" }, "missing"] }] },
                ]},
                { "$not": [{ "$gt": ["$xw.exp", "$$NOW"] }] },
            ]}
        );
        let acquired = at(body, "$let.in.$cond.1.$let.in").as_document().unwrap();
        assert!(!acquired.contains_key("pm"));
    }

    fn projected(live: i32, exp_ms: i64, now_ms: i64) -> Document {
        doc! {
            "_id": "k", "aid": "them", "tok": 9_i64, "exp": date(exp_ms),
            "now": date(now_ms), "live": live,
        }
    }

    #[test]
    fn a_retry_reads_its_own_entrys_token_and_a_foreign_document_is_held_with_no_expiry() {
        let key: LeaseKey = "k".into();
        let mut retry = projected(2, 50_000, 1_000);
        retry.insert("me", doc! { "tok": 7_i64, "lid": bson_lease_id(LID) });
        let permit = LeaseKind::Permit { permits: 3 };
        assert_eq!(
            classify_multi(&key, permit, &retry),
            AcquireOutcome::Acquired { token: 7 }
        );
        let foreign = doc! { "_id": "k", "aid": "java", "ts": date(5) };
        assert_eq!(
            classify_multi(&key, permit, &foreign),
            AcquireOutcome::Held {
                holder: "java".into(),
                remaining: None,
            }
        );
    }

    #[test]
    fn a_full_semaphore_is_held_until_its_earliest_live_holders_expiry() {
        let mut full = projected(2, 50_000, 1_000);
        full.insert("pm", 2);
        full.insert("first", date(11_000));
        assert_eq!(
            classify_multi(&"k".into(), LeaseKind::Permit { permits: 2 }, &full),
            AcquireOutcome::Held {
                holder: "them".into(),
                remaining: Some(Duration::from_secs(10)),
            }
        );
    }

    #[test]
    fn live_holders_of_another_kind_are_a_mismatch() {
        let key: LeaseKey = "k".into();
        let mut permits = projected(1, 50_000, 1_000);
        permits.insert("pm", 2);
        let two = LeaseKind::Permit { permits: 2 };
        for asked in [LeaseKind::Permit { permits: 3 }, LeaseKind::Shared] {
            assert_eq!(
                classify_multi(&key, asked, &permits),
                AcquireOutcome::Mismatch { stored: two }
            );
        }
        let shared = projected(1, 50_000, 1_000);
        assert_eq!(
            classify_multi(&key, two, &shared),
            AcquireOutcome::Mismatch {
                stored: LeaseKind::Shared
            }
        );
        // A live exclusive holder: a mismatch for a permit; shared waits.
        let exclusive = projected(0, 50_000, 1_000);
        assert_eq!(
            classify_multi(&key, two, &exclusive),
            AcquireOutcome::Mismatch {
                stored: LeaseKind::Exclusive
            }
        );
        assert_eq!(
            classify_multi(&key, LeaseKind::Shared, &exclusive),
            AcquireOutcome::Held {
                holder: "them".into(),
                remaining: Some(Duration::from_secs(49)),
            }
        );
        // An exclusive acquisition finds live permits: a mismatch.
        let mut stored = projected(1, 50_000, 1_000);
        stored.insert("pm", 2);
        stored.insert("lid", bson_lease_id(Uuid::from_u128(5)));
        assert_eq!(
            classify(&key, "me", LID, &stored),
            AcquireOutcome::Mismatch { stored: two }
        );
        stored.insert("exp", date(500));
        assert!(matches!(
            classify(&key, "me", LID, &stored),
            AcquireOutcome::Held { .. }
        ));
    }

    #[test]
    fn a_shared_acquisition_is_held_by_a_live_exclusive_waiter_until_its_mark_ends() {
        let mut marked = projected(1, 50_000, 1_000);
        marked.insert("xw", doc! { "aid": "writer", "exp": date(4_000) });
        let held_by_writer = AcquireOutcome::Held {
            holder: "writer".into(),
            remaining: Some(Duration::from_secs(3)),
        };
        assert_eq!(
            classify_multi(&"k".into(), LeaseKind::Shared, &marked),
            held_by_writer
        );
        marked.insert("live", 0);
        marked.insert("exp", date(1_000));
        assert_eq!(
            classify_multi(&"k".into(), LeaseKind::Shared, &marked),
            held_by_writer
        );
        marked.insert("xw", doc! { "aid": "writer", "exp": date(900) });
        assert_eq!(
            classify_multi(&"k".into(), LeaseKind::Shared, &marked),
            AcquireOutcome::Held {
                holder: "them".into(),
                remaining: Some(Duration::ZERO),
            },
            "an expired mark blocks nobody: try again at once"
        );
    }

    #[test]
    fn the_projection_computes_this_entry_the_live_count_and_the_first_expiry_on_the_server() {
        let projection = multi_acquire_projection("me", LID);
        assert_eq!(at(&projection, "now"), &Bson::from("$$NOW"));
        assert_eq!(
            at(&projection, "live"),
            &bson(doc! { "$size": live_others("me", LID) })
        );
        assert_eq!(
            at(&projection, "me.$first.$filter.cond"),
            &bson(entry_is("me", LID))
        );
        assert!(!projection.contains_key("hs"), "never the whole array");
    }

    #[test]
    fn a_waiting_exclusive_attempt_marks_only_live_shared_holders_and_retries_within_half_its_ttl()
    {
        let (shared_live, marked) = exclusive_waiter_mark("me", 8_000);
        assert_eq!(
            shared_live,
            doc! { "$and": [
                our_shape(),
                { "$isArray": "$hs" },
                { "$eq": [{ "$type": "$pm" }, "missing"] },
                { "$gt": ["$exp", "$$NOW"] },
            ]}
        );
        assert_eq!(
            marked,
            doc! { "$mergeObjects": ["$$ROOT", { "xw": {
                "aid": { "$literal": "me" },
                "exp": { "$add": ["$$NOW", 8_000_i64] },
            }}]}
        );
        let held = |remaining| AcquireOutcome::Held {
            holder: "reader".into(),
            remaining: Some(remaining),
        };
        let ours = doc! { "xw": { "aid": "me" } };
        let theirs = doc! { "xw": { "aid": "other" } };
        let long = Duration::from_secs(20);
        assert_eq!(
            cap_for_mark(held(long), &ours, "me", 8_000),
            held(Duration::from_secs(4))
        );
        assert_eq!(cap_for_mark(held(long), &theirs, "me", 8_000), held(long));
        assert_eq!(cap_for_mark(held(long), &doc! {}, "me", 8_000), held(long));
    }

    #[test]
    fn an_exclusive_acquisition_held_at_least_writes_hl_and_never_expires_before_it() {
        let plain = acquire_pipeline("me", 30_000, LID, false, None);
        let acquired = at(&plain[0], "$replaceWith.$cond.1").as_document().unwrap();
        assert!(!acquired.contains_key("hl"), "a new acquisition removes hl");
        let held = acquire_pipeline("me", 30_000, LID, false, Some(90_000));
        let acquired = at(&held[0], "$replaceWith.$cond.1").as_document().unwrap();
        let mine = at(&held[0], "$replaceWith.$cond.0.$or.1");
        let hold_until = doc! { "$cond": [
            mine.clone(),
            { "$ifNull": ["$hl", { "$add": ["$$NOW", 90_000_i64] }] },
            { "$add": ["$$NOW", 90_000_i64] },
        ]};
        assert_eq!(at(acquired, "hl"), &bson(hold_until.clone()));
        assert_eq!(
            at(acquired, "exp"),
            &bson(doc! { "$max": [{ "$add": ["$$NOW", 30_000_i64] }, hold_until] })
        );
    }

    fn leases() -> Vec<LeaseRef> {
        vec![
            LeaseRef {
                key: "a".into(),
                lease_id: LID,
            },
            LeaseRef {
                key: "b".into(),
                lease_id: Uuid::from_u128(7),
            },
        ]
    }

    #[test]
    fn renewals_and_releases_match_a_lease_at_the_top_or_as_an_entry_of_its_owner() {
        let ids = vec![bson_lease_id(LID), bson_lease_id(Uuid::from_u128(7))];
        assert_eq!(
            holder_filter("me", &leases()),
            doc! {
                "_id": { "$in": ["a", "b"] },
                "$or": [
                    { "lid": { "$in": ids.clone() }, "aid": { "$eq": "me" } },
                    { "hs": { "$elemMatch": { "lid": { "$in": ids }, "aid": { "$eq": "me" } } } },
                ],
            }
        );
        assert_eq!(
            owner_holders_filter("me", &[LID]),
            doc! {
                "hs": { "$elemMatch": { "aid": { "$eq": "me" }, "lid": { "$nin": [bson_lease_id(LID)] } } },
                "tok": { "$type": "long" },
                "exp": { "$type": "date" },
            }
        );
    }

    #[test]
    fn renewal_keeps_exp_at_least_hl_and_renews_only_the_batchs_entries() {
        let ids = lease_ids(&leases());
        let update = renew_any_update("me", &ids, 5_000);
        assert_eq!(update.len(), 1, "one stage");
        let set = update[0].get_document("$set").unwrap();
        let expires = doc! { "$add": ["$$NOW", 5_000_i64] };
        assert_eq!(at(set, "ts"), &Bson::from("$$NOW"));
        assert_eq!(
            at(set, "exp"),
            &bson(doc! { "$cond": [
                { "$isArray": "$hs" },
                { "$max": ["$exp", expires.clone()] },
                { "$max": [expires.clone(), "$hl"] },
            ]})
        );
        assert_eq!(
            at(set, "hs.$cond.1.$map.in.$cond.0"),
            &bson(entry_among("me", &ids))
        );
        assert_eq!(at(set, "hs.$cond.2"), &Bson::from("$$REMOVE"));
    }

    #[test]
    fn release_removes_the_entries_sets_rl_and_keeps_an_exclusive_lease_until_hl() {
        let released = Released::Leases {
            owner: "me",
            ids: vec![LID],
        };
        let update = release_any_update(&released, 2_000);
        assert_eq!(update.len(), 3);
        let first = update[0].get_document("$set").unwrap();
        assert_eq!(
            at(first, "exp.$cond.2"),
            &bson(doc! { "$max": [{ "$min": ["$exp", "$$NOW"] }, "$hl"] })
        );
        assert_eq!(
            at(first, "rl"),
            &bson(doc! { "$cond": [{ "$isArray": "$hs" }, "$$NOW", "$rl"] })
        );
        assert_eq!(
            at(first, "hs.$cond.1.$filter.cond"),
            &bson(doc! { "$and": [
                { "$gt": ["$$this.exp", "$$NOW"] },
                { "$not": [entry_among("me", &[LID])] },
            ]})
        );
        let second = update[1].get_document("$set").unwrap();
        assert_eq!(
            at(second, "exp.$cond.1"),
            &bson(doc! { "$ifNull": [{ "$max": "$hs.exp" }, "$$NOW"] })
        );
        assert_eq!(update[2], doc! { "$unset": ["lid", "wt"] });
        let by_owner = release_any_update(
            &Released::Owner {
                owner: "me",
                except: vec![LID],
            },
            2_000,
        );
        assert_eq!(
            at(
                by_owner[0].get_document("$set").unwrap(),
                "hs.$cond.1.$filter.cond.$and.1.$not.0"
            ),
            &bson(entry_of_owner("me", &[LID]))
        );
    }

    #[test]
    fn force_release_frees_every_holder_the_minimum_hold_and_the_waiting_mark() {
        assert_eq!(
            force_release_any_filter(&"k".into()),
            doc! {
                "_id": "k",
                "tok": { "$type": "long" },
                "$or": [
                    { "lid": { "$exists": true } },
                    { "hs": { "$exists": true } },
                    { "hl": { "$exists": true } },
                ],
                "$expr": { "$gt": ["$exp", "$$NOW"] },
            }
        );
        let update = force_release_update(2_000);
        assert_eq!(
            at(&update[0], "$set.exp"),
            &bson(doc! { "$min": ["$exp", "$$NOW"] })
        );
        assert_eq!(at(&update[0], "$set.rl"), &Bson::from("$$NOW"));
        assert_eq!(
            update[1],
            doc! { "$unset": ["lid", "wt", "hs", "pm", "hl", "xw"] }
        );
    }

    #[test]
    fn a_holders_payload_is_written_in_its_own_entry() {
        assert_eq!(
            holder_payload_filter("me", &leases()[0]),
            doc! { "_id": "a", "hs": { "$elemMatch": { "lid": bson_lease_id(LID), "aid": { "$eq": "me" } } } }
        );
        assert_eq!(
            holder_payload_update(doc! { "x": 1 }),
            doc! { "$set": { "hs.$.data": { "x": 1 } } }
        );
    }
}
