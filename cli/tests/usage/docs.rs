//! What the docs say of the tool is what it does: every flag that
//! docs/cli.md or the README names is one `--help` lists, and every exit
//! code they give is one `--help` documents, with the same meaning as the
//! constants the other tests check the tool's exits against.

use crate::common::cli::{
    Env, KIND_MISMATCH, LEASE_LOST, NOT_ACQUIRED, UNAVAILABLE, USAGE, stdout,
};

const SUBCOMMANDS: [&str; 7] = [
    "exec", "leader", "lock", "elect", "list", "release", "watch",
];

/// Flags of other programs the docs name: the daemons `exec` may run.
const OTHERS: [&str; 3] = ["--foreground", "--nodaemon", "--yes"];

/// The `--long-flags` in `text`, but cargo's and [`OTHERS`].
fn flags(text: &str) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    let ours = text
        .lines()
        .filter(|l| !l.contains("cargo "))
        .collect::<Vec<_>>()
        .join("\n");
    for (at, _) in ours.match_indices("--") {
        let name: String = ours[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '-')
            .collect();
        // `-- CMD` and a `---` rule are not flags.
        let flag = format!("--{}", name.trim_end_matches('-'));
        if name.len() > 1 && !name.starts_with('-') && !OTHERS.contains(&flag.as_str()) {
            found.insert(flag);
        }
    }
    found
}

/// The numbers after "exit" or "exits" in `text`.
fn exit_codes(text: &str) -> std::collections::BTreeSet<i32> {
    let mut found = std::collections::BTreeSet::new();
    for word in ["exit ", "exits "] {
        for (at, _) in text.match_indices(word) {
            let digits: String = text[at + word.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(code) = digits.parse() {
                found.insert(code);
            }
        }
    }
    found
}

fn read(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_flag_and_exit_code_the_docs_name_is_the_tools() {
    let env = Env::new("cli_docs");
    let mut help = stdout(&env.run(&["--help"]));
    for sub in SUBCOMMANDS {
        help.push_str(&stdout(&env.run(&[sub, "--help"])));
    }
    let cli_md = read("../docs/cli.md");
    let readme = read("../README.md");
    // The README's section on the tool.
    let readme = &readme[readme
        .find("mongo-lease exec")
        .expect("the README shows the tool")..];

    let documented = flags(&help);
    let named: Vec<_> = flags(&cli_md).into_iter().chain(flags(readme)).collect();
    assert!(named.len() > 20, "the docs name the flags: {named:?}");
    let unknown: Vec<_> = named.iter().filter(|f| !documented.contains(*f)).collect();
    assert!(
        unknown.is_empty(),
        "named by the docs, not by --help: {unknown:?}"
    );

    let codes = exit_codes(&cli_md);
    assert!(codes.len() >= 4, "{codes:?}");
    let table = &help[help
        .find("Exit codes:")
        .expect("--help lists the exit codes")..];
    for code in &codes {
        assert!(
            table
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{code} "))),
            "exit {code} is in docs/cli.md, not in --help's exit codes"
        );
    }
    // The codes the other tests check exits against are the documented ones.
    for (code, meaning) in [
        (USAGE, "bad usage"),
        (UNAVAILABLE, "could not be reached"),
        (NOT_ACQUIRED, "not acquired"),
        (LEASE_LOST, "was lost"),
        (KIND_MISMATCH, "another kind"),
    ] {
        let line = table
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{code} ")))
            .unwrap_or_else(|| panic!("exit {code} in --help"));
        assert!(line.contains(meaning), "exit {code}: {line}");
    }
}
