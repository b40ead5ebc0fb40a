//! Printing: the lease table, JSON, and redaction of credentials.

use std::time::{Duration, SystemTime};

use mongo_lease::{HolderInfo, LeaseInfo, LeaseKey, LeaseKind, LeaseManager};
use serde_json::{Value, json};

use crate::Failure;

/// Removes the credentials of the connection string from messages.
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    pub fn new(uri: &str) -> Redactor {
        let mut secrets = Vec::new();
        if let Some((_, rest)) = uri.split_once("://") {
            let authority = rest.split(['/', '?']).next().unwrap_or(rest);
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                if !userinfo.is_empty() {
                    secrets.push(userinfo.to_string());
                }
                if let Some((_, password)) = userinfo.split_once(':') {
                    if !password.is_empty() {
                        secrets.push(password.to_string());
                        secrets.push(percent_decode(password));
                    }
                }
            }
        }
        secrets.retain(|s| !s.is_empty());
        // Longest first, so that a password inside the userinfo goes with it.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    pub fn redact(&self, message: &str) -> String {
        let mut message = message.to_string();
        for secret in &self.secrets {
            message = message.replace(secret.as_str(), "***");
        }
        message
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `2m 5s`, `12.3s`, `450ms`.
fn short(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// RFC 3339 with milliseconds. A foreign holder's `ts` can be any date: one
/// before 1970 or after 9999 (which `humantime` cannot format) is shown by
/// BSON's own formatting, or as milliseconds since the Unix epoch.
pub fn time(t: SystemTime) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if t >= SystemTime::UNIX_EPOCH && write!(out, "{}", humantime::format_rfc3339_millis(t)).is_ok()
    {
        return out;
    }
    let date = mongodb::bson::DateTime::from_system_time(t);
    date.try_to_rfc3339_string()
        .unwrap_or_else(|_| format!("{} ms since the Unix epoch", date.timestamp_millis()))
}

fn payload_json(info: &LeaseInfo) -> Value {
    match &info.payload {
        Some(p) => mongodb::bson::Bson::Document(p.clone()).into_relaxed_extjson(),
        None => Value::Null,
    }
}

/// A key as an Extended JSON value (canonical): a JSON string for a string
/// key, `{"$oid": ...}` for an `ObjectId`, what `--key-json` reads back.
pub fn key_json(key: &LeaseKey) -> Value {
    key.to_bson().into_canonical_extjson()
}

/// The kind's name, as in `MONGO_LEASE_KIND` and the JSON output.
pub fn kind_name(kind: LeaseKind) -> &'static str {
    match kind {
        LeaseKind::Shared => "shared",
        LeaseKind::Permit { .. } => "permit",
        _ => "exclusive",
    }
}

/// The number of permits of a semaphore key.
fn permits(kind: LeaseKind) -> Option<u32> {
    match kind {
        LeaseKind::Permit { permits } => Some(permits),
        _ => None,
    }
}

/// How long `t` is after `now` (zero if it is not).
fn until(now: SystemTime, t: SystemTime) -> Duration {
    t.duration_since(now).unwrap_or(Duration::ZERO)
}

/// One holder of a shared or semaphore key as JSON, with its age and time
/// to expiry at the read's server time.
fn holder_json(holder: &HolderInfo, server_time: SystemTime) -> Value {
    json!({
        "owner_id": holder.owner_id,
        "fencing_token": holder.fencing_token,
        "acquired_at": time(holder.acquired_at),
        "renewed_at": time(holder.renewed_at),
        "expires_at": time(holder.expires_at),
        "age_ms": until(holder.acquired_at, server_time).as_millis() as u64,
        "time_to_expiry_ms": until(server_time, holder.expires_at).as_millis() as u64,
    })
}

/// The waiting owners of a key as JSON, first served first
/// (`LeaseInfo::waiters`): `owner_id`, `kind`, `registered_at` (`null` for
/// an exclusive waiter's mark on a shared key) and `expires_at`, when its
/// entry lapses unless it tries again.
pub fn waiters_json(info: &LeaseInfo) -> Value {
    let waiters = info.waiters.iter().map(|w| {
        json!({
            "owner_id": w.owner_id,
            "kind": kind_name(w.kind),
            "registered_at": w.registered_at.map(time),
            "expires_at": time(w.expires_at),
        })
    });
    Value::Array(waiters.collect())
}

/// Whether `info` has no expiry: a foreign holder's lock without an expiry
/// by its rule (a bare `{_id}`, `{_id, ts, aid}` without a TTL index on
/// `ts`, a document of no recognised layout, or one whose `--foreign-lock`
/// rule gives no expiry), held until its document changes.
pub fn expiry_unknown(info: &LeaseInfo) -> bool {
    info.foreign && info.time_to_expiry() == Duration::MAX
}

/// A lease as JSON. A foreign holder's lock (`"foreign": true`: a document
/// not written by mongo-lease) shows its expiry by its own rule; without
/// one ([`expiry_unknown`]) `expires_at` and `time_to_expiry_ms` are `null`. `kind` is `exclusive`, `shared` or
/// `permit` (then `permits` is the key's number of permits, else `null`);
/// `holders` lists the live holders of a shared or semaphore key (empty for
/// an exclusive one), `hold_until` is the server time until which a key
/// acquired with `--hold-at-least` stays held (`null` without one, or once
/// past), `lock_delay_until` the server time until which no acquisition
/// can take a key after `release --force` (of a key, or with `--owner`; `null`
/// without a lock-delay, or once past), `waiters` the owners waiting for the key ([`waiters_json`]), and
/// `transitions` how many times the key went to another owner id.
pub fn lease_json(info: &LeaseInfo) -> Value {
    let (expires_at, time_to_expiry_ms) = if expiry_unknown(info) {
        (Value::Null, Value::Null)
    } else {
        (
            json!(time(info.expires_at)),
            json!(info.time_to_expiry().as_millis() as u64),
        )
    };
    let holders: Vec<Value> = info
        .holders
        .iter()
        .map(|h| holder_json(h, info.server_time))
        .collect();
    json!({
        "key": key_json(&info.key),
        "owner_id": info.owner_id,
        "foreign": info.foreign,
        "fencing_token": info.fencing_token,
        "held": info.held,
        "acquired_at": time(info.acquired_at),
        "renewed_at": time(info.renewed_at),
        "expires_at": expires_at,
        "server_time": time(info.server_time),
        "age_ms": info.age().as_millis() as u64,
        "time_to_expiry_ms": time_to_expiry_ms,
        "payload": payload_json(info),
        "kind": kind_name(info.kind),
        "permits": permits(info.kind),
        "holders": holders,
        "hold_until": info.hold_until.map(time),
        "lock_delay_until": info.lock_delay_until.map(time),
        "waiters": waiters_json(info),
        "transitions": info.transitions,
    })
}

/// The holder as shown in tables and messages: the owner id, marked
/// `(foreign)` for a foreign holder's lock.
fn holder_label(info: &LeaseInfo) -> String {
    match (info.foreign, info.owner_id.is_empty()) {
        (false, _) => info.owner_id.clone(),
        (true, false) => format!("{} (foreign)", info.owner_id),
        (true, true) => "(foreign)".into(),
    }
}

/// The KIND cell of a key's line.
fn kind_cell(info: &LeaseInfo) -> String {
    match info.kind {
        LeaseKind::Permit { permits: 1 } => "1 permit".into(),
        LeaseKind::Permit { permits } => format!("{permits} permits"),
        kind => kind_name(kind).into(),
    }
}

/// The table of `list`: one line per key, then one per holder of a shared
/// or semaphore key.
fn rows(leases: &[LeaseInfo]) -> Vec<[String; 9]> {
    let mut rows = Vec::new();
    for l in leases {
        let multi = l.kind.is_multi_holder();
        let owner = if multi {
            match l.holders.len() {
                1 => "(1 holder)".to_string(),
                n => format!("({n} holders)"),
            }
        } else {
            holder_label(l)
        };
        let state = if l.held { "held" } else { "free" };
        rows.push([
            l.key.to_string(),
            kind_cell(l),
            owner,
            // A foreign holder's lock has no fencing token, and an age only
            // from a date of its own (else its `acquired_at` is the read's).
            if l.foreign {
                "-".into()
            } else {
                l.fencing_token.to_string()
            },
            state.to_string(),
            if l.foreign && l.acquired_at >= l.server_time {
                "-".into()
            } else {
                short(l.age())
            },
            if expiry_unknown(l) {
                "none".into()
            } else if l.held {
                short(l.time_to_expiry())
            } else {
                "-".into()
            },
            match l.hold_until {
                Some(t) => short(until(l.server_time, t)),
                None => "-".into(),
            },
            match &l.payload {
                Some(_) => payload_json(l).to_string(),
                None => "-".into(),
            },
        ]);
        for h in &l.holders {
            rows.push([
                String::new(),
                format!("- {}", kind_name(l.kind)),
                h.owner_id.clone(),
                h.fencing_token.to_string(),
                "held".into(),
                short(until(h.acquired_at, l.server_time)),
                short(until(l.server_time, h.expires_at)),
                "-".into(),
                "-".into(),
            ]);
        }
    }
    rows
}

pub async fn print_list(
    manager: &LeaseManager,
    held_only: bool,
    json: bool,
) -> Result<u8, Failure> {
    let mut leases = manager.list().await?;
    if held_only {
        leases.retain(|l| l.held);
    }
    if json {
        let all: Vec<Value> = leases.iter().map(lease_json).collect();
        println!("{}", Value::Array(all));
        return Ok(0);
    }
    let header = [
        "KEY",
        "KIND",
        "OWNER",
        "TOKEN",
        "STATE",
        "AGE",
        "EXPIRES IN",
        "HELD UNTIL",
        "PAYLOAD",
    ];
    let rows = rows(&leases);
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        eprintln!("(no leases)");
    }
    Ok(0)
}

/// When the keys an override released are granted again: after the
/// lock-delay, and by default not before the released lease's expiry.
#[derive(Debug, Clone, Copy)]
pub struct Freed {
    lock_delay: Duration,
    immediately: bool,
}

impl Freed {
    pub fn new(lock_delay: Duration, immediately: bool) -> Self {
        Freed {
            lock_delay,
            immediately,
        }
    }

    /// How long after the release `released` (its lease as it was) its
    /// key stays unavailable.
    fn after(&self, released: &LeaseInfo) -> Duration {
        match self.immediately {
            true => self.lock_delay,
            false => self.lock_delay.max(released.time_to_expiry()),
        }
    }
}

/// The answer of `release KEY --force`.
pub fn print_release(key: &LeaseKey, released: Option<&LeaseInfo>, freed: Freed, json: bool) {
    // A foreign holder's lock is deleted: nothing delays the next holder.
    let delayed = released
        .filter(|info| !info.foreign)
        .map(|info| freed.after(info));
    if json {
        let mut out = json!({ "key": key_json(key), "released": released.is_some() });
        if let Some(after) = delayed {
            out["lock_delay_ms"] = json!(freed.lock_delay.as_millis() as u64);
            out["free_in_ms"] = json!(after.as_millis() as u64);
        }
        if let Some(info) = released {
            out["owner_id"] = json!(info.owner_id);
            out["fencing_token"] = json!(info.fencing_token);
            out["foreign"] = json!(info.foreign);
            out["kind"] = json!(kind_name(info.kind));
            out["holders"] = info
                .holders
                .iter()
                .map(|h| holder_json(h, info.server_time))
                .collect();
        }
        println!("{out}");
        return;
    }
    let key = key.to_extended_json();
    match released {
        Some(info) if info.foreign => println!(
            "released {key} (force): it was held by a foreign holder {:?} \
             (a lock document not written by mongo-lease), which was deleted",
            info.owner_id
        ),
        Some(info) if !info.holders.is_empty() => {
            let holders: Vec<String> = info
                .holders
                .iter()
                .map(|h| format!("{} (fencing token {})", h.owner_id, h.fencing_token))
                .collect();
            println!(
                "released {key} (force): it was held as {} by {}",
                info.kind,
                holders.join(", ")
            )
        }
        Some(info) => println!(
            "released {key} (force): it was held by {} with fencing token {}",
            info.owner_id, info.fencing_token
        ),
        None => println!("{key} was not held; nothing released"),
    }
    if let Some(after) = delayed {
        print_free_in(after, freed);
    }
}

/// The line saying when a released key is granted again.
fn print_free_in(after: Duration, freed: Freed) {
    let after = humantime::format_duration(Duration::from_millis(after.as_millis() as u64));
    match (freed.immediately, freed.lock_delay.is_zero()) {
        (true, true) => println!("free now (--immediately, no lock-delay)"),
        (true, false) => println!("free again in {after}: the lock-delay (--lock-delay to change)"),
        (false, _) => println!(
            "free again in {after}, when the holder's lease could no longer be live; \
             its holder is told at its next renewal (--immediately if it is known to be gone)"
        ),
    }
}

/// The answer of `release --owner AID --force`.
pub fn print_owner_release(owner: &str, released: u64, freed: Freed, json: bool) {
    if json {
        let mut out =
            json!({ "owner_id": owner, "released": released, "immediately": freed.immediately });
        if released > 0 {
            out["lock_delay_ms"] = json!(freed.lock_delay.as_millis() as u64);
        }
        println!("{out}");
        return;
    }
    let leases = if released == 1 { "lease" } else { "leases" };
    println!("released {released} {leases} of owner id {owner:?} (force)");
    if released == 0 {
        return;
    }
    let delay = humantime::format_duration(freed.lock_delay);
    match freed.immediately {
        true => println!("their keys are free again in {delay}: the lock-delay"),
        false => println!(
            "their keys are free again once each lease could no longer be live (at most a \
             TTL from now), and not before the lock-delay ({delay}); their holders are told \
             at their next renewal (--immediately if they are known to be gone)"
        ),
    }
}

/// The answer of `release KEY --request`.
pub fn print_request(key: &LeaseKey, held: bool, json: bool) {
    if json {
        println!("{}", json!({ "key": key_json(key), "requested": held }));
    } else if held {
        println!(
            "asked the holders of {} to release it",
            key.to_extended_json()
        );
    } else {
        println!("{} was not held; nothing to ask", key.to_extended_json());
    }
}

pub fn print_not_acquired(key: &LeaseKey, holder: Option<&LeaseInfo>, json: bool) {
    let holder = holder.filter(|h| h.held);
    if json {
        let out = json!({
            "key": key_json(key),
            "acquired": false,
            "holder": holder.map(lease_json),
        });
        println!("{out}");
        return;
    }
    let key = key.to_extended_json();
    match holder {
        Some(h) if expiry_unknown(h) => eprintln!(
            "mongo-lease: not acquired: {key} is held by a foreign holder {:?} \
             (a lock document not written by mongo-lease, with no expiry)",
            h.owner_id
        ),
        Some(h) if h.foreign => eprintln!(
            "mongo-lease: not acquired: {key} is held by a foreign holder {:?} \
             (a lock document not written by mongo-lease) for {} more, by its own rule",
            h.owner_id,
            short(h.time_to_expiry())
        ),
        Some(h) if h.kind.is_multi_holder() => {
            let holders: Vec<String> = h
                .holders
                .iter()
                .map(|holder| {
                    format!(
                        "{} (fencing token {}, expires in {})",
                        holder.owner_id,
                        holder.fencing_token,
                        short(until(h.server_time, holder.expires_at))
                    )
                })
                .collect();
            let how = match h.kind {
                LeaseKind::Permit { permits } => match h.holders.len() {
                    1 => format!("1 of its {permits} permits is held"),
                    n => format!("{n} of its {permits} permits are held"),
                },
                _ => "it is held shared".into(),
            };
            eprintln!(
                "mongo-lease: not acquired: {key}: {how} by {}",
                holders.join(", ")
            );
        }
        Some(h) if h.hold_until.is_some() => {
            let hold_until = h.hold_until.unwrap_or(h.server_time);
            eprintln!(
                "mongo-lease: not acquired: {key} is held until {} (in {}), the minimum hold \
                 (--hold-at-least) of its acquisition by {} (fencing token {})",
                time(hold_until),
                short(until(h.server_time, hold_until)),
                h.owner_id,
                h.fencing_token,
            )
        }
        Some(h) => eprintln!(
            "mongo-lease: not acquired: {key} is held by {} (fencing token {}, expires in {})",
            h.owner_id,
            h.fencing_token,
            short(h.time_to_expiry())
        ),
        None => eprintln!("mongo-lease: not acquired: {key} is held"),
    }
}

/// How much the tool says on stderr besides errors (`-v`, `-q`).
#[derive(Clone, Copy, Debug)]
pub struct Say {
    pub quiet: bool,
    pub verbose: bool,
}

impl Say {
    pub fn new(c: &crate::args::Connection) -> Say {
        Say {
            quiet: c.quiet,
            verbose: c.verbose,
        }
    }

    /// A line on stderr, unless `-q`.
    pub fn info(self, line: std::fmt::Arguments<'_>) {
        if !self.quiet {
            eprintln!("mongo-lease: {line}");
        }
    }

    /// Whether progress lines repeat while waiting: with `-v`, or on a
    /// terminal (else one line, at once).
    pub fn repeat(self) -> bool {
        use std::io::IsTerminal;
        self.verbose || (!self.quiet && std::io::stderr().is_terminal())
    }
}

/// Who holds a key, and until when by the server's clock, in a few words
/// (`held by OWNER (fencing token N) until T (in 25.0s)`); `term` names the
/// token of an election.
pub fn held_by(h: &LeaseInfo, token: &str) -> String {
    let until_then =
        |t: SystemTime| format!("until {} (in {})", time(t), short(until(h.server_time, t)));
    if expiry_unknown(h) {
        return format!(
            "held by a foreign holder {:?} (another application's lock document, with no expiry)",
            h.owner_id
        );
    }
    if h.foreign {
        return format!(
            "held by a foreign holder {:?} (another application's lock document) {}",
            h.owner_id,
            until_then(h.expires_at)
        );
    }
    if h.kind.is_multi_holder() {
        let how = match h.kind {
            LeaseKind::Permit { permits } => {
                format!("{} of its {permits} permits taken", h.holders.len())
            }
            _ => format!("held shared by {}", h.holders.len()),
        };
        return format!("{how}, the first ending {}", {
            let first = h
                .holders
                .iter()
                .map(|x| x.expires_at)
                .min()
                .unwrap_or(h.expires_at);
            until_then(first)
        });
    }
    if let Some(hold_until) = h.hold_until {
        return format!(
            "held by {} ({token} {}) {}, its minimum hold (--hold-at-least)",
            h.owner_id,
            h.fencing_token,
            until_then(hold_until)
        );
    }
    format!(
        "held by {} ({token} {}) {} unless renewed",
        h.owner_id,
        h.fencing_token,
        until_then(h.expires_at)
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::time;

    #[test]
    fn times_of_any_date_are_formatted_without_panicking() {
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(
            time(epoch + Duration::from_millis(1_500)),
            "1970-01-01T00:00:01.500Z"
        );
        assert_eq!(
            time(epoch - Duration::from_secs(86_400)),
            "1969-12-31T00:00:00Z"
        );
        let far = epoch + Duration::from_millis(8_640_000_000_000_000);
        assert_eq!(time(far), "8640000000000000 ms since the Unix epoch");
    }
}
