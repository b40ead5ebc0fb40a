//! `release --force` and `release --owner` (docs/lock-delay.md): they say
//! when the released key is free again (by default once the ended lease
//! could no longer be live, with `--immediately` after the lock-delay
//! alone), and it is granted to nobody until then.

mod common;

use common::cli::{Env, LEASE_LOST, NOT_ACQUIRED, stderr, stdout};
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
