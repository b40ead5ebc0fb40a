//! What a member says about itself: one `hello` per member, read as a
//! [`MemberState`], and the writable primary chosen from one round of them.
//! Errors that give up on a replica set carry these observations.

use std::fmt;

use mongodb::Client;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::{Document, doc};

use super::member::Member;

/// What the test kit saw of one member: its answer to `hello`, or why it
/// could not ask.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberState {
    /// A writable primary (`isWritablePrimary: true`).
    Primary,
    /// A secondary.
    Secondary {
        /// The primary this member knows of (`host:port`, as in the replica
        /// set configuration), if any.
        primary: Option<String>,
    },
    /// Neither primary nor secondary: starting up, recovering, rolling
    /// back, in the middle of stepping down or up, or not yet part of a
    /// configuration.
    Other {
        /// The primary this member knows of, if any.
        primary: Option<String>,
    },
    /// `hello` failed (refused, timed out, ...): the driver's error.
    Unreachable(String),
    /// The member's `mongod` is not running: it was killed or stopped
    /// through the test kit.
    NotRunning,
    /// The member's `mongod` exited on its own: its exit status.
    Exited(String),
}

impl fmt::Display for MemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn primary(p: &Option<String>) -> String {
            match p {
                Some(p) => format!("primary is {p}"),
                None => "sees no primary".to_owned(),
            }
        }
        match self {
            MemberState::Primary => f.write_str("PRIMARY"),
            MemberState::Secondary { primary: p } => write!(f, "SECONDARY ({})", primary(p)),
            MemberState::Other { primary: p } => write!(
                f,
                "neither PRIMARY nor SECONDARY (starting, recovering or changing role; {})",
                primary(p)
            ),
            MemberState::Unreachable(e) => write!(f, "unreachable ({e})"),
            MemberState::NotRunning => f.write_str("not running (killed or stopped)"),
            MemberState::Exited(status) => write!(f, "exited on its own ({status})"),
        }
    }
}

/// What the test kit saw of one member of a replica set, named by its
/// index and port. Displays as `member 1 (port 40123): SECONDARY (...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberStatus {
    /// Index of the member (its `_id` in the replica set configuration).
    pub index: usize,
    /// The member's own loopback port.
    pub port: u16,
    /// What it said, or why it could not be asked.
    pub state: MemberState,
}

impl fmt::Display for MemberStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "member {} (port {}): {}",
            self.index, self.port, self.state
        )
    }
}

/// One member's answer to one `hello`, with what is needed to choose
/// between two members that both claim to be primary.
#[derive(Debug, Clone)]
pub(super) struct Probe {
    pub(super) status: MemberStatus,
    /// `electionId` of a primary: the newest election wins.
    pub(super) election_id: Option<ObjectId>,
}

impl Probe {
    pub(super) fn is_primary(&self) -> bool {
        self.status.state == MemberState::Primary
    }
}

/// Asks `member` (through `client`, a direct connection to it) who it is.
pub(super) async fn probe(member: &Member, client: &Client) -> Probe {
    let (state, election_id) = if let Some(status) = member.exit_status() {
        (MemberState::Exited(status.to_string()), None)
    } else if member.pid().is_none() {
        (MemberState::NotRunning, None)
    } else {
        match client
            .database("admin")
            .run_command(doc! { "hello": 1 })
            .await
        {
            Ok(reply) => read_hello(&reply),
            Err(e) => (MemberState::Unreachable(e.to_string()), None),
        }
    };
    Probe {
        status: MemberStatus {
            index: member.index(),
            port: member.port(),
            state,
        },
        election_id,
    }
}

/// Reads a `hello` reply.
pub(super) fn read_hello(reply: &Document) -> (MemberState, Option<ObjectId>) {
    let primary = reply.get_str("primary").ok().map(str::to_owned);
    if reply.get_bool("isWritablePrimary").unwrap_or(false) {
        (MemberState::Primary, reply.get_object_id("electionId").ok())
    } else if reply.get_bool("secondary").unwrap_or(false) {
        (MemberState::Secondary { primary }, None)
    } else {
        (MemberState::Other { primary }, None)
    }
}

/// Index of the writable primary in one round of probes. If two members
/// claim to be primary (an old primary that has not yet noticed the newer
/// election), the one with the newest `electionId` wins.
pub(super) fn pick_primary(probes: &[Probe]) -> Option<usize> {
    probes
        .iter()
        .filter(|p| p.is_primary())
        .max_by_key(|p| p.election_id)
        .map(|p| p.status.index)
}

/// `member 0 (port ...): ...; member 1 (port ...): ...`.
pub(super) fn describe(members: &[MemberStatus]) -> String {
    if members.is_empty() {
        return "(no member was asked)".to_owned();
    }
    members
        .iter()
        .map(MemberStatus::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests;
