//! The fault plan of one schedule, drawn from its seed: per manager,
//! periods in which some kinds of store call fail before or after they
//! apply, arrive late, or are answered late, reads see a snapshot behind
//! the latest writes, and in which its change stream delays, duplicates
//! or drops writes or fails; a freeze (every call and event held until it
//! ends); a lag of its stream (every event late by one delay for a
//! while); and for the whole schedule, a crash of one manager and the
//! server's clock running faster than the managers' and stepping back.
//! Faults stop at the plan's `stop`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::random::random_range;
use crate::store::memory::{EventFate, Fault, MemoryStore, Op};

/// How far the server's clock steps back at most (`$$NOW` going back a few
/// milliseconds, docs/mongodb-behaviour.md B3).
pub(crate) const CLOCK_STEP_BACK: Duration = Duration::from_millis(10);

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
        Plan {
            stop,
            managers,
            crash,
            server_faster_ppm,
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
                (concerned && random_range(0.0..1.0) < p.chance).then(|| match random_range(0..5) {
                    0 => Fault::Fail,
                    1 => Fault::FailAfterApply,
                    2 => Fault::LateReply(between(ms(1), ms(1_500))),
                    _ => Fault::Delay(between(ms(1), ms(1_500))),
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
            "faults stop at {:?}; crash: {:?}; server clock {} ppm faster",
            self.stop, self.crash, self.server_faster_ppm
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
                    "  {:?}..{:?}: chance {}, calls {:#013b}, events {}",
                    p.from, p.to, p.chance, p.ops, p.events
                )?;
            }
        }
        Ok(())
    }
}
