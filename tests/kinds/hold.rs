//! `hold_at_least`: a key stays held until its acquisition time plus the
//! minimum hold by the server's clock, released or abandoned.

use std::time::Duration;

use mongo_lease::ReleaseOutcome;

use crate::common::Fixture;
use crate::support::{LIVENESS, server_now, stored_time};

const TTL: Duration = Duration::from_secs(10);

/// An exclusive lease with `hold_at_least(2 s)` released at once: another
/// manager's `try_acquire` is refused while the server's `$$NOW` is before
/// `hl` and succeeds after. Each attempt is judged by the server time read
/// (with `inspect`) just before it (a refusal: that time was before `hl`)
/// or just after it (a success: that time, and the acquisition's own, are
/// at or after `hl`), never by the test's clock. `inspect` shows
/// `hold_until` while it is ahead.
#[tokio::test]
async fn a_key_released_at_once_stays_held_until_its_hold_at_least_by_the_servers_clock() {
    const AT_LEAST: Duration = Duration::from_secs(2);
    /// Pace of the attempts: no verdict rests on it.
    const PACE: Duration = Duration::from_millis(100);
    let fx = Fixture::new("hold_release").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let job = a.acquire("job").hold_at_least(AT_LEAST).await.unwrap();
    let first_token = job.fencing_token();
    assert_eq!(job.release().await.unwrap(), ReleaseOutcome::Released);

    let doc = fx.doc("job").await;
    let hold_until = stored_time(&doc, "hl");
    let acquired_at = stored_time(&doc, "acq");
    assert_eq!(
        hold_until,
        acquired_at + AT_LEAST,
        "hl = acquisition + hold_at_least"
    );
    assert!(doc.get("lid").is_none(), "released");
    // The key reads as held until hl, by the server's clock.
    let info = b.inspect("job").await.unwrap().unwrap();
    if info.server_time < hold_until {
        assert_eq!(info.hold_until, Some(hold_until));
        assert!(info.held, "released before its minimum hold: still held");
    } else {
        assert_eq!(
            info.hold_until, None,
            "hold_until is shown only while ahead"
        );
        assert!(!info.held);
    }

    let started = tokio::time::Instant::now();
    let mut refused = 0;
    let taken = loop {
        assert!(
            started.elapsed() < LIVENESS,
            "the key was still refused {LIVENESS:?} after a 2 s minimum hold"
        );
        let before = server_now(&b, "job").await;
        match b.try_acquire("job").await.unwrap() {
            None => {
                assert!(
                    before < hold_until,
                    "refused at a server time of at least {before:?}, after hl {hold_until:?}"
                );
                refused += 1;
                tokio::time::sleep(PACE).await;
            }
            Some(lease) => {
                let after = server_now(&b, "job").await;
                assert!(
                    after >= hold_until,
                    "acquired by a server time of {after:?}, before hl {hold_until:?}"
                );
                break lease;
            }
        }
    };
    assert!(taken.fencing_token() > first_token);
    let info = b.inspect("job").await.unwrap().unwrap();
    assert!(
        info.acquired_at >= hold_until,
        "taken at {:?} by the server's clock, before hl {hold_until:?}",
        info.acquired_at
    );
    assert_eq!(
        info.hold_until, None,
        "an acquisition without hold_at_least clears hl"
    );
    assert!(fx.doc("job").await.get("hl").is_none());
    eprintln!("refused {refused} times during the minimum hold");
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A holder that crashes keeps its key until the later of its minimum hold
/// (`hl`) and its lease's expiry (`exp`), by the server's clock: with a
/// minimum hold longer than the TTL (4 s against 2 s), and shorter (1 s).
/// A waiter takes it within `retry_max` of that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_keeps_the_key_until_the_later_of_its_minimum_hold_and_its_expiry() {
    const TTL: Duration = Duration::from_secs(2);
    const KEYS: [(&str, Duration); 2] = [
        ("longer-than-ttl", Duration::from_secs(4)),
        ("shorter-than-ttl", Duration::from_secs(1)),
    ];
    let fx = Fixture::new("hold_crash").await;
    let crashed_tokens = fx.crashed_process(TTL, async |manager| {
        let mut tokens = Vec::new();
        for (key, at_least) in KEYS {
            let lease = manager.acquire(key).hold_at_least(at_least).await.unwrap();
            tokens.push(lease.fencing_token());
            std::mem::forget(lease);
        }
        std::mem::forget(manager);
        tokens
    });
    let survivor = fx.manager(TTL).await;
    let mut waits = Vec::new();
    for ((key, at_least), crashed_token) in KEYS.into_iter().zip(crashed_tokens) {
        // As the crashed process left it (nobody renews it any more).
        let doc = fx.doc(key).await;
        let (acquired, hold_until) = (stored_time(&doc, "acq"), stored_time(&doc, "hl"));
        let expires = stored_time(&doc, "exp");
        assert_eq!(hold_until, acquired + at_least);
        assert_eq!(
            expires,
            hold_until.max(acquired + TTL),
            "exp = max($$NOW + ttl, hl) at the acquisition"
        );
        let until = hold_until.max(expires);
        // The server's time just before the survivor's first attempt.
        let waits_from = server_now(&survivor, key).await;
        let survivor = survivor.clone();
        waits.push(tokio::spawn(async move {
            let Ok(acquired) = tokio::time::timeout(LIVENESS, survivor.acquire(key)).await else {
                panic!("{key} was never taken over");
            };
            let lease = acquired.unwrap();
            assert!(lease.fencing_token() > crashed_token);
            let info = survivor.inspect(key).await.unwrap().unwrap();
            assert!(
                info.acquired_at >= until,
                "{key} taken at {:?} by the server's clock, before max(hl, exp) = {until:?}",
                info.acquired_at
            );
            // Right after it, both by the server's clock: a waiter never
            // waits longer than `retry_max` between two attempts, and the
            // time left on the key caps its wait, as in takeover.rs.
            let late = info
                .acquired_at
                .duration_since(until.max(waits_from))
                .unwrap_or_default();
            eprintln!("{key} taken {late:?} after max(hl, exp)");
            assert!(
                late <= mongo_lease::DEFAULT_RETRY_MAX,
                "{key} taken {late:?} after max(hl, exp) = {until:?} (the survivor waited from \
                 {waits_from:?}), more than retry_max ({:?})",
                mongo_lease::DEFAULT_RETRY_MAX
            );
            assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        }));
    }
    for wait in waits {
        crate::common::within(LIVENESS, "a takeover and its checks", wait)
            .await
            .unwrap();
    }
    survivor.shutdown().await.unwrap();
}
