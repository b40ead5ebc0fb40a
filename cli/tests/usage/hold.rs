//! etcdctl's habits: `lock KEY` and `elect NAME [VALUE]` hold the lease or
//! leadership until SIGINT or SIGTERM, print the key and fencing token (the
//! name and term) on stdout, and release on exit; a loss exits 76.

use std::time::Duration;

use crate::common::cli::{Env, LEASE_LOST, NOT_ACQUIRED, token_of};
use mongodb::bson::doc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holds_until_interrupted_and_prints_the_key_and_token() {
    let env = Env::new("cli_lock");
    let observer = env.manager(Duration::from_secs(10)).await;
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut lock = env.spawn(&["lock", "job"]);
        let line = lock.expect_line("job ");
        let token = token_of(&line);
        assert_eq!(line, format!("job {token}"));
        let info = observer.inspect("job").await.unwrap().unwrap();
        assert!(info.held, "{info:?}");
        assert_eq!(info.fencing_token, token);
        let out = env.run(&["exec", "job", "-n", "-c", "true"]);
        assert_eq!(out.status.code(), Some(NOT_ACQUIRED));
        lock.signal(signal);
        assert_eq!(lock.wait(), 0, "{:?}", lock.rest());
        // Released on exit.
        let out = env.run(&["exec", "job", "-n", "-c", "true"]);
        assert_eq!(out.status.code(), Some(0));
    }
    // --json: an object per key.
    let mut lock = env.spawn(&["--json", "lock", "--key", "a", "--key", "b", "-s"]);
    for key in ["a", "b"] {
        let line = lock.expect_line(&format!("\"key\":\"{key}\""));
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["kind"], "shared", "{line}");
        assert!(value["fencing_token"].as_u64().unwrap() > 0, "{line}");
    }
    lock.signal(libc::SIGINT);
    assert_eq!(lock.wait(), 0);
    observer.shutdown().await.unwrap();
}

#[test]
fn lock_says_when_its_lease_is_lost_and_exits_76() {
    let env = Env::new("cli_lock_lost");
    let mut lock = env.spawn(&["--watch-held-leases", "lock", "job", "--ttl", "3s"]);
    lock.expect_line("job ");
    let out = env.run(&["release", "job", "--force", "--immediately"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lock.wait(), LEASE_LOST);
    let rest = lock.rest().join("\n");
    assert!(
        rest.contains("the lease on \"job\" was lost (released by an operator"),
        "{rest}"
    );
    assert!(!rest.contains("the command was terminated"), "{rest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_holds_leadership_until_interrupted_and_prints_the_term() {
    let env = Env::new("cli_elect");
    let observer = env.manager(Duration::from_secs(10)).await;
    let mut first = env.spawn(&["elect", "scheduler", "10.0.0.7:8080"]);
    let term = token_of(&first.expect_line("scheduler "));
    let info = observer.inspect("scheduler").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, term);
    assert_eq!(info.payload, Some(doc! { "value": "10.0.0.7:8080" }));

    // A follower says who leads, then leads once the first resigns.
    let mut second = env.spawn(&["--json", "elect", "scheduler"]);
    let line = second.expect_line("campaigning for \"scheduler\"");
    assert!(line.contains(&format!("(term {term})")), "{line}");
    first.signal(libc::SIGINT);
    assert_eq!(first.wait(), 0);
    let line = second.expect_line("\"term\"");
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(value["term"].as_u64().unwrap() > term, "{line}");
    assert_eq!(value["name"], "scheduler");
    second.signal(libc::SIGTERM);
    assert_eq!(second.wait(), 0);
    let info = observer.inspect("scheduler").await.unwrap().unwrap();
    assert!(!info.held, "resigned: {info:?}");
    observer.shutdown().await.unwrap();
}

#[test]
fn a_leader_follower_says_who_leads_and_runs_a_shell_command_once_leader() {
    let env = Env::new("cli_follower");
    let mut first = env.spawn(&["elect", "jobs"]);
    let term = token_of(&first.expect_line("jobs "));
    let follower = env.spawn(&[
        "leader",
        "--name",
        "jobs",
        "-c",
        "echo led $MONGO_LEASE_TOKEN",
    ]);
    let line = follower.expect_line("campaigning for \"jobs\"");
    assert!(line.contains(&format!("(term {term})")), "{line}");
    first.signal(libc::SIGTERM);
    assert_eq!(first.wait(), 0);
    assert!(token_of(&follower.expect_line("led ")) > term);
}

#[test]
fn lock_releases_on_request_unless_told_to_ignore_requests() {
    let env = Env::new("cli_lock_request");
    let mut lock = env.spawn(&["lock", "job"]);
    lock.expect_line("job ");
    let out = env.run(&["release", "job", "--request"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lock.wait(), 0, "{:?}", lock.rest());
    let out = env.run(&["exec", "job", "-n", "-c", "true"]);
    assert_eq!(out.status.code(), Some(0), "released");

    let lock = env.spawn(&["lock", "job", "--on-revocation", "none"]);
    lock.expect_line("job ");
    let out = env.run(&["release", "job", "--request"]);
    assert_eq!(out.status.code(), Some(0));
    // Still held: a request changes nothing.
    let out = env.run(&["exec", "job", "-n", "-c", "true"]);
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED));
}
