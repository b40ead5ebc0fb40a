//! Three candidates elect a leader; an observer follows every change.
//!
//! Each candidate stands for a separate process (its own `mongodb::Client`
//! and [`LeaseManager`]) and runs [`Election::run_as_leader`]: while leader it
//! publishes its address as the leader's payload and "works" until its
//! leadership is lost. 1.5 s into each term an operator force-releases the
//! election (as `mongo-lease release scheduler --force` would), three times:
//! the leader's token fires at its next renewal and its work stops; the
//! key is granted again only once its lease could no longer be live (its
//! expiry, at most a TTL of 3 s later), and then another candidate takes
//! over with a higher term. The observer, pushed by a change stream, prints
//! each change, so the output reads in the order things happen: the
//! release (`no leader`), the old leader's loss, the new leader.
//!
//! Run it (about 15 s):
//!
//! ```text
//! cargo run --example election        # starts a throwaway mongod (installed into ~/.cache/mongo-lease/ on first use)
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo run --example election
//! ```

use std::time::Duration;

use futures::StreamExt;
use mongo_lease::{Election, LeaseManager, LeaseManagerOptions};
use mongodb::bson::doc;

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
    let db = mongo_lease::testkit::unique_name("election_demo");
    let manager = |name: &'static str| {
        let (uri, db) = (uri.clone(), db.clone());
        async move {
            let client = mongodb::Client::with_uri_str(&uri).await?;
            LeaseManager::connect(
                LeaseManagerOptions::builder()
                    .database(client.database(&db))
                    .collection("leases")
                    .owner_id(name)
                    .ttl(Duration::from_secs(3))
                    .build(),
            )
            .await
        }
    };

    let operator = manager("operator").await?;
    let mut leaders = Election::new(&operator, "scheduler")?.observe().await?;
    // Each new term, from the observer to the operator.
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut last_term = None;
        while let Some(change) = leaders.next().await {
            match change {
                Ok(Some(leader)) if last_term != Some(leader.term) => {
                    last_term = Some(leader.term);
                    let _ = terms_tx.send(leader.term);
                    println!(
                        "observer: new leader {} (term {})",
                        leader.owner_id, leader.term
                    );
                }
                Ok(Some(leader)) => println!(
                    "observer: leader is {} (term {}, payload {})",
                    leader.owner_id,
                    leader.term,
                    leader.payload.map(|p| p.to_string()).unwrap_or("-".into())
                ),
                Ok(None) => println!("observer: no leader"),
                Err(e) => println!("observer: {e}"),
            }
        }
    });

    for (name, port) in [("alpha", 8001), ("bravo", 8002), ("charlie", 8003)] {
        let election = Election::new(&manager(name).await?, "scheduler")?;
        tokio::spawn(async move {
            election
                .run_as_leader(|leader| async move {
                    println!("{name}: leading in term {}", leader.term());
                    let addr = format!("10.0.0.7:{port}");
                    leader.set_payload(doc! { "addr": addr }).await.ok();
                    leader.status().lost().await; // "work" until leadership is lost
                    println!("{name}: lost leadership of term {}", leader.term());
                })
                .await
        });
    }

    for _ in 0..3 {
        terms.recv().await; // a new term began
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if let Some(was) = operator.force_release("scheduler").await? {
            println!(
                "operator: force-released {}'s term {}",
                was.owner_id, was.fencing_token
            );
        }
    }
    terms.recv().await; // the last takeover
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}
