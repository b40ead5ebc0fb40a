//! The safety checker: critical sections rebuilt from the workers' events,
//! judged for mutual exclusion, lost-lease signals and lost updates.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::harness::Event;
use crate::worker::Step;

/// One critical section (one acquisition), as reported or reconstructed.
/// (Every field shows in the checker's failure messages.)
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Cs {
    pub w: String,
    pub key: String,
    pub tok: i64,
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

fn collect_sections(events: &[Event], kills: &HashMap<String, (u64, u64)>) -> Vec<Cs> {
    let mut sections = Vec::new();
    let mut done: BTreeSet<(String, i64)> = BTreeSet::new();
    for e in events.iter().filter(|e| e.kind == "cs") {
        done.insert((e.w.clone(), e.num("tok")));
        sections.push(Cs {
            w: e.w.clone(),
            key: e.get("key").to_string(),
            tok: e.num("tok"),
            t_acq: e.num("t_acq") as u64,
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
        if done.contains(&(e.w.clone(), e.num("tok"))) {
            continue;
        }
        let (_, dead) = *kills
            .get(&e.w)
            .unwrap_or_else(|| panic!("worker {} acquired {e:?} and never reported the end", e.w));
        // Killed after it called release (its `releasing` line): its
        // critical section ended there, whatever the release became.
        let released_at = events
            .iter()
            .find(|r| r.kind == "releasing" && r.w == e.w && r.num("tok") == e.num("tok"))
            .map(Event::t);
        let claimed = events
            .iter()
            .find(|c| c.kind == "claimed" && c.w == e.w && c.num("tok") == e.num("tok"));
        sections.push(Cs {
            w: e.w.clone(),
            key: e.get("key").to_string(),
            tok: e.num("tok"),
            t_acq: e.t(),
            t_end: released_at.unwrap_or(dead),
            t_lost: 0,
            claim: if claimed.is_some() {
                Step::Ok
            } else {
                Step::Unknown
            },
            claim_lost: false,
            n_read: claimed.map(|c| c.num("n")).unwrap_or(0),
            prev_last: claimed.map(|c| c.num("last")).unwrap_or(0),
            write: Step::Unknown,
            write_lost: false,
            lost: false,
            crashed: true,
        });
    }
    sections
}

/// The safety checker. Per key:
///
/// 1. **Mutual exclusion**: the intervals [acquire returned, release called
///    or token fired] of all acquisitions (crashed holders: until they were
///    reaped) do not overlap, and fencing tokens increase in that order.
/// 2. **Lost-lease signal**: every refused fenced step (a higher token was
///    written first) came back to a holder whose token had already fired.
/// 3. **No lost update**: the set of applied writes is known exactly (writes
///    reported applied, plus the `last` token every claim saw and the final
///    `last`, which settles unknown outcomes and crashed holders); every
///    claim saw exactly the applied writes with lower tokens (`n` and
///    `last`), and the final counter equals the number of applied writes.
pub fn check(
    events: &[Event],
    kills: &HashMap<String, (u64, u64)>,
    finals: &HashMap<String, (i64, i64)>,
) -> Report {
    try_check(events, kills, finals).unwrap_or_else(|violation| panic!("{violation}"))
}

/// [`check`], returning the first violation found instead of panicking.
pub fn try_check(
    events: &[Event],
    kills: &HashMap<String, (u64, u64)>,
    finals: &HashMap<String, (i64, i64)>,
) -> Result<Report, String> {
    /// Returns the formatted violation unless `cond` holds.
    macro_rules! ensure {
        ($cond:expr, $($message:tt)+) => {
            if !$cond {
                return Err(format!($($message)+));
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
        // 1. Intervals and token order.
        for pair in list.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            ensure!(
                a.t_end <= b.t_acq,
                "MUTUAL EXCLUSION VIOLATED on {key}: {a:?} still held it {} ms after {b:?} acquired it",
                (a.t_end - b.t_acq) as f64 / 1e6
            );
            ensure!(
                a.tok < b.tok,
                "fencing tokens out of order on {key}: {a:?} then {b:?}"
            );
        }
        // 2. Refusals only reach holders that were told.
        for c in list.iter() {
            if c.claim == Step::Refused {
                ensure!(
                    c.claim_lost,
                    "claim refused while the lease was not signalled lost: {c:?}"
                );
            }
            if c.write == Step::Refused {
                ensure!(
                    c.write_lost,
                    "write refused while the lease was not signalled lost: {c:?}"
                );
            }
        }
        // 3. Applied writes, exactly.
        let (final_n, final_last) = finals[key];
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
                "a write with token {t} applied on {key}, but no worker held that token"
            );
            if applied.insert(*t) {
                report.settled_by_chain += 1;
            }
        }
        for c in list.iter().filter(|c| c.write == Step::Ok) {
            ensure!(c.claim == Step::Ok, "write applied without a claim: {c:?}");
        }
        for c in list.iter().filter(|c| c.claim == Step::Ok) {
            let before: Vec<i64> = applied.range(..c.tok).copied().collect();
            ensure!(
                c.n_read == before.len() as i64,
                "LOST UPDATE on {key}: the claim of {c:?} read n = {} but {} writes had applied before it",
                c.n_read,
                before.len()
            );
            ensure!(
                c.prev_last == before.last().copied().unwrap_or(0),
                "the claim of {c:?} did not see the last applied write on {key} (it saw {}, the last was {:?})",
                c.prev_last,
                before.last()
            );
        }
        ensure!(
            final_n == applied.len() as i64,
            "LOST UPDATE on {key}: counter {final_n}, applied writes {}",
            applied.len()
        );
    }
    Ok(report)
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
        .unwrap_err();
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
}
