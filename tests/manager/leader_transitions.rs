//! Leader transitions on a real `mongod` (`LeaderInfo::transitions`,
//! `LeaseInfo::transitions`; "Leader transitions" in the lock protocol):
//! managers in several processes (each with its own client) lead in turn,
//! through every write that makes a new holder, and the count grows by one
//! exactly when leadership goes to another owner id.

use crate::common;

use std::time::Duration;

use common::Fixture;
use mongo_lease::{Election, LeaseManager, ReleaseOutcome};

const TTL: Duration = Duration::from_secs(30);
/// A hang guard only: each step takes milliseconds.
const LIMIT: Duration = Duration::from_secs(60);

async fn transitions(election: &Election) -> u64 {
    let leader = election.leader().await.unwrap().expect("a leader");
    leader.transitions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transitions_count_each_change_of_leader_and_only_those() {
    let fx = Fixture::new("leader_transitions").await;
    let managers: Vec<LeaseManager> = fx.managers(3, TTL).await;
    let [a, b, c]: [Election; 3] = managers
        .iter()
        .map(|m| Election::new(m, "e").unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();

    // The first leader (a new document): 0. Leading again: no transition.
    let lead = a.campaign().await.unwrap();
    assert_eq!(transitions(&a).await, 0);
    assert_eq!(lead.resign().await.unwrap(), ReleaseOutcome::Released);
    let lead = a.campaign().await.unwrap();
    assert_eq!(transitions(&a).await, 0, "the same owner again");

    assert_eq!(lead.resign().await.unwrap(), ReleaseOutcome::Released);

    // Another owner takes the free key: 1.
    let lead = b.campaign().await.unwrap();
    assert_eq!(transitions(&b).await, 1);

    // Handed over to a registered owner in the releasing write: 2.
    let handed = {
        let c = c.clone();
        tokio::spawn(async move { c.campaign().await.unwrap() })
    };
    common::eventually("c registered", LIMIT, || async {
        let info = managers[0].inspect("e").await.unwrap().unwrap();
        info.waiters
            .iter()
            .any(|w| w.owner_id == managers[2].owner_id())
    })
    .await;
    assert_eq!(lead.resign().await.unwrap(), ReleaseOutcome::Released);
    let lead = common::within(LIMIT, "the handoff", handed).await.unwrap();
    let leader = c.leader().await.unwrap().unwrap();
    assert_eq!(
        (leader.owner_id.as_str(), leader.transitions),
        (managers[2].owner_id(), 2)
    );

    // Taken over after its holder stopped renewing: 3.
    let taken = fx.take_over("e", &managers[0]).await;
    assert_eq!(transitions(&a).await, 3);
    drop(lead);
    let observed = a.observe().await.unwrap().recv().await.unwrap().unwrap();
    assert_eq!(observed.map(|l| l.transitions), Some(3), "as observed");

    // Every kind counts: a shared holder of another owner, then the first again.
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    let held = managers[1].acquire("e").shared().await.unwrap();
    let info = managers[1].inspect("e").await.unwrap().unwrap();
    assert_eq!(info.transitions, 4);
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    let lead = a.campaign().await.unwrap();
    assert_eq!(transitions(&a).await, 5);
    assert_eq!(lead.resign().await.unwrap(), ReleaseOutcome::Released);
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}
