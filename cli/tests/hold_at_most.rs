//! `exec --hold-at-most D` (a lease never renewed, ended D after its
//! acquisition: the command gets SIGTERM at its deadline, exit 76) and
//! `leader --payload` (the payload written by the write that wins the term)
//! against a real `mongod`.

mod common;

use std::time::Duration;

use common::cli::{Env, LEASE_LOST, USAGE, WAIT, stderr};
use common::within;
use mongodb::bson::doc;

/// A command that says it started, and on SIGTERM writes `got-TERM` to
/// `file` and exits 0.
fn trapping(file: &std::path::Path) -> String {
    format!(
        "trap 'echo got-TERM > {file}; exit 0' TERM; echo started; while :; do sleep 0.05; done",
        file = file.display()
    )
}

#[test]
fn a_command_held_at_most_d_gets_sigterm_at_the_deadline_and_exec_exits_76() {
    let env = Env::new("cli_at_most");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("term");
    let script = trapping(&file);
    let mut proc = env.spawn(&[
        "exec",
        "--key",
        "report",
        "--ttl",
        "2s",
        "--grace",
        "1s",
        "--hold-at-most",
        "2s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    proc.expect_line("started");
    let code = proc.wait();
    let rest = proc.rest().join("\n");
    assert_eq!(code, LEASE_LOST, "{rest}");
    // Named as such, and as what it is: no renewal was due.
    assert!(
        rest.contains("--hold-at-most 2s ended the lease on \"report\""),
        "{rest}"
    );
    assert!(!rest.contains("renewal not confirmed"), "{rest}");
    // The command exited 0 on its SIGTERM: the exit code is the loss's.
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "got-TERM");
    // Written once, with exp = acq + D; never renewed.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let doc = runtime.block_on(async {
        let leases = env.leases().await;
        leases.find_one(doc! { "_id": "report" }).await.unwrap()
    });
    let doc = doc.expect("the lock document");
    let acq = doc.get_datetime("acq").unwrap().timestamp_millis();
    let ts = doc.get_datetime("ts").unwrap().timestamp_millis();
    assert_eq!(ts, acq, "never renewed: {doc:?}");
}

#[test]
fn a_hold_at_most_not_longer_than_the_safety_margin_is_bad_usage() {
    let env = Env::new("cli_at_most_bad");
    // The safety margin: --ttl / 10 + --grace = 1.2 s.
    let out = env.run(&[
        "exec",
        "--key",
        "report",
        "--ttl",
        "2s",
        "--grace",
        "1s",
        "--hold-at-most",
        "1s",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--hold-at-most 1s is too short"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_payload_is_written_with_the_term_and_never_missing() {
    let env = Env::new("cli_leader_payload");
    let observer = env.manager(Duration::from_secs(10)).await;
    let mut changes = observer.observe("scheduler").await.unwrap();
    let first = within(WAIT, "the first state", changes.recv()).await;
    assert!(matches!(first, Some(Ok(None))), "{first:?}");
    let out = tokio::task::spawn_blocking({
        let cmd = env.cmd(&[
            "leader",
            "--name",
            "scheduler",
            "--payload",
            r#"{"addr":"10.0.0.7:8080"}"#,
            "--once",
            "--",
            "true",
        ]);
        move || {
            let mut cmd = cmd;
            cmd.output().unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Every state the observer saw with a leader has its payload, up to
    // its resignation.
    let mut leaders = 0;
    loop {
        let change = within(WAIT, "the next change", changes.recv()).await;
        let info = change.expect("the stream goes on").unwrap();
        match info {
            Some(info) if info.held => {
                assert_eq!(
                    info.payload,
                    Some(doc! { "addr": "10.0.0.7:8080" }),
                    "{info:?}"
                );
                leaders += 1;
            }
            _ if leaders > 0 => break,
            _ => {}
        }
    }
    observer.shutdown().await.unwrap();
}
