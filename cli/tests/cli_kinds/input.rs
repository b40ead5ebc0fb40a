//! Bad kind flags, and the documentation of the kinds in `--help`.

use crate::common::cli::{Env, USAGE, stderr, stdout};
use crate::support::exec_args;

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
    // The kinds need documents kept on release.
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
        assert!(
            stderr(&out).contains("--release-mode keep"),
            "{flags:?}: {}",
            stderr(&out)
        );
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
