//! `mongo-lease exec`: run a command while holding a lease on a key.

use mongo_lease::LockManager;

use crate::args::ExecArgs;
use crate::child::{self, ChildOutcome, Signals};
use crate::{Failure, exit, output};

pub async fn exec(manager: &LockManager, args: ExecArgs, json: bool) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let key = args.key.key()?;
    let acquire = async {
        if args.no_wait {
            manager.try_acquire(key.clone()).await
        } else if let Some(timeout) = args.timeout {
            manager.acquire_timeout(key.clone(), timeout).await
        } else {
            manager.acquire(key.clone()).await.map(Some)
        }
    };
    let lease = tokio::select! {
        lease = acquire => lease?,
        signal = signals.next() => return Ok(128 + signal as u8),
    };
    let Some(lease) = lease else {
        let holder = manager.inspect(key.clone()).await.ok().flatten();
        output::print_not_acquired(&key, holder.as_ref(), json);
        return Ok(exit::NOT_ACQUIRED);
    };
    tracing::debug!(%key, token = lease.fencing_token(), "acquired");
    let outcome = child::run(
        &args.command,
        &key.to_string(),
        lease.fencing_token(),
        manager.owner_id(),
        lease.lost(),
        args.timing.grace,
        &signals,
    )
    .await;
    let lost = lease.is_lost();
    let _ = lease.release().await;
    match outcome {
        ChildOutcome::Exited(code) if !lost => Ok(code),
        ChildOutcome::Exited(_) | ChildOutcome::Lost => {
            eprintln!(
                "mongo-lease: the lease on {} was lost; the command was terminated",
                key.to_extended_json()
            );
            Ok(exit::LEASE_LOST)
        }
        ChildOutcome::SpawnFailed(code, message) => {
            eprintln!("mongo-lease: {message}");
            Ok(code)
        }
    }
}
