//! `release --force` and `release --owner` (docs/lock-delay.md): they say
//! when the released key is free again (by default once the ended lease
//! could no longer be live, with `--immediately` after the lock-delay
//! alone), and it is granted to nobody until then.

mod common;

use common::cli::{Env, LEASE_LOST, NOT_ACQUIRED, WAIT, stderr, stdout};
use mongodb::bson::doc;
use serde_json::Value;

/// A command that holds its lease until it is lost.
const HOLD: [&str; 3] = ["sh", "-c", "echo working; while true; do sleep 0.05; done"];

/// The holders are told of a force release at once, not at their next
/// heartbeat (`--watch-held-leases`).
const WATCH: &str = "--watch-held-leases";

#[test]
fn release_force_prints_its_lock_delay_and_nobody_gets_the_key_meanwhile() {
    let env = Env::new("cli_delay");
    let mut holder = env.spawn(
        &[
            &[WATCH, "exec", "--key", "job", "--ttl", "5s", "--"][..],
            &HOLD,
        ]
        .concat(),
    );
    holder.expect_line("working");
    // Far longer than the test: the key stays delayed throughout.
    let out = env.run(&[
        "release",
        "job",
        "--force",
        "--immediately",
        "--lock-delay",
        "10m",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("free again in 10m: the lock-delay"),
        "{}",
        stdout(&out)
    );
    assert_eq!(holder.wait(), LEASE_LOST);
    let out = env.run(&["exec", "--key", "job", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{}", stderr(&out));

    // The default lock-delay: the safety margin of the default TTL (30 s /
    // 10); without --immediately, the key waits for the lease's expiry,
    // most of the default TTL away.
    let mut holder = env.spawn(&[&[WATCH, "exec", "--key", "job2", "--"][..], &HOLD].concat());
    holder.expect_line("working");
    let out = env.run(&["--json", "release", "job2", "--force"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["released"], Value::Bool(true));
    assert_eq!(report["lock_delay_ms"], Value::from(3_000));
    let free_in = report["free_in_ms"].as_u64().expect("free_in_ms");
    assert!(free_in > 10_000 && free_in <= 30_000, "{report}");
    assert_eq!(holder.wait(), LEASE_LOST);
    let out = env.run(&["exec", "--key", "job2", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{}", stderr(&out));

    // By owner id, and none for a key nobody held.
    let mut holder = env.spawn(
        &[
            &[WATCH, "--owner-id", "w7", "exec", "--key", "job3", "--"][..],
            &HOLD,
        ]
        .concat(),
    );
    holder.expect_line("working");
    let out = env.run(&["release", "--owner", "w7", "--force", "--lock-delay", "10m"]);
    let text = stdout(&out);
    assert!(
        text.contains("released 1 lease of owner id \"w7\""),
        "{text}"
    );
    assert!(
        text.contains("could no longer be live") && text.contains("lock-delay (10m)"),
        "{text}"
    );
    assert_eq!(holder.wait(), LEASE_LOST);
    let out = env.run(&["exec", "--key", "job3", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{}", stderr(&out));
    let out = env.run(&["release", "free", "--force"]);
    assert!(!stdout(&out).contains("free again"), "{}", stdout(&out));
    let out = env.run(&["release", "free", "--force", "--lock-delay", "soon"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("--lock-delay"), "{}", stderr(&out));
}

/// An operator's force release with default options but
/// a shorter TTL: A runs under the lease, B waits for the key, and
/// `release --force` (no lock-delay, to make the point) ends A's lease
/// right after a renewal of it. A's `exec` hears of it only at its next
/// renewal, then sends its command SIGTERM; B's command starts only after
/// that, so the two never run at once (without waiting for A's lease, B
/// would start at once, a heartbeat before A is told).
#[test]
fn release_force_grants_the_key_again_only_after_the_holders_command_was_told_to_stop() {
    const TTL: &str = "5s";
    let env = Env::new("cli_force_waits");
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    let log = events.display().to_string();
    let a_command = format!(
        "trap 'echo A-stopped >> {log}; exit 0' TERM; echo A-started >> {log}; echo working; \
         while true; do sleep 0.05; done"
    );
    let mut a = env.spawn(&[
        "exec", "--key", "ov", "--ttl", TTL, "--", "sh", "-c", &a_command,
    ]);
    a.expect_line("working");
    let b_command = format!("echo B-started >> {log}");
    let mut b = env.spawn(&[
        "exec", "--key", "ov", "--ttl", TTL, "--", "sh", "-c", &b_command,
    ]);
    env.wait_for_waiting_mark_blocking("ov");
    wait_for_a_renewal_blocking(&env, "ov");
    let out = env.run(&["release", "ov", "--force", "--lock-delay", "0s"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(b.wait(), 0, "B's exec");
    assert_eq!(a.wait(), LEASE_LOST, "A's exec");
    let order = std::fs::read_to_string(&events).unwrap();
    assert_eq!(
        order.lines().collect::<Vec<_>>(),
        ["A-started", "A-stopped", "B-started"],
        "B's command started before A's was told to stop"
    );
}

/// Waits until the lease on `key` is renewed (its `ts` moves), on a runtime
/// of its own: returns right after a renewal.
fn wait_for_a_renewal_blocking(env: &Env, key: &str) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let leases = env.leases().await;
            let renewed_at = || async {
                let doc = leases.find_one(doc! { "_id": key }).await.unwrap();
                *doc.expect("the lease").get_datetime("ts").unwrap()
            };
            let before = renewed_at().await;
            common::eventually("a renewal", WAIT, || async { renewed_at().await > before }).await;
        });
}
