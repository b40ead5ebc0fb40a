//! Racing acquires on fresh keys, and takeover after a holder crashes.

use crate::common;

use std::time::Duration;

use common::Fixture;
use mongo_lease::ReleaseOutcome;
use mongodb::bson::doc;
use tokio::time::Instant;

/// Eight managers race for the same missing documents: the upsert on `_id` is a
/// mutex, losers see "held", never an error (docs/mongodb-behaviour.md, B1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_winner_when_managers_race_for_a_fresh_key() {
    let fx = Fixture::new("race").await;
    let managers = fx.managers(8, Duration::from_secs(10)).await;
    for round in 0..20 {
        let key = format!("fresh-{round}");
        let attempts = managers.iter().map(|m| {
            let (m, key) = (m.clone(), key.clone());
            tokio::spawn(async move { m.try_acquire(key).await })
        });
        // A hang guard only: the eight attempts take milliseconds here (the
        // 20 rounds, 1.5 s).
        let results = common::within(
            Duration::from_secs(30),
            "the racing try_acquires",
            futures::future::join_all(attempts),
        )
        .await;
        let winners: Vec<_> = results
            .into_iter()
            .filter_map(|r| r.unwrap().unwrap())
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
    }
    for m in managers {
        m.shutdown().await.unwrap();
    }
}

/// A holder whose process dies without releasing: the key is free once the
/// lease expires by the server's clock, without waiting for the TTL monitor,
/// and a waiter gets it promptly (its backoff is capped by the remaining time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_lease_is_taken_over_right_after_it_expires() {
    const TTL: Duration = Duration::from_secs(2);
    /// The survivor's longest delay between two attempts (its default).
    const RETRY_MAX: Duration = mongo_lease::DEFAULT_RETRY_MAX;
    let fx = Fixture::new("crash").await;
    // The "crashing process": a manager on its own runtime, torn down while holding.
    let old_token = fx.crashed_process(TTL, async |manager| {
        let lease = manager.acquire("job").await.unwrap();
        let token = lease.fencing_token();
        std::mem::forget(lease);
        std::mem::forget(manager);
        token
    });
    // When the crashed lease expires, by the server's clock.
    let expires = *fx.doc("job").await.get_datetime("exp").unwrap();
    let survivor = fx.manager(TTL).await;
    // The server's time just before the survivor's first attempt.
    let waits_from = fx
        .db
        .run_command(doc! { "hello": 1 })
        .await
        .unwrap()
        .get_datetime("localTime")
        .unwrap()
        .to_owned();
    // A hang guard only: 10x the TTL, which the wait is shorter than.
    let lease = tokio::time::timeout(10 * TTL, survivor.acquire("job"))
        .await
        .expect("the crashed holder's lease was not taken over")
        .unwrap();
    assert!(lease.fencing_token() > old_token);
    // The server's own time of the takeover (`acq`, its `$$NOW`) against
    // the crashed lease's expiry, both by the server's clock, so no
    // scheduling delay on this machine can move either.
    let taken = *fx.doc("job").await.get_datetime("acq").unwrap();
    // Not before expiry.
    assert!(
        taken >= expires,
        "taken over at {taken} by the server's clock, before the crashed lease expired at {expires}"
    );
    // Right after it, without waiting for the TTL monitor (which may delete
    // the document only `gc_grace`, 60 s, after it expired): a waiter never
    // waits longer than `retry_max` between two attempts, and the remaining
    // time (+ up to `retry_initial`, 10 ms) caps its wait on a lease that
    // expires sooner, so it tries again about when the lease expires. The
    // takeover lands that jitter and a round trip after the expiry (or after
    // the first attempt, if the survivor started after it); `retry_max` (1 s)
    // is more than 10x that, and shorter than one TTL.
    let late = taken.timestamp_millis() - expires.max(waits_from).timestamp_millis();
    eprintln!("taken over {late} ms after the crashed lease expired");
    assert!(
        late <= RETRY_MAX.as_millis() as i64,
        "taken over {late} ms after the crashed lease expired at {expires} \
         (the survivor waited from {waits_from}), more than retry_max ({RETRY_MAX:?})"
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let doc = fx.doc("job").await;
    assert!(doc.get("lid").is_none());
    survivor.shutdown().await.unwrap();
}

/// A waiter in another process is woken by the release itself (a change
/// stream of releases), not by its next poll: with a backoff that would make
/// it wait at least 60 s, it gets the key at once, granted on the release's
/// event (the release handed the key to its registration) and renewed.
#[tokio::test]
async fn a_release_wakes_waiters_in_other_processes_at_once() {
    const TTL: Duration = Duration::from_secs(300);
    /// The waiter's backoff: its first retry comes 60 to 120 s after its
    /// first attempt.
    const POLL: Duration = Duration::from_secs(120);
    let fx = Fixture::new("wake").await;
    let holder = fx.manager(TTL).await;
    let lease = holder.acquire("k").await.unwrap();

    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.retry_initial = POLL;
    options.retry_max = POLL;
    let waiter = mongo_lease::LeaseManager::connect(options).await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let lease = waiter.acquire("k").await.unwrap();
            (Instant::now(), lease)
        })
    };
    // The first attempt found the key held, and the release stream is open.
    common::eventually(
        "the waiter's change stream is open",
        Duration::from_secs(10),
        || {
            let opened = log.count("ok:aggregate");
            async move { opened >= 1 }
        },
    )
    .await;
    // Writes before the stream opened were not announced, so its opening
    // retries the key at once; that attempt finds it held too, and the next
    // poll is at least POLL / 2 away. The first attempt sent the light
    // acquire and then the general one (the key was held); the key is
    // contended from then on, so each later attempt is one command.
    common::eventually(
        "the retry when the stream opened",
        Duration::from_secs(10),
        || {
            let commands = log.count("findAndModify");
            async move { commands >= 3 }
        },
    )
    .await;
    // Two attempts so far (light and general, then general); a stream that
    // had to be opened again under load retries once more, which changes
    // nothing below: what counts is what the waiter sends after the release.
    let names = |from: usize| -> Vec<String> {
        log.all()[from..]
            .iter()
            .map(|(name, _)| name.clone())
            .collect()
    };
    assert!(log.count("findAndModify") >= 3, "{:?}", names(0));
    // No attempt in flight when the key is released (one would confirm the
    // handoff itself): every command sent so far answered.
    common::eventually(
        "the waiter's commands answered",
        Duration::from_secs(10),
        || {
            let quiet = ["findAndModify", "aggregate"]
                .iter()
                .all(|name| log.count(name) == log.count(&format!("ok:{name}")));
            async move { quiet }
        },
    )
    .await;

    let before = log.all().len();
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let released_at = Instant::now();
    // A hang guard only: the handoff takes milliseconds here, and the
    // waiter's own poll would come after at least POLL / 2.
    let (acquired_at, lease) = tokio::time::timeout(POLL / 4, waiting)
        .await
        .expect("the release did not wake the waiter")
        .unwrap();
    let since_release = names(before);
    assert!(
        !since_release.iter().any(|name| name == "findAndModify"),
        "the release handed the key to the waiter's registration, and the \
         waiter was granted it on the event, with no attempt: {since_release:?}"
    );
    // The handed lease is renewed at once, to its TTL (the handoff wrote
    // only the registration's `hx`): the waiter's first `update`.
    common::eventually(
        "the handed lease's renewal",
        Duration::from_secs(10),
        || {
            let renewed = log.count("ok:update");
            async move { renewed >= 1 }
        },
    )
    .await;
    assert_eq!(log.count("update"), 1, "one renewal");
    let doc = fx.doc("k").await;
    let ms = |name: &str| doc.get_datetime(name).unwrap().timestamp_millis();
    assert_eq!(ms("exp") - ms("ts"), TTL.as_millis() as i64, "{doc}");
    assert_eq!(doc.get_i64("tok").unwrap() as u64, lease.fencing_token());
    let handoff = acquired_at - released_at;
    eprintln!("cross-process handoff after release: {handoff:?}");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}

/// Fairness between processes: a manager whose tasks keep re-acquiring a key
/// hands it over locally at once, so a waiter in another process would only
/// get it when a poll happens to land between a release and the next local
/// acquisition. A waiting acquire marks the lease (`wt`) and the release of a
/// marked lease yields the key (`yu`), so the other manager gets it at the
/// busy manager's next release, every round; a `try_acquire` leaves no mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_another_manager_waited_for_yields_the_key_to_it() {
    const TTL: Duration = Duration::from_secs(30);
    const HOLD: Duration = Duration::from_millis(200);
    let fx = Fixture::new("fair").await;
    let busy = fx.manager(TTL).await;
    let other = fx.manager(TTL).await;
    let lease = busy.acquire("hot").await.unwrap();
    assert!(other.try_acquire("hot").await.unwrap().is_none());
    assert!(
        !fx.doc("hot").await.contains_key("wt"),
        "a try_acquire marked the lease as waited for"
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(!fx.doc("hot").await.contains_key("yu"), "yielded to nobody");

    let stop = tokio_util::sync::CancellationToken::new();
    // Acquisitions by the busy manager so far.
    let busy_acquired = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut loops = Vec::new();
    for _ in 0..2 {
        let (busy, stop, busy_acquired) = (busy.clone(), stop.clone(), busy_acquired.clone());
        loops.push(tokio::spawn(async move {
            let mut held = 0;
            while !stop.is_cancelled() {
                let lease = busy.acquire("hot").await.unwrap();
                busy_acquired.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held += 1;
                tokio::time::sleep(HOLD).await;
                assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
            }
            held
        }));
    }
    let busy_id = busy.owner_id().to_owned();
    let mut counted = 0;
    for round in 0..5 {
        // Expected at the busy manager's next release; without the yield, only
        // a poll that happens to land between a release and the next local
        // acquisition (a few ms every HOLD) would get it, after dozens of
        // local handoffs. Counted, not timed: once the other manager's mark
        // is on the busy manager's lease, that lease's release yields the key,
        // so the busy manager acquires it at most once more (that lease's own
        // acquisition, if its count had not landed yet when the mark was seen).
        let mut acquiring = {
            let other = other.clone();
            tokio::spawn(async move { other.acquire("hot").await })
        };
        // A hang guard only: the mark lands within one attempt (milliseconds).
        let deadline = Instant::now() + Duration::from_secs(60);
        let before = loop {
            if acquiring.is_finished() {
                // Its first attempt found the key free: nothing to count.
                break None;
            }
            let doc = fx.doc("hot").await;
            if doc.contains_key("wt")
                && doc.contains_key("lid")
                && doc.get_str("aid").ok() == Some(busy_id.as_str())
            {
                break Some(busy_acquired.load(std::sync::atomic::Ordering::SeqCst));
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no waiting mark on the busy manager's lease: {doc:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let lease = tokio::time::timeout(Duration::from_secs(60), &mut acquiring)
            .await
            .unwrap_or_else(|_| panic!("round {round}: starved by the busy manager"))
            .unwrap()
            .unwrap();
        if let Some(before) = before {
            counted += 1;
            let meanwhile = busy_acquired.load(std::sync::atomic::Ordering::SeqCst) - before;
            assert!(
                meanwhile <= 1,
                "round {round}: the busy manager acquired the key {meanwhile} times after the other manager's mark"
            );
        }
        let doc = fx.doc("hot").await;
        assert_eq!(doc.get_str("aid").unwrap(), other.owner_id());
        // The busy manager's tasks wait on it now: they marked it, so this
        // release yields the key back to them.
        common::eventually(
            "the busy manager waits",
            Duration::from_secs(10),
            || async { fx.doc("hot").await.contains_key("wt") },
        )
        .await;
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        let doc = fx.doc("hot").await;
        assert!(
            doc.get_str("aid").unwrap() == busy.owner_id() || doc.contains_key("yu"),
            "round {round}: the release did not yield: {doc:?}"
        );
    }
    // A round where the other manager's first attempt found the key free
    // (in the moment between a release and the next local acquisition)
    // counts nothing; all five doing so would leave this test untested.
    assert!(
        counted > 0,
        "no round found the busy manager's lease marked"
    );
    eprintln!("fairness: {counted} of 5 rounds counted from the waiting mark");
    stop.cancel();
    // A hang guard only: each loop ends after its current hold (HOLD, and a
    // local handoff of milliseconds); 30 s is 10x the whole test here (3 s).
    for l in loops {
        let held = common::within(Duration::from_secs(30), "the busy loops' end", l).await;
        assert!(held.unwrap() > 0);
    }
    busy.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// The waiting mark costs one write per holding period, and the waiter's
/// registration in the queue of waiting owners one more per half its
/// registration window, however often the waiter retries: the other
/// attempts find `wt` set and the registration fresh and change nothing, so
/// they leave no oplog entry (no replication, no change event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_marks_a_lease_once_however_often_it_retries() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("mark").await;
    let holder = fx.manager(TTL).await;
    let lease = holder.acquire("k").await.unwrap();
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.retry_initial = Duration::from_millis(10);
    options.retry_max = Duration::from_millis(40);
    let waiter = mongo_lease::LeaseManager::connect(options).await.unwrap();

    let since = fx.doc("k").await.get_datetime("ts").unwrap().to_owned();
    let started = Instant::now();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.acquire("k").await })
    };
    // Ten attempts, however long they take on this machine; then the
    // waiter leaves (its acquire future dropped).
    common::eventually("ten waiting attempts", Duration::from_secs(60), || {
        let attempts = log.count("findAndModify");
        async move { attempts >= 10 }
    })
    .await;
    waiting.abort();
    let attempt = waiting.await;
    let span = started.elapsed();
    assert!(attempt.is_err_and(|e| e.is_cancelled()), "the key is held");
    let attempts = log.count("findAndModify");
    let wt = fx.doc("k").await.get_datetime("wt").unwrap().to_owned();
    assert!(wt >= since);

    let oplog = fx
        .client
        .database("local")
        .collection::<mongodb::bson::Document>("oplog.rs");
    let writes = oplog
        .count_documents(doc! {
            "ns": format!("{}.{}", fx.db.name(), fx.collection),
            "op": "u",
            "o2._id": "k",
        })
        .await
        .unwrap();
    // Registration window: 2 * retry_max + 1 s + safety margin (ttl / 10);
    // refreshed past its half.
    let margin = TTL / mongo_lease::DEFAULT_SAFETY_MARGIN_DIVISOR;
    let half = (2 * Duration::from_millis(40) + Duration::from_secs(1) + margin) / 2;
    let most = 1 + (span.as_millis() / half.as_millis()) as u64;
    assert!(
        (1..=most).contains(&writes),
        "{attempts} waiting attempts over {span:?} wrote {writes} times (at most {most})"
    );

    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}
