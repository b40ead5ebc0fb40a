//! Semaphores across managers: the bound on holders, fencing tokens, a
//! crashed holder's permits, another number of permits, `available`.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_lease::{LeaseKind, ReleaseOutcome, Semaphore};
use tokio_util::time::FutureExt as _;

use crate::common::Fixture;
use crate::support::{LIVENESS, assert_mismatch, stored_holders, without_renewals};

const TTL: Duration = Duration::from_secs(10);

/// What the tasks holding a permit record: who is inside now, and the
/// tokens of every acquisition so far.
#[derive(Default)]
struct Room {
    /// `(task, fencing token)` of each task inside (between its acquire's
    /// return and its release: a subset of the key's holders at any time).
    inside: Vec<(String, u64)>,
    /// The most tasks inside at once.
    most: usize,
    /// Every acquisition's token, in the order the tasks recorded them.
    tokens: Vec<u64>,
}

/// 3 managers (as 3 processes) × 4 tasks, 3 rounds each, on one key of 2
/// permits: never more than 2 tasks inside, every task gets its permits,
/// and a permit's token is greater than every token of an acquisition that
/// had returned before this one was asked for (the key's tokens follow the
/// order of its acquisitions); all tokens distinct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_two_of_twelve_tasks_hold_a_two_permit_key_and_every_task_gets_its_permits() {
    const MANAGERS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 3;
    /// How long a task stays inside: contention only, no verdict rests on it.
    const HOLD: Duration = Duration::from_millis(15);
    let fx = Fixture::new("sem_bound").await;
    let room: Arc<Mutex<Room>> = Arc::default();
    let managers = fx.managers(MANAGERS, TTL).await;
    let mut tasks = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for t in 0..TASKS {
            let pool = Semaphore::new(manager, "pool", 2).unwrap();
            let room = room.clone();
            tasks.push(tokio::spawn(async move {
                let me = format!("{m}/{t}");
                for _ in 0..ROUNDS {
                    // Every token recorded so far belongs to an acquisition
                    // that returned before this one is asked for.
                    let before = room.lock().unwrap().tokens.iter().copied().max();
                    let permit = pool.acquire().await.unwrap();
                    let token = permit.fencing_token();
                    assert_eq!(permit.kind(), LeaseKind::Permit { permits: 2 });
                    {
                        let mut room = room.lock().unwrap();
                        assert!(
                            room.inside.len() < 2,
                            "{me} got a permit (token {token}) while {:?} held both",
                            room.inside
                        );
                        if let Some(before) = before {
                            assert!(
                                token > before,
                                "{me}'s token {token} is not greater than {before}, \
                                 of an acquisition that returned before {me} asked"
                            );
                        }
                        room.inside.push((me.clone(), token));
                        room.most = room.most.max(room.inside.len());
                        room.tokens.push(token);
                    }
                    tokio::time::sleep(HOLD).await;
                    assert!(!permit.status().is_lost(), "{me}'s permit was lost");
                    // Out of the room while still holding: the room never
                    // counts a task whose permit is already free.
                    room.lock().unwrap().inside.retain(|(who, _)| *who != me);
                    assert_eq!(permit.release().await.unwrap(), ReleaseOutcome::Released);
                }
            }));
        }
    }
    for task in tasks {
        tokio::time::timeout(LIVENESS, task)
            .await
            .expect("a task did not get its permits")
            .unwrap();
    }
    let room = std::mem::take(&mut *room.lock().unwrap());
    assert_eq!(
        room.tokens.len(),
        MANAGERS * TASKS * ROUNDS,
        "every permit was granted"
    );
    let mut distinct = room.tokens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        room.tokens.len(),
        "a fencing token was issued twice"
    );
    eprintln!("at most {} tasks inside at once", room.most);
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}

/// Permits of one key are held at once by different managers, up to the
/// number of permits; `available` counts the free ones by the server's
/// clock, and each holder shows in `inspect` with its own token.
#[tokio::test]
async fn permits_are_held_at_once_by_several_managers_and_available_counts_the_free_ones() {
    let fx = Fixture::new("sem_available").await;
    let (a, b, c) = (
        fx.manager(TTL).await,
        fx.manager(TTL).await,
        fx.manager(TTL).await,
    );
    let pools = [&a, &b, &c].map(|m| Semaphore::new(m, "pool", 3).unwrap());
    assert_eq!(pools[0].available().await.unwrap(), 3, "no document yet");
    let mut permits = Vec::new();
    for (i, pool) in pools.iter().enumerate() {
        let permit = pool.try_acquire().await.unwrap().expect("a free permit");
        assert_eq!(permit.kind(), LeaseKind::Permit { permits: 3 });
        permits.push(permit);
        assert_eq!(pool.available().await.unwrap(), 2 - i as u32);
    }
    assert!(
        permits.iter().all(|p| !p.status().is_lost()),
        "all three held at once"
    );
    let info = a
        .inspect("pool")
        .await
        .unwrap()
        .expect("the key's document");
    assert!(info.held);
    assert_eq!(info.kind, LeaseKind::Permit { permits: 3 });
    let holders: Vec<_> = info
        .holders
        .iter()
        .map(|h| (h.owner_id.as_str(), h.fencing_token))
        .collect();
    let granted: Vec<_> = [&a, &b, &c]
        .iter()
        .zip(&permits)
        .map(|(m, p)| (m.owner_id(), p.fencing_token()))
        .collect();
    assert_eq!(
        holders, granted,
        "the holders, oldest first, with their tokens"
    );
    assert!(
        granted.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens follow the acquisitions: {granted:?}"
    );
    // Full: a fourth permit is refused, in any manager.
    assert!(pools[0].try_acquire().await.unwrap().is_none());
    assert!(pools[2].try_acquire().await.unwrap().is_none());
    let second = permits.remove(1);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(pools[1].available().await.unwrap(), 1);
    let long = pools[2].acquire().ttl(Duration::from_secs(60));
    let again = tokio::time::timeout(LIVENESS, long)
        .await
        .expect("the released permit")
        .unwrap();
    assert_eq!(again.ttl(), Duration::from_secs(60));
    assert_eq!(again.kind(), LeaseKind::Permit { permits: 3 });
    assert!(again.fencing_token() > granted[2].1);
    assert_eq!(pools[0].available().await.unwrap(), 0);
    // Full again: a waiting acquire times out (the bound is no verdict on
    // speed; its last attempt may still be in flight, hence last).
    assert!(
        pools[1]
            .acquire()
            .into_future()
            .timeout(Duration::from_millis(300))
            .await
            .ok()
            .transpose()
            .unwrap()
            .is_none()
    );
    drop(permits);
    drop(again);
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}

/// A process that dies holding both permits of a key: each comes back once
/// it has expired by the server's clock (the survivor's acquisitions
/// happened, by the server's `$$NOW`, after the crashed entries' expiry),
/// without waiting for the TTL monitor, and with greater tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permits_come_back_after_their_ttl_by_the_servers_clock() {
    const TTL: Duration = Duration::from_secs(2);
    let fx = Fixture::new("sem_crash").await;
    let (crashed_owner, crashed_tokens) = fx.crashed_process(TTL, async |manager| {
        let pool = Semaphore::new(&manager, "pool", 2).unwrap();
        let first = pool.acquire().await.unwrap();
        let second = pool.acquire().await.unwrap();
        let out = (
            manager.owner_id().to_owned(),
            [first.fencing_token(), second.fencing_token()],
        );
        std::mem::forget(first);
        std::mem::forget(second);
        std::mem::forget(manager);
        out
    });
    // As the crashed process left it (nobody renews its entries any more).
    let crashed = stored_holders(&fx.doc("pool").await);
    assert_eq!(crashed.len(), 2);
    assert!(crashed.iter().all(|h| h.owner == crashed_owner));
    let stored_tokens: Vec<_> = crashed.iter().map(|h| h.token).collect();
    assert_eq!(
        stored_tokens, crashed_tokens,
        "the crashed holders, oldest first"
    );
    let mut crashed_expiries: Vec<_> = crashed.iter().map(|h| h.expires_at).collect();
    crashed_expiries.sort();

    let survivor = fx.manager(TTL).await;
    let pool = Semaphore::new(&survivor, "pool", 2).unwrap();
    let first = tokio::time::timeout(LIVENESS, pool.acquire())
        .await
        .expect("the first permit never came back")
        .unwrap();
    let second = tokio::time::timeout(LIVENESS, pool.acquire())
        .await
        .expect("the second permit never came back")
        .unwrap();
    let max_crashed = *crashed_tokens.iter().max().unwrap();
    assert!(first.fencing_token() > max_crashed);
    assert!(second.fencing_token() > first.fencing_token());
    let info = survivor.inspect("pool").await.unwrap().unwrap();
    let acquired = |token: u64| {
        info.holders
            .iter()
            .find(|h| h.fencing_token == token)
            .unwrap_or_else(|| panic!("no holder with token {token}: {:?}", info.holders))
            .acquired_at
    };
    // The i-th permit taken needs i + 1 crashed entries gone: with one
    // crashed entry still live, the key was full.
    for (i, token) in [first.fencing_token(), second.fencing_token()]
        .into_iter()
        .enumerate()
    {
        let taken = acquired(token);
        assert!(
            taken >= crashed_expiries[i],
            "permit {i} taken at {taken:?} by the server's clock, before the crashed \
             entry expired at {:?}",
            crashed_expiries[i]
        );
    }
    assert!(
        info.holders
            .iter()
            .all(|h| h.owner_id == survivor.owner_id()),
        "the crashed entries are gone: {:?}",
        info.holders
    );
    assert_eq!(pool.available().await.unwrap(), 0);
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(pool.available().await.unwrap(), 2);
    survivor.shutdown().await.unwrap();
}

/// While permits of a 2-permit key are held, another manager asking for 3
/// permits, a shared lease or an exclusive lease gets
/// `KindMismatch` at once (no waiting), and nothing is written; once every
/// permit is free, the key takes 3 permits.
#[tokio::test]
async fn asking_another_kind_while_permits_are_held_is_a_kind_mismatch_that_writes_nothing() {
    let fx = Fixture::new("sem_mismatch").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let two = LeaseKind::Permit { permits: 2 };
    let three_kind = LeaseKind::Permit { permits: 3 };
    let permit = Semaphore::new(&a, "pool", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let stored = without_renewals(&fx.doc("pool").await);

    let three = Semaphore::new(&b, "pool", 3).unwrap();
    assert_mismatch(three.try_acquire().await, two, three_kind);
    let waited = tokio::time::timeout(LIVENESS, three.acquire())
        .await
        .expect("acquire waited instead of failing");
    assert_mismatch(waited, two, three_kind);
    assert_mismatch(three.available().await, two, three_kind);
    assert_mismatch(b.try_acquire("pool").shared().await, two, LeaseKind::Shared);
    assert_mismatch(b.try_acquire("pool").await, two, LeaseKind::Exclusive);
    assert_eq!(
        without_renewals(&fx.doc("pool").await),
        stored,
        "a refused acquisition wrote to the key"
    );
    assert!(!permit.status().is_lost());

    assert_eq!(permit.release().await.unwrap(), ReleaseOutcome::Released);
    let three_permits = three.try_acquire().await.unwrap().expect("a free key");
    assert_eq!(three_permits.kind(), three_kind);
    let info = b.inspect("pool").await.unwrap().unwrap();
    assert_eq!(info.kind, three_kind, "the key now stores 3 permits");
    assert_eq!(three.available().await.unwrap(), 2);
    drop(three_permits);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The manager that holds permits of a key refuses another number of
/// permits, a shared lease or an exclusive lease on it at once too (its
/// permits are live in the store), like any other manager, without a
/// round trip; its waiters for the same number go on.
#[tokio::test]
async fn asking_another_kind_in_the_manager_that_holds_the_permits_is_a_kind_mismatch_too() {
    let fx = Fixture::new("sem_local_mismatch").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let a = mongo_lease::LeaseManager::connect(options).await.unwrap();
    let two = LeaseKind::Permit { permits: 2 };
    let pool = Semaphore::new(&a, "pool", 2).unwrap();
    let permit = pool.acquire().await.unwrap();
    let attempts = log.count("findAndModify");
    let three = Semaphore::new(&a, "pool", 3).unwrap();
    let waited = tokio::time::timeout(LIVENESS, three.acquire())
        .await
        .expect("acquire waited instead of failing");
    assert_mismatch(waited, two, LeaseKind::Permit { permits: 3 });
    assert_mismatch(
        three.try_acquire().await,
        two,
        LeaseKind::Permit { permits: 3 },
    );
    assert_mismatch(a.try_acquire("pool").shared().await, two, LeaseKind::Shared);
    let exclusive = tokio::time::timeout(LIVENESS, a.acquire("pool"))
        .await
        .expect("acquire waited instead of failing");
    assert_mismatch(exclusive, two, LeaseKind::Exclusive);
    assert_eq!(
        log.count("findAndModify"),
        attempts,
        "refused without a round trip"
    );
    let second = pool
        .try_acquire()
        .await
        .unwrap()
        .expect("the second permit");
    assert!(!permit.status().is_lost() && !second.status().is_lost());
    drop((permit, second));
    a.shutdown().await.unwrap();
}
