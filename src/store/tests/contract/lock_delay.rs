//! Lock-delay ("Lock-delay" in `store`): after a force release, or a
//! release by owner id, of a live lease, no kind is granted the key, and
//! nobody is handed it, before `nb`; an expired lease is not delayed, and
//! on a shared or semaphore key whose other holders remain, the ended
//! holder's place stays taken until its expiry (unless immediate).

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::kinds::{shape, take_as};
use super::{Fixture, held, raw, take};
use crate::kind::LeaseKind;
use crate::store::light_acquire::{LightAcquire, LightAcquired};
use crate::store::{AcquireOutcome, Store};

/// Longer than any scenario: a key it delays stays delayed throughout.
const LONG: Duration = Duration::from_secs(600);

/// An attempt by `store` on `key` as `kind`, waiting.
async fn attempt(store: &impl Store, key: &str, kind: LeaseKind) -> AcquireOutcome {
    let ttl = store.default_ttl();
    store
        .acquire_shaped(key.into(), Uuid::new_v4(), true, ttl, shape(kind))
        .await
        .unwrap()
}

/// Asserts that an attempt by `store` on `key` as `kind` finds it held
/// until about [`LONG`] from now, and a read shows the delay's end.
async fn held_for_long(store: &impl Store, key: &str, kind: LeaseKind) {
    read_delayed(store, key).await;
    match attempt(store, key, kind).await {
        AcquireOutcome::Held { remaining, .. } => assert!(
            remaining.is_some_and(|r| r > LONG - Duration::from_secs(60)),
            "{key}: {remaining:?}"
        ),
        other => panic!("{key} as {kind:?}: {other:?}"),
    }
}

/// Asserts that a read of `key` shows its lock-delay ending about [`LONG`]
/// from the server's now (`LeaseInfo::lock_delay_until`).
async fn read_delayed(store: &impl Store, key: &str) {
    let info = store
        .inspect(key.into())
        .await
        .unwrap()
        .expect("a document");
    let left =
        (info.lock_delay_until).and_then(|until| until.duration_since(info.server_time).ok());
    assert!(
        left.is_some_and(|left| left > LONG - Duration::from_secs(60) && left <= LONG),
        "{key}: {info:?}"
    );
}

/// Asserts that every kind's attempt on `key` finds it held until about
/// [`LONG`] from now (not a mismatch, not acquired), that the light
/// acquire does not take it, and that a read shows the delay's end.
async fn delayed(store: &impl Store, key: &str) {
    read_delayed(store, key).await;
    let remaining = held(store, key, true, "a").await;
    assert!(
        remaining > LONG - Duration::from_secs(60) && remaining <= LONG,
        "{key}: {remaining:?}"
    );
    for kind in [LeaseKind::Shared, LeaseKind::Permit { permits: 3 }] {
        match attempt(store, key, kind).await {
            AcquireOutcome::Held { remaining, .. } => {
                assert!(remaining.is_some_and(|r| r > LONG - Duration::from_secs(60)))
            }
            other => panic!("{key} as {kind:?}: {other:?}"),
        }
    }
    let light = LightAcquire {
        key: key.into(),
        lease_id: Uuid::new_v4(),
        ttl: super::TTL,
        started: tokio::time::Instant::now(),
    };
    let answers = store.acquire_light(vec![light]).await;
    assert!(
        matches!(answers[..], [LightAcquired::NotApplied]),
        "{answers:?}"
    );
}

pub(super) async fn a_force_release_keeps_the_key_from_every_kind_until_the_lock_delay_ends<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let operator = f.delaying_store("op", LONG).await;
    assert_eq!(operator.profile().lock_delay, LONG);
    let (la, ta) = take(&a, "k").await;
    let before = operator
        .force_release("k".into(), OverrideEnd::Immediately)
        .await
        .unwrap();
    assert_eq!(before.map(|i| i.fencing_token), Some(ta));
    let r = raw(f, "k").await;
    assert_eq!((r.lease_id, r.expired), (None, false));
    assert_eq!(
        a.renew(vec![la]).await.unwrap().len(),
        1,
        "the lease is lost"
    );
    delayed(&b, "k").await;
    // Nothing held: a second force release ends nothing, and does not
    // shorten the delay.
    assert_eq!(
        operator
            .force_release("k".into(), OverrideEnd::AtExpiry)
            .await
            .unwrap(),
        None
    );
    delayed(&b, "k").await;

    // Every kind: a shared key's holders are ended, and delayed, too.
    let (_, _) = take_as(&a, "s", shape(LeaseKind::Shared)).await;
    assert!(
        operator
            .force_release("s".into(), OverrideEnd::Immediately)
            .await
            .unwrap()
            .is_some()
    );
    delayed(&b, "s").await;

    // A short delay: the key is free once it has passed, by the server's
    // clock (the same machine's here), and the next token is greater.
    let short = Duration::from_millis(700);
    let quick = f.delaying_store("op", short).await;
    let (_, tq) = take(&a, "q").await;
    let start = Instant::now();
    assert!(
        quick
            .force_release("q".into(), OverrideEnd::Immediately)
            .await
            .unwrap()
            .is_some()
    );
    let bound = start + Duration::from_secs(30);
    let token = loop {
        match b.attempt("q".into(), Uuid::new_v4(), false).await.unwrap() {
            AcquireOutcome::Acquired { token } => break token,
            AcquireOutcome::Held { .. } if Instant::now() < bound => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("q: {other:?}"),
        }
    };
    // Less the server's `$$NOW` stepping back a few ms (B3).
    assert!(
        start.elapsed() >= short - Duration::from_millis(50),
        "{:?}",
        start.elapsed()
    );
    assert!(token > tq);
}

/// By default an override keeps the key of the live lease it ends until
/// that lease's expiry (`nb = max(exp, $$NOW + delay)`): its holder, told at
/// its next renewal at the latest, has stopped by then. An override marked
/// immediate frees the key after the lock-delay alone, also a key an
/// earlier override left waiting.
pub(super) async fn an_override_keeps_the_key_until_the_ended_lease_expires_unless_immediate<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b, c] = super::stores(f, ["a", "b", "c"]).await;
    let (la, ta) = take(&a, "k").await;
    let left = held(&b, "k", false, "a").await;
    assert!(left > super::TTL - Duration::from_secs(5), "{left:?}");
    // A force release: the lease is ended, its key waits for its expiry.
    let was = b
        .force_release("k".into(), OverrideEnd::AtExpiry)
        .await
        .unwrap()
        .expect("held");
    assert_eq!(was.fencing_token, ta);
    assert_eq!(
        a.renew(vec![la]).await.unwrap().len(),
        1,
        "the lease is lost"
    );
    let r = raw(f, "k").await;
    assert_eq!((r.lease_id, r.expired), (None, false));
    let waiting = held(&b, "k", true, "a").await;
    assert!(
        waiting > left - Duration::from_secs(5) && waiting <= left,
        "{waiting:?}"
    );
    // Marked immediate (no lock-delay here): free at once, a greater token.
    assert_eq!(
        b.force_release("k".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        None,
        "nothing was held"
    );
    let (_, tb) = take(&b, "k").await;
    assert!(tb > ta);

    // A release by owner id likewise: its live lease waits for its expiry,
    // and an immediate one frees at once.
    let (_, _) = take(&a, "o").await;
    assert_eq!(
        b.release_owner("a".into(), OverrideEnd::AtExpiry)
            .await
            .unwrap(),
        1
    );
    assert!(held(&b, "o", true, "a").await > super::TTL - Duration::from_secs(5));
    let (_, _) = take(&a, "p").await;
    assert_eq!(
        b.release_owner("a".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        1
    );
    take(&b, "p").await;

    // A permit (or a shared place) released by owner id keeps its place
    // until its expiry, as its holder may still work; the other holder's
    // stays; a second such release finds nothing; an immediate one frees
    // the place.
    let two = LeaseKind::Permit { permits: 2 };
    let (pa, _) = take_as(&a, "pool", shape(two)).await;
    let (pc, _) = take_as(&c, "pool", shape(two)).await;
    let (sa, _) = take_as(&a, "s", shape(LeaseKind::Shared)).await;
    take_as(&c, "s", shape(LeaseKind::Shared)).await;
    let ended = b.release_owner("a".into(), OverrideEnd::AtExpiry);
    assert_eq!(ended.await.unwrap(), 2);
    let outcome = attempt(&b, "pool", two).await;
    assert!(
        matches!(outcome, AcquireOutcome::Held { .. }),
        "{outcome:?}"
    );
    // An attempt of a's under its ended lease id, landing late, takes no
    // place again, though the shared key admits another holder.
    let ttl = a.default_ttl();
    let late = a.acquire_shaped("s".into(), sa.lease_id, true, ttl, shape(LeaseKind::Shared));
    let late = late.await.unwrap();
    assert!(matches!(late, AcquireOutcome::Held { .. }), "{late:?}");
    assert_eq!(
        a.renew(vec![pa, sa]).await.unwrap().len(),
        2,
        "a's are lost"
    );
    assert_eq!(c.renew(vec![pc]).await.unwrap().len(), 0, "c's is not");
    let again = b.release_owner("a".into(), OverrideEnd::AtExpiry);
    assert_eq!(again.await.unwrap(), 0);
    let now = b.release_owner("a".into(), OverrideEnd::Immediately);
    assert_eq!(now.await.unwrap(), 2);
    take_as(&b, "pool", shape(two)).await;
}

/// A release by owner id that waits for the holders keeps a key all of
/// whose live holders were that owner's until their expiry (`nb`); an
/// immediate one then frees the places it kept, but ends no live lease, so
/// it writes no lock-delay of its own and keeps that wait: `exp` stays at
/// least `nb`, and every kind finds the key held until then.
pub(super) async fn an_immediate_release_by_owner_id_of_kept_places_keeps_the_earlier_wait<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b] = super::stores(f, ["a", "b"]).await;
    assert_eq!(b.profile().lock_delay, Duration::ZERO);
    let one = LeaseKind::Permit { permits: 1 };
    take_as(&a, "pool", shape(one)).await;
    let ended = b.release_owner("a".into(), OverrideEnd::AtExpiry);
    assert_eq!(ended.await.unwrap(), 1);
    let kept = match attempt(&b, "pool", one).await {
        AcquireOutcome::Held {
            remaining: Some(remaining),
            ..
        } => remaining,
        other => panic!("pool: {other:?}"),
    };
    assert!(kept > super::TTL - Duration::from_secs(5), "{kept:?}");
    let now = b.release_owner("a".into(), OverrideEnd::Immediately);
    assert_eq!(now.await.unwrap(), 1);
    let r = raw(f, "pool").await;
    assert_eq!((r.lease_id, r.expired), (None, false));
    let left = held(&b, "pool", false, "a").await;
    assert!(
        left > kept - Duration::from_secs(5) && left <= kept,
        "{left:?}"
    );
    let outcome = attempt(&b, "pool", one).await;
    assert!(
        matches!(outcome, AcquireOutcome::Held { .. }),
        "{outcome:?}"
    );
}

/// A release by owner id that waits for the holders (the default) delays
/// a shared or semaphore key all of whose live holders were that owner's:
/// it keeps their places until their expiry, and no holder joins them
/// before the lock-delay ends, even where the kind has room beside them.
pub(super) async fn a_release_by_owner_id_keeps_joiners_out_of_the_places_it_kept_until_the_lock_delay_ends<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b] = super::stores(f, ["a", "b"]).await;
    let operator = f.delaying_store("op", LONG).await;
    let two = LeaseKind::Permit { permits: 2 };
    take_as(&a, "shared", shape(LeaseKind::Shared)).await;
    take_as(&a, "pool", shape(two)).await;
    let ended = operator.release_owner("a".into(), OverrideEnd::AtExpiry);
    assert_eq!(ended.await.unwrap(), 2);
    for (key, kind) in [("shared", LeaseKind::Shared), ("pool", two)] {
        held_for_long(&b, key, kind).await;
        assert!(!raw(f, key).await.expired, "{key}");
    }
}

/// Releases by owner id that end a shared or semaphore key's owners one at
/// a time delay it as one that ends them all at once: the last one finds
/// only its owner's places and those an earlier one kept (`xl`).
pub(super) async fn releases_by_owner_id_one_owner_at_a_time_delay_the_key_they_end<F: Fixture>(
    f: &F,
) {
    let [a, b, c] = super::stores(f, ["a", "b", "c"]).await;
    let operator = f.delaying_store("op", LONG).await;
    let three = LeaseKind::Permit { permits: 3 };
    for store in [&a, &c] {
        take_as(store, "shared", shape(LeaseKind::Shared)).await;
        take_as(store, "pool", shape(three)).await;
    }
    for owner in ["a", "c"] {
        let ended = operator.release_owner(owner.into(), OverrideEnd::AtExpiry);
        assert_eq!(ended.await.unwrap(), 2, "{owner}");
    }
    for (key, kind) in [("shared", LeaseKind::Shared), ("pool", three)] {
        held_for_long(&b, key, kind).await;
    }
}

/// An immediate release by owner id of an owner whose only place on a
/// key is one an earlier release by owner id kept ends no live lease there:
/// it writes no lock-delay, and a holder may join the places kept.
pub(super) async fn an_immediate_release_by_owner_id_of_only_kept_places_writes_no_lock_delay<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b, c] = super::stores(f, ["a", "b", "c"]).await;
    let operator = f.delaying_store("op", LONG).await;
    take_as(&a, "k", shape(LeaseKind::Shared)).await;
    take_as(&b, "k", shape(LeaseKind::Shared)).await;
    let (of_c, _) = take_as(&c, "k", shape(LeaseKind::Shared)).await;
    for owner in ["a", "b"] {
        let ended = operator.release_owner(owner.into(), OverrideEnd::AtExpiry);
        assert_eq!(ended.await.unwrap(), 1, "{owner}: c still holds");
    }
    assert_eq!(c.release_by_id(vec![of_c]).await.unwrap(), 1);
    let now = operator.release_owner("a".into(), OverrideEnd::Immediately);
    assert_eq!(now.await.unwrap(), 1);
    take_as(&c, "k", shape(LeaseKind::Shared)).await;
}

pub(super) async fn release_owner_delays_the_live_leases_it_ends_only<F: Fixture>(f: &F) {
    let [a, b, c] = super::stores(f, ["a", "b", "c"]).await;
    let operator = f.delaying_store("op", LONG).await;
    take(&a, "live").await;
    take(&a, "expired").await;
    f.expire("expired").await;
    // A waiting owner registered in the queue is not handed the key.
    take(&a, "queued").await;
    held(&b, "queued", true, "a").await;
    assert_eq!(f.queue("queued").await, ["b"]);
    // A shared key whose other holder remains, and one whose last live
    // holder is `a`'s.
    take_as(&a, "shared", shape(LeaseKind::Shared)).await;
    take_as(&c, "shared", shape(LeaseKind::Shared)).await;
    take_as(&a, "alone", shape(LeaseKind::Shared)).await;

    let released = operator
        .release_owner("a".into(), OverrideEnd::Immediately)
        .await
        .unwrap();
    assert_eq!(released, 5);
    delayed(&b, "live").await;
    delayed(&c, "queued").await;
    assert_eq!(raw(f, "queued").await.lease_id, None, "not handed over");
    delayed(&b, "alone").await;
    take(&b, "expired").await;
    take_as(&b, "shared", shape(LeaseKind::Shared)).await;
}

pub(super) async fn a_zero_lock_delay_frees_the_key_at_once<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let operator = f.delaying_store("op", Duration::ZERO).await;
    take(&a, "k").await;
    assert!(
        operator
            .force_release("k".into(), OverrideEnd::Immediately)
            .await
            .unwrap()
            .is_some()
    );
    take(&b, "k").await;
    take(&a, "o").await;
    assert_eq!(
        operator
            .release_owner("a".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        1
    );
    take(&b, "o").await;
}
