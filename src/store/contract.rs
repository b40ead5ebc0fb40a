//! The store contract: one suite of scenarios over the [`Store`] trait, each
//! run against [`MemoryStore`] (`store::contract::memory::*`) and against
//! [`MongoStore`] on a real `mongod` from the test kit
//! (`store::contract::mongo::*`), so that the twin the actor's timing tests
//! rely on follows the rules the real store follows.
//!
//! A scenario only uses the trait, plus a [`Fixture`] for what only a test
//! can do: make a lease expire on the server, delete a document as the TTL
//! monitor would, plant a document of foreign shape, read the raw state.
//! Each MongoDB test gets a fresh collection on the process's shared replica
//! set (`MONGODB_URI` if set).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::{Bson, Document, doc};
use tokio::time::Instant;
use uuid::Uuid;

use super::memory::{MemoryDb, MemoryStore};
use super::{AcquireOutcome, LeaseRef, MongoStore, Store};
use crate::error::Error;

/// Lease TTL of every store in the scenarios: far longer than a scenario.
const TTL: Duration = Duration::from_secs(30);
/// Yield window of every store in the scenarios.
const YIELD: Duration = Duration::from_secs(20);

/// The state of one lock document, as stored, judged at the server's now.
#[derive(Debug, Clone, PartialEq)]
struct Raw {
    /// `aid`.
    owner: String,
    /// `lid`; `None` once released.
    lease_id: Option<Uuid>,
    /// `tok`.
    token: u64,
    /// `exp <= now`.
    expired: bool,
    /// `wt` is set.
    waiting: bool,
    /// `yu` is set and later than now.
    yielded: bool,
    /// `data`.
    payload: Option<Document>,
}

/// What a scenario needs besides the [`Store`] trait: a fresh lock
/// collection, stores (managers) on it, and the test-only operations.
trait Fixture: Sized {
    type Store: Store + Clone;

    /// A fresh, empty lock collection.
    async fn new() -> Self;

    /// A store on this collection for the owner id `owner` (TTL [`TTL`],
    /// yield window [`YIELD`]).
    async fn store(&self, owner: &str) -> Self::Store;

    /// Makes the lease on `key` expired by server time, keeping its lease id
    /// (a holder whose renewals stopped reaching the server).
    async fn expire(&self, key: &str);

    /// Deletes the document of `key` as the TTL monitor would: only once its
    /// `exp` has passed (expire or release it first), hence after every
    /// earlier acquisition's server time.
    async fn delete(&self, key: &str);

    /// Writes a document of foreign shape under `key`.
    async fn put_foreign(&self, key: &str);

    /// The document of `key`, if any.
    async fn raw(&self, key: &str) -> Option<Raw>;
}

// ----- the twin ---------------------------------------------------------------

struct MemoryFixture {
    db: MemoryDb,
}

impl Fixture for MemoryFixture {
    type Store = MemoryStore;

    async fn new() -> Self {
        MemoryFixture {
            db: MemoryDb::new(),
        }
    }

    async fn store(&self, owner: &str) -> MemoryStore {
        self.db.store(owner, TTL).with_yield_window(YIELD)
    }

    async fn expire(&self, key: &str) {
        self.db.expire(key);
    }

    async fn delete(&self, key: &str) {
        let doc = self.db.doc(key).expect("a document to delete");
        assert!(doc.is_free_at(Instant::now()), "deleting a live lease");
        self.db.delete(key);
    }

    async fn put_foreign(&self, key: &str) {
        self.db.put_foreign(key);
    }

    async fn raw(&self, key: &str) -> Option<Raw> {
        let now = Instant::now();
        self.db.doc(key).map(|d| Raw {
            expired: d.is_free_at(now),
            yielded: d.yield_until.is_some_and(|until| until > now),
            waiting: d.waiting_since.is_some(),
            owner: d.owner,
            lease_id: d.lease_id,
            token: d.token,
            payload: d.payload,
        })
    }
}

// ----- MongoDB ----------------------------------------------------------------

struct MongoFixture {
    db: mongodb::Database,
    collection: String,
}

impl MongoFixture {
    fn raw_collection(&self) -> mongodb::Collection<Document> {
        self.db.collection(&self.collection)
    }
}

impl Fixture for MongoFixture {
    type Store = MongoStore;

    async fn new() -> Self {
        let client = mongodb::Client::with_uri_str(crate::testkit::shared_uri())
            .await
            .expect("a client of the test deployment");
        let fixture = MongoFixture {
            db: client.database("mongo_lease_contract"),
            collection: crate::testkit::unique_name("c"),
        };
        // Indexes as a manager creates them; a long grace keeps the TTL
        // monitor away from the scenario's documents.
        fixture
            .store("prepare")
            .await
            .prepare(Duration::from_secs(3600))
            .await
            .expect("prepare the lock collection");
        fixture
    }

    async fn store(&self, owner: &str) -> MongoStore {
        MongoStore::new(
            &self.db,
            &self.collection,
            owner.to_string(),
            TTL,
            YIELD,
            Duration::from_secs(30),
        )
    }

    async fn expire(&self, key: &str) {
        // `exp = min(exp, $$NOW)`: expired, but not so long ago that the TTL
        // monitor (grace: one hour) would delete the document meanwhile.
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key },
                vec![doc! { "$set": { "exp": { "$min": ["$exp", "$$NOW"] } } }],
            )
            .await
            .expect("expire the lease");
        assert_eq!(result.matched_count, 1, "no document to expire");
    }

    async fn delete(&self, key: &str) {
        // Strictly after `exp` and the last write's `ts` by the server's
        // clock, as the TTL monitor (which deletes after `exp` + grace). The
        // condition holds within a millisecond; the bound is a liveness one.
        let due = doc! {
            "_id": key,
            "$expr": { "$gt": ["$$NOW", { "$max": ["$exp", "$ts"] }] },
        };
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let result = self
                .raw_collection()
                .delete_one(due.clone())
                .await
                .expect("delete the document");
            if result.deleted_count == 1 {
                return;
            }
            assert!(
                self.raw(key).await.is_some(),
                "no document {key:?} to delete"
            );
            assert!(Instant::now() < give_up, "{key:?} never became due");
            tokio::task::yield_now().await;
        }
    }

    async fn put_foreign(&self, key: &str) {
        self.raw_collection()
            .insert_one(doc! { "_id": key, "owner": "someone else", "until": 12 })
            .await
            .expect("insert a foreign document");
    }

    async fn raw(&self, key: &str) -> Option<Raw> {
        let doc = self
            .raw_collection()
            .find_one(doc! { "_id": key })
            .projection(doc! {
                "aid": 1, "lid": 1, "tok": 1, "exp": 1, "wt": 1, "yu": 1, "data": 1,
                "now": "$$NOW",
            })
            .await
            .expect("read the document")?;
        let now = doc.get_datetime("now").expect("now");
        let date = |name: &str| doc.get_datetime(name).ok();
        Some(Raw {
            owner: doc.get_str("aid").expect("aid").to_string(),
            lease_id: match doc.get("lid") {
                Some(Bson::Binary(b)) => Some(Uuid::from_slice(&b.bytes).expect("a UUID")),
                None => None,
                Some(other) => panic!("lid {other}"),
            },
            token: doc.get_i64("tok").expect("tok") as u64,
            expired: date("exp").expect("exp") <= now,
            waiting: doc.contains_key("wt"),
            yielded: date("yu").is_some_and(|until| until > now),
            payload: doc.get_document("data").ok().cloned(),
        })
    }
}

// ----- helpers ----------------------------------------------------------------

fn lease(key: &str, lease_id: Uuid) -> LeaseRef {
    LeaseRef {
        key: key.to_string(),
        lease_id,
    }
}

/// Acquires `key` under a new lease id, which must succeed; returns the
/// lease and its token.
async fn take(store: &impl Store, key: &str) -> (LeaseRef, u64) {
    let lease_id = Uuid::new_v4();
    match store.acquire(key.to_string(), lease_id, false).await {
        Ok(AcquireOutcome::Acquired { token }) => (lease(key, lease_id), token),
        other => panic!("acquiring {key:?}: {other:?}"),
    }
}

/// Acquires `key` under a new lease id, which must find it held by `holder`;
/// returns the remaining time reported.
async fn held(store: &impl Store, key: &str, waiting: bool, holder: &str) -> Duration {
    match store
        .acquire(key.to_string(), Uuid::new_v4(), waiting)
        .await
    {
        Ok(AcquireOutcome::Held {
            holder: h,
            remaining,
        }) if h == holder => remaining,
        other => panic!("acquiring {key:?} held by {holder:?}: {other:?}"),
    }
}

/// The document of `key`, which must exist.
async fn raw(f: &impl Fixture, key: &str) -> Raw {
    f.raw(key)
        .await
        .unwrap_or_else(|| panic!("no document for {key:?}"))
}

/// Asserts that `raw` is a live lease of `owner` under `lease`, unmarked.
fn assert_held(raw: &Raw, owner: &str, lease: &LeaseRef, token: u64) {
    assert_eq!(
        raw,
        &Raw {
            owner: owner.to_string(),
            lease_id: Some(lease.lease_id),
            token,
            expired: false,
            waiting: false,
            yielded: false,
            payload: raw.payload.clone(),
        }
    );
}

// ----- scenarios --------------------------------------------------------------

async fn acquire_free_key_takes_it<F: Fixture>() {
    let f = F::new().await;
    let a = f.store("a").await;
    let (l, token) = take(&a, "k").await;
    assert!(token > 0);
    assert_held(&raw(&f, "k").await, "a", &l, token);
    let info = a.inspect("k".into()).await.unwrap().expect("a lease");
    assert!(info.held);
    assert_eq!((info.owner_id.as_str(), info.fencing_token), ("a", token));
    assert!(info.expires_at > info.server_time);
    assert!(info.time_to_expiry() <= TTL);

    // A retry under the same lease id (an ambiguous first attempt) is
    // recognised: the same acquisition, the same token.
    let retry = a.acquire("k".into(), l.lease_id, false).await.unwrap();
    assert_eq!(retry, AcquireOutcome::Acquired { token });
    assert_held(&raw(&f, "k").await, "a", &l, token);
}

async fn acquire_held_key_returns_held<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l, token) = take(&b, "k").await;
    let before = raw(&f, "k").await;

    // Not waiting (`try_acquire`): nothing is written.
    let remaining = held(&a, "k", false, "b").await;
    assert!(remaining <= TTL && remaining > TTL / 2, "{remaining:?}");
    assert_eq!(raw(&f, "k").await, before);

    // Waiting: the holder's lease is marked, and nothing else changes.
    held(&a, "k", true, "b").await;
    held(&a, "k", true, "b").await;
    let marked = raw(&f, "k").await;
    assert_eq!(
        marked,
        Raw {
            waiting: true,
            ..before.clone()
        }
    );
    assert_eq!((marked.lease_id, marked.token), (Some(l.lease_id), token));

    // The holder's own new attempt (another lease id) is held too, unmarked.
    held(&b, "k", true, "b").await;
    assert_eq!(raw(&f, "k").await, marked);
    assert!(b.renew(vec![l]).await.unwrap().is_empty());
}

async fn acquire_expired_key_takes_it_with_a_greater_token<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (lb, tb) = take(&b, "k").await;
    f.expire("k").await;
    let (la, ta) = take(&a, "k").await;
    assert!(ta > tb, "{ta} > {tb}");
    assert_held(&raw(&f, "k").await, "a", &la, ta);
    assert_eq!(b.renew(vec![lb.clone()]).await.unwrap(), ["k"]);
    assert_eq!(b.release(vec![lb]).await.unwrap(), 0);
    assert_held(&raw(&f, "k").await, "a", &la, ta);
}

async fn acquire_yielded_key_is_refused_to_the_yielding_owner_only<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take(&a, "k").await;
    held(&b, "k", true, "a").await;
    assert_eq!(a.release(vec![la]).await.unwrap(), 1);
    let released = raw(&f, "k").await;
    assert_eq!(
        released,
        Raw {
            owner: "a".into(),
            lease_id: None,
            token: ta,
            expired: true,
            waiting: false,
            yielded: true,
            payload: None,
        }
    );

    // The releasing owner waits out the yield window, and marks nothing.
    let remaining = held(&a, "k", true, "a").await;
    assert!(remaining <= YIELD && remaining > YIELD / 2, "{remaining:?}");
    assert_eq!(raw(&f, "k").await, released);

    // Anyone else takes it at once; the new acquisition has no marks.
    let (lb, tb) = take(&b, "k").await;
    assert!(tb > ta);
    assert_held(&raw(&f, "k").await, "b", &lb, tb);
}

async fn release_of_an_unmarked_lease_does_not_yield<F: Fixture>() {
    let f = F::new().await;
    let a = f.store("a").await;
    let (l1, t1) = take(&a, "k").await;
    assert_eq!(a.release(vec![l1]).await.unwrap(), 1);
    assert!(!raw(&f, "k").await.yielded);
    let (l2, t2) = take(&a, "k").await;
    assert!(t2 > t1);
    assert_held(&raw(&f, "k").await, "a", &l2, t2);
}

async fn fencing_tokens_strictly_increase_also_after_a_delete<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut tokens = Vec::new();

    // Back to back, many within one millisecond of server time.
    for _ in 0..10 {
        let (l, t) = take(&a, "k").await;
        tokens.push(t);
        assert_eq!(a.release(vec![l]).await.unwrap(), 1);
    }
    // Takeover after expiry.
    let (_, t) = take(&b, "k").await;
    tokens.push(t);
    f.expire("k").await;
    let (la, t) = take(&a, "k").await;
    tokens.push(t);
    // After the document was deleted (released, then garbage-collected).
    assert_eq!(a.release(vec![la]).await.unwrap(), 1);
    f.delete("k").await;
    assert_eq!(f.raw("k").await, None);
    let (_, t) = take(&b, "k").await;
    tokens.push(t);
    // After a lease expired and its document was deleted.
    f.expire("k").await;
    f.delete("k").await;
    let (la, t) = take(&a, "k").await;
    tokens.push(t);
    assert_held(&raw(&f, "k").await, "a", &la, t);

    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens not strictly increasing: {tokens:?}"
    );
}

async fn renewal_reports_exactly_the_lost_keys<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut leases = Vec::new();
    for key in ["k1", "k2", "k3", "k4", "k5"] {
        leases.push(take(&a, key).await);
    }
    // k2: taken over after expiry; k3: expired and deleted; k4: released;
    // k5: expired, not taken (still ours: renewal does not judge expiry).
    f.expire("k2").await;
    let (lb, tb) = take(&b, "k2").await;
    f.expire("k3").await;
    f.delete("k3").await;
    assert_eq!(a.release(vec![leases[3].0.clone()]).await.unwrap(), 1);
    f.expire("k5").await;

    let refs: Vec<LeaseRef> = leases.iter().map(|(l, _)| l.clone()).collect();
    let lost: BTreeSet<String> = a.renew(refs).await.unwrap().into_iter().collect();
    assert_eq!(
        lost,
        BTreeSet::from(["k2".into(), "k3".into(), "k4".into()])
    );

    for i in [0, 4] {
        let (l, t) = &leases[i];
        assert_held(&raw(&f, &l.key).await, "a", l, *t);
    }
    assert_held(&raw(&f, "k2").await, "b", &lb, tb);
    assert_eq!(f.raw("k3").await, None);
    let k4 = raw(&f, "k4").await;
    assert_eq!(
        (k4.lease_id, k4.expired),
        (None, true),
        "a released lease stays released"
    );

    // All kept: nothing lost.
    let kept = vec![leases[0].0.clone(), leases[4].0.clone()];
    assert!(a.renew(kept).await.unwrap().is_empty());
}

async fn release_clears_the_lease_id_and_yields_only_when_marked<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l1, t1) = take(&a, "k1").await;
    let (l2, t2) = take(&a, "k2").await;
    let (l3, t3) = take(&a, "k3").await;
    held(&b, "k2", true, "a").await;

    // A wrong lease id releases nothing (one lease, then a batch).
    let stranger = lease("k3", Uuid::new_v4());
    assert_eq!(a.release(vec![stranger.clone()]).await.unwrap(), 0);
    let wrong = vec![stranger, lease("k1", Uuid::new_v4())];
    assert_eq!(a.release(wrong).await.unwrap(), 0);
    assert_held(&raw(&f, "k3").await, "a", &l3, t3);

    // A batch release: both released; only the marked one yields.
    assert_eq!(a.release(vec![l1.clone(), l2.clone()]).await.unwrap(), 2);
    let released = |token, yielded| Raw {
        owner: "a".into(),
        lease_id: None,
        token,
        expired: true,
        waiting: false,
        yielded,
        payload: None,
    };
    assert_eq!(raw(&f, "k1").await, released(t1, false));
    assert_eq!(raw(&f, "k2").await, released(t2, true));

    // Releasing again matches nothing; a late renewal cannot revive them.
    assert_eq!(a.release(vec![l1.clone(), l2.clone()]).await.unwrap(), 0);
    assert_eq!(a.release(vec![l1.clone()]).await.unwrap(), 0);
    let lost: BTreeSet<String> = a.renew(vec![l1, l2]).await.unwrap().into_iter().collect();
    assert_eq!(lost, BTreeSet::from(["k1".into(), "k2".into()]));
    assert_eq!(raw(&f, "k1").await, released(t1, false));

    // A single release of the right lease.
    assert_eq!(a.release(vec![l3]).await.unwrap(), 1);
    assert_eq!(raw(&f, "k3").await, released(t3, false));
}

async fn release_by_owner_skips_lease_ids_in_flight<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l1, _) = take(&a, "k1").await;
    let (l2, _) = take(&a, "k2").await;
    let (l3, t3) = take(&a, "k3").await;
    let (l4, t4) = take(&b, "k4").await;
    let (l5, _) = take(&a, "k5").await;
    assert_eq!(a.release(vec![l5]).await.unwrap(), 1);

    assert_eq!(a.release_owner(vec![l3.lease_id]).await.unwrap(), 2);
    for l in [&l1, &l2] {
        let r = raw(&f, &l.key).await;
        assert_eq!((r.lease_id, r.expired), (None, true), "{} released", l.key);
    }
    assert_held(&raw(&f, "k3").await, "a", &l3, t3);
    assert_held(&raw(&f, "k4").await, "b", &l4, t4);
    assert_eq!(a.release_owner(vec![l3.lease_id]).await.unwrap(), 0);
    assert_eq!(a.release_owner(Vec::new()).await.unwrap(), 1);
    assert_held(&raw(&f, "k4").await, "b", &l4, t4);
}

async fn payload_is_set_only_under_the_holding_lease_id<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take(&a, "k").await;
    let payload = doc! { "progress": 1, "note": "half way" };
    assert!(a.set_payload(la.clone(), payload.clone()).await.unwrap());
    assert_eq!(raw(&f, "k").await.payload.as_ref(), Some(&payload));
    let info = a.inspect("k".into()).await.unwrap().unwrap();
    assert_eq!(info.payload.as_ref(), Some(&payload));

    // Under a wrong lease id: refused, unchanged.
    let wrong = lease("k", Uuid::new_v4());
    assert!(!a.set_payload(wrong, doc! { "progress": 2 }).await.unwrap());
    assert_eq!(raw(&f, "k").await.payload.as_ref(), Some(&payload));

    // A retry of the acquisition keeps it; a new acquisition drops it.
    let retry = a.acquire("k".into(), la.lease_id, false).await.unwrap();
    assert_eq!(retry, AcquireOutcome::Acquired { token: ta });
    assert_eq!(raw(&f, "k").await.payload.as_ref(), Some(&payload));
    f.expire("k").await;
    let (lb, tb) = take(&b, "k").await;
    assert_eq!(raw(&f, "k").await.payload, None);
    assert!(!a.set_payload(la, doc! { "progress": 3 }).await.unwrap());
    assert_held(&raw(&f, "k").await, "b", &lb, tb);
    assert_eq!(raw(&f, "k").await.payload, None);
}

async fn force_release_releases_a_live_lease_of_any_owner<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (_, tb) = take(&b, "k").await;
    let before = a.force_release("k".into()).await.unwrap().expect("held");
    assert!(before.held);
    assert_eq!((before.owner_id.as_str(), before.fencing_token), ("b", tb));
    let r = raw(&f, "k").await;
    assert_eq!((r.lease_id, r.expired, r.yielded), (None, true, false));
    assert_eq!(a.force_release("k".into()).await.unwrap(), None);
    assert_eq!(a.force_release("nothing".into()).await.unwrap(), None);
    let (_, ta) = take(&a, "k").await;
    assert!(ta > tb);
}

async fn a_document_of_foreign_shape_is_never_taken<F: Fixture>() {
    let f = F::new().await;
    let a = f.store("a").await;
    f.put_foreign("f").await;
    for waiting in [false, true] {
        let err = a
            .acquire("f".into(), Uuid::new_v4(), waiting)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::ForeignDocument { ref key } if key == "f"),
            "{err:?}"
        );
    }
    let err = a.inspect("f".into()).await.unwrap_err();
    assert!(matches!(err, Error::ForeignDocument { .. }), "{err:?}");
    assert_eq!(a.force_release("f".into()).await.unwrap(), None);
    assert_eq!(a.release_owner(Vec::new()).await.unwrap(), 0);
}

async fn list_pages_through_leases_in_key_order<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    take(&a, "k1").await;
    let (l2, _) = take(&b, "k2").await;
    take(&a, "k3").await;
    take(&b, "k4").await;
    f.put_foreign("k5").await;
    assert_eq!(b.release(vec![l2]).await.unwrap(), 1);

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = a.list(after, 2).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.into_iter().map(|i| (i.key, i.owner_id, i.held)));
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let expected = [
        ("k1", "a", true),
        ("k2", "b", false),
        ("k3", "a", true),
        ("k4", "b", true),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(k, o, h)| (k.to_string(), o.to_string(), *h))
        .collect();
    assert_eq!(seen, expected, "foreign documents are skipped");
    assert!(a.inspect("none".into()).await.unwrap().is_none());
}

async fn releases_and_deletes_are_announced_expiries_and_renewals_are_not<F: Fixture>() {
    let f = F::new().await;
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut releases = a.watch_releases();
    // The stream opens in the background: release a probe key until the
    // stream reports it, so that it sees everything below.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let (probe, _) = take(&a, "probe").await;
        assert_eq!(a.release(vec![probe]).await.unwrap(), 1);
        tokio::select! {
            event = releases.next() => match event {
                Some(Ok(key)) if key == "probe" => break,
                other => panic!("before any release: {other:?}"),
            },
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        assert!(
            Instant::now() < give_up,
            "the stream of releases never opened"
        );
    }

    let (l1, _) = take(&a, "k1").await;
    let (l2, _) = take(&a, "k2").await;
    let (l3, _) = take(&b, "k3").await;
    take(&b, "k4").await;
    // Not releases: acquisitions, renewals, waiting marks, expiries.
    assert!(
        a.renew(vec![l1.clone(), l2.clone()])
            .await
            .unwrap()
            .is_empty()
    );
    held(&a, "k4", true, "b").await;
    f.expire("k2").await;
    // Releases: a release, a delete (the TTL monitor), a forced release.
    assert_eq!(a.release(vec![l1]).await.unwrap(), 1);
    f.delete("k2").await;
    assert!(a.force_release("k3".into()).await.unwrap().is_some());
    assert_eq!(b.release(vec![l3]).await.unwrap(), 0);
    let (end, _) = take(&a, "end").await;
    assert_eq!(a.release(vec![end]).await.unwrap(), 1);

    let mut seen = Vec::new();
    while seen.last().is_none_or(|k| k != "end") {
        match releases.next().await {
            Some(Ok(key)) if key == "probe" => {}
            Some(Ok(key)) => seen.push(key),
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    assert_eq!(seen, ["k1", "k2", "k3", "end"]);
}

/// Runs each scenario against both stores: `memory::<scenario>` and
/// `mongo::<scenario>`.
macro_rules! contract {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario::<super::MemoryFixture>().await;
                }
            )*
        }
        mod mongo {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario::<super::MongoFixture>().await;
                }
            )*
        }
    };
}

contract!(
    acquire_free_key_takes_it,
    acquire_held_key_returns_held,
    acquire_expired_key_takes_it_with_a_greater_token,
    acquire_yielded_key_is_refused_to_the_yielding_owner_only,
    release_of_an_unmarked_lease_does_not_yield,
    fencing_tokens_strictly_increase_also_after_a_delete,
    renewal_reports_exactly_the_lost_keys,
    release_clears_the_lease_id_and_yields_only_when_marked,
    release_by_owner_skips_lease_ids_in_flight,
    payload_is_set_only_under_the_holding_lease_id,
    force_release_releases_a_live_lease_of_any_owner,
    a_document_of_foreign_shape_is_never_taken,
    list_pages_through_leases_in_key_order,
    releases_and_deletes_are_announced_expiries_and_renewals_are_not,
);
