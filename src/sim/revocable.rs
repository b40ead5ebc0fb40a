//! The revocable holder of the workload: once faults stopped, it holds a
//! key of its own until its lease is told of a request to release it
//! (`LeaseEvent::RevocationRequested`), then releases it at once and takes
//! it again; every other request of the requester is for that key. Every
//! request that finds it held must reach it within the revocation
//! property's bound, and a lease that is never told outlives that bound,
//! so the property decides on those requests (holds of the other tasks
//! mostly end before it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout_at};

use super::checker::TOLD_WITHIN;
use super::history::{Event, Kind};
use super::workload::{Process, Recorder, granted, ms, wait};
use super::{FAULTS_STOP, WORK_STOP};
use crate::status::{LeaseEvent, ReleaseOutcome};

/// The key it holds (nobody else acquires it).
pub const KEY: &str = "v0";

/// How long it holds a lease that is never told: past the bound of a
/// request made at any time while requests are made (from the faults'
/// stop to the work's), and a little more for the last one's reply.
const UNTOLD_HOLD: Duration =
    Duration::from_secs(TOLD_WITHIN.as_secs() + WORK_STOP.as_secs() - FAULTS_STOP.as_secs() + 3);

/// A task of `process` that, once faults stopped and until `stop`,
/// acquires [`KEY`] and holds it until told of a request to release it (or
/// lost, or `UNTOLD_HOLD` passed), then releases it.
pub async fn revocable(recorder: Recorder, process: Arc<Process>, stop: Arc<AtomicBool>) {
    while recorder.at(Instant::now()) < FAULTS_STOP {
        sleep(ms(100)).await;
    }
    let name = format!("locks/{KEY}");
    while !stop.load(Ordering::SeqCst) {
        let acquired = async { process.manager.acquire(KEY).await.map(Some) };
        let (result, waited_from) = wait(&recorder, &process, name.clone(), acquired).await;
        let Ok(Some(lease)) = result else {
            sleep(ms(100)).await;
            continue;
        };
        let mut events = lease.status().events();
        let key = (name.clone(), Kind::Exclusive);
        let number = granted(&recorder, &process, key, &lease, (waited_from, None));
        // Told (its follower in `granted` records it), lost, or never told.
        let _ = timeout_at(Instant::now() + UNTOLD_HOLD, async {
            while let Some(event) = events.recv().await {
                if let LeaseEvent::RevocationRequested { .. } | LeaseEvent::Lost(_) = event {
                    return;
                }
            }
        })
        .await;
        recorder.push(Event::Released { lease: number });
        let released = matches!(lease.release().await, Ok(ReleaseOutcome::Released));
        recorder.push(Event::ReleaseAnswered {
            lease: number,
            released,
        });
        sleep(ms(100)).await;
    }
}
