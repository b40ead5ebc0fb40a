//! Fencing tokens' layout: the server's millisecond of the acquisition in
//! the high bits, a count of acquisitions within that millisecond in the
//! [`TOKEN_TIME_SHIFT`] low bits (the rule: `docs/protocol.md`, "Fencing
//! tokens").

/// Multiplier of the server time (ms) in a fencing token: tokens issued within
/// one millisecond of server time may grow by up to 2^20 before the time part
/// catches up, far more than one key can be acquired in a millisecond.
pub(crate) const TOKEN_TIME_SHIFT: u32 = 20;
