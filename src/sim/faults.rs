//! The fault plan of one schedule, drawn from its seed: per manager,
//! periods in which some kinds of store call fail before or after they
//! apply, arrive late, or are answered late, reads see a snapshot behind
//! the latest writes, and in which its change stream delays, duplicates
//! or drops writes or fails; in a third of the periods calls also land
//! long after they were sent (up to [`LANDING_MOST`], three TTLs), answered
//! then or never, or never land, while their callers give up in between;
//! a freeze (every call and event held until it ends); a lag of its
//! stream (every event late by one delay for a while); and for the whole
//! schedule, a crash of one manager, the server's clock running faster
//! than the managers' and stepping back, failovers to members whose
//! clocks are ahead or behind by up to the bound the managers assume
//! (`clock_skew`), the GC grace of the managers' TTL index, and the bound
//! their stores put on each operation. Faults stop at the plan's `stop`;
//! a call sent before may still land after it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::random::random_range;
use crate::store::memory::{EventFate, Fault, MemoryStore, Op};

/// How far the server's clock steps back at most (`$$NOW` going back a few
/// milliseconds, docs/mongodb-behaviour.md B3).
pub(crate) const CLOCK_STEP_BACK: Duration = Duration::from_millis(10);

/// The longest a call may take to land after it was sent ([`Fault::Delay`],
/// [`Fault::Unanswered`]): three of the simulation's TTLs. Its caller may
/// have given up long before (a renewal after a heartbeat interval, any
/// call after the operation timeout).
pub(crate) const LANDING_MOST: Duration = Duration::from_secs(9);

/// The bounds on the difference between the members' clocks that a
/// schedule draws from (every manager's `clock_skew`; the default is 1 s).
const CLOCK_SKEWS: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_secs(1),
];

/// How much faster than the managers' monotonic clocks the server's clock
/// runs at most, in parts per million: 5 %, within what the safety margin
/// covers over one TTL (docs/safety.md "Clock rates"; the simulation's
/// margin is a tenth of its TTL).
pub(crate) const SERVER_FASTER_PPM: u32 = 50_000;

/// One period of faults of one manager.
#[derive(Debug, Clone)]
struct Period {
    from: Duration,
    to: Duration,
    /// The chance each call of a kind in `ops` (or each event) suffers one.
    chance: f64,
    /// The kinds of call concerned, a bit per `Op`.
    ops: u32,
    /// Whether its change stream suffers too.
    events: bool,
    /// Whether its calls may land long after they were sent (up to
    /// [`LANDING_MOST`]), or never.
    long: bool,
}

/// The faults of one manager.
#[derive(Debug, Clone, Default)]
pub struct ManagerFaults {
    periods: Vec<Period>,
    /// Every call and event is held from `.0` to `.1`.
    freeze: Option<(Duration, Duration)>,
    /// From `.0` to `.1` its stream lags: every event is delivered `.2`
    /// late, in order, as a change stream does while the majority commit
    /// point lags behind the writes. A handoff then reaches its waiter
    /// after the handed lease's `hx` may have ended and another owner
    /// taken the key.
    lag: Option<(Duration, Duration, Duration)>,
}

/// A schedule's fault plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// When faults stop.
    pub stop: Duration,
    /// Per manager.
    pub managers: Vec<ManagerFaults>,
    /// The manager that crashes, and when.
    pub crash: Option<(usize, Duration)>,
    /// How much faster than the managers' clocks the server's runs, in
    /// parts per million (up to [`SERVER_FASTER_PPM`]; one schedule in four
    /// runs at exactly that bound).
    pub server_faster_ppm: u32,
    /// The bound on the difference between the members' clocks: every
    /// manager's `clock_skew`, which the failovers keep to (with the steps
    /// back of [`CLOCK_STEP_BACK`] included).
    pub clock_skew: Duration,
    /// Failovers: when, and how far ahead of the managers' clocks the new
    /// primary's clock is (from none to `clock_skew` less
    /// [`CLOCK_STEP_BACK`]; the first primary's is none), so that each
    /// steps the server's clock forward or back by up to that.
    pub failovers: Vec<(Duration, Duration)>,
    /// The GC grace of the managers' TTL index on `exp`.
    pub gc_grace: Duration,
    /// The bound each manager's store puts on an operation (the product's
    /// default, or a tenth of the TTL as that default is of the product's).
    pub operation_timeout: Duration,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn between(from: Duration, to: Duration) -> Duration {
    ms(random_range(
        from.as_millis() as u64..=to.as_millis() as u64,
    ))
}

impl Plan {
    /// Draws the plan of `managers` managers, faults stopping at `stop`.
    pub fn draw(managers: usize, stop: Duration) -> Plan {
        let managers = (0..managers)
            .map(|_| {
                let mut periods = Vec::new();
                let mut at = between(Duration::ZERO, ms(2_000));
                while at < stop {
                    let to = (at + between(ms(200), ms(4_000))).min(stop);
                    // A third of the periods are trouble on the network:
                    // every kind of call and the stream suffer at once, so
                    // that faults coincide (an acquire's unknown outcome
                    // resolved by a stale read, its handoff's event late,
                    // the renewal after it lost).
                    let trouble = random_range(0..3) == 0;
                    let chance = match trouble {
                        true => [0.3, 0.7][random_range(0..2)],
                        false => [0.02, 0.1, 0.3, 0.7][random_range(0..4)],
                    };
                    periods.push(Period {
                        from: at,
                        to,
                        chance,
                        ops: match trouble {
                            true => (1u32 << 11) - 1,
                            false => random_range(1..(1u32 << 11)),
                        },
                        events: trouble || random_range(0..2) == 0,
                        long: random_range(0..3) == 0,
                    });
                    at = to + between(Duration::ZERO, ms(3_000));
                }
                let freeze = (random_range(0..3) == 0).then(|| {
                    let from = between(Duration::ZERO, stop.saturating_sub(ms(1_000)));
                    (from, (from + between(ms(500), ms(6_000))).min(stop))
                });
                let lag = (random_range(0..3) == 0).then(|| {
                    let from = between(Duration::ZERO, stop.saturating_sub(ms(1_000)));
                    let to = (from + between(ms(1_000), ms(8_000))).min(stop);
                    (from, to, between(ms(400), ms(1_500)))
                });
                ManagerFaults {
                    periods,
                    freeze,
                    lag,
                }
            })
            .collect::<Vec<_>>();
        let crash = (random_range(0..4) == 0).then(|| {
            (
                random_range(0..managers.len()),
                between(stop / 10, stop * 7 / 10),
            )
        });
        let server_faster_ppm = match random_range(0..4) {
            0 => SERVER_FASTER_PPM,
            _ => random_range(0..=SERVER_FASTER_PPM),
        };
        let clock_skew = CLOCK_SKEWS[random_range(0..CLOCK_SKEWS.len())];
        // The members' clocks within `clock_skew` of each other, the steps
        // back of B3 included: a failover's step is at most that, either
        // way; most of them to either end of the range, so that full steps
        // forward and back are common. More often than on a real replica
        // set, so that one comes between two acquisitions of a key.
        let widest = clock_skew.saturating_sub(CLOCK_STEP_BACK);
        let mut failovers = Vec::new();
        let mut at = between(Duration::ZERO, ms(2_000));
        while at < stop {
            let ahead = match random_range(0..5) {
                0 | 1 => Duration::ZERO,
                2 | 3 => widest,
                _ => between(Duration::ZERO, widest),
            };
            failovers.push((at, ahead));
            at += between(ms(200), ms(2_000));
        }
        // As `connect` creates the index: at least `DELETE_MIN_TOKEN_AGE`.
        let gc_grace = between(crate::config::DELETE_MIN_TOKEN_AGE, ms(3_000));
        let operation_timeout = match random_range(0..3) {
            0 => ms(1_000),
            _ => ms(10_000),
        };
        Plan {
            stop,
            managers,
            crash,
            server_faster_ppm,
            clock_skew,
            failovers,
            gc_grace,
            operation_timeout,
        }
    }

    /// Installs manager `m`'s faults on `store` (calls and stream), the
    /// schedule starting at `t0`.
    pub fn install(&self, m: usize, store: &MemoryStore, t0: Instant) {
        let faults = Arc::new(self.managers[m].clone());
        let stop = self.stop;
        let calls = faults.clone();
        store.set_call_faults(Box::new(move |op| {
            let now = Instant::now() - t0;
            let latency = ms(random_range(0..=3));
            if now >= stop {
                return (latency, None);
            }
            if let Some((from, to)) = calls.freeze
                && (from..to).contains(&now)
            {
                return (latency + (to - now), None);
            }
            let period = calls.period(now);
            // A read (the re-read after an acquire's unknown outcome among
            // them) sees a majority snapshot up to 1.5 s old, half the time
            // in a period.
            if op == Op::Inspect && period.is_some() && random_range(0..2) == 0 {
                return (latency, Some(Fault::Stale(between(ms(1), ms(1_500)))));
            }
            let fault = period.and_then(|p| {
                let concerned = p.ops & (1 << (op as u32)) != 0;
                let late = || between(ms(1), ms(1_500));
                let long = || between(ms(1), LANDING_MOST);
                (concerned && random_range(0.0..1.0) < p.chance).then(|| {
                    match (p.long, random_range(0..6)) {
                        (_, 0) => Fault::Fail,
                        (_, 1) => Fault::FailAfterApply,
                        (_, 2) => Fault::LateReply(late()),
                        (false, _) => Fault::Delay(late()),
                        // Landing long after the send, while the caller
                        // gives up (its timeout): answered if it still
                        // waits, or never; or never landing.
                        (true, 3) => Fault::Delay(long()),
                        (true, 4) => Fault::Unanswered(long()),
                        (true, _) => Fault::Lost,
                    }
                })
            });
            (latency, fault)
        }));
        store.set_event_faults(Box::new(move || {
            let now = Instant::now() - t0;
            let on_time = EventFate::Deliver {
                copies: 1,
                delay: Duration::ZERO,
            };
            if now >= stop {
                return on_time;
            }
            if let Some((from, to)) = faults.freeze
                && (from..to).contains(&now)
            {
                return EventFate::Deliver {
                    copies: 1,
                    delay: to - now,
                };
            }
            if let Some((_, _, delay)) = faults
                .lag
                .filter(|(from, to, _)| (from..to).contains(&&now))
            {
                return EventFate::Deliver { copies: 1, delay };
            }
            match faults.period(now) {
                // Stale events (delayed, duplicated) are what grant-on-event
                // must refuse: a stream in a period of faults suffers often.
                Some(p) if p.events && random_range(0.0..1.0) < p.chance.max(0.3) => {
                    match random_range(0..20) {
                        0..6 => EventFate::Drop,
                        6..12 => EventFate::Deliver {
                            copies: 2,
                            delay: between(Duration::ZERO, ms(100)),
                        },
                        12..16 => EventFate::Deliver {
                            copies: 1,
                            delay: between(ms(1), ms(500)),
                        },
                        // Later than a handoff's expiry (its `hx`).
                        16..19 => EventFate::Deliver {
                            copies: 1,
                            delay: between(ms(500), ms(3_000)),
                        },
                        _ => EventFate::Restart,
                    }
                }
                _ => on_time,
            }
        }));
    }
}

impl ManagerFaults {
    fn period(&self, now: Duration) -> Option<&Period> {
        self.periods.iter().find(|p| (p.from..p.to).contains(&now))
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "faults stop at {:?}; crash: {:?}; server clock {} ppm faster; clock skew {:?}, \
             failovers {:?}; GC grace {:?}; operation timeout {:?}",
            self.stop,
            self.crash,
            self.server_faster_ppm,
            self.clock_skew,
            self.failovers,
            self.gc_grace,
            self.operation_timeout
        )?;
        for (m, faults) in self.managers.iter().enumerate() {
            writeln!(
                f,
                "manager {m}: freeze {:?}, stream lag {:?}",
                faults.freeze, faults.lag
            )?;
            for p in &faults.periods {
                writeln!(
                    f,
                    "  {:?}..{:?}: chance {}, calls {:#013b}, events {}, long {}",
                    p.from, p.to, p.chance, p.ops, p.events, p.long
                )?;
            }
        }
        Ok(())
    }
}
