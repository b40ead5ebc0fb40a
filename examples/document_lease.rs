//! Two workers take turns on one work item, with an in-document lease.
//!
//! The lease lives inside the work item itself, under its `_lease` field:
//! no lock collection is involved. Each worker stands for a separate
//! process (its own `mongodb::Client` and [`LeaseManager`]). One turn:
//!
//! 1. acquire the item's lease (waiting while the other worker holds it;
//!    the first acquire creates the item): the call returns the item as read
//!    in the same round trip;
//! 2. work on it;
//! 3. `commit` the new state (`$inc` the turn count, `$push` the worker's
//!    name): one atomic write that applies only while the lease is held, and
//!    releases it.
//!
//! Once both managers have shut down, the final item carries no lock field.
//!
//! Run it (about 3 s with a throwaway mongod):
//!
//! ```text
//! cargo run --example document_lease        # starts a throwaway mongod (installed into ~/.cache/mongo-lease/ on first use)
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo run --example document_lease
//! ```

use std::time::Duration;

use mongo_lease::{LeaseManager, LeaseManagerOptions};
use mongodb::bson::{Document, doc};

const TURNS: usize = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _server; // keeps a throwaway replica set alive, if one was started
    let uri = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => uri,
        _ => {
            let rs = mongo_lease::testkit::ReplicaSet::start(Default::default()).await?;
            let uri = rs.uri();
            _server = rs;
            uri
        }
    };
    let client = mongodb::Client::with_uri_str(&uri).await?;
    let db = client.database(&mongo_lease::testkit::unique_name("document_lease_demo"));

    let mut workers = Vec::new();
    for name in ["alice", "bob"] {
        // A worker's own client and manager, as in its own process.
        let client = mongodb::Client::with_uri_str(&uri).await?;
        let manager = LeaseManager::connect(
            LeaseManagerOptions::builder()
                .database(client.database(db.name()))
                .collection("leases")
                .owner_id(name)
                .ttl(Duration::from_secs(10))
                .build(),
        )
        .await?;
        workers.push(tokio::spawn(take_turns(name, manager)));
    }
    for worker in workers {
        worker.await??;
    }

    let item = db
        .collection::<Document>("workitem")
        .find_one(doc! { "_id": "item-17" })
        .await?
        .ok_or("no work item")?;
    println!("final document: {item}");
    assert!(!item.contains_key("_lease"), "a lock field was left");
    db.drop().await?;
    Ok(())
}

/// One worker's turns on `item-17`; shuts its manager down at the end.
async fn take_turns(name: &'static str, manager: LeaseManager) -> mongo_lease::Result<()> {
    let items = manager.documents::<Document>("workitem").await?;
    // The item to create if it does not exist yet.
    let create = doc! { "state": "new", "turns": 0, "log": [] };
    for _ in 0..TURNS {
        let item = items.acquire("item-17").create(create.clone()).await?;
        println!(
            "{name:>5}: acquired item-17 (fencing token {}), turns so far: {}",
            item.lease().fencing_token(),
            item.document().get_i32("turns").unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // the work
        let written = item
            .commit(doc! {
                "$inc": { "turns": 1 },
                "$push": { "log": name },
                "$set": { "state": format!("last worked on by {name}") },
            })
            .await?;
        println!(
            "{name:>5}: committed, turns: {}, log: {}",
            written.get_i32("turns").unwrap_or_default(),
            written
                .get("log")
                .map(ToString::to_string)
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // other work
    }
    // Shutdown also waits until a short lease's last lock field is removed.
    manager.shutdown().await
}
