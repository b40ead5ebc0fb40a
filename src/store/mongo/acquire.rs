//! **Acquire**: every wire form of an acquisition and the one place that
//! picks among them ([`MongoStore::acquire_once`] for an exclusive lease,
//! [`MongoStore::acquire_shape`] for any kind), with how each reply is read:
//! the general form ([`acquire_pipeline`], [`multi_acquire_pipeline`]) and
//! the light form ([`light_acquire_update`]), as "Light forms" in `store`
//! specifies. What the light form does not settle goes on to the general
//! form, which recognises a landed light write as a retry (B7).

use super::handle::{MongoStore, is_duplicate_key, reread_after, ttl_ms};
use super::handoff::{e, entries_without, live_entries, or_remove};
use super::raw::{
    encode_pipeline, encoding, raw_key_filter, raw_lets_with_ttl, reply_value, update_statements,
};
use super::rules::{
    LID, LockPath, TTL, acquired_token, bson_lease_id, entries, entry_is, entry_live, f,
    has_holders, inserted, key_filter, missing, next_token, our_layout, read_lease_id,
    restated_after, restated_seconds, this, transitions_after, yielded_by,
};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::light_acquire::{Found, acquired};
use crate::store::light_acquire::{LightAcquire, LightAcquired};
use crate::store::replies::{FIRST_EXPIRY, LIVE, MINE, YIELDED, classify_multi};
use crate::store::{AcquireOutcome, AcquireRequest, MAX_QUEUE, field, is_our_layout, replies};
use mongodb::bson::{
    Bson, Document, RawArray, RawArrayBuf, RawDocument, RawDocumentBuf, doc, rawdoc,
};
use tokio::time::Instant;
use uuid::Uuid;
/// The live entries of `hs` other than `lease_id` of `owner`.
pub(super) fn live_others(owner: &str, lease_id: Uuid) -> Document {
    doc! { "$filter": { "input": entries(), "cond": { "$and": [
        entry_live(),
        { "$not": [entry_is(owner, lease_id)] },
    ]}}}
}

/// Whether the key has a live exclusive waiter's mark (`xw`) of another
/// owner than `owner` (an owner's own mark is of a waiter that left: its
/// manager serves its waiters in order, so it asks for a shared lease only
/// when no exclusive waiter of its own is ahead).
pub(super) fn other_owners_mark(owner: &str) -> Document {
    doc! { "$and": [
        { "$gt": [format!("${}.{}", field::EXCLUSIVE_WAITER, field::EXPIRES_AT), "$$NOW"] },
        { "$ne": [format!("${}.{}", field::EXCLUSIVE_WAITER, field::OWNER), { "$literal": owner }] },
    ]}
}

/// How many permits the entries `entries` (an array expression) take: the
/// sum of their `n`, 1 for an entry without one.
pub(super) fn permits_used(entries: impl Into<Bson>) -> Document {
    doc! { "$sum": { "$map": {
        "input": entries.into(),
        "in": { "$ifNull": [this(field::PERMITS_TAKEN), 1_i64] },
    }}}
}

/// A semaphore's number of permits as stored in `pm`.
pub(super) fn stored_permits(permits: u32) -> i32 {
    i32::try_from(permits).unwrap_or(i32::MAX)
}

/// The acquire update of a shared lease or a permit ([`LeaseKind::Shared`],
/// [`LeaseKind::Permit`]), as "Shared and semaphore keys" in `store`
/// specifies it: one `$replaceWith` over the key's document, an upsert on
/// `upsert_filter` as the exclusive acquire (docs/mongodb-behaviour.md,
/// B1, B29), that returns the document unchanged when it loses (no write,
/// B2). `lid`, `wt`, `yu`, `data` and `hl` of an earlier exclusive holder
/// are gone from a document it wins.
pub(super) fn multi_acquire_pipeline(
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    shape: LeaseShape,
    waiting: bool,
) -> Vec<Document> {
    let (kind, taken) = (shape.kind, shape.taken());
    let mine = doc! { "$gt": [{ "$size": "$$mine" }, 0] };
    let no_live = doc! { "$eq": [{ "$size": "$$live" }, 0] };
    // An exclusive holder: a lease (`lid`) or a minimum hold (`hl`). A key
    // whose last holder left has neither, and an `exp` of that release that
    // a later `$$NOW` may still be below (docs/mongodb-behaviour.md, B3).
    let exclusive_holder = doc! { "$or": [
        { "$ne": [{ "$type": f(field::LEASE_ID) }, "missing"] },
        { "$gt": [f(field::HOLD_UNTIL), "$$NOW"] },
    ]};
    // A lock-delay (`nb`) keeps the key from every kind ("Lock-delay"),
    // also beside the places of the holders a release by owner id ended
    // and kept until their expiry.
    let delayed = doc! { "$gt": [f(field::NOT_BEFORE), "$$NOW"] };
    let exclusive_held = doc! { "$and": [
        { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
        no_live.clone(),
        { "$not": [mine.clone()] },
        exclusive_holder,
    ]};
    let has_permits = doc! { "$ne": [{ "$type": f(field::PERMITS) }, "missing"] };
    // A retry wins only on a key still held as its kind (or alone): one
    // whose number of permits changed since the entry was written answers
    // `OursAsAnotherKind` (`replies::classify_multi`), and its entry is
    // given back; renewed, it would count as a permit of the old number.
    let same_kind = match kind {
        LeaseKind::Permit { permits } => {
            doc! { "$eq": [f(field::PERMITS), stored_permits(permits)] }
        }
        _ => doc! { "$not": [has_permits.clone()] },
    };
    let mine_wins = doc! { "$and": [
        our_layout(),
        mine.clone(),
        { "$or": [no_live.clone(), same_kind] },
    ]};
    let kind_admits = match kind {
        LeaseKind::Permit { permits } => doc! { "$or": [
            no_live.clone(),
            { "$and": [
                { "$eq": [f(field::PERMITS), stored_permits(permits)] },
                { "$lte": [
                    { "$add": [permits_used("$$live"), i64::from(taken)] },
                    i64::from(permits),
                ]},
            ]},
        ]},
        _ => doc! { "$and": [
            { "$or": [no_live, { "$not": [has_permits] }] },
            { "$not": [other_owners_mark(owner)] },
        ]},
    };
    // An entry an operator's release by owner id ended under this lease id
    // (`xl`): an attempt under it, landing late, takes no place again.
    let ended = doc! { "$in": [
        bson_lease_id(lease_id),
        { "$ifNull": [format!("${}.{}", field::HOLDERS, field::ENDED_LEASE_ID), []] },
    ]};
    let wins = doc! { "$and": [
        { "$not": [ended] },
        { "$or": [
            inserted(),
            mine_wins,
            { "$and": [
                our_layout(),
                { "$not": [exclusive_held] },
                kind_admits,
                { "$not": [delayed] },
                { "$not": [yielded_by(owner)] },
            ]},
        ]},
    ]};
    let lost = if waiting && kind == LeaseKind::Shared {
        let held_by_other = doc! { "$and": [
            our_layout(),
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
    let mut new_entry = doc! {
        field::OWNER: { "$literal": owner },
        field::LEASE_ID: bson_lease_id(lease_id),
        field::TOKEN: next_token(),
        field::ACQUIRED_AT: "$$NOW",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: expires.clone(),
    };
    if taken > 1 {
        new_entry.insert(field::PERMITS_TAKEN, stored_permits(taken));
    }
    // A retry keeps the top `aid`, `acq` and `tr`: those of the key's
    // latest acquisition, which may be another holder's since.
    let latest = |field: &str, new: Bson| doc! { "$cond": [mine.clone(), f(field), new] };
    // A retry's entry never expires sooner than it did (`renewed_expiry`).
    let entry = doc! { "$cond": [
        mine.clone(),
        { "$let": { "vars": { "it": { "$first": "$$mine" } }, "in": { "$mergeObjects": [
            "$$it",
            { field::RENEWED_AT: "$$NOW", field::EXPIRES_AT: { "$max": ["$$it.exp", expires] } },
        ]}}},
        new_entry,
    ]};
    let mut acquired = doc! {
        field::ID: "$_id",
        field::OWNER: latest(field::OWNER, doc! { "$literal": owner }.into()),
        field::TOKEN: { "$max": [f(field::TOKEN), "$$entry.tok"] },
        field::ACQUIRED_AT: latest(field::ACQUIRED_AT, "$$entry.acq".into()),
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$max": [{ "$max": "$$live.exp" }, "$$entry.exp"] },
        field::HOLDERS: { "$concatArrays": ["$$live", ["$$entry"]] },
    };
    if let LeaseKind::Permit { permits } = kind {
        acquired.insert(field::PERMITS, stored_permits(permits));
    }
    acquired.insert(field::RELEASED_AT, f(field::RELEASED_AT));
    acquired.insert(field::EXCLUSIVE_WAITER, f(field::EXCLUSIVE_WAITER));
    let transitions = transitions_after(doc! { "$literal": owner });
    acquired.insert(
        field::TRANSITIONS,
        latest(field::TRANSITIONS, transitions.into()),
    );
    let mine_entries =
        doc! { "$filter": { "input": entries(), "cond": entry_is(owner, lease_id) } };
    restated_after(vec![doc! { "$replaceWith": { "$let": {
        "vars": { "live": live_others(owner, lease_id), "mine": mine_entries },
        "in": { "$cond": [
            wins,
            { "$let": { "vars": { "entry": entry }, "in": acquired } },
            lost,
        ]},
    }}}])
}

/// The projection of the reads that decide a shared or permit acquisition
/// (the reply of [`multi_acquire_pipeline`], or a re-read): the top fields,
/// the exclusive waiter's mark, and, computed on the server
/// (docs/mongodb-behaviour.md, B11) rather than the whole `hs`, this
/// acquisition's entry, the number of other live entries and the earliest
/// of their expiries.
pub(super) fn multi_acquire_projection(owner: &str, lease_id: Uuid) -> Document {
    let mine = doc! { "$filter": { "input": entries(), "cond": entry_is(owner, lease_id) } };
    let live = live_others(owner, lease_id);
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::EXPIRES_AT: 1,
        field::PERMITS: 1, field::HOLD_UNTIL: 1, field::NOT_BEFORE: 1, field::OTHER_OWNER: 1,
        "now": "$$NOW",
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
/// Part of a losing waiting exclusive attempt ([`acquire_pipeline`]).
pub(super) fn exclusive_waiter_mark(owner: &str, ttl_ms: i64) -> (Document, Document) {
    let shared_live = doc! { "$and": [
        our_layout(),
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

/// The light acquire's update ("Light forms" in `store`), under the lease
/// id `$$lid`, expiring `$$ttl` milliseconds after `$$NOW`.
pub(super) fn light_acquire_update(owner: &str) -> Vec<Document> {
    let lid = LID;
    let free = doc! { "$and": [
        our_layout(),
        { "$lte": [f(field::EXPIRES_AT), "$$NOW"] },
        missing(field::QUEUE),
        missing(field::HOLDERS),
        missing(field::PERMITS),
        missing(field::EXCLUSIVE_WAITER),
        { "$ne": [f(field::LEASE_ID), lid] },
        { "$not": [{ "$and": [
            { "$eq": [f(field::OWNER), { "$literal": owner }] },
            { "$gt": [f(field::YIELD_UNTIL), "$$NOW"] },
        ]}]},
    ]};
    let acquired = doc! {
        field::ID: f(field::ID),
        field::OWNER: { "$literal": owner },
        field::LEASE_ID: lid,
        field::TOKEN: next_token(),
        field::ACQUIRED_AT: "$$NOW",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$add": ["$$NOW", TTL] },
        field::TRANSITIONS: transitions_after(doc! { "$literal": owner }),
        // Restated in the acquisition itself ("Read by other clients" in
        // `store`); a document this write leaves alone keeps its own.
        field::OBTAINED_AT: "$$NOW",
        field::TTL_SECONDS: restated_seconds(
            doc! { "$add": ["$$NOW", TTL] },
            "$$NOW",
            next_token(),
        ),
    };
    vec![doc! { "$replaceWith": { "$cond": [
        { "$or": [inserted(), free] },
        acquired,
        "$$ROOT",
    ]}}]
}

/// What the light acquire's and handoff's replies are read with: the
/// server's `$$NOW` too.
pub(super) fn light_projection() -> Document {
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::RENEWED_AT: 1,
        field::OTHER_OWNER: 1, "now": "$$NOW",
    }
}

/// [`upsert_filter`] of `key`, encoded: the light acquire's filter.
pub(super) fn raw_upsert_filter(key: &LeaseKey) -> Result<RawDocumentBuf> {
    RawDocumentBuf::from_document(&upsert_filter(key)).map_err(encoding)
}

/// `doc` (as the batch's `find` read it) as the shared decision reads
/// it; `None` without a token, an expiry or the server's `$$NOW`.
fn found(doc: &Document) -> Option<Found<'_>> {
    let left_ms = doc.get_datetime(field::EXPIRES_AT).ok()?.timestamp_millis()
        - doc.get_datetime("now").ok()?.timestamp_millis();
    Some(Found {
        owner: doc.get_str(field::OWNER).ok(),
        lease_id: read_lease_id(doc.get(field::LEASE_ID)),
        token: doc.get_i64(field::TOKEN).ok()? as u64,
        left_ms,
    })
}

/// The filter of an acquiring upsert of one key's document: `{_id: key,
/// _ins: null}` (why: `field::INSERTED`).
pub(super) fn upsert_filter(key: &LeaseKey) -> Document {
    doc! { field::ID: key, field::INSERTED: Bson::Null }
}

/// The acquire update: one round trip, never an error when the key is held.
///
/// An upsert on [`upsert_filter`] (an `$expr` is refused in an upsert filter
/// on 6.0, docs/mongodb-behaviour.md, B1) whose pipeline writes
/// [`LockPath::acquired`] (expiring `ttl_ms` after `$$NOW`) if the
/// acquisition wins by [`LockPath::wins`] and [`queue_allows`] it, and
/// otherwise returns the document unchanged (no oplog entry, B2; a document
/// of foreign layout too), except that a `waiting` attempt marks a lease of
/// another owner (`wt`) and registers ([`registered`]), or marks live
/// shared holders ([`exclusive_waiter_mark`]). `hold_ms` and `payload` as
/// "Holding at least" in `store` and `Acquire::payload` say; an
/// acquisition leaves [`queue_after_acquisition`].
pub(super) fn acquire_pipeline(
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    waiting: bool,
    hold_ms: Option<i64>,
    registration_ms: i64,
    payload: Option<&Document>,
) -> Vec<Document> {
    let at = LockPath::TOP;
    let lid = bson_lease_id(lease_id);
    let mine = at.retry(owner, &lid);
    let wins = at.wins(owner, &lid, Some(queue_allows(owner)));
    let mut acquired = doc! { field::ID: "$_id" };
    acquired.extend(at.acquired(owner, &lid, ttl_ms));
    acquired.insert(field::QUEUE, queue_after_acquisition(owner));
    if let Some(payload) = payload {
        // In the acquiring write itself, a retry included, so that no
        // reader sees this acquisition without it (`Acquire::payload`).
        acquired.insert(field::PAYLOAD, doc! { "$literal": payload });
    }
    if let Some(hold_ms) = hold_ms {
        let hold_until = doc! { "$cond": [
            mine,
            { "$ifNull": [format!("${}", field::HOLD_UNTIL), { "$add": ["$$NOW", hold_ms] }] },
            { "$add": ["$$NOW", hold_ms] },
        ]};
        acquired.insert(
            field::EXPIRES_AT,
            doc! { "$max": [at.expiry_after(owner, &lid, ttl_ms), hold_until.clone()] },
        );
        acquired.insert(field::HOLD_UNTIL, hold_until);
    }
    let lost = if waiting {
        // A free key kept for the head of the queue (another owner).
        let kept_for_queue = doc! { "$and": [at.our_layout(), { "$not": [queue_allows(owner)] }] };
        let marked = doc! { "$mergeObjects": ["$$ROOT", {
            field::WAITING_SINCE: at.waiting_since(),
            field::QUEUE: registered(owner, lid, ttl_ms, registration_ms, payload),
        }]};
        let (shared_live, mark) = exclusive_waiter_mark(owner, ttl_ms);
        Bson::from(doc! { "$cond": [
            { "$or": [at.held_by_other(owner), kept_for_queue] },
            marked,
            { "$cond": [shared_live, mark, "$$ROOT"] },
        ]})
    } else {
        Bson::from("$$ROOT")
    };
    restated_after(vec![
        doc! { "$replaceWith": { "$cond": [wins, acquired, lost] } },
    ])
}

/// The projection of reads that decide an acquire attempt; `now` is the
/// server's `$$NOW`, so the remaining lease time is computed on the server's clock.
pub(super) fn acquire_projection() -> Document {
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::OTHER_OWNER: 1,
        field::EXPIRES_AT: 1, field::YIELD_UNTIL: 1, "now": "$$NOW",
        field::PERMITS: 1, format!("{}.{}", field::EXCLUSIVE_WAITER, field::OWNER): 1,
        format!("{}.{}", field::QUEUE, field::OWNER): 1,
        format!("{}.{}", field::QUEUE, field::REGISTRATION_EXPIRES): 1,
    }
}

/// Whether `owner` may take the key as far as the queue is concerned: no
/// live entry, or the first live entry is `owner`'s.
pub(super) fn queue_allows(owner: &str) -> Document {
    let head_owner = doc! { "$let": {
        "vars": { "h": { "$first": live_entries() } },
        "in": format!("$$h.{}", field::OWNER),
    }};
    doc! { "$eq": [
        { "$ifNull": [head_owner, { "$literal": owner }] },
        { "$literal": owner },
    ]}
}

/// The `q` an acquisition by `owner` leaves: the other owners' live
/// entries, in order (removed if none).
pub(super) fn queue_after_acquisition(owner: &str) -> Document {
    or_remove(entries_without(live_entries(), doc! { "$literal": owner }))
}

/// The `q` a losing waiting attempt by `owner` writes ("Registration" and
/// "Bound" in "Queue of waiting owners" in `store`, with `R =
/// registration_ms`): the live entries in order, `owner`'s refreshed in
/// place or appended while fewer than [`MAX_QUEUE`] are live.
pub(super) fn registered(
    owner: &str,
    lease_id: Bson,
    ttl_ms: i64,
    registration_ms: i64,
    payload: Option<&Document>,
) -> Document {
    let entry = |at: &str| {
        let mut entry = doc! {
            field::OWNER: { "$literal": owner },
            field::LEASE_ID: lease_id.clone(),
            field::REGISTERED_AT: at,
            field::REGISTRATION_EXPIRES: { "$add": ["$$NOW", registration_ms] },
            field::HANDED_TTL: ttl_ms.min(registration_ms),
        };
        if let Some(payload) = payload {
            entry.insert(field::PAYLOAD, doc! { "$literal": payload });
        }
        entry
    };
    let is_mine = doc! { "$eq": [e(field::OWNER), { "$literal": owner }] };
    let other_payload = match payload {
        Some(payload) => doc! { "$ne": [e(field::PAYLOAD), { "$literal": payload }] },
        None => doc! { "$ne": [{ "$type": e(field::PAYLOAD) }, "missing"] },
    };
    // Refreshed only under another lease id or payload, or past half its
    // window: a waiter retrying often writes nothing most of the time (B2).
    let stale = doc! { "$or": [
        { "$ne": [e(field::LEASE_ID), lease_id.clone()] },
        other_payload,
        { "$lt": [e(field::REGISTRATION_EXPIRES), { "$add": ["$$NOW", registration_ms / 2] }] },
    ]};
    doc! { "$let": {
        "vars": { "live": live_entries() },
        "in": { "$concatArrays": [
            { "$map": {
                "input": "$$live",
                "as": "e",
                "in": { "$cond": [
                    { "$and": [is_mine.clone(), stale] },
                    entry(&e(field::REGISTERED_AT)),
                    "$$e",
                ]},
            }},
            { "$cond": [
                { "$or": [
                    { "$anyElementTrue": [{ "$map": { "input": "$$live", "as": "e", "in": is_mine }}] },
                    { "$gte": [{ "$size": "$$live" }, MAX_QUEUE as i64] },
                ]},
                [],
                [entry("$$NOW")],
            ]},
        ]},
    }}
}

impl MongoStore {
    /// An acquisition of the request's shape: exclusive (held at least its
    /// `hold_at_least`, if any) through the exclusive pipeline; a shared
    /// lease or a permit through [`multi_acquire_pipeline`]. One round trip.
    pub(super) async fn acquire_shape(&self, request: AcquireRequest) -> Result<AcquireOutcome> {
        let AcquireRequest {
            key,
            lease_id,
            waiting,
            ttl,
            shape,
            payload,
            ..
        } = request;
        let (kind, ttl_ms) = (shape.kind, ttl_ms(ttl));
        kind.validate()?;
        crate::store::payload_applies(false, shape, payload.as_ref())?;
        if kind == LeaseKind::Exclusive {
            let hold_ms = shape.hold_at_least.map(self::ttl_ms);
            return self
                .acquire_once(key, lease_id, waiting, ttl_ms, hold_ms, payload)
                .await;
        }
        if shape.hold_at_least.is_some() {
            return Err(crate::error::Error::InvalidConfig {
                reason: format!(
                    "hold_at_least applies to exclusive leases only, not to {kind} leases"
                ),
            });
        }
        let update = multi_acquire_pipeline(self.owner(), ttl_ms, lease_id, shape, waiting);
        let projection = multi_acquire_projection(self.owner(), lease_id);
        self.acquire_by(key, update, projection, |key, doc| {
            classify_multi(key, kind, doc)
        })
        .await
    }

    /// The `findAndModify` of an acquisition or a handoff: `key`'s
    /// document (an upsert on `{_id, _ins: null}` if `upsert`, else on
    /// `_id`) with the encoded `update` and the `let` variables `lets`,
    /// returning the document after the write with `fields`. Sent as a
    /// plain command, not a retryable write: the server keeps no image of
    /// it (docs/mongodb-behaviour.md, B25), and an error is an unknown
    /// outcome that the caller resolves by re-reading (B7).
    pub(super) async fn find_and_modify(
        &self,
        key: &LeaseKey,
        upsert: bool,
        update: &RawArray,
        fields: &RawDocument,
        lets: RawDocumentBuf,
    ) -> Result<Option<Document>> {
        let mut command = RawDocumentBuf::new();
        command.append("findAndModify", self.coll().name());
        let query = if upsert {
            raw_upsert_filter(key)?
        } else {
            raw_key_filter(key)?
        };
        command.append("query", query);
        command.append_ref("update", update);
        command.append_ref("fields", fields);
        command.append("new", true);
        command.append("upsert", upsert);
        command.append("let", lets);
        self.raw_command(command).await.map(reply_value)
    }

    /// The light acquires `requests` (of distinct keys; string keys if
    /// more than one): the light form's own command for one, one batch
    /// for more ([`MongoStore::acquire_light_batch`]); one answer each, in order.
    pub(super) async fn light_acquires(&self, requests: Vec<LightAcquire>) -> Vec<LightAcquired> {
        match &requests[..] {
            [request] => vec![self.acquire_light_alone(request).await],
            _ => self.acquire_light_batch(&requests).await,
        }
    }

    /// The light acquire's own command (`findAndModify`) for `request`:
    /// not applied after a transient error (its outcome unknown: the
    /// general acquire under the same lease id recognises a landed one as
    /// a retry, B7) or a duplicate key (a racing upsert).
    pub(super) async fn acquire_light_alone(&self, request: &LightAcquire) -> LightAcquired {
        let LightAcquire {
            key, lease_id, ttl, ..
        } = request;
        let lease_id = *lease_id;
        let attempt = self
            .find_and_modify(
                key,
                true,
                &self.light.acquire,
                &self.light.projection,
                raw_lets_with_ttl(&[(LID, lease_id)], *ttl),
            )
            .await;
        let token = match attempt {
            Ok(doc) => doc.and_then(|doc| acquired_token(&doc, self.owner(), lease_id)),
            Err(e) if e.is_transient() => None,
            Err(Error::Database(e)) if is_duplicate_key(&e) => None,
            Err(e) => return LightAcquired::Failed(e),
        };
        token.map_or(LightAcquired::NotApplied, LightAcquired::Acquired)
    }

    /// The light acquires `requests` (of distinct string keys) in one
    /// `update` and one `find` (see the module docs); one answer each, in
    /// order.
    pub(super) async fn acquire_light_batch(
        &self,
        requests: &[LightAcquire],
    ) -> Vec<LightAcquired> {
        let not_applied = || requests.iter().map(|_| LightAcquired::NotApplied).collect();
        let mut statements = RawArrayBuf::new();
        for request in requests {
            let Ok(filter) = raw_upsert_filter(&request.key) else {
                return not_applied();
            };
            let mut statement = rawdoc! { "q": filter };
            statement.append_ref("u", &self.light.acquire);
            statement.append(
                "c",
                raw_lets_with_ttl(&[(LID, request.lease_id)], request.ttl),
            );
            statement.append("upsert", true);
            statements.push(statement);
        }
        let command = update_statements(self.coll().name(), statements, false);
        if self.raw_command(command).await.is_err() {
            return not_applied();
        }
        let keys: Vec<&str> = requests.iter().filter_map(|r| r.key.as_str()).collect();
        let projection = doc! {
            field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::EXPIRES_AT: 1,
            field::OTHER_OWNER: 1, "now": "$$NOW",
        };
        let find_sent = Instant::now();
        let Some(docs) = self.read_keys(&keys, projection).await else {
            return not_applied();
        };
        requests
            .iter()
            .map(|request| {
                let doc = request.key.as_str().and_then(|k| docs.get(k));
                acquired(doc.and_then(found), request, self.owner(), find_sent)
            })
            .collect()
    }

    /// The first stage of both acquire pipelines when the document is a
    /// foreign holder's lock that its own rule says is no longer held: it
    /// is taken over in the acquiring write itself
    /// ([`ForeignRules::takeover_stage`](crate::foreign::ForeignRules::takeover_stage)).
    pub(super) fn takeover_stage(&self) -> Document {
        self.foreign().takeover_stage(our_layout(), field::INSERTED)
    }

    /// Reads `key`'s document with `projection`.
    pub(super) async fn read_key(
        &self,
        key: &LeaseKey,
        projection: Document,
    ) -> Result<Option<Document>> {
        self.bounded(self.coll().find_one(key_filter(key)).projection(projection))
            .await
    }

    /// An exclusive acquisition (held at least `hold_ms` if `Some`, with
    /// `payload` if `Some`) by the general pipeline (the actor tries the
    /// light acquire first where it may apply, `Store::acquire_light`).
    pub(super) async fn acquire_once(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl_ms: i64,
        hold_ms: Option<i64>,
        payload: Option<Document>,
    ) -> Result<AcquireOutcome> {
        let update = acquire_pipeline(
            self.owner(),
            ttl_ms,
            lease_id,
            waiting,
            hold_ms,
            self.registration_ms(),
            payload.as_ref(),
        );
        self.acquire_by(key, update, acquire_projection(), |key, doc| {
            replies::exclusive(key, self.owner(), lease_id, ttl_ms, doc)
        })
        .await
    }

    /// One acquire attempt: the upsert `update` of `key`'s document,
    /// returning it projected with `projection`, read by `read`.
    ///
    /// The first write's reply leaves out the foreign lock fields: their
    /// expressions are the largest part of the command, and the server
    /// parses them at every write (docs/mongodb-behaviour.md, B25) while
    /// the reply of a document of our layout never has them. A reply not
    /// of our layout ([`is_our_layout`]: a foreign holder's lock) has the
    /// write sent again with the takeover stage first, returning the
    /// foreign fields too: the takeover stage decides at its write whether
    /// that lock's rule says it is no longer held (`fh` false), takes it
    /// over if so, and leaves it as it is if not.
    ///
    /// A document that could not be returned (a racing upsert, an unknown
    /// outcome) is re-read with `projection` and the foreign fields (B1,
    /// B7), and `read`'s verdict on it is only what a read proves
    /// ([`replies::from_reread`]: never `Acquired`, no token in `Held`); so
    /// is its verdict on the answer to a write sent again, whose first send
    /// may land after it.
    pub(super) async fn acquire_by(
        &self,
        key: LeaseKey,
        update: Vec<Document>,
        projection: Document,
        read: impl Fn(&LeaseKey, &Document) -> AcquireOutcome,
    ) -> Result<AcquireOutcome> {
        let fields = RawDocumentBuf::from_document(&projection).map_err(encoding)?;
        let (attempt, mut resent) = self.acquire_write(&key, &update, &fields).await;
        let attempt = match attempt {
            Ok(Some(doc)) if !is_our_layout(&doc) => {
                let fields = self.with_foreign_fields(projection.clone());
                let fields = RawDocumentBuf::from_document(&fields).map_err(encoding)?;
                let takeover: Vec<_> = std::iter::once(self.takeover_stage())
                    .chain(update)
                    .collect();
                let (attempt, again) = self.acquire_write(&key, &takeover, &fields).await;
                resent |= again;
                attempt
            }
            attempt => attempt,
        };
        match attempt {
            Ok(Some(doc)) => return Ok(replies::answered(read(&key, &doc), resent)),
            Ok(None) => {}
            // Whatever the second send's error, the first's outcome is
            // unknown.
            Err(e) if resent => {
                tracing::debug!(%key, error = %e, "acquire sent again failed; re-reading");
            }
            Err(e) => reread_after(&key, e, |e| Error::UnusableCollection {
                reason: format!(
                    "a unique index other than `_id` refused the lease for {}: {e}",
                    key.to_extended_json()
                ),
            })?,
        }
        self.reread(key, projection, read).await
    }

    /// The upsert `update` of `key`'s document, returning it with `fields`,
    /// sent once more after a transient error
    /// ([`replies::sent_again_once`]), and whether it was.
    async fn acquire_write(
        &self,
        key: &LeaseKey,
        update: &[Document],
        fields: &RawDocumentBuf,
    ) -> (Result<Option<Document>>, bool) {
        let update = match encode_pipeline(update) {
            Ok(update) => update,
            Err(e) => return (Err(e), false),
        };
        let send = || self.find_and_modify(key, true, &update, fields, RawDocumentBuf::new());
        replies::sent_again_once(send).await
    }

    /// The re-read of an acquire attempt whose write did not return the
    /// document, projected with `projection` and the foreign lock fields,
    /// worth only what a read proves ([`replies::from_reread`]).
    pub(super) async fn reread(
        &self,
        key: LeaseKey,
        projection: Document,
        read: impl Fn(&LeaseKey, &Document) -> AcquireOutcome,
    ) -> Result<AcquireOutcome> {
        // The write's outcome stays unknown whatever the read's error.
        let projection = self.with_foreign_fields(projection);
        let found = self.read_key(&key, projection).await.map_err(|e| match e {
            e if e.is_transient() => e,
            e => Error::Unreachable {
                waited: self.operation_timeout,
                reason: format!("the re-read of an acquisition of unknown outcome failed: {e}"),
                source: None,
            },
        })?;
        match found {
            Some(doc) => Ok(replies::from_reread(read(&key, &doc))),
            // The document vanished between the write and the read: try again.
            None => Err(Error::Unreachable {
                waited: self.operation_timeout,
                reason: "lock document vanished during acquire".into(),
                source: None,
            }),
        }
    }
}
