//! Heartbeat renewal, lost-lease signals and durability settings against a real mongod.

use crate::common;

use std::time::Duration;

use common::{Fixture, eventually};
use mongo_lease::{LeaseManager, ReleaseOutcome};
use mongodb::bson::{Document, doc};

const TTL: Duration = Duration::from_secs(2);

#[tokio::test]
async fn heartbeat_keeps_leases_alive_past_their_ttl_with_batched_renewals() {
    let fx = Fixture::new("heartbeat").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..40 {
        leases.push(manager.acquire(format!("k{i}")).await.unwrap());
    }
    let first_ts = fx.doc("k0").await;
    let first_ts = first_ts.get_datetime("ts").unwrap().timestamp_millis();
    log.clear();

    // Hold for three TTLs: without renewal every lease would expire.
    let held_for = TTL * 3;
    let lost = futures::future::select_all(leases.iter().map(|l| Box::pin(l.status().lost())));
    assert!(
        tokio::time::timeout(held_for, lost).await.is_err(),
        "no lease may be lost"
    );

    let renewals: Vec<Document> = log
        .all()
        .into_iter()
        .filter(|(name, cmd)| name == "update" && cmd.get_str("update") == Ok("workitem.lock"))
        .map(|(_, cmd)| cmd)
        .collect();
    let ticks = held_for.as_millis() / (TTL / 3).as_millis();
    assert!(
        renewals.len() as u128 <= ticks + 1 && renewals.len() >= 3,
        "one renewal command per tick for 40 leases, got {} in {ticks} ticks",
        renewals.len()
    );
    for cmd in &renewals {
        let updates = cmd.get_array("updates").unwrap();
        assert_eq!(updates.len(), 1);
        let update = updates[0].as_document().unwrap();
        assert_eq!(
            update.get_bool("multi"),
            Ok(true),
            "renewal is one updateMany"
        );
    }
    let doc = fx.doc("k0").await;
    assert!(
        doc.get_datetime("ts").unwrap().timestamp_millis() > first_ts,
        "ts advanced"
    );
    for lease in leases {
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
    manager.shutdown().await.unwrap();
}

#[tokio::test]
async fn token_fires_when_a_renewal_finds_the_lease_taken() {
    let fx = Fixture::new("lost_taken").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let lease = a.acquire("k").await.unwrap();
    // Another owner takes the key (as after an operator's forced release).
    let taker = fx.take_over("k", &b).await;
    assert!(
        !lease.status().is_lost(),
        "not signalled before the next renewal"
    );
    // The next heartbeat comes within TTL / 3; the rest of TTL is slack for
    // the renewal's round trip (milliseconds here), over 10x that.
    tokio::time::timeout(TTL, lease.status().lost())
        .await
        .expect("signalled at the next heartbeat");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    // The stale release did not touch the new holder's lease.
    assert!(!taker.status().is_lost());
    let doc = fx.doc("k").await;
    assert_eq!(doc.get_str("aid").unwrap(), b.owner_id());
    assert!(doc.get("lid").is_some());
    assert_eq!(taker.release().await.unwrap(), ReleaseOutcome::Released);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn writes_use_majority_and_reads_majority_whatever_the_client_defaults() {
    let fx = Fixture::new("durability").await;
    let (options, log) = fx
        .monitored_options(
            TTL,
            "w=1&readConcernLevel=local&readPreference=secondaryPreferred",
        )
        .await;
    let manager = LeaseManager::connect(options).await.unwrap();
    let lease = manager.acquire("k").await.unwrap();
    let renewals = log.clone();
    eventually("a heartbeat renewal is sent", TTL * 2, || {
        let n = renewals.count("update");
        async move { n >= 1 }
    })
    .await;
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
    let mut writes = 0;
    for (name, cmd) in log.all() {
        match name.as_str() {
            "findAndModify" | "update" => {
                writes += 1;
                let wc = cmd
                    .get_document("writeConcern")
                    .unwrap_or_else(|_| panic!("{name} without writeConcern: {cmd}"));
                assert_eq!(wc.get_str("w"), Ok("majority"), "{name}: {cmd}");
            }
            "find" => {
                let rc = cmd.get_document("readConcern").unwrap();
                assert_eq!(rc.get_str("level"), Ok("majority"), "{cmd}");
            }
            _ => {}
        }
    }
    assert!(
        writes >= 3,
        "acquire, renewal and release were seen ({writes})"
    );
}

/// `release_all` releases the leases the manager holds, by lease id; one
/// left by an earlier process with the same owner id is not among them (a
/// release by owner id that landed late would end leases acquired since):
/// an operator's release by owner id ends it.
#[tokio::test]
async fn release_all_releases_every_lease_the_manager_holds_and_no_other() {
    let fx = Fixture::new("release_all").await;
    let options = fx.options(TTL).await;
    let mut options = options;
    options.owner_id = Some("worker-7".into());
    let a = LeaseManager::connect(options).await.unwrap();
    let leases = [a.acquire("x").await.unwrap(), a.acquire("y").await.unwrap()];
    // A lease left by an earlier process with the same owner id.
    let (_, future) = (
        0,
        mongodb::bson::DateTime::from_millis(
            mongodb::bson::DateTime::now().timestamp_millis() + 60_000,
        ),
    );
    fx.raw()
        .insert_one(doc! { "_id": "z", "aid": "worker-7", "lid": mongodb::bson::Uuid::new(), "tok": 5_i64, "ts": mongodb::bson::DateTime::now(), "exp": future })
        .await
        .unwrap();
    assert_eq!(a.release_all().await.unwrap(), 2);
    assert!(
        leases.iter().all(|l| l.status().is_lost()),
        "local tokens cancelled"
    );
    let b = fx.manager(TTL).await;
    for key in ["x", "y"] {
        assert!(b.try_acquire(key).await.unwrap().is_some(), "{key} is free");
    }
    assert!(
        b.try_acquire("z").await.unwrap().is_none(),
        "z is still held"
    );
    // An operator with no lock-delay, who knows the earlier process is gone.
    let mut options = fx.options(TTL).await;
    options.lock_delay = Some(std::time::Duration::ZERO);
    let operator = LeaseManager::connect(options).await.unwrap();
    let ended = operator.release_owner("worker-7").immediately().await;
    assert_eq!(ended.unwrap(), 1);
    assert!(b.try_acquire("z").await.unwrap().is_some(), "z is free");
    operator.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn dropping_every_handle_stops_the_manager_and_releases() {
    let fx = Fixture::new("drop_all").await;
    let manager = fx.manager(TTL).await;
    let lease = manager.acquire("k").await.unwrap();
    let token = lease.status().cancellation_token();
    drop(manager);
    assert!(
        !token.is_cancelled(),
        "a live lease keeps the manager running"
    );
    drop(lease);
    let raw = fx.raw();
    eventually(
        "the dropped lease is released",
        Duration::from_secs(10),
        || {
            let raw = raw.clone();
            async move {
                raw.find_one(doc! { "_id": "k" })
                    .await
                    .unwrap()
                    .unwrap()
                    .get("lid")
                    .is_none()
            }
        },
    )
    .await;
    assert!(token.is_cancelled());
}
