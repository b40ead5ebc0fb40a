//! The waiting owners of a key on a real `mongod` (`LeaseInfo::waiters`):
//! managers in several processes (each with its own client) that wait for
//! a key are shown by `inspect`, `list` and `observe` in the order they
//! will be served, with their kinds; a handoff removes the one served; an
//! exclusive waiter on a shared key shows by its mark; an election lists
//! its leader and waiting candidates.

use crate::common;

use std::time::Duration;

use common::Fixture;
use mongo_lease::{Election, Lease, LeaseInfo, LeaseKind, LeaseManager, ReleaseOutcome};
use tokio::task::JoinHandle;

/// A hang guard only: each step takes milliseconds.
const LIMIT: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(30);

fn owners(info: &LeaseInfo) -> Vec<String> {
    info.waiters.iter().map(|w| w.owner_id.clone()).collect()
}

/// Waits until `inspect` of `key` shows `expected` waiting, in order, and
/// returns that read.
async fn waiters_are(reader: &LeaseManager, key: &str, expected: &[&str]) -> LeaseInfo {
    let start = tokio::time::Instant::now();
    loop {
        let info = reader.inspect(key).await.unwrap().expect("a lock document");
        if owners(&info) == expected {
            return info;
        }
        assert!(
            start.elapsed() < LIMIT,
            "waiters {:?}, expected {expected:?}",
            owners(&info)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn acquire(manager: &LeaseManager, key: &str) -> JoinHandle<Lease> {
    let (manager, key) = (manager.clone(), key.to_string());
    tokio::spawn(async move { manager.acquire(key).await.unwrap() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_observe_show_the_waiting_owners_in_order() {
    let fx = Fixture::new("waiters_order").await;
    let [holder, first, second, trier]: [LeaseManager; 4] =
        fx.managers(4, TTL).await.try_into().unwrap();
    let (a, b) = (first.owner_id(), second.owner_id());
    let lease = holder.acquire("k").await.unwrap();
    let mut observer = holder.observe("k").await.unwrap();
    let initial = observer.recv().await.unwrap().unwrap().unwrap();
    assert!(initial.waiters.is_empty(), "{initial:?}");

    let first_wait = acquire(&first, "k");
    waiters_are(&holder, "k", &[a]).await;
    let second_wait = acquire(&second, "k");
    let info = waiters_are(&holder, "k", &[a, b]).await;
    // A try_acquire neither waits nor registers.
    assert!(trier.try_acquire("k").await.unwrap().is_none());
    let info_after_try = holder.inspect("k").await.unwrap().unwrap();
    assert_eq!(owners(&info_after_try), [a, b]);

    for w in &info.waiters {
        assert_eq!(w.kind, LeaseKind::Exclusive);
        assert!(w.expires_at > info.server_time, "{w:?} at {info:?}");
        assert!(w.registered_at.unwrap() <= info.server_time, "{w:?}");
    }
    assert!(info.waiters[0].registered_at <= info.waiters[1].registered_at);
    let listed = holder.list().await.unwrap();
    let listed = listed.iter().find(|l| l.key == "k").unwrap();
    assert_eq!(owners(listed), [a, b]);
    assert!(listed.held && listed.owner_id == holder.owner_id());

    // The observer sees the queue as it grows (each state from a change event).
    let seen = common::within(LIMIT, "an observed state with both waiters", async {
        loop {
            let state = observer.recv().await.unwrap().unwrap().unwrap();
            if owners(&state) == [a, b] {
                return state;
            }
        }
    })
    .await;
    assert_eq!(seen.owner_id, holder.owner_id());

    // Each release hands the key to the head of the queue, which leaves it.
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let lease = common::within(LIMIT, "the first waiter's lease", first_wait)
        .await
        .unwrap();
    let info = waiters_are(&holder, "k", &[b]).await;
    assert_eq!(info.owner_id, a, "served first");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let lease = common::within(LIMIT, "the second waiter's lease", second_wait)
        .await
        .unwrap();
    let info = waiters_are(&holder, "k", &[]).await;
    assert_eq!(info.owner_id, b);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    drop(observer);
    for manager in [holder, first, second, trier] {
        manager.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_waiter_on_a_shared_key_is_shown_by_its_mark() {
    let fx = Fixture::new("waiters_mark").await;
    let [reader, writer]: [LeaseManager; 2] = fx.managers(2, TTL).await.try_into().unwrap();
    let read_lease = reader.acquire("s").shared().await.unwrap();
    let waiting = acquire(&writer, "s");
    let info = waiters_are(&reader, "s", &[writer.owner_id()]).await;
    let mark = &info.waiters[0];
    assert_eq!(mark.kind, LeaseKind::Exclusive);
    assert_eq!(mark.registered_at, None, "a mark has no place in a queue");
    assert!(mark.expires_at > info.server_time);
    assert_eq!(info.kind, LeaseKind::Shared);
    assert_eq!(
        read_lease.release().await.unwrap(),
        ReleaseOutcome::Released
    );
    let lease = common::within(LIMIT, "the exclusive lease", waiting)
        .await
        .unwrap();
    waiters_are(&reader, "s", &[]).await;
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    reader.shutdown().await.unwrap();
    writer.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_lists_its_leader_and_waiting_candidates() {
    let fx = Fixture::new("waiters_election").await;
    let managers = fx.managers(3, TTL).await;
    let elections: Vec<Election> = managers
        .iter()
        .map(|m| Election::new(m, "scheduler").unwrap())
        .collect();
    let none = elections[0].candidates().await.unwrap();
    assert!(none.leader.is_none() && none.waiting.is_empty(), "{none:?}");
    let leadership = elections[0].campaign().await.unwrap();
    let mut campaigns = Vec::new();
    for (n, election) in elections.iter().enumerate().skip(1) {
        let election = election.clone();
        campaigns.push(tokio::spawn(async move { election.campaign().await }));
        let expected: Vec<&str> = managers[1..=n].iter().map(|m| m.owner_id()).collect();
        waiters_are(&managers[0], "scheduler", &expected).await;
    }
    let candidates = elections[2].candidates().await.unwrap();
    let leader = candidates.leader.expect("a leader");
    assert_eq!(leader.owner_id, managers[0].owner_id());
    let waiting: Vec<&str> = candidates
        .waiting
        .iter()
        .map(|w| w.owner_id.as_str())
        .collect();
    assert_eq!(waiting, [managers[1].owner_id(), managers[2].owner_id()]);

    assert_eq!(leadership.resign().await.unwrap(), ReleaseOutcome::Released);
    let next = common::within(LIMIT, "the next leader", campaigns.remove(0))
        .await
        .unwrap()
        .unwrap();
    let candidates = elections[0].candidates().await.unwrap();
    assert_eq!(
        candidates.leader.map(|l| l.owner_id),
        Some(managers[1].owner_id().to_string())
    );
    let waiting: Vec<String> = candidates.waiting.into_iter().map(|w| w.owner_id).collect();
    assert_eq!(waiting, [managers[2].owner_id()]);
    assert_eq!(next.resign().await.unwrap(), ReleaseOutcome::Released);
    let last = common::within(LIMIT, "the last leader", campaigns.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(last.resign().await.unwrap(), ReleaseOutcome::Released);
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}
