//! `release KEY --request` (a cooperative revocation, docs/revocation.md):
//! an `exec` holding the key passes the request to its command as SIGTERM,
//! or the signal of `--on-revocation`; the command decides when to exit.

mod common;

use common::cli::{Env, USAGE, stderr, stdout};

/// A command that exits 0 on `signal`, saying so.
fn trapping(signal: &str) -> String {
    format!(
        "trap 'echo got {signal}; exit 0' {signal}; echo working; while true; do sleep 0.05; done"
    )
}

#[test]
fn a_release_request_signals_execs_command_which_exits_and_releases() {
    let env = Env::new("cli_revocation");
    let script = trapping("TERM");
    // Told by its stream of writes, at once.
    let mut holder = env.spawn(&[
        "--watch-held-leases",
        "exec",
        "--key",
        "job",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    holder.expect_line("working");
    let out = env.run(&["release", "job", "--request"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("asked the holders of \"job\""),
        "{}",
        stdout(&out)
    );
    holder.expect_line("got TERM");
    assert_eq!(holder.wait(), 0, "the command's own exit code");
    // Released by its holder: free at once, nothing more to ask.
    let out = env.run(&["--json", "release", "job", "--request"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["requested"], serde_json::Value::Bool(false));
    let out = env.run(&["exec", "--key", "job", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // Another signal; by default the holder reads requests at its
    // heartbeat (under a second with a 3 s TTL).
    let script = trapping("USR1");
    let mut holder = env.spawn(&[
        "exec",
        "--key",
        "job",
        "--ttl",
        "3s",
        "--on-revocation",
        "USR1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    holder.expect_line("working");
    env.run(&["release", "job", "--request"]);
    holder.expect_line("got USR1");
    assert_eq!(holder.wait(), 0);

    // Several keys: a request for any of them (here the last taken).
    let script = trapping("TERM");
    let mut holder = env.spawn(&[
        "exec", "--key", "job", "--key", "zeta", "--ttl", "3s", "--", "sh", "-c", &script,
    ]);
    holder.expect_line("working");
    env.run(&["release", "zeta", "--request"]);
    holder.expect_line("got TERM");
    assert_eq!(holder.wait(), 0);

    // Bad input.
    let out = env.run(&["release", "job", "--request", "--force"]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    let out = env.run(&[
        "exec",
        "--key",
        "job",
        "--on-revocation",
        "KILLME",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("--on-revocation"), "{}", stderr(&out));
}
