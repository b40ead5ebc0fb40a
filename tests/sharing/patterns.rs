//! The lock patterns of other applications with an expiry of their own,
//! each client played by its exact commands (`common::others`):
//! `{_id, ts, aid}` with a TTL index on `ts` (pattern 1), npm
//! `distributed-locks-mongodb`'s `{_id, value, ttl, obtained_at}` (pattern
//! 2), and the C# `{_id, ExpireAt}` with a TTL index on `ExpireAt`
//! (pattern 3). With default options, `connect` joins a collection that
//! holds their locks, a live one is respected and shown with its owner and
//! expiry, and one expired by its own rule is taken over by the acquiring
//! write; a data document is still refused.

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{Error, LeaseManager};
use mongodb::bson::{Bson, doc};
use tokio_util::time::FutureExt as _;

use crate::common::Fixture;
use crate::common::others::{
    bytes, pattern1_indexes, pattern1_lock, pattern2_lock, pattern2_unlock, pattern3_index,
    pattern3_lock, pattern3_unlock, stored_bytes,
};

/// A liveness bound: only turns a hang into a failure.
const WAIT: Duration = Duration::from_secs(60);

/// Milliseconds since the epoch of a server time.
fn ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_joins_a_collection_of_each_patterns_live_locks_and_respects_them() {
    let fx = Fixture::new("patterns_join").await;
    pattern1_indexes(&fx, Duration::from_secs(30)).await;
    pattern3_index(&fx).await;
    let p1 = pattern1_lock(&fx, "p1", "java-app-1", Duration::ZERO).await;
    assert!(pattern2_lock(&fx, "p2", "node-7", 600).await);
    assert!(pattern3_lock(&fx, "p3", Duration::from_secs(60)).await);
    let p2 = fx.doc("p2").await;
    let p3 = fx.doc("p3").await;

    // Default options (TTL 30 s: the `ts` index of 30 s is accepted).
    let options = fx.options(mongo_lease::DEFAULT_TTL).await;
    let m = LeaseManager::connect(options)
        .await
        .expect("joins the collection");
    for key in ["p1", "p2", "p3"] {
        assert!(m.try_acquire(key).await.unwrap().is_none(), "{key} is held");
    }
    for (key, written) in [("p1", &p1), ("p2", &p2), ("p3", &p3)] {
        assert_eq!(
            stored_bytes(&fx, key).await,
            bytes(written),
            "{key} untouched"
        );
    }
    // Each client still finds its own lock held.
    assert!(!pattern2_lock(&fx, "p2", "node-8", 600).await);
    assert!(!pattern3_lock(&fx, "p3", Duration::from_secs(60)).await);

    // Owners and expiries by each pattern's rule.
    let page = m.list().await.unwrap();
    let seen: Vec<_> = page
        .iter()
        .map(|i| {
            (
                i.key.as_str().unwrap().to_string(),
                i.owner_id.clone(),
                i.held,
                i.foreign,
            )
        })
        .collect();
    let row = |k: &str, o: &str| (k.to_string(), o.to_string(), true, true);
    assert_eq!(
        seen,
        [row("p1", "java-app-1"), row("p2", "node-7"), row("p3", "")]
    );
    let at = |d: &mongodb::bson::Document, f: &str| d.get_datetime(f).unwrap().timestamp_millis();
    let info = |key: &str| {
        page.iter()
            .find(|i| i.key.as_str() == Some(key))
            .unwrap()
            .clone()
    };
    assert_eq!(ms(info("p1").expires_at), at(&p1, "ts") + 30_000);
    assert_eq!(ms(info("p1").acquired_at), at(&p1, "ts"));
    assert_eq!(
        ms(info("p2").expires_at),
        at(&p2, "obtained_at") + 600_000 + 1
    );
    assert_eq!(ms(info("p3").expires_at), at(&p3, "ExpireAt"));
    let inspected = m.inspect("p2").await.unwrap().expect("p2");
    assert_eq!(
        (inspected.owner_id.as_str(), inspected.foreign),
        ("node-7", true)
    );
    assert!(inspected.time_to_expiry() > Duration::from_secs(500));

    // Released by their clients: free for us.
    assert!(pattern2_unlock(&fx, "p2", "node-7").await);
    pattern3_unlock(&fx, "p3").await;
    let l2 = m.try_acquire("p2").await.unwrap().expect("p2 is free");
    let l3 = m.try_acquire("p3").await.unwrap().expect("p3 is free");
    assert!(!l2.release().await.unwrap().was_lost());
    assert!(!l3.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_document_beside_the_patterns_locks_is_refused_naming_it() {
    let fx = Fixture::new("patterns_data").await;
    pattern1_lock(&fx, "p1", "java-app-1", Duration::ZERO).await;
    assert!(pattern2_lock(&fx, "p2", "node-7", 600).await);
    assert!(pattern3_lock(&fx, "p3", Duration::from_secs(60)).await);
    fx.raw()
        .insert_one(doc! { "_id": "invoice-9", "amount": 3 })
        .await
        .unwrap();
    let refused = LeaseManager::connect(fx.options(mongo_lease::DEFAULT_TTL).await).await;
    let Err(Error::UnusableCollection { reason }) = refused else {
        panic!("expected UnusableCollection, got {refused:?}");
    };
    assert!(
        reason.contains("\"invoice-9\""),
        "names the document: {reason}"
    );
    assert!(reason.contains("not a lock document"), "{reason}");
    assert_eq!(
        fx.raw().count_documents(doc! {}).await.unwrap(),
        4,
        "nothing lost"
    );
}

/// A manager whose waiters back off up to an hour: a waiter gets a key
/// held by a foreign lock soon after that lock expires by its own rule
/// only because its attempts were answered with the time left (the delay
/// is capped by it), and the acquisition is its write after the expiry.
async fn waiter(fx: &Fixture) -> LeaseManager {
    let mut options = fx.options(Duration::from_secs(3)).await;
    options.retry_initial = Duration::from_millis(100);
    options.retry_max = Duration::from_secs(3600);
    LeaseManager::connect(options).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_2s_lock_is_taken_over_once_past_obtained_at_plus_ttl() {
    let fx = Fixture::new("pattern2_expiry").await;
    let m = waiter(&fx).await;
    assert!(pattern2_lock(&fx, "job", "node-7", 2).await);
    let lock = fx.doc("job").await;
    let expiry = lock.get_datetime("obtained_at").unwrap().timestamp_millis() + 2_000;

    let lease = m
        .acquire("job")
        .into_future()
        .timeout(WAIT)
        .await
        .expect("in time")
        .unwrap();
    let info = m.inspect("job").await.unwrap().expect("our lease");
    assert!(!info.foreign && info.held);
    // Strictly after `obtained_at + ttl`, as its clients judge.
    assert!(ms(info.acquired_at) > expiry, "{info:?} vs {expiry}");
    // The token rule from no `tok`: the acquisition's server millisecond.
    assert_eq!((lease.fencing_token() >> 20) as i64, ms(info.acquired_at));
    // Its clients' guarded takeover matched the old `value` and
    // `obtained_at`: that document is gone.
    // Ours now, restated for its clients: `obtained_at` is our `ts`.
    let stored = fx.doc("job").await;
    assert!(stored.get("value").is_none(), "{stored:?}");
    assert_eq!(stored.get("obtained_at"), stored.get("ts"), "{stored:?}");
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_3s_lock_is_taken_over_at_its_expire_at() {
    let fx = Fixture::new("pattern3_expiry").await;
    pattern3_index(&fx).await;
    let m = waiter(&fx).await;
    assert!(pattern3_lock(&fx, "job", Duration::from_secs(2)).await);
    let expiry = fx
        .doc("job")
        .await
        .get_datetime("ExpireAt")
        .unwrap()
        .timestamp_millis();

    let lease = m
        .acquire("job")
        .into_future()
        .timeout(WAIT)
        .await
        .expect("in time")
        .unwrap();
    let info = m.inspect("job").await.unwrap().expect("our lease");
    assert!(!info.foreign && info.held);
    assert!(ms(info.acquired_at) >= expiry, "{info:?} vs {expiry}");
    assert_eq!((lease.fencing_token() >> 20) as i64, ms(info.acquired_at));
    // Its client finds the key held now.
    assert!(!pattern3_lock(&fx, "job", Duration::from_secs(60)).await);
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_1s_lock_is_held_until_ts_plus_its_ttl_index_then_taken_over() {
    let fx = Fixture::new("pattern1_expiry").await;
    // An index the manager accepts with its TTL of 3 s (heartbeat 1 s,
    // margin 0.3 s), long enough that the TTL monitor, which runs every
    // 60 s, is unlikely to delete the locks first (a delete frees the key
    // too, and would not fail the test).
    pattern1_indexes(&fx, Duration::from_secs(20)).await;
    let m = waiter(&fx).await;
    let live = pattern1_lock(&fx, "live", "java-app-1", Duration::from_secs(5)).await;
    let old = pattern1_lock(&fx, "old", "java-app-2", Duration::from_secs(25)).await;

    assert!(m.try_acquire("live").await.unwrap().is_none());
    assert_eq!(stored_bytes(&fx, "live").await, bytes(&live));
    let info = m.inspect("live").await.unwrap().expect("the live lock");
    let ts = live.get_datetime("ts").unwrap().timestamp_millis();
    assert_eq!(
        (info.owner_id.as_str(), ms(info.expires_at)),
        ("java-app-1", ts + 20_000)
    );

    let lease = m
        .try_acquire("old")
        .await
        .unwrap()
        .expect("expired by its rule");
    let info = m.inspect("old").await.unwrap().expect("our lease");
    assert!(!info.foreign && info.owner_id == m.owner_id());
    let old_ts = old.get_datetime("ts").unwrap().timestamp_millis();
    assert!(ms(info.acquired_at) >= old_ts + 20_000);
    assert_eq!((lease.fencing_token() >> 20) as i64, ms(info.acquired_at));
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_shows_a_pattern_2_lock_with_its_owner_and_expiry_then_free_at_its_expiry() {
    use futures::StreamExt;
    let fx = Fixture::new("pattern2_observe").await;
    let m = waiter(&fx).await;
    assert!(pattern2_lock(&fx, "job", "node-7", 2).await);
    let obtained_at = fx
        .doc("job")
        .await
        .get_datetime("obtained_at")
        .unwrap()
        .timestamp_millis();

    let mut observer = m.observe("job").await.unwrap();
    let first = observer
        .next()
        .timeout(WAIT)
        .await
        .expect("in time")
        .expect("a state");
    let first = first.unwrap().expect("the lock");
    assert!(first.foreign && first.held, "{first:?}");
    assert_eq!(first.owner_id, "node-7");
    assert_eq!(ms(first.expires_at), obtained_at + 2_001);
    // Nothing writes at its expiry: the observer reads the key again then.
    let expired = observer
        .next()
        .timeout(WAIT)
        .await
        .expect("in time")
        .expect("a state");
    let expired = expired.unwrap().expect("the lock, expired");
    assert!(expired.foreign && !expired.held, "{expired:?}");
    assert!(
        ms(expired.server_time) >= obtained_at + 2_001,
        "{expired:?}"
    );
    assert_eq!(expired.time_to_expiry(), Duration::ZERO);
    drop(observer);
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_rule_makes_its_schema_a_foreign_lock_and_a_bad_rule_is_refused() {
    use mongo_lease::ForeignLockRule;
    let fx = Fixture::new("patterns_user_rule").await;
    // Another application's `{_id, holder, until}`: one live, one expired.
    let now = mongodb::bson::DateTime::now().timestamp_millis();
    let date = mongodb::bson::DateTime::from_millis;
    let live = doc! { "_id": "live", "holder": "batch-1", "until": date(now + 600_000) };
    fx.raw().insert_one(live.clone()).await.unwrap();
    fx.raw()
        .insert_one(doc! { "_id": "old", "holder": "batch-0", "until": date(now - 1_000) })
        .await
        .unwrap();
    // Without the rule: not a lock document.
    let refused = LeaseManager::connect(fx.options(mongo_lease::DEFAULT_TTL).await).await;
    assert!(
        matches!(refused, Err(Error::UnusableCollection { .. })),
        "{refused:?}"
    );

    let rule = |owner: Bson| {
        ForeignLockRule::builder()
            .held(doc! { "$lt": ["$$NOW", "$until"] })
            .owner(owner)
            .expires_at("$until")
            .build()
    };
    // An expression the server cannot parse: refused before anything is
    // written, naming the rule's field.
    let mut options = fx.options(mongo_lease::DEFAULT_TTL).await;
    options.foreign_lock = Some(rule(doc! { "$nosuch": "$holder" }.into()));
    let bad = LeaseManager::connect(options).await;
    let Err(Error::InvalidConfig { reason }) = bad else {
        panic!("expected InvalidConfig, got {bad:?}");
    };
    assert!(
        reason.starts_with("foreign_lock.owner: ") && reason.contains("$nosuch"),
        "{reason}"
    );
    let indexes: Vec<_> = fx.raw().list_index_names().await.unwrap();
    assert_eq!(indexes, ["_id_"], "nothing written");

    let mut options = fx.options(mongo_lease::DEFAULT_TTL).await;
    options.foreign_lock = Some(rule("$holder".into()));
    let m = LeaseManager::connect(options)
        .await
        .expect("joins with the rule");
    assert!(m.try_acquire("live").await.unwrap().is_none());
    assert_eq!(stored_bytes(&fx, "live").await, bytes(&live));
    let info = m.inspect("live").await.unwrap().expect("the live lock");
    assert_eq!((info.owner_id.as_str(), info.foreign), ("batch-1", true));
    assert_eq!(ms(info.expires_at), now + 600_000);
    let lease = m
        .try_acquire("old")
        .await
        .unwrap()
        .expect("expired by the rule");
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

/// Patterns 2 and 3 release by a delete (`{_id, value}`, `{_id}`): a
/// waiter is woken by it (the change stream) and takes the key long before
/// their lock would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_the_key_when_pattern_2s_or_3s_client_releases_it() {
    let fx = Fixture::new("patterns_release").await;
    pattern3_index(&fx).await;
    let m = fx.manager(mongo_lease::DEFAULT_TTL).await;
    assert!(pattern2_lock(&fx, "p2", "node-7", 3_600).await);
    assert!(pattern3_lock(&fx, "p3", Duration::from_secs(3_600)).await);
    for key in ["p2", "p3"] {
        let waiter = tokio::spawn({
            let m = m.clone();
            async move { m.acquire(key).await }
        });
        // The waiter has tried and found it held.
        crate::common::eventually("the waiter waits", WAIT, || async {
            m.inspect(key).await.unwrap().is_some_and(|i| i.foreign) && !waiter.is_finished()
        })
        .await;
        if key == "p2" {
            assert!(pattern2_unlock(&fx, "p2", "node-7").await);
        } else {
            pattern3_unlock(&fx, "p3").await;
        }
        let lease = waiter
            .timeout(WAIT)
            .await
            .expect("in time")
            .unwrap()
            .unwrap();
        assert!(!lease.release().await.unwrap().was_lost());
    }
    m.shutdown().await.unwrap();
}
