//! Runs schedules of the deterministic simulation (`mongo_lease::sim`):
//! the real manager over the in-memory twin with seeded faults, each
//! history judged by the checker.
//!
//! ```text
//! cargo run --release --example simulate -- --seeds 20000 [--from 0]
//! cargo run --release --example simulate -- --seed 42 --trace
//! ```
//!
//! A failing seed prints its violation with the last events of its key;
//! `--seed S --trace` replays it with its fault plan and whole history.
//! The last line is `N schedules, V violations`.

use std::process::ExitCode;
use std::time::Instant;

fn usage() -> ExitCode {
    eprintln!("usage: simulate --seeds N [--from S] | --seed S [--trace]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut seeds, mut from, mut trace) = (None, 0u64, false);
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match args[i].as_str() {
            "--seeds" => match value(i) {
                Some(n) => seeds = Some(n),
                None => return usage(),
            },
            "--from" | "--seed" => match value(i) {
                Some(s) => {
                    from = s;
                    if args[i] == "--seed" {
                        seeds = Some(1);
                    }
                }
                None => return usage(),
            },
            "--trace" => {
                trace = true;
                i += 1;
                continue;
            }
            _ => return usage(),
        }
        i += 2;
    }
    let Some(seeds) = seeds else {
        return usage();
    };
    let started = Instant::now();
    let (mut violations, mut grants, mut failing) = (0usize, 0usize, Vec::new());
    for seed in from..from + seeds {
        let report = mongo_lease::sim::run(seed);
        grants += report.grants();
        if trace {
            println!("{}", report.plan);
            print!("{}", report.history);
            println!("ended at {:?}", report.end);
        }
        if !report.violations.is_empty() {
            violations += report.violations.len();
            failing.push(seed);
            for v in &report.violations {
                println!("seed {seed}: {v}");
            }
            print!("{}", report.explain(40));
        }
    }
    let elapsed = started.elapsed();
    println!(
        "seeds {from}..{}: {grants} leases granted, {:.1} s, {:.1} schedules/s; failing seeds: {:?}{}",
        from + seeds,
        elapsed.as_secs_f64(),
        seeds as f64 / elapsed.as_secs_f64(),
        &failing[..failing.len().min(20)],
        if failing.len() > 20 { " ..." } else { "" }
    );
    println!("{seeds} schedules, {violations} violations");
    if violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
