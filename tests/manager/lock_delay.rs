//! Lock-delay (docs/lock-delay.md): after an operator ends a live lease
//! (force release, release by owner id), nobody is granted its key for the
//! operator's manager's lock-delay, by the server's clock; its default is
//! the safety margin. Unless the operator says the holder is gone
//! (`.immediately()`), nobody is granted it before the ended lease's expiry
//! either: its holder, told at its next renewal, has stopped by then.

use crate::common;

use std::time::{Duration, SystemTime};

use common::{Fixture, within};
use mongo_lease::{Error, Lease, LeaseEvent, LeaseManager, ReleaseOutcome, Semaphore};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
/// Hang guard of the waits below (each takes at most the delay and a
/// heartbeat here).
const GUARD: Duration = Duration::from_secs(60);
/// How far the server's `$$NOW` may step back between two writes
/// (docs/mongodb-behaviour.md, B3): the grant may come that much early.
const STEP_BACK: Duration = Duration::from_millis(50);

async fn operator(fx: &Fixture, delay: Option<Duration>) -> LeaseManager {
    let mut options = fx.options(TTL).await;
    options.lock_delay = delay;
    LeaseManager::connect(options).await.expect("connect")
}

/// Asserts that `operator`'s lock-delay is `delay`, as the server shows it:
/// a force release (`immediately`) of a live lease on `key` (a key of its
/// own) writes `nb = $$NOW + delay`, between the server times read just
/// before and just after it.
async fn assert_lock_delay(fx: &Fixture, operator: &LeaseManager, key: &str, delay: Duration) {
    let lease = operator.acquire(key).await.unwrap();
    let before = operator
        .inspect(key)
        .await
        .unwrap()
        .expect("held")
        .server_time;
    operator
        .force_release(key)
        .immediately()
        .await
        .unwrap()
        .expect("held");
    let after = operator
        .inspect(key)
        .await
        .unwrap()
        .expect("kept")
        .server_time;
    let not_before: SystemTime = fx
        .doc(key)
        .await
        .get_datetime("nb")
        .expect("nb written")
        .to_system_time();
    assert!(
        before + delay <= not_before + STEP_BACK && not_before <= after + delay + STEP_BACK,
        "lock-delay {delay:?}: nb {not_before:?} not within [{before:?}, {after:?}] + {delay:?}"
    );
    drop(lease);
}

/// A force release: the holder is told lost at its next renewal, a waiter
/// of another manager gets the key only once the delay has passed, with a
/// greater fencing token; the document shows `nb`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_key_is_granted_again_only_after_the_lock_delay() {
    const DELAY: Duration = Duration::from_millis(1500);
    let fx = Fixture::new("delay_force").await;
    let [holder, waiter] = [fx.manager(TTL).await, fx.manager(TTL).await];
    let op = operator(&fx, Some(DELAY)).await;
    assert_lock_delay(&fx, &op, "probe", DELAY).await;
    let lease = holder.acquire("job").await.unwrap();
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire("job").await }
    });
    let start = Instant::now();
    let before = op
        .force_release("job")
        .immediately()
        .await
        .unwrap()
        .expect("held");
    assert_eq!(before.fencing_token, lease.fencing_token());
    let doc = fx.doc("job").await;
    assert_eq!(doc.get("nb"), doc.get("exp"), "{doc}");
    assert!(!doc.contains_key("lid"), "{doc}");
    // Nothing more to end: the delay stays.
    assert!(op.force_release("job").await.unwrap().is_none());
    assert!(waiter.try_acquire("job").await.unwrap().is_none());

    let next = within(GUARD, "the waiter's grant", wait)
        .await
        .unwrap()
        .unwrap();
    assert!(
        start.elapsed() + STEP_BACK >= DELAY,
        "granted {:?} after the force release",
        start.elapsed()
    );
    assert!(next.fencing_token() > lease.fencing_token());
    within(GUARD, "the holder told lost", lease.status().lost()).await;
    assert!(
        !fx.doc("job").await.contains_key("nb"),
        "a new acquisition removes nb"
    );
    for m in [holder, waiter, op] {
        m.shutdown().await.unwrap();
    }
}

/// A release by owner id delays every live lease of that owner, and no
/// waiting manager (registered in the key's queue) is handed one early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_owner_delays_each_live_lease_it_ends() {
    const DELAY: Duration = Duration::from_millis(1500);
    let fx = Fixture::new("delay_owner").await;
    let [holder, waiter] = [fx.manager(TTL).await, fx.manager(TTL).await];
    let op = operator(&fx, Some(DELAY)).await;
    let a = holder.acquire("a").await.unwrap();
    let b = holder.acquire("b").await.unwrap();
    let waits: Vec<_> = ["a", "b"]
        .map(|key| {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.acquire(key).await })
        })
        .into();
    // Registered in the queue: a release would hand it the key at once.
    common::eventually("the waiter registered on a", GUARD, || async {
        fx.doc("a")
            .await
            .get_array("q")
            .is_ok_and(|q| !q.is_empty())
    })
    .await;
    let start = Instant::now();
    assert_eq!(
        op.release_owner(holder.owner_id())
            .immediately()
            .await
            .unwrap(),
        2
    );
    for (wait, old) in waits.into_iter().zip([&a, &b]) {
        let next = within(GUARD, "a waiter's grant", wait)
            .await
            .unwrap()
            .unwrap();
        assert!(
            start.elapsed() + STEP_BACK >= DELAY,
            "{:?}",
            start.elapsed()
        );
        assert!(next.fencing_token() > old.fencing_token());
    }
    for m in [holder, waiter, op] {
        m.shutdown().await.unwrap();
    }
}

/// The default lock-delay is the manager's safety margin (a tenth of its
/// TTL by default); zero frees the key at once; more than an hour is
/// refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_delay_defaults_to_the_safety_margin_and_zero_frees_at_once() {
    let fx = Fixture::new("delay_default").await;
    let default = fx.manager(TTL).await;
    assert_lock_delay(&fx, &default, "probe-default", TTL / 10).await;
    let mut options = fx.options(TTL).await;
    options.safety_margin = Some(Duration::from_millis(700));
    let margin = LeaseManager::connect(options).await.unwrap();
    assert_lock_delay(&fx, &margin, "probe-margin", Duration::from_millis(700)).await;

    let none = operator(&fx, Some(Duration::ZERO)).await;
    let lease = default.acquire("k").await.unwrap();
    assert!(
        none.force_release("k")
            .immediately()
            .await
            .unwrap()
            .is_some()
    );
    let next = margin
        .try_acquire("k")
        .await
        .unwrap()
        .expect("free at once");
    assert!(next.fencing_token() > lease.fencing_token());

    let mut options = fx.options(TTL).await;
    options.lock_delay = Some(Duration::from_secs(7200));
    match LeaseManager::connect(options).await {
        Err(Error::InvalidConfig { reason }) => assert!(reason.contains("lock_delay"), "{reason}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    for m in [default, margin, none] {
        m.shutdown().await.unwrap();
    }
}

/// The holder's heartbeat (a third of [`SHORT_TTL`]) and safety margin
/// (a tenth, and so the operator's lock-delay) are the defaults.
const SHORT_TTL: Duration = Duration::from_secs(3);

/// A holder is renewed just now, another manager waits in the key's queue,
/// and `end` (an operator's override by `operator`, which does not say the
/// holder is gone) ends the lease: the holder is told only at its next
/// renewal, a heartbeat later, long after the lock-delay. The waiter is
/// granted the key only once the holder's lease is lost.
async fn granted_again_only_once_the_holder_is_lost(
    test: &str,
    end: impl AsyncFnOnce(&LeaseManager, &LeaseManager),
) {
    let fx = Fixture::new(test).await;
    let [holder, waiter, operator] = [
        fx.manager(SHORT_TTL).await,
        fx.manager(SHORT_TTL).await,
        fx.manager(SHORT_TTL).await,
    ];
    let lease = holder.acquire("job").await.unwrap();
    let mut events = lease.status().events();
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire("job").await }
    });
    common::eventually("the waiter registered", GUARD, || async {
        fx.doc("job")
            .await
            .get_array("q")
            .is_ok_and(|q| !q.is_empty())
    })
    .await;
    within(GUARD, "a renewal of the holder's lease", async {
        while !matches!(events.recv().await, Some(LeaseEvent::Renewed { .. })) {}
    })
    .await;
    end(&operator, &holder).await;
    let next = within(GUARD, "the waiter's grant", wait)
        .await
        .unwrap()
        .unwrap();
    let left = lease
        .status()
        .deadline()
        .map(|d| d.saturating_duration_since(Instant::now()));
    assert!(
        lease.status().is_lost(),
        "the waiter was granted the key (token {} > {}) while its holder still held it: \
         its local deadline {left:?} away, told of nothing",
        next.fencing_token(),
        lease.fencing_token()
    );
    assert!(next.fencing_token() > lease.fencing_token());
    for m in [holder, waiter, operator] {
        m.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_key_is_granted_again_only_once_its_holder_is_lost() {
    granted_again_only_once_the_holder_is_lost("delay_holder", async |operator, _| {
        let ended = operator.force_release("job").await.unwrap();
        assert!(ended.as_ref().is_some_and(|info| info.held), "{ended:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_released_by_owner_id_is_granted_again_only_once_its_holder_is_lost() {
    granted_again_only_once_the_holder_is_lost("delay_owner_holder", async |operator, holder| {
        assert_eq!(operator.release_owner(holder.owner_id()).await.unwrap(), 1);
    })
    .await;
}

/// Whether `lease` could still be live to its holder: not told lost and
/// before its local deadline.
fn still_live(lease: &Lease) -> bool {
    !lease.status().is_lost()
        && lease
            .status()
            .deadline()
            .is_some_and(|d| Instant::now() < d)
}

/// A semaphore of 2 permits held by a and b. A release by owner id of a
/// (not immediate) keeps a's permit taken until its expiry: c is refused
/// while a may still work, and granted only once a is lost (property 2:
/// never 3 live permits of 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_released_by_owner_id_stays_taken_while_its_holder_may_still_work() {
    let fx = Fixture::new("delay_owner_permit").await;
    let managers = fx.managers(4, SHORT_TTL).await;
    let [a, b, c, operator] = &managers[..] else {
        unreachable!()
    };
    let pa = Semaphore::new(a, "pool", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let pb = Semaphore::new(b, "pool", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(operator.release_owner(a.owner_id()).await.unwrap(), 1);
    let pool = Semaphore::new(c, "pool", 2).unwrap();
    if let Some(pc) = pool.try_acquire().await.unwrap() {
        assert!(
            !still_live(&pa),
            "3 live permits of 2: c {} granted beside a {} (released by owner id, not told) and b {}",
            pc.fencing_token(),
            pa.fencing_token(),
            pb.fencing_token()
        );
    }
    let pc = within(GUARD, "c's permit", pool.acquire()).await.unwrap();
    assert!(
        !still_live(&pa),
        "3 live permits of 2: c {} granted while a {} may still work",
        pc.fencing_token(),
        pa.fencing_token()
    );
    assert!(!pb.status().is_lost(), "b's permit was not released");
    for m in managers {
        m.shutdown().await.unwrap();
    }
}

/// A key shared by a and b. A release by owner id of a (not immediate)
/// keeps a's place until its expiry: once b releases, c's exclusive
/// acquisition is granted only once a is lost (property 2: no exclusive
/// lease beside a live shared one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_place_released_by_owner_id_keeps_an_exclusive_holder_out_while_its_holder_may_still_work()
 {
    let fx = Fixture::new("delay_owner_shared").await;
    let managers = fx.managers(4, SHORT_TTL).await;
    let [a, b, c, operator] = &managers[..] else {
        unreachable!()
    };
    let ra = a.acquire("catalogue").shared().await.unwrap();
    let rb = b.acquire("catalogue").shared().await.unwrap();
    assert_eq!(operator.release_owner(a.owner_id()).await.unwrap(), 1);
    assert_eq!(rb.release().await.unwrap(), ReleaseOutcome::Released);
    if let Some(writer) = c.try_acquire("catalogue").await.unwrap() {
        assert!(
            !still_live(&ra),
            "exclusive lease {} granted beside shared lease {} (released by owner id, not told)",
            writer.fencing_token(),
            ra.fencing_token()
        );
    }
    let writer = within(GUARD, "c's exclusive lease", c.acquire("catalogue"))
        .await
        .unwrap();
    assert!(
        !still_live(&ra),
        "exclusive lease {} granted while shared lease {} may still be read under",
        writer.fencing_token(),
        ra.fencing_token()
    );
    assert!(writer.fencing_token() > ra.fencing_token());
    for m in managers {
        m.shutdown().await.unwrap();
    }
}

/// Another application's TTL index on `ts` deletes a document its
/// `expireAfterSeconds` after the lease's last renewal, whatever `nb` says:
/// `connect` refuses a lock-delay that would outlast it, with an error that
/// names both, and accepts one within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_longer_than_a_ts_ttl_index_allows_is_refused_at_connect() {
    let fx = Fixture::new("delay_ts_index").await;
    common::others::pattern1_indexes(&fx, Duration::from_secs(5)).await;
    let connect = |delay: Duration| {
        let fx = &fx;
        async move {
            let mut options = fx.options(SHORT_TTL).await;
            options.lock_delay = Some(delay);
            LeaseManager::connect(options).await
        }
    };
    match connect(Duration::from_secs(20)).await {
        Err(Error::InvalidConfig { reason }) => {
            assert!(
                reason.contains("lock_delay") && reason.contains("`ts`"),
                "{reason}"
            );
        }
        other => panic!("a 20 s lock-delay under a 5 s TTL index on ts: {other:?}"),
    }
    let manager = connect(Duration::from_secs(2))
        .await
        .expect("within the index's time");
    assert_lock_delay(&fx, &manager, "probe", Duration::from_secs(2)).await;
    manager.shutdown().await.unwrap();
}
