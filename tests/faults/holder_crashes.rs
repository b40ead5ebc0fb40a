//! Holder processes killed with SIGKILL while they hold a key: the key is
//! taken over within TTL + one retry interval of the crash, or later by at
//! most one registration window when a crashed waiter heads the key's
//! queue of waiting owners (`scenario::takeover_bound`).

use std::time::Duration;

use crate::harness::{Fleet, Params};
use crate::scenario::{
    Rounds, finish, params, progress, scenario_slot, summarize, takeover_bound, three_members,
};

/// Kills (SIGKILL) the worker behind the next acquisition that `pick`
/// accepts, while it holds the key, and returns the time from the kill to
/// the next acquisition of that key by another worker, or `None` if the
/// holder had already released before the signal landed.
pub async fn kill_holder_and_time_takeover(
    fleet: &mut Fleet,
    pick: impl Fn(&str) -> bool,
) -> Option<(String, f64)> {
    let from = fleet.history.len();
    let live = fleet.live_workers();
    let acq = fleet
        .history
        .wait_for(
            "an acquisition to crash",
            from,
            Duration::from_secs(60),
            |e| e.kind == "acq" && live.contains(&e.w) && pick(&e.w),
        )
        .await;
    let (key, tok, victim) = (acq.get("key").to_string(), acq.num("tok"), acq.w.clone());
    let (killed, _) = fleet.kill(&victim).await;
    let released_first = fleet
        .history
        .all()
        .iter()
        .any(|e| e.w == victim && e.kind == "cs" && e.num("tok") == tok);
    if released_first {
        return None;
    }
    let next = fleet
        .history
        .wait_for(
            "the crashed holder's key to be taken over",
            from,
            Duration::from_secs(60),
            |e| e.kind == "acq" && e.get("key") == key && e.num("tok") > tok,
        )
        .await;
    assert_ne!(next.w, victim);
    Some((victim, (next.t() - killed) as f64 / 1e9))
}

/// (e) Holder processes are killed with SIGKILL while holding a key: the key
/// must be taken over within [`takeover_bound`] of the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_holder_processes_kill_9() {
    let _slot = scenario_slot().await;
    let rs = three_members(false).await;
    let p = Params {
        hold_ms: (200, 400),
        long_hold_pct: 0,
        ..params(2.0)
    };
    // The protocol's bound (a crashed waiter's registration may keep the
    // key for the head of the queue until it lapses): see `takeover_bound`.
    let bound = takeover_bound(&p);
    let mut fleet = Fleet::new(&rs.uri(), p.clone()).await;
    fleet.spawn_n(p.workers).await;
    progress(&fleet, 0, 5, Duration::from_secs(60)).await;
    let mut takeovers = Vec::new();
    let mut rounds = Rounds::new(2);
    while rounds.next() {
        let Some((victim, takeover)) = kill_holder_and_time_takeover(&mut fleet, |_| true).await
        else {
            continue;
        };
        eprintln!("killed {victim} while it held a key: taken over after {takeover:.2} s");
        assert!(
            takeover <= bound,
            "taken over {takeover:.2} s after the crash; bound TTL + registration window + retry = {bound:.2} s"
        );
        takeovers.push(takeover);
        fleet.spawn_n(1).await;
    }
    assert!(!takeovers.is_empty(), "no holder was killed while holding");
    let report = finish("e_kill_holders", &mut fleet).await;
    assert!(report.crashed >= takeovers.len());
    eprintln!(
        "FIGURE e_kill_holders: TTL {:?} + retry {:?}: key taken over {} after the crash (bound {bound:.1} s)",
        p.ttl,
        p.retry_max,
        summarize(&takeovers)
    );
}
