//! The metrics of `crate::telemetry`, recorded by a manager under the
//! paused clock into `metrics-util`'s `DebuggingRecorder`, installed for
//! the test's thread only (the test runs a single-threaded runtime inside
//! `metrics::with_local_recorder`, so the manager task records there too).

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio_util::time::FutureExt as _;

use super::*;
use crate::telemetry::{
    ACQUIRE_WAIT, ACQUISITIONS, HELD_LEASES, LEASES_ENDED, RENEWAL_DURATION, RENEWAL_FAILURES,
    RENEWAL_LAG, WAITERS,
};

/// What was recorded so far, read from a [`Snapshotter`] (which hands out
/// counters and gauges as increments since the last snapshot, and
/// histograms' new values): the totals.
#[derive(Default)]
struct Recorded {
    values: HashMap<(String, Vec<(String, String)>), DebugValue>,
}

impl Recorded {
    fn update(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let entry = self.values.entry((key.name().to_owned(), labels));
            match (entry.or_insert(DebugValue::Counter(0)), value) {
                (DebugValue::Counter(total), DebugValue::Counter(n)) => *total += n,
                (slot @ DebugValue::Counter(0), value) => *slot = value,
                (DebugValue::Gauge(total), DebugValue::Gauge(n)) => total.0 += n.0,
                (DebugValue::Histogram(all), DebugValue::Histogram(new)) => all.extend(new),
                (slot, value) => panic!("{slot:?} then {value:?}"),
            }
        }
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut labels: Vec<_> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        self.values.get(&(name.to_owned(), labels))
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            other => panic!("{name} is {other:?}"),
        }
    }

    /// A gauge moved up and down (the sum of its moves).
    fn gauge(&self, name: &str) -> f64 {
        match self.get(name, &[]) {
            Some(DebugValue::Gauge(v)) => v.0,
            None => 0.0,
            other => panic!("{name} is {other:?}"),
        }
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.get(name, labels) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.0).collect(),
            None => Vec::new(),
            other => panic!("{name} is {other:?}"),
        }
    }
}

/// Runs `test` on a paused single-threaded runtime with a recorder of its
/// own; `test` reads what was recorded through the [`Snapshotter`].
fn with_recorder<F>(test: impl FnOnce(Snapshotter) -> F)
where
    F: Future<Output = ()>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorder, || runtime.block_on(test(snapshotter)));
}

const EXCLUSIVE_ACQUIRED: [(&str, &str); 2] = [("kind", "exclusive"), ("outcome", "acquired")];

#[test]
fn waits_queue_depth_held_leases_and_outcomes_are_recorded() {
    with_recorder(|snapshotter| async move {
        let mut recorded = Recorded::default();
        let db = MemoryDb::new();
        let (a, _, t0) = start(&db, "a");
        let first = a.acquire("k").await.unwrap();
        let second = waiter(&a, "k").await;
        let third = waiter(&a, "k").await;
        settle().await;
        recorded.update(&snapshotter);
        assert_eq!(recorded.gauge(WAITERS), 2.0, "two callers queued");
        assert_eq!(recorded.gauge(HELD_LEASES), 1.0);
        assert_eq!(recorded.counter(ACQUISITIONS, &EXCLUSIVE_ACQUIRED), 1);
        assert_eq!(
            recorded.histogram(ACQUIRE_WAIT, &[("kind", "exclusive")]),
            [0.0],
            "no wait at zero latency"
        );
        assert!(a.try_acquire("k").await.unwrap().is_none());
        assert!(
            a.acquire("k")
                .into_future()
                .timeout(Duration::from_secs(1))
                .await
                .ok()
                .transpose()
                .unwrap()
                .is_none()
        );

        sleep_until(t0 + Duration::from_secs(2)).await;
        assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
        let (_, second) = soon(second).await.unwrap().unwrap();
        recorded.update(&snapshotter);
        assert_eq!(recorded.gauge(WAITERS), 1.0, "the third still waits");
        assert_eq!(recorded.gauge(HELD_LEASES), 1.0);
        let waits = recorded.histogram(ACQUIRE_WAIT, &[("kind", "exclusive")]);
        assert_eq!(waits.len(), 2);
        assert!(
            (2.0..2.0 + RELEASE_WAKE_JITTER.as_secs_f64()).contains(&waits[1]),
            "waited from the request at t0 to the release at t0 + 2 s: {waits:?}"
        );
        let outcome = |o| recorded.counter(ACQUISITIONS, &[("kind", "exclusive"), ("outcome", o)]);
        assert_eq!(
            (
                outcome("acquired"),
                outcome("not_acquired"),
                outcome("timed_out")
            ),
            (2, 1, 1)
        );

        drop(second);
        let (_, third) = soon(third).await.unwrap().unwrap();
        assert_eq!(third.release().await.unwrap(), ReleaseOutcome::Released);
        recorded.update(&snapshotter);
        assert_eq!(recorded.gauge(WAITERS), 0.0);
        assert_eq!(recorded.gauge(HELD_LEASES), 0.0, "back to 0 after release");
        assert_eq!(recorded.counter(LEASES_ENDED, &[("reason", "released")]), 3);
        a.shutdown().await.unwrap();
    });
}

#[test]
fn renewals_their_failures_their_lag_and_an_expired_lease_are_recorded() {
    with_recorder(|snapshotter| async move {
        let mut recorded = Recorded::default();
        let db = MemoryDb::new();
        let (a, store, t0) = start(&db, "a");
        let lease = a.acquire("k").await.unwrap();
        let _kept = a.acquire("kept").await.unwrap();
        sleep_until(t0 + HEARTBEAT * 2 + HEARTBEAT / 2).await;
        recorded.update(&snapshotter);
        assert_eq!(
            recorded.histogram(RENEWAL_DURATION, &[]),
            [0.0, 0.0],
            "one batch per heartbeat, answered at once"
        );
        assert_eq!(recorded.counter(RENEWAL_FAILURES, &[]), 0);
        // The lag is read at each heartbeat, before its renewals: one
        // heartbeat old at the second.
        match recorded.get(RENEWAL_LAG, &[("owner_id", "a")]) {
            Some(DebugValue::Gauge(lag)) => assert_eq!(lag.0, HEARTBEAT.as_secs_f64()),
            other => panic!("renewal lag: {other:?}"),
        }

        store.hang_renewals();
        soon(lease.status().lost()).await;
        recorded.update(&snapshotter);
        assert!(recorded.counter(RENEWAL_FAILURES, &[]) >= 1);
        assert_eq!(recorded.counter(LEASES_ENDED, &[("reason", "expired")]), 2);
        assert_eq!(recorded.gauge(HELD_LEASES), 0.0);
    });
}
