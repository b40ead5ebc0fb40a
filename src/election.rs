//! [`Election`]: leader election on a lease.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use mongodb::bson::Document;

use crate::actor::command::AcquireMode;
use crate::error::{Error, Result};
use crate::info::{LeaseInfo, WaitingOwner};
use crate::key::LeaseKey;
use crate::lease::{Lease, LeaseHandle, LeaseObserver};
use crate::manager::LeaseManager;
use crate::status::{LeaseStatus, ReleaseOutcome};

/// One leader election, by name, among the processes that share a lock
/// collection: the lease on the key of that name, whose holder leads, whose
/// fencing token is the **term**, and whose payload the leader may publish
/// (docs/election.md). Cheap to clone; every clone campaigns for the same
/// manager, whose owner id identifies the candidate.
///
/// # Examples
///
/// ```no_run
/// use mongo_lease::{Election, LeaseManager};
///
/// # async fn demo(manager: LeaseManager) -> mongo_lease::Result<()> {
/// let election = Election::new(&manager, "scheduler")?;
/// // Runs the scheduler while leader; campaigns again after losing leadership.
/// election
///     .run_as_leader(|leader| async move {
///         println!("leading in term {}", leader.term());
///         leader.status().lost().await; // stop when leadership is lost
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    manager: LeaseManager,
    name: LeaseKey,
    /// How each term is acquired: with the candidate's payload, if any.
    options: crate::config::AcquireOptions,
}

impl Election {
    /// The election `name` (the lease key) on `manager`'s lock collection.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`](crate::Error::InvalidKey) if `name` is not a
    /// valid [`LeaseKey`].
    pub fn new(manager: &LeaseManager, name: impl Into<LeaseKey>) -> Result<Election> {
        let name = name.into();
        name.validate()?;
        Ok(Election {
            manager: manager.clone(),
            name,
            options: crate::config::AcquireOptions::default(),
        })
    }

    /// This candidate's payload (its address, say), written by the very
    /// write that makes it leader ([`Acquire::payload`](crate::request::Acquire::payload)).
    ///
    /// # Errors
    ///
    /// As [`Lease::set_payload`], before anything is sent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use mongodb::bson::doc;
    /// let election = mongo_lease::Election::new(&manager, "scheduler")?
    ///     .with_payload(doc! { "addr": "10.0.0.7:8080" })?;
    /// let leadership = election.campaign().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_payload(mut self, payload: mongodb::bson::Document) -> Result<Election> {
        crate::lease::check_payload(&payload)?;
        self.options.payload = Some(payload);
        Ok(self)
    }

    /// The election's name, which is also its lease key.
    pub fn name(&self) -> &LeaseKey {
        &self.name
    }

    /// The manager this election campaigns with.
    pub fn manager(&self) -> &LeaseManager {
        &self.manager
    }

    /// Campaigns until this candidate is leader (waits as long as it takes).
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`]:
    ///
    /// ```no_run
    /// # async fn demo(election: mongo_lease::Election) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    ///
    /// if let Ok(leadership) = tokio::time::timeout(Duration::from_secs(5), election.campaign()).await {
    ///     leadership?.resign().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self) -> Result<Leadership> {
        self.run(AcquireMode::Wait).await?.ok_or(Error::Shutdown)
    }

    /// One attempt: leadership if nobody leads now, else `Ok(None)`.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::try_acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Election::campaign`].
    pub async fn try_campaign(&self) -> Result<Option<Leadership>> {
        self.run(AcquireMode::Try).await
    }

    /// Campaigns once, as `mode` says: the leadership won, if any.
    async fn run(&self, mode: AcquireMode) -> Result<Option<Leadership>> {
        let name = self.name.clone();
        let lease = self.manager.acquire_key(name, mode, &self.options).await?;
        Ok(lease.map(|lease| {
            tracing::info!(election = %self.name, term = lease.fencing_token(), "became leader");
            Leadership {
                election: self.name.clone(),
                lease,
            }
        }))
    }

    /// The current leader, read from MongoDB with the server's clock;
    /// `Ok(None)` if nobody leads.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::inspect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        Ok(self.candidates().await?.leader)
    }

    /// The candidates of the election, read from MongoDB with the server's
    /// clock (one round trip): the leader, if any, and the managers waiting
    /// for leadership, first served first ([`WaitingOwner`] says who
    /// appears).
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::inspect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(election: mongo_lease::Election) -> mongo_lease::Result<()> {
    /// let candidates = election.candidates().await?;
    /// if let Some(leader) = &candidates.leader {
    ///     println!("leader {}", leader.owner_id);
    /// }
    /// for (place, waiter) in candidates.waiting.iter().enumerate() {
    ///     println!("next #{}: {}", place + 1, waiter.owner_id);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn candidates(&self) -> Result<Candidates> {
        let info = self.manager.inspect(self.name.clone()).await?;
        Ok(Candidates {
            leader: info.as_ref().and_then(LeaderInfo::from_info),
            waiting: info.map(|info| info.waiters).unwrap_or_default(),
        })
    }

    /// Observes the leadership: a stream ([`LeaderObserver`]) of the
    /// current leader (or `None`), then one item per change. Delivered as
    /// [`LeaseManager::observe`] delivers.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::observe`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(election: mongo_lease::Election) -> mongo_lease::Result<()> {
    /// use futures::StreamExt;
    /// let mut leaders = election.observe().await?;
    /// while let Some(leader) = leaders.next().await {
    ///     match leader? {
    ///         Some(l) => println!("leader {} in term {}", l.owner_id, l.term),
    ///         None => println!("no leader"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe(&self) -> Result<LeaderObserver> {
        Ok(LeaderObserver {
            changes: self.manager.observe(self.name.clone()).await?,
            last: None,
        })
    }

    /// Runs `f` while leader: campaigns, awaits the future `f` returns for a
    /// [`LeaderContext`] (whose token fires when leadership is lost), then
    /// resigns and returns its output, or drops it and campaigns again if
    /// leadership was lost by then ([`LeaseStatus::is_lost`]); see
    /// docs/election.md. The future must stop promptly when the token fires
    /// (`select!` on [`LeaseStatus::lost`]): it is awaited to its end, never
    /// aborted.
    ///
    /// # Errors
    ///
    /// As [`Election::campaign`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops the future of `f` (if running) and
    /// resigns (in the background), or withdraws the candidacy.
    pub async fn run_as_leader<F, Fut>(&self, mut f: F) -> Result<Fut::Output>
    where
        F: FnMut(LeaderContext) -> Fut,
        Fut: Future,
    {
        loop {
            let leadership = self.campaign().await?;
            let output = f(leadership.context()).await;
            if leadership.status().is_lost() {
                tracing::info!(
                    election = %self.name,
                    term = leadership.term(),
                    "leadership lost; campaigning again"
                );
                continue;
            }
            let term = leadership.term();
            if let Err(error) = leadership.resign().await {
                tracing::warn!(
                    election = %self.name, term, %error,
                    "resigning failed; the leadership expires after the TTL"
                );
            }
            return Ok(output);
        }
    }
}

/// This candidate's leadership: a held lease on the election's key, as a
/// [`Lease`] is held. Dropping it resigns in the background; prefer
/// [`Leadership::resign`].
#[derive(Debug)]
pub struct Leadership {
    election: LeaseKey,
    lease: Lease,
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &LeaseKey {
        &self.election
    }

    /// The leader's lease (its payload is seen by [`Election::leader`]).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// How the leadership stands (see [`LeaseStatus`]): lost when its lease is.
    pub fn status(&self) -> LeaseStatus {
        self.lease.status()
    }

    /// The term: the fencing token of the lease, strictly greater than every
    /// earlier term of this election.
    pub fn term(&self) -> u64 {
        self.lease.fencing_token()
    }

    /// Resigns: releases the lease so that another candidate can lead at
    /// once (a candidate of another manager first, as a release yields).
    ///
    /// # Errors
    ///
    /// As [`Lease::release`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after its first poll still resigns.
    pub async fn resign(self) -> Result<ReleaseOutcome> {
        let term = self.term();
        let outcome = self.lease.release().await?;
        tracing::info!(election = %self.election, term, "resigned");
        Ok(outcome)
    }

    /// A [`LeaderContext`] for this leadership: what [`Election::run_as_leader`]
    /// passes to its future, for code that campaigns itself.
    pub fn context(&self) -> LeaderContext {
        LeaderContext {
            election: self.election.clone(),
            term: self.term(),
            status: self.lease.status(),
            lease: self.lease.handle(),
        }
    }
}

/// What the future run by [`Election::run_as_leader`] knows of its
/// leadership. Cheap to clone into the tasks that work as leader.
#[derive(Clone)]
pub struct LeaderContext {
    election: LeaseKey,
    term: u64,
    status: LeaseStatus,
    lease: LeaseHandle,
}

impl LeaderContext {
    /// The election's name.
    pub fn name(&self) -> &LeaseKey {
        &self.election
    }

    /// The term (fencing token) of this leadership.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// How the leadership stands (see [`LeaseStatus`]).
    pub fn status(&self) -> LeaseStatus {
        self.status.clone()
    }

    /// Publishes the leader's payload (see [`Lease::set_payload`]).
    ///
    /// # Errors
    ///
    /// As [`Lease::set_payload`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the payload written.
    pub async fn set_payload(&self, payload: Document) -> Result<()> {
        self.lease.set_payload(payload).await
    }
}

impl fmt::Debug for LeaderContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderContext")
            .field("election", &self.election)
            .field("term", &self.term)
            .field("lost", &self.status.is_lost())
            .finish()
    }
}

/// The candidates of an election, as read by [`Election::candidates`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Candidates {
    /// The leader; `None` if nobody leads.
    pub leader: Option<LeaderInfo>,
    /// The managers waiting for leadership, first served first
    /// ([`LeaseInfo::waiters`] of the election key).
    pub waiting: Vec<WaitingOwner>,
}

/// The leader of an election: the election's view of a held [`LeaseInfo`]
/// (times are server time).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leader's owner id.
    pub owner_id: String,
    /// Its term (the lease's fencing token).
    pub term: u64,
    /// Server time at which it became leader.
    pub since: SystemTime,
    /// The payload it published, if any.
    pub payload: Option<Document>,
    /// [`LeaseInfo::transitions`] of the election key.
    pub transitions: u64,
}

impl LeaderInfo {
    /// The leader described by `info`, if the lease is held. A foreign
    /// holder's lock ([`LeaseInfo::foreign`]) is a leader with its owner
    /// field as owner id and term 0.
    pub fn from_info(info: &LeaseInfo) -> Option<LeaderInfo> {
        info.held.then(|| LeaderInfo {
            owner_id: info.owner_id.clone(),
            term: info.fencing_token,
            since: info.acquired_at,
            payload: info.payload.clone(),
            transitions: info.transitions,
        })
    }
}

/// The leadership changes of an election, from [`Election::observe`]: a
/// [`Stream`](futures::Stream) of `Result<Option<LeaderInfo>>`, each item
/// different from the one before, ending as [`LeaseObserver`] ends.
#[derive(Debug)]
pub struct LeaderObserver {
    changes: LeaseObserver,
    last: Option<Option<LeaderInfo>>,
}

impl LeaderObserver {
    /// The next change, or `None` once the stream has ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<Result<Option<LeaderInfo>>> {
        futures::StreamExt::next(self).await
    }
}

impl futures::Stream for LeaderObserver {
    type Item = Result<Option<LeaderInfo>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let Some(state) = std::task::ready!(Pin::new(&mut self.changes).poll_next(cx)?) else {
                return Poll::Ready(None);
            };
            let leader = state.as_ref().and_then(LeaderInfo::from_info);
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Poll::Ready(Some(Ok(leader)));
            }
        }
    }
}
