//! The re-entrant task of the workload: a holder that re-enters the lease
//! it holds, and asks for it again without re-entering.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::{Instant, sleep};

use super::history::{Event, Kind, LeaseNo};
use super::workload::{Process, Recorder, granted, idle, ms, timed, wait};
use crate::caller::CallerId;
use crate::lease::Lease;
use crate::random::random_range;
use crate::status::ReleaseOutcome;
use std::future::IntoFuture;

/// A task of `process` that, until `stop`, acquires `key` for a caller of
/// its own (waiting, or with a timeout), then one to three times either
/// re-enters it (acquiring again as that caller, waiting or trying, or by
/// `Lease::reenter`) or asks for it again without re-entering (which must
/// be refused at once: a wait on itself would never end, and the liveness
/// property would find it), holds it a while, and releases (or drops) the
/// entries in a random order. An acquisition that finds the lease lost
/// meanwhile may get a new lease of the key: it is recorded as one.
pub async fn reentrant(
    recorder: Recorder,
    process: Arc<Process>,
    key: &'static str,
    stop: Arc<AtomicBool>,
) {
    let name = format!("locks/{key}");
    let manager = &process.manager;
    while !stop.load(Ordering::SeqCst) {
        let caller = CallerId::new();
        let reenter = || manager.acquire(key).caller(caller).reentrant();
        let acquired = async {
            match random_range(0..2) {
                0 => reenter().await.map(Some),
                _ => timed(reenter(), ms(random_range(1..3_000))).await,
            }
        };
        let (result, waited_from) = wait(&recorder, &process, name.clone(), acquired).await;
        let Ok(Some(lease)) = result else {
            sleep(ms(random_range(1..300))).await;
            continue;
        };
        let as_granted = |lease: &Lease, waited_from: Instant| {
            let key = (name.clone(), Kind::Exclusive);
            granted(&recorder, &process, key, lease, (waited_from, None))
        };
        let outer = as_granted(&lease, waited_from);
        let mut entries: Vec<(LeaseNo, Lease)> = vec![(outer, lease)];
        for _ in 0..random_range(1..=3usize) {
            idle(Instant::now() + ms(random_range(0..500)), &stop).await;
            let (_, base) = &entries[random_range(0..entries.len())];
            if base.status().is_lost() {
                break;
            }
            let again = match random_range(0..4) {
                0 => match base.reenter() {
                    Ok(entry) => Ok(Some(entry)),
                    Err(_) => break,
                },
                1 => {
                    let acquired = async { manager.acquire(key).caller(caller).await.map(Some) };
                    wait(&recorder, &process, name.clone(), acquired).await.0
                }
                2 => {
                    let acquired = manager
                        .try_acquire(key)
                        .caller(caller)
                        .reentrant()
                        .into_future();
                    wait(&recorder, &process, name.clone(), acquired).await.0
                }
                _ => {
                    let acquired = async { reenter().await.map(Some) };
                    wait(&recorder, &process, name.clone(), acquired).await.0
                }
            };
            let Ok(Some(entry)) = again else {
                continue;
            };
            // A re-entry of the entries' lease of that token (the outer
            // one, or a new lease taken after the outer one was lost).
            let reentered = entries
                .iter()
                .find(|(_, lease)| lease.fencing_token() == entry.fencing_token());
            let number = match reentered {
                Some((of, _)) => {
                    let (of, number) = (*of, recorder.number());
                    recorder.push(Event::Reentered {
                        lease: number,
                        of,
                        token: entry.fencing_token(),
                    });
                    number
                }
                // The lease was lost meanwhile: a new acquisition.
                None => as_granted(&entry, Instant::now()),
            };
            entries.push((number, entry));
        }
        let until = Instant::now() + ms(random_range(0..2_000));
        while Instant::now() < until
            && !entries.iter().any(|(_, lease)| lease.status().is_lost())
            && !stop.load(Ordering::SeqCst)
        {
            sleep(ms(random_range(1..200))).await;
        }
        while !entries.is_empty() {
            let (number, lease) = entries.swap_remove(random_range(0..entries.len()));
            recorder.push(Event::Released { lease: number });
            if random_range(0..4) == 0 {
                drop(lease);
            } else {
                let released = matches!(lease.release().await, Ok(ReleaseOutcome::Released));
                recorder.push(Event::ReleaseAnswered {
                    lease: number,
                    released,
                });
            }
        }
        sleep(ms(random_range(0..300))).await;
    }
}
