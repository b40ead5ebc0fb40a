//! In-document leases (the lock inside the user's own document, released by
//! the write of its new state) and fenced writes to user data for leases of
//! the lock collection (the transaction helper and the fence helper), on a
//! real mongod. Plain driver calls play the user's other code.

#[path = "common/mod.rs"]
mod common;
#[path = "document_lease/support.rs"]
mod support;

#[path = "document_lease/api.rs"]
mod api;
#[path = "document_lease/collection_drop.rs"]
mod collection_drop;
#[path = "document_lease/commit.rs"]
mod commit;
#[path = "document_lease/creation.rs"]
mod creation;
#[path = "document_lease/fence.rs"]
mod fence;
#[path = "document_lease/input.rs"]
mod input;
#[path = "document_lease/inspect.rs"]
mod inspect;
#[path = "document_lease/lock_id.rs"]
mod lock_id;
#[path = "document_lease/protocol.rs"]
mod protocol;
#[path = "document_lease/transaction.rs"]
mod transaction;
#[path = "document_lease/transaction_abort.rs"]
mod transaction_abort;
#[path = "document_lease/transaction_lost.rs"]
mod transaction_lost;
#[path = "document_lease/transaction_retry.rs"]
mod transaction_retry;
#[path = "document_lease/yield_on_commit.rs"]
mod yield_on_commit;
