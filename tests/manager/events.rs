//! A lease's events and loss reasons against a real mongod: each cause of a
//! loss (expired, taken, deleted, force-released by this manager and by
//! another, released, shutdown) gives its reason, readable as soon as
//! `lost()` completes; `is_lost()` reads the local deadline without the
//! manager task; a renewal's `expires_at` bounds the server's `exp`.

use crate::common;

use std::time::{Duration, SystemTime};

use common::Fixture;
use mongo_lease::testkit::FaultProxy;
use mongo_lease::{
    Election, Lease, LeaseEvent, LeaseEvents, LeaseManager, LeaseManagerOptions, LossReason,
};
use mongodb::bson::doc;
use tokio::time::{Instant, timeout};

const TTL: Duration = Duration::from_secs(2);
/// Only turns a hang into a failure: every wait here takes at most a few
/// TTLs.
const HANG: Duration = Duration::from_secs(60);

/// Waits for the lease's token, then reads its reason at once: it is
/// recorded before the token fires.
async fn reason_of(lease: &Lease) -> LossReason {
    timeout(HANG, lease.status().lost())
        .await
        .expect("the lease is lost");
    lease
        .status()
        .lost_reason()
        .expect("the reason is recorded before the token fires")
}

async fn next(events: &mut LeaseEvents) -> LeaseEvent {
    timeout(HANG, events.recv())
        .await
        .expect("an event")
        .expect("an event before the end")
}

/// Reads events up to the loss, checks its reason and that nothing follows.
async fn assert_ends_lost(events: &mut LeaseEvents, reason: LossReason) {
    loop {
        if let LeaseEvent::Lost(lost) = next(events).await {
            assert_eq!(lost, reason);
            break;
        }
    }
    assert_eq!(timeout(HANG, events.recv()).await.unwrap(), None);
}

#[tokio::test]
async fn a_frozen_holder_reads_lost_expired_past_its_deadline_before_its_manager_runs() {
    let fx = Fixture::new("ev_frozen").await;
    let a = fx.manager(TTL).await;
    let lease = a.acquire("job").await.unwrap();
    let deadline = lease.status().deadline().expect("held");
    // This single-threaded runtime also runs the manager task and the
    // driver: the whole "process" is frozen, as in a long GC pause.
    std::thread::sleep(
        deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(50),
    );
    assert!(lease.status().is_lost(), "read without the manager task");
    assert!(
        !lease.status().cancellation_token().is_cancelled(),
        "it has not run"
    );
    assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
    assert_eq!(reason_of(&lease).await, LossReason::Expired);
    a.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_holder_cut_off_from_the_server_is_at_risk_then_lost_expired() {
    let fx = Fixture::new("ev_cut_off").await;
    let hello = fx.db.run_command(doc! { "hello": 1 }).await.unwrap();
    let primary = hello.get_str("primary").expect("a replica set primary");
    let proxy = FaultProxy::start(primary.parse().unwrap()).await.unwrap();
    let clients = common::Clients::default();
    let client = clients
        .connect(&format!(
            "mongodb://{}/?directConnection=true",
            proxy.addr()
        ))
        .await;
    let a = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database(fx.db.name()))
            .collection(fx.collection.clone())
            .ttl(TTL)
            .clock_skew(common::clock_skew(TTL))
            .build(),
    )
    .await
    .unwrap();
    let lease = a.acquire("job").await.unwrap();
    let mut events = lease.status().events();
    proxy.blackhole();
    let at_risk = loop {
        match next(&mut events).await {
            LeaseEvent::AtRisk { deadline, error } => break (deadline, error),
            LeaseEvent::Renewed { .. } => continue,
            other => panic!("expected AtRisk first, got {other:?}"),
        }
    };
    assert!(!at_risk.1.is_empty());
    assert_eq!(
        lease.status().deadline(),
        Some(at_risk.0),
        "still held until then"
    );
    assert_eq!(reason_of(&lease).await, LossReason::Expired);
    assert!(Instant::now() >= at_risk.0, "not before its deadline");
    assert_ends_lost(&mut events, LossReason::Expired).await;
    proxy.heal();
    a.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lease_taken_after_its_expiry_is_lost_taken_with_the_new_owner_id_and_token() {
    let fx = Fixture::new("ev_taken").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let lease = a.acquire("job").await.unwrap();
    let theirs = fx.take_over("job", &b).await;
    assert_eq!(
        reason_of(&lease).await,
        LossReason::Taken {
            owner_id: b.owner_id().to_string(),
            fencing_token: theirs.fencing_token()
        }
    );
    assert!(!theirs.release().await.unwrap().was_lost());
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lease_whose_document_is_deleted_is_lost_deleted() {
    let fx = Fixture::new("ev_deleted").await;
    let a = fx.manager(TTL).await;
    let lease = a.acquire("job").await.unwrap();
    let mut events = lease.status().events();
    fx.raw().delete_one(doc! { "_id": "job" }).await.unwrap();
    assert_eq!(reason_of(&lease).await, LossReason::Deleted);
    assert_ends_lost(&mut events, LossReason::Deleted).await;
    a.shutdown().await.unwrap();
}

#[tokio::test]
async fn force_release_by_this_manager_or_another_is_lost_force_released() {
    let fx = Fixture::new("ev_forced").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let mine = a.acquire("mine").await.unwrap();
    a.force_release("mine").await.unwrap().expect("was held");
    assert_eq!(
        mine.status().lost_reason(),
        Some(LossReason::ForceReleased),
        "known when force_release returns"
    );
    let theirs = a.acquire("theirs").await.unwrap();
    b.force_release("theirs").await.unwrap().expect("was held");
    assert_eq!(reason_of(&theirs).await, LossReason::ForceReleased);
    let by_owner = a.acquire("by-owner").await.unwrap();
    assert_eq!(b.release_owner(a.owner_id()).await.unwrap(), 1);
    assert_eq!(reason_of(&by_owner).await, LossReason::ForceReleased);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_in_document_lease_whose_lock_field_is_removed_is_lost_deleted() {
    let fx = Fixture::new("ev_document").await;
    let a = fx.manager(TTL).await;
    let items = fx.db.collection::<mongodb::bson::Document>("items");
    items
        .insert_one(doc! { "_id": "item", "title": "pump" })
        .await
        .unwrap();
    let leases = a
        .documents::<mongodb::bson::Document>("items")
        .await
        .unwrap();
    let held = leases.acquire("item").await.unwrap();
    items
        .update_one(doc! { "_id": "item" }, doc! { "$unset": { "_lease": "" } })
        .await
        .unwrap();
    assert_eq!(reason_of(held.lease()).await, LossReason::Deleted);
    a.shutdown().await.unwrap();
}

#[tokio::test]
async fn released_and_shut_down_leases_say_so() {
    let fx = Fixture::new("ev_released").await;
    let a = fx.manager(TTL).await;
    let released = a.acquire("released").await.unwrap();
    let mut events = released.status().events();
    assert!(!released.release().await.unwrap().was_lost());
    assert_ends_lost(&mut events, LossReason::Released).await;
    let last = a.acquire("last").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(reason_of(&last).await, LossReason::Shutdown);
}

#[tokio::test]
async fn a_leader_forced_out_reads_why_on_its_leadership_and_context() {
    let fx = Fixture::new("ev_leader").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let election = Election::new(&a, "leader").unwrap();
    let leadership = election.campaign().await.unwrap();
    let context = leadership.context();
    b.force_release("leader").await.unwrap().expect("was held");
    timeout(HANG, context.status().lost()).await.unwrap();
    assert_eq!(
        context.status().lost_reason(),
        Some(LossReason::ForceReleased)
    );
    assert_eq!(
        leadership.status().lost_reason(),
        Some(LossReason::ForceReleased)
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_renewal_s_expires_at_is_a_lower_bound_of_the_server_s_expiry() {
    let fx = Fixture::new("ev_expiry").await;
    let a = fx.manager(TTL).await;
    let started = Instant::now();
    let lease = a.acquire("job").await.unwrap();
    let mut events = lease.status().events();
    let (expires_at, deadline) = loop {
        if let LeaseEvent::Renewed {
            expires_at,
            deadline,
        } = next(&mut events).await
        {
            break (expires_at, deadline);
        }
    };
    assert_eq!(lease.status().deadline(), Some(deadline));
    let info = a.inspect("job").await.unwrap().expect("held");
    let elapsed = started.elapsed();
    // B3: `$$NOW` may step back a few milliseconds between writes.
    let steps = Duration::from_millis(50);
    assert!(
        expires_at <= info.expires_at + steps,
        "{expires_at:?} after the server's {:?}",
        info.expires_at
    );
    let short = info
        .expires_at
        .duration_since(expires_at)
        .unwrap_or_default();
    assert!(
        short <= elapsed + Duration::from_millis(1),
        "short by {short:?}, more than the {elapsed:?} since the acquire began"
    );
    eprintln!(
        "expires_at short of the server's exp by {short:?} ({elapsed:?} since the acquire began)"
    );
    assert!(expires_at > SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000));
    assert!(!lease.release().await.unwrap().was_lost());
    a.shutdown().await.unwrap();
}
