//! `exec --hold-at-least`: a key held until a time by the server's clock.

use std::time::{Duration, Instant};

use crate::common::cli::{Env, NOT_ACQUIRED, stderr};
use crate::support::{GUARD, Server, exec_args};

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
        "an acquisition without --hold-at-least removes hl"
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
