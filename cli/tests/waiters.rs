//! `list --json` and `watch --json` show the owners waiting for a key
//! (`waiters`), against a real `mongod`: a holder in this process, two
//! `exec` processes waiting in turn.

mod common;

use std::time::Duration;

use serde_json::Value;

use common::cli::{Env, WAIT, stderr};

const TTL: Duration = Duration::from_secs(30);

/// The owner ids of a JSON line's or lease's `waiters`.
fn waiting(value: &Value) -> Vec<String> {
    value["waiters"]
        .as_array()
        .unwrap_or_else(|| panic!("no waiters in {value}"))
        .iter()
        .map(|w| w["owner_id"].as_str().unwrap().to_string())
        .collect()
}

/// `list --json`'s entry for `key`.
fn listed(env: &Env, key: &str) -> Value {
    let out = env.run(&["list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let leases: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lease = leases.as_array().unwrap().iter().find(|l| l["key"] == key);
    lease
        .unwrap_or_else(|| panic!("no {key} in {leases}"))
        .clone()
}

/// Waits (bounded) until `list --json` shows `owners` waiting for `key`.
async fn list_shows(env: &Env, key: &str, owners: &[&str]) -> Value {
    let start = std::time::Instant::now();
    loop {
        let lease = listed(env, key);
        if waiting(&lease) == owners {
            return lease;
        }
        assert!(
            start.elapsed() < WAIT,
            "waiters {lease}, expected {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_watch_show_the_waiting_owners_in_order() {
    let env = Env::new("cli_waiters");
    let holder = env.manager(TTL).await;
    let lease = holder.acquire("job").await.unwrap();
    let exec = |owner: &str| {
        env.spawn(&[
            "--owner-id",
            owner,
            "exec",
            "--key",
            "job",
            "--",
            "sh",
            "-c",
            "echo \"holding $MONGO_LEASE_OWNER\"",
        ])
    };
    let mut first = exec("first");
    list_shows(&env, "job", &["first"]).await;
    let mut second = exec("second");
    let lease_json = list_shows(&env, "job", &["first", "second"]).await;
    assert_eq!(lease_json["owner_id"], holder.owner_id());
    for w in lease_json["waiters"].as_array().unwrap() {
        assert_eq!(w["kind"], "exclusive", "{w}");
        assert!(w["registered_at"].is_string(), "{w}");
        assert!(w["expires_at"].is_string(), "{w}");
    }

    // watch's first line is the current state, with its waiters.
    let mut watch = env.spawn(&["watch", "--json", "job"]);
    let line: Value = serde_json::from_str(&watch.expect_line("\"event\"")).unwrap();
    assert_eq!(line["event"], "held", "{line}");
    assert_eq!(waiting(&line), ["first", "second"], "{line}");

    // The release hands the key to the first; it runs and releases; then the second.
    assert_eq!(
        lease.release().await.unwrap(),
        mongo_lease::ReleaseOutcome::Released
    );
    first.expect_line("holding first");
    assert_eq!(first.wait(), 0);
    second.expect_line("holding second");
    assert_eq!(second.wait(), 0);
    let acquired: Value = serde_json::from_str(&watch.expect_line("\"first\"")).unwrap();
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    assert_eq!(waiting(&acquired), ["second"], "{acquired}");
    watch.signal(libc::SIGINT);
    assert_eq!(watch.wait(), 0);
    holder.shutdown().await.unwrap();
}
