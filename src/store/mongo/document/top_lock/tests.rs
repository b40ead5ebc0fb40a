//! Unit tests of the `LockId` / `LockTime` BSON; what the server does with it is tested on mongod (`tests/document_lease/lock_id.rs`).
