//! Errors in the tool's own terms, one line each, never the driver's debug
//! output: a bad URI, an unreachable host, the wrong replica set name, the
//! limits of --hold-at-most and --hold-at-least; a long --ttl works; a
//! standalone server gets a warning saying what it gives up; and --help
//! documents the flags of flock and etcdctl, -v, -q and MONGO_LEASE_LOG.

use crate::common::cli::{Env, UNAVAILABLE, USAGE, stderr, stdout};

/// One line, in the tool's words, with none of the driver's debug output.
fn one_sentence(out: &std::process::Output) -> String {
    let text = stderr(out);
    assert_eq!(text.trim_end().lines().count(), 1, "one line: {text}");
    for debug in [
        "labels:",
        "Topology",
        "Kind:",
        "source: None",
        "ReleaseMode",
        "hold_at",
        "safety_margin",
        "lock_delay",
    ] {
        assert!(!text.contains(debug), "{debug:?} in {text}");
    }
    text
}

#[test]
fn connection_errors_name_the_cause_and_the_flag_without_driver_debug_output() {
    let env = Env::new("cli_errors");
    let out = env
        .cmd(&["list"])
        .env("MONGODB_URI", "foo://x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(USAGE));
    let text = one_sentence(&out);
    assert!(text.contains("invalid --uri (or MONGODB_URI)"), "{text}");
    assert!(text.contains("scheme"), "{text}");

    let out = env
        .cmd(&["--connect-timeout", "500ms", "list"])
        .env("MONGODB_URI", "mongodb://127.0.0.1:1/")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(UNAVAILABLE));
    let text = one_sentence(&out);
    assert!(text.contains("127.0.0.1:1: Connection refused"), "{text}");
    assert!(
        text.contains("within 400ms (0.8 × --connect-timeout 500ms)"),
        "{text}"
    );

    // The shared test deployment under another replica set name.
    let uri = env.uri.clone();
    let wrong = match uri.find("replicaSet=") {
        Some(_) => regex_free_replace(&uri),
        None => format!(
            "{uri}{}replicaSet=nosuchset",
            if uri.contains('?') { "&" } else { "/?" }
        ),
    };
    let out = env
        .cmd(&["--connect-timeout", "500ms", "list"])
        .env("MONGODB_URI", &wrong)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(UNAVAILABLE),
        "{wrong}: {}",
        stderr(&out)
    );
    let text = one_sentence(&out);
    assert!(
        text.contains("no member of replica set \"nosuchset\""),
        "{text}"
    );
}

/// `uri` with its replicaSet option's value replaced by `nosuchset`.
fn regex_free_replace(uri: &str) -> String {
    let at = uri.find("replicaSet=").unwrap() + "replicaSet=".len();
    let end = uri[at..].find('&').map_or(uri.len(), |e| at + e);
    format!("{}nosuchset{}", &uri[..at], &uri[end..])
}

#[test]
fn lease_flags_are_checked_in_the_tools_terms() {
    let env = Env::new("cli_flag_errors");
    for (flags, says) in [
        (
            &["--hold-at-most", "1000y"][..],
            "--hold-at-most 1000years is longer than a year",
        ),
        (
            &["--ttl", "2years"][..],
            "--ttl 2years is longer than a year",
        ),
        (
            &["--hold-at-most", "3s"][..],
            "--hold-at-most 3s is too short",
        ),
        (
            &["--hold-at-most", "10s", "--hold-at-least", "20s"][..],
            "--hold-at-least 20s is longer than --hold-at-most 10s",
        ),
    ] {
        let mut args = vec!["exec", "k"];
        args.extend(flags);
        args.extend(["-c", "echo ran"]);
        let out = env.run(&args);
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{flags:?}: {}",
            stderr(&out)
        );
        let text = one_sentence(&out);
        assert!(text.contains(says), "{flags:?}: {text}");
        assert!(!stdout(&out).contains("ran"));
    }
    let out = env.run(&[
        "--release-mode",
        "delete",
        "exec",
        "k",
        "--permits",
        "2",
        "-c",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(one_sentence(&out).contains("--permits needs the lock document kept"));

    // A --ttl of hours: its lock-delay stays within the library's limit.
    let out = env.run(&["exec", "k", "--ttl", "6h", "-c", "echo ran"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_server_gets_a_warning_saying_what_it_gives_up() {
    let server = mongo_lease::testkit::Standalone::start()
        .await
        .expect("a standalone mongod");
    let env = Env::new("cli_standalone");
    let run = |args: &[&str]| {
        env.cmd(args)
            .env("MONGODB_URI", server.uri())
            .output()
            .unwrap()
    };
    let out = run(&["exec", "k", "-c", "echo ran"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("warning: MongoDB is a standalone server, not a replica set"),
        "{text}"
    );
    assert!(text.contains("no failover"), "{text}");
    assert!(text.contains("poll"), "{text}");
    let out = run(&["-q", "list"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stderr(&out), "", "-q: no warning");
    // Not on a replica set.
    let out = env.run(&["list"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stderr(&out).contains("standalone"), "{}", stderr(&out));
}

#[test]
fn help_documents_the_short_flags_lock_elect_and_the_log() {
    let env = Env::new("cli_help");
    let help = stdout(&env.run(&["--help"]));
    for text in [
        "MONGO_LEASE_LOG",
        "mongo_lease=debug",
        "-v, --verbose",
        "-q, --quiet",
        "lock ",
        "elect ",
    ] {
        assert!(help.contains(text), "{text:?} in --help: {help}");
    }
    let help = stdout(&env.run(&["exec", "--help"]));
    for text in [
        "-n, --no-wait",
        "-w, --timeout <SECONDS>",
        "-s, --shared",
        "-c, --command <SHELL_COMMAND>",
        "29m 53s",
    ] {
        assert!(help.contains(text), "{text:?} in exec --help: {help}");
    }
    let help = stdout(&env.run(&["elect", "--help"]));
    assert!(help.contains("[VALUE]"), "{help}");
}

/// A semaphore is one key with N permits: --permits with several keys is
/// refused in one line, and nothing is held.
#[test]
fn permits_with_several_keys_is_refused_naming_the_flag() {
    let env = Env::new("cli_permits_keys");
    let out = env
        .cmd(&[
            "exec",
            "--permits",
            "2",
            "--key",
            "a",
            "--key",
            "b",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(USAGE));
    let text = one_sentence(&out);
    assert!(text.contains("--permits takes one key"), "{text}");
    let listed = env.cmd(&["list", "--json"]).output().unwrap();
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(!stdout(&listed).contains("\"a\""), "{}", stdout(&listed));
}
