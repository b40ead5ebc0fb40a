//! Loss detection with `LeaseManagerOptions::watch_held_leases` (by default
//! a holder keeps no change stream open, and the heartbeat's renewal finds
//! a lost lease): how soon a held lease's token fires after another
//! application deletes or rewrites its document, and what the manager's one
//! change stream of writes costs.
//!
//! ```text
//! cargo bench --bench loss_detection                 # throwaway 1-member replica set
//! LOSS_SAMPLES=200 LOSS_HELD=10000 cargo bench --bench loss_detection
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench loss_detection
//! ```
//!
//! Part 1, the delay: a manager whose heartbeat runs every 200 s (so only
//! its change stream can notice in time) holds an anchor lease and one
//! sample lease at a time; another client deletes the sample's document by
//! `_id`, deletes every document of the manager's owner id (`aid`), or sets
//! its `aid` to another owner id. Printed: the time from sending that write
//! to the sample's token firing (p50 / p95 / max over `LOSS_SAMPLES` of each
//! kind), and the change events and renewal commands the manager received
//! and sent per sample (each sample also acquires a key: one event).
//!
//! Part 2, the cost of holding: a manager holding `LOSS_HELD` leases with a
//! 1 s heartbeat, over three ticks: renewal commands sent, and change events
//! received (renewals only touch `ts` and `exp`, which the stream's `$match`
//! filters out on the server).
//!
//! The integration tests check the behaviour (`tests/sharing/loss_detection.rs`);
//! the figures live here because they depend on the machine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mongo_lease::{LeaseManager, LeaseManagerOptions};
use mongodb::Client;
use mongodb::bson::{Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};

#[path = "common/mongod.rs"]
mod mongod;
#[path = "../tests/common/renewal.rs"]
mod renewal;

/// Liveness bound of one sample: the heartbeat never comes within it.
const BOUND: Duration = Duration::from_secs(30);

/// Commands and change events seen by one manager's client.
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<Tally>>);

#[derive(Default, Clone, Copy, Debug)]
struct Tally {
    /// Renewal commands sent (updates that set `ts`).
    renewals: usize,
    /// Leases in those renewal commands.
    renewed: usize,
    /// Change events received (in `getMore` and `aggregate` replies).
    events: usize,
    /// Commands sent, of any kind.
    commands: usize,
}

impl Counts {
    fn get(&self) -> Tally {
        *self.0.lock().unwrap()
    }

    async fn client(&self, uri: &str) -> Client {
        let mut options = mongodb::options::ClientOptions::parse(uri)
            .await
            .expect("uri");
        let sink = self.clone();
        options.command_event_handler = Some(EventHandler::callback(move |event| {
            let mut tally = sink.0.lock().unwrap();
            match event {
                CommandEvent::Started(started) => {
                    tally.commands += 1;
                    if let Some(keys) = renewal::renewed_keys(&started.command) {
                        tally.renewals += 1;
                        tally.renewed += keys.len();
                    }
                }
                CommandEvent::Succeeded(done) => {
                    let cursor = done.reply.get_document("cursor").ok();
                    let batch = cursor.and_then(|c| {
                        c.get_array("nextBatch")
                            .or_else(|_| c.get_array("firstBatch"))
                            .ok()
                    });
                    let watch = cursor
                        .and_then(|c| c.get_str("ns").ok())
                        .is_some_and(|ns| !ns.contains(".$cmd"));
                    if let (Some(batch), true) = (batch, watch) {
                        tally.events += batch.len();
                    }
                }
                _ => {}
            }
        }));
        Client::with_options(options).expect("client")
    }
}

fn main() {
    let samples = env_usize("LOSS_SAMPLES", 50);
    let held = env_usize("LOSS_HELD", 1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(samples, held));
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A manager on `db_name.collection` with this TTL and heartbeat, whose
/// client's commands and change events `counts` counts; and that client,
/// to shut down after the manager.
async fn counted_manager(
    counts: &Counts,
    uri: &str,
    db_name: &str,
    collection: &str,
    ttl: Duration,
    heartbeat: Duration,
) -> (Client, LeaseManager) {
    let client = counts.client(uri).await;
    let mut options = LeaseManagerOptions::builder()
        .database(client.database(db_name))
        .collection(collection)
        .ttl(ttl)
        .build();
    options.heartbeat_interval = Some(heartbeat);
    options.watch_held_leases = true;
    let manager = LeaseManager::connect(options).await.expect("connect");
    (client, manager)
}

async fn run(samples: usize, held: usize) {
    let (_replica_set, uri) = mongod::mongod().await;
    let db_name = format!(
        "bench_loss_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let other = Client::with_uri_str(&uri).await.expect("client");
    let raw = other.database(&db_name).collection::<Document>("leases");

    // ----- part 1: the delay ---------------------------------------------------------
    let counts = Counts::default();
    let (client, manager) = counted_manager(
        &counts,
        &uri,
        &db_name,
        "leases",
        Duration::from_secs(600),
        Duration::from_secs(200),
    )
    .await;
    let owner = manager.owner_id().to_string();
    let mut anchor = manager.acquire("anchor").await.expect("anchor");
    // Let the stream open (its first `aggregate`).
    tokio::time::sleep(Duration::from_millis(500)).await;

    println!(
        "delay from another client's write to the token firing, {samples} samples each \
         (write sent with w: majority; the manager's heartbeat: every 200 s)"
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>16} {:>18}",
        "write", "p50 ms", "p95 ms", "max ms", "events/sample", "renewals/sample"
    );
    for kind in ["delete by _id", "delete by aid", "$set aid"] {
        let mut delays = Vec::new();
        let before = counts.get();
        for i in 0..samples {
            let key = format!("s{i}");
            let lease = manager.acquire(key.as_str()).await.expect("acquire");
            let sent = Instant::now();
            match kind {
                "delete by _id" => {
                    raw.delete_one(doc! { "_id": &key }).await.expect("delete");
                }
                "delete by aid" => {
                    raw.delete_many(doc! { "aid": &owner })
                        .await
                        .expect("delete");
                }
                _ => {
                    raw.update_one(doc! { "_id": &key }, doc! { "$set": { "aid": "other" } })
                        .await
                        .expect("rewrite");
                }
            }
            tokio::time::timeout(BOUND, lease.status().lost())
                .await
                .unwrap_or_else(|_| panic!("{kind}: not lost within {BOUND:?}"));
            delays.push(sent.elapsed());
            if kind == "delete by aid" {
                tokio::time::timeout(BOUND, anchor.status().lost())
                    .await
                    .expect("the anchor is lost too");
                anchor = manager.acquire("anchor").await.expect("anchor");
            }
            raw.delete_one(doc! { "_id": &key })
                .await
                .expect("clean up");
        }
        let after = counts.get();
        delays.sort();
        let pct = |p: f64| {
            let i = ((delays.len() as f64 * p).ceil() as usize).clamp(1, delays.len()) - 1;
            delays[i].as_secs_f64() * 1000.0
        };
        println!(
            "{:<22} {:>9.1} {:>9.1} {:>9.1} {:>16.2} {:>18.2}",
            kind,
            pct(0.5),
            pct(0.95),
            pct(1.0),
            (after.events - before.events) as f64 / samples as f64,
            (after.renewals - before.renewals) as f64 / samples as f64,
        );
    }
    drop(anchor);
    manager.shutdown().await.expect("shutdown");
    client.shutdown().await;

    // ----- part 2: the cost of holding -------------------------------------------------
    let counts = Counts::default();
    let (client, manager) = counted_manager(
        &counts,
        &uri,
        &db_name,
        "held",
        Duration::from_secs(30),
        Duration::from_secs(1),
    )
    .await;
    let leases: Vec<_> = futures::stream::iter(0..held)
        .map(|i| {
            let manager = manager.clone();
            async move { manager.acquire(format!("h{i:06}")).await.expect("acquire") }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    // Let the acquisitions' own events drain.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = counts.get();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = counts.get();
    println!();
    println!("holding {held} leases for 3 s with a 1 s heartbeat (about 3 ticks):");
    println!(
        "  renewal commands: {}, leases renewed: {}, change events received: {}, commands in all: {}",
        after.renewals - before.renewals,
        after.renewed - before.renewed,
        after.events - before.events,
        after.commands - before.commands,
    );
    drop(leases);
    manager.shutdown().await.expect("shutdown");
    client.shutdown().await;
    other
        .database(&db_name)
        .drop()
        .await
        .expect("drop the bench's database");
}
