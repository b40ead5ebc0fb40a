//! The tracing spans the crate documents, captured by a `tracing_subscriber`
//! layer against a real MongoDB: an `acquire` span per acquisition (key,
//! kind, owner id) and a `lease` span per held lease (key, owner id,
//! fencing token) that the log line about its end is in. The subscriber is
//! the test thread's own (`tracing::subscriber::with_default`) and the
//! runtime single-threaded, so the manager task, which runs on that thread,
//! reports to it too, and tests running at the same time do not mix.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fixture;
use mongo_lease::ReleaseOutcome;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span or an event: its name (an event's message) and fields, and for
/// an event the span it happened in.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    fields: BTreeMap<String, String>,
    in_span: Option<String>,
}

impl Visit for Seen {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.insert(field.name().into(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.fields
            .insert(field.name().into(), format!("{value:?}"));
    }
}

/// Every span opened and every event, in order.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Seen>>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().into(),
            ..Seen::default()
        };
        attrs.record(&mut seen);
        self.spans.lock().unwrap().push(seen);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut seen = Seen::default();
        event.record(&mut seen);
        seen.name = seen.fields.remove("message").unwrap_or_default();
        seen.in_span = ctx.event_span(event).map(|span| span.name().to_string());
        self.events.lock().unwrap().push(seen);
    }
}

impl Capture {
    fn spans(&self, name: &str) -> Vec<Seen> {
        let spans = self.spans.lock().unwrap();
        spans.iter().filter(|s| s.name == name).cloned().collect()
    }

    fn events(&self, message: &str) -> Vec<Seen> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|e| e.name == message)
            .cloned()
            .collect()
    }
}

fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn an_acquisition_runs_in_an_acquire_span_and_a_held_lease_has_a_lease_span() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (owner_id, token) = tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let fx = Fixture::new("spans").await;
            let manager = fx.manager(Duration::from_secs(10)).await;
            let lease = manager.acquire("job-7").await.unwrap();
            let token = lease.fencing_token();
            assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
            let owner_id = manager.owner_id().to_string();
            manager.shutdown().await.unwrap();
            (owner_id, token)
        })
    });

    let acquire = capture.spans("acquire");
    assert_eq!(acquire.len(), 1, "one acquisition: {acquire:?}");
    assert_eq!(
        acquire[0].fields,
        fields(&[
            ("key", "job-7"),
            ("kind", "exclusive"),
            ("owner_id", &owner_id)
        ])
    );
    let lease = capture.spans("lease");
    assert_eq!(lease.len(), 1, "one held lease: {lease:?}");
    assert_eq!(
        lease[0].fields,
        fields(&[
            ("key", "job-7"),
            ("owner_id", &owner_id),
            ("fencing_token", &token.to_string()),
        ])
    );
    let ended = capture.events("lease ended");
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].in_span.as_deref(), Some("lease"), "{ended:?}");
    assert_eq!(
        ended[0].fields.get("reason").map(String::as_str),
        Some("released")
    );
}
