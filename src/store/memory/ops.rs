//! `impl Store for MemoryStore`: each operation applies the rules of
//! [`rules`](super::rules) at server time through [`MemoryStore::run`].

use crate::random::HashSet;
use crate::store::replies;
use crate::store::retried::retried;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mongodb::bson::Document;
use uuid::Uuid;

use super::control::Op;
use super::doc::{Doc, Holder, Registration};
use super::kinds;
use super::rules::{Collection, apply_acquire, apply_handoff, lease_matches, release_doc};
use super::store::{MemoryStore, lock_fields_document};
use crate::config::ReleaseMode;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::{LeaseShape, PermitsChange};
use crate::store::{
    AcquireOutcome, AcquireRequest, Announced, Announcement, DocumentWrite, Handoff,
    HandoffOutcome, LeaseRef, LockPlace, OverrideEnd, Release, Released, Store, StoreProfile,
};
use crate::store::{
    light_acquire::{LightAcquire, LightAcquired},
    light_release::{LightForms, LightRelease},
};

impl Store for MemoryStore {
    /// Any kind, with a minimum hold, by the rules of `rules` and `kinds`.
    /// In-document leases: every user document exists unless the test
    /// removed it ([`MemoryDb::remove_user_document`](super::MemoryDb::remove_user_document)):
    /// then an acquisition with `create` creates it (its fields are not
    /// modelled), one without fails with `DocumentNotFound`. An acquisition
    /// there returns `{_id, <field>: {aid, lid, tok}}`.
    fn acquire(
        &self,
        request: AcquireRequest,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>> {
        let AcquireRequest {
            key,
            lease_id,
            waiting,
            ttl,
            shape,
            create,
            payload,
        } = request;
        let refused = self.refuses(shape).or_else(|| {
            crate::store::payload_applies(self.place.is_some(), shape, payload.as_ref()).err()
        });
        if let Some(error) = refused {
            return futures::future::ready(Err(error)).boxed();
        }
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let creates = create.is_some();
        let registration = Registration {
            window: crate::store::registration_window(self.yield_window, self.safety_margin),
            bound: self.queue_bound,
        };
        let apply = Arc::new({
            let (key, owner) = (key.clone(), owner.clone());
            move |coll: &mut Collection, now| {
                if coll.missing.contains(&key) {
                    if !creates {
                        return Err(Error::DocumentNotFound { id: key.clone() });
                    }
                    coll.missing.remove(&key);
                }
                let retry = is_retry(coll, &key, lease_id);
                // `None`: no document (an insert); else whether it had a `lid`.
                let had_lease_id = coll.docs.get(&key).map(|d| d.lease_id.is_some());
                let outcome = apply_acquire(
                    &db,
                    coll,
                    &key,
                    &owner,
                    lease_id,
                    ttl,
                    waiting,
                    shape,
                    now,
                    registration,
                    payload.as_ref(),
                )?;
                // The payload with the acquisition, in the acquiring write
                // (a retry too), as `MongoStore`'s `acquire_pipeline`.
                if let (Some(payload), AcquireOutcome::Acquired { .. }) = (&payload, &outcome)
                    && let Some(doc) = coll.docs.get_mut(&key)
                {
                    doc.payload = Some(payload.clone());
                }
                // A retry under the same lease id sets neither `lid` nor
                // `aid`: no event on MongoDB either.
                if !retry && let AcquireOutcome::Acquired { token } = outcome {
                    db.announce_taken(&key, &owner, (lease_id, token), shape.kind, had_lease_id);
                }
                Ok(outcome)
            }
        });
        let store = self.clone();
        let send = {
            let (store, key) = (self.clone(), key.clone());
            move || {
                let apply = apply.clone();
                store.run(Op::Acquire, vec![key.clone()], move |c, n| apply(c, n))
            }
        };
        async move {
            // In the lock collection, sent once more after a transient
            // error, as `MongoStore` sends it; in a user collection once
            // (`DocumentStore`'s retryable write).
            let (write, sent_again) = match store.place {
                None => replies::sent_again_once(send).await,
                Some(_) => (send().await, false),
            };
            let outcome = match write {
                Ok(outcome) => replies::answered(outcome, sent_again),
                // An unknown outcome (`Fault::Fail`, `FailAfterApply`, a
                // timeout) is resolved by a re-read, as by `MongoStore` and
                // `DocumentStore` (B7).
                Err(error) if error.is_transient() || sent_again => {
                    tracing::debug!(%key, %error, "acquire outcome unknown; re-reading");
                    let reread = store.reread(key.clone(), lease_id, ttl, shape.kind, creates);
                    reread.await?
                }
                Err(error) => return Err(error),
            };
            let document = match (&outcome, &store.place) {
                (AcquireOutcome::Acquired { token }, Some((_, field))) => {
                    Some(lock_fields_document(&key, field, &owner, lease_id, *token))
                }
                _ => None,
            };
            Ok((outcome, document))
        }
        .boxed()
    }

    /// As `MongoStore`'s and `DocumentStore`'s: the registration window
    /// of the yield window (the manager's `retry_max`) and the safety
    /// margin ([`MemoryStore::with_safety_margin`]); the light release in
    /// the lock collection only, the light acquire if
    /// [`MemoryStore::with_light_acquire`].
    fn profile(&self) -> StoreProfile {
        let (collection, field) = match &self.place {
            None => ("locks".into(), None),
            Some((collection, field)) => (collection.clone(), Some(field.clone())),
        };
        StoreProfile {
            place: Arc::new(LockPlace {
                database: "memory".into(),
                collection,
                field,
                lock_id: self.lock_id.as_ref().map(|f| f.lock_id.clone()),
            }),
            light_forms: LightForms {
                acquire: self.light_acquire && self.place.is_none(),
                release: self.place.is_none(),
                handoff: false,
            },
            removes_on_release: self.release_mode == ReleaseMode::Delete,
            registration_window: crate::store::registration_window(
                self.yield_window,
                self.safety_margin,
            ),
            queue_bound: self.queue_bound,
            lock_delay: self.lock_delay,
            lock_id_fields: self.lock_id.clone(),
            #[cfg(test)]
            ttl: self.ttl,
        }
    }

    fn documents(
        &self,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<crate::lock_id_fields::LockIdFields>>,
    ) -> Result<Arc<dyn Store>> {
        if self.place.is_some() {
            return Err(Error::InvalidConfig {
                reason: "in-document leases are opened from the lock collection's store".into(),
            });
        }
        Ok(Arc::new(
            self.document_store_with(collection, field, lock_id),
        ))
    }

    /// Conditional on the lease id and owner id, as on MongoDB; the user's
    /// update is not applied (its semantics are MongoDB's), the release
    /// (`write.release`) is, by the delete-mode rule. Returns
    /// `{_id, <field>: {aid, lid, tok}}` as before the write.
    // As every `run` closure here: `Error` is large (the lint is about it).
    fn write_document(
        &self,
        lease: LeaseRef,
        token: u64,
        write: DocumentWrite,
    ) -> BoxFuture<'static, Result<Option<Document>>> {
        let Some((_, field)) = self.place.clone() else {
            return futures::future::ready(Err(Error::InvalidConfig {
                reason: "not an in-document lease".into(),
            }))
            .boxed();
        };
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        self.run(
            Op::WriteDocument,
            vec![lease.key.clone()],
            move |coll, now| {
                let held = coll
                    .docs
                    .get(&lease.key)
                    .is_some_and(|doc| doc.lease_id == Some(lease.lease_id) && doc.owner == owner);
                if !held {
                    return Ok(None);
                }
                if write.release {
                    let matches = |key: &LeaseKey, _: &Doc| *key == lease.key;
                    coll.release_where(&db, matches, now, yield_window, ReleaseMode::Delete);
                }
                Ok(Some(lock_fields_document(
                    &lease.key,
                    &field,
                    &owner,
                    lease.lease_id,
                    token,
                )))
            },
        )
    }

    fn watch_releases(&self, announced: Announced) -> BoxStream<'static, Result<Announcement>> {
        self.writes(announced)
    }

    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseRef>>> {
        let owner = self.owner.clone();
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        self.run(Op::Renew, keys, move |coll, now| {
            let keys: HashSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
            let ids: HashSet<Uuid> = leases.iter().map(|l| l.lease_id).collect();
            let mut kept = HashSet::default();
            for (key, doc) in coll.docs.iter_mut() {
                if lease_matches(key, doc, &owner, &keys, &ids) {
                    // Never back under one lease id (`renewed_expiry`).
                    doc.exp = doc.floor(doc.exp.max(now + ttl));
                    doc.renewed = now;
                    kept.extend(doc.lease_id.map(|id| (key.clone(), id)));
                } else if keys.contains(key) {
                    let renewed = kinds::renew_holders(doc, &owner, &ids, ttl, now);
                    kept.extend(renewed.into_iter().map(|id| (key.clone(), id)));
                }
            }
            Ok(leases
                .into_iter()
                .filter(|l| !kept.contains(&(l.key.clone(), l.lease_id)))
                .collect())
        })
    }

    /// Each selection by the rules of `rules` and `kinds`, as
    /// `MongoStore`'s: a lease too young to delete is only marked released
    /// (keep mode's release).
    fn release(&self, release: Release) -> BoxFuture<'static, Result<Released>> {
        let count = match release {
            Release::Leases(leases) => self.release_in(leases, self.release_mode),
            Release::LeaseTooYoungToDelete(lease) => {
                self.release_in(vec![lease], ReleaseMode::Keep)
            }
            Release::ReleasedDocuments(keys) => self.delete_released(keys),
            Release::ReleasedDocumentsOf(owner) => {
                // Applied at once, outside the server's schedule.
                let db = self.db.clone();
                let deleted = match self.release_mode {
                    ReleaseMode::Delete => db.apply(|coll, now| {
                        coll.delete_released_where(&db, |_, doc| doc.owner == owner, now)
                    }),
                    ReleaseMode::Keep => 0,
                };
                return futures::future::ready(Ok(Released::count(deleted))).boxed();
            }
            Release::OwnerLeases { owner, end } => return self.release_owner_leases(owner, end),
            Release::ForcedKey { key, end } => {
                let forced = self.force_release(key, end);
                return async move {
                    let was = forced.await?;
                    Ok(Released {
                        count: u64::from(was.is_some()),
                        was,
                        ..Default::default()
                    })
                }
                .boxed();
            }
        };
        async move { Ok(Released::count(count.await?)) }.boxed()
    }

    fn acquire_light(&self, requests: Vec<LightAcquire>) -> BoxFuture<'static, Vec<LightAcquired>> {
        self.clone().light_acquires(requests).boxed()
    }

    fn release_light(
        &self,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    ) -> BoxFuture<'static, Vec<LightRelease>> {
        self.clone().light_releases(leases, hands_over).boxed()
    }

    /// By the rule of `rules`: one form, the general one (the twin has no
    /// light handoff).
    fn handoff(&self, handoff: Handoff) -> BoxFuture<'static, Result<HandoffOutcome>> {
        let Handoff {
            key, from, to, ttl, ..
        } = handoff;
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        self.run(Op::Handoff, vec![key.clone()], move |coll, now| {
            Ok(apply_handoff(
                coll,
                &db,
                &key,
                &owner,
                (from, to),
                ttl,
                yield_window,
                now,
            ))
        })
    }

    fn leave_queues(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        let owner = self.owner.clone();
        self.run(Op::LeaveQueues, keys.clone(), move |coll, now| {
            let mut changed = 0;
            for key in &keys {
                if let Some(doc) = coll.docs.get_mut(key)
                    && doc.queue.iter().any(|w| w.owner == owner)
                {
                    doc.leave_queue(&owner, now);
                    changed += 1;
                }
            }
            Ok(changed)
        })
    }

    fn inspect(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        self.run(Op::Inspect, vec![key.clone()], move |coll, now| {
            if let Some(foreign) = coll.foreign.get(&key) {
                return Ok(Some(db.foreign_info(&key, foreign, now)));
            }
            if let Some(view) = coll.their_lock_at(&db, &key, now) {
                let server_time = db.date(now).to_system_time();
                return Ok(Some(crate::store::lease_info(&key, &view, server_time)));
            }
            Ok(coll.docs.get(&key).map(|doc| db.info(&key, doc, now)))
        })
    }

    fn list(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>> {
        let db = self.db.clone();
        self.run(Op::List, Vec::new(), move |coll, now| {
            let mut keys: Vec<&LeaseKey> = coll
                .docs
                .keys()
                .chain(coll.foreign.keys())
                .filter(|k| after.as_ref().is_none_or(|a| *k > a))
                .collect();
            keys.sort();
            keys.truncate(limit);
            let next = (keys.len() == limit)
                .then(|| keys.last().map(|k| (*k).clone()))
                .flatten();
            let page = keys
                .into_iter()
                .map(|k| match coll.foreign.get(k) {
                    Some(foreign) => db.foreign_info(k, foreign, now),
                    None => db.info(k, &coll.docs[k], now),
                })
                .collect();
            Ok((page, next))
        })
    }

    fn set_permits(
        &self,
        key: LeaseKey,
        permits: u32,
    ) -> BoxFuture<'static, Result<PermitsChange>> {
        let db = self.db.clone();
        if let Err(e) = (LeaseKind::Permit { permits }).validate() {
            return Box::pin(futures::future::ready(Err(e.into())));
        }
        self.run(Op::SetPermits, vec![key.clone()], move |coll, now| {
            let Some(doc) = coll.docs.get_mut(&key) else {
                return Ok(PermitsChange::NothingHeld);
            };
            let requested = LeaseKind::Permit { permits };
            let change = kinds::set_permits(doc, permits, now)
                .map_err(|stored| Error::KindMismatch { stored, requested })?;
            if change == PermitsChange::Set {
                db.announce_release(&key);
            }
            Ok(change)
        })
    }

    fn request_release(&self, key: LeaseKey) -> BoxFuture<'static, Result<bool>> {
        let (db, by) = (self.db.clone(), self.owner.clone());
        self.run(Op::RequestRelease, vec![key.clone()], move |coll, now| {
            // Held now by a lease or holders of our layout (as MongoStore's
            // filter: `lid` or `hs`, `exp > now`).
            let Some(doc) = coll.docs.get_mut(&key) else {
                return Ok(false);
            };
            let held = (doc.lease_id.is_some() || !doc.holders.is_empty()) && doc.exp > now;
            if held {
                doc.revocation = Some((by.clone(), now));
                db.announce_revocation(&key, &by);
            }
            Ok(held)
        })
    }

    fn revocations(
        &self,
        keys: Vec<LeaseKey>,
    ) -> BoxFuture<'static, Result<Vec<(LeaseKey, String)>>> {
        self.run(Op::RequestRelease, keys.clone(), move |coll, _now| {
            Ok(keys
                .iter()
                .filter_map(|key| {
                    let (by, _) = coll.docs.get(key)?.revocation.as_ref()?;
                    Some((key.clone(), by.clone()))
                })
                .collect())
        })
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        let owner = self.owner.clone();
        self.run(
            Op::SetPayload,
            vec![lease.key.clone()],
            move |coll, _now| match coll.docs.get_mut(&lease.key) {
                Some(doc) if doc.lease_id == Some(lease.lease_id) && doc.owner == owner => {
                    doc.payload = Some(payload);
                    Ok(true)
                }
                Some(doc) => Ok(kinds::set_holder_payload(
                    doc,
                    &owner,
                    lease.lease_id,
                    payload,
                )),
                None => Ok(false),
            },
        )
    }

    fn observe(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        self.states(key)
    }
}

impl MemoryStore {
    /// Why an acquisition of `shape` is refused before any write, as by
    /// `MongoStore` and `DocumentStore`.
    fn refuses(&self, shape: LeaseShape) -> Option<Error> {
        if self.place.is_some() {
            return crate::store::document_shape(shape).err();
        }
        shape.kind.validate().err().map(Error::from).or_else(|| {
            (shape.hold_at_least.is_some() && shape.kind != crate::kind::LeaseKind::Exclusive).then(
                || Error::InvalidConfig {
                    reason: format!(
                        "hold_at_least applies to exclusive leases only, not to {} leases",
                        shape.kind
                    ),
                },
            )
        })
    }
}

/// Whether an acquisition under `lease_id` already landed on `key` (a retry:
/// it writes neither `lid` nor `aid`, so MongoDB's change stream shows no
/// event for it either).
fn is_retry(coll: &Collection, key: &LeaseKey, lease_id: Uuid) -> bool {
    coll.docs.get(key).is_some_and(|doc| {
        doc.lease_id == Some(lease_id) || doc.holders.iter().any(|h| h.lease_id == Some(lease_id))
    })
}

impl MemoryStore {
    /// The general release of `leases` in `mode` (one call), by the rules
    /// of `rules` and `kinds`; no call for none (as MongoStore).
    fn release_in(
        &self,
        leases: Vec<LeaseRef>,
        mode: ReleaseMode,
    ) -> BoxFuture<'static, Result<u64>> {
        if leases.is_empty() {
            return futures::future::ready(Ok(0)).boxed();
        }
        // Sent again after a transient failure, as `MongoStore`'s; the first
        // send issued now, as every call of the twin.
        let first = std::sync::Mutex::new(Some(self.release_once(leases.clone(), mode)));
        let store = self.clone();
        async move {
            let send = || {
                let first = first.lock().expect("not poisoned").take();
                first.unwrap_or_else(|| store.release_once(leases.clone(), mode))
            };
            retried("release", send).await
        }
        .boxed()
    }

    /// One send of [`MemoryStore::release_in`]'s write.
    fn release_once(
        &self,
        leases: Vec<LeaseRef>,
        mode: ReleaseMode,
    ) -> BoxFuture<'static, Result<u64>> {
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        self.run(Op::Release, keys, move |coll, now| {
            let keys: HashSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
            let ids: HashSet<Uuid> = leases.iter().map(|l| l.lease_id).collect();
            let matches = |key: &LeaseKey, doc: &Doc| lease_matches(key, doc, &owner, &keys, &ids);
            let (deleted, marked) = coll.release_where(&db, matches, now, yield_window, mode);
            let holders = |key: &LeaseKey, holder: &Holder| {
                keys.contains(key)
                    && holder.lease_id.is_some_and(|id| ids.contains(&id))
                    && holder.owner == owner
            };
            let (removed, _) = coll.release_holders_where(&db, holders, now);
            Ok(deleted + marked + removed)
        })
    }

    /// [`Release::OwnerLeases`].
    fn release_owner_leases(
        &self,
        owner: String,
        end: OverrideEnd,
    ) -> BoxFuture<'static, Result<Released>> {
        let db = self.db.clone();
        let yield_window = self.yield_window;
        let mode = self.release_mode;
        let lock_delay = self.lock_delay;
        let release = self.run(Op::ReleaseOwner, Vec::new(), move |coll, now| {
            coll.delay_owner_ends(&owner, lock_delay, end, now);
            let matches = |_: &LeaseKey, doc: &Doc| doc.owner == owner && doc.lease_id.is_some();
            let released = coll.release_where(&db, matches, now, yield_window, mode);
            // Waiting for the holders, their places stay until their
            // expiry (`Collection::keep_places_of`).
            let holders = match end {
                OverrideEnd::AtExpiry => coll.keep_places_of(&db, &owner, now),
                OverrideEnd::Immediately => {
                    let holders = |_: &LeaseKey, holder: &Holder| holder.owner == owner;
                    coll.release_holders_where(&db, holders, now).1
                }
            };
            Ok((released, holders))
        });
        async move {
            let ((deleted, marked), holders) = release.await?;
            // As `MongoStore`'s: a follow-up once its update changed any
            // document (leases marked released or holders' documents).
            Ok(Released {
                count: deleted + marked + holders,
                follow_up_due: mode == ReleaseMode::Delete && marked + holders > 0,
                ..Default::default()
            })
        }
        .boxed()
    }

    /// [`Release::ReleasedDocuments`].
    fn delete_released(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        if keys.is_empty() || self.release_mode != ReleaseMode::Delete {
            return futures::future::ready(Ok(0)).boxed();
        }
        let db = self.db.clone();
        self.run(Op::Release, keys.clone(), move |coll, now| {
            let keys: HashSet<&LeaseKey> = keys.iter().collect();
            Ok(coll.delete_released_where(&db, |key, _| keys.contains(key), now))
        })
    }

    /// [`Release::ForcedKey`]: the lease as it was, if it was held.
    fn force_release(
        &self,
        key: LeaseKey,
        end: OverrideEnd,
    ) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        let yield_window = self.yield_window;
        let lock_delay = self.lock_delay;
        self.run(Op::ForceRelease, vec![key.clone()], move |coll, now| {
            // A foreign holder's lock is deleted while its rule says it is
            // held, and left as it is once free (as MongoStore's `deleteOne`).
            if let Some(foreign) = coll.foreign.get(&key) {
                let info = db.foreign_info(&key, foreign, now);
                if !info.held {
                    return Ok(None);
                }
                coll.foreign.remove(&key);
                db.announce_release(&key);
                return Ok(Some(info));
            }
            let Some(doc) = coll.docs.get_mut(&key) else {
                return Ok(None);
            };
            // Held by a lease, by holders, or by a minimum hold: freed
            // whole, `hl` included (only a force release frees it earlier);
            // marked immediate, also a key an earlier override left
            // waiting (`nb`).
            let held = doc.live_kind(now).is_some()
                || doc
                    .hold_until
                    .is_some_and(|until| until > now && doc.exp > now);
            let waiting =
                end == OverrideEnd::Immediately && doc.not_before.is_some() && doc.exp > now;
            if !held && !waiting {
                return Ok(None);
            }
            let before = db.info(&key, doc, now);
            if end == OverrideEnd::Immediately {
                doc.not_before = None;
                doc.exp = doc.exp.min(now);
            }
            super::lock_delay::delay(doc, lock_delay, end, now);
            kinds::drop_holders(doc, now);
            release_doc(doc, now, yield_window);
            db.announce_release(&key);
            // A key an earlier override left waiting held nothing.
            Ok(Some(before).filter(|before| before.held))
        })
    }
}
