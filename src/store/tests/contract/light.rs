//! The light forms: a grouped light acquire takes only what the general
//! acquire would take as a new acquisition, and counts only a lease under
//! the request's own lease id that lasts its TTL from its attempt's start.

use crate::store::StoreExt;
use uuid::Uuid;

use super::{Fixture, Raw, TTL, assert_held, lease, raw, take};
use crate::store::Store;
use crate::store::light_acquire::{LightAcquire, LightAcquired};

/// A request whose attempt started a second before: as in the actor, whose
/// attempts start before their write is sent, the bound has slack, so the
/// verdicts do not depend on how much later than the `update` a busy
/// server runs the `find`.
fn request(key: &str, lease_id: Uuid) -> LightAcquire {
    LightAcquire {
        key: key.into(),
        lease_id,
        ttl: TTL,
        started: tokio::time::Instant::now() - std::time::Duration::from_secs(1),
    }
}

/// The token of an acquired answer, `None` for not applied.
fn token(answer: &LightAcquired) -> Option<u64> {
    match answer {
        LightAcquired::Acquired(token) | LightAcquired::AcquiredShort { token, .. } => Some(*token),
        LightAcquired::NotApplied => None,
        LightAcquired::Failed(e) => panic!("a grouped light acquire failed: {e}"),
    }
}

pub(super) async fn a_grouped_light_acquire_counts_only_the_new_acquisitions_it_wrote<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    // An expired lease of another owner: taken, with a greater token.
    let (_, before) = take(&b, "expired").await;
    f.expire("expired").await;
    // A live lease of another owner, and a foreign holder's lock: unchanged.
    let (live, live_token) = take(&b, "held").await;
    let held = raw(f, "held").await;
    f.put_foreign("foreign", "other-app").await;
    // An earlier attempt of this owner under the request's lease id that
    // landed, and whose lease has expired since: not taken again, and not
    // counted (its expiry is not this TTL from the attempt's start).
    let (earlier, earlier_token) = take(&a, "earlier").await;
    f.expire("earlier").await;
    let stale = raw(f, "earlier").await;
    // A live lease of this owner under another lease id, with a longer
    // TTL: more than the request's TTL left, but not this request's.
    let other = lease("mine", Uuid::new_v4());
    let outcome = a
        .acquire_with_ttl("mine".into(), other.lease_id, false, TTL * 2)
        .await
        .unwrap();
    let crate::store::AcquireOutcome::Acquired { token: mine_token } = outcome else {
        panic!("acquiring mine: {outcome:?}");
    };
    let mine = raw(f, "mine").await;

    let ids = [
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
        Uuid::new_v4(),
    ];
    let requests = vec![
        request("new", ids[0]),
        request("expired", ids[1]),
        request("held", ids[2]),
        request("foreign", ids[3]),
        request("earlier", earlier.lease_id),
        request("mine", Uuid::new_v4()),
    ];
    let answers = a.acquire_light(requests).await;
    let tokens: Vec<Option<u64>> = answers.iter().map(token).collect();
    let [Some(new), Some(taken), None, None, None, None] = tokens[..] else {
        panic!("answers: {answers:?}");
    };
    assert_held(&raw(f, "new").await, "a", &lease("new", ids[0]), new);
    assert_held(
        &raw(f, "expired").await,
        "a",
        &lease("expired", ids[1]),
        taken,
    );
    assert!(taken > before, "{taken} > {before}");
    assert_eq!(raw(f, "held").await, held);
    assert_eq!(
        (held.lease_id, held.token),
        (Some(live.lease_id), live_token)
    );
    assert!(f.foreign_unchanged("foreign").await);
    let after = raw(f, "earlier").await;
    assert_eq!(after, stale);
    assert_eq!(
        after,
        Raw {
            expired: true,
            ..after.clone()
        }
    );
    assert_eq!(after.token, earlier_token);
    assert_eq!(raw(f, "mine").await, mine);
    assert_held(&mine, "a", &other, mine_token);

    // The general acquire under that lease id takes it back as a retry.
    let retry = a
        .attempt("earlier".into(), earlier.lease_id, false)
        .await
        .unwrap();
    assert_eq!(
        retry,
        crate::store::AcquireOutcome::Acquired {
            token: earlier_token
        }
    );
}
