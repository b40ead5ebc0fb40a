//! One manager holding 2 000 keys, renewed in batches.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use mongo_lease::LeaseManager;
use mongodb::bson::{Document, doc};

use crate::common::{self, Fixture};
use crate::support::{BOUND, bounded};

/// Keys held at once by the manager of the many-keys test: enough for
/// several renewal batches and a partial one. Scale is the bench's
/// (`benches/scale.rs`, 100 000 keys), not this test's.
const MANY: usize = 2_000;
/// Its renewal batch size: not a divisor of `MANY`, so a tick ends with a
/// partial batch.
const BATCH: usize = 600;
/// Its heartbeat interval. A renewal that takes longer is abandoned and
/// retried (which would add commands to a tick); a tick renewing 10 000
/// leases takes about 0.25 s here (`benches/scale.rs` renews 100 000 in
/// 2.4 s), so this is 20x that for five times fewer.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// The keys named by each renewal command in `log`, in the order sent.
fn renewal_commands(log: &[(String, Document)]) -> Vec<Vec<String>> {
    log.iter()
        .filter(|(name, _)| name == "update")
        .filter_map(|(_, command)| {
            let keys = common::renewal::renewed_keys(command)?;
            Some(
                keys.iter()
                    .map(|k| k.as_str().expect("string keys").to_owned())
                    .collect(),
            )
        })
        .collect()
}

/// Splits renewal commands into heartbeat ticks (a tick renews each held
/// lease at most once, so a key seen again starts the next tick) and
/// returns the first tick that renewed `keys` leases.
fn first_tick_renewing(commands: &[Vec<String>], keys: usize) -> Option<Vec<Vec<String>>> {
    let mut tick: Vec<Vec<String>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for command in commands {
        if command.iter().any(|k| seen.contains(k)) {
            tick.clear();
            seen.clear();
        }
        seen.extend(command.iter().cloned());
        tick.push(command.clone());
        if seen.len() == keys {
            return Some(tick);
        }
    }
    None
}

/// One manager holds `MANY` distinct keys at once: every acquire succeeds,
/// a heartbeat tick renews them all in exactly ceil(n / batch) commands,
/// nothing is lost while held, and shutdown releases every lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_manager_holds_2_000_keys_renewed_in_batches() {
    let fx = Fixture::new("many").await;
    let (mut options, log) = fx.monitored_options(Duration::from_secs(30), "").await;
    options.renewal_batch_size = BATCH;
    options.heartbeat_interval = Some(HEARTBEAT);
    let manager = LeaseManager::connect(options).await.unwrap();
    let keys: Vec<String> = (0..MANY).map(|i| format!("key-{i:05}")).collect();
    // Only a hang guard: 10 000 acquisitions took 39 s here with the
    // machine's load at 9 (two cores), so this is 75x that for 2 000.
    let (leases, took) = bounded(
        &format!("acquiring {MANY} keys"),
        Duration::from_secs(600),
        futures::stream::iter(keys.clone())
            .map(|key| {
                let manager = manager.clone();
                async move { manager.acquire(key).await }
            })
            .buffer_unordered(256)
            .try_collect::<Vec<_>>(),
    )
    .await;
    let leases = leases.unwrap();
    assert_eq!(leases.len(), MANY);
    eprintln!("{MANY} keys acquired in {took:?}");

    // The first tick after the last acquire renews every lease (ticks during
    // the acquisitions renewed fewer), in ceil(MANY / BATCH) commands.
    let mark = log.all().len();
    let mut tick = None;
    common::eventually(
        "a heartbeat tick renewed every lease",
        HEARTBEAT * 20,
        || {
            tick = first_tick_renewing(&renewal_commands(&log.all()[mark..]), MANY);
            std::future::ready(tick.is_some())
        },
    )
    .await;
    let tick = tick.unwrap();
    let sizes: Vec<usize> = tick.iter().map(Vec::len).collect();
    assert_eq!(
        tick.len(),
        MANY.div_ceil(BATCH),
        "renewal commands in one tick (batch sizes {sizes:?})"
    );
    assert!(sizes.iter().all(|&n| n <= BATCH), "{sizes:?}");
    let mut renewed: Vec<String> = tick.into_iter().flatten().collect();
    renewed.sort();
    assert_eq!(renewed, keys, "each lease renewed exactly once in the tick");

    assert_eq!(
        leases.iter().filter(|l| l.status().is_lost()).count(),
        0,
        "leases lost while held"
    );
    let live = fx
        .raw()
        .count_documents(doc! { "lid": { "$exists": true } })
        .await
        .unwrap();
    assert_eq!(live as usize, MANY);
    bounded("shutdown", BOUND * 4, manager.shutdown())
        .await
        .0
        .unwrap();
    assert!(
        leases.iter().all(|l| l.status().is_lost()),
        "shutdown cancels every token"
    );
    let live = fx
        .raw()
        .count_documents(doc! { "lid": { "$exists": true } })
        .await
        .unwrap();
    assert_eq!(live, 0, "shutdown released every lease");
}
