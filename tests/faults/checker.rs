//! The safety checker: critical sections rebuilt from the workers' events,
//! judged for mutual exclusion between the kinds of lease, fencing-token
//! order, minimum holds, lost-lease signals and lost updates.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::harness::Event;
use crate::worker::Step;

/// One critical section (one acquisition), as reported or reconstructed.
/// (Every field shows in the checker's failure messages.)
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Cs {
    pub w: String,
    pub key: String,
    /// How it held the key: `x` exclusive, `h` exclusive with
    /// `hold_at_least`, `e` an election's leadership, `d` an in-document
    /// lease (all exclusive), `s` shared, `p` a semaphore's permit.
    pub kind: String,
    /// The semaphore's permits (`p`), 0 otherwise.
    pub permits: u32,
    /// The minimum hold asked for (`h`), in milliseconds, 0 otherwise.
    pub hold_ms: u64,
    pub tok: i64,
    /// When the acquire call began (`t_acq` when not reported).
    pub t_call: u64,
    pub t_acq: u64,
    pub t_end: u64,
    /// When the lease's token fired before its release (0 if it did not).
    pub t_lost: u64,
    pub claim: Step,
    pub claim_lost: bool,
    pub n_read: i64,
    pub prev_last: i64,
    pub write: Step,
    pub write_lost: bool,
    pub lost: bool,
    /// The worker was killed while holding it.
    pub crashed: bool,
}

impl Cs {
    /// Whether no other holder may hold the key beside it.
    pub fn is_exclusive(&self) -> bool {
        !matches!(self.kind.as_str(), "s" | "p")
    }
}

/// One broken rule: on which key, around which time (the monotonic clock
/// of the events), and what.
#[derive(Debug, Clone)]
pub struct Violation {
    pub key: String,
    pub t: u64,
    pub message: String,
}

/// Every violation the checker found.
#[derive(Debug, Clone)]
pub struct Violations(pub Vec<Violation>);

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}", v.message)?;
        }
        Ok(())
    }
}

/// What the checker found; the assertions are made inside [`check`].
#[derive(Debug, Default)]
pub struct Report {
    pub sections: usize,
    pub valid: usize,
    pub lost: usize,
    pub crashed: usize,
    pub refused: usize,
    pub unknown: usize,
    pub settled_by_chain: usize,
    pub acquire_errors: usize,
    pub step_errors: usize,
    pub per_key: BTreeMap<String, Vec<Cs>>,
}

impl Report {
    pub fn kept(&self) -> usize {
        self.sections - self.lost - self.crashed
    }

    /// Leases held at some point during one of the fault windows
    /// (`[start, end]` on the monotonic clock): (kept, lost).
    pub fn across(&self, windows: &[(u64, u64)]) -> (usize, usize) {
        let held: Vec<&Cs> = self
            .per_key
            .values()
            .flatten()
            .filter(|c| !c.crashed)
            .filter(|c| windows.iter().any(|(s, e)| c.t_acq <= *e && c.t_end >= *s))
            .collect();
        let lost = held.iter().filter(|c| c.lost).count();
        (held.len() - lost, lost)
    }

    /// Critical sections per kind of lease (`x=12 s=30 ...`).
    pub fn kinds(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for c in self.per_key.values().flatten() {
            *counts.entry(c.kind.as_str()).or_default() += 1;
        }
        counts
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn summary(&self) -> String {
        format!(
            "{} critical sections ({} with both fenced steps applied), leases kept {} / lost {} / \
             crashed {}, refused steps {}, unknown steps {} (settled by the chain: {}), \
             acquire errors {}, retried step errors {}",
            self.sections,
            self.valid,
            self.kept(),
            self.lost,
            self.crashed,
            self.refused,
            self.unknown,
            self.settled_by_chain,
            self.acquire_errors,
            self.step_errors
        )
    }
}

/// The kind fields of an `acq` or `cs` event (`x`, no permits, no minimum
/// hold when absent, as in the scenarios of exclusive leases only).
fn kind_of(e: &Event) -> (String, u32, u64) {
    let field = |k: &str| e.fields.get(k).map(String::as_str);
    (
        field("kind").unwrap_or("x").to_string(),
        field("permits").map_or(0, |p| p.parse().unwrap()),
        field("hold_ms").map_or(0, |h| h.parse().unwrap()),
    )
}

fn collect_sections(events: &[Event], kills: &HashMap<String, (u64, u64)>) -> Vec<Cs> {
    let mut sections = Vec::new();
    let mut done: BTreeSet<(String, String, i64)> = BTreeSet::new();
    for e in events.iter().filter(|e| e.kind == "cs") {
        done.insert((e.w.clone(), e.get("key").to_string(), e.num("tok")));
        let (kind, permits, hold_ms) = kind_of(e);
        let t_acq = e.num("t_acq") as u64;
        sections.push(Cs {
            w: e.w.clone(),
            key: e.get("key").to_string(),
            kind,
            permits,
            hold_ms,
            tok: e.num("tok"),
            t_call: e.fields.get("t_call").map_or(t_acq, |t| t.parse().unwrap()),
            t_acq,
            t_end: e.num("t_end") as u64,
            t_lost: e.num("t_lost") as u64,
            claim: Step::parse(e.get("claim")),
            claim_lost: e.get("claim_lost") == "1",
            n_read: e.num("n"),
            prev_last: e.num("last"),
            write: Step::parse(e.get("write")),
            write_lost: e.get("write_lost") == "1",
            lost: e.get("lost") == "1",
            crashed: false,
        });
    }
    // Acquisitions of killed workers that never reported an end.
    for e in events.iter().filter(|e| e.kind == "acq") {
        let (key, tok) = (e.get("key").to_string(), e.num("tok"));
        if done.contains(&(e.w.clone(), key.clone(), tok)) {
            continue;
        }
        let (_, dead) = *kills
            .get(&e.w)
            .unwrap_or_else(|| panic!("worker {} acquired {e:?} and never reported the end", e.w));
        // Killed after it called release (its `releasing` line), or after
        // it noticed the loss (its `noticed` line): its critical section
        // ended there, whatever the release became.
        let same = |r: &&Event| r.w == e.w && r.get("key") == key && r.num("tok") == tok;
        let ended_at = events
            .iter()
            .filter(|r| r.kind == "releasing" || r.kind == "noticed")
            .find(same)
            .map(Event::t);
        let claimed = events.iter().filter(|c| c.kind == "claimed").find(same);
        let (kind, permits, hold_ms) = kind_of(e);
        // Shared holders and permits take no fenced step.
        let (claim, write) = match claimed {
            _ if matches!(kind.as_str(), "s" | "p") => (Step::Skipped, Step::Skipped),
            Some(_) => (Step::Ok, Step::Unknown),
            None => (Step::Unknown, Step::Unknown),
        };
        sections.push(Cs {
            w: e.w.clone(),
            key,
            kind,
            permits,
            hold_ms,
            tok,
            t_call: e.fields.get("t_call").map_or(e.t(), |t| t.parse().unwrap()),
            t_acq: e.t(),
            t_end: ended_at.unwrap_or(dead),
            t_lost: 0,
            claim,
            claim_lost: false,
            n_read: claimed.map(|c| c.num("n")).unwrap_or(0),
            prev_last: claimed.map(|c| c.num("last")).unwrap_or(0),
            write,
            write_lost: false,
            lost: false,
            crashed: true,
        });
    }
    sections
}

/// The safety checker. Per key:
///
/// 1. **Mutual exclusion**: a critical section lasts from its acquire's
///    return until its holder stopped it (release called, loss noticed by
///    `is_lost()` or the token, or the worker killed: until it was reaped).
///    An exclusive section overlaps no other section; shared sections
///    overlap no permit; at most `permits` permit sections overlap.
/// 2. **Fencing tokens**: an acquisition that returned before another's
///    acquire call began has the lower token (for exclusive keys: tokens
///    increase in acquisition order).
/// 3. **Minimum hold**: the acquisition after one with `hold_at_least`
///    returned no earlier than that one's call + its minimum hold.
/// 4. **Lost-lease signal**: every refused fenced step (a higher token was
///    written first) came back to a holder whose token had already fired.
/// 5. **No lost update** (keys with a counter): the set of applied writes is
///    known exactly (writes reported applied, plus the `last` token every
///    claim saw and the final `last`, which settles unknown outcomes and
///    crashed holders); every claim saw exactly the applied writes with
///    lower tokens (`n` and `last`), and the final counter equals the
///    number of applied writes.
pub fn check(
    events: &[Event],
    kills: &HashMap<String, (u64, u64)>,
    finals: &HashMap<String, (i64, i64)>,
) -> Report {
    try_check(events, kills, finals).unwrap_or_else(|violations| panic!("{violations}"))
}

/// A clock step of the server's `$$NOW` (milliseconds) on each side, plus
/// the rate difference of the wall and monotonic clocks over a minimum hold.
fn hold_tolerance_ns(hold_ms: u64) -> u64 {
    2_000_000 + hold_ms * 1_000
}

/// [`check`], returning every violation found instead of panicking.
pub fn try_check(
    events: &[Event],
    kills: &HashMap<String, (u64, u64)>,
    finals: &HashMap<String, (i64, i64)>,
) -> Result<Report, Violations> {
    let mut found: Vec<Violation> = Vec::new();
    /// Records the formatted violation on `$key` at `$t` unless `$cond` holds.
    macro_rules! ensure {
        ($cond:expr, $key:expr, $t:expr, $($message:tt)+) => {
            if !$cond {
                found.push(Violation {
                    key: $key.to_string(),
                    t: $t,
                    message: format!($($message)+),
                });
            }
        };
    }
    let sections = collect_sections(events, kills);
    let mut report = Report {
        sections: sections.len(),
        acquire_errors: events
            .iter()
            .filter(|e| e.kind == "err" && e.get("op") == "acquire")
            .count(),
        step_errors: events
            .iter()
            .filter(|e| e.kind == "err" && e.get("op") != "acquire")
            .count(),
        ..Report::default()
    };
    for cs in &sections {
        report
            .per_key
            .entry(cs.key.clone())
            .or_default()
            .push(cs.clone());
        report.valid += (cs.claim == Step::Ok && cs.write == Step::Ok) as usize;
        report.lost += cs.lost as usize;
        report.crashed += cs.crashed as usize;
        report.refused +=
            (cs.claim == Step::Refused) as usize + (cs.write == Step::Refused) as usize;
        report.unknown += (cs.claim == Step::Unknown && !cs.crashed) as usize
            + (cs.write == Step::Unknown && !cs.crashed) as usize;
    }
    for (key, list) in &mut report.per_key {
        list.sort_by_key(|c| c.t_acq);
        // 1. Who holds the key at once: a sweep over the sections' starts
        // and ends (an end at the same instant as a start comes first).
        let mut points: Vec<(u64, bool, usize)> = list
            .iter()
            .enumerate()
            .flat_map(|(i, c)| [(c.t_acq, true, i), (c.t_end, false, i)])
            .collect();
        points.sort();
        let mut live: BTreeSet<usize> = BTreeSet::new();
        for (t, start, i) in points {
            if !start {
                live.remove(&i);
                continue;
            }
            let b = &list[i];
            for a in live.iter().map(|&j| &list[j]) {
                let overlap = (a.t_end - b.t_acq) as f64 / 1e6;
                if a.is_exclusive() && b.is_exclusive() {
                    ensure!(
                        false,
                        key,
                        t,
                        "MUTUAL EXCLUSION VIOLATED on {key}: {a:?} still held it {overlap} ms after {b:?} acquired it"
                    );
                } else {
                    ensure!(
                        a.kind == b.kind,
                        key,
                        t,
                        "KINDS MIXED on {key}: {a:?} ({}) still held it {overlap} ms after {b:?} ({}) acquired it",
                        a.kind,
                        b.kind
                    );
                }
            }
            if b.kind == "p" {
                let permits: Vec<&Cs> = live
                    .iter()
                    .map(|&j| &list[j])
                    .filter(|a| a.kind == "p")
                    .collect();
                ensure!(
                    permits.len() < b.permits as usize,
                    key,
                    t,
                    "MORE THAN {} PERMITS on {key}: {b:?} acquired one while {} were held: {permits:?}",
                    b.permits,
                    permits.len()
                );
            }
            if b.t_end > b.t_acq {
                live.insert(i);
            }
        }
        // 2. Tokens: every section that returned before `b`'s call began
        // has a lower token than `b`.
        let mut by_call: Vec<&Cs> = list.iter().collect();
        by_call.sort_by_key(|c| c.t_call);
        let mut returned = 0;
        let mut highest: Option<&Cs> = None;
        for b in by_call {
            while returned < list.len() && list[returned].t_acq < b.t_call {
                let a = &list[returned];
                if highest.is_none_or(|h| a.tok > h.tok) {
                    highest = Some(a);
                }
                returned += 1;
            }
            if let Some(a) = highest {
                ensure!(
                    a.tok < b.tok,
                    key,
                    b.t_acq,
                    "fencing tokens out of order on {key}: {a:?} then {b:?}"
                );
            }
        }
        // 3. Minimum holds: the next acquisition (by token) waited for it.
        for h in list.iter().filter(|c| c.hold_ms > 0) {
            if let Some(next) = list.iter().filter(|c| c.tok > h.tok).min_by_key(|c| c.tok) {
                let until = h.t_call + h.hold_ms * 1_000_000;
                ensure!(
                    next.t_acq + hold_tolerance_ns(h.hold_ms) >= until,
                    key,
                    next.t_acq,
                    "HOLD_AT_LEAST BROKEN on {key}: {next:?} acquired it {} ms after the call of {h:?}, \
                     which holds it at least {} ms",
                    (next.t_acq as f64 - h.t_call as f64) / 1e6,
                    h.hold_ms
                );
            }
        }
        // 4. Refusals only reach holders that were told.
        for c in list.iter() {
            if c.claim == Step::Refused {
                ensure!(
                    c.claim_lost,
                    key,
                    c.t_acq,
                    "claim refused while the lease was not signalled lost: {c:?}"
                );
            }
            if c.write == Step::Refused {
                ensure!(
                    c.write_lost,
                    key,
                    c.t_acq,
                    "write refused while the lease was not signalled lost: {c:?}"
                );
            }
        }
        // 5. Applied writes, exactly.
        let Some(&(final_n, final_last)) = finals.get(key.as_str()) else {
            for c in list.iter() {
                ensure!(
                    c.claim == Step::Skipped && c.write == Step::Skipped,
                    key,
                    c.t_acq,
                    "a fenced step on {key}, which has no counter: {c:?}"
                );
            }
            continue;
        };
        let end = list.last().map_or(0, |c| c.t_end);
        let tokens: BTreeSet<i64> = list.iter().map(|c| c.tok).collect();
        let mut applied: BTreeSet<i64> = list
            .iter()
            .filter(|c| c.write == Step::Ok)
            .map(|c| c.tok)
            .collect();
        let seen: BTreeSet<i64> = list
            .iter()
            .filter(|c| c.claim == Step::Ok)
            .map(|c| c.prev_last)
            .chain([final_last])
            .filter(|t| *t != 0)
            .collect();
        for t in &seen {
            ensure!(
                tokens.contains(t),
                key,
                end,
                "a write with token {t} applied on {key}, but no worker held that token"
            );
            if applied.insert(*t) {
                report.settled_by_chain += 1;
            }
        }
        for c in list.iter().filter(|c| c.write == Step::Ok) {
            ensure!(
                c.claim == Step::Ok,
                key,
                c.t_acq,
                "write applied without a claim: {c:?}"
            );
        }
        for c in list.iter().filter(|c| c.claim == Step::Ok) {
            let before: Vec<i64> = applied.range(..c.tok).copied().collect();
            ensure!(
                c.n_read == before.len() as i64,
                key,
                c.t_acq,
                "LOST UPDATE on {key}: the claim of {c:?} read n = {} but {} writes had applied before it",
                c.n_read,
                before.len()
            );
            ensure!(
                c.prev_last == before.last().copied().unwrap_or(0),
                key,
                c.t_acq,
                "the claim of {c:?} did not see the last applied write on {key} (it saw {}, the last was {:?})",
                c.prev_last,
                before.last()
            );
        }
        ensure!(
            final_n == applied.len() as i64,
            key,
            end,
            "LOST UPDATE on {key}: counter {final_n}, applied writes {}",
            applied.len()
        );
    }
    if found.is_empty() {
        Ok(report)
    } else {
        Err(Violations(found))
    }
}

pub fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

/// The checker itself: it accepts a correct history and rejects each kind
/// of violation (so a scenario that passes has been judged).
mod tests {
    use std::collections::HashMap;

    use super::{check, try_check};
    use crate::harness::Event;

    /// Asserts the checker finds a violation whose message contains `expected`.
    fn rejected(events: &[Event], finals: HashMap<String, (i64, i64)>, expected: &str) {
        let violation = try_check(events, &HashMap::new(), &finals)
            .err()
            .unwrap_or_else(|| panic!("accepted; expected a violation with {expected:?}"));
        let violation = violation.to_string();
        assert!(violation.contains(expected), "{violation}");
    }

    fn cs(
        w: &str,
        tok: i64,
        span: (u64, u64),
        claim: (&str, i64, i64),
        write: &str,
        lost: bool,
    ) -> Event {
        let line = format!(
            "EVT cs w={w} task=0 key=k0 tok={tok} t_acq={} t_end={} t_lost={} claim={} claim_lost={} \
             n={} last={} write={write} write_lost={} lost={} release=x",
            span.0,
            span.1,
            if lost { span.1 } else { 0 },
            claim.0,
            lost as u8,
            claim.1,
            claim.2,
            lost as u8,
            lost as u8
        );
        Event::parse(w, &line).unwrap()
    }

    fn finals(n: i64, last: i64) -> HashMap<String, (i64, i64)> {
        HashMap::from([("k0".to_string(), (n, last))])
    }

    #[test]
    fn accepts_a_correct_history() {
        let events = [
            cs("w1", 10, (0, 10), ("ok", 0, 0), "ok", false),
            cs("w2", 20, (20, 30), ("ok", 1, 10), "ok", false),
            // Lost, told, and its late write refused.
            cs("w1", 30, (40, 50), ("ok", 2, 20), "refused", true),
            cs("w2", 40, (60, 70), ("ok", 2, 20), "ok", false),
        ];
        let report = check(&events, &HashMap::new(), &finals(3, 40));
        assert_eq!((report.valid, report.lost, report.refused), (3, 1, 1));
    }

    #[test]
    fn settles_a_crashed_holders_write_from_the_chain() {
        let events = [
            Event::parse("w1", "EVT acq w=w1 task=0 key=k0 tok=10 t=0").unwrap(),
            Event::parse("w1", "EVT claimed w=w1 task=0 key=k0 tok=10 n=0 last=0 t=1").unwrap(),
            cs("w2", 20, (30, 40), ("ok", 1, 10), "ok", false),
        ];
        let kills = HashMap::from([("w1".to_string(), (5, 6))]);
        let report = check(&events, &kills, &finals(2, 20));
        assert_eq!((report.crashed, report.settled_by_chain), (1, 1));
    }

    /// A release that hands the key to another task of the same worker
    /// lets that task report its acquisition before the releasing task
    /// reports its end; a kill in between ends the first holder at its
    /// release call (its `releasing` line), not at the kill.
    #[test]
    fn a_holder_killed_after_its_release_call_ends_there() {
        let events = [
            Event::parse("w1", "EVT acq w=w1 task=0 key=k0 tok=10 t=0").unwrap(),
            Event::parse("w1", "EVT claimed w=w1 task=0 key=k0 tok=10 n=0 last=0 t=1").unwrap(),
            Event::parse("w1", "EVT releasing w=w1 task=0 key=k0 tok=10 t=5").unwrap(),
            Event::parse("w1", "EVT acq w=w1 task=1 key=k0 tok=20 t=6").unwrap(),
        ];
        let kills = HashMap::from([("w1".to_string(), (7, 8))]);
        let report = check(&events, &kills, &finals(1, 10));
        assert_eq!(report.crashed, 2);
        // Without the `releasing` line the same history overlaps.
        let violation = try_check(
            &[events[0].clone(), events[1].clone(), events[3].clone()],
            &kills,
            &finals(1, 10),
        )
        .unwrap_err()
        .to_string();
        assert!(
            violation.contains("MUTUAL EXCLUSION VIOLATED"),
            "{violation}"
        );
    }

    #[test]
    fn rejects_overlapping_holders() {
        let events = [
            cs("w1", 10, (0, 25), ("ok", 0, 0), "ok", false),
            cs("w2", 20, (20, 30), ("ok", 1, 10), "ok", false),
        ];
        rejected(&events, finals(2, 20), "MUTUAL EXCLUSION VIOLATED");
    }

    #[test]
    fn rejects_a_refusal_the_holder_was_not_told_about() {
        let events = [
            cs("w1", 10, (0, 10), ("ok", 0, 0), "refused", false),
            cs("w2", 20, (20, 30), ("ok", 0, 0), "ok", false),
        ];
        rejected(
            &events,
            finals(1, 20),
            "write refused while the lease was not signalled lost",
        );
    }

    #[test]
    fn rejects_a_lost_update() {
        let events = [
            cs("w1", 10, (0, 10), ("ok", 0, 0), "ok", false),
            cs("w2", 20, (20, 30), ("ok", 0, 0), "ok", false),
        ];
        rejected(&events, finals(1, 20), "LOST UPDATE");
    }

    #[test]
    fn rejects_a_counter_that_lost_a_write() {
        let events = [
            cs("w1", 10, (0, 10), ("ok", 0, 0), "ok", false),
            cs("w2", 20, (20, 30), ("ok", 1, 10), "ok", false),
        ];
        rejected(&events, finals(1, 20), "LOST UPDATE");
    }

    #[test]
    fn rejects_tokens_that_go_backwards() {
        let events = [
            cs("w1", 20, (0, 10), ("ok", 0, 0), "ok", false),
            cs("w2", 10, (20, 30), ("ok", 1, 20), "ok", false),
        ];
        rejected(&events, finals(2, 10), "fencing tokens out of order");
    }

    /// A section of a kind on `key` with no fenced step (shared, permit).
    fn held(w: &str, key: &str, kind: &str, tok: i64, call: u64, span: (u64, u64)) -> Event {
        let permits = if kind == "p" { 2 } else { 0 };
        let line = format!(
            "EVT cs w={w} task=0 key={key} tok={tok} kind={kind} permits={permits} hold_ms=0 \
             t_call={call} t_acq={} t_end={} t_lost=0 claim=skipped claim_lost=0 n=0 last=0 \
             write=skipped write_lost=0 lost=0 release=released",
            span.0, span.1
        );
        Event::parse(w, &line).unwrap()
    }

    fn no_counters() -> HashMap<String, (i64, i64)> {
        HashMap::new()
    }

    #[test]
    fn accepts_shared_holders_together_and_permits_up_to_their_number() {
        let events = [
            held("w1", "x0", "s", 10, 0, (1, 50)),
            held("w2", "x0", "s", 20, 0, (2, 60)),
            held("w3", "x0", "x", 30, 55, (60, 70)),
            held("w1", "p0", "p", 10, 0, (1, 50)),
            held("w2", "p0", "p", 20, 0, (2, 60)),
            held("w3", "p0", "p", 30, 50, (50, 70)),
        ];
        let report = check(&events, &HashMap::new(), &no_counters());
        assert_eq!(report.kinds(), "p=3 s=2 x=1");
    }

    #[test]
    fn rejects_shared_and_exclusive_at_once() {
        let events = [
            held("w1", "x0", "s", 10, 0, (1, 50)),
            held("w2", "x0", "x", 20, 10, (40, 60)),
        ];
        let violation = try_check(&events, &HashMap::new(), &no_counters())
            .unwrap_err()
            .to_string();
        assert!(violation.contains("KINDS MIXED"), "{violation}");
    }

    #[test]
    fn rejects_more_permits_than_the_semaphore_has() {
        let events = [
            held("w1", "p0", "p", 10, 0, (1, 50)),
            held("w2", "p0", "p", 20, 0, (2, 60)),
            held("w3", "p0", "p", 30, 0, (49, 70)),
        ];
        let violation = try_check(&events, &HashMap::new(), &no_counters())
            .unwrap_err()
            .to_string();
        assert!(violation.contains("MORE THAN 2 PERMITS"), "{violation}");
    }

    /// Concurrent acquisitions may return in either order; one that
    /// returned before another's call began has the lower token.
    #[test]
    fn judges_tokens_by_the_order_of_return_and_call() {
        let overlapping = [
            held("w1", "x0", "s", 20, 0, (5, 50)),
            held("w2", "x0", "s", 10, 0, (6, 50)),
        ];
        check(&overlapping, &HashMap::new(), &no_counters());
        let ordered = [
            held("w1", "x0", "s", 20, 0, (5, 50)),
            held("w2", "x0", "s", 10, 6, (7, 50)),
        ];
        let violation = try_check(&ordered, &HashMap::new(), &no_counters())
            .unwrap_err()
            .to_string();
        assert!(
            violation.contains("fencing tokens out of order"),
            "{violation}"
        );
    }

    #[test]
    fn rejects_an_acquisition_within_a_minimum_hold() {
        const MS: u64 = 1_000_000;
        let hold = |next_at: u64| {
            [
                Event::parse(
                    "w1",
                    "EVT cs w=w1 task=0 key=h0 tok=10 kind=h permits=0 hold_ms=100 t_call=0 \
                     t_acq=1000000 t_end=2000000 t_lost=0 claim=skipped claim_lost=0 n=0 last=0 \
                     write=skipped write_lost=0 lost=0 release=released",
                )
                .unwrap(),
                held("w2", "h0", "x", 20, MS, (next_at, next_at + MS)),
            ]
        };
        let counters = || HashMap::from([("h0".to_string(), (0, 0))]);
        check(&hold(100 * MS), &HashMap::new(), &counters());
        let violation = try_check(&hold(90 * MS), &HashMap::new(), &counters())
            .unwrap_err()
            .to_string();
        assert!(violation.contains("HOLD_AT_LEAST BROKEN"), "{violation}");
    }

    #[test]
    fn a_killed_permit_holder_holds_until_reaped() {
        let events = [
            Event::parse(
                "w1",
                "EVT acq w=w1 task=0 key=p0 tok=10 kind=p permits=2 hold_ms=0 t_call=0 t=1",
            )
            .unwrap(),
            held("w2", "p0", "p", 20, 0, (2, 60)),
            held("w3", "p0", "p", 30, 0, (40, 70)),
        ];
        let kills = HashMap::from([("w1".to_string(), (30, 50))]);
        let violation = try_check(&events, &kills, &no_counters())
            .unwrap_err()
            .to_string();
        assert!(violation.contains("MORE THAN 2 PERMITS"), "{violation}");
        let kills = HashMap::from([("w1".to_string(), (30, 35))]);
        assert_eq!(check(&events, &kills, &no_counters()).crashed, 1);
    }
}
