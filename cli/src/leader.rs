//! `mongo-lease leader`: run a command only while leader of an election.

use std::sync::Arc;

use mongo_lease::{Election, LeaseKind, LeaseManager};

use crate::args::LeaderArgs;
use crate::child::{self, ChildOutcome, LeaseEnv, Signals};
use crate::http::{Phase, Status};
use crate::{Failure, exit};

/// Campaigns and runs the command while leader (see `--help`); `status`
/// tells `--http`'s `/healthz` whether it leads or campaigns.
pub async fn leader(
    manager: &LeaseManager,
    args: LeaderArgs,
    status: &Status,
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
    if args.once {
        let leadership = tokio::select! {
            leadership = election.campaign() => leadership?,
            signal = signals.next() => return Ok(128 + signal as u8),
        };
        eprintln!(
            "mongo-lease: leader of {} (term {})",
            shown,
            leadership.term()
        );
        status.set(Phase::Holding(Arc::new(leadership.context())));
        let lease = LeaseEnv {
            key: &env_name,
            tokens: &[leadership.term()],
            owner_id: manager.owner_id(),
            kind: LeaseKind::Exclusive,
        };
        let outcome = child::run(
            &args.command,
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
                eprintln!("mongo-lease: leader of {} (term {})", shown, leader.term());
                status.set(Phase::Holding(Arc::new(leader.clone())));
                running.store(true, std::sync::atomic::Ordering::SeqCst);
                let lease = LeaseEnv {
                    key: env_name,
                    tokens: &[leader.term()],
                    owner_id,
                    kind: LeaseKind::Exclusive,
                };
                let outcome = child::run(
                    &args.command,
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
        let outcome = tokio::select! {
            outcome = run => outcome?,
            signal = idle_signal => return Ok(128 + signal as u8),
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
