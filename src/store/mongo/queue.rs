//! The BSON of the queue of waiting owners ("Queue of waiting owners" in
//! `store`): the registration a losing waiting attempt writes, the rule
//! that keeps a free key for the head of the queue, the queue an
//! acquisition leaves, the handoff stages of a release, and the reading of
//! an attempt that the queue kept waiting. Pure functions, unit-tested
//! without a server like [`pipeline`](super::pipeline)'s; what the server
//! does with them is tested by the store contract (`store::contract::queue`).

use mongodb::bson::{Bson, Document, doc};

use super::rules::next_token;
use crate::store::field;

/// `$name`: the value of field `name`.
fn f(name: &str) -> String {
    format!("${name}")
}

/// `$$e.name`: field `name` of the queue entry at hand (bound as `e`).
fn e(name: &str) -> String {
    format!("$$e.{name}")
}

/// The live entries of `q` (`re > $$NOW`), in order; `[]` without a `q`
/// array.
fn live_entries() -> Document {
    doc! { "$filter": {
        "input": { "$cond": [{ "$isArray": f(field::QUEUE) }, f(field::QUEUE), []] },
        "as": "e",
        "cond": { "$gt": [e(field::REGISTRATION_EXPIRES), "$$NOW"] },
    }}
}

/// `entries` without those of owner id `owner` (an expression).
fn entries_without(entries: impl Into<Bson>, owner: impl Into<Bson>) -> Document {
    doc! { "$filter": {
        "input": entries.into(),
        "as": "e",
        "cond": { "$ne": [e(field::OWNER), owner.into()] },
    }}
}

/// `entries` (an array expression), or `$$REMOVE` if it is empty: a `q`
/// is removed once nobody waits.
fn or_remove(entries: Document) -> Document {
    doc! { "$let": {
        "vars": { "q": entries },
        "in": { "$cond": [{ "$gt": [{ "$size": "$$q" }, 0] }, "$$q", "$$REMOVE"] },
    }}
}

/// Whether `owner` may take the key as far as the queue is concerned: no
/// live entry, or the first live entry is `owner`'s.
pub(in crate::store::mongo) fn queue_allows(owner: &str) -> Document {
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
pub(in crate::store::mongo) fn queue_after_acquisition(owner: &str) -> Document {
    or_remove(entries_without(live_entries(), doc! { "$literal": owner }))
}

/// The `q` a losing waiting attempt by `owner` writes: the live entries in
/// order, `owner`'s refreshed in place (`lid`, `re`, `hx`; `at` kept) if it
/// names another lease id or expires within half the window, or appended
/// with `at = $$NOW`. `re = $$NOW + registration_ms`, `hx =
/// min(ttl_ms, registration_ms)`.
pub(in crate::store::mongo) fn registered(
    owner: &str,
    lease_id: Bson,
    ttl_ms: i64,
    registration_ms: i64,
) -> Document {
    let entry = |at: &str| {
        doc! {
            field::OWNER: { "$literal": owner },
            field::LEASE_ID: lease_id.clone(),
            field::REGISTERED_AT: at,
            field::REGISTRATION_EXPIRES: { "$add": ["$$NOW", registration_ms] },
            field::HANDED_TTL: ttl_ms.min(registration_ms),
        }
    };
    let is_mine = doc! { "$eq": [e(field::OWNER), { "$literal": owner }] };
    // Refreshed only under another lease id or past half its window: a
    // waiter retrying often writes nothing most of the time (B2).
    let stale = doc! { "$or": [
        { "$ne": [e(field::LEASE_ID), lease_id.clone()] },
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
                { "$anyElementTrue": [{ "$map": { "input": "$$live", "as": "e", "in": is_mine }}] },
                [],
                [entry("$$NOW")],
            ]},
        ]},
    }}
}

/// Temporary field of a release: the queue entry the key is handed to
/// (removed by the release's last stage).
pub(in crate::store::mongo) const HANDED: &str = "qh";

/// Whether the release hands the key over (a [`HANDED`] entry was picked).
fn handed() -> Document {
    doc! { "$eq": [{ "$type": f(HANDED) }, "object"] }
}

/// The first stage of a release ([`handoff_stages`] ends it): picks the
/// first live entry of another owner than the releasing holder's (`aid`),
/// on an exclusive key (no `hs`) with no minimum hold ahead (`hl`).
pub(in crate::store::mongo) fn pick_stage() -> Document {
    let exclusive = doc! { "$not": [{ "$isArray": f(field::HOLDERS) }] };
    let no_hold = doc! { "$not": [{ "$gt": [f(field::HOLD_UNTIL), "$$NOW"] }] };
    doc! { "$set": { HANDED: { "$cond": [
        { "$and": [exclusive, no_hold] },
        { "$first": entries_without(live_entries(), f(field::OWNER)) },
        "$$REMOVE",
    ]}}}
}

/// The last stages of a release, after the release itself: if an entry was
/// picked ([`pick_stage`]), its owner becomes the holder (`aid`, `lid`
/// from the entry, the next token, `acq = ts = $$NOW`, `exp = $$NOW +
/// hx`; no `yu`, `hl` nor `data`); in any case `q` keeps the live entries
/// but the picked one, and the temporary field goes.
pub(in crate::store::mongo) fn handoff_stages() -> [Document; 2] {
    let pick = |then: Bson, otherwise: Bson| doc! { "$cond": [handed(), then, otherwise] };
    let from_entry = |name: &str| Bson::from(format!("${HANDED}.{name}"));
    let keep = |name: &str| Bson::from(f(name));
    let remove = || Bson::from("$$REMOVE");
    let now = || Bson::from("$$NOW");
    [
        doc! { "$set": {
            field::OWNER: pick(from_entry(field::OWNER), keep(field::OWNER)),
            field::LEASE_ID: pick(from_entry(field::LEASE_ID), keep(field::LEASE_ID)),
            field::TOKEN: pick(next_token().into(), keep(field::TOKEN)),
            field::ACQUIRED_AT: pick(now(), keep(field::ACQUIRED_AT)),
            field::RENEWED_AT: pick(now(), keep(field::RENEWED_AT)),
            field::EXPIRES_AT: pick(
                doc! { "$add": ["$$NOW", from_entry(field::HANDED_TTL)] }.into(),
                keep(field::EXPIRES_AT),
            ),
            field::YIELD_UNTIL: pick(remove(), keep(field::YIELD_UNTIL)),
            field::HOLD_UNTIL: pick(remove(), keep(field::HOLD_UNTIL)),
            field::PAYLOAD: pick(remove(), keep(field::PAYLOAD)),
            field::QUEUE: { "$cond": [
                { "$isArray": f(field::QUEUE) },
                or_remove(entries_without(live_entries(), from_entry(field::OWNER))),
                "$$REMOVE",
            ]},
        }},
        doc! { "$unset": [HANDED] },
    ]
}

impl super::MongoStore {
    /// [`Store::leave_queues`](crate::store::Store::leave_queues): one
    /// `updateMany` on the documents of `keys` whose queue has an entry of
    /// this owner, keeping the other owners' entries.
    pub(in crate::store::mongo) async fn leave_queues_of(
        &self,
        keys: Vec<crate::key::LeaseKey>,
    ) -> crate::error::Result<u64> {
        let keys: Vec<Bson> = keys.iter().map(|k| k.to_bson()).collect();
        let entry_owner = format!("{}.{}", field::QUEUE, field::OWNER);
        let filter = doc! { field::ID: { "$in": keys }, entry_owner: self.owner() };
        let update = vec![doc! { "$set": { field::QUEUE: { "$filter": {
            "input": format!("${}", field::QUEUE),
            "cond": { "$ne": [format!("$$this.{}", field::OWNER), self.owner()] },
        } } } }];
        Ok(self
            .bounded(self.coll().update_many(filter, update))
            .await?
            .modified_count)
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::DateTime;

    use std::time::Duration;

    use super::*;
    use crate::store::AcquireOutcome;
    use crate::store::replies::held_for_queue;

    fn at(ms: i64) -> DateTime {
        DateTime::from_millis(ms)
    }

    #[test]
    fn a_free_key_kept_for_the_queue_head_is_held_by_it_until_its_registration_expires() {
        let doc = doc! {
            "now": at(10_000),
            field::QUEUE: [
                { field::OWNER: "dead", field::REGISTRATION_EXPIRES: at(9_000) },
                { field::OWNER: "head", field::REGISTRATION_EXPIRES: at(12_500) },
                { field::OWNER: "me", field::REGISTRATION_EXPIRES: at(13_000) },
            ],
        };
        let free = AcquireOutcome::Held {
            holder: "old".into(),
            remaining: Some(Duration::ZERO),
            token: Some(41),
        };
        assert_eq!(
            held_for_queue(free.clone(), &doc, "me"),
            AcquireOutcome::Held {
                holder: "head".into(),
                remaining: Some(Duration::from_millis(2_500)),
                token: Some(41),
            },
            "the last lease's token is kept"
        );
        // The head itself, and a key still held, are left as they are.
        assert_eq!(held_for_queue(free.clone(), &doc, "head"), free);
        let held = AcquireOutcome::Held {
            holder: "old".into(),
            remaining: Some(Duration::from_millis(700)),
            token: Some(41),
        };
        assert_eq!(held_for_queue(held.clone(), &doc, "me"), held);
    }

    #[test]
    fn a_registration_keeps_the_place_of_the_owners_entry_and_appends_a_new_one() {
        let reg = registered("$me", Bson::Null, 30_000, 3_000);
        let text = reg.to_string();
        assert!(text.contains("$literal"), "owner ids are literals: {text}");
        assert!(text.contains("$concatArrays"), "{text}");
        assert!(
            text.contains(&format!("\"{}\": 3000", field::HANDED_TTL)),
            "{text}"
        );
    }

    #[test]
    fn a_release_picks_only_on_an_exclusive_key_without_a_hold_ahead() {
        let text = pick_stage().to_string();
        assert!(
            text.contains(&format!("\"$isArray\": \"${}\"", field::HOLDERS)),
            "{text}"
        );
        assert!(text.contains(&format!("${}", field::HOLD_UNTIL)), "{text}");
        let [handoff, unset] = handoff_stages();
        assert_eq!(unset, doc! { "$unset": [HANDED] });
        assert!(
            handoff
                .get_document("$set")
                .unwrap()
                .contains_key(field::TOKEN)
        );
    }
}
