//! A payload written with the acquisition (`Acquire::payload`) on a
//! real mongod: one write, and no reader, in this process or another, ever
//! sees the acquisition without it.

use crate::common;

use std::time::Duration;

use common::{Fixture, within};
use mongo_lease::{Error, LeaseManager, MAX_PAYLOAD_LEN};
use mongodb::bson::doc;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn the_payload_is_written_by_the_acquiring_write_and_observers_never_see_a_lease_without_it()
{
    let fx = Fixture::new("acquire_payload").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let holders = [
        LeaseManager::connect(options).await.unwrap(),
        fx.manager(TTL).await,
    ];
    let observer = fx.manager(TTL).await;
    let mut changes = observer.observe("leader").await.unwrap();
    // The observer's first state: nobody holds the key.
    let first = within(TTL, "the first state", changes.recv()).await;
    assert!(matches!(first, Some(Ok(None))), "{first:?}");

    // Leaders one after the other, each with its address.
    let rounds = 6;
    let mut tokens = Vec::new();
    for round in 0..rounds {
        let manager = &holders[round % 2];
        let address = format!("10.0.0.{round}:8080");
        log.clear();
        let lease = within(
            TTL * 4,
            "the acquisition",
            manager
                .acquire("leader")
                .payload(doc! { "addr": address.clone() }),
        )
        .await
        .unwrap();
        tokens.push(lease.fencing_token());
        if round % 2 == 0 {
            // The payload is in one command: the acquiring write (a renewal
            // may follow, checking the lease against a write announced
            // while it was in flight, with no payload in it).
            let with_payload: Vec<_> = log
                .all()
                .into_iter()
                .filter(|(_, cmd)| format!("{cmd:?}").contains(&address))
                .collect();
            assert_eq!(with_payload.len(), 1, "{with_payload:?}");
            assert_eq!(with_payload[0].0, "findAndModify", "the acquiring write");
        }
        let info = observer.inspect("leader").await.unwrap().expect("held");
        assert_eq!(info.payload, Some(doc! { "addr": address }));
        assert!(!lease.release().await.unwrap().was_lost());
    }

    // Every state the observer saw with a holder carries that holder's
    // payload; it saw every leader (a change stream skips no change).
    let mut seen = Vec::new();
    while seen.len() < rounds {
        let change = within(TTL * 4, "the next change", changes.recv()).await;
        let Some(info) = change.expect("the stream goes on").unwrap() else {
            continue;
        };
        if !info.held {
            continue;
        }
        assert!(
            info.payload.is_some(),
            "a leader seen without its payload: {info:?}"
        );
        let address = info.payload.as_ref().unwrap().get_str("addr").unwrap();
        let round = tokens
            .iter()
            .position(|t| *t == info.fencing_token)
            .unwrap();
        assert_eq!(address, format!("10.0.0.{round}:8080"));
        if seen.last() != Some(&round) {
            seen.push(round);
        }
    }
    assert_eq!(seen, (0..rounds).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_bad_payload_or_kind_with_a_payload_is_refused_and_nothing_written() {
    let fx = Fixture::new("acquire_payload_bad").await;
    let manager = fx.manager(TTL).await;
    let big = "x".repeat(MAX_PAYLOAD_LEN);
    let cases = [doc! { "blob": big }, doc! { "a.b": 1 }, doc! { "$set": 1 }];
    for payload in cases {
        let refused = manager.acquire("k").payload(payload).await;
        assert!(
            matches!(refused, Err(Error::InvalidPayload { .. })),
            "{refused:?}"
        );
    }
    let refused = manager.acquire("k").shared().payload(doc! { "x": 1 }).await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
    assert!(
        fx.raw().find_one(doc! {}).await.unwrap().is_none(),
        "nothing was written"
    );
}
