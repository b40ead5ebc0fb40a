//! `exec --shared` and a plain `exec`: the two sides of a read/write key.

use crate::common::cli::{Env, NOT_ACQUIRED, Proc, stderr, stdout};
use crate::support::{Files, GUARD, Server, at, exec_args, quoted};

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
