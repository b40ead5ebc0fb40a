//! **Handoff**: a release that makes the next holder in the releasing write
//! itself, with a greater fencing token. One concept, two routes:
//!
//! - to a **local waiter** ("Handoff to a local waiter" in `store`): one
//!   `findOneAndUpdate` ([`handoff_update`], sent by
//!   [`MongoStore::handoff_general`]), or its light form
//!   ([`light_handoff_update`], [`MongoStore::handoff_light_once`]) for a
//!   key nobody else waits for, as the actor chose; each resolves an
//!   unknown outcome by re-reading;
//! - to the first **registered** owner of another manager ("Queue of
//!   waiting owners"): the stages every release carries ([`pick_stage`],
//!   [`handoff_stages`]), and [`MongoStore::leave_queues_of`], which removes
//!   a manager's registrations when it stops.

use super::handle::{MongoStore, WRITE_ATTEMPTS, ttl_ms};
use super::raw::raw_lets_with_ttl;
use super::rules::{
    FROM, TO, TTL, acquired_token, bson_lease_id, f, keys_filter, missing, next_token,
    ours_and_nobody_else_waits, read_lease_id, restated_after, root_with, transitions_after,
};
use crate::error::Result;
use crate::key::LeaseKey;
use crate::store::{Handoff, HandoffOutcome, field};
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReturnDocument;
use uuid::Uuid;
/// The lease `from` of `owner` on `key`, a plain lease of our
/// shape, live by the server's clock (`exp > $$NOW`).
pub(super) fn handoff_filter(key: &LeaseKey, owner: &str, from: Uuid) -> Document {
    doc! {
        field::ID: key,
        field::LEASE_ID: bson_lease_id(from),
        field::OWNER: { "$eq": owner },
        field::TOKEN: { "$type": "long" },
        field::OTHER_OWNER: { "$exists": false },
        "$expr": { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    }
}

/// The handoff's update ("Handoff to a local waiter" in `store`): a new
/// acquisition under `to` when no other owner waits and no minimum hold is
/// live; otherwise the release of an exclusive lease, then handed to the
/// first owner registered in the queue if there is one (between the
/// queue's pick and handoff stages). One `$set` for the local handoff or
/// the release: every expression reads the document as it was.
pub(super) fn handoff_update(to: Uuid, ttl_ms: i64, yield_ms: i64) -> Vec<Document> {
    // Another owner waits: marked (`wt`), or registered in the queue of
    // waiting owners (picked by `pick_stage`, handed the key by
    // `handoff_stages`; "Queue of waiting owners" in `store`).
    let waited = doc! { "$or": [
        { "$ne": [{ "$type": f(field::WAITING_SINCE) }, "missing"] },
        handed(),
    ]};
    let holding = doc! { "$gt": [f(field::HOLD_UNTIL), "$$NOW"] };
    let handed = doc! { "$not": [{ "$or": [waited.clone(), holding] }] };
    let either = |acquired: Bson, released: Bson| -> Bson {
        doc! { "$cond": [handed.clone(), acquired, released] }.into()
    };
    let now = || Bson::from("$$NOW");
    let remove = || Bson::from("$$REMOVE");
    let keep = |name: &str| Bson::from(f(name));
    let released_exp = doc! { "$max": [
        { "$min": [f(field::EXPIRES_AT), "$$NOW"] },
        f(field::HOLD_UNTIL),
    ]};
    let yielded = doc! { "$cond": [
        waited,
        { "$add": ["$$NOW", yield_ms] },
        f(field::YIELD_UNTIL),
    ]};
    let [handoff, cleanup] = handoff_stages();
    restated_after(vec![
        pick_stage(),
        doc! { "$set": {
            field::LEASE_ID: either(bson_lease_id(to), remove()),
            field::TOKEN: either(next_token().into(), keep(field::TOKEN)),
            field::ACQUIRED_AT: either(now(), keep(field::ACQUIRED_AT)),
            field::RENEWED_AT: either(now(), keep(field::RENEWED_AT)),
            field::EXPIRES_AT: either(doc! { "$add": ["$$NOW", ttl_ms] }.into(), released_exp.into()),
            field::PAYLOAD: either(remove(), keep(field::PAYLOAD)),
            field::HOLD_UNTIL: either(remove(), keep(field::HOLD_UNTIL)),
            field::REVOCATION: either(remove(), keep(field::REVOCATION)),
            field::YIELD_UNTIL: either(remove(), yielded.into()),
            field::WAITING_SINCE: remove(),
        }},
        handoff,
        cleanup,
    ])
}

/// The projection of the handoff's reply and of its re-read.
pub(super) fn handoff_projection() -> Document {
    doc! { field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1 }
}

/// What the handoff's reply (the document after the write, projected
/// with [`handoff_projection`]) says: `to` holds it, or it was released.
pub(super) fn classify_handoff(doc: &Document, to: Uuid) -> HandoffOutcome {
    let ours = read_lease_id(doc.get(field::LEASE_ID)) == Some(to);
    match doc.get_i64(field::TOKEN) {
        Ok(token) if ours => HandoffOutcome::Acquired {
            token: token as u64,
        },
        _ => HandoffOutcome::Released,
    }
}

/// The light handoff's update, of the document of the key (its `_id`
/// alone, B26): if it holds the live lease `$$from` of `owner`
/// ([`handoff_filter`]'s conditions)
/// and nobody else waits and no minimum hold is live, a new acquisition
/// under `$$to`, expiring `$$ttl` milliseconds after `$$NOW`, with the next token,
/// without the payload and the yield; any other document unchanged.
pub(super) fn light_handoff_update(owner: &str) -> Vec<Document> {
    let live = vec![
        doc! { "$eq": [{ "$type": f(field::TOKEN) }, "long"] },
        doc! { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
        missing(field::OTHER_OWNER),
    ];
    let handed = root_with(
        doc! {
            field::LEASE_ID: TO,
            field::TOKEN: next_token(),
            field::ACQUIRED_AT: "$$NOW",
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: { "$add": ["$$NOW", TTL] },
        },
        // A new acquisition: no payload, yield or request to release of
        // the lease it ends (as the general handoff).
        &[field::PAYLOAD, field::YIELD_UNTIL, field::REVOCATION],
    );
    restated_after(vec![doc! { "$replaceWith": { "$cond": [
        ours_and_nobody_else_waits(owner, FROM, live),
        handed,
        "$$ROOT",
    ]}}])
}

/// `$$e.name`: field `name` of the queue entry at hand (bound as `e`).
pub(super) fn e(name: &str) -> String {
    format!("$$e.{name}")
}

/// The live entries of `q` (`re > $$NOW`), in order; `[]` without a `q`
/// array.
pub(super) fn live_entries() -> Document {
    doc! { "$filter": {
        "input": { "$cond": [{ "$isArray": f(field::QUEUE) }, f(field::QUEUE), []] },
        "as": "e",
        "cond": { "$gt": [e(field::REGISTRATION_EXPIRES), "$$NOW"] },
    }}
}

/// `entries` without those of owner id `owner` (an expression).
pub(super) fn entries_without(entries: impl Into<Bson>, owner: impl Into<Bson>) -> Document {
    doc! { "$filter": {
        "input": entries.into(),
        "as": "e",
        "cond": { "$ne": [e(field::OWNER), owner.into()] },
    }}
}

/// `entries` (an array expression), or `$$REMOVE` if it is empty: a `q`
/// is removed once nobody waits.
pub(super) fn or_remove(entries: Document) -> Document {
    doc! { "$let": {
        "vars": { "q": entries },
        "in": { "$cond": [{ "$gt": [{ "$size": "$$q" }, 0] }, "$$q", "$$REMOVE"] },
    }}
}

/// Temporary field of a release: the queue entry the key is handed to
/// (removed by the release's last stage).
pub(super) const HANDED: &str = "qh";

/// Whether the release hands the key over (a [`HANDED`] entry was picked).
pub(super) fn handed() -> Document {
    doc! { "$eq": [{ "$type": f(HANDED) }, "object"] }
}

/// The first stage of a release ([`handoff_stages`] ends it): picks the
/// first live entry of another owner than the releasing holder's (`aid`),
/// on an exclusive key (no `hs`) with no minimum hold nor lock-delay ahead
/// (`hl`, `nb`).
pub(super) fn pick_stage() -> Document {
    let exclusive = doc! { "$not": [{ "$isArray": f(field::HOLDERS) }] };
    let ahead = doc! { "$max": [f(field::HOLD_UNTIL), f(field::NOT_BEFORE)] };
    let no_hold = doc! { "$not": [{ "$gt": [ahead, "$$NOW"] }] };
    doc! { "$set": { HANDED: { "$cond": [
        { "$and": [exclusive, no_hold] },
        { "$first": entries_without(live_entries(), f(field::OWNER)) },
        "$$REMOVE",
    ]}}}
}

/// What a release that hands the key to a queue entry writes ("Queue of
/// waiting owners" in `store`), `entry(name)` being the entry's field
/// `name`: its owner becomes the holder (`aid`, `lid` from the entry, the
/// next `token`, one more leader transition, `acq = ts = $$NOW`, `exp =
/// expires`, the entry's `data` if any), with no `yu`, `hl` nor `rv`
/// (`$$REMOVE`). The general release's handoff stage ([`handoff_stages`])
/// and the light release (`release::light_release_update`) both write it.
pub(super) fn handed_fields(entry: &dyn Fn(&str) -> Bson, token: Bson, expires: Bson) -> Document {
    doc! {
        field::OWNER: entry(field::OWNER),
        field::LEASE_ID: entry(field::LEASE_ID),
        field::TOKEN: token,
        field::TRANSITIONS: transitions_after(entry(field::OWNER)),
        field::ACQUIRED_AT: "$$NOW",
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: expires,
        field::YIELD_UNTIL: "$$REMOVE",
        field::HOLD_UNTIL: "$$REMOVE",
        field::REVOCATION: "$$REMOVE",
        // The payload the entry's owner acquires with, if any.
        field::PAYLOAD: { "$ifNull": [entry(field::PAYLOAD), "$$REMOVE"] },
    }
}

/// The last stages of a release, after the release itself: if an entry was
/// picked ([`pick_stage`]), the key is handed to it ([`handed_fields`]);
/// in any case `q` keeps the live entries but the picked one, and the
/// temporary field goes.
pub(super) fn handoff_stages() -> [Document; 2] {
    let from_entry = |name: &str| Bson::from(format!("${HANDED}.{name}"));
    let expires = doc! { "$add": ["$$NOW", from_entry(field::HANDED_TTL)] };
    let mut set = Document::new();
    for (name, value) in handed_fields(&from_entry, next_token().into(), expires.into()) {
        let value = doc! { "$cond": [handed(), value, f(&name)] };
        set.insert(name, value);
    }
    set.insert(
        field::QUEUE,
        doc! { "$cond": [
            { "$isArray": f(field::QUEUE) },
            or_remove(entries_without(live_entries(), from_entry(field::OWNER))),
            "$$REMOVE",
        ]},
    );
    [doc! { "$set": set }, doc! { "$unset": [HANDED] }]
}

impl MongoStore {
    /// The general handoff (see "Handoff to a local waiter" in `store`):
    /// one `findOneAndUpdate`, tried again (up to [`WRITE_ATTEMPTS`] in
    /// all) only while a re-read after a transient failure finds `from`
    /// still in place.
    pub(super) async fn handoff_general(&self, handoff: &Handoff) -> Result<HandoffOutcome> {
        let Handoff { key, from, to, .. } = handoff;
        let mut attempt = 1;
        loop {
            let write = self
                .bounded(
                    self.coll()
                        .find_one_and_update(
                            handoff_filter(key, self.owner(), *from),
                            handoff_update(*to, ttl_ms(handoff.ttl), self.yield_ms),
                        )
                        .return_document(ReturnDocument::After)
                        .projection(handoff_projection()),
                )
                .await;
            let error = match write {
                Ok(Some(doc)) => return Ok(classify_handoff(&doc, *to)),
                Ok(None) => return Ok(HandoffOutcome::Lost),
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(e),
            };
            match self.handoff_reread(handoff, &error, attempt).await? {
                Some(outcome) => return Ok(outcome),
                None if attempt < WRITE_ATTEMPTS => attempt += 1,
                None => return Err(error),
            }
        }
    }

    /// The light handoff ([`light_handoff_update`]), sent once: `Acquired`
    /// if it applied, `NotApplied` if it did not (the actor then sends the
    /// general form, which decides). An unknown outcome is re-read:
    /// `NotApplied` too while `from` still holds the key.
    pub(super) async fn handoff_light_once(&self, handoff: &Handoff) -> Result<HandoffOutcome> {
        let error = match self.handoff_light(handoff).await {
            Ok(Some(token)) => return Ok(HandoffOutcome::Acquired { token }),
            Ok(None) => return Ok(HandoffOutcome::NotApplied),
            Err(e) if e.is_transient() => e,
            Err(e) => return Err(e),
        };
        let outcome = self.handoff_reread(handoff, &error, 1).await?;
        Ok(outcome.unwrap_or(HandoffOutcome::NotApplied))
    }

    /// After a handoff write whose outcome is unknown (`error`), re-read,
    /// never assume (docs/mongodb-behaviour.md, B7): `to` holds the key
    /// (the write landed), or neither lease does: lost, whether the write
    /// released it or an operator ended it before (property 7 of
    /// docs/safety.md: a doubt reports a loss, never the reverse); `None`
    /// while `from` still holds it (the write did not land).
    async fn handoff_reread(
        &self,
        handoff: &Handoff,
        error: &crate::error::Error,
        attempt: u32,
    ) -> Result<Option<HandoffOutcome>> {
        let Handoff { key, from, to, .. } = handoff;
        tracing::debug!(%key, %error, attempt, "handoff outcome unknown; re-reading");
        let found = self.read_key(key, handoff_projection()).await?;
        let ours = found
            .as_ref()
            .filter(|d| d.get_str(field::OWNER).is_ok_and(|o| o == self.owner()));
        Ok(
            match ours.and_then(|d| read_lease_id(d.get(field::LEASE_ID))) {
                Some(id) if id == *to => ours.map(|doc| classify_handoff(doc, *to)),
                Some(id) if id == *from => None,
                _ => Some(HandoffOutcome::Lost),
            },
        )
    }

    /// The light handoff's one write: the new token if it applied; `None`
    /// if it did not.
    ///
    /// # Errors
    ///
    /// As the write's: a transient error is an unknown outcome (the write
    /// may have applied, under `to`).
    pub(super) async fn handoff_light(&self, handoff: &Handoff) -> Result<Option<u64>> {
        let lets = raw_lets_with_ttl(&[(FROM, handoff.from), (TO, handoff.to)], handoff.ttl);
        let doc = self
            .find_and_modify(
                &handoff.key,
                false,
                &self.light.handoff,
                &self.light.projection,
                lets,
            )
            .await?;
        Ok(doc.and_then(|doc| acquired_token(&doc, self.owner(), handoff.to)))
    }

    /// [`Store::leave_queues`](crate::store::Store::leave_queues): one
    /// `updateMany` on the documents of our layout among `keys` whose queue
    /// has an entry of this owner, keeping the other owners' live entries
    /// (and removing `q` once none is left, as every write of it does); a
    /// document another application took over in place keeps our `q` and
    /// is never written.
    pub(super) async fn leave_queues_of(&self, keys: Vec<LeaseKey>) -> Result<u64> {
        let mut filter = keys_filter(&keys);
        filter.insert(format!("{}.{}", field::QUEUE, field::OWNER), self.owner());
        filter.insert(field::TOKEN, doc! { "$type": "long" });
        filter.insert(field::OTHER_OWNER, doc! { "$exists": false });
        let update = vec![doc! { "$set": { field::QUEUE: or_remove(
            entries_without(live_entries(), self.owner()),
        ) } }];
        Ok(self
            .bounded(self.coll().update_many(filter, update))
            .await?
            .modified_count)
    }
}

#[cfg(test)]
mod tests;
