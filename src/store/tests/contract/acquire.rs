//! Acquiring: free, held, expired and yielded keys, fencing tokens, foreign documents.

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use uuid::Uuid;

use super::{Fixture, Raw, TTL, YIELD, assert_held, held, raw, take, yielded};
use crate::store::{AcquireOutcome, Store};

pub(super) async fn acquire_free_key_takes_it<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (l, token) = take(&a, "k").await;
    assert!(token > 0);
    assert_held(&raw(f, "k").await, "a", &l, token);
    let info = a.inspect("k".into()).await.unwrap().expect("a lease");
    assert!(info.held);
    assert_eq!((info.owner_id.as_str(), info.fencing_token), ("a", token));
    assert!(info.expires_at > info.server_time);
    assert!(info.time_to_expiry() <= TTL);

    // A retry under the same lease id (an ambiguous first attempt) is
    // recognised: the same acquisition, the same token.
    let retry = a.attempt("k".into(), l.lease_id, false).await.unwrap();
    assert_eq!(retry, AcquireOutcome::Acquired { token });
    assert_held(&raw(f, "k").await, "a", &l, token);
}

pub(super) async fn acquire_held_key_returns_held<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l, token) = take(&b, "k").await;
    let before = raw(f, "k").await;

    // Not waiting (`try_acquire`): nothing is written.
    let remaining = held(&a, "k", false, "b").await;
    assert!(remaining <= TTL && remaining > TTL / 2, "{remaining:?}");
    assert_eq!(raw(f, "k").await, before);

    // Waiting: the holder's lease is marked, and nothing else changes.
    held(&a, "k", true, "b").await;
    held(&a, "k", true, "b").await;
    let marked = raw(f, "k").await;
    assert_eq!(
        marked,
        Raw {
            waiting: true,
            ..before.clone()
        }
    );
    assert_eq!((marked.lease_id, marked.token), (Some(l.lease_id), token));

    // The holder's own new attempt (another lease id) is held too, unmarked.
    held(&b, "k", true, "b").await;
    assert_eq!(raw(f, "k").await, marked);
    assert!(b.renew(vec![l]).await.unwrap().is_empty());
}

pub(super) async fn acquire_expired_key_takes_it_with_a_greater_token<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (lb, tb) = take(&b, "k").await;
    f.expire("k").await;
    let (la, ta) = take(&a, "k").await;
    assert!(ta > tb, "{ta} > {tb}");
    assert_held(&raw(f, "k").await, "a", &la, ta);
    assert_eq!(b.renew(vec![lb.clone()]).await.unwrap(), ["k"]);
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 0);
    assert_held(&raw(f, "k").await, "a", &la, ta);
}

pub(super) async fn acquire_yielded_key_is_refused_to_the_yielding_owner_only<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take(&a, "k").await;
    held(&b, "k", true, "a").await;
    // A waiter that stopped retrying: its registration lapsed, so the
    // release yields instead of handing the key over ("Queue of waiting
    // owners" in `store`).
    f.lapse_registrations("k").await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let released = raw(f, "k").await;
    assert_eq!(released, yielded("a", ta));

    // The releasing owner waits out the yield window, and marks nothing.
    let remaining = held(&a, "k", true, "a").await;
    assert!(remaining <= YIELD && remaining > YIELD / 2, "{remaining:?}");
    assert_eq!(raw(f, "k").await, released);

    // Anyone else takes it at once; the new acquisition has no marks.
    let (lb, tb) = take(&b, "k").await;
    assert!(tb > ta);
    assert_held(&raw(f, "k").await, "b", &lb, tb);
}

pub(super) async fn fencing_tokens_strictly_increase_also_after_a_delete<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut tokens = Vec::new();

    // Back to back, many within one millisecond of server time.
    for _ in 0..10 {
        let (l, t) = take(&a, "k").await;
        tokens.push(t);
        assert_eq!(a.release_by_id(vec![l]).await.unwrap(), 1);
    }
    // Takeover after expiry.
    let (_, t) = take(&b, "k").await;
    tokens.push(t);
    f.expire("k").await;
    let (la, t) = take(&a, "k").await;
    tokens.push(t);
    // After the document was deleted (released, then garbage-collected).
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    f.delete("k").await;
    assert_eq!(f.raw("k").await, None);
    let (_, t) = take(&b, "k").await;
    tokens.push(t);
    // After a lease expired and its document was deleted.
    f.expire("k").await;
    f.delete("k").await;
    let (la, t) = take(&a, "k").await;
    tokens.push(t);
    assert_held(&raw(f, "k").await, "a", &la, t);

    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "tokens not strictly increasing: {tokens:?}"
    );
}

pub(super) async fn a_document_of_foreign_shape_is_never_taken<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    f.put_foreign("f", "java-app-1").await;
    // Held by its foreign holder, with no known expiry; not even marked as
    // waited for.
    for waiting in [false, true, true] {
        let outcome = a
            .attempt("f".into(), Uuid::new_v4(), waiting)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            AcquireOutcome::Held {
                ahead: 0,
                holder: "java-app-1".into(),
                remaining: None,
                token: None,
            }
        );
        assert!(f.foreign_unchanged("f").await, "waiting: {waiting}");
    }
    let released = a.release_owner("java-app-1".into(), OverrideEnd::Immediately);
    assert_eq!(released.await.unwrap(), 0);
    assert!(f.foreign_unchanged("f").await);
}
