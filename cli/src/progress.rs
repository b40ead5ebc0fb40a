//! The progress line of a waiting `exec`, `lock`, `leader` or `elect`: who
//! holds the key, until when, and how many owners wait ahead; at once, then
//! every few seconds on a terminal or with `-v` (`Say::repeat`).

use std::time::Duration;

use mongo_lease::{LeaseKey, LeaseManager};

use crate::output::{Say, held_by};

/// How often the line repeats (`-v`, or on a terminal).
const EVERY: Duration = Duration::from_secs(5);
/// How often the keys are read until one is found held by someone else.
const UNTIL_HELD: Duration = Duration::from_millis(500);

/// What the line says the tool is doing: `waiting for` or `campaigning
/// for`, and the token's name (`fencing token`, `term`).
#[derive(Clone, Copy)]
pub struct Waiting {
    pub doing: &'static str,
    pub token: &'static str,
}

pub const LEASE: Waiting = Waiting {
    doing: "waiting for",
    token: "fencing token",
};
pub const LEADERSHIP: Waiting = Waiting {
    doing: "campaigning for",
    token: "term",
};

/// Reports while the caller waits for `keys`; never completes (drop it once
/// the wait is over).
pub async fn report(manager: &LeaseManager, keys: &[LeaseKey], say: Say, waiting: Waiting) {
    if say.quiet {
        return std::future::pending().await;
    }
    loop {
        match line(manager, keys, waiting).await {
            Some(line) => {
                eprintln!("mongo-lease: {line}");
                if !say.repeat() {
                    return std::future::pending().await;
                }
                tokio::time::sleep(EVERY).await;
            }
            None => tokio::time::sleep(UNTIL_HELD).await,
        }
    }
}

/// The line for the first of `keys` held by another owner, if any.
async fn line(manager: &LeaseManager, keys: &[LeaseKey], waiting: Waiting) -> Option<String> {
    let me = manager.owner_id();
    for key in keys {
        let Ok(Some(info)) = manager.inspect(key.clone()).await else {
            continue;
        };
        let mine = info.owner_id == me && info.holders.iter().all(|h| h.owner_id == me);
        if !info.held || mine {
            continue;
        }
        let ahead = info
            .waiters
            .iter()
            .position(|w| w.owner_id == me)
            .unwrap_or(info.waiters.len());
        let ahead = match ahead {
            0 => "no other owner waits ahead".to_string(),
            1 => "1 other owner waits ahead".to_string(),
            n => format!("{n} other owners wait ahead"),
        };
        return Some(format!(
            "{} {}: {}; {ahead}",
            waiting.doing,
            key.to_extended_json(),
            held_by(&info, waiting.token)
        ));
    }
    None
}
