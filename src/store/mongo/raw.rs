//! **Raw commands**: commands encoded by hand (every acquisition's and
//! handoff's `findAndModify`, the light releases and the heartbeat's
//! renewal), sent with `run_raw_command`. They are not
//! retryable writes (no `txnNumber`), so the server keeps no image of a
//! `findAndModify`'s result nor a transaction record for a retry
//! (docs/mongodb-behaviour.md, B25); their callers resolve an unknown
//! outcome themselves (B7). Unlike the driver's write helpers,
//! `run_raw_command` returns a write concern error and write errors as
//! fields of the reply: read here ([`update_reply`], [`acknowledged`]).
//! The light forms' updates are encoded once per store
//! ([`LightForms`](super::light_forms::LightForms)).

use super::handle::MongoStore;
use super::rules::{TTL, key_filter};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, Document, RawArrayBuf, RawBinaryRef, RawDocumentBuf, rawdoc};
use std::time::Duration;
use uuid::Uuid;
/// An update's stages, encoded.
pub(super) fn encode_pipeline(stages: &[Document]) -> Result<RawArrayBuf> {
    let mut update = RawArrayBuf::new();
    for stage in stages {
        update.push(RawDocumentBuf::from_document(stage).map_err(encoding)?);
    }
    Ok(update)
}

/// The `_id` filter of `key`, encoded.
pub(super) fn raw_key_filter(key: &LeaseKey) -> Result<RawDocumentBuf> {
    RawDocumentBuf::from_document(&key_filter(key)).map_err(encoding)
}

/// The `let` variables `vars` (name, lease id), encoded.
pub(super) fn raw_lets(vars: &[(&str, Uuid)]) -> RawDocumentBuf {
    let mut lets = RawDocumentBuf::new();
    for (name, id) in vars {
        let id = RawBinaryRef {
            subtype: BinarySubtype::Uuid,
            bytes: id.as_bytes(),
        };
        lets.append_ref(&name[2..], id);
    }
    lets
}

/// The `let` variables `vars` (name, lease id) and the TTL `$$ttl` (in
/// whole milliseconds), encoded.
pub(super) fn raw_lets_with_ttl(vars: &[(&str, Uuid)], ttl: Duration) -> RawDocumentBuf {
    let mut lets = raw_lets(vars);
    lets.append(&TTL[2..], super::handle::ttl_ms(ttl));
    lets
}

/// A document this store built that BSON cannot encode (a key too large).
pub(super) fn encoding(e: mongodb::bson::raw::Error) -> Error {
    Error::InvalidKey {
        reason: format!("cannot be encoded as BSON: {e}"),
    }
}

/// The document a raw `findAndModify` command's `reply` returned (`value`).
pub(super) fn reply_value(mut reply: Document) -> Option<Document> {
    match reply.remove("value") {
        Some(Bson::Document(value)) => Some(value),
        _ => None,
    }
}

/// An `update` command of `statements` on `collection`. With `ordered`
/// false (`ordered: false` in the command) every statement is tried,
/// whatever an earlier one's write error; with `ordered` true (the
/// server's default, left out of the command) the first write error stops
/// the rest.
pub(super) fn update_statements(
    collection: &str,
    statements: RawArrayBuf,
    ordered: bool,
) -> RawDocumentBuf {
    let mut command = RawDocumentBuf::new();
    command.append("update", collection);
    command.append("updates", statements);
    if !ordered {
        command.append("ordered", false);
    }
    command
}

/// The documents an `update` command's `reply` matched (`n`) and modified
/// (`nModified`); `None` if it carries write errors.
pub(super) fn update_counts(reply: &Document) -> Option<(u64, u64)> {
    let (matched, modified, errors) = update_reply(reply);
    (!errors).then_some((matched, modified))
}

/// The documents an `update` command's `reply` matched (`n`) and modified
/// (`nModified`), and whether it carries write errors (the counts are then
/// those of the statements that applied).
pub(super) fn update_reply(reply: &Document) -> (u64, u64, bool) {
    let errors = reply.get_array("writeErrors").is_ok_and(|e| !e.is_empty());
    let count = |name| match reply.get(name) {
        Some(Bson::Int32(n)) => (*n).max(0) as u64,
        Some(Bson::Int64(n)) => (*n).max(0) as u64,
        _ => 0,
    };
    (count("n"), count("nModified"), errors)
}

/// `reply`, or an unknown outcome ([`Error::Unreachable`], after `waited`)
/// if it carries a write concern error: the write may have applied.
pub(super) fn acknowledged(reply: Document, waited: Duration) -> Result<Document> {
    match reply.get_document("writeConcernError") {
        Ok(error) => Err(Error::Unreachable {
            waited,
            reason: format!("a majority did not acknowledge the write: {error}"),
            source: None,
        }),
        Err(_) => Ok(reply),
    }
}

impl MongoStore {
    /// Sends `command` (on the lock collection's database) with majority
    /// write concern, as a raw command.
    ///
    /// # Errors
    ///
    /// As the command's; a write concern error is [`Error::Unreachable`],
    /// an unknown outcome.
    pub(super) async fn raw_command(&self, mut command: RawDocumentBuf) -> Result<Document> {
        command.append("writeConcern", rawdoc! { "w": "majority" });
        self.send_raw(command).await
    }

    /// Sends `command` (on the lock collection's database), which names
    /// its write concern, as a raw command.
    ///
    /// # Errors
    ///
    /// As [`MongoStore::raw_command`]'s.
    pub(super) async fn send_raw(&self, command: RawDocumentBuf) -> Result<Document> {
        let reply = self.bounded(self.database.run_raw_command(command)).await?;
        acknowledged(reply, self.operation_timeout)
    }
}
