//! `mongo-lease watch`: print each change of a key's holders as it happens.
//!
//! The states come from `LeaseManager::observe` (a change stream on a replica
//! set, re-reads at expiry, polling on a standalone server); this file turns
//! consecutive states into changes of holder. Renewals and payload writes
//! change no holder, so they print nothing.
//!
//! How a holder's lease ended is read from the state that follows it: an
//! expiry leaves the stored expiry (`exp`) where the last renewal put it,
//! a release moves it back to the release's time. A key can also go from
//! one exclusive holder to another in one write: a takeover after the
//! previous lease expired (`taken over`), or a release that hands the key
//! to the first owner registered in the key's queue of waiting owners (a
//! release and an acquisition, so `released` then `acquired`: the
//! acquisition's server time is before the previous lease's expiry).
//! Each JSON line also lists the owners waiting for the key in that state
//! (`waiters`, as in `list --json`); a change of waiters alone prints
//! nothing. A
//! force release stores exactly what a release by the holder does (the
//! lock document does not say who released it), so it prints `released`
//! too.

use std::io::Write;
use std::time::SystemTime;

use mongo_lease::{LeaseInfo, LeaseKey, LeaseKind, LeaseManager};
use serde_json::{Value, json};

use crate::child::Signals;
use crate::output::{key_json, kind_name, time, waiters_json};
use crate::{Failure, exit};

/// Follows `key` until SIGINT or SIGTERM (then exits 0), printing one line
/// per change; the first line is the current state.
pub async fn watch(manager: &LeaseManager, key: LeaseKey, json: bool) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let mut observer = manager.observe(key.clone()).await?;
    let mut tracker = Tracker::default();
    let mut stop = std::pin::pin!(signals.next());
    let mut out = std::io::stdout();
    loop {
        let state = tokio::select! {
            state = observer.recv() => state,
            _ = &mut stop => return Ok(0),
        };
        let state = match state {
            Some(Ok(state)) => state,
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(Failure {
                    code: exit::UNAVAILABLE,
                    message: "the observation of the key ended".into(),
                });
            }
        };
        let waiters = state
            .as_ref()
            .map_or(Value::Array(Vec::new()), waiters_json);
        for change in tracker.next(&Snapshot::of(state.as_ref())) {
            let line = if json {
                let mut line = change.json(&key);
                line["waiters"] = waiters.clone();
                line.to_string()
            } else {
                change.text(&key)
            };
            // stdout is line-buffered: each line reaches a pipe as printed.
            if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    eprintln!("mongo-lease: cannot write the output: {e}");
                }
                return Ok(0);
            }
        }
    }
}

/// One holder of the key, as `watch` follows it: identified by owner id and
/// fencing token.
#[derive(Clone, Debug, PartialEq)]
struct Holder {
    owner_id: String,
    fencing_token: u64,
    acquired_at: SystemTime,
    /// When it expires unless renewed, as last seen.
    expires_at: SystemTime,
    /// A foreign holder's lock.
    foreign: bool,
    /// Whether `expires_at` is its expiry: always for mongo-lease's
    /// leases, for a foreign holder's lock only by a rule of its shape.
    expiry_known: bool,
    kind: LeaseKind,
}

impl Holder {
    fn same(&self, other: &Holder) -> bool {
        self.owner_id == other.owner_id && self.fencing_token == other.fencing_token
    }
}

/// A state of the key as the tracker reads it.
#[derive(Clone, Debug, PartialEq)]
struct Snapshot {
    /// The live holders: the exclusive holder, or the holders of a shared
    /// or semaphore key; none for a free key.
    holders: Vec<Holder>,
    /// The server time of the state.
    server_time: SystemTime,
    /// The stored expiry (`exp`) of a key of mongo-lease's layout held (or
    /// last held) exclusively, or a foreign holder's lock's expiry by its
    /// own rule; `None` for a deleted document, a foreign holder's lock
    /// without one, or a shared or semaphore key.
    exclusive_expiry: Option<SystemTime>,
}

impl Snapshot {
    fn of(state: Option<&LeaseInfo>) -> Snapshot {
        let Some(info) = state else {
            // No document, so no server time read with it: the local clock
            // stands in.
            return Snapshot {
                holders: Vec::new(),
                server_time: SystemTime::now(),
                exclusive_expiry: None,
            };
        };
        let expiry_known = !crate::output::expiry_unknown(info);
        let exclusive = !info.kind.is_multi_holder() && expiry_known;
        let holder = |owner_id: &str, fencing_token, acquired_at, expires_at| Holder {
            owner_id: owner_id.to_string(),
            fencing_token,
            acquired_at,
            expires_at,
            foreign: info.foreign,
            expiry_known,
            kind: info.kind,
        };
        let holders = if !info.held {
            Vec::new()
        } else if info.kind.is_multi_holder() {
            info.holders
                .iter()
                .map(|h| holder(&h.owner_id, h.fencing_token, h.acquired_at, h.expires_at))
                .collect()
        } else {
            vec![holder(
                &info.owner_id,
                info.fencing_token,
                info.acquired_at,
                info.expires_at,
            )]
        };
        Snapshot {
            holders,
            server_time: info.server_time,
            exclusive_expiry: exclusive.then_some(info.expires_at),
        }
    }
}

/// What happened to the key.
#[derive(Clone, Debug, PartialEq)]
enum Event {
    /// The first line: the key is held by this holder.
    Held,
    /// The first line: nobody holds the key.
    Free,
    /// A new holder, after a release (also one that handed the key to it
    /// in the same write) or of a free key.
    Acquired,
    /// The holder released it, or an operator force-released it or deleted
    /// its document (the stored state does not tell these apart).
    Released,
    /// The server's expiry passed without a renewal.
    Expired,
    /// A new holder after the previous one's lease had expired: the
    /// previous holder is named.
    TakenOver(Holder),
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Held => "held",
            Event::Free => "free",
            Event::Acquired => "acquired",
            Event::Released => "released",
            Event::Expired => "expired",
            Event::TakenOver(_) => "taken over",
        }
    }
}

/// One line of output.
#[derive(Clone, Debug, PartialEq)]
struct Change {
    event: Event,
    /// The holder it is about (`None` for `free`).
    holder: Option<Holder>,
    /// When the lease ends or ended: its expiry (held, acquired, taken
    /// over, expired) or the release's server time (released).
    ends_at: Option<SystemTime>,
    /// The server time of the state (the write's, or the read's).
    server_time: SystemTime,
}

/// Consecutive states in, changes out.
#[derive(Default)]
struct Tracker {
    /// The holders of the last state (`None` before the first one).
    last: Option<Vec<Holder>>,
    /// The exclusive holder whose lease expired last, while nobody took
    /// the key since: the next exclusive holder takes over from it.
    expired: Option<Holder>,
}

impl Tracker {
    fn next(&mut self, state: &Snapshot) -> Vec<Change> {
        let server_time = state.server_time;
        let now = &state.holders;
        let change = |event, holder: Option<&Holder>, ends_at| Change {
            event,
            holder: holder.cloned(),
            ends_at,
            server_time,
        };
        let Some(before) = self.last.replace(now.clone()) else {
            if now.is_empty() {
                return vec![change(Event::Free, None, None)];
            }
            return now
                .iter()
                .map(|h| change(Event::Held, Some(h), expiry(h)))
                .collect();
        };
        let gone: Vec<&Holder> = before
            .iter()
            .filter(|b| !now.iter().any(|n| n.same(b)))
            .collect();
        let new: Vec<&Holder> = now
            .iter()
            .filter(|n| !before.iter().any(|b| b.same(n)))
            .collect();
        let mut changes = Vec::new();
        // An exclusive holder replaced by another in one write: a takeover
        // if its lease had expired; otherwise its release handed the key on
        // (a release and an acquisition, below).
        let replaced = match (gone.as_slice(), new.as_slice()) {
            ([old], [new]) if !old.kind.is_multi_holder() && taken_after_expiry(old, new) => {
                Some((*old).clone())
            }
            _ => None,
        };
        if replaced.is_none() {
            for old in &gone {
                if ended_by_expiry(old, state) {
                    if !old.kind.is_multi_holder() {
                        self.expired = Some((*old).clone());
                    }
                    changes.push(change(Event::Expired, Some(old), Some(old.expires_at)));
                } else {
                    self.expired = None;
                    changes.push(change(Event::Released, Some(old), Some(server_time)));
                }
            }
        }
        let mut expired = if new.is_empty() {
            None
        } else {
            self.expired.take()
        };
        for holder in new {
            let previous = match &replaced {
                Some(old) => Some(old.clone()),
                None if !holder.kind.is_multi_holder() => expired.take(),
                None => None,
            };
            let event = previous.map_or(Event::Acquired, Event::TakenOver);
            changes.push(change(event, Some(holder), expiry(holder)));
        }
        changes
    }
}

/// The expiry of a holder, none for a foreign holder's lock without an
/// expiry by its rule.
fn expiry(holder: &Holder) -> Option<SystemTime> {
    holder.expiry_known.then_some(holder.expires_at)
}

/// Whether `new`, which replaced the exclusive holder `old` in one write,
/// took the key once `old`'s lease had expired, rather than from `old`'s
/// release handing it on in that write: an acquisition takes a key only if
/// its `exp <= $$NOW`, and `new.acquired_at` is that write's `$$NOW`. A
/// foreign holder's lock without a known expiry was replaced by a write of
/// its own application; one with an expiry by its rule is taken over once
/// that has passed.
fn taken_after_expiry(old: &Holder, new: &Holder) -> bool {
    !old.expiry_known || old.expires_at <= new.acquired_at
}

/// Whether `old`, no longer a holder in `state`, left because its expiry
/// passed rather than by a write: a release (or force release) moves an
/// exclusive lease's `exp` back to the release's time, whereas an expiry
/// leaves it where the last renewal put it; a holder of a shared or
/// semaphore key has expired once its last seen expiry has passed.
fn ended_by_expiry(old: &Holder, state: &Snapshot) -> bool {
    if !old.expiry_known {
        return false;
    }
    if old.kind.is_multi_holder() {
        return old.expires_at <= state.server_time;
    }
    // No stored expiry: the document was deleted (by its holder in delete
    // mode, or an operator), or the key is now of another kind. A key held
    // again stores its new holder's expiry: an exclusive holder replaced
    // in one write and not taken over was released (`taken_after_expiry`).
    state.holders.is_empty()
        && state
            .exclusive_expiry
            .is_some_and(|exp| exp >= old.expires_at)
}

impl Change {
    /// One JSON object, with the same fields on every line (`null` where
    /// one does not apply).
    fn json(&self, key: &LeaseKey) -> Value {
        let holder = self.holder.as_ref();
        let previous = match &self.event {
            Event::TakenOver(previous) => Some(previous),
            _ => None,
        };
        let permits = match holder.map(|h| h.kind) {
            Some(LeaseKind::Permit { permits }) => Some(permits),
            _ => None,
        };
        json!({
            "event": self.event.name(),
            "key": key_json(key),
            "kind": holder.map(|h| kind_name(h.kind)),
            "permits": permits,
            "owner_id": holder.map(|h| &h.owner_id),
            "fencing_token": holder.map(|h| h.fencing_token),
            "foreign": holder.is_some_and(|h| h.foreign),
            "acquired_at": holder.map(|h| time(h.acquired_at)),
            "expires_at": self.ends_at.map(time),
            "previous_owner_id": previous.map(|p| &p.owner_id),
            "previous_fencing_token": previous.map(|p| p.fencing_token),
            "server_time": time(self.server_time),
        })
    }

    /// One line of text: server time, event, key, holder.
    fn text(&self, key: &LeaseKey) -> String {
        let mut line = format!(
            "{} {} {}",
            time(self.server_time),
            self.event.name(),
            key.to_extended_json()
        );
        let Some(holder) = &self.holder else {
            return line;
        };
        match holder.kind {
            LeaseKind::Permit { permits } => line.push_str(&format!(" (permit of {permits})")),
            LeaseKind::Shared => line.push_str(" (shared)"),
            _ => {}
        }
        let owner = if holder.foreign {
            format!("{} (foreign)", holder.owner_id)
        } else {
            holder.owner_id.clone()
        };
        line.push_str(&format!(
            " by {owner} (fencing token {}",
            holder.fencing_token
        ));
        match (&self.event, self.ends_at) {
            (Event::Released, _) => line.push(')'),
            (Event::Expired, Some(at)) => line.push_str(&format!(", expired at {})", time(at))),
            (_, Some(at)) => line.push_str(&format!(", expires at {})", time(at))),
            (_, None) => line.push_str(", no expiry)"),
        }
        if let Event::TakenOver(previous) = &self.event {
            line.push_str(&format!(
                " from {} (fencing token {})",
                previous.owner_id, previous.fencing_token
            ));
        }
        line
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
