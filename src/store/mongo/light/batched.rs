//! The light acquire and release of many keys in one command: what the
//! actor's group commit asks for when writes queued behind one in flight.
//! A batch of one is the light form's own command, unchanged.
//!
//! * **Acquire**: one `update` of one upsert statement per key (the light
//!   acquire's update, its lease id a per-statement constant `c`), not
//!   ordered, then one `find` of the keys. The update command returns no
//!   documents, so the `find` reads each key's holder, token and expiry.
//!   A key counts as acquired only if it holds this owner and lease id and
//!   the server's remaining validity (`exp - $$NOW` at the `find`) is at
//!   least the TTL less `e`, the local time from the update's send to the
//!   `find`'s send in whole milliseconds, plus one. The `find`'s `$$NOW`
//!   is read after the `find` was sent (one clock rate, as every local
//!   deadline assumes) and rounded down to the millisecond, so `$$NOW >
//!   find send - 1 ms`, and `exp >= $$NOW + TTL - e > update send + TTL -
//!   2 ms`: the expiry is at least the update's send + the TTL, less 2 ms
//!   of rounding (far below any safety margin), which the actor counts on
//!   (it counts from its attempt's send, earlier still), whichever write
//!   under that lease id set it (this one, or an earlier attempt whose
//!   outcome was unknown, B7). The `find`'s reply leg is not counted:
//!   measured at the reply, it would lower the bound by that leg. Any
//!   other key, and every key after an error, is left to the general form,
//!   which decides (and recognises a landed earlier attempt as a retry).
//! * **Release**: one `update` of one statement per lease (the light
//!   release), not ordered. All applied (`nModified` = statements): all
//!   released. Otherwise one `find` of the keys reads each document, and
//!   the shared decision (`store::light_release`'s `release_outcomes`,
//!   which the in-memory twin makes too) tells from the modified count
//!   which leases count as released; the others are left to the general
//!   release. After an error of the `update` or of the `find`, every lease
//!   is left to the general release, which reports a lease it no longer
//!   finds as lost, not as released by the batch: an operator's force
//!   release or release by owner id before the batch leaves the same
//!   document (possibly a release reported as a loss, never the reverse).
//!
//! Only string keys are batched (the `find`'s documents are matched to
//! the requests by `_id`, which for a string is exact); the actor sends
//! other keys alone.

use std::collections::HashMap;
use std::time::Instant;

use mongodb::bson::{Document, RawArrayBuf, doc, rawdoc};

use super::super::handle::MongoStore;
use super::super::ops::ttl_ms;
use super::super::plain::{update_reply, update_statements};
use super::super::rules::bson_lease_id;
use super::{
    LID, encode_pipeline, light_acquire_update, light_release_update, raw_key_filter, raw_lets,
    raw_upsert_filter,
};
use crate::store::light_release::{
    LightAcquire, LightAcquired, LightRelease, Read, release_outcomes,
};
use crate::store::{LeaseRef, field};

/// The token of `doc` (as the batch's `find` read it) if it holds
/// `request`'s lease for `owner` for at least the request's TTL less
/// `elapsed_ms` more, by the server's clock.
fn fresh_token(
    doc: &Document,
    request: &LightAcquire,
    owner: &str,
    elapsed_ms: i64,
) -> Option<u64> {
    let ours = doc.get(field::LEASE_ID) == Some(&bson_lease_id(request.lease_id))
        && doc.get_str(field::OWNER) == Ok(owner);
    let left = doc.get_datetime(field::EXPIRES_AT).ok()?.timestamp_millis()
        - doc.get_datetime("now").ok()?.timestamp_millis();
    let token = doc.get_i64(field::TOKEN).ok()?;
    (ours && left >= ttl_ms(request.ttl) - elapsed_ms).then_some(token as u64)
}

/// The `e` of the grouped acquire's bound (see the module docs): the
/// local time from an update sent at `sent` to a `find` sent at
/// `find_sent`, in whole milliseconds, plus one.
fn elapsed_before_find(sent: Instant, find_sent: Instant) -> i64 {
    find_sent.saturating_duration_since(sent).as_millis() as i64 + 1
}

impl MongoStore {
    /// The documents of the string keys `keys`, read on the primary (read
    /// concern `local`: a majority-acknowledged write of this store is
    /// there) with `projection`, by key; `None` if the read failed.
    async fn read_keys(
        &self,
        keys: &[&str],
        projection: Document,
    ) -> Option<HashMap<String, Document>> {
        let command = doc! {
            "find": self.coll().name(),
            "filter": { field::ID: { "$in": keys } },
            "projection": projection,
            "batchSize": keys.len() as i64,
            "singleBatch": true,
            "readConcern": { "level": "local" },
        };
        let reply = self
            .bounded(self.coll_database().run_command(command))
            .await
            .ok()?;
        let batch = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .ok()?;
        Some(
            batch
                .iter()
                .filter_map(|d| d.as_document())
                .filter_map(|d| Some((d.get_str(field::ID).ok()?.to_owned(), d.clone())))
                .collect(),
        )
    }

    /// The light acquires `requests` (of distinct string keys) in one
    /// `update` and one `find` (see the module docs); one answer each, in
    /// order.
    pub(in crate::store::mongo) async fn acquire_light_batch(
        &self,
        requests: &[LightAcquire],
    ) -> Vec<LightAcquired> {
        let not_applied = || requests.iter().map(|_| LightAcquired::NotApplied).collect();
        // One encoding per TTL of the batch (a handful at most).
        let mut updates: Vec<(i64, RawArrayBuf)> = Vec::new();
        let mut statements = RawArrayBuf::new();
        for request in requests {
            let ttl = ttl_ms(request.ttl);
            let update = match updates.iter().find(|(t, _)| *t == ttl) {
                Some((_, update)) => update.clone(),
                None => {
                    let Ok(update) = encode_pipeline(light_acquire_update(self.owner(), ttl))
                    else {
                        return not_applied();
                    };
                    updates.push((ttl, update.clone()));
                    update
                }
            };
            let Ok(filter) = raw_upsert_filter(&request.key) else {
                return not_applied();
            };
            statements.push(rawdoc! {
                "q": filter,
                "u": update,
                "c": raw_lets(&[(LID, request.lease_id)]),
                "upsert": true,
            });
        }
        let sent = Instant::now();
        let command = update_statements(self.coll().name(), statements, false);
        if self.plain_command(command).await.is_err() {
            return not_applied();
        }
        let keys: Vec<&str> = requests.iter().filter_map(|r| r.key.as_str()).collect();
        let projection = doc! {
            field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::EXPIRES_AT: 1,
            "now": "$$NOW",
        };
        let elapsed_ms = elapsed_before_find(sent, Instant::now());
        let Some(docs) = self.read_keys(&keys, projection).await else {
            return not_applied();
        };
        requests
            .iter()
            .map(|request| {
                let doc = request.key.as_str().and_then(|k| docs.get(k));
                match doc.and_then(|d| fresh_token(d, request, self.owner(), elapsed_ms)) {
                    Some(token) => LightAcquired::Acquired(token),
                    None => LightAcquired::NotApplied,
                }
            })
            .collect()
    }

    /// The light releases of `leases` (of distinct string keys) in one
    /// `update`, and one `find` unless all applied (see the module docs);
    /// one answer each, in order.
    pub(in crate::store::mongo) async fn release_light_batch(
        &self,
        leases: &[LeaseRef],
    ) -> Vec<LightRelease> {
        let all = |outcome: fn() -> LightRelease| leases.iter().map(|_| outcome()).collect();
        let Ok(update) = encode_pipeline(light_release_update(self.owner())) else {
            return all(|| LightRelease::NotApplied);
        };
        let mut statements = RawArrayBuf::new();
        for lease in leases {
            let Ok(filter) = raw_key_filter(&lease.key) else {
                return all(|| LightRelease::NotApplied);
            };
            statements.push(rawdoc! {
                "q": filter,
                "u": update.clone(),
                "c": raw_lets(&[(LID, lease.lease_id)]),
            });
        }
        let command = update_statements(self.coll().name(), statements, false);
        // After an error, not known to have released: the general release
        // decides, and reports a lease it no longer finds lost (module docs).
        let Ok(reply) = self.plain_command(command).await else {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn the_acquires_bound_counts_only_the_time_before_the_finds_send() {
        let sent = Instant::now();
        let ms = std::time::Duration::from_millis;
        assert_eq!(elapsed_before_find(sent, sent + ms(7)), 8);
        assert_eq!(
            elapsed_before_find(sent, sent + ms(7) + std::time::Duration::from_micros(900)),
            8
        );
        assert_eq!(elapsed_before_find(sent, sent), 1);
    }

    #[test]
    fn a_batched_acquire_counts_only_a_lease_that_lasts_its_ttl_from_the_send() {
        let lease_id = Uuid::new_v4();
        let request = LightAcquire {
            key: "k".into(),
            lease_id,
            ttl: std::time::Duration::from_secs(10),
        };
        let now = mongodb::bson::DateTime::from_millis(1_000_000);
        let doc = |owner: &str, id: Uuid, left_ms: i64| {
            doc! {
                field::OWNER: owner, field::LEASE_ID: bson_lease_id(id), field::TOKEN: 9_i64,
                field::EXPIRES_AT: mongodb::bson::DateTime::from_millis(1_000_000 + left_ms),
                "now": now,
            }
        };
        // 5 ms passed since the send: at least 9 995 ms must be left.
        assert_eq!(
            fresh_token(&doc("a", lease_id, 9_995), &request, "a", 5),
            Some(9)
        );
        assert_eq!(
            fresh_token(&doc("a", lease_id, 9_994), &request, "a", 5),
            None
        );
        assert_eq!(
            fresh_token(&doc("b", lease_id, 10_000), &request, "a", 5),
            None
        );
        let other = Uuid::new_v4();
        assert_eq!(
            fresh_token(&doc("a", other, 10_000), &request, "a", 5),
            None
        );
    }
}
