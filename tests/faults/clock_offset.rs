//! Clients whose wall clocks are minutes off (an `LD_PRELOAD` shim): the
//! protocol uses the server's clock only.

use std::time::Duration;

use crate::harness::{Fleet, Params};
use crate::holder_crashes::kill_holder_and_time_takeover;
use crate::scenario::{
    finish, params, progress, scenario_slot, summarize, takeover_bound, three_members,
};

/// Starts a worker whose wall clock reads `offset` seconds off.
async fn spawn_skewed(fleet: &mut Fleet, shim: &std::path::Path, offset: i64) -> String {
    let cfg = fleet.config(&fleet.uri.clone());
    let env = [
        ("LD_PRELOAD", shim.display().to_string()),
        ("MONGO_LEASE_CLOCK_OFFSET_SECS", offset.to_string()),
    ];
    fleet.spawn(cfg, &env).await
}

/// A client whose wall clock is offset by minutes: workers whose clocks run
/// 5 minutes ahead and 5 minutes behind share keys with a correct one. If
/// the core used client clocks anywhere in expiry, the ahead worker's leases
/// would outlive its crash by 5 minutes (takeover bound fails) and the behind
/// worker's leases would be expired on arrival (exclusion fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_client_wall_clock_offset_by_minutes() {
    let _slot = scenario_slot().await;
    let rs = three_members(false).await;
    let shim = crate::common::clock::shim();
    let p = Params {
        keys: 1,
        hold_ms: (200, 400),
        long_hold_pct: 0,
        ..params(2.0)
    };
    // The protocol's bound (a crashed waiter's registration may keep the
    // key for the head of the queue until it lapses): see `takeover_bound`.
    let bound = takeover_bound(&p);
    let mut fleet = Fleet::new(&rs.uri(), p.clone()).await;
    let mut offsets = std::collections::HashMap::new();
    for offset in [300, -300, 0] {
        offsets.insert(spawn_skewed(&mut fleet, shim, offset).await, offset);
    }
    // The shim works: each worker's wall clock reads the offset.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for e in fleet.history.all().iter().filter(|e| e.kind == "ready") {
        let skew = e.num("wall_ms") - now_ms;
        let want = offsets[&e.w] * 1000;
        assert!(
            (skew - want).abs() < 10_000,
            "worker {}'s wall clock is off by {skew} ms, not {want} ms",
            e.w
        );
    }
    progress(&fleet, 0, 10, Duration::from_secs(60)).await;
    let mut takeovers = Vec::new();
    for offset in [300, -300] {
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(
                attempts <= 5,
                "could not kill the {offset:+} s worker while it held the key"
            );
            let skewed: Vec<String> = offsets
                .iter()
                .filter(|(_, o)| **o == offset)
                .map(|(w, _)| w.clone())
                .collect();
            if let Some((victim, takeover)) =
                kill_holder_and_time_takeover(&mut fleet, |w| skewed.iter().any(|s| s == w)).await
            {
                eprintln!(
                    "killed {victim} (clock {offset:+} s) while it held the key: taken over after {takeover:.2} s"
                );
                assert!(
                    takeover <= bound,
                    "taken over {takeover:.2} s after the crash of a client with its clock {offset:+} s off; bound {bound:.2} s"
                );
                takeovers.push(takeover);
                offsets.insert(spawn_skewed(&mut fleet, shim, offset).await, offset);
                break;
            }
            // It had released just before the signal: start another one.
            offsets.insert(spawn_skewed(&mut fleet, shim, offset).await, offset);
        }
    }
    let from = fleet.history.len();
    progress(&fleet, from, 10, Duration::from_secs(60)).await;
    let report = finish("h_clock_offset", &mut fleet).await;
    eprintln!(
        "FIGURE h_clock_offset: clients at +5 min, -5 min and 0: key taken over {} after a skewed holder's crash (bound {bound:.1} s); leases lost {}",
        summarize(&takeovers),
        report.lost
    );
    assert_eq!(report.lost, 0);
}
