//! **Release**: a lease's release and its forms, the release of an owner's
//! leases (an operator's release by owner id), force release, and delete mode's
//! deletes (the `Store` implementation picks by the caller's [`Release`](crate::store::Release)):
//! the general release ([`release_any_update`]; "Fairness between owners",
//! "Queue of waiting owners", "Holding at least" in `store`), the light
//! release ([`light_release_update`]; "Light forms"), delete mode
//! ([`deletable_filter`], [`released_filter`]) and force
//! release ([`force_release_update`], [`foreign_filter`]). Each write is
//! idempotent and retried after a transient failure ([`retried`]).

use super::handle::{MongoStore, min_token_age_ms, retried};
use super::handoff::{
    entries_without, handed_fields, handoff_stages, live_entries, or_remove, pick_stage,
};
use super::raw::{raw_key_filter, raw_lets, update_counts, update_reply, update_statements};
use super::read::projected_info;
use super::renew::holder_filter;
use super::rules::{
    LID, LockPath, bson_lease_id, entries, entry_among, entry_live, entry_of_owner, f, has_holders,
    lease_ids, missing, next_token, ours_and_nobody_else_waits, restated_after, restated_seconds,
    root_with, this,
};
use crate::config::ReleaseMode;
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::light_release::{LightRelease, Read, lone_release_answer, release_outcomes};
use crate::store::{LeaseRef, OverrideEnd, field};
use mongodb::bson::{Bson, Document, RawArrayBuf, doc, rawdoc};
use mongodb::options::ReturnDocument;
use uuid::Uuid;
/// Which leases a release takes away: those of a batch (`ids` of `owner`),
/// or every lease of an owner, ended by an operator. (A manager releases
/// its own leases by lease id only, never by owner id: a release by owner
/// id that lands late would end leases acquired after it was sent.)
pub(super) enum Selection<'a> {
    /// The leases `ids` of `owner`.
    Leases { owner: &'a str, ids: Vec<Uuid> },
    /// Every lease of `owner`, ended by an operator (release by owner id):
    /// its key unavailable until `end` says, with a lock-delay of
    /// `delay_ms` ([`delay_stage`]).
    OwnerLeases {
        owner: &'a str,
        delay_ms: i64,
        end: OverrideEnd,
    },
}

/// The lock-delay of a release by owner id (`owner`'s leases, `selected`
/// among a key's holders), a stage before the release's: `nb = $$NOW +
/// delay_ms` (or later, if already), and with [`OverrideEnd::AtExpiry`]
/// at least the lease's `exp`, on a document whose live exclusive lease it
/// ends, or all of whose live holders are `owner`'s or were ended by an
/// earlier release by owner id (`xl`), at least one a live lease of
/// `owner` (with its lease id); any
/// other document unchanged. The release then keeps `exp` at least `nb`,
/// and hands the key to nobody ("Lock-delay" in `store`).
pub(super) fn delay_stage(selected: &Document, delay_ms: i64, end: OverrideEnd) -> Document {
    let live = doc! { "$filter": { "input": entries(), "cond": entry_live() } };
    // It ends a live lease of the owner (an entry with its lease id, not
    // one an earlier release by owner id ended and kept, `xl`), and every
    // live entry is the owner's or such a kept one: ending the key's owners
    // one at a time delays it too.
    let ended = doc! { "$ne": [{ "$type": this(field::ENDED_LEASE_ID) }, "missing"] };
    let selected_or_ended = doc! { "$or": [selected.clone(), ended] };
    let has_lease_id = doc! { "$ne": [{ "$type": this(field::LEASE_ID) }, "missing"] };
    let ends_a_live_lease = doc! { "$and": [selected.clone(), has_lease_id] };
    let ends_all_holders = doc! { "$and": [
        { "$anyElementTrue": [{ "$map": { "input": live.clone(), "in": ends_a_live_lease } }] },
        { "$allElementsTrue": [{ "$map": { "input": live, "in": selected_or_ended } }] },
    ]};
    let ends = doc! { "$cond": [
        has_holders(),
        ends_all_holders,
        { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    ]};
    let mut until = vec![
        Bson::from(f(field::NOT_BEFORE)),
        Bson::from(doc! { "$add": ["$$NOW", delay_ms] }),
    ];
    if end == OverrideEnd::AtExpiry {
        until.push(f(field::EXPIRES_AT).into());
    }
    doc! { "$set": { field::NOT_BEFORE: { "$cond": [
        ends,
        { "$max": until },
        f(field::NOT_BEFORE),
    ]}}}
}

/// The release of any kinds, one update over every matched document, as
/// "Shared and semaphore keys" ("Release"), "Holding at least",
/// "Lock-delay" and "Fairness between owners" in `store` specify it. An
/// exclusive key with another owner's live entry in its queue is handed to
/// the first one instead
/// ([`pick_stage`](super::handoff::pick_stage),
/// [`handoff_stages`](super::handoff::handoff_stages)).
pub(super) fn release_any_update(selection: &Selection<'_>, yield_ms: i64) -> Vec<Document> {
    let (selected, delay, keeps_places) = match selection {
        Selection::Leases { owner, ids } => (entry_among(owner, ids), None, false),
        Selection::OwnerLeases {
            owner,
            delay_ms,
            end,
        } => {
            let waits = *delay_ms > 0 || *end == OverrideEnd::AtExpiry;
            (
                entry_of_owner(owner),
                waits.then_some((*delay_ms, *end)),
                *end == OverrideEnd::AtExpiry,
            )
        }
    };
    // The live entries that stay: all but the released ones, or, for an
    // override that waits for its holders, all, the ended ones with their
    // lease id moved to `xl` (none of their holder's writes matches them
    // again, nor does an acquisition under it take a place again).
    let ended = doc! { "$mergeObjects": [
        { "$unsetField": { "field": field::LEASE_ID, "input": "$$this" } },
        { field::ENDED_LEASE_ID: { "$ifNull": [
            format!("$$this.{}", field::LEASE_ID),
            format!("$$this.{}", field::ENDED_LEASE_ID),
        ]}},
    ]};
    let entries_left = if keeps_places {
        doc! { "$map": {
            "input": { "$filter": { "input": f(field::HOLDERS), "cond": entry_live() } },
            "in": { "$cond": [selected.clone(), ended, "$$this"] },
        }}
    } else {
        doc! { "$filter": { "input": f(field::HOLDERS), "cond": { "$and": [
            entry_live(),
            { "$not": [selected.clone()] },
        ]}}}
    };
    let remain =
        doc! { "$cond": [has_holders(), { "$gt": [{ "$size": f(field::HOLDERS) }, 0] }, false] };
    let [handoff, cleanup] = handoff_stages();
    let delay = delay.map(|(delay_ms, end)| delay_stage(&selected, delay_ms, end));
    // `nb` only in a release by owner id, where a delay may have been
    // written: by this release, or by an earlier one that waited for the
    // holders and kept their places, which an immediate one frees without a
    // lock-delay of its own (a new acquisition removes `nb`; a past one
    // changes no `$max`).
    let mut floor = vec![
        Bson::from(doc! { "$min": [f(field::EXPIRES_AT), "$$NOW"] }),
        Bson::from(f(field::HOLD_UNTIL)),
    ];
    let mut holders_exp: Bson = doc! { "$ifNull": [
        { "$max": format!("${}.{}", field::HOLDERS, field::EXPIRES_AT) },
        "$$NOW",
    ]}
    .into();
    if matches!(selection, Selection::OwnerLeases { .. }) {
        floor.push(f(field::NOT_BEFORE).into());
        holders_exp = doc! { "$max": [holders_exp, f(field::NOT_BEFORE)] }.into();
    }
    restated_after(
        delay
            .into_iter()
            .chain([
                pick_stage(),
                doc! { "$set": {
                    field::EXPIRES_AT: { "$cond": [
                        has_holders(),
                        f(field::EXPIRES_AT),
                        { "$max": floor },
                    ]},
                    field::YIELD_UNTIL: LockPath::TOP.yield_if_waited(yield_ms),
                    field::RELEASED_AT: { "$cond": [has_holders(), "$$NOW", f(field::RELEASED_AT)] },
                    field::HOLDERS: { "$cond": [has_holders(), entries_left, "$$REMOVE"] },
                }},
                doc! { "$set": {
                    field::EXPIRES_AT: { "$cond": [
                        has_holders(),
                        holders_exp,
                        f(field::EXPIRES_AT),
                    ]},
                    field::PERMITS: { "$cond": [remain.clone(), f(field::PERMITS), "$$REMOVE"] },
                    field::HOLDERS: { "$cond": [remain, f(field::HOLDERS), "$$REMOVE"] },
                }},
                doc! { "$unset": [field::LEASE_ID, field::WAITING_SINCE] },
                handoff,
                cleanup,
            ])
            .collect(),
    )
}

/// Every document with a holder entry of `owner`, of our layout: the
/// multi-holder side of a release by owner id.
pub(super) fn owner_holders_filter(owner: &str) -> Document {
    doc! {
        field::HOLDERS: { "$elemMatch": { field::OWNER: { "$eq": owner } } },
        field::TOKEN: { "$type": "long" },
        field::EXPIRES_AT: { "$type": "date" },
        field::OTHER_OWNER: { "$exists": false },
    }
}

/// `key` if held now by anything of our layout: an exclusive lease, holders
/// in `hs`, or a minimum hold (`exp > $$NOW` covers them all); with
/// [`OverrideEnd::Immediately`], also a key an earlier override left
/// waiting for its lease's expiry or a lock-delay (`nb`, ahead).
pub(super) fn force_release_any_filter(key: &LeaseKey, end: OverrideEnd) -> Document {
    let mut held = vec![
        doc! { field::LEASE_ID: { "$exists": true } },
        doc! { field::HOLDERS: { "$exists": true } },
        doc! { field::HOLD_UNTIL: { "$exists": true } },
    ];
    if end == OverrideEnd::Immediately {
        held.push(doc! { field::NOT_BEFORE: { "$exists": true } });
    }
    doc! {
        field::ID: key,
        field::TOKEN: { "$type": "long" },
        field::OTHER_OWNER: { "$exists": false },
        "$or": held,
        "$expr": { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    }
}

/// A force release, whoever holds the key and however: `rl = $$NOW`, and
/// the exclusive holder (`lid`, `wt`), every holder in `hs` (with `pm`),
/// the minimum hold (`hl`) and the exclusive waiter's mark (`xw`) are
/// removed; `yu` as in a release; `nb` and `exp` as "Lock-delay" in `store`
/// says (at once, `exp` to now and no `nb`, without a lock-delay). The
/// filter ([`force_release_any_filter`]) matches only a key held now, or
/// waiting for an earlier override's `nb`.
pub(super) fn force_release_update(
    yield_ms: i64,
    delay_ms: i64,
    end: OverrideEnd,
) -> Vec<Document> {
    let delay_end = doc! { "$add": ["$$NOW", delay_ms] };
    let (expires, not_before) = match end {
        OverrideEnd::AtExpiry => {
            let until = Bson::from(doc! { "$max": [f(field::EXPIRES_AT), delay_end] });
            (until.clone(), until)
        }
        OverrideEnd::Immediately if delay_ms > 0 => {
            let until = Bson::from(delay_end);
            (until.clone(), until)
        }
        OverrideEnd::Immediately => {
            let now = doc! { "$min": [f(field::EXPIRES_AT), "$$NOW"] };
            (Bson::from(now), Bson::from("$$REMOVE"))
        }
    };
    restated_after(vec![
        doc! { "$set": {
            field::EXPIRES_AT: expires,
            field::NOT_BEFORE: not_before,
            field::YIELD_UNTIL: LockPath::TOP.yield_if_waited(yield_ms),
            field::RELEASED_AT: "$$NOW",
        }},
        doc! { "$unset": [
            field::LEASE_ID, field::WAITING_SINCE, field::HOLDERS, field::PERMITS,
            field::HOLD_UNTIL, field::EXCLUSIVE_WAITER,
        ]},
    ])
}

/// The light release's update, of the document of the released lease's
/// key (its `_id` alone, B26). If it holds the exclusive lease `$$lid` of
/// `owner`:
/// - with no queue, waiting mark, minimum hold, holders nor permits,
///   `exp = min(exp, $$NOW)` and `lid` removed;
/// - with `hands_over`, also where the queue of waiting owners has a live
///   entry of another owner and there is no minimum hold, lock-delay,
///   holders nor permits: handed to the first such entry, as the general
///   release hands it ([`handed_fields`]; "Queue of waiting owners" in
///   `store`). A larger update, which `mongod` parses at every release:
///   the actor asks for it only on a contended key.
///
/// Any other document unchanged (`nModified` 0): the general release
/// decides. Either way the fields other clients read are restated in this
/// write, not by a last stage: a document it leaves alone must stay
/// unchanged, since `nModified` is the answer.
pub(super) fn light_release_update(owner: &str, hands_over: bool) -> Vec<Document> {
    let expires = doc! { "$min": [f(field::EXPIRES_AT), "$$NOW"] };
    let released = root_with(
        doc! {
            field::EXPIRES_AT: expires.clone(),
            field::OBTAINED_AT: f(field::RENEWED_AT),
            field::TTL_SECONDS: restated_seconds(expires, f(field::RENEWED_AT), f(field::TOKEN)),
        },
        &[field::LEASE_ID],
    );
    if !hands_over {
        return vec![doc! { "$replaceWith": { "$cond": [
            ours_and_nobody_else_waits(owner, LID, vec![]),
            released,
            "$$ROOT",
        ]}}];
    }
    // The next holder `$$next`, its token `$$tok` and expiry `$$exp`: the
    // general release's handoff stage, and the restated fields after it.
    let entry = |name: &str| Bson::from(format!("$$next.{name}"));
    let mut handed = handed_fields(&entry, "$$tok".into(), "$$exp".into());
    handed.insert(
        field::QUEUE,
        or_remove(entries_without("$$live", entry(field::OWNER))),
    );
    handed.insert(field::OBTAINED_AT, "$$NOW");
    handed.insert(
        field::TTL_SECONDS,
        restated_seconds("$$exp", "$$NOW", "$$tok"),
    );
    // Every field the handoff removes, or sets from the entry (an entry
    // without a lease id then leaves none, as the general release).
    let mut kept = Bson::from("$$ROOT");
    for name in [
        field::LEASE_ID,
        field::QUEUE,
        field::WAITING_SINCE,
        field::YIELD_UNTIL,
        field::HOLD_UNTIL,
        field::REVOCATION,
        field::PAYLOAD,
    ] {
        kept = doc! { "$unsetField": { "field": name, "input": kept } }.into();
    }
    let handed = doc! { "$let": {
        "vars": {
            "tok": next_token(),
            "exp": { "$add": ["$$NOW", entry(field::HANDED_TTL)] },
        },
        "in": { "$mergeObjects": [kept, handed] },
    }};
    let nobody_waits = doc! { "$and": [missing(field::QUEUE), missing(field::WAITING_SINCE)] };
    let ours = doc! { "$and": [
        { "$eq": [f(field::OWNER), { "$literal": owner }] },
        { "$eq": [f(field::LEASE_ID), LID] },
        missing(field::OTHER_OWNER),
        missing(field::HOLD_UNTIL),
        missing(field::HOLDERS),
        missing(field::PERMITS),
    ]};
    vec![doc! { "$replaceWith": { "$cond": [
        ours,
        { "$let": {
            "vars": { "live": live_entries() },
            "in": { "$let": {
                "vars": { "next": { "$first": entries_without("$$live", f(field::OWNER)) } },
                "in": { "$cond": [
                    { "$and": [
                        { "$eq": [{ "$type": "$$next" }, "object"] },
                        missing(field::NOT_BEFORE),
                    ]},
                    handed,
                    { "$cond": [nobody_waits, released, "$$ROOT"] },
                ]},
            }},
        }},
        "$$ROOT",
    ]}}]
}

/// Every lease document of `owner` not released yet (live, or expired
/// without a release), of our layout: an operator's release by owner id.
/// Another application's lock document with the same `aid` (no int64 `tok`)
/// never matches.
pub(super) fn owner_leases_filter(owner: &str) -> Document {
    doc! {
        field::OWNER: owner,
        field::LEASE_ID: { "$exists": true },
        field::TOKEN: { "$type": "long" },
        field::EXPIRES_AT: { "$type": "date" },
        field::OTHER_OWNER: { "$exists": false },
    }
}

/// The documents among `filter`'s that a release in delete mode deletes at
/// once ([`LockPath::deletable_filter`], with no `hs` nor `q`).
pub(super) fn deletable_filter(filter: Document, min_age_ms: i64) -> Document {
    LockPath::TOP.deletable_filter(filter, min_age_ms, &[field::HOLDERS, field::QUEUE])
}

/// What the follow-up delete of delete mode removes among `filter`'s
/// ([`LockPath::released_filter`], with no `hs` nor `q`, `hl` not ahead).
pub(super) fn released_filter(filter: Document, min_age_ms: i64) -> Document {
    LockPath::TOP.released_filter(
        filter,
        min_age_ms,
        &[field::HOLDERS, field::QUEUE],
        &[field::HOLD_UNTIL, field::NOT_BEFORE],
    )
}

/// A release in two idempotent writes, each retried after a transient
/// failure (up to [`WRITE_ATTEMPTS`](super::handle::WRITE_ATTEMPTS) in all):
/// `remove` (a delete, or the removal of a user document's lock field)
/// where it applies, then `mark`, the released state; each gives its
/// count. A `single` lease that `remove`
/// removed is done. After a failure an earlier attempt may have applied: a
/// lease that neither write finds is then reported lost all the same,
/// since an operator may have ended it before (property 7 of
/// docs/safety.md: a doubt reports a loss, never the reverse). How many
/// were removed, and how many marked released.
pub(super) async fn release_in_two_writes(
    single: bool,
    remove: impl Future<Output = Result<u64>>,
    mark: impl Future<Output = Result<u64>>,
) -> Result<(u64, u64)> {
    let removed = remove.await?;
    if single && removed > 0 {
        return Ok((removed, 0));
    }
    let marked = mark.await?;
    Ok((removed, marked))
}

/// Field of a force release's read: the whole stored document.
pub(super) const STORED: &str = "sd";

/// A foreign holder's lock under `key`, only while it is still the whole
/// document `found` read ([`STORED`]): the filter of a force release's
/// delete, so that a concurrent change is not clobbered.
pub(super) fn foreign_filter(key: &LeaseKey, found: &Document) -> Document {
    let stored = found.get(STORED).cloned().unwrap_or(Bson::Null);
    doc! {
        field::ID: key.to_bson(),
        "$expr": { "$eq": ["$$ROOT", { "$literal": stored }] },
    }
}

impl MongoStore {
    /// The light release's `update` of `lease`'s document
    /// ([`light_release_update`]): 1 if it released the lease, 0 if it did not
    /// apply; 0 after a write error too, so that the general release that
    /// follows decides, and reports the error if the server refuses it
    /// again. Idempotent: the first write that lands removes `lid`.
    pub(super) async fn release_light_command(
        &self,
        lease: &LeaseRef,
        hands_over: bool,
    ) -> Result<u64> {
        let mut statement = rawdoc! { "q": raw_key_filter(&lease.key)? };
        statement.append_ref("u", self.light.release(hands_over));
        statement.append("multi", false);
        let mut statements = RawArrayBuf::new();
        statements.push(statement);
        let mut command = update_statements(self.coll().name(), statements, true);
        command.append("let", raw_lets(&[(LID, lease.lease_id)]));
        let reply = self.raw_command(command).await?;
        Ok(update_counts(&reply).map_or(0, |(_, modified)| modified))
    }

    /// The light releases of `leases` (exclusive, of distinct keys; string
    /// keys if more than one): the light form's own command for one, one
    /// batch for more ([`MongoStore::release_light_batch`]); one answer each, in order.
    pub(super) async fn light_releases(
        &self,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    ) -> Vec<LightRelease> {
        match &leases[..] {
            [lease] => vec![self.release_light_alone(lease, hands_over).await],
            _ => self.release_light_batch(&leases, hands_over).await,
        }
    }

    /// The light release's own command for `lease`, retried after a
    /// transient failure: one sent again that finds nothing is not applied
    /// (an operator may have ended the lease before it; the general release
    /// decides).
    pub(super) async fn release_light_alone(
        &self,
        lease: &LeaseRef,
        hands_over: bool,
    ) -> LightRelease {
        let send = || self.release_light_command(lease, hands_over);
        lone_release_answer(retried("release", send).await)
    }

    /// The light releases of `leases` (of distinct string keys) in one
    /// `update`, and one `find` unless all applied (see the module docs);
    /// one answer each, in order.
    pub(super) async fn release_light_batch(
        &self,
        leases: &[LeaseRef],
        hands_over: bool,
    ) -> Vec<LightRelease> {
        let all = |outcome: fn() -> LightRelease| leases.iter().map(|_| outcome()).collect();
        let mut statements = RawArrayBuf::new();
        for lease in leases {
            let Ok(filter) = raw_key_filter(&lease.key) else {
                return all(|| LightRelease::NotApplied);
            };
            let mut statement = rawdoc! { "q": filter };
            statement.append_ref("u", self.light.release(hands_over));
            statement.append("c", raw_lets(&[(LID, lease.lease_id)]));
            statements.push(statement);
        }
        let command = update_statements(self.coll().name(), statements, false);
        // After an error, not known to have released: the general release
        // decides, and reports a lease it no longer finds lost (module docs).
        let Ok(reply) = self.raw_command(command).await else {
            return all(|| LightRelease::NotApplied);
        };
        let (_, count, errors) = update_reply(&reply);
        if !errors && count == leases.len() as u64 {
            return all(|| LightRelease::Released);
        }
        let keys: Vec<&str> = leases.iter().filter_map(|l| l.key.as_str()).collect();
        let projection = doc! { field::LEASE_ID: 1 };
        let Some(docs) = self.read_keys(&keys, projection).await else {
            return all(|| LightRelease::NotApplied);
        };
        let read: Vec<Read> = leases
            .iter()
            .map(|lease| {
                let doc = lease.key.as_str().and_then(|k| docs.get(k));
                let lease_id = doc.and_then(|d| d.get(field::LEASE_ID));
                if lease_id == Some(&bson_lease_id(lease.lease_id)) {
                    Read::Kept
                } else {
                    Read::Gone
                }
            })
            .collect();
        release_outcomes(read, count)
    }

    /// One `findAndModify` (a retryable write) that releases `key` if a lease
    /// of our layout holds it now, whoever the owner; returns it as it was.
    /// Otherwise, if a foreign holder's lock held by its rule is there, one
    /// `deleteOne` (a retryable write) deletes it if it is still the document
    /// read ([`foreign_filter`]); a concurrent change wins, and nothing is
    /// reported released.
    pub(super) async fn force_release_key(
        &self,
        key: LeaseKey,
        end: OverrideEnd,
    ) -> Result<Option<LeaseInfo>> {
        let before = self
            .bounded(
                self.coll()
                    .find_one_and_update(
                        force_release_any_filter(&key, end),
                        force_release_update(self.yield_ms, self.lock_delay_ms, end),
                    )
                    .return_document(ReturnDocument::Before)
                    .projection(self.info_projection()),
            )
            .await?;
        if let Some(doc) = before {
            // A key an earlier override left waiting held nothing.
            return Ok(projected_info(&key, &doc).filter(|info| info.held));
        }
        let mut projection = self.info_projection();
        projection.insert(STORED, "$$ROOT");
        let found = self.read_key(&key, projection).await?;
        let Some((found, info)) = found
            .and_then(|doc| projected_info(&key, &doc).map(|info| (doc, info)))
            .filter(|(_, info)| info.foreign && info.held)
        else {
            return Ok(None);
        };
        let deleted = self
            .bounded(self.coll().delete_one(foreign_filter(&key, &found)))
            .await?;
        Ok((deleted.deleted_count == 1).then_some(info))
    }

    /// Deletes the documents matching `filter`: `deleteOne` for a `single`
    /// lease (a retryable write), else `deleteMany` (idempotent).
    async fn delete_matching(&self, filter: &Document, single: bool) -> Result<u64> {
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

    /// Releases the leases matching `filter` ([`release_in_two_writes`]);
    /// `single` for one lease, which uses `updateOne` / `deleteOne` so that
    /// the driver's retryable writes report the original outcome.
    ///
    /// In [`ReleaseMode::Delete`] and with `delete_first`, the documents
    /// whose token is at least [`DELETE_MIN_TOKEN_AGE`](crate::config::DELETE_MIN_TOKEN_AGE) old and that nobody
    /// waited for are deleted first ([`deletable_filter`]); the rest are
    /// marked released ([`release_any_update`]) as in keep mode. Returns how
    /// many were deleted and how many marked released.
    async fn release_parts(
        &self,
        filter: Document,
        selection: &Selection<'_>,
        single: bool,
        delete_first: bool,
    ) -> Result<(u64, u64)> {
        let delete = async {
            if !delete_first || self.release_mode != ReleaseMode::Delete {
                return Ok(0);
            }
            let deletable = deletable_filter(filter.clone(), min_token_age_ms());
            self.delete_matching(&deletable, single).await
        };
        let update = || release_any_update(selection, self.yield_ms).into();
        let mark = self.update_matching(self.coll(), "release", &filter, update, single);
        release_in_two_writes(single, delete, mark).await
    }

    pub(super) async fn release_matching(
        &self,
        filter: Document,
        selection: &Selection<'_>,
        single: bool,
        delete_first: bool,
    ) -> Result<u64> {
        let (deleted, marked) = self
            .release_parts(filter, selection, single, delete_first)
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
            let selection = Selection::Leases {
                owner: self.owner(),
                ids: lease_ids(&round),
            };
            let filter = holder_filter(self.owner(), &round);
            count += self
                .release_matching(filter, &selection, round.len() == 1, delete_first)
                .await?;
        }
        Ok(count)
    }

    /// Delete mode's follow-up: deletes the released documents among
    /// `filter`'s whose token is now old enough ([`released_filter`]).
    pub(super) async fn delete_released_matching(&self, filter: Document) -> Result<u64> {
        let filter = released_filter(filter, min_token_age_ms());
        self.delete_matching(&filter, false).await
    }

    /// Releases every lease document of `owner` not released yet
    /// ([`owner_leases_filter`]), whoever's manager holds it. How many it
    /// deleted, and how many it marked released: in delete mode, those
    /// (tokens younger than
    /// [`DELETE_MIN_TOKEN_AGE`](crate::config::DELETE_MIN_TOKEN_AGE), or
    /// keys kept until `nb`) are left to the caller's follow-up delete.
    pub(super) async fn release_owner_leases(
        &self,
        owner: String,
        end: OverrideEnd,
    ) -> Result<(u64, u64)> {
        let mut holders = owner_holders_filter(&owner);
        if end == OverrideEnd::AtExpiry {
            // A place an earlier such release kept (its entry without a
            // lease id) is released already; an immediate one frees it.
            holders = doc! { "$and": [holders, { field::HOLDERS: { "$elemMatch": {
                field::OWNER: { "$eq": &owner },
                field::LEASE_ID: { "$exists": true },
            }}}]};
        }
        let filter = doc! { "$or": [owner_leases_filter(&owner), holders] };
        let delay_ms = self.lock_delay_ms;
        let selection = Selection::OwnerLeases {
            owner: &owner,
            delay_ms,
            end,
        };
        // Waiting for a lock-delay or a lease's expiry, a live lease's
        // document stays until `nb`: the follow-up delete waits for it
        // ([`released_filter`]).
        let delete_first = delay_ms == 0 && end == OverrideEnd::Immediately;
        self.release_parts(filter, &selection, false, delete_first)
            .await
    }
}
