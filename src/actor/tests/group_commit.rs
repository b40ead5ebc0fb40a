//! The light forms' group commit and the memory of contended keys
//! (`actor::group_commit`), over the twin's light release.

use super::*;

/// Acquires `k0` to `k{n - 1}`, then releases them all at once while each
/// release call takes 100 ms: checks every lease released, and returns the
/// release calls (the keys of each and when it went) and when the releases
/// were asked for.
async fn release_together(n: usize) -> (Vec<(Vec<String>, Instant)>, Instant) {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let mut leases = Vec::new();
    for i in 0..n {
        leases.push(a.acquire(format!("k{i}").as_str()).await.unwrap());
    }
    store.set_latency(Op::Release, 100 * MS);
    let released_at = Instant::now();
    let releases = leases.into_iter().map(|lease| lease.release());
    let outcomes = soon(futures::future::join_all(releases)).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(ReleaseOutcome::Released))),
        "{outcomes:?}"
    );
    for i in 0..n {
        assert_released(&db, format!("k{i}").as_str());
    }
    let calls = store.calls_of(Op::Release).into_iter();
    let calls = calls.map(|c| (c.keys.iter().map(|k| k.to_string()).collect(), c.at));
    (calls.collect(), released_at)
}

/// Releases asked for while a light release is in flight wait for it and
/// go together in one call; the first goes at once, alone.
#[tokio::test(start_paused = true)]
async fn light_releases_asked_for_while_one_is_in_flight_go_together_in_one_call() {
    let (calls, released_at) = release_together(5).await;
    let keys: Vec<Vec<String>> = calls.iter().map(|(keys, _)| keys.clone()).collect();
    assert_eq!(
        keys,
        [
            vec!["k0".to_string()],
            (1..5).map(|i| format!("k{i}")).collect()
        ],
        "the first alone, the four asked for meanwhile together"
    );
    assert_eq!(calls[0].1, released_at, "the first goes at once");
    assert_eq!(
        calls[1].1,
        released_at + 100 * MS,
        "the group when it returns"
    );
}

/// More releases queued than one call takes go in further calls, each
/// once the previous returns, at most `MOST_PER_COMMAND` per call: none
/// is left unanswered.
#[tokio::test(start_paused = true)]
async fn light_releases_beyond_one_calls_most_go_in_the_next_call() {
    use crate::store::light_release::MOST_PER_COMMAND;
    let (calls, released_at) = release_together(1 + MOST_PER_COMMAND + 44).await;
    let sizes: Vec<usize> = calls.iter().map(|(keys, _)| keys.len()).collect();
    assert_eq!(
        sizes,
        [1, MOST_PER_COMMAND, 44],
        "alone, then at most the most per call"
    );
    let ats: Vec<Instant> = calls.iter().map(|(_, at)| *at).collect();
    assert_eq!(
        ats,
        [0, 100, 200].map(|ms| released_at + ms * MS),
        "each once the previous returns"
    );
}

/// A key where neither form of the light release applies (another owner
/// waits for a shared lease: its waiting mark, and no place in the queue
/// of waiting owners, which only exclusive waiters take): once the form
/// that hands over missed too, its releases go straight to the general
/// release for `CONTENDED_FOR`, then try the light form again.
#[tokio::test(start_paused = true)]
async fn a_key_where_a_light_release_did_not_apply_skips_it_for_a_while() {
    use crate::config::CONTENDED_FOR;
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    // a holds "k", b waits for a shared lease of it, a releases it (b then
    // has it, and releases it): how many release calls a made.
    let released_while_b_waits = || async {
        let before = sa.calls(Op::Release);
        let lease = a.acquire("k").await.unwrap();
        let b = b.clone();
        let remote = started(async move { b.acquire("k").shared().await }).await;
        soon(db.changed_until("k", |d| d.waiting_since.is_some())).await;
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        let remote = soon(remote).await.unwrap().unwrap();
        assert_eq!(remote.release().await.unwrap(), ReleaseOutcome::Released);
        sa.calls(Op::Release) - before
    };
    assert_eq!(released_while_b_waits().await, 2, "light, then general");
    assert_eq!(
        released_while_b_waits().await,
        2,
        "contended: light handing over, then general"
    );
    assert_eq!(released_while_b_waits().await, 1, "general only, at once");
    sleep(CONTENDED_FOR).await;
    assert_eq!(
        released_while_b_waits().await,
        2,
        "light again, then general"
    );
}

/// Another manager's exclusive waiter, registered in the key's queue of
/// waiting owners: on a key a took uncontended, a's light release for keys
/// nobody waits for misses, and the general release hands b the key; the
/// key is now contended, and a's next releases hand it over in the light
/// release's one call, with a greater token.
#[tokio::test(start_paused = true)]
async fn the_light_release_hands_a_contended_key_to_a_registered_owner_in_one_call() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    for calls in [2, 1, 1] {
        let before = sa.calls(Op::Release);
        let lease = a.acquire("k").await.unwrap();
        let token = lease.fencing_token();
        let remote = waiter(&b, "k").await;
        soon(db.changed_until("k", |d| !d.queue.is_empty())).await;
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(sa.calls(Op::Release) - before, calls);
        let (_, remote) = soon(remote).await.unwrap().unwrap();
        assert!(remote.fencing_token() > token);
        let doc = db.doc("k").expect("a document");
        assert_eq!((doc.owner.as_str(), doc.queue.len()), ("b", 0));
        assert_eq!(remote.release().await.unwrap(), ReleaseOutcome::Released);
    }
}

/// Five acquires of distinct keys started at once, with 100 ms of latency
/// per call: the lone light acquire of k0 returns at 100 ms; the group of
/// the four others goes then, its `update` returning at 200 ms and its
/// `find`, the next call, delayed `find_delay` on the server. Returns the
/// leases in key order and the instant they started; asserts
/// that no general acquire was sent.
async fn grouped_acquires_with_a_late_find(find_delay: Duration) -> (Vec<Lease>, Instant) {
    let db = MemoryDb::new();
    let store = db.store("a", TTL).with_light_acquire();
    let a = LeaseManager::start(Arc::new(store.clone()), "a".into(), timing());
    store.set_latency(Op::Acquire, 100 * MS);
    let started = Instant::now();
    let acquires: Vec<_> = (0..5)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move { a.acquire(format!("k{i}").as_str()).await })
        })
        .collect();
    sleep(150 * MS).await;
    assert_eq!(store.calls(Op::Acquire), 2, "the lone acquire, the update");
    store.fault_next(Op::Acquire, Fault::Delay(find_delay), 1);
    let mut leases = Vec::new();
    for acquire in acquires {
        leases.push(soon(acquire).await.unwrap().unwrap());
    }
    let keys: Vec<usize> = store
        .calls_of(Op::Acquire)
        .iter()
        .map(|c| c.keys.len())
        .collect();
    assert_eq!(
        keys,
        [1, 4, 4],
        "the lone acquire, then the group's update and find; no general acquire"
    );
    (leases, started)
}

/// Light acquires that queued behind the one in flight are granted from
/// their grouped `update` and `find` even when the server runs the `find`
/// later than the `update`, relative to their sends (both queue behind other
/// commands on a busy server): the bound counts from each attempt's start,
/// from which its holder's local deadline counts, so the time spent queued
/// is slack. Counted from the `update`'s send, a `find` run 50 ms late left
/// every grouped key to the general acquire, and skipping the light forms
/// for `CONTENDED_FOR`.
#[tokio::test(start_paused = true)]
async fn queued_light_acquires_count_from_their_start_when_the_find_runs_late() {
    let (leases, started) = grouped_acquires_with_a_late_find(50 * MS).await;
    // Counted from their start: 51 ms of slack covered the late `find`.
    for lease in &leases[1..] {
        assert_eq!(
            lease.status().deadline(),
            Some(started + TTL - SAFETY_MARGIN)
        );
    }
    for lease in leases {
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
}

/// A grouped light acquire whose `find` the server runs so late that its
/// leases have less time left than the TTL from their attempts' start
/// (here a `find` delayed 1 s, with a 3 s TTL) grants them all the same,
/// with no general acquire, but each counts its local deadline from
/// earlier by the shortfall (`LightAcquired::AcquiredShort`): 899 ms
/// here (1.9 s left at the `find`, 201 ms from the start to its send).
/// Counted from the start, the holders' deadlines would pass the leases'
/// expiry if an earlier attempt under the same lease id had set it.
#[tokio::test(start_paused = true)]
async fn a_grouped_light_acquire_found_short_counts_its_deadlines_from_earlier() {
    let (leases, started) = grouped_acquires_with_a_late_find(1000 * MS).await;
    // Not renewed yet (the heartbeat ran before they were granted).
    let from_start = started + TTL - SAFETY_MARGIN;
    for lease in &leases[1..] {
        assert_eq!(
            lease.status().deadline(),
            Some(from_start - 899 * MS),
            "{}",
            lease.key()
        );
    }
}
