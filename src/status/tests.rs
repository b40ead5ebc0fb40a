use super::*;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_lease_reads_lost_once_its_deadline_passed_without_the_actor() {
    let state = LeaseState::new(Instant::now() + Duration::from_secs(10));
    assert!(!state.is_lost());
    assert_eq!(state.lost_reason(), None);
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(!state.is_lost());
    state.set_deadline(Instant::now() + Duration::from_secs(10));
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(!state.is_lost(), "the renewal moved the deadline");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(state.is_lost());
    assert!(
        !state.token().is_cancelled(),
        "only the actor fires the token"
    );
    assert_eq!(state.lost_reason(), Some(LossReason::Expired));
}

#[tokio::test(start_paused = true)]
async fn the_token_fires_at_the_loss_whether_made_before_or_after_it() {
    let before = LeaseState::new(Instant::now() + Duration::from_secs(10));
    let token = before.token().clone();
    assert!(!token.is_cancelled());
    before.lose(LossReason::Released);
    assert!(token.is_cancelled(), "a token made before the loss fires");
    let after = LeaseState::new(Instant::now() + Duration::from_secs(10));
    after.lose(LossReason::Deleted);
    assert!(
        after.token().is_cancelled(),
        "a token made after it has fired"
    );
}

#[tokio::test(start_paused = true)]
async fn the_first_recorded_reason_wins_and_fires_the_token() {
    let state = LeaseState::new(Instant::now() + Duration::from_secs(10));
    assert!(state.lose(LossReason::Deleted));
    assert!(!state.lose(LossReason::Released));
    assert!(state.token().is_cancelled());
    assert!(state.is_lost());
    assert_eq!(state.deadline(), None);
    assert_eq!(state.lost_reason(), Some(LossReason::Deleted));
    state.set_deadline(Instant::now() + Duration::from_secs(10));
    assert_eq!(state.deadline(), None, "a lost lease stays lost");
}
