use mongodb::bson::doc;

use crate::document::DEFAULT_LEASE_FIELD;

use super::*;

#[test]
fn a_value_that_reads_like_the_lock_field_is_the_users_data() {
    for update in [
        doc! { "$set": { "label": "_lease" } },
        doc! { "$set": { "path": "_lease.lid" } },
        doc! { "$push": { "log": "_lease" } },
        doc! { "$rename": { "old": "new" } },
    ] {
        let update = DocumentUpdate::Modifiers(update);
        assert_eq!(
            check_update(&update, DEFAULT_LEASE_FIELD).ok(),
            Some(()),
            "{update:?}"
        );
    }
    for update in [
        doc! { "$rename": { "state": "_lease" } },
        doc! { "$rename": { "state": "_lease.x" } },
        doc! { "$rename": { "_lease": "state" } },
    ] {
        let update = DocumentUpdate::Modifiers(update);
        assert!(
            matches!(
                check_update(&update, DEFAULT_LEASE_FIELD),
                Err(Error::InvalidUpdate { .. })
            ),
            "{update:?}"
        );
    }
}

#[test]
fn a_pipeline_that_names_the_reserved_field_is_refused() {
    for pipeline in [
        vec![doc! { "$set": { "__mongo_lease__lease": "mine" } }],
        vec![doc! { "$unset": ["__mongo_lease__lease"] }],
        vec![
            doc! { "$set": { "n": 1 } },
            doc! { "$replaceWith": { "$mergeObjects": ["$$ROOT", {
                "a": [{ "b": "$__mongo_lease__lease.tok" }],
            }]}},
        ],
    ] {
        let update = DocumentUpdate::Pipeline(pipeline);
        assert!(
            matches!(
                check_update(&update, DEFAULT_LEASE_FIELD),
                Err(Error::InvalidUpdate { reason }) if reason.contains("reserved")
            ),
            "{update:?}"
        );
    }
    let fine = DocumentUpdate::Pipeline(vec![doc! { "$set": { "_lease": "x", "m": "__mongo" } }]);
    assert_eq!(check_update(&fine, DEFAULT_LEASE_FIELD).ok(), Some(()));
}
