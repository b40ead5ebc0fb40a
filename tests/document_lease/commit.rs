//! In-document leases through the public API: turns of two managers on one
//! work item, commit refused after a lost lease, creation under concurrent
//! acquires, lost-lease tokens.
