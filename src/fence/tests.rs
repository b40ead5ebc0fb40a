use super::*;

/// Compiles only if the transaction helper's future is `Send` (it can
/// be spawned) when the callback borrows its context.
#[allow(dead_code)]
fn with_transaction_future_is_send(
    lease: &Lease,
    client: &Client,
    items: &mongodb::Collection<Document>,
) {
    use futures::FutureExt;
    fn send<T: Send>(_: T) {}
    send(lease.with_transaction(client, items, |session, items| {
        async move {
            items.insert_one(doc! {}).session(session).await?;
            Ok(())
        }
        .boxed()
    }));
}

#[test]
fn filter_is_one_key_named_by_the_field() {
    let fence = Fence::new(42).unwrap();
    assert_eq!(
        fence.filter("res.fence"),
        doc! { "res.fence": { "$not": { "$exists": true, "$not": { "$lte": 42_i64 } } } }
    );
    assert_eq!(fence.update("fence"), doc! { "$set": { "fence": 42_i64 } });
}

#[test]
fn update_with_adds_the_token_to_the_callers_set() {
    let fence = Fence::new(7).unwrap();
    assert_eq!(
        fence
            .update_with("fence", doc! { "$set": { "by": "a" }, "$inc": { "n": 1 } })
            .unwrap(),
        doc! { "$set": { "by": "a", "fence": 7_i64 }, "$inc": { "n": 1 } }
    );
    assert_eq!(
        fence
            .update_with("fence", doc! { "$inc": { "n": 1 } })
            .unwrap(),
        doc! { "$inc": { "n": 1 }, "$set": { "fence": 7_i64 } }
    );
}

#[test]
fn update_with_refuses_what_it_cannot_merge() {
    let fence = Fence::new(7).unwrap();
    for (field, update) in [
        ("", doc! { "$set": { "a": 1 } }),
        ("$f", doc! { "$set": { "a": 1 } }),
        ("fence", doc! { "state": "done" }),
        ("fence", doc! { "$set": 1 }),
        ("fence", doc! { "$set": { "fence": 1 } }),
        ("fence", doc! { "$inc": { "fence": 1 } }),
    ] {
        let error = fence.update_with(field, update.clone()).unwrap_err();
        assert!(
            matches!(error, Error::InvalidUpdate { .. }),
            "{field:?} {update}: {error}"
        );
    }
}

#[test]
fn tokens_beyond_int64_are_refused() {
    assert!(Fence::new(i64::MAX as u64).is_some());
    assert_eq!(Fence::new(i64::MAX as u64 + 1), None);
}
