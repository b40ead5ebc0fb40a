//! `--foreign-lock`: another application's lock documents of a layout of
//! its own, read by a rule of aggregation expressions. `list` shows such a
//! lock with its owner and expiry, `exec --no-wait` exits 75 while the rule
//! reads it as held and takes the key once it reads it free; a rule that is
//! not Extended JSON, or that MongoDB cannot parse, exits 2 with one line
//! naming the field, before anything is written. Plain driver calls play
//! the other application (`{_id, locked, owner, created, expire}`).

use mongodb::bson::{DateTime, Document, doc};
use serde_json::Value;

use super::foreign_locks::{cli, text};
use crate::common::Fixture;
use crate::common::others::{bytes, stored_bytes};

/// The other application's rule: held while `locked`, its owner in
/// `owner`, its expiry in `expire` (null: none).
const RULE: &str =
    r#"{"held": {"$eq": ["$locked", true]}, "owner": "$owner", "expires_at": "$expire"}"#;

/// `mongo-lease` exit codes (`mongo-lease --help`).
const USAGE: i32 = 2;
const UNAVAILABLE: i32 = 69;
const NOT_ACQUIRED: i32 = 75;

/// The other application locks `key` as `owner` (`locked`), or leaves its
/// document unlocked; `expire` null unless given. Returns it as written.
async fn other_app_lock(
    fx: &Fixture,
    key: &str,
    locked: bool,
    owner: &str,
    expire: Option<DateTime>,
) -> Document {
    let written = doc! {
        "_id": key,
        "locked": locked,
        "owner": owner,
        "created": DateTime::now(),
        "expire": expire,
    };
    fx.raw()
        .insert_one(written.clone())
        .await
        .expect("the other application's insert");
    written
}

/// The names of the lock collection's indexes, sorted.
async fn index_names(fx: &Fixture) -> Vec<String> {
    let mut names = fx.raw().list_index_names().await.expect("list the indexes");
    names.sort();
    names
}

/// Every document of the lock collection, as BSON bytes, by `_id`.
async fn all_documents(fx: &Fixture) -> Vec<Vec<u8>> {
    use futures::TryStreamExt;
    let docs: Vec<Document> = fx
        .raw()
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .expect("read the collection")
        .try_collect()
        .await
        .expect("read the collection");
    docs.iter().filter_map(bytes).collect()
}

/// The `list --json` entry of `key`.
fn entry<'a>(listed: &'a Value, key: &str) -> &'a Value {
    listed
        .as_array()
        .expect("an array")
        .iter()
        .find(|e| e["key"] == key)
        .unwrap_or_else(|| panic!("no entry for {key} in {listed}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_list_shows_a_lock_read_by_the_rule_with_its_owner_and_expiry_and_exec_no_wait_exits_75()
 {
    let fx = Fixture::new("foreign_rule_held").await;
    let written = other_app_lock(&fx, "k", true, "w1", None).await;
    // A lock with an expiry of its own (an hour after its creation).
    let expire = DateTime::from_millis(
        written.get_datetime("created").unwrap().timestamp_millis() + 3_600_000,
    );
    let timed = other_app_lock(&fx, "k2", true, "w2", Some(expire)).await;

    let out = cli(&fx, &["--foreign-lock", RULE, "list", "--json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let k = entry(&listed, "k");
    assert_eq!(
        (&k["owner_id"], &k["foreign"], &k["held"], &k["expires_at"]),
        (
            &Value::from("w1"),
            &Value::from(true),
            &Value::from(true),
            &Value::Null
        ),
        "{k}"
    );
    let k2 = entry(&listed, "k2");
    assert_eq!(
        (&k2["owner_id"], &k2["foreign"], &k2["held"]),
        (&Value::from("w2"), &Value::from(true), &Value::from(true)),
        "{k2}"
    );
    let expires = k2["expires_at"].as_str().expect("an expiry");
    let expires = DateTime::parse_rfc3339_str(expires).unwrap();
    assert_eq!(expires, expire, "{k2}");

    // The table: held by its owner, marked foreign, with no expiry (k) or
    // its own (k2).
    let out = cli(&fx, &["--foreign-lock", RULE, "list"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let row = |key: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no row for {key} in\n{table}"))
            .to_string()
    };
    let k = row("k");
    assert!(
        k.contains("w1 (foreign)") && k.contains("held") && k.contains("none"),
        "{k}"
    );
    let k2 = row("k2");
    assert!(
        k2.contains("w2 (foreign)") && k2.contains("held") && !k2.contains("none"),
        "{k2}"
    );

    // The rule given by its environment variable: exec waits for nobody
    // and leaves the lock as it is.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mongo-lease"));
    cmd.env("MONGODB_URI", crate::common::uri())
        .env("MONGO_LEASE_DB", fx.db.name())
        .env("MONGO_LEASE_COLLECTION", &fx.collection)
        .env("MONGO_LEASE_CLOCK_SKEW", "100ms")
        .env("MONGO_LEASE_FOREIGN_LOCK", RULE)
        .env_remove("MONGO_LEASE_OWNER_ID")
        .args(["exec", "--key", "k", "--no-wait", "--", "true"]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        text(&out.stderr)
    );
    let said = text(&out.stderr);
    assert!(
        said.contains("foreign holder \"w1\"") && said.contains("no expiry"),
        "{said}"
    );
    let out = cli(
        &fx,
        &[
            "--foreign-lock",
            RULE,
            "exec",
            "--key",
            "k2",
            "--no-wait",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("foreign holder \"w2\""));
    assert_eq!(stored_bytes(&fx, "k").await, bytes(&written));
    assert_eq!(stored_bytes(&fx, "k2").await, bytes(&timed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exec_no_wait_takes_a_key_whose_lock_the_rule_reads_as_not_held() {
    let fx = Fixture::new("foreign_rule_free").await;
    let written = other_app_lock(&fx, "k", false, "w1", None).await;
    let exec = [
        "exec",
        "--key",
        "k",
        "--no-wait",
        "--",
        "sh",
        "-c",
        "echo ran $MONGO_LEASE_KEY",
    ];

    // Without the rule, the document is of no layout the tool knows: it
    // refuses the collection (and says a rule would describe it), does not
    // run the command, and leaves the document as it is.
    let out = cli(&fx, &exec).await;
    assert_eq!(
        out.status.code(),
        Some(UNAVAILABLE),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("--foreign-lock"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stdout).contains("ran"), "{}", text(&out.stdout));
    assert_eq!(stored_bytes(&fx, "k").await, bytes(&written));

    let mut args = vec!["--foreign-lock", RULE];
    args.extend(exec);
    let out = cli(&fx, &args).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "ran k");
    // Taken over and released: none of the other application's fields
    // is left.
    if let Some(after) = fx.raw().find_one(doc! { "_id": "k" }).await.unwrap() {
        assert!(!after.contains_key("locked"), "{after}");
    }
}

/// A rule MongoDB cannot parse: exit 2, one line on stderr naming the
/// field, and nothing written (no index, no document); the same with a
/// rule MongoDB accepts creates the tool's indexes, which shows the check
/// sees a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_a_rule_mongodb_cannot_parse_exits_2_with_one_line_naming_the_field_and_writes_nothing()
{
    let fx = Fixture::new("foreign_rule_bad").await;
    other_app_lock(&fx, "k", true, "w1", None).await;
    let (indexes, documents) = (index_names(&fx).await, all_documents(&fx).await);
    let bad = r#"{"held": {"$nosuch": 1}}"#;

    for args in [
        vec!["--foreign-lock", bad, "list"],
        vec!["--foreign-lock", bad, "exec", "--key", "new", "--", "true"],
    ] {
        let out = cli(&fx, &args).await;
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {said}");
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {said}");
        assert!(
            lines[0].starts_with("mongo-lease: invalid --foreign-lock")
                && lines[0].contains("foreign_lock.held: ")
                && lines[0].contains("$nosuch")
                && !lines[0].contains("$set"),
            "{args:?}: {said}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(index_names(&fx).await, indexes, "{args:?}");
        assert_eq!(all_documents(&fx).await, documents, "{args:?}");
    }

    let out = cli(&fx, &["--foreign-lock", RULE, "list"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(index_names(&fx).await.len() > indexes.len());
}

/// A rule that is not Extended JSON of the rule's fields: exit 2, one line,
/// before connecting (no collection is created).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_a_rule_that_is_not_json_exits_2_with_one_line() {
    let fx = Fixture::new("foreign_rule_json").await;
    for (rule, says) in [
        (r#"{"held": "#, "not JSON"),
        (r#"{"owner": "$owner"}"#, "missing field `held`"),
        (
            r#"{"held": true, "expiry": "$expire"}"#,
            "unknown field `expiry`",
        ),
        ("[1]", "not an Extended JSON v2 object"),
        (r#"{"held": {"$date": "bad"}}"#, "not Extended JSON v2: "),
        // A field name with a line break, in serde's message: one line.
        (r#"{"held": true, "a\nb": 1}"#, "unknown field `a b`"),
    ] {
        let out = cli(&fx, &["--foreign-lock", rule, "list"]).await;
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(USAGE), "{rule}: {said}");
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines.len(), 1, "{rule}: {said}");
        assert!(
            lines[0].starts_with("mongo-lease: invalid --foreign-lock") && lines[0].contains(says),
            "{rule}: {said}"
        );
    }
    let collections = fx.db.list_collection_names().await.unwrap();
    assert!(collections.is_empty(), "{collections:?}");
}
