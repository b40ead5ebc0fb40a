//! Servers that cannot be reached, never answer, or go away while a lease
//! is held: bounded calls and clear errors.

use std::time::Duration;

use mongo_lease::{Error, LeaseManager, ReleaseOutcome};
use tokio::time::Instant;

use crate::common::{Clients, server_behind_proxy};
use crate::support::{BOUND, bounded, options_for};

#[tokio::test]
async fn an_unresolvable_host_is_a_bounded_clear_error() {
    let clients = Clients::default();
    let options = options_for(
        &clients,
        "mongodb://no-such-host.invalid:27017/?serverSelectionTimeoutMS=60000",
        "d",
        Duration::from_millis(800),
    )
    .await;
    let (result, took) = bounded("connect", BOUND, LeaseManager::connect(options)).await;
    let e = result.unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e}");
    assert!(e.is_transient());
    eprintln!("unresolvable host: {e} (after {took:?})");
}

/// A server that accepts the connection and then never answers (a
/// blackholed link): connect gives up after the operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_a_bounded_clear_error() {
    let (_rs, proxy, uri) = server_behind_proxy().await;
    let clients = Clients::default();
    proxy.blackhole();
    let options = options_for(&clients, &uri, "d", Duration::from_millis(800)).await;
    let (result, took) = bounded("connect", BOUND, LeaseManager::connect(options)).await;
    let e = result.unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e}");
    assert!(took >= Duration::from_millis(800), "{took:?}");
    eprintln!("blackholed server: {e} (after {took:?})");
}

/// The server becomes unreachable while a manager holds a lease: every call
/// ends within a bound, the lease's token fires at its local deadline, and
/// once the link heals the manager works again and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_server_mid_lease_gives_bounded_calls_and_a_fired_token() {
    let (_rs, proxy, uri) = server_behind_proxy().await;
    let clients = Clients::default();
    let op = Duration::from_millis(800);
    let manager = LeaseManager::connect(options_for(&clients, &uri, "d", op).await)
        .await
        .unwrap();
    let acquired = Instant::now();
    let lease = manager.acquire("held").await.unwrap();
    let fired = {
        let token = lease.status().cancellation_token();
        tokio::spawn(async move {
            token.cancelled().await;
            acquired.elapsed()
        })
    };

    proxy.blackhole();
    let (r, took) = bounded("try_acquire", BOUND, manager.try_acquire("other")).await;
    let e = r.unwrap_err();
    assert!(e.is_transient(), "{e}");
    eprintln!("try_acquire while unreachable: {e} after {took:?}");
    let (r, took) = bounded("acquire under a timeout", BOUND, async {
        let wait = manager.acquire("other2");
        tokio::time::timeout(Duration::from_secs(1), wait)
            .await
            .ok()
            .transpose()
    })
    .await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    // It gave up at its own timeout, not earlier (no upper bound here: how
    // soon after it the reply arrives depends on the machine's load).
    assert!(took >= Duration::from_secs(1), "{took:?}");
    // The token fires at the local deadline: TTL 2 s − margin 0.2 s − clock
    // skew 0.2 s after the acquire was sent, not earlier. (That it fires
    // before another owner can take the key is checked by ordering, in
    // `tests/manager/deadline.rs`.)
    let (fired, _) = bounded("the lost-lease signal", BOUND, fired).await;
    let fired = fired.unwrap();
    assert!(
        fired >= Duration::from_millis(1500),
        "fired after {fired:?}"
    );
    let (r, _) = bounded("release", BOUND, lease.release()).await;
    assert_eq!(r.unwrap(), ReleaseOutcome::AlreadyLost);

    // Connections reset by peer, then healed: the manager recovers.
    proxy.reset();
    proxy.heal();
    let (r, took) = bounded("acquire after the heal", BOUND, manager.acquire("held")).await;
    let lease = r.unwrap();
    eprintln!("acquired again {took:?} after the heal");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);

    // Shutdown while unreachable is bounded too, and reports the failure.
    let _held = manager.acquire("kept").await.unwrap();
    proxy.blackhole();
    let (r, took) = bounded("shutdown", BOUND, manager.shutdown()).await;
    eprintln!("shutdown while unreachable: {r:?} after {took:?}");
    assert!(r.unwrap_err().is_transient());
    // Healed, so that the client's shutdown at the end can close the change
    // stream the failed manager shutdown left open.
    proxy.heal();
}
