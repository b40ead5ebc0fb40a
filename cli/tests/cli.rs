//! The `mongo-lease` binary against a real `mongod`, in several processes:
//! `exec` mutual exclusion, exit codes, lost leases, `list`, `release
//! --force`, bad input; the command's process group (its grandchildren end
//! with it on a loss, a forwarded signal or the death of `mongo-lease`, and
//! before the lease expires on the server); and leader election across
//! processes (exactly one leader, takeover after kill -9 and after a
//! cut-off, observers see every term); `usage/`: flock's and etcdctl's
//! habits (`-n`, `-w`, `-s`, `-c`, `lock`, `elect`), the progress line of a
//! waiting `exec` or `elect`, errors in the tool's terms, the standalone
//! server's warning, `--help`.

mod common;

#[path = "usage/docs.rs"]
mod docs;
// flock's and etcdctl's habits, progress while waiting, errors in the
// tool's terms: modules of this binary (one link for all of them).
#[path = "usage/errors.rs"]
mod errors;
#[path = "usage/flock.rs"]
mod flock;
#[path = "usage/hold.rs"]
mod hold;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cli::{
    Env, LEASE_LOST, NOT_ACQUIRED, Proc, UNAVAILABLE, USAGE, WAIT, exits_within, pid_in, stderr,
    stdout, token_of,
};
use futures::StreamExt;
use mongo_lease::Election;
use serde_json::Value;

// ----- exec ---------------------------------------------------------------------------

/// Two `exec` loops increment a counter file with a read-sleep-write script:
/// no increment is lost, and the critical sections never overlap.
#[test]
fn concurrent_execs_of_a_counter_script_never_interleave() {
    let env = Env::new("cli_counter");
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let log = dir.path().join("log");
    std::fs::write(&counter, "0").unwrap();
    let script = format!(
        "echo \"begin $MONGO_LEASE_TOKEN\" >> {log}; n=$(cat {c}); sleep 0.05; \
         echo $((n + 1)) > {c}; echo \"end $MONGO_LEASE_TOKEN\" >> {log}",
        c = counter.display(),
        log = log.display()
    );
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let script = script.clone();
            let (uri, db) = (env.uri.clone(), env.db.clone());
            std::thread::spawn(move || {
                let env = Env {
                    uri,
                    db,
                    clients: Default::default(),
                };
                for _ in 0..5 {
                    let out = env.run(&["exec", "--key", "counter", "--", "sh", "-c", &script]);
                    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "10");
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 20);
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        let (begin, end) = (&pair[0], &pair[1]);
        assert!(
            begin.starts_with("begin ") && end.starts_with("end "),
            "{lines:?}"
        );
        let token = token_of(begin);
        assert_eq!(token, token_of(end), "interleaved: {lines:?}");
        assert!(token > last_token, "tokens increase: {lines:?}");
        last_token = token;
    }
}

/// The command's exit code and environment; 127 for a missing command.
#[test]
fn exec_passes_the_environment_and_exit_code_through() {
    let env = Env::new("cli_exit");
    let out = env.run(&[
        "exec",
        "--key",
        "k",
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        "echo \"$MONGO_LEASE_KEY|$MONGO_LEASE_TOKEN|$MONGO_LEASE_OWNER\"; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let printed = stdout(&out);
    let fields: Vec<&str> = printed.trim().split('|').collect();
    assert_eq!(fields[0], "k");
    assert!(fields[1].parse::<u64>().unwrap() > 0);
    assert!(
        fields[2].contains(':'),
        "owner id HOST:PID:RANDOM: {printed}"
    );
    let out = env.run(&["exec", "--key", "k", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = env.run(&["exec", "--key", "k", "--", "/nonexistent/command"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(stderr(&out).contains("cannot run"), "{}", stderr(&out));
    // The lease is released after each run.
    let out = env.run(&["list", "--json"]);
    let leases: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(leases[0]["held"], Value::Bool(false), "{leases}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_not_acquired_with_no_wait_or_timeout() {
    let env = Env::new("cli_held");
    let manager = env.manager(Duration::from_secs(10)).await;
    let lease = manager.acquire("busy").await.unwrap();

    let out = env.run(&["exec", "--key", "busy", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED));
    assert!(
        stderr(&out).contains(manager.owner_id()),
        "{}",
        stderr(&out)
    );

    let started = Instant::now();
    let out = env.run(&[
        "--json",
        "exec",
        "--key",
        "busy",
        "--timeout",
        "300ms",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["acquired"], Value::Bool(false));
    assert_eq!(report["holder"]["owner_id"], manager.owner_id());
    assert_eq!(report["holder"]["fencing_token"], lease.fencing_token());

    // Waiting (the default) gets it once it is released. The timed-out
    // attempt above marked the lease as waited for: clear the mark, so that
    // a new one shows the waiting process's own attempt.
    env.leases()
        .await
        .update_one(
            mongodb::bson::doc! { "_id": "busy" },
            mongodb::bson::doc! { "$unset": { "wt": "" } },
        )
        .await
        .unwrap();
    let mut waiting = env.spawn(&[
        "exec",
        "--key",
        "busy",
        "--",
        "sh",
        "-c",
        "echo got it $MONGO_LEASE_TOKEN",
    ]);
    env.wait_for_waiting_mark("busy").await;
    assert!(waiting.child.try_wait().unwrap().is_none(), "still waiting");
    let token = lease.fencing_token();
    assert!(!lease.release().await.unwrap().was_lost());
    assert!(token_of(&waiting.expect_line("got it")) > token);
    assert_eq!(waiting.wait(), 0);
    manager.shutdown().await.unwrap();
}

/// `release --force` from another process takes the lease away: the command
/// gets SIGTERM (or SIGKILL after --grace) and `exec` exits with 76.
#[test]
fn a_lost_lease_terminates_the_command_and_exits_with_its_own_code() {
    let env = Env::new("cli_lost");
    let mut polite = env.spawn(&[
        "exec",
        "--key",
        "job",
        "--ttl",
        "2s",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        "trap 'echo got TERM; exit 0' TERM; echo working; while true; do sleep 0.05; done",
    ]);
    polite.expect_line("working");
    let out = env.run(&["release", "job", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("released \"job\""),
        "{}",
        stdout(&out)
    );
    polite.expect_line("got TERM");
    polite.expect_line("was lost");
    assert_eq!(polite.wait(), LEASE_LOST);

    let mut stubborn = env.spawn(&[
        "exec",
        "--key",
        "job",
        "--ttl",
        "2s",
        "--grace",
        "300ms",
        "--",
        "sh",
        "-c",
        "trap 'echo ignoring TERM' TERM; echo working; while true; do sleep 0.05; done",
    ]);
    stubborn.expect_line("working");
    let out = env.run(&["--json", "release", "job", "--force"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["released"], Value::Bool(true));
    stubborn.expect_line("ignoring TERM");
    assert_eq!(stubborn.wait(), LEASE_LOST, "killed after the grace period");

    let out = env.run(&["release", "job", "--force"]);
    assert!(stdout(&out).contains("was not held"), "{}", stdout(&out));
}

/// SIGTERM to `mongo-lease exec` is forwarded; it exits with the command's code.
#[test]
fn signals_are_forwarded_to_the_command() {
    let env = Env::new("cli_signal");
    let mut proc = env.spawn(&[
        "exec",
        "--key",
        "k",
        "--",
        "sh",
        "-c",
        "trap 'echo got TERM; exit 5' TERM; echo working; while true; do sleep 0.05; done",
    ]);
    proc.expect_line("working");
    proc.signal(libc::SIGTERM);
    proc.expect_line("got TERM");
    assert_eq!(proc.wait(), 5);
}

#[test]
fn list_shows_holders_with_server_time_age_and_expiry() {
    let env = Env::new("cli_list");
    let _holder = env.spawn(&[
        "exec",
        "--key",
        "report",
        "--ttl",
        "20s",
        "--",
        "sh",
        "-c",
        "echo holding; sleep 30",
    ]);
    _holder.expect_line("holding");
    let out = env.run(&["list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let leases: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lease = &leases.as_array().unwrap()[0];
    assert_eq!(lease["key"], "report");
    assert_eq!(lease["held"], Value::Bool(true));
    assert!(lease["fencing_token"].as_u64().unwrap() > 0);
    assert!(lease["owner_id"].as_str().unwrap().contains(':'));
    let age = lease["age_ms"].as_u64().unwrap();
    let ttl_left = lease["time_to_expiry_ms"].as_u64().unwrap();
    assert!(age < 10_000, "{lease}");
    assert!(ttl_left > 10_000 && ttl_left <= 20_000, "{lease}");
    let expires: humantime::Timestamp = lease["expires_at"].as_str().unwrap().parse().unwrap();
    let now: humantime::Timestamp = lease["server_time"].as_str().unwrap().parse().unwrap();
    let expires: std::time::SystemTime = expires.into();
    let now: std::time::SystemTime = now.into();
    assert_eq!(
        expires.duration_since(now).unwrap().as_millis() as u64,
        ttl_left
    );

    let out = env.run(&["list"]);
    let text = stdout(&out);
    assert!(text.starts_with("KEY"), "{text}");
    assert!(text.contains("report") && text.contains("held"), "{text}");
    let out = env.run(&["list", "--held", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn bad_input_fails_with_clear_errors_and_never_prints_credentials() {
    let env = Env::new("cli_bad");
    let out = env.run(&["exec", "--key", "k", "--ttl", "3 parsecs", "--", "true"]);
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(stderr(&out).contains("--ttl"), "{}", stderr(&out));

    let out = env.run(&["exec", "--key", "k", "--ttl", "5ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));

    // The command could not be stopped before the lease's expiry.
    let out = env.run(&[
        "exec", "--key", "k", "--ttl", "2s", "--grace", "2s", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("raise --ttl to at least 4s"),
        "{}",
        stderr(&out)
    );

    let out = env.run(&["exec", "--key", "k"]);
    assert_eq!(out.status.code(), Some(USAGE), "a command is required");

    let out = env.run(&["exec", "--key", "", "--", "true"]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));

    let out = env.run(&["release", "k"]);
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(stderr(&out).contains("--force"));

    let out = env.run(&["leader", "--name", "n", "--payload", "[1]", "--", "true"]);
    assert_eq!(out.status.code(), Some(USAGE));

    let out = env
        .cmd(&["list"])
        .env_remove("MONGODB_URI")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(stderr(&out).contains("MONGODB_URI"));

    let out = env
        .cmd(&["list"])
        .env("MONGODB_URI", "mongodb://admin:hunter2secret@/nohost")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(!stderr(&out).contains("hunter2secret"), "{}", stderr(&out));

    let out = env
        .cmd(&["--connect-timeout", "300ms", "list"])
        .env(
            "MONGODB_URI",
            "mongodb://admin:hunter2secret@127.0.0.1:1/?directConnection=true",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    assert!(!stderr(&out).contains("hunter2secret"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Connection refused"),
        "names the cause: {}",
        stderr(&out)
    );

    let out = env.run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    for code in ["69", "75", "76", "127"] {
        assert!(help.contains(code), "exit code {code} documented: {help}");
    }
}

// ----- the command's process group ------------------------------------------------------

/// How the test ends the lease a command runs under.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `release KEY --force` from another process: the lease is lost.
    ForceRelease,
    /// SIGTERM to `mongo-lease`, which forwards it.
    Term,
    /// SIGKILL of `mongo-lease`, which can do nothing about it.
    Kill,
}

/// Runs `args` (an `exec` or `leader` of key or election `k`) with a
/// command that starts a grandchild (`sleep` in the background of `sh`),
/// ends it as `ending` says, and checks that the grandchild dies: the
/// kernel tells its exit through a pidfd (WAIT, over 10x the milliseconds
/// it takes, only turns a survivor into a failure). Returns the exit code of
/// `mongo-lease`.
fn grandchild_dies_when(args: &[&str], ending: Ending) -> i32 {
    let env = Env::new("cli_group");
    let dir = tempfile::tempdir().unwrap();
    let grandchild = dir.path().join("grandchild");
    let script = format!(
        "sleep 300 & echo $! > {}; echo ready; wait",
        grandchild.display()
    );
    // Told of a force release at once, not at the next heartbeat.
    let mut args = [&["--watch-held-leases"][..], args].concat();
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let mut proc = env.spawn(&args);
    proc.expect_line("ready");
    let pid = pid_in(&grandchild);
    match ending {
        Ending::ForceRelease => {
            let out = env.run(&["release", "k", "--force"]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        }
        Ending::Term => proc.signal(libc::SIGTERM),
        Ending::Kill => proc.signal(libc::SIGKILL),
    }
    assert!(
        exits_within(pid, WAIT),
        "{ending:?}: the command's grandchild {pid} still runs"
    );
    proc.wait()
}

#[test]
fn exec_a_lost_lease_ends_the_commands_grandchildren() {
    let code = grandchild_dies_when(&["exec", "--key", "k"], Ending::ForceRelease);
    assert_eq!(code, LEASE_LOST);
}

#[test]
fn exec_a_forwarded_sigterm_reaches_the_commands_grandchildren() {
    let code = grandchild_dies_when(&["exec", "--key", "k"], Ending::Term);
    assert_eq!(code, 128 + libc::SIGTERM, "the command's own code");
}

#[test]
fn exec_killed_takes_the_commands_grandchildren_with_it() {
    grandchild_dies_when(&["exec", "--key", "k"], Ending::Kill);
}

#[test]
fn leader_a_lost_leadership_ends_the_commands_grandchildren() {
    let code = grandchild_dies_when(&["leader", "--name", "k", "--once"], Ending::ForceRelease);
    assert_eq!(code, LEASE_LOST);
}

#[test]
fn leader_a_forwarded_sigterm_reaches_the_commands_grandchildren() {
    let code = grandchild_dies_when(&["leader", "--name", "k"], Ending::Term);
    assert_eq!(code, 128 + libc::SIGTERM, "the command's own code");
}

#[test]
fn leader_killed_takes_the_commands_grandchildren_with_it() {
    grandchild_dies_when(&["leader", "--name", "k"], Ending::Kill);
}

/// A command stopped in its group (as one that reads the terminal from a
/// background group is, by SIGTTIN) still ends on a forwarded SIGTERM,
/// which SIGCONT follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_sigterm_ends_a_stopped_command() {
    let env = Env::new("cli_stopped");
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!(
        "echo $$ > {}; echo ready; kill -STOP $$; echo continued",
        pid_file.display()
    );
    let mut proc = env.spawn(&["exec", "--key", "k", "--", "sh", "-c", &script]);
    proc.expect_line("ready");
    let pid = pid_in(&pid_file);
    let stat = format!("/proc/{pid}/stat");
    common::eventually("the command is stopped", WAIT, || async {
        let stat = std::fs::read_to_string(&stat).unwrap_or_default();
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('T')
    })
    .await;
    proc.signal(libc::SIGTERM);
    assert!(
        exits_within(pid, WAIT),
        "the stopped command {pid} still runs"
    );
    assert_eq!(proc.wait(), 128 + libc::SIGTERM);
}

/// With the default --grace, a holder cut off from MongoDB (its proxy
/// blackholed) stops its command, which ignores SIGTERM, before the lease
/// expires on the server: when the next holder's command starts, neither
/// the first command nor its grandchild runs any more. Judged by what the
/// next command finds in /proc as it starts, not by durations; the first
/// command's exit, as a zombie not yet reaped, counts as gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_default_grace_a_cut_off_holders_command_is_gone_before_the_next_holder_starts() {
    use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
    let rs = ReplicaSet::start(ReplicaSetOptions::default().proxied(true))
        .await
        .expect("a proxied replica set");
    let db = mongo_lease::testkit::unique_name("cli_grace");
    // The holder reaches the server through the proxy, the next holder directly.
    let holder_env = Env {
        uri: rs.uri(),
        db: db.clone(),
        clients: Default::default(),
    };
    let next_env = Env {
        uri: rs.member_uri(0),
        db,
        clients: Default::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    let (pid, grandchild) = (dir.path().join("pid"), dir.path().join("grandchild"));
    let stubborn = format!(
        "trap '' TERM; sleep 300 & echo $! > {g}; echo $$ > {p}; echo ready; wait",
        g = grandchild.display(),
        p = pid.display()
    );
    let check = format!(
        "for p in $(cat {p}) $(cat {g}); do \
           s=$(awk '{{print $3}}' /proc/$p/stat 2>/dev/null); \
           if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo \"alive $p\"; else echo \"gone $p\"; fi; \
         done; echo checked",
        g = grandchild.display(),
        p = pid.display()
    );
    let ttl = Duration::from_secs(4);
    let holder = holder_env.spawn(&[
        "exec", "--key", "k", "--ttl", "4s", "--", "sh", "-c", &stubborn,
    ]);
    holder.expect_line("ready");
    let next = next_env.spawn(&[
        "exec", "--key", "k", "--ttl", "4s", "--", "sh", "-c", &check,
    ]);
    next_env.wait_for_waiting_mark("k").await;
    rs.proxy(0).blackhole();
    // Bounded by 10x the TTL after which the next holder acquires.
    next.expect_line_within("checked", 10 * ttl);
    let mut found = Vec::new();
    for pid in [pid_in(&pid), pid_in(&grandchild)] {
        found.push(next.expect_line(&format!(" {pid}")));
    }
    assert!(
        found.iter().all(|l| l.starts_with("gone")),
        "the first holder's command when the next one started: {found:?}"
    );
    drop(holder);
    drop(next);
    rs.proxy(0).heal();
}

// ----- leader election across processes -------------------------------------------------

fn leader_args<'a>(name: &'a str, script: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["leader", "--name", name, "--ttl", "2s"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    args
}

/// Four candidate processes take turns (each leader runs a short command,
/// resigns, campaigns again): their commands never overlap, terms increase,
/// and an observer in this process sees every term, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_leader_among_candidate_processes_and_observers_see_every_term() {
    let env = Env::new("cli_leaders");
    let watcher = env.manager(Duration::from_secs(2)).await;
    let mut observer = Election::new(&watcher, "svc")
        .unwrap()
        .observe()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo \"begin $MONGO_LEASE_TOKEN\" >> {log}; sleep 0.1; echo \"end $MONGO_LEASE_TOKEN\" >> {log}",
        log = log.display()
    );
    let candidates: Vec<Proc> = (0..4)
        .map(|_| env.spawn(&leader_args("svc", &script, &["--restart-delay", "50ms"])))
        .collect();
    let terms_logged = |log: &Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("end"))
            .count()
    };
    // Terms seen by the observer. Once it saw the 13th, the first 12 ended
    // (a term ends when its command exits), so their commands logged both lines.
    let mut seen = Vec::new();
    let mut next_term = async || loop {
        let leader = tokio::time::timeout(WAIT, observer.next())
            .await
            .expect("an observed change")
            .unwrap()
            .unwrap();
        if let Some(leader) = leader {
            return leader.term;
        }
    };
    while seen.len() < 13 {
        seen.push(next_term().await);
    }
    assert!(terms_logged(&log) >= 12, "too few terms");
    for candidate in &candidates {
        candidate.signal(libc::SIGTERM);
    }
    for mut candidate in candidates {
        let code = candidate.wait();
        assert!(code == 0 || code == 128 + libc::SIGTERM, "exit code {code}");
    }
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // begin/end pairs of one term each; the last command may have been
    // stopped by the SIGTERM before its end.
    let mut terms = Vec::new();
    for pair in lines.chunks(2) {
        assert!(pair[0].starts_with("begin"), "overlap: {lines:?}");
        let term = token_of(&pair[0]);
        if let Some(end) = pair.get(1) {
            assert!(end.starts_with("end"), "overlap: {lines:?}");
            assert_eq!(term, token_of(end), "overlap: {lines:?}");
        }
        assert!(terms.last().is_none_or(|&t| term > t), "{lines:?}");
        terms.push(term);
    }
    while seen.len() < terms.len() {
        seen.push(next_term().await);
    }
    // Every logged term, in order. The observer may also have seen a last
    // term whose leader got the SIGTERM before its command logged anything.
    assert_eq!(seen[..terms.len()], terms, "every term, in order");
    watcher.shutdown().await.unwrap();
}

/// kill -9 of the leader's process: its command dies with it, and another
/// candidate leads once the lease expires (TTL 2 s).
#[test]
fn a_killed_leader_is_replaced_after_its_ttl() {
    let env = Env::new("cli_kill");
    let script = "echo \"leading $MONGO_LEASE_TOKEN\"; exec sleep 60";
    let mut first = env.spawn(&leader_args("svc", script, &[]));
    let first_term = token_of(&first.expect_line("leading"));
    let second = env.spawn(&leader_args("svc", script, &[]));
    // The second candidate campaigns: its attempt marked the leader's lease.
    env.wait_for_waiting_mark_blocking("svc");
    first.signal(libc::SIGKILL);
    first.wait();
    let killed_at = Instant::now();
    // Bounded by `expect_line` (WAIT, 10x the 2 s TTL after which it leads).
    let second_term = token_of(&second.expect_line("leading"));
    eprintln!("took over {:?} after the kill", killed_at.elapsed());
    assert!(second_term > first_term);
    // The first leader's command died with it (parent-death signal).
    let out = Command::new("pgrep")
        .args(["-f", &format!("leading {first_term}")])
        .output()
        .unwrap();
    assert!(out.stdout.is_empty(), "orphaned command");
}

/// SIGSTOP of the leader's process (a cut-off): its lease expires and
/// another candidate leads; when it resumes, it learns it lost leadership
/// and terminates its command.
#[test]
fn a_cut_off_leader_is_replaced_and_stops_its_command_when_it_resumes() {
    let env = Env::new("cli_stop");
    let script = "trap 'echo \"stopping $MONGO_LEASE_TOKEN\"; exit 0' TERM; \
                  echo \"leading $MONGO_LEASE_TOKEN\"; while true; do sleep 0.05; done";
    let first = env.spawn(&leader_args("svc", script, &["--once"]));
    let first_term = token_of(&first.expect_line("leading"));
    let second = env.spawn(&leader_args("svc", script, &[]));
    first.signal(libc::SIGSTOP);
    let second_term = token_of(&second.expect_line("leading"));
    assert!(second_term > first_term);
    first.signal(libc::SIGCONT);
    assert_eq!(token_of(&first.expect_line("stopping")), first_term);
    let mut first = first;
    assert_eq!(first.wait(), LEASE_LOST, "--once: leadership lost");
}
