use std::time::{Duration, SystemTime};

use super::*;
use crate::info::HolderInfo;

fn info(kind: LeaseKind, holders: usize, held: bool) -> LeaseInfo {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let holder = HolderInfo {
        owner_id: "a".into(),
        fencing_token: 1,
        acquired_at: now,
        renewed_at: now,
        expires_at: now + Duration::from_secs(10),
        permits: 1,
    };
    LeaseInfo {
        key: LeaseKey::from("k"),
        owner_id: "a".into(),
        fencing_token: 1,
        acquired_at: now,
        renewed_at: now,
        expires_at: now + Duration::from_secs(10),
        server_time: now,
        payload: None,
        held,
        foreign: false,
        kind,
        holders: vec![holder; holders],
        hold_until: None,
        lock_delay_until: None,
        waiters: Vec::new(),
        transitions: 0,
        released: false,
    }
}

fn free(permits: u32, info: Option<&LeaseInfo>) -> Result<u32> {
    free_permits(permits, info)
}

fn mismatch(result: Result<u32>) -> LeaseKind {
    match result {
        Err(Error::KindMismatch { stored, .. }) => stored,
        other => panic!("expected a kind mismatch, got {other:?}"),
    }
}

#[test]
fn every_permit_is_free_on_a_key_without_live_holders() {
    assert_eq!(free(3, None).unwrap(), 3);
    assert_eq!(
        free(3, Some(&info(LeaseKind::Exclusive, 0, false))).unwrap(),
        3
    );
    let released = info(LeaseKind::Permit { permits: 5 }, 0, false);
    assert_eq!(free(3, Some(&released)).unwrap(), 3);
}

#[test]
fn live_holders_of_the_same_number_take_their_permits() {
    let two = info(LeaseKind::Permit { permits: 3 }, 2, true);
    assert_eq!(free(3, Some(&two)).unwrap(), 1);
    let full = info(LeaseKind::Permit { permits: 3 }, 3, true);
    assert_eq!(free(3, Some(&full)).unwrap(), 0);
}

#[test]
fn a_key_held_as_another_kind_is_a_kind_mismatch() {
    let other = info(LeaseKind::Permit { permits: 2 }, 1, true);
    assert_eq!(
        mismatch(free(3, Some(&other))),
        LeaseKind::Permit { permits: 2 }
    );
    let shared = info(LeaseKind::Shared, 1, true);
    assert_eq!(mismatch(free(3, Some(&shared))), LeaseKind::Shared);
    let exclusive = info(LeaseKind::Exclusive, 0, true);
    assert_eq!(mismatch(free(3, Some(&exclusive))), LeaseKind::Exclusive);
    let mut held_at_least = info(LeaseKind::Exclusive, 0, false);
    held_at_least.hold_until = Some(held_at_least.server_time + Duration::from_secs(1));
    assert_eq!(
        mismatch(free(3, Some(&held_at_least))),
        LeaseKind::Exclusive
    );
}

#[test]
fn a_foreign_holders_lock_leaves_no_permit() {
    let mut foreign = info(LeaseKind::Exclusive, 0, true);
    foreign.foreign = true;
    assert_eq!(free(3, Some(&foreign)).unwrap(), 0);
}

#[test]
fn no_permit_is_free_while_a_lock_delay_lasts() {
    // The places a release by owner id kept have expired, or it kept none
    // (immediately): no live holder, yet no acquisition before `nb`.
    let mut delayed = info(LeaseKind::Permit { permits: 3 }, 0, false);
    delayed.lock_delay_until = Some(delayed.server_time + Duration::from_secs(5));
    assert_eq!(free(3, Some(&delayed)).unwrap(), 0);
    // Whatever kind the key was held as: an acquisition is answered held.
    let mut shared = info(LeaseKind::Shared, 1, true);
    shared.lock_delay_until = delayed.lock_delay_until;
    assert_eq!(free(3, Some(&shared)).unwrap(), 0);
}
