//! The changes `watch` derives from consecutive states (without a server:
//! states are built by hand as the observer would report them).

use std::time::{Duration, SystemTime};

use mongo_lease::{LeaseKey, LeaseKind};

use super::{Event, Holder, Snapshot, Tracker};

fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + ms)
}

fn holder(owner: &str, token: u64, expires_ms: u64) -> Holder {
    Holder {
        owner_id: owner.into(),
        fencing_token: token,
        acquired_at: at(0),
        expires_at: at(expires_ms),
        foreign: false,
        expiry_known: true,
        kind: LeaseKind::Exclusive,
    }
}

/// An exclusive key held by `h` at `now_ms`.
fn held(h: &Holder, now_ms: u64) -> Snapshot {
    Snapshot {
        holders: vec![h.clone()],
        server_time: at(now_ms),
        exclusive_expiry: Some(h.expires_at),
    }
}

/// An exclusive key nobody holds at `now_ms`, its stored `exp` at `exp_ms`.
fn free(exp_ms: u64, now_ms: u64) -> Snapshot {
    Snapshot {
        holders: Vec::new(),
        server_time: at(now_ms),
        exclusive_expiry: Some(at(exp_ms)),
    }
}

fn events(tracker: &mut Tracker, state: &Snapshot) -> Vec<&'static str> {
    tracker.next(state).iter().map(|c| c.event.name()).collect()
}

#[test]
fn the_first_line_is_the_current_state() {
    let mut tracker = Tracker::default();
    assert_eq!(events(&mut tracker, &free(0, 10)), ["free"]);
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    let changes = tracker.next(&held(&a, 10));
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].event, Event::Held);
    assert_eq!(changes[0].holder.as_ref(), Some(&a));
    assert_eq!(changes[0].ends_at, Some(a.expires_at));
}

#[test]
fn renewals_print_nothing_and_a_release_then_an_acquisition_print_one_line_each() {
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    tracker.next(&held(&a, 10));
    let renewed = holder("a", 1, 40_000);
    assert!(events(&mut tracker, &held(&renewed, 10_000)).is_empty());
    // A release moves `exp` back to its own time.
    let released = tracker.next(&free(12_000, 12_000));
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].event, Event::Released);
    assert_eq!(released[0].ends_at, Some(at(12_000)));
    let b = holder("b", 2, 50_000);
    assert_eq!(events(&mut tracker, &held(&b, 20_000)), ["acquired"]);
}

#[test]
fn an_expiry_prints_expired_and_the_next_holder_takes_over_from_it() {
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    tracker.next(&held(&a, 10));
    // The re-read at the expiry: `exp` where the last renewal put it.
    let expired = tracker.next(&free(30_000, 30_001));
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].event, Event::Expired);
    assert_eq!(expired[0].ends_at, Some(at(30_000)));
    let b = holder("b", 2, 70_000);
    let taken = tracker.next(&held(&b, 40_000));
    assert_eq!(taken[0].event, Event::TakenOver(a.clone()));
    assert_eq!(taken[0].holder.as_ref(), Some(&b));
    // A later holder after a release is an acquisition again.
    tracker.next(&free(41_000, 41_000));
    let c = holder("c", 3, 80_000);
    assert_eq!(events(&mut tracker, &held(&c, 42_000)), ["acquired"]);
}

/// `holder(owner, token, expires_ms)` acquired at `acquired_ms`.
fn acquired_at(owner: &str, token: u64, acquired_ms: u64, expires_ms: u64) -> Holder {
    Holder {
        acquired_at: at(acquired_ms),
        ..holder(owner, token, expires_ms)
    }
}

#[test]
fn a_holder_replaced_in_one_state_after_its_expiry_is_taken_over() {
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    tracker.next(&held(&a, 10));
    let b = acquired_at("b", 2, 30_000, 70_000);
    let changes = tracker.next(&held(&b, 30_005));
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].event, Event::TakenOver(a));
}

/// A release that hands the key to a registered waiter in its own write
/// (the queue of waiting owners): the previous lease had not expired.
#[test]
fn a_holder_replaced_in_one_state_before_its_expiry_released_it_to_the_next() {
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    tracker.next(&held(&a, 10));
    let b = acquired_at("b", 2, 12_000, 15_000);
    let changes = tracker.next(&held(&b, 12_000));
    let kinds: Vec<_> = changes.iter().map(|c| c.event.clone()).collect();
    assert_eq!(kinds, [Event::Released, Event::Acquired]);
    assert_eq!(changes[0].holder.as_ref(), Some(&a));
    assert_eq!(changes[0].ends_at, Some(at(12_000)));
    assert_eq!(changes[1].holder.as_ref(), Some(&b));
    assert_eq!(changes[1].ends_at, Some(at(15_000)));
    // The next holder after b's expiry takes over from b, not from a.
    let c = acquired_at("c", 3, 15_000, 50_000);
    assert_eq!(
        tracker.next(&held(&c, 15_000))[0].event,
        Event::TakenOver(b)
    );
}

/// A force release stores what the holder's own release does: `exp` back
/// to its time, so the same lines.
#[test]
fn a_force_release_then_a_new_holder_is_released_then_acquired() {
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    tracker.next(&held(&a, 10));
    assert_eq!(events(&mut tracker, &free(5_000, 5_000)), ["released"]);
    let b = acquired_at("b", 2, 5_010, 35_010);
    assert_eq!(events(&mut tracker, &held(&b, 5_010)), ["acquired"]);
}

#[test]
fn a_deleted_document_is_a_release() {
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    tracker.next(&held(&a, 10));
    let deleted = Snapshot {
        holders: Vec::new(),
        server_time: at(20),
        exclusive_expiry: None,
    };
    assert_eq!(events(&mut tracker, &deleted), ["released"]);
}

#[test]
fn holders_of_a_shared_key_come_and_go_one_line_each() {
    let shared = |owner: &str, token, expires_ms| Holder {
        kind: LeaseKind::Shared,
        ..holder(owner, token, expires_ms)
    };
    let state = |holders: Vec<Holder>, now_ms| Snapshot {
        holders,
        server_time: at(now_ms),
        exclusive_expiry: None,
    };
    let (a, b) = (shared("a", 1, 30_000), shared("b", 2, 31_000));
    let mut tracker = Tracker::default();
    assert_eq!(events(&mut tracker, &state(vec![a.clone()], 10)), ["held"]);
    assert_eq!(
        events(&mut tracker, &state(vec![a.clone(), b.clone()], 20)),
        ["acquired"]
    );
    // `a` left before its expiry: released; `b` after it: expired.
    assert_eq!(
        events(&mut tracker, &state(vec![b.clone()], 25_000)),
        ["released"]
    );
    assert_eq!(events(&mut tracker, &state(vec![], 31_000)), ["expired"]);
    // An exclusive holder after shared ones is an acquisition.
    let c = holder("c", 3, 90_000);
    assert_eq!(events(&mut tracker, &held(&c, 32_000)), ["acquired"]);
}

#[test]
fn json_lines_carry_the_same_fields_on_every_line() {
    let key = LeaseKey::from("job");
    let mut tracker = Tracker::default();
    let a = holder("a", 1, 30_000);
    let mut lines = tracker.next(&held(&a, 10));
    tracker.next(&free(30_000, 30_001));
    lines.extend(tracker.next(&held(&holder("b", 2, 70_000), 40_000)));
    let fields = |v: &serde_json::Value| {
        let mut names: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        names.sort();
        names
    };
    let first = lines[0].json(&key);
    assert_eq!(first["event"], "held");
    assert_eq!(first["key"], "job");
    assert_eq!(first["owner_id"], "a");
    assert_eq!(first["fencing_token"], 1);
    assert_eq!(first["expires_at"], "2023-11-14T22:13:50.000Z");
    let taken = lines[1].json(&key);
    assert_eq!(taken["event"], "taken over");
    assert_eq!(taken["previous_owner_id"], "a");
    assert_eq!(taken["previous_fencing_token"], 1);
    assert_eq!(fields(&first), fields(&taken));
    assert!(lines[1].text(&key).contains("taken over \"job\" by b"));
}
