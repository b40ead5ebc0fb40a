//! The kinds of lease of `mongo-lease exec` against a real `mongod`, in
//! several processes: `--permits N` (a semaphore key), `--shared` (the
//! shared side of a read/write key), `--hold-at-least`, `list` showing each
//! kind, `release --force` of a semaphore key, kind mismatches and bad
//! flags. The commands rendezvous through files they append
//! to under flock(1) and poll; the verdicts read the order of the log, never
//! how long something took.

mod common;

use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use common::cli::{
    Env, KIND_MISMATCH, LEASE_LOST, NOT_ACQUIRED, Proc, USAGE, stderr, stdout, token_of,
};
use mongodb::bson::{Document, doc};
use serde_json::Value;

/// Hang guard of the waits of these tests and of their commands' polling
/// loops: every wait here takes well under a few seconds.
const GUARD: Duration = Duration::from_secs(120);

/// A directory of files for the commands: the log they append to, and the
/// files the test creates to let them go on.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The log's path, quoted for sh.
    fn log(&self) -> String {
        quoted(&self.path("log"))
    }

    /// Shell code appending `line` (expanded by sh) to the log under
    /// flock(1).
    fn append(&self, line: &str) -> String {
        format!(
            "flock {lock} sh -c \"echo {line} >> {log}\"",
            lock = quoted(&self.path("log.lock")),
            log = self.log()
        )
    }

    /// Appends `line` to the log from the test, as the commands do.
    fn append_now(&self, line: &str) {
        let status = Command::new("sh")
            .arg("-c")
            .arg(self.append(line))
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Shell code that polls until `condition` (a sh condition) holds, and
    /// exits 3 if it does not within [`GUARD`] (a hang, not a verdict).
    fn wait_until(&self, condition: &str) -> String {
        format!(
            "end=$(( $(date +%s) + {guard} )); \
             until {condition}; do \
               [ \"$(date +%s)\" -ge \"$end\" ] && exit 3; sleep 0.01; \
             done",
            guard = GUARD.as_secs()
        )
    }

    /// The log's lines so far.
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits (bounded by [`GUARD`]) until the log has a line starting with
    /// `prefix`, failing at once if one of `execs` exits meanwhile.
    fn wait_for_line(&self, prefix: &str, execs: &mut [Proc]) {
        wait_for(&format!("a line {prefix:?} in the log"), execs, || {
            self.lines().iter().any(|l| l.starts_with(prefix))
        });
    }

    /// Creates the file `name` (which commands poll for).
    fn touch(&self, name: &str) {
        std::fs::write(self.path(name), "").unwrap();
    }
}

/// Polls `check` until it holds; fails at once if one of `execs` (which
/// are to keep running meanwhile) has exited, and after [`GUARD`] (a hang).
fn wait_for(what: &str, execs: &mut [Proc], mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + GUARD;
    while !check() {
        for exec in execs.iter_mut() {
            if let Some(status) = exec.child.try_wait().unwrap() {
                panic!("an exec exited ({status}) before {what}");
            }
        }
        assert!(Instant::now() < deadline, "no {what} within {GUARD:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}

/// The index of the line `line` in `lines` (panics if absent).
fn at(lines: &[String], line: &str) -> usize {
    lines
        .iter()
        .position(|l| l == line)
        .unwrap_or_else(|| panic!("no line {line:?} in {lines:?}"))
}

/// The lock collection and the server's clock, read through a client of
/// this test's own single-threaded runtime (which owns the client and drops
/// its tasks with itself).
struct Server {
    leases: mongodb::Collection<Document>,
    db: mongodb::Database,
    runtime: tokio::runtime::Runtime,
}

impl Server {
    fn new(env: &Env) -> Server {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(mongodb::Client::with_uri_str(&env.uri))
            .unwrap();
        let db = client.database(&env.db);
        Server {
            leases: db.collection("leases"),
            db,
            runtime,
        }
    }

    /// The lock document of `key`, if any.
    fn doc(&self, key: &str) -> Option<Document> {
        self.runtime
            .block_on(self.leases.find_one(doc! { "_id": key }).into_future())
            .unwrap()
    }

    /// Waits (bounded) until the document of `key` has the field `field`,
    /// failing at once if one of `execs` exits meanwhile.
    fn wait_for_field(&self, key: &str, field: &str, execs: &mut [Proc]) {
        wait_for(&format!("{field:?} on {key:?}"), execs, || {
            self.doc(key).is_some_and(|d| d.contains_key(field))
        });
    }

    /// The server's `$$NOW`.
    fn now(&self) -> SystemTime {
        let reply = self
            .runtime
            .block_on(
                self.db
                    .run_command(doc! {
                        "aggregate": 1,
                        "pipeline": [{ "$documents": [{ "now": "$$NOW" }] }],
                        "cursor": {},
                    })
                    .into_future(),
            )
            .unwrap();
        reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .ok()
            .and_then(|batch| batch.first()?.as_document()?.get_datetime("now").ok())
            .unwrap_or_else(|| panic!("no $$NOW in {reply}"))
            .to_system_time()
    }
}

/// A time in `list --json` (RFC 3339).
fn parse_time(value: &Value) -> SystemTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {value}"));
    text.parse::<humantime::Timestamp>().unwrap().into()
}

/// `exec` args: `--key KEY`, `flags`, then `sh -c SCRIPT`.
fn exec_args<'a>(key: &'a str, flags: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut args = vec!["exec", "--key", key];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    args
}

// ----- semaphores ----------------------------------------------------------------------

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

// ----- shared and exclusive ------------------------------------------------------------

/// Two `exec --shared` run at once (each waits until the other has
/// entered); an exclusive `exec --no-wait` meanwhile exits 75; once they
/// exited, an exclusive `exec` runs.
#[test]
fn shared_holders_overlap_and_exclude_an_exclusive_one() {
    let env = Env::new("cli_shared");
    let files = Files::new();
    let log = files.log();
    let scripts: Vec<String> = ["a", "b"]
        .iter()
        .map(|id| {
            format!(
                "{enter}; {both}; {go}; {leave}",
                enter = files.append(&format!("+{id} $MONGO_LEASE_KIND")),
                both = files.wait_until(&format!("[ $(grep -c '^+' {log}) -ge 2 ]")),
                go = files.wait_until(&format!("[ -e {} ]", quoted(&files.path("go")))),
                leave = files.append(&format!("-{id}")),
            )
        })
        .collect();
    let mut shared: Vec<Proc> = scripts
        .iter()
        .map(|script| env.spawn(&exec_args("rw", &["--shared"], script)))
        .collect();
    files.wait_for_line("+a", &mut shared);
    files.wait_for_line("+b", &mut shared);

    let exclusive = files.append("+x $MONGO_LEASE_KIND $MONGO_LEASE_PERMITS");
    let out = env.run(&exec_args("rw", &["--no-wait"], &exclusive));
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{}", stderr(&out));
    assert!(stderr(&out).contains("held shared"), "{}", stderr(&out));

    files.touch("go");
    for exec in &mut shared {
        assert_eq!(exec.wait_within(GUARD), 0);
    }
    let out = env.run(&exec_args("rw", &[], &exclusive));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let lines = files.lines();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(
        lines[..2].concat().matches("shared").count(),
        2,
        "{lines:?}"
    );
    assert_eq!(
        lines[4], "+x exclusive",
        "the exclusive exec ran last: {lines:?}"
    );
}

/// A stream of overlapping `exec --shared` (each exits only once the next
/// one has entered) keeps the key shared; an exclusive `exec` then waits,
/// and marks the key (`xw`). From then on no shared exec enters (one
/// `--no-wait` exits 75, a waiting one enters only after the exclusive
/// command): the exclusive command runs once the holder of the moment exits.
#[test]
fn an_exclusive_waiter_gets_the_key_while_shared_acquirers_keep_arriving() {
    let env = Env::new("cli_writer");
    let server = Server::new(&env);
    let files = Files::new();
    let stop = quoted(&files.path("stop"));
    let log = files.log();
    // Shared command `i`: in, until the next one is in (or the test says
    // stop), out.
    let shared_script = |i: usize| {
        format!(
            "{enter}; {wait}; {leave}",
            enter = files.append(&format!("+s{i}")),
            wait = files.wait_until(&format!(
                "grep -q '^+s{next}$' {log} || [ -e {stop} ]",
                next = i + 1
            )),
            leave = files.append(&format!("-s{i}")),
        )
    };
    let mut execs = Vec::new();
    for i in 0..3 {
        let script = shared_script(i);
        execs.push(env.spawn(&exec_args("rw", &["--shared"], &script)));
        files.wait_for_line(&format!("+s{i}"), &mut execs[i..]);
    }
    let exclusive_script = format!("{}; {}", files.append("+x"), files.append("-x"));
    let mut exclusive = env.spawn(&exec_args("rw", &[], &exclusive_script));
    // The exclusive exec found the key shared and waits: its mark is on it.
    server.wait_for_field("rw", "xw", std::slice::from_mut(&mut exclusive));
    files.append_now("waiting");

    // Shared acquirers keep arriving, and are refused while it waits.
    let out = env.run(&exec_args("rw", &["--shared", "--no-wait"], "echo ran"));
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{}", stderr(&out));
    assert!(!stdout(&out).contains("ran"));
    let script = shared_script(3);
    execs.push(env.spawn(&exec_args("rw", &["--shared"], &script)));

    // The holder of the moment (s2) leaves; the exclusive command runs.
    files.touch("stop");
    assert_eq!(exclusive.wait_within(GUARD), 0, "the exclusive exec ran");
    for exec in &mut execs {
        assert_eq!(exec.wait_within(GUARD), 0);
    }

    let lines = files.lines();
    for i in 0..2 {
        assert!(
            at(&lines, &format!("+s{}", i + 1)) < at(&lines, &format!("-s{i}")),
            "the shared commands overlapped: {lines:?}"
        );
    }
    let (waiting, exclusive_in, exclusive_out) =
        (at(&lines, "waiting"), at(&lines, "+x"), at(&lines, "-x"));
    assert!(
        waiting < exclusive_in && exclusive_in + 1 == exclusive_out,
        "{lines:?}"
    );
    assert!(
        lines[waiting..exclusive_out]
            .iter()
            .all(|l| !l.starts_with("+s")),
        "no shared command entered while the exclusive exec waited: {lines:?}"
    );
    assert!(at(&lines, "+s3") > exclusive_out, "{lines:?}");
    eprintln!("log: {lines:?}");
}

// ----- holding at least ------------------------------------------------------------------

/// A job under `--hold-at-least 5s` that ends at once keeps the key until
/// `hl` (acquisition + 5 s by the server's clock): every `exec --no-wait`
/// that ended before then, by the server's `$$NOW` read after it, exits 75;
/// the one that succeeds acquired the key at `hl` or later.
#[test]
fn a_key_held_at_least_5s_is_refused_until_then_and_acquired_after() {
    let env = Env::new("cli_hold");
    let server = Server::new(&env);
    let out = env.run(&exec_args("nightly", &["--hold-at-least", "5s"], "true"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc = server.doc("nightly").expect("the job's lock document");
    let hold_until = doc.get_datetime("hl").unwrap().to_system_time();
    let acquired = doc.get_datetime("acq").unwrap().to_system_time();
    assert_eq!(
        hold_until.duration_since(acquired).unwrap(),
        Duration::from_secs(5)
    );

    // `$$NOW` of separate commands can step back by a few milliseconds
    // (docs/mongodb-behaviour.md, B3): an attempt counts as "before hl" or
    // "after hl" only with this margin.
    let margin = Duration::from_millis(100);
    let started = Instant::now();
    let mut attempts = Vec::new();
    let success = loop {
        let before = server.now();
        let out = env.run(&exec_args("nightly", &["--no-wait"], "echo ran"));
        let after = server.now();
        let code = out.status.code();
        attempts.push((before, after, code));
        match code {
            Some(0) => break server.doc("nightly").unwrap(),
            Some(NOT_ACQUIRED) => {
                assert!(
                    before < hold_until + margin,
                    "refused although it started after hl: {}",
                    stderr(&out)
                );
                if attempts.len() == 1 {
                    assert!(stderr(&out).contains("held until"), "{}", stderr(&out));
                }
            }
            _ => panic!("unexpected exit: {}", stderr(&out)),
        }
        assert!(started.elapsed() < GUARD, "never acquired: {attempts:?}");
    };
    for (_, after, code) in &attempts {
        if *after + margin < hold_until {
            assert_eq!(
                *code,
                Some(NOT_ACQUIRED),
                "acquired before hl: {attempts:?}"
            );
        }
    }
    let acquired_again = success.get_datetime("acq").unwrap().to_system_time();
    assert!(acquired_again >= hold_until, "acquired before hl");
    assert!(
        !success.contains_key("hl"),
        "a plain acquisition removes hl"
    );
    eprintln!(
        "{} attempts refused, then one acquired {:?} after hl",
        attempts.len() - 1,
        acquired_again
            .duration_since(hold_until)
            .unwrap_or_default()
    );
    // The first attempt started right after the job; on a machine so slow
    // that it ended after hl anyway, only the rules above are checked.
    if attempts[0].1 + margin < hold_until {
        assert_eq!(attempts[0].2, Some(NOT_ACQUIRED));
    } else {
        eprintln!("the first attempt ended after hl: no refusal to check");
    }
}

// ----- list ------------------------------------------------------------------------------

/// `list` shows a semaphore key with its permits and holders, a shared key
/// with its holders, and a key held at least until a time (released, still
/// held), in JSON and in the table.
#[test]
fn list_shows_permits_shared_holders_and_hold_until() {
    let env = Env::new("cli_list_kinds");
    let files = Files::new();
    let hold = format!(
        "echo \"holding $MONGO_LEASE_KEY $MONGO_LEASE_OWNER $MONGO_LEASE_TOKEN\"; {}",
        files.wait_until(&format!("[ -e {} ]", quoted(&files.path("done"))))
    );
    let mut holders: Vec<Proc> = [
        ("pool", &["--permits", "3"][..]),
        ("pool", &["--permits", "3"][..]),
        ("docs", &["--shared"][..]),
        ("docs", &["--shared"][..]),
    ]
    .into_iter()
    .map(|(key, flags)| env.spawn(&exec_args(key, flags, &hold)))
    .collect();
    // (key, owner id, token) of each holder, as its command saw them.
    let mut seen: Vec<(String, String, u64)> = holders
        .iter()
        .map(|proc| {
            let line = proc.expect_line("holding");
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields[1].into(), fields[2].into(), token_of(&line))
        })
        .collect();
    seen.sort();
    let out = env.run(&exec_args("nightly", &["--hold-at-least", "10m"], "true"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = env.run(&["list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let leases: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lease = |key: &str| {
        leases
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["key"] == key)
            .unwrap_or_else(|| panic!("no {key} in {leases}"))
            .clone()
    };
    let mut listed = Vec::new();
    for (key, kind, permits) in [
        ("pool", "permit", Value::from(3)),
        ("docs", "shared", Value::Null),
    ] {
        let lease = lease(key);
        assert_eq!(lease["kind"], kind, "{lease}");
        assert_eq!(lease["permits"], permits, "{lease}");
        assert_eq!(lease["held"], true, "{lease}");
        assert_eq!(lease["hold_until"], Value::Null, "{lease}");
        let now = parse_time(&lease["server_time"]);
        for holder in lease["holders"].as_array().unwrap() {
            assert!(parse_time(&holder["expires_at"]) > now, "{holder}");
            assert!(holder["time_to_expiry_ms"].as_u64().unwrap() > 0);
            listed.push((
                key.to_string(),
                holder["owner_id"].as_str().unwrap().to_string(),
                holder["fencing_token"].as_u64().unwrap(),
            ));
        }
    }
    listed.sort();
    assert_eq!(listed, seen, "every holder, with its owner id and token");

    let nightly = lease("nightly");
    assert_eq!(nightly["kind"], "exclusive");
    assert_eq!(
        nightly["held"], true,
        "released, but in its minimum hold: {nightly}"
    );
    assert_eq!(nightly["holders"], Value::Array(Vec::new()));
    let hold_until = parse_time(&nightly["hold_until"]);
    assert_eq!(
        hold_until
            .duration_since(parse_time(&nightly["acquired_at"]))
            .unwrap(),
        Duration::from_secs(600),
        "{nightly}"
    );
    assert!(hold_until > parse_time(&nightly["server_time"]));

    let out = env.run(&["list", "--held", "--json"]);
    let held: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        held.as_array().unwrap().len(),
        3,
        "a key in its minimum hold is held: {held}"
    );

    let out = env.run(&["list"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    let line_of = |key: &str| {
        table
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no line of {key}: {table}"))
    };
    assert!(line_of("pool").contains("3 permits"), "{table}");
    assert!(line_of("pool").contains("(2 holders)"), "{table}");
    assert!(line_of("docs").contains("shared"), "{table}");
    let cells: Vec<&str> = line_of("nightly")
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(cells[1], "exclusive", "{table}");
    assert_eq!(cells[4], "held", "{table}");
    assert!(cells[7].ends_with('s'), "HELD UNTIL: time left: {table}");
    for (key, owner, token) in &seen {
        let kind = if key == "pool" { "permit" } else { "shared" };
        assert!(
            table.lines().any(|l| l.contains(&format!("- {kind}"))
                && l.contains(owner.as_str())
                && l.contains(&token.to_string())),
            "a line for the holder {owner} of {key}: {table}"
        );
    }

    files.touch("done");
    for proc in &mut holders {
        assert_eq!(proc.wait_within(GUARD), 0);
    }
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

// ----- bad flags -------------------------------------------------------------------------

/// Bad values and combinations of the kind flags are usage errors (exit 2)
/// naming the flag, before anything runs; the exit code of a kind mismatch
/// and the environment of the kinds are in `--help`.
#[test]
fn bad_kind_flags_are_usage_errors_naming_the_flag() {
    let env = Env::new("cli_kind_flags");
    for (flags, named) in [
        (&["--permits", "0"][..], "--permits"),
        (&["--permits", "two"][..], "--permits"),
        (&["--permits", "10001"][..], "--permits"),
        (&["--permits=-1"][..], "--permits"),
        (&["--permits", "2", "--shared"][..], "--shared"),
        (
            &["--shared", "--hold-at-least", "5s"][..],
            "--hold-at-least",
        ),
        (
            &["--permits", "2", "--hold-at-least", "5s"][..],
            "--hold-at-least",
        ),
        (&["--hold-at-least", "0s"][..], "--hold-at-least"),
        (&["--hold-at-least", "soon"][..], "--hold-at-least"),
    ] {
        let out = env.run(&exec_args("k", flags, "echo ran"));
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{flags:?}: {}",
            stderr(&out)
        );
        assert!(stderr(&out).contains(named), "{flags:?}: {}", stderr(&out));
        assert!(!stdout(&out).contains("ran"));
    }
    // Checked by the library: the kinds need documents kept on release.
    for flags in [&["--shared"][..], &["--hold-at-least", "5s"][..]] {
        let mut args = vec!["--release-mode", "delete"];
        args.extend(exec_args("k", flags, "echo ran"));
        let out = env.run(&args);
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{flags:?}: {}",
            stderr(&out)
        );
        assert!(stderr(&out).contains("Keep"), "{flags:?}: {}", stderr(&out));
        assert!(!stdout(&out).contains("ran"));
    }

    let out = env.run(&["exec", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    for text in ["--permits <N>", "--shared", "--hold-at-least <DURATION>"] {
        assert!(help.contains(text), "{text} documented: {help}");
    }
    let out = env.run(&["--help"]);
    let help = stdout(&out);
    for text in ["78", "MONGO_LEASE_KIND", "MONGO_LEASE_PERMITS"] {
        assert!(help.contains(text), "{text} documented: {help}");
    }
}
