//! The **light forms** of one owner ("Light forms" in `store`), encoded
//! once, when the store is made, from the builders of the files that send
//! them (`acquire.rs`, `release.rs`, `handoff.rs`); the store's handle
//! holds them.

use super::acquire::{light_acquire_update, light_projection};
use super::handoff::light_handoff_update;
use super::raw::encode_pipeline;
use super::release::light_release_update;
use mongodb::bson::{Document, RawArrayBuf, RawDocumentBuf};

/// The light forms of one owner ("Light forms" in `store`), encoded once,
/// when the store is made: what varies from one command to the next (the
/// lease ids, the TTL) is in its `let` variables, so a command copies
/// these bytes instead of building and encoding its update again.
pub(super) struct LightForms {
    /// [`light_acquire_update`].
    pub acquire: RawArrayBuf,
    /// [`light_release_update`]: the form for keys nobody waits for, then
    /// the form that hands the key over ([`LightForms::release`]).
    releases: [RawArrayBuf; 2],
    /// [`light_handoff_update`].
    pub handoff: RawArrayBuf,
    /// [`light_projection`]: what the light acquire's and handoff's
    /// replies are read with.
    pub projection: RawDocumentBuf,
}

impl LightForms {
    /// The light forms of `owner`. Their keys are this crate's constants
    /// and the owner id is a string value, so they always encode.
    pub(super) fn new(owner: &str) -> Self {
        let encoded = |stages: Vec<Document>| {
            encode_pipeline(&stages).expect("constant keys and string values encode")
        };
        LightForms {
            acquire: encoded(light_acquire_update(owner)),
            releases: [false, true]
                .map(|hands_over| encoded(light_release_update(owner, hands_over))),
            handoff: encoded(light_handoff_update(owner)),
            projection: RawDocumentBuf::from_document(&light_projection())
                .expect("a constant document encodes"),
        }
    }

    /// The light release's form: the one that hands the key over, or the
    /// one for keys nobody waits for.
    pub(super) fn release(&self, hands_over: bool) -> &RawArrayBuf {
        &self.releases[usize::from(hands_over)]
    }
}
