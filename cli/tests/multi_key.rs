//! `mongo-lease exec --key A --key B -- CMD` against a real `mongod`, in
//! several processes: every key held while the command runs, or none; the
//! keys and fencing tokens in its environment, one per line; the loss of
//! one key ends the command (exit 76); execs over the same keys in
//! opposite orders all run.

mod common;

use std::time::Duration;

use common::cli::{Env, LEASE_LOST, NOT_ACQUIRED, Proc, USAGE, stderr};

/// Hang guard: every wait here takes well under a few seconds.
const GUARD: Duration = Duration::from_secs(120);

/// `exec` over `keys` running `script` under sh.
fn exec<'a>(keys: &[&'a str], flags: &[&'a str], script: &'a str) -> Vec<&'a str> {
    // Told of a force release at once, not at the next heartbeat.
    let mut args = vec!["--watch-held-leases", "exec"];
    for key in keys {
        args.extend_from_slice(&["--key", key]);
    }
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    args
}

/// Prints the environment's keys and tokens on one line each (newlines as
/// `,`), then waits until `go` exists.
fn report_and_wait(go: &std::path::Path) -> String {
    format!(
        "printf 'keys=%s\\n' \"$(printf '%s' \"$MONGO_LEASE_KEY\" | tr '\\n' ,)\"; \
         printf 'tokens=%s\\n' \"$(printf '%s' \"$MONGO_LEASE_TOKEN\" | tr '\\n' ,)\"; \
         end=$(( $(date +%s) + {guard} )); \
         until [ -e '{go}' ]; do [ \"$(date +%s)\" -ge \"$end\" ] && exit 3; sleep 0.01; done",
        guard = GUARD.as_secs(),
        go = go.display()
    )
}

#[test]
fn exec_holds_every_key_while_its_command_runs_and_lists_them() {
    let env = Env::new("cli_multi");
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = report_and_wait(&go);
    let holder: Proc = env.spawn(&exec(&["b", "c", "a"], &[], &script));
    let keys = holder.expect_line("keys=");
    assert_eq!(keys, "keys=a,b,c", "in the order taken, one per line");
    let tokens = holder.expect_line("tokens=");
    let tokens: Vec<u64> = tokens["tokens=".len()..]
        .split(',')
        .map(|t| t.parse().expect("a fencing token"))
        .collect();
    assert_eq!(tokens.len(), 3, "a fencing token per key, same order");

    // Each key is held: another exec of any one of them is refused, and so
    // is one over a free key and a held one (which takes neither).
    for keys in [&["a"][..], &["c"], &["b", "z"]] {
        let out = env.run(&exec(keys, &["--no-wait"], "true"));
        assert_eq!(
            out.status.code(),
            Some(NOT_ACQUIRED),
            "{keys:?}: {}",
            stderr(&out)
        );
    }
    let out = env.run(&exec(&["z"], &["--no-wait"], "true"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "z was given back: {}",
        stderr(&out)
    );

    std::fs::write(&go, "").unwrap();
    let mut holder = holder;
    assert_eq!(holder.wait_within(GUARD), 0);
    let out = env.run(&exec(&["a", "b", "c"], &["--no-wait"], "true"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "released together: {}",
        stderr(&out)
    );
}

#[test]
fn losing_one_key_ends_the_command_with_exit_76() {
    let env = Env::new("cli_multi_loss");
    let dir = tempfile::tempdir().unwrap();
    let script = report_and_wait(&dir.path().join("never"));
    let mut holder = env.spawn(&exec(&["a", "b"], &["--grace", "1s"], &script));
    holder.expect_line("keys=a,b");
    let out = env.run(&["release", "b", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(holder.wait_within(GUARD), LEASE_LOST);
    // The other key was released with the group.
    let out = env.run(&exec(&["a"], &["--no-wait"], "true"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn execs_over_the_same_keys_in_opposite_orders_all_run() {
    let env = Env::new("cli_multi_order");
    let orders = [["x", "y"], ["y", "x"], ["y", "x"], ["x", "y"]];
    let mut execs: Vec<Proc> = Vec::new();
    for order in &orders {
        execs.push(env.spawn(&exec(order, &[], "sleep 0.05")));
    }
    for exec in &mut execs {
        assert_eq!(exec.wait_within(GUARD), 0);
    }
}

#[test]
fn a_newline_in_one_of_several_keys_is_a_usage_error() {
    let env = Env::new("cli_multi_input");
    let out = env.run(&exec(&["a", "b\nc"], &[], "true"));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("newline"), "{}", stderr(&out));
    let out = env.run(&exec(&["a", "a"], &[], "true"));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
}
