//! Misuse from the command line: a user whose credentials do not allow a
//! write gets one short sentence and a documented exit code. The library's
//! side: `tests/misuse/`, whose support (replica sets with access control,
//! users of one role, the check that a message is short) is shared here.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../tests/misuse/support.rs"]
#[allow(dead_code)]
mod support;

mod credentials;
