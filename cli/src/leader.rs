//! `mongo-lease leader`: run a command only while leader of an election.

use std::sync::Arc;

use mongo_lease::{Election, LeaseKind, LeaseManager};

use crate::args::LeaderArgs;
use crate::child::{self, ChildOutcome, LeaseEnv, Signals};
use crate::http::{Phase, Status};
use crate::output::Say;
use crate::{Failure, exit, progress};

/// Campaigns and runs the command while leader (see `--help`); `status`
/// tells `--http`'s `/healthz` whether it leads or campaigns. Without a
/// command (`elect`), leadership is held until SIGINT or SIGTERM.
pub async fn leader(
    manager: &LeaseManager,
    args: LeaderArgs,
    status: &Status,
    json: bool,
    say: Say,
) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let name = args.name.key()?;
    let mut election = Election::new(manager, name.clone())?;
    if let Some(payload) = &args.payload {
        // Written with each term's acquisition, not after it.
        election = election.with_payload(payload.clone())?;
    }
    // What the messages call the election, and what the command gets as
    // MONGO_LEASE_KEY (a string as is, another type as Extended JSON).
    let shown = name.to_extended_json();
    let env_name = name.to_string();
    let keys = [name.clone()];
    if args.once {
        let leadership = tokio::select! {
            leadership = election.campaign() => leadership?,
            signal = signals.next() => return Ok(128 + signal as u8),
            () = progress::report(manager, &keys, say, progress::LEADERSHIP) => {
                unreachable!("the progress report never ends")
            }
        };
        say.info(format_args!(
            "leader of {} (term {})",
            shown,
            leadership.term()
        ));
        if args.run.command.is_empty() {
            // `elect`: the name and term on stdout, held until interrupted.
            if json {
                let line = serde_json::json!({
                    "name": crate::output::key_json(&name),
                    "term": leadership.term(),
                    "value": args.payload.as_ref().and_then(|p| p.get_str("value").ok()),
                    "owner_id": manager.owner_id(),
                });
                println!("{line}");
            } else {
                println!("{env_name} {}", leadership.term());
            }
            say.info(format_args!(
                "holding leadership until SIGINT or SIGTERM (Ctrl-C), which resign it"
            ));
            let term = leadership.term();
            let outcome = child::hold(leadership.status().lost(), &signals, None).await;
            let _ = leadership.resign().await;
            return Ok(match outcome {
                ChildOutcome::Exited(code) => code,
                _ => {
                    eprintln!("mongo-lease: leadership of {shown} lost (term {term})");
                    exit::LEASE_LOST
                }
            });
        }
        status.set(Phase::Holding(Arc::new(leadership.context())));
        let lease = LeaseEnv {
            key: &env_name,
            tokens: &[leadership.term()],
            owner_id: manager.owner_id(),
            kind: LeaseKind::Exclusive,
        };
        let outcome = child::run(
            &args.run.command,
            &lease,
            leadership.status().lost(),
            args.timing.grace(),
            &signals,
            None,
        )
        .await;
        let lost = leadership.status().is_lost();
        status.set(Phase::Ended);
        let _ = leadership.resign().await;
        return Ok(match outcome {
            ChildOutcome::Exited(code) if !lost => code,
            ChildOutcome::SpawnFailed(code, message) => {
                eprintln!("mongo-lease: {message}");
                code
            }
            _ => {
                eprintln!(
                    "mongo-lease: leadership of {} lost; the command was terminated",
                    shown
                );
                exit::LEASE_LOST
            }
        });
    }
    loop {
        let running = std::sync::atomic::AtomicBool::new(false);
        let run = election.run_as_leader(|leader| {
            let (args, signals, running) = (&args, &signals, &running);
            let (shown, env_name) = (&shown, &env_name);
            let owner_id = manager.owner_id();
            async move {
                if signals.received().is_some() {
                    return ChildOutcome::Exited(0);
                }
                say.info(format_args!("leader of {} (term {})", shown, leader.term()));
                status.set(Phase::Holding(Arc::new(leader.clone())));
                running.store(true, std::sync::atomic::Ordering::SeqCst);
                let lease = LeaseEnv {
                    key: env_name,
                    tokens: &[leader.term()],
                    owner_id,
                    kind: LeaseKind::Exclusive,
                };
                let outcome = child::run(
                    &args.run.command,
                    &lease,
                    leader.status().lost(),
                    args.timing.grace(),
                    signals,
                    None,
                )
                .await;
                running.store(false, std::sync::atomic::Ordering::SeqCst);
                status.set(Phase::Campaigning);
                if leader.status().is_lost() {
                    eprintln!(
                        "mongo-lease: leadership of {} lost (term {}); campaigning again",
                        shown,
                        leader.term()
                    );
                }
                outcome
            }
        });
        let idle_signal = async {
            loop {
                let signal = signals.next().await;
                if !running.load(std::sync::atomic::Ordering::SeqCst) {
                    return signal;
                }
            }
        };
        // While a follower: who leads, until when (the report restarts with
        // each campaign; while the command runs, this process leads and it
        // says nothing).
        let report = async {
            loop {
                if !running.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::select! {
                        () = progress::report(manager, &keys, say, progress::LEADERSHIP) => {}
                        () = until_running(&running) => {}
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        };
        let outcome = tokio::select! {
            outcome = run => outcome?,
            signal = idle_signal => return Ok(128 + signal as u8),
            () = report => unreachable!("the progress report never ends"),
        };
        let code = match outcome {
            ChildOutcome::Exited(code) => code,
            ChildOutcome::SpawnFailed(code, message) => {
                eprintln!("mongo-lease: {message}");
                return Ok(code);
            }
            ChildOutcome::Lost => exit::LEASE_LOST,
        };
        if let Some(signal) = signals.received() {
            let _ = signal;
            return Ok(code);
        }
        eprintln!(
            "mongo-lease: the command exited with code {code}; resigned, campaigning again in {}",
            humantime::format_duration(args.restart_delay)
        );
        tokio::select! {
            _ = tokio::time::sleep(args.restart_delay) => {}
            signal = signals.next() => return Ok(128 + signal as u8),
        }
    }
}

/// Completes once `running` is set (the command started: this process leads).
async fn until_running(running: &std::sync::atomic::AtomicBool) {
    while !running.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
