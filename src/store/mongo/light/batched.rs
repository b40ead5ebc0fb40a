//! The light acquire and release of many keys in one command: what the
//! actor's group commit asks for when writes queued behind one in flight.
//! A batch of one is the light form's own command, unchanged.
//!
//! * **Acquire**: one `update` of one upsert statement per key (the light
//!   acquire's update, its lease id a per-statement constant `c`), not
//!   ordered, then one `find` of the keys. The update command returns no
//!   documents, so the `find` reads each key's holder, token and expiry,
//!   with the server's `$$NOW`, and the shared decision
//!   (`store::light_acquire`, which the in-memory twin makes too) tells
//!   from them and the local time from the update's send to the `find`'s
//!   send which keys count as acquired. Any other key, and every key after
//!   an error, is left to the general form, which decides (and recognises
//!   a landed earlier attempt as a retry).
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
use super::super::rules::{bson_lease_id, read_lease_id};
use super::{Form, LID, encoded_update, raw_key_filter, raw_lets, raw_upsert_filter};
use crate::store::light_acquire::{Found, acquired, elapsed_before_find};
use crate::store::light_release::{
    LightAcquire, LightAcquired, LightRelease, Read, release_outcomes,
};
use crate::store::{LeaseRef, field};

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
                    let Ok(update) = encoded_update(Form::Acquire, self.owner(), ttl) else {
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
                acquired(doc.and_then(found), request, self.owner(), elapsed_ms)
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
        let Ok(update) = encoded_update(Form::Release, self.owner(), 0) else {
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
