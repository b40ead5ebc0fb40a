//! Scale: one manager holding many keys at once. Prints how fast the keys
//! are acquired, how long one heartbeat tick takes to renew them all (in
//! batches), and how long shutdown takes to release them.
//!
//! ```text
//! cargo bench --bench scale                          # 100 000 keys, throwaway 1-member replica set
//! SCALE_KEYS=20000 cargo bench --bench scale         # another number of keys
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench scale
//! ```
//!
//! The integration tests check the same behaviour at a size that runs in
//! seconds (`one_manager_holds_2_000_keys_renewed_in_batches` in
//! `tests/misuse/many_keys.rs`); the figures live here because they depend on the
//! machine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_lease::{DEFAULT_RENEWAL_BATCH_SIZE, LeaseManager, LeaseManagerOptions};
use mongodb::Client;
use mongodb::bson::{Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};

/// Lease TTL of the benchmark's manager; its heartbeat is a third of it.
const TTL: Duration = Duration::from_secs(30);
/// Acquire calls in flight at once.
#[path = "common/mongod.rs"]
mod mongod;
#[path = "../tests/common/renewal.rs"]
mod renewal;

const CONCURRENCY: usize = 256;

/// Start and end of each renewal command (an `update` that sets `ts`).
#[derive(Clone, Default)]
struct Renewals(Arc<Mutex<RenewalLog>>);

#[derive(Default)]
struct RenewalLog {
    started: HashMap<i32, (Instant, usize)>,
    /// `(started, finished, leases)` of each completed renewal command.
    done: Vec<(Instant, Instant, usize)>,
}

fn main() {
    let keys: usize = std::env::var("SCALE_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(keys));
}

async fn run(keys: usize) {
    let (_replica_set, uri) = mongod::mongod().await;

    let renewals = Renewals::default();
    let mut client_options = mongodb::options::ClientOptions::parse(&uri)
        .await
        .expect("uri");
    let sink = renewals.clone();
    client_options.command_event_handler = Some(EventHandler::callback(move |event| {
        let now = Instant::now();
        let mut log = sink.0.lock().unwrap();
        match event {
            CommandEvent::Started(started) => {
                if let Some(n) = renewal::renewed_keys(&started.command).map(|keys| keys.len()) {
                    log.started.insert(started.request_id, (now, n));
                }
            }
            CommandEvent::Succeeded(done) => {
                if let Some((at, n)) = log.started.remove(&done.request_id) {
                    log.done.push((at, now, n));
                }
            }
            CommandEvent::Failed(failed) => {
                log.started.remove(&failed.request_id);
            }
            _ => {}
        }
    }));
    let client = Client::with_options(client_options).expect("client");
    let db = client.database(&format!(
        "bench_scale_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(db.clone())
            .collection("scale.lock")
            .ttl(TTL)
            .build(),
    )
    .await
    .expect("connect");

    let started = Instant::now();
    let leases = futures::stream::iter(0..keys)
        .map(|i| {
            let manager = manager.clone();
            async move { manager.acquire(format!("key-{i:06}")).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await
        .expect("acquire");
    let acquired = started.elapsed();

    // The next heartbeat tick renews every lease: wait until renewal
    // commands started after the last acquire have covered them all.
    let after = Instant::now();
    let tick = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let log = renewals.0.lock().unwrap();
        let tick: Vec<_> = log
            .done
            .iter()
            .filter(|(at, _, _)| *at >= after)
            .copied()
            .collect();
        if tick.iter().map(|(_, _, n)| n).sum::<usize>() >= keys {
            break tick;
        }
    };
    let first = tick.iter().map(|(at, _, _)| *at).min().unwrap();
    let last = tick.iter().map(|(_, end, _)| *end).max().unwrap();
    let renewal = last - first;
    assert!(
        leases.iter().all(|l| !l.status().is_lost()),
        "no lease lost"
    );

    let shutdown_started = Instant::now();
    manager.shutdown().await.expect("shutdown");
    let shutdown = shutdown_started.elapsed();
    assert!(leases.iter().all(|l| l.status().is_lost()));
    let live = db
        .collection::<Document>("scale.lock")
        .count_documents(doc! { "lid": { "$exists": true } })
        .await
        .expect("count");
    assert_eq!(live, 0, "shutdown released every lease");
    db.drop().await.expect("drop the benchmark database");
    // Let the driver's background work finish while the runtime still runs it.
    drop(db);
    if tokio::time::timeout(Duration::from_secs(10), client.shutdown())
        .await
        .is_err()
    {
        eprintln!("the client's shutdown took over 10 s");
    }

    println!(
        "scale: {keys} keys held by one manager (TTL {TTL:?}, {CONCURRENCY} acquires in flight)"
    );
    println!(
        "  acquire:  {:>8.2} s  ({:.0} acquisitions/s)",
        acquired.as_secs_f64(),
        keys as f64 / acquired.as_secs_f64()
    );
    println!(
        "  renewal:  {:>8.2} s  for one heartbeat tick: {} updateMany of up to {} leases",
        renewal.as_secs_f64(),
        tick.len(),
        DEFAULT_RENEWAL_BATCH_SIZE
    );
    println!(
        "  shutdown: {:>8.2} s  (releases every lease)",
        shutdown.as_secs_f64()
    );
}
