//! flock(1)'s habits: `-n`, `-w SECONDS` (`0` = do not wait), `-s`, `-c
//! "shell command"`, a positional KEY; and the progress line of a waiting
//! `exec`: who holds the key, until when, how many wait ahead (once, then
//! every few seconds with `-v`; none with `-q`).

use std::time::Duration;

use crate::common::cli::{Env, NOT_ACQUIRED, WAIT, stderr, stdout};
use crate::common::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_flags_do_what_flocks_do() {
    let env = Env::new("cli_flock");
    let manager = env.manager(Duration::from_secs(10)).await;
    let lease = manager.acquire("busy").await.unwrap();

    // -n and -w 0: not acquired at once; -w SECONDS: after that wait.
    for flags in [
        &["-n"][..],
        &["-w", "0"],
        &["-w", "0.3"],
        &["--timeout", "0s"],
    ] {
        let mut args = vec!["exec", "busy"];
        args.extend(flags);
        args.extend(["-c", "echo ran"]);
        let out = env.run(&args);
        assert_eq!(
            out.status.code(),
            Some(NOT_ACQUIRED),
            "{flags:?}: {}",
            stderr(&out)
        );
        assert!(!stdout(&out).contains("ran"), "{flags:?}");
        assert!(
            stderr(&out).contains(manager.owner_id()),
            "{}",
            stderr(&out)
        );
    }
    // -c runs a shell string under the lease; -s takes the key shared.
    let out = env.run(&[
        "exec",
        "free",
        "-c",
        "echo \"$MONGO_LEASE_KEY $MONGO_LEASE_KIND\"; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "free exclusive");
    let out = env.run(&["exec", "reads", "-s", "-c", "echo $MONGO_LEASE_KIND"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "shared");
    // A bad -w names the flag.
    let out = env.run(&["exec", "busy", "-w", "soon", "-c", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--timeout <SECONDS>"),
        "{}",
        stderr(&out)
    );

    assert!(!lease.release().await.unwrap().was_lost());

    // Four waiters of a key no one tried yet: one line at once each,
    // naming the holder and its expiry and how many wait ahead; it repeats
    // with -v or on a terminal, not on a pipe; -q says nothing.
    let lease = manager.acquire("queue").await.unwrap();
    let mut first = env.spawn(&["exec", "queue", "-w", "60", "-c", "echo got-first"]);
    let line = first.expect_line("waiting for \"queue\"");
    assert!(
        line.contains(&format!("held by {}", manager.owner_id())),
        "{line}"
    );
    assert!(
        line.contains(&format!("fencing token {}", lease.fencing_token())),
        "{line}"
    );
    assert!(line.contains(" until 20"), "{line}");
    assert!(line.contains("no other owner waits ahead"), "{line}");
    let waiters = |n: usize| {
        let manager = &manager;
        async move {
            eventually(&format!("{n} waiters"), WAIT, || async {
                let info = manager.inspect("queue").await.unwrap().unwrap();
                info.waiters.len() == n
            })
            .await
        }
    };
    waiters(1).await;
    let second = env.spawn(&["-v", "exec", "queue", "-w", "60", "-c", "echo got-second"]);
    let line = second.expect_line("waiting for \"queue\"");
    assert!(line.contains("1 other owner waits ahead"), "{line}");
    // Repeated, a few seconds later.
    second.expect_line("waiting for \"queue\"");
    waiters(2).await;
    // On a terminal it repeats without -v.
    let at_a_shell =
        env.spawn_on_terminal(&["exec", "queue", "-w", "60", "-c", "echo got-at-a-shell"]);
    let line = at_a_shell.expect_line("waiting for \"queue\"");
    assert!(line.contains("2 other owners wait ahead"), "{line}");
    at_a_shell.expect_line("waiting for \"queue\"");
    waiters(3).await;
    let mut third = env.spawn(&["-q", "exec", "queue", "-w", "60", "-c", "echo got-third"]);
    waiters(4).await;

    assert!(!lease.release().await.unwrap().was_lost());
    third.expect_line("got-third");
    assert_eq!(third.wait(), 0);
    let rest = third.rest();
    assert!(
        rest.iter().all(|l| !l.starts_with("stderr:")),
        "-q: {rest:?}"
    );
    at_a_shell.expect_line("got-at-a-shell");
    first.expect_line("got-first");
    // On a pipe, without -v: the one line. It waited longer than the
    // others took to repeat theirs.
    assert_eq!(first.wait(), 0);
    let rest = first.rest();
    assert!(
        !rest.iter().any(|l| l.contains("waiting for")),
        "repeated on a pipe: {rest:?}"
    );
    second.expect_line("got-second");
    manager.shutdown().await.unwrap();
}
