use super::*;

#[test]
fn a_server_older_than_5_0_is_refused_by_name() {
    let build = |version: &str, major: i32| {
        doc! { "version": version, "versionArray": [major, 0, 0, 0] }
    };
    let refused = check_server_version(&build("4.4.29", 4)).unwrap_err();
    assert!(
        matches!(&refused, Error::Unsupported { reason } if reason.contains("4.4.29")),
        "{refused}"
    );
    check_server_version(&build("5.0.0", 5)).unwrap();
    check_server_version(&build("6.0.5", 6)).unwrap();
    check_server_version(&doc! {}).unwrap();
}

fn timing(ttl: u64, heartbeat: u64, margin: u64) -> Timing {
    Timing {
        ttl: Duration::from_secs(ttl),
        heartbeat_interval: Duration::from_secs(heartbeat),
        safety_margin: Duration::from_secs(margin),
        clock_skew: Duration::ZERO,
        operation_timeout: Duration::from_secs(10),
        retry_initial: Duration::from_millis(10),
        retry_max: Duration::from_secs(1),
        renewal_batch_size: 100,
        ttl_cap: None,
        watch_held_leases: false,
        release_mode: crate::config::ReleaseMode::Keep,
        contended_for: crate::config::CONTENDED_FOR,
    }
}

fn ttl_index(field: &str, expire_after: Duration) -> IndexModel {
    IndexModel::builder()
        .keys(doc! { field: 1 })
        .options(
            IndexOptions::builder()
                .name(format!("{field}_1"))
                .expire_after(expire_after)
                .build(),
        )
        .build()
}

fn check(field: &str, secs: u64, timing: &Timing) -> Result<Option<Duration>> {
    check_ttl_index(&ttl_index(field, Duration::from_secs(secs)), timing, "db.c")
}

#[test]
fn a_ts_index_must_outlive_heartbeat_plus_margin_and_caps_the_ttl() {
    // The measured case: TTL 90 s, heartbeat 40 s, margin 9 s, {ts: 1} at 30 s.
    let measured = timing(90, 40, 9);
    let error = check("ts", 30, &measured).unwrap_err();
    assert!(matches!(error, Error::UnusableCollection { .. }), "{error}");
    // The boundary: E must be strictly longer than heartbeat + margin.
    let t = timing(90, 3, 9);
    assert!(check("ts", 12, &t).is_err());
    assert_eq!(check("ts", 13, &t).unwrap(), Some(Duration::from_secs(13)));
    // Also a cap when E is not shorter than the manager's TTL: a lease
    // acquired with a longer TTL of its own must not outlive E either.
    assert_eq!(check("ts", 90, &t).unwrap(), Some(Duration::from_secs(90)));
    assert_eq!(
        check("ts", 600, &t).unwrap(),
        Some(Duration::from_secs(600))
    );
    let mut capped = t.clone();
    capped.ttl_cap = check("ts", 120, &t).unwrap();
    assert_eq!(
        capped.validity_for(Duration::from_secs(90)),
        Duration::from_secs(81),
        "the manager's TTL, shorter than E, is kept"
    );
    assert_eq!(
        capped.validity_for(Duration::from_secs(600)),
        Duration::from_secs(111),
        "a longer per-lease TTL is capped by E"
    );
}

#[test]
fn ttl_indexes_on_dates_no_renewal_moves_are_refused() {
    let t = timing(30, 10, 3);
    for field in ["acq", "wt", "yu", "data.deadline"] {
        let error = check(field, 86_400, &t).unwrap_err();
        assert!(error.to_string().contains("no renewal moves"), "{error}");
    }
}

#[test]
fn ttl_indexes_on_exp_or_unrelated_fields_are_accepted_without_a_cap() {
    let t = timing(30, 10, 3);
    for field in ["exp", "createdAt", "data"] {
        assert_eq!(check(field, 0, &t).unwrap(), None, "{field}");
    }
    let plain = IndexModel::builder().keys(doc! { "ts": 1 }).build();
    assert_eq!(check_ttl_index(&plain, &t, "db.c").unwrap(), None);
}
