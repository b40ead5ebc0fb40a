//! The metrics of `mongo_lease::telemetry`, recorded against a real MongoDB
//! into `metrics-util`'s `DebuggingRecorder`. Each test installs its own
//! recorder for its thread only (`metrics::with_local_recorder`) and runs a
//! single-threaded runtime inside it, so the manager task, which runs on
//! that thread, records there too, and tests running at the same time do
//! not see each other's series.

use crate::common;

use std::collections::HashMap;
use std::future::Future;
use std::future::IntoFuture;
use std::time::Duration;

use common::Fixture;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use mongo_lease::telemetry::{
    ACQUIRE_WAIT, ACQUISITIONS, CHANGE_STREAM_RESTARTS, HELD_LEASES, LEASES_ENDED,
    RENEWAL_DURATION, RENEWAL_FAILURES, RENEWAL_LAG, WAITERS,
};
use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::doc;
use tokio::time::Instant;
use tokio_util::time::FutureExt as _;

const TTL: Duration = Duration::from_secs(2);

/// How long a wait for an event may take before the test fails. It only
/// turns a hang into a failure: each waits for at most two heartbeats
/// (under a second here).
const BOUND: Duration = Duration::from_secs(30);

type Series = (String, Vec<(String, String)>);

/// Totals of what was recorded so far. A [`Snapshotter`] hands out counters
/// and gauges as their moves since the previous snapshot, and histograms'
/// new values; this adds them up.
struct Recorded {
    snapshotter: Snapshotter,
    values: HashMap<Series, DebugValue>,
}

impl Recorded {
    fn new(snapshotter: Snapshotter) -> Self {
        Recorded {
            snapshotter,
            values: HashMap::new(),
        }
    }

    /// Takes in what was recorded since the last call.
    fn update(&mut self) -> &mut Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let series = series(
                key.name(),
                key.labels().map(|l| (l.key(), l.value())).collect(),
            );
            match (
                self.values.entry(series).or_insert(DebugValue::Counter(0)),
                value,
            ) {
                (DebugValue::Counter(total), DebugValue::Counter(n)) => *total += n,
                (slot @ DebugValue::Counter(0), value) => *slot = value,
                (DebugValue::Gauge(total), DebugValue::Gauge(n)) => total.0 += n.0,
                (DebugValue::Histogram(all), DebugValue::Histogram(new)) => all.extend(new),
                (slot, value) => panic!("{slot:?} then {value:?}"),
            }
        }
        self
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.values.get(&series(name, labels.to_vec())) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            other => panic!("{name} is {other:?}"),
        }
    }

    /// A gauge moved up and down by increments (the sum of its moves).
    fn gauge(&self, name: &str) -> f64 {
        match self.values.get(&series(name, Vec::new())) {
            Some(DebugValue::Gauge(v)) => v.0,
            None => 0.0,
            other => panic!("{name} is {other:?}"),
        }
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.values.get(&series(name, labels.to_vec())) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.0).collect(),
            None => Vec::new(),
            other => panic!("{name} is {other:?}"),
        }
    }

    /// Waits (bounded, see [`BOUND`]) until `done` holds of the totals.
    async fn until(&mut self, what: &str, done: impl Fn(&Recorded) -> bool) {
        self.until_within(BOUND, what, done).await;
    }

    /// Waits at most `bound` until `done` holds of the totals.
    async fn until_within(
        &mut self,
        bound: Duration,
        what: &str,
        done: impl Fn(&Recorded) -> bool,
    ) {
        let started = Instant::now();
        while !done(self.update()) {
            assert!(started.elapsed() < bound, "waited {bound:?} for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn series(name: &str, labels: Vec<(&str, &str)>) -> Series {
    let mut labels: Vec<_> = labels
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

/// Runs `test` on a single-threaded runtime with a recorder of its own.
fn with_recorder<F: Future<Output = ()>>(test: impl FnOnce(Recorded) -> F) {
    let recorder = DebuggingRecorder::new();
    let recorded = Recorded::new(recorder.snapshotter());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(test(recorded)));
}

/// Polls `fut` once, so that its acquire is queued, then runs it in a task.
async fn queued<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    let mut fut = Box::pin(fut);
    assert!(futures::poll!(&mut fut).is_pending());
    tokio::spawn(fut)
}

#[test]
fn acquisitions_waits_queue_depth_renewals_and_held_leases_are_recorded() {
    with_recorder(|mut recorded| async move {
        let f = Fixture::new("metrics_acquire").await;
        let a = f.manager(TTL).await;
        let b = f.manager(TTL).await;
        let held = a.acquire("k").await.unwrap();
        let requested = Instant::now();
        let (b1, b2) = (b.clone(), b.clone());
        let first = queued(async move { b1.acquire("k").await }).await;
        let second = queued(async move { b2.acquire("k").await }).await;
        recorded.update();
        assert_eq!(recorded.gauge(WAITERS), 2.0, "two callers queued");
        assert_eq!(recorded.gauge(HELD_LEASES), 1.0);
        let outcome =
            |r: &Recorded, o| r.counter(ACQUISITIONS, &[("kind", "exclusive"), ("outcome", o)]);
        assert_eq!(outcome(&recorded, "acquired"), 1);
        assert!(b.try_acquire("k").await.unwrap().is_none());
        assert!(
            b.acquire("k")
                .into_future()
                .timeout(Duration::from_millis(10))
                .await
                .ok()
                .transpose()
                .unwrap()
                .is_none()
        );
        recorded.update();
        assert_eq!(outcome(&recorded, "not_acquired"), 1);
        assert_eq!(outcome(&recorded, "timed_out"), 1);

        // A heartbeat renews the held lease in one batch.
        recorded
            .until("a renewal batch", |r| {
                !r.histogram(RENEWAL_DURATION, &[]).is_empty()
            })
            .await;
        assert_eq!(recorded.counter(RENEWAL_FAILURES, &[]), 0);
        let lags = [a.owner_id(), b.owner_id()].map(|owner| {
            recorded
                .values
                .contains_key(&series(RENEWAL_LAG, vec![("owner_id", owner)]))
        });
        assert!(
            lags.contains(&true),
            "the heartbeat records the renewal lag: {lags:?}"
        );

        let released = Instant::now();
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        let first = common::within(BOUND, "the first waiter's handoff", first)
            .await
            .unwrap()
            .unwrap();
        recorded.update();
        let waits = recorded.histogram(ACQUIRE_WAIT, &[("kind", "exclusive")]);
        assert_eq!(waits.len(), 2, "{waits:?}");
        let waited = released.duration_since(requested).as_secs_f64();
        assert!(
            waits[1] >= waited,
            "waited from its request to the release at least: {waits:?} < {waited}"
        );
        assert_eq!(recorded.gauge(WAITERS), 1.0, "the second still waits");
        assert_eq!(recorded.gauge(HELD_LEASES), 1.0);

        assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
        let second = common::within(BOUND, "the second waiter's handoff", second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
        recorded.update();
        assert_eq!(recorded.gauge(WAITERS), 0.0);
        assert_eq!(recorded.gauge(HELD_LEASES), 0.0, "back to 0");
        assert_eq!(recorded.counter(LEASES_ENDED, &[("reason", "released")]), 3);
        assert_eq!(outcome(&recorded, "acquired"), 3);
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();
    });
}

#[test]
fn leases_ended_are_counted_by_the_reason_each_lease_reports() {
    with_recorder(|mut recorded| async move {
        let f = Fixture::new("metrics_ended").await;
        let a = f.manager(TTL).await;
        let deleted = a.acquire("deleted").await.unwrap();
        let _kept = a.acquire("kept").await.unwrap();

        f.raw().delete_one(doc! { "_id": "deleted" }).await.unwrap();
        tokio::time::timeout(BOUND, deleted.status().lost())
            .await
            .expect("the deleted lease is lost");
        let reason = deleted
            .status()
            .lost_reason()
            .expect("a lost lease has a reason");
        assert!(reason.is_involuntary(), "{reason}");
        recorded.update();
        assert_eq!(
            recorded.counter(LEASES_ENDED, &[("reason", reason.as_str())]),
            1
        );
        assert_eq!(recorded.gauge(HELD_LEASES), 1.0);

        a.shutdown().await.unwrap();
        recorded.update();
        assert_eq!(
            recorded.counter(LEASES_ENDED, &[("reason", "shutdown")]),
            1,
            "the lease still held at shutdown"
        );
        assert_eq!(recorded.gauge(HELD_LEASES), 0.0);
    });
}

/// The manager's change stream of writes fails (its `getMore` answered once
/// with ExceededTimeLimit and no label, which the driver does not resume by
/// itself): the manager reopens it at a heartbeat once its retry delay (5 s)
/// has passed, and counts the restart, once.
#[test]
fn a_change_stream_reopened_after_a_failure_is_counted() {
    /// The restart comes about 5 s after the failure: 12x that.
    const RESTART_BOUND: Duration = Duration::from_secs(60);
    with_recorder(|mut recorded| async move {
        let rs = ReplicaSet::start(
            ReplicaSetOptions::default()
                .extra_arg("--setParameter")
                .extra_arg("enableTestCommands=1"),
        )
        .await
        .expect("a replica set with test commands");
        let mut options = mongodb::options::ClientOptions::parse(rs.uri())
            .await
            .unwrap();
        options.app_name = Some("stream-restarts".into());
        let client = mongodb::Client::with_options(options).unwrap();
        let manager = LeaseManager::connect(
            LeaseManagerOptions::builder()
                .database(client.database("d"))
                .collection("job.lock")
                .ttl(TTL)
                .clock_skew(common::clock_skew(TTL))
                // Its stream of writes stays open while it holds a lease.
                .watch_held_leases(true)
                .build(),
        )
        .await
        .unwrap();
        let held = manager.acquire("held").await.unwrap();
        let restarts = |r: &Recorded| r.counter(CHANGE_STREAM_RESTARTS, &[("place", "locks")]);
        assert_eq!(restarts(recorded.update()), 0);

        rs.fail_command(
            doc! { "times": 1 }.into(),
            doc! {
                "failCommands": ["getMore"], "appName": "stream-restarts",
                "errorCode": 262, "errorLabels": [],
            },
        )
        .await
        .unwrap();
        // A release announced on the stream answers the `getMore` waiting
        // now (the server holds an idle one up to 10 s), so the next one
        // meets the fail point at once.
        let poke = manager.acquire("poke").await.unwrap();
        assert_eq!(poke.release().await.unwrap(), ReleaseOutcome::Released);
        recorded
            .until_within(RESTART_BOUND, "the stream's restart", |r| restarts(r) == 1)
            .await;

        assert_eq!(restarts(recorded.update()), 1, "one failure, one restart");
        assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
        manager.shutdown().await.unwrap();
    });
}
