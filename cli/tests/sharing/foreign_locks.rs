//! Other applications' lock documents seen from the command line: `exec
//! --no-wait` exits 75 on a foreign holder (the common `{_id, ts, aid}` or a
//! bare `{_id}`), `list` shows it, only `release --force` deletes it, and
//! nothing else modifies it. Plain driver calls play the other application.
//! The library's side: `tests/sharing/foreign_locks.rs`.

use std::process::Output;

use mongodb::bson::doc;
use serde_json::Value;

use std::time::Duration;

use crate::common::others::{
    BARE, OTHER_APP, bare_lock, bare_unlock, bytes, foreign_lock, pattern2_lock, stored_bytes,
};
use crate::common::{self, Fixture};

const BIN: &str = env!("CARGO_BIN_EXE_mongo-lease");
/// `mongo-lease` exit code for "not acquired" (`mongo-lease --help`).
const NOT_ACQUIRED: i32 = 75;

/// Runs `mongo-lease ARGS` on the fixture's lock collection.
pub(crate) async fn cli(fx: &Fixture, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.env("MONGODB_URI", common::uri())
        .env("MONGO_LEASE_DB", fx.db.name())
        .env("MONGO_LEASE_COLLECTION", &fx.collection)
        .env("MONGO_LEASE_CLOCK_SKEW", "100ms") // one member; short leases
        .env_remove("MONGO_LEASE_OWNER_ID")
        .env_remove("MONGO_LEASE_FOREIGN_LOCK")
        .args(args);
    tokio::task::spawn_blocking(move || cmd.output().expect("run mongo-lease"))
        .await
        .unwrap()
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exec_no_wait_exits_75_list_shows_the_foreign_holder_and_release_force_deletes_it() {
    let fx = Fixture::new("foreign_cli").await;
    let written = foreign_lock(&fx, "job", OTHER_APP).await;

    let out = cli(&fx, &["exec", "--key", "job", "--no-wait", "--", "true"]).await;
    assert_eq!(
        out.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("foreign holder \"java-app-1\""),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));

    let out = cli(&fx, &["list"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("job "))
        .unwrap_or_else(|| panic!("no row for job in\n{table}"));
    assert!(row.contains("java-app-1 (foreign)"), "{row}");
    assert!(row.contains("held") && row.contains("none"), "{row}");

    let out = cli(&fx, &["list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = &listed.as_array().unwrap()[0];
    assert_eq!(entry["key"], "job");
    assert_eq!(entry["owner_id"], OTHER_APP);
    assert_eq!(entry["foreign"], true);
    assert_eq!(entry["held"], true);
    assert_eq!(entry["expires_at"], Value::Null);
    assert_eq!(entry["time_to_expiry_ms"], Value::Null);
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));

    let out = cli(&fx, &["release", "job", "--force"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("held by a foreign holder \"java-app-1\"") && said.contains("deleted"),
        "{said}"
    );
    assert_eq!(stored_bytes(&fx, "job").await, None);
}

// ----- a bare `{_id}`: a client that locks by an upsert of its `_id` alone --

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exec_no_wait_exits_75_while_a_bare_id_lock_exists_and_runs_once_it_is_deleted() {
    let fx = Fixture::new("foreign_bare_cli").await;
    assert_eq!(
        bare_lock(&fx, BARE).await,
        None,
        "the other client acquired"
    );
    let bare = doc! { "_id": BARE };

    let out = cli(&fx, &["exec", "--key", BARE, "--no-wait", "--", "true"]).await;
    assert_eq!(
        out.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("foreign holder"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(stored_bytes(&fx, BARE).await, bytes(&bare));

    let out = cli(&fx, &["list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = &listed.as_array().unwrap()[0];
    assert_eq!(
        (
            &entry["key"],
            &entry["owner_id"],
            &entry["foreign"],
            &entry["held"]
        ),
        (
            &Value::from(BARE),
            &Value::from(""),
            &Value::from(true),
            &Value::from(true)
        )
    );

    bare_unlock(&fx, BARE).await;
    let out = cli(&fx, &["exec", "--key", BARE, "--no-wait", "--", "true"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

// ----- a lock with an expiry of its own: npm `distributed-locks-mongodb` ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exec_no_wait_exits_75_on_a_live_pattern_2_lock_list_shows_its_owner_and_0_once_it_expired()
 {
    let fx = Fixture::new("pattern2_cli").await;
    // Its client locks for 2 s, by its exact commands.
    assert!(pattern2_lock(&fx, "job", "node-7", 2).await);
    let written = fx.doc("job").await;

    let out = cli(&fx, &["exec", "--key", "job", "--no-wait", "--", "true"]).await;
    assert_eq!(
        out.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        text(&out.stderr)
    );
    let said = text(&out.stderr);
    assert!(
        said.contains("foreign holder \"node-7\"") && said.contains("by its own rule"),
        "{said}"
    );
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));

    let out = cli(&fx, &["list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = &listed.as_array().unwrap()[0];
    assert_eq!(
        (&entry["owner_id"], &entry["foreign"]),
        (&Value::from("node-7"), &Value::from(true))
    );
    // `obtained_at + ttl` and its clients' strict `>`: 2 001 ms after it.
    let obtained_at = written.get_datetime("obtained_at").unwrap();
    let expires = entry["expires_at"].as_str().expect("an expiry");
    let expires = mongodb::bson::DateTime::parse_rfc3339_str(expires).unwrap();
    assert_eq!(
        expires.timestamp_millis(),
        obtained_at.timestamp_millis() + 2_001
    );
    let out = cli(&fx, &["list"]).await;
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("job "))
        .expect("a row for job");
    assert!(
        row.contains("node-7 (foreign)") && !row.contains("none"),
        "{row}"
    );

    // Past its expiry by its rule, the next `exec --no-wait` takes it over.
    common::eventually(
        "exec --no-wait runs the command",
        Duration::from_secs(60),
        || async {
            let out = cli(&fx, &["exec", "--key", "job", "--no-wait", "--", "true"]).await;
            match out.status.code() {
                Some(0) => true,
                Some(NOT_ACQUIRED) => false,
                other => panic!("exit {other:?}: {}", text(&out.stderr)),
            }
        },
    )
    .await;
    // Released, the key is free to its clients again at once (the released
    // document reads expired to them, or is deleted: `connect` chose delete
    // mode in this shared collection).
    common::eventually(
        "pattern 2 locks it again",
        Duration::from_secs(60),
        || async { pattern2_lock(&fx, "job", "node-7", 2).await },
    )
    .await;
}
