use super::*;

#[tokio::test(start_paused = true)]
async fn the_board_reads_unhealthy_once_the_earliest_deadline_passed_without_the_task() {
    let board = HealthBoard::default();
    let t0 = Instant::now();
    board.lease_started(t0, t0 + Duration::from_secs(3));
    board.lease_started(t0, t0 + Duration::from_secs(5));
    tokio::time::advance(Duration::from_secs(2)).await;
    let before = board.read();
    assert!(before.is_healthy());
    assert_eq!(before.held_leases, 2);
    assert_eq!(before.oldest_renewal_age, Some(Duration::from_secs(2)));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!board.read().is_healthy(), "the 3 s deadline passed");
    // Published after a renewal of the first lease: on time again.
    let renewed = Instant::now();
    board.publish(Some(renewed + Duration::from_secs(3)), Some(t0));
    assert!(board.read().is_healthy());
    board.lease_ended();
    board.lease_ended();
    assert_eq!(
        board.read(),
        Health {
            held_leases: 0,
            oldest_renewal_age: None,
            renewals_on_time: true,
        }
    );
    board.renewal_missed();
    assert!(!board.read().is_healthy());
    board.server_answered();
    assert!(board.read().is_healthy());
}
