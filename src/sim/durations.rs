//! Duration control and the payload with the acquisition in the
//! simulation: what the workload's exclusive tasks ask for now and then
//! (`hold_at_most`, a payload in the acquiring write, `Lease::set_ttl`
//! while held, a read of the key before each attempt), and the properties
//! the checker adds for them:
//!
//! - a lease held at most D (`hold_at_most`) is never renewed, and its
//!   local deadline is no later than its grant + D − the safety margin
//!   (so, as every lease is told by its deadline, its holder is told
//!   within D of getting it);
//! - a read of a key (`inspect`) never shows a holder acquired with a
//!   payload without one, nor a holder acquired without one with a payload
//!   (another waiter's, written by its registration).
//!
//! A changed TTL needs no property of its own: a local deadline later than
//! the server's expiry breaks the checker's mutual exclusion.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mongodb::bson::doc;

use super::checker::Violation;
use super::history::{At, Event, History, LeaseNo};
use super::workload::{Process, Recorder};
use crate::config::AcquireOptions;
use crate::lease::Lease;
use crate::random::random_range;

/// The extra options of an exclusive acquisition with the minimum hold
/// `hold`: one in six held at most 0.4 to 4 s (not beside a minimum
/// hold), one in six with a payload.
pub(super) fn draw(hold: Option<Duration>) -> AcquireOptions {
    let mut options = AcquireOptions::default();
    match random_range(0..6) {
        0 if hold.is_none() => {
            options.hold_at_most = Some(Duration::from_millis(random_range(400..4_000)));
        }
        1 => options.payload = Some(doc! { "n": random_range(0..1_000i64) }),
        _ => {}
    }
    options
}

/// Records what `options` asked of the lease `number`, just granted.
pub(super) fn granted(
    recorder: &Recorder,
    number: LeaseNo,
    lease: &Lease,
    options: &AcquireOptions,
) {
    if let Some(at_most) = options.hold_at_most {
        debug_assert_eq!(lease.ttl(), at_most);
        recorder.push(Event::HeldAtMost {
            lease: number,
            at_most,
        });
    }
    if options.payload.is_some() {
        recorder.push(Event::AcquiredWithPayload { lease: number });
    }
}

/// Now and then (one in eight calls) changes the TTL of `lease`, held with
/// `options` and renewed, to 1.4 to 6 s (up to twice the TTL: the safety
/// margin, a tenth of the TTL, covers the server clock's faster rate over
/// 6 s), at most `most`; its outcome (a fault may fail it) is judged by the
/// other properties. A renewal of the old TTL given up by its caller may
/// land after a longer one was confirmed.
pub(super) async fn maybe_set_ttl(lease: &Lease, options: &AcquireOptions, most: Duration) {
    if options.hold_at_most.is_none() && random_range(0..8) == 0 {
        let ttl = Duration::from_millis(random_range(1_400..6_000)).min(most);
        let _ = lease.set_ttl(ttl).await;
    }
}

/// Half the time, reads `key` (recorded as `recorded`) by `process` and
/// records the holder it shows, if any.
pub(super) async fn inspect(recorder: &Recorder, process: &Process, key: &str, recorded: String) {
    if random_range(0..2) == 0 {
        return;
    }
    if let Ok(Some(info)) = process.manager.inspect(key).await
        && info.held
        && !info.foreign
    {
        recorder.push(Event::Inspected {
            manager: process.index,
            key: recorded,
            token: info.fencing_token,
            payload: info.payload.is_some(),
        });
    }
}

/// The properties of the module docs over `history`.
pub(super) fn check(history: &History) -> Vec<Violation> {
    // Each lease's grant: when, its key, fencing token and local deadline.
    let mut grants: BTreeMap<LeaseNo, (At, String, u64, At)> = BTreeMap::new();
    let mut at_most: BTreeMap<LeaseNo, Duration> = BTreeMap::new();
    let mut with_payload: BTreeSet<(String, u64)> = BTreeSet::new();
    for entry in history.entries() {
        match &entry.event {
            Event::Granted {
                lease,
                key,
                token,
                deadline,
                ..
            } => {
                grants.insert(*lease, (entry.at, key.clone(), *token, *deadline));
            }
            Event::HeldAtMost { lease, at_most: d } => {
                at_most.insert(*lease, *d);
            }
            Event::AcquiredWithPayload { lease } => {
                let (_, key, token, _) = &grants[lease];
                with_payload.insert((key.clone(), *token));
            }
            _ => {}
        }
    }
    let without_payload: BTreeSet<(String, u64)> = grants
        .values()
        .map(|(_, key, token, _)| (key.clone(), *token))
        .filter(|granted| !with_payload.contains(granted))
        .collect();
    let mut found = Vec::new();
    for (index, entry) in history.entries().iter().enumerate() {
        let mut violation = |key: &str, what: String| {
            found.push(Violation {
                at: entry.at,
                entry: index,
                key: key.to_string(),
                what,
            })
        };
        match &entry.event {
            Event::Renewed { lease, .. } if at_most.contains_key(lease) => {
                let key = &grants[lease].1;
                violation(
                    key,
                    format!("lease {lease}, held at most its TTL, was renewed"),
                );
            }
            Event::HeldAtMost { lease, at_most } => {
                let (granted, key, _, deadline) = &grants[lease];
                let latest = *granted + at_most.saturating_sub(super::SAFETY_MARGIN);
                if *deadline > latest {
                    violation(
                        key,
                        format!(
                            "lease {lease}, held at most {at_most:?}, has its local deadline \
                             {deadline:?} after its grant at {granted:?} + that − the safety margin"
                        ),
                    );
                }
            }
            Event::Inspected {
                manager,
                key,
                token,
                payload: false,
            } if with_payload.contains(&(key.clone(), *token)) => violation(
                key,
                format!(
                    "manager {manager} read the holder of fencing token {token}, acquired with \
                     a payload, without it"
                ),
            ),
            Event::Inspected {
                manager,
                key,
                token,
                payload: true,
            } if without_payload.contains(&(key.clone(), *token)) => violation(
                key,
                format!(
                    "manager {manager} read the holder of fencing token {token}, acquired \
                     without a payload, with one"
                ),
            ),
            _ => {}
        }
    }
    found
}
