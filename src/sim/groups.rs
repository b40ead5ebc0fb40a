//! The group task of the workload: several keys at once, in any order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::{Instant, sleep};

use super::history::{Event, Kind, LeaseNo};
use super::workload::{Process, Recorder, granted, ms, timed, wait};
use crate::random::random_range;
use crate::status::ReleaseOutcome;

/// Keys a group takes among: the exclusive tasks' keys (one of which
/// another application locks now and then), the read/write key, and one
/// of the groups' own.
const KEYS: [&str; 4] = ["x0", "x1", "rw", "g0"];

/// A task of `process` that, until `stop`, acquires two or three of
/// [`KEYS`], given in a random order, at once (`acquire_all`, waiting or
/// with a timeout, or `try_acquire_all`), holds them a while and releases
/// (or drops) the group. Tasks over overlapping keys in opposite orders
/// must all be served (the liveness property); each member is recorded as
/// a lease of its key, then the group ([`Event::GroupGranted`]).
pub async fn groups(recorder: Recorder, process: Arc<Process>, stop: Arc<AtomicBool>) {
    let manager = &process.manager;
    while !stop.load(Ordering::SeqCst) {
        let mut keys: Vec<&str> = KEYS.to_vec();
        for i in (1..keys.len()).rev() {
            keys.swap(i, random_range(0..=i));
        }
        keys.truncate(random_range(2..=3usize));
        let label: Vec<String> = keys.iter().map(|key| format!("locks/{key}")).collect();
        let acquired = async {
            match random_range(0..4) {
                0 | 1 => manager.acquire_all(keys.clone()).await.map(Some),
                2 => manager.try_acquire_all(keys.clone()).await,
                _ => {
                    timed(
                        manager.acquire_all(keys.clone()),
                        ms(random_range(1..3_000)),
                    )
                    .await
                }
            }
        };
        let (result, waited_from) = wait(&recorder, &process, label.join("+"), acquired).await;
        let group = match result {
            Ok(Some(group)) => group,
            Ok(None) => {
                sleep(ms(random_range(0..300))).await;
                continue;
            }
            Err(_) => {
                sleep(ms(random_range(1..100))).await;
                continue;
            }
        };
        let leases: Vec<LeaseNo> = group
            .leases()
            .iter()
            .map(|lease| {
                let key = (format!("locks/{}", lease.key()), Kind::Exclusive);
                granted(&recorder, &process, key, lease, (waited_from, None))
            })
            .collect();
        recorder.push(Event::GroupGranted {
            leases: leases.clone(),
        });
        let hold = match random_range(0..4) {
            0 => random_range(1_500..6_000),
            _ => random_range(0..1_500),
        };
        let until = Instant::now() + ms(hold);
        while Instant::now() < until && !group.status().is_lost() && !stop.load(Ordering::SeqCst) {
            sleep(ms(random_range(1..200))).await;
        }
        for lease in &leases {
            recorder.push(Event::Released { lease: *lease });
        }
        if random_range(0..4) == 0 {
            drop(group);
        } else {
            let released = matches!(group.release().await, Ok(ReleaseOutcome::Released));
            for lease in leases {
                recorder.push(Event::ReleaseAnswered { lease, released });
            }
        }
        sleep(ms(random_range(0..300))).await;
    }
}
