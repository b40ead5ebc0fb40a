//! [`ReplicaSet`]: starting a set (spawn, `replSetInitiate`, wait until
//! healthy), its URIs and clients.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mongodb::Client;
use mongodb::bson::{Bson, doc};
use tempfile::TempDir;

use super::TestkitError;
use super::auth::{encode_userinfo, write_key_file};
use super::install::mongod_path;
use super::member::{LOG_TAIL_LINES, Member, POLL, pick_ports};
use super::options::ReplicaSetOptions;
use super::probe::{MemberState, MemberStatus, describe};
use super::process;
use super::proxy::FaultProxy;

/// MongoDB allows at most 7 voting members.
const MAX_VOTERS: usize = 7;

/// A throwaway replica set of real `mongod` processes on `127.0.0.1`.
///
/// Created by [`ReplicaSet::start`]. Dropping it kills every member
/// (`SIGKILL`, then reaps it) and removes the data directories; if the
/// process dies without dropping it, the members are killed by the kernel
/// (`PR_SET_PDEATHSIG`, Linux) or by an exit hook. See the
/// [module docs](super) for details.
///
/// The async methods need a tokio runtime with the time driver enabled
/// (any `#[tokio::test]` qualifies). Drop blocks briefly while the killed
/// processes are reaped.
#[derive(Debug)]
pub struct ReplicaSet {
    pub(super) opts: ReplicaSetOptions,
    pub(super) mongod: PathBuf,
    pub(super) members: Vec<Member>,
    startup_time: Duration,
    /// Directory holding the key file of an access-controlled set.
    pub(super) key_dir: Option<TempDir>,
    /// The `root` user exists: the test kit's own clients authenticate.
    pub(super) users_ready: bool,
}

impl ReplicaSet {
    /// Starts a replica set and waits until it is healthy.
    ///
    /// Steps: locate `mongod` ([`mongod_path`]); pick a free loopback port
    /// and create a temporary data directory per member; spawn all members
    /// in parallel (if a port was taken meanwhile, the member is retried on
    /// a new port); run `replSetInitiate` through a direct connection to
    /// member 0, which gets priority 2 (others 1) so it is the preferred
    /// primary (and is nudged with `replSetStepUp` instead of waiting for an
    /// election timeout); then poll `hello` every 50 ms until one member is
    /// a writable primary **and** every other member is a secondary (so
    /// `w: "majority"` writes work immediately).
    ///
    /// Typical time on a 2-core machine: ~0.4 s for one member, ~2.1 s for
    /// three (most of it the secondaries' initial sync). All of this is
    /// bounded by [`startup_timeout`](ReplicaSetOptions::startup_timeout);
    /// errors include the tail of the relevant `mongod.log`. On error every
    /// member started so far is killed and its directory removed.
    ///
    /// If `mongod` must first be installed, this blocks the calling thread
    /// for the few seconds `pip` takes (once per checkout).
    pub async fn start(opts: ReplicaSetOptions) -> Result<ReplicaSet, TestkitError> {
        opts.validate()?;
        let mongod = mongod_path()?;
        process::sweep_stale_dirs();

        let began = Instant::now();
        let deadline = began + opts.startup_timeout;
        let ports = pick_ports(opts.members)?;
        let members = (ports.into_iter().enumerate())
            .map(|(index, port)| Member::new(index, port))
            .collect::<Result<Vec<_>, _>>()?;
        let key_dir = match &opts.auth {
            Some(_) => Some(write_key_file()?),
            None => None,
        };
        let mut rs = ReplicaSet {
            opts,
            mongod,
            members,
            startup_time: Duration::ZERO,
            key_dir,
            users_ready: false,
        };

        // Spawn everything first so the members boot in parallel.
        for m in &rs.members {
            m.spawn(&rs.mongod, &rs.opts, rs.key_file().as_deref())
                .await?;
        }
        let key_file = rs.key_file();
        for m in &mut rs.members {
            m.wait_listening_on_a_free_port(
                &rs.mongod,
                Some(&rs.opts.set_name),
                &rs.opts,
                key_file.as_deref(),
                deadline,
            )
            .await?;
        }
        let listening = began.elapsed();
        if rs.opts.proxied {
            for m in &mut rs.members {
                m.proxy = Some(FaultProxy::start(([127, 0, 0, 1], m.port).into()).await?);
            }
        }

        rs.initiate(deadline).await?;
        let primary_after = rs.wait_healthy(deadline, began).await?;
        if rs.opts.auth.is_some() {
            rs.create_root_user(deadline).await?;
            rs.users_ready = true;
        }
        rs.startup_time = began.elapsed();
        let hosts: Vec<String> = rs.members.iter().map(Member::host).collect();
        tracing::info!(
            members = rs.members.len(),
            hosts = %hosts.join(","),
            listening_ms = listening.as_millis() as u64,
            primary_ms = primary_after.as_millis() as u64,
            healthy_ms = rs.startup_time.as_millis() as u64,
            "testkit replica set ready"
        );
        Ok(rs)
    }

    /// Runs `replSetInitiate` on member 0 (retrying transient failures).
    async fn initiate(&self, deadline: Instant) -> Result<(), TestkitError> {
        let members: Vec<Bson> = self
            .members
            .iter()
            .map(|m| {
                let mut d = doc! { "_id": m.index as i32, "host": m.host() };
                if m.index >= MAX_VOTERS {
                    d.insert("priority", 0);
                    d.insert("votes", 0);
                } else {
                    d.insert("priority", if m.index == 0 { 2 } else { 1 });
                }
                Bson::Document(d)
            })
            .collect();
        let mut config = doc! { "_id": &self.opts.set_name, "members": members };
        if self.opts.fast_elections {
            config.insert(
                "settings",
                doc! { "electionTimeoutMillis": 1000, "heartbeatIntervalMillis": 500 },
            );
        }
        let client = self.direct_client(0).await?;
        let admin = client.database("admin");
        loop {
            match admin
                .run_command(doc! { "replSetInitiate": config.clone() })
                .await
            {
                Ok(_) => return Ok(()),
                // AlreadyInitialized: an earlier attempt went through.
                Err(e) if error_code(&e) == Some(23) => return Ok(()),
                Err(e) => {
                    if let Some(status) = self.members[0].exit_status() {
                        return Err(self.members[0].exited_error(status));
                    }
                    if Instant::now() >= deadline {
                        return Err(TestkitError::driver(
                            format!(
                                "running replSetInitiate on member 0; last lines of the logs:\n{}",
                                self.logs_tail()
                            ),
                            e,
                        ));
                    }
                    tracing::debug!(error = %e, "replSetInitiate failed, retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Waits until there is a writable primary and all other members are
    /// secondaries. Returns when the primary was first seen (since `began`).
    async fn wait_healthy(
        &self,
        deadline: Instant,
        began: Instant,
    ) -> Result<Duration, TestkitError> {
        let clients = self.direct_clients().await?;
        let mut primary_seen: Option<Duration> = None;
        let mut last_step_up: Option<Instant> = None;
        loop {
            self.check_alive()?;
            let probes = self.probe_all(&clients).await;
            let primaries = probes.iter().filter(|p| p.is_primary()).count();
            if primaries > 0 && primary_seen.is_none() {
                primary_seen = Some(began.elapsed());
            }
            // Member 0 would only stand for election after an election
            // timeout; ask it to do so right away (saves ~1 s, or ~10 s
            // without fast elections). Failures (e.g. the others don't have
            // the config yet) are harmless: just try again.
            if primaries == 0
                && probes.len() > 1
                && matches!(probes[0].status.state, MemberState::Secondary { .. })
                && last_step_up.is_none_or(|t| t.elapsed() >= Duration::from_millis(250))
            {
                last_step_up = Some(Instant::now());
                let _ = clients[0]
                    .database("admin")
                    .run_command(doc! { "replSetStepUp": 1 })
                    .await;
            }
            let secondaries = probes
                .iter()
                .filter(|p| matches!(p.status.state, MemberState::Secondary { .. }))
                .count();
            if primaries == 1 && primaries + secondaries == probes.len() {
                return Ok(primary_seen.unwrap_or_default());
            }
            if Instant::now() >= deadline {
                let what = match primary_seen {
                    None => "a writable primary",
                    Some(_) => "all members to be PRIMARY or SECONDARY",
                };
                let seen: Vec<MemberStatus> = probes.into_iter().map(|p| p.status).collect();
                return Err(
                    self.timeout(format!("{what} (members last seen: {})", describe(&seen)))
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Errors if a member that should be running has exited.
    fn check_alive(&self) -> Result<(), TestkitError> {
        for m in &self.members {
            if let Some(status) = m.exit_status() {
                return Err(m.exited_error(status));
            }
        }
        Ok(())
    }

    pub(super) fn timeout(&self, what: String) -> TestkitError {
        TestkitError::Timeout {
            what,
            timeout: self.opts.startup_timeout,
            log_tail: self.logs_tail(),
        }
    }

    pub(super) fn logs_tail(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "--- member {} (port {}, {}) ---\n{}",
                    m.index,
                    m.port,
                    m.log_path().display(),
                    m.log_tail(LOG_TAIL_LINES)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(super) async fn direct_clients(&self) -> Result<Vec<Client>, TestkitError> {
        let mut clients = Vec::with_capacity(self.members.len());
        for i in 0..self.members.len() {
            clients.push(self.direct_client(i).await?);
        }
        Ok(clients)
    }

    /// The replica-set connection string:
    /// `mongodb://127.0.0.1:P1,127.0.0.1:P2,.../?replicaSet=NAME` (the
    /// members' [hosts](Member::host), so the proxies' addresses in a
    /// [proxied](ReplicaSetOptions::proxied) set). With
    /// [`auth`](ReplicaSetOptions::auth) it carries the credentials:
    /// `mongodb://USER:PASSWORD@.../?replicaSet=NAME&authSource=admin`.
    pub fn uri(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(Member::host).collect();
        match &self.opts.auth {
            None => format!(
                "mongodb://{}/?replicaSet={}",
                hosts.join(","),
                self.opts.set_name
            ),
            Some((user, password)) => format!(
                "mongodb://{}:{}@{}/?replicaSet={}&authSource=admin",
                encode_userinfo(user),
                encode_userinfo(password),
                hosts.join(","),
                self.opts.set_name
            ),
        }
    }

    /// The fault proxy in front of member `i`, in a
    /// [proxied](ReplicaSetOptions::proxied) set.
    ///
    /// # Panics
    ///
    /// If `i >= self.members().len()`, or if the set is not proxied.
    pub fn proxy(&self, i: usize) -> &FaultProxy {
        self.members[i]
            .proxy()
            .expect("ReplicaSet::proxy needs ReplicaSetOptions::proxied(true)")
    }

    /// A client for member `i` only, with short timeouts, for polling and
    /// administration; it bypasses the proxies and, once the `root` user
    /// exists, authenticates as it.
    pub(super) async fn direct_client(&self, i: usize) -> Result<Client, TestkitError> {
        let member = &self.members[i];
        let mut uri = format!(
            "{}&serverSelectionTimeoutMS=2000&connectTimeoutMS=2000&appName=mongo-lease-testkit",
            member.uri()
        );
        let mut shown = uri.clone();
        if let (Some((user, password)), true) = (&self.opts.auth, self.users_ready) {
            let userinfo = format!("{}:{}@", encode_userinfo(user), encode_userinfo(password));
            uri = uri.replacen("mongodb://", &format!("mongodb://{userinfo}"), 1);
            uri.push_str("&authSource=admin");
            shown.push_str(" (authenticated)");
        }
        Client::with_uri_str(&uri)
            .await
            .map_err(|e| TestkitError::driver(format!("creating a client for {shown}"), e))
    }

    /// A URI connecting directly to member `i` only
    /// (`mongodb://127.0.0.1:P/?directConnection=true`).
    ///
    /// # Panics
    ///
    /// If `i >= self.members().len()`.
    pub fn member_uri(&self, i: usize) -> String {
        self.members[i].uri()
    }

    /// The members, indexed like the replica set configuration `_id`s.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The options the set was started with.
    pub fn options(&self) -> &ReplicaSetOptions {
        &self.opts
    }

    /// How long [`start`](Self::start) took from spawning the first
    /// `mongod` until the set was healthy.
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    /// A new driver client for [`uri`](Self::uri) (default driver options).
    pub async fn client(&self) -> Result<Client, TestkitError> {
        Client::with_uri_str(self.uri())
            .await
            .map_err(|e| TestkitError::driver("creating a client", e))
    }

    pub(super) fn member(&self, i: usize) -> Result<&Member, TestkitError> {
        self.members.get(i).ok_or(TestkitError::NoSuchMember {
            index: i,
            len: self.members.len(),
        })
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        // SIGKILL everyone first so they die in parallel; each Member's
        // Drop then reaps its process and removes its directory.
        for m in &self.members {
            m.signal_kill();
        }
    }
}

pub(super) fn error_code(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}
