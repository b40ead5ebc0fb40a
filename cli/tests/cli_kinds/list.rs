//! `list` shows each kind.

use std::time::Duration;

use serde_json::Value;

use crate::common::cli::{Env, Proc, stderr, stdout, token_of};
use crate::support::{Files, GUARD, exec_args, parse_time, quoted};

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
