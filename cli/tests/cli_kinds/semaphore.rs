//! `exec --permits N`: a semaphore key across processes.

use serde_json::Value;

use crate::common::cli::{Env, KIND_MISMATCH, LEASE_LOST, Proc, stderr, stdout, token_of};
use crate::support::{Files, GUARD, at, exec_args, quoted};

/// Six concurrent `exec --permits 2`: each command logs `+ID`, waits until
/// two commands are inside at once (or all six have entered, for the last
/// ones), then logs `-ID`. Replaying the log, never more than two are
/// inside, two are at some point, and all six ran.
#[test]
fn six_execs_with_two_permits_never_run_more_than_two_at_a_time_and_all_run() {
    let env = Env::new("cli_permits");
    let files = Files::new();
    let log = files.log();
    let inside = format!(
        "[ $(( $(grep -c '^+' {log}) - $(grep -c '^-' {log}) )) -ge 2 ] \
         || [ $(grep -c '^+' {log}) -ge 6 ]"
    );
    let scripts: Vec<String> = (0..6)
        .map(|id| {
            format!(
                "{enter}; {wait}; {leave}",
                enter = files.append(&format!(
                    "+{id} $MONGO_LEASE_KIND $MONGO_LEASE_PERMITS $MONGO_LEASE_TOKEN"
                )),
                wait = files.wait_until(&inside),
                leave = files.append(&format!("-{id}")),
            )
        })
        .collect();
    let mut execs: Vec<Proc> = scripts
        .iter()
        .map(|script| env.spawn(&exec_args("pool", &["--permits", "2"], script)))
        .collect();
    for exec in &mut execs {
        assert_eq!(exec.wait_within(GUARD), 0, "every exec ran its command");
    }
    let lines = files.lines();
    let (mut now, mut most) = (0, 0);
    let mut tokens = Vec::new();
    for line in &lines {
        if line.starts_with('+') {
            now += 1;
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields[1..3], ["permit", "2"], "environment: {line}");
            tokens.push(token_of(line));
        } else {
            now -= 1;
        }
        most = most.max(now);
        assert!(now <= 2, "more than two inside: {lines:?}");
    }
    assert_eq!(most, 2, "two inside at once: {lines:?}");
    for id in 0..6 {
        assert!(
            lines.iter().position(|l| l.starts_with(&format!("+{id} ")))
                < Some(at(&lines, &format!("-{id}"))),
            "{id} entered, then left: {lines:?}"
        );
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 6, "a fencing token each: {lines:?}");
}

/// While permits are held, an `exec` asking for another number of permits,
/// or for another kind, fails at once, waiting or not, with its own exit
/// code and a message naming both kinds and the flag to pass; one asking
/// for the same number takes a free permit.
#[test]
fn another_kind_or_number_of_permits_fails_with_its_own_exit_code() {
    let env = Env::new("cli_mismatch");
    let files = Files::new();
    let hold = format!(
        "echo holding; {}",
        files.wait_until(&format!("[ -e {} ]", quoted(&files.path("done"))))
    );
    let mut holder = env.spawn(&exec_args("pool", &["--permits", "2"], &hold));
    holder.expect_line("holding");

    for (flags, requested) in [
        (&["--permits", "3", "--no-wait"][..], "permit of 3"),
        (&["--permits", "3"][..], "permit of 3"),
        (&["--no-wait"][..], "exclusive"),
        (&["--shared"][..], "shared"),
    ] {
        let out = env.run(&exec_args("pool", flags, "echo ran"));
        assert_eq!(
            out.status.code(),
            Some(KIND_MISMATCH),
            "{flags:?}: {}",
            stderr(&out)
        );
        assert!(!stdout(&out).contains("ran"), "{}", stdout(&out));
        let message = stderr(&out);
        assert!(
            message.contains("permit of 2") && message.contains(requested),
            "{flags:?}: {message}"
        );
        assert!(
            message.contains("--permits 2"),
            "says what to pass: {message}"
        );
    }

    let out = env.run(&exec_args(
        "pool",
        &["--permits", "2", "--no-wait"],
        "echo ran",
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ran");

    files.touch("done");
    assert_eq!(holder.wait_within(GUARD), 0);
}

/// `release --force` of a semaphore key takes every permit away: it names
/// each holder, and each holder's command is terminated (exit 76).
#[test]
fn release_force_of_a_semaphore_key_names_every_holder_and_ends_their_commands() {
    let env = Env::new("cli_release_kinds");
    let hold = "echo \"holding $MONGO_LEASE_OWNER $MONGO_LEASE_TOKEN\"; \
                while true; do sleep 0.05; done";
    let mut holders: Vec<Proc> = (0..2)
        .map(|_| env.spawn(&exec_args("pool", &["--permits", "2"], hold)))
        .collect();
    let seen: Vec<(String, u64)> = holders
        .iter()
        .map(|proc| {
            let line = proc.expect_line("holding");
            (
                line.split_whitespace().nth(1).unwrap().into(),
                token_of(&line),
            )
        })
        .collect();
    let out = env.run(&["--json", "release", "pool", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["released"], true, "{report}");
    assert_eq!(report["kind"], "permit", "{report}");
    let mut released: Vec<(String, u64)> = report["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["owner_id"].as_str().unwrap().to_string(),
                h["fencing_token"].as_u64().unwrap(),
            )
        })
        .collect();
    released.sort();
    let mut seen = seen;
    seen.sort();
    assert_eq!(released, seen, "every holder named");
    for proc in &mut holders {
        proc.expect_line("was lost");
        assert_eq!(proc.wait_within(GUARD), LEASE_LOST);
    }
}
