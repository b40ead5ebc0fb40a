use super::*;
use crate::key::LeaseKey;
use std::time::{Duration, SystemTime};

fn info(owner: &str, token: u64, renewed_ago: u64, expires_in: i64) -> LeaseInfo {
    info_released(owner, token, renewed_ago, expires_in, false)
}

fn info_released(
    owner: &str,
    token: u64,
    renewed_ago: u64,
    expires_in: i64,
    released: bool,
) -> LeaseInfo {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let renewed_at = now - Duration::from_secs(renewed_ago);
    let expires_at = if expires_in >= 0 {
        now + Duration::from_secs(expires_in as u64)
    } else {
        now - Duration::from_secs(expires_in.unsigned_abs())
    };
    LeaseInfo {
        key: LeaseKey::from("k"),
        owner_id: owner.into(),
        fencing_token: token,
        acquired_at: renewed_at,
        renewed_at,
        expires_at,
        server_time: now,
        payload: None,
        held: expires_at > now,
        foreign: false,
        kind: LeaseKind::Exclusive,
        holders: Vec::new(),
        hold_until: None,
        lock_delay_until: None,
        waiters: Vec::new(),
        transitions: 0,
        released,
    }
}

fn judged(info: Option<&LeaseInfo>) -> LossReason {
    judge(info, "a", 7, LeaseKind::Exclusive)
}

#[test]
fn a_missing_document_was_deleted() {
    assert_eq!(judged(None), LossReason::Deleted);
}

#[test]
fn another_token_or_owner_id_took_the_key_even_if_since_released() {
    let taken = LossReason::Taken {
        owner_id: "b".into(),
        fencing_token: 9,
    };
    assert_eq!(judged(Some(&info("b", 9, 1, 9))), taken);
    assert_eq!(judged(Some(&info("b", 9, 20, -10))), taken);
    assert_eq!(
        judged(Some(&info("intruder", 7, 1, 9))),
        LossReason::Taken {
            owner_id: "intruder".into(),
            fencing_token: 7
        }
    );
    let foreign = LeaseInfo {
        foreign: true,
        ..info("app", 0, 1, 0)
    };
    assert_eq!(
        judged(Some(&foreign)),
        LossReason::Taken {
            owner_id: "app".into(),
            fencing_token: 0
        }
    );
}

#[test]
fn our_acquisition_released_by_someone_else_was_force_released() {
    let released = info_released("a", 7, 3, -1, true);
    assert_eq!(judged(Some(&released)), LossReason::ForceReleased);
}

#[test]
fn our_acquisition_that_ran_out_with_its_lease_id_expired() {
    assert_eq!(judged(Some(&info("a", 7, 11, -1))), LossReason::Expired);
    // However its `exp` was moved back (a test's expiry, a clock step).
    assert_eq!(judged(Some(&info("a", 7, 3, -1))), LossReason::Expired);
}

#[test]
fn a_lost_holder_of_a_shared_key_was_taken_only_by_a_live_holder_of_another_kind() {
    let exclusive_now = info("b", 9, 1, 9);
    assert_eq!(
        judge(Some(&exclusive_now), "a", 7, LeaseKind::Shared),
        LossReason::Taken {
            owner_id: "b".into(),
            fencing_token: 9
        }
    );
    let shared_now = LeaseInfo {
        kind: LeaseKind::Shared,
        ..info("b", 9, 1, 9)
    };
    assert_eq!(
        judge(Some(&shared_now), "a", 7, LeaseKind::Shared),
        LossReason::Expired
    );
}
