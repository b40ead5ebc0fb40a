//! Keys of any BSON type from the command line: `--key-json` and
//! `--name-json` take a key as Extended JSON (an `ObjectId` is stored as
//! that `ObjectId`), `list` prints keys as Extended JSON, and the command
//! sees `MONGO_LEASE_KEY` as Extended JSON. The library's side:
//! `tests/sharing/keys.rs`.

use std::process::{Command, Output};
use std::time::Duration;

use mongo_lease::{LeaseManager, ReleaseOutcome};
use mongodb::bson::{Bson, Document, doc, oid::ObjectId};

use crate::common::{self, Fixture};

const TTL: Duration = Duration::from_secs(30);
const OID: &str = "5087b72181a445980ae47d13";

fn oid() -> ObjectId {
    OID.parse().unwrap()
}

const BIN: &str = env!("CARGO_BIN_EXE_mongo-lease");
const NOT_ACQUIRED: i32 = 75;
const USAGE: i32 = 2;

/// `mongo-lease ARGS` on database `db` (collection `leases`), run to its end
/// on a blocking thread.
async fn cli(db: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.env("MONGODB_URI", common::uri())
        .env("MONGO_LEASE_DB", db)
        .env_remove("MONGO_LEASE_COLLECTION")
        .env("MONGO_LEASE_CLOCK_SKEW", "100ms") // one member; short leases
        .env_remove("MONGO_LEASE_OWNER_ID")
        .env_remove("MONGO_LEASE_FOREIGN_LOCK")
        .args(args);
    tokio::task::spawn_blocking(move || cmd.output().expect("run mongo-lease"))
        .await
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `mongo-lease ARGS -- sh -c 'echo "key=$MONGO_LEASE_KEY"'` on `db`
/// to its end: it exits 0 and its command sees `MONGO_LEASE_KEY` as
/// `key_json` (the key or name as Extended JSON).
async fn cli_shows_the_key_as(db: &str, args: &[&str], key_json: &str) {
    let mut all = args.to_vec();
    all.extend(["--", "sh", "-c", "echo \"key=$MONGO_LEASE_KEY\""]);
    let out = cli(db, &all).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains(&format!("key={key_json}")),
        "the command sees the key as Extended JSON: {out:?}"
    );
}

/// A manager of the collection `leases` of the fixture's database, the one
/// the CLI runs use.
async fn cli_collection_manager(fx: &Fixture) -> LeaseManager {
    common::manager_on(fx.db.clone(), "leases", TTL).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_locks_an_objectid_given_as_extended_json_and_lists_it_as_extended_json() {
    let fx = Fixture::new("keys_cli").await;
    let db = fx.db.name().to_owned();
    let key_json = format!(r#"{{"$oid":"{OID}"}}"#);

    cli_shows_the_key_as(
        &db,
        &["exec", "--key-json", &key_json, "--no-wait"],
        &key_json,
    )
    .await;
    let stored = fx
        .db
        .collection::<Document>("leases")
        .find_one(doc! { "_id": oid() })
        .await
        .unwrap();
    assert!(stored.is_some(), "the lock document's _id is the ObjectId");

    // Another manager holds that ObjectId: exec --no-wait exits 75.
    let manager = cli_collection_manager(&fx).await;
    let lease = manager.acquire(oid()).await.unwrap();
    let out = cli(
        &db,
        &["exec", "--key-json", &key_json, "--no-wait", "--", "true"],
    )
    .await;
    assert_eq!(out.status.code(), Some(NOT_ACQUIRED), "{out:?}");

    // A string key of the same hex digits is another key.
    let out = cli(&db, &["exec", "--key", OID, "--no-wait", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let out = cli(&db, &["list", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&serde_json::Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["key"])
        .collect();
    assert_eq!(
        keys,
        [&serde_json::json!(OID), &serde_json::json!({ "$oid": OID })],
        "a string key is a JSON string, an ObjectId is {{\"$oid\": ...}}, in MongoDB's order"
    );
    let out = cli(&db, &["list"]).await;
    assert!(stdout(&out).contains(&key_json), "the table: {out:?}");

    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_needs_a_key_takes_one_for_release_and_refuses_bad_extended_json() {
    let fx = Fixture::new("keys_cli_usage").await;
    let db = fx.db.name().to_owned();
    for args in [
        &["exec", "--no-wait", "--", "true"][..],
        &["exec", "--key-json", r#"{"$oid":"xyz"}"#, "--", "true"],
        &["exec", "--key-json", "not json", "--", "true"],
        &["exec", "--key-json", "[1, 2]", "--", "true"],
        &["release", "k", "--key-json", "\"k\"", "--force"],
        &["release", "--force"],
    ] {
        let out = cli(&db, args).await;
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {out:?}");
    }
    // release --key-json --force releases the ObjectId key.
    let manager = cli_collection_manager(&fx).await;
    let lease = manager.acquire(oid()).await.unwrap();
    let key_json = format!(r#"{{"$oid":"{OID}"}}"#);
    let out = cli(
        &db,
        &["release", "--key-json", &key_json, "--force", "--json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["key"], serde_json::json!({ "$oid": OID }));
    assert_eq!(reply["released"], serde_json::json!(true));
    let info = manager.inspect(oid()).await.unwrap().unwrap();
    assert!(!info.held, "force-released");
    drop(lease);
    manager.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_leader_under_an_objectid_name_runs_its_command_with_the_name_as_extended_json() {
    let fx = Fixture::new("keys_cli_leader").await;
    let db = fx.db.name().to_owned();
    let name_json = format!(r#"{{"$oid":"{OID}"}}"#);

    cli_shows_the_key_as(
        &db,
        &["leader", "--name-json", &name_json, "--once"],
        &name_json,
    )
    .await;
    let stored = fx
        .db
        .collection::<Document>("leases")
        .find(doc! {})
        .await
        .unwrap();
    let ids: Vec<Bson> = futures::TryStreamExt::try_collect::<Vec<Document>>(stored)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.get("_id").unwrap().clone())
        .collect();
    assert_eq!(
        ids,
        [Bson::ObjectId(oid())],
        "the only lock document's _id is the ObjectId"
    );

    for args in [
        &[
            "leader",
            "--name",
            "a",
            "--name-json",
            &name_json,
            "--",
            "true",
        ][..],
        &["leader", "--once", "--", "true"],
        &["leader", "--name-json", "not json", "--", "true"],
    ] {
        let out = cli(&db, args).await;
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {out:?}");
    }
}
