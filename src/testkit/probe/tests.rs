use super::*;

fn probe_of(index: usize, state: MemberState, election_id: Option<ObjectId>) -> Probe {
    Probe {
        status: MemberStatus {
            index,
            port: 27017 + index as u16,
            state,
        },
        election_id,
    }
}

#[test]
fn hello_replies_are_read() {
    let oid = ObjectId::new();
    let (state, id) = read_hello(&doc! {
        "isWritablePrimary": true, "secondary": false,
        "primary": "127.0.0.1:1", "electionId": oid,
    });
    assert_eq!((state, id), (MemberState::Primary, Some(oid)));
    let (state, id) = read_hello(&doc! {
        "isWritablePrimary": false, "secondary": true, "primary": "127.0.0.1:1",
    });
    assert_eq!(
        state,
        MemberState::Secondary {
            primary: Some("127.0.0.1:1".into())
        }
    );
    assert_eq!(id, None);
    let (state, _) = read_hello(&doc! { "isWritablePrimary": false, "secondary": true });
    assert_eq!(state, MemberState::Secondary { primary: None });
    // Stepping down, recovering, or not yet initiated.
    let (state, _) = read_hello(&doc! { "isWritablePrimary": false, "secondary": false });
    assert_eq!(state, MemberState::Other { primary: None });
}

#[test]
fn the_newest_election_wins() {
    let older = ObjectId::from_bytes([0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 3]);
    let newer = ObjectId::from_bytes([0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 4]);
    let secondary = MemberState::Secondary { primary: None };
    assert_eq!(pick_primary(&[]), None);
    assert_eq!(
        pick_primary(&[
            probe_of(0, secondary.clone(), None),
            probe_of(1, MemberState::NotRunning, None),
        ]),
        None
    );
    assert_eq!(
        pick_primary(&[
            probe_of(0, MemberState::Primary, Some(newer)),
            probe_of(1, MemberState::Primary, Some(older)),
        ]),
        Some(0)
    );
    assert_eq!(
        pick_primary(&[
            probe_of(0, MemberState::Primary, Some(older)),
            probe_of(1, secondary, None),
            probe_of(2, MemberState::Primary, Some(newer)),
        ]),
        Some(2)
    );
}

#[test]
fn descriptions_name_each_member() {
    let text = describe(&[
        probe_of(0, MemberState::Secondary { primary: None }, None).status,
        probe_of(
            1,
            MemberState::Other {
                primary: Some("127.0.0.1:9".into()),
            },
            None,
        )
        .status,
        probe_of(
            2,
            MemberState::Unreachable("connection refused".into()),
            None,
        )
        .status,
        probe_of(3, MemberState::NotRunning, None).status,
    ]);
    assert_eq!(
        text,
        "member 0 (port 27017): SECONDARY (sees no primary); \
             member 1 (port 27018): neither PRIMARY nor SECONDARY \
             (starting, recovering or changing role; primary is 127.0.0.1:9); \
             member 2 (port 27019): unreachable (connection refused); \
             member 3 (port 27020): not running (killed or stopped)"
    );
    assert_eq!(describe(&[]), "(no member was asked)");
}
