//! The handoff to a local waiter ("Handoff to a local waiter" in `store`):
//! the BSON of its one `findOneAndUpdate` (pure, unit-tested below), the
//! reading of what comes back, and [`MongoStore::hand_over_once`], which
//! sends it and resolves an unknown outcome by re-reading.

use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReturnDocument;
use uuid::Uuid;

use super::handle::MongoStore;
use super::ops::WRITE_ATTEMPTS;
use super::pipeline::key_filter;
use super::rules::{bson_lease_id, next_token, read_lease_id};
use crate::error::Result;
use crate::key::LeaseKey;
use crate::store::{HandOver, field};

fn f(name: &str) -> String {
    format!("${name}")
}

/// The lease `from` of `owner` on `key`, a plain exclusive lease of our
/// shape, live by the server's clock (`exp > $$NOW`).
pub(super) fn hand_over_filter(key: &LeaseKey, owner: &str, from: Uuid) -> Document {
    doc! {
        field::ID: key,
        field::LEASE_ID: bson_lease_id(from),
        field::OWNER: { "$eq": owner },
        field::TOKEN: { "$type": "long" },
        "$expr": { "$gt": [f(field::EXPIRES_AT), "$$NOW"] },
    }
}

/// The handoff's update: a new acquisition under `to` (expiring `ttl_ms`
/// after `$$NOW`, the next token, no `data`, `hl`, `wt` nor `yu`) when no
/// other owner waits (no `wt`) and no minimum hold is live; otherwise the
/// release of an exclusive lease (`lid` and `wt` removed, `exp =
/// max(min(exp, $$NOW), hl)`, `yu = $$NOW + yield_ms` if another owner
/// waited), then handed to the first owner registered in the queue of
/// waiting owners if there is one (between `queue`'s pick and handoff
/// stages). One `$set` for the local handoff or the release: every
/// expression reads the document as it was.
pub(super) fn hand_over_update(to: Uuid, ttl_ms: i64, yield_ms: i64) -> Vec<Document> {
    // Another owner waits: marked (`wt`), or registered in the queue of
    // waiting owners (picked by `pick_stage`, handed the key by
    // `handoff_stages`; "Queue of waiting owners" in `store`).
    let waited = doc! { "$or": [
        { "$ne": [{ "$type": f(field::WAITING_SINCE) }, "missing"] },
        { "$eq": [{ "$type": f(super::queue::HANDED) }, "object"] },
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
    let [handoff, cleanup] = super::queue::handoff_stages();
    vec![
        super::queue::pick_stage(),
        doc! { "$set": {
            field::LEASE_ID: either(bson_lease_id(to), remove()),
            field::TOKEN: either(next_token().into(), keep(field::TOKEN)),
            field::ACQUIRED_AT: either(now(), keep(field::ACQUIRED_AT)),
            field::RENEWED_AT: either(now(), keep(field::RENEWED_AT)),
            field::EXPIRES_AT: either(doc! { "$add": ["$$NOW", ttl_ms] }.into(), released_exp.into()),
            field::PAYLOAD: either(remove(), keep(field::PAYLOAD)),
            field::HOLD_UNTIL: either(remove(), keep(field::HOLD_UNTIL)),
            field::YIELD_UNTIL: either(remove(), yielded.into()),
            field::WAITING_SINCE: remove(),
        }},
        handoff,
        cleanup,
    ]
}

/// The projection of the handoff's reply and of its re-read.
pub(super) fn hand_over_projection() -> Document {
    doc! { field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1 }
}

/// What the handoff's reply (the document after the write, projected
/// with [`hand_over_projection`]) says: `to` holds it, or it was released.
pub(super) fn classify_hand_over(doc: &Document, to: Uuid) -> HandOver {
    match (
        read_lease_id(doc.get(field::LEASE_ID)),
        doc.get_i64(field::TOKEN),
    ) {
        (Some(id), Ok(token)) if id == to => HandOver::Acquired {
            token: token as u64,
        },
        _ => HandOver::Released,
    }
}

impl MongoStore {
    /// The handoff of the plain exclusive lease `from` of `key` to `to`
    /// (see "Handoff to a local waiter" in `store`): one `findOneAndUpdate`,
    /// tried again (up to [`WRITE_ATTEMPTS`] in all) only while a re-read
    /// after a transient failure finds `from` still in place.
    pub(super) async fn hand_over_once(
        &self,
        key: LeaseKey,
        from: Uuid,
        to: Uuid,
        ttl_ms: i64,
        light: bool,
    ) -> Result<HandOver> {
        // The light form first, for a key nobody else waits for (`light`),
        // unless the actor found the key contended lately.
        let mut light = light;
        let mut attempt = 1;
        loop {
            let error = if light {
                light = false;
                match self.hand_over_light(&key, from, to, ttl_ms).await {
                    Ok(Some(token)) => return Ok(HandOver::Acquired { token }),
                    // It did not apply: the general form tells why.
                    Ok(None) => continue,
                    Err(e) if e.is_transient() => e,
                    Err(e) => return Err(e),
                }
            } else {
                let write = self
                    .bounded(
                        self.coll()
                            .find_one_and_update(
                                hand_over_filter(&key, self.owner(), from),
                                hand_over_update(to, ttl_ms, self.yield_ms()),
                            )
                            .return_document(ReturnDocument::After)
                            .projection(hand_over_projection()),
                    )
                    .await;
                match write {
                    Ok(Some(doc)) => return Ok(classify_hand_over(&doc, to)),
                    Ok(None) => return Ok(HandOver::Lost),
                    Err(e) if e.is_transient() => e,
                    Err(e) => return Err(e),
                }
            };
            // Outcome unknown: re-read, never assume (docs/mongodb-behaviour.md, B7).
            tracing::debug!(%key, error = %error, attempt, "handoff outcome unknown; re-reading");
            let found = self
                .bounded(
                    self.coll()
                        .find_one(key_filter(&key))
                        .projection(hand_over_projection()),
                )
                .await?;
            let ours = found
                .as_ref()
                .filter(|d| d.get_str(field::OWNER).is_ok_and(|o| o == self.owner()));
            match ours.and_then(|d| read_lease_id(d.get(field::LEASE_ID))) {
                Some(id) if id == to => {
                    return Ok(classify_hand_over(ours.expect("read above"), to));
                }
                Some(id) if id == from && attempt < WRITE_ATTEMPTS => attempt += 1,
                Some(id) if id == from => return Err(error),
                // As a release whose outcome was unknown: gone means released.
                _ => return Ok(HandOver::Released),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_names_the_live_lease_of_our_shape() {
        let from = Uuid::new_v4();
        let filter = hand_over_filter(&"k".into(), "a", from);
        assert_eq!(filter.get_str(field::ID).unwrap(), "k");
        assert_eq!(read_lease_id(filter.get(field::LEASE_ID)), Some(from));
        assert_eq!(
            filter.get_document(field::OWNER).unwrap(),
            &doc! { "$eq": "a" }
        );
        assert_eq!(
            filter.get_document("$expr").unwrap(),
            &doc! { "$gt": ["$exp", "$$NOW"] }
        );
    }

    #[test]
    fn the_update_is_one_set_stage_between_the_queues_pick_and_handoff_and_removes_the_waiting_mark()
     {
        let update = hand_over_update(Uuid::new_v4(), 1000, 500);
        assert_eq!(
            update.len(),
            4,
            "pick, the handoff or release, the queue's handoff, cleanup"
        );
        assert_eq!(update[0], crate::store::mongo::queue::pick_stage());
        assert_eq!(update[2..], crate::store::mongo::queue::handoff_stages());
        let set = update[1].get_document("$set").unwrap();
        assert_eq!(set.get_str(field::WAITING_SINCE).unwrap(), "$$REMOVE");
        for name in [
            field::LEASE_ID,
            field::TOKEN,
            field::ACQUIRED_AT,
            field::RENEWED_AT,
            field::EXPIRES_AT,
            field::PAYLOAD,
            field::HOLD_UNTIL,
            field::YIELD_UNTIL,
        ] {
            assert!(
                set.get_document(name).unwrap().contains_key("$cond"),
                "{name}"
            );
        }
        assert!(!set.contains_key(field::OWNER), "the owner id is unchanged");
    }

    #[test]
    fn a_reply_under_the_new_lease_id_is_an_acquisition_else_a_release() {
        let to = Uuid::new_v4();
        let acquired = doc! { field::LEASE_ID: bson_lease_id(to), field::TOKEN: 7_i64 };
        assert_eq!(
            classify_hand_over(&acquired, to),
            HandOver::Acquired { token: 7 }
        );
        let released = doc! { field::TOKEN: 7_i64 };
        assert_eq!(classify_hand_over(&released, to), HandOver::Released);
    }
}
