//! Shared fixture: a real MongoDB (the test kit's throwaway replica set, or
//! `MONGODB_URI`) and managers on fresh lock collections.
#![allow(dead_code)]

use std::time::Duration;

use mongo_lease::testkit::{FaultProxy, ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseManager, LeaseManagerOptions};
use mongodb::bson::Document;
use mongodb::{Client, Collection, Database};

pub mod clock;
pub mod others;
pub mod pattern2_client;
pub mod renewal;
pub mod timed;
pub mod watchdog;

/// A database on the shared test deployment, unique to one test.
pub struct Fixture {
    pub client: Client,
    pub db: Database,
    pub collection: String,
    /// Every client made for this fixture's managers, shut down on drop.
    clients: std::sync::Mutex<Vec<Client>>,
    /// Fails the run if the test still holds the fixture after
    /// [`watchdog::TEST_HANG`].
    _watchdog: watchdog::Watchdog,
}

/// How long [`shut_down`] waits for one client's shutdown. It only
/// turns a hang into a warning: a shutdown takes milliseconds here, unless a
/// test left a change stream open (a manager not shut down).
const CLIENT_SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

impl Drop for Fixture {
    fn drop(&mut self) {
        let mut clients = std::mem::take(&mut *self.clients.lock().unwrap());
        clients.push(self.client.clone());
        shut_down(clients);
    }
}

/// Clients made outside a [`Fixture`], shut down (see [`shut_down`]) when
/// this is dropped: declare it before the managers that use them.
/// Also a hang guard for the test that made it ([`watchdog`]).
#[derive(Default)]
pub struct Clients(std::sync::Mutex<Vec<Client>>, watchdog::Watchdog);

impl Clients {
    /// A client for `uri`, shut down with the others.
    pub async fn connect(&self, uri: &str) -> Client {
        let client = Client::with_uri_str(uri).await.expect("client");
        self.add(client)
    }

    /// `client`, shut down with the others.
    pub fn add(&self, client: Client) -> Client {
        self.0.lock().unwrap().push(client.clone());
        client
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        shut_down(std::mem::take(&mut *self.0.lock().unwrap()));
    }
}

/// Shuts down `clients` at the end of a test, so that the driver's
/// background clean-ups (the `killCursors` of a dropped change stream, for
/// one) finish while the test's runtime still runs. Otherwise such a task can
/// still run on a worker of a multi-threaded test runtime after the runtime
/// dropped the client's connection-pool task, and the driver panics
/// (`ConnectionRequester`: `SendError`). A single-threaded runtime drops its
/// tasks without polling them again, so it needs none of this; nor does a
/// test that is already failing.
pub fn shut_down(clients: Vec<Client>) {
    if std::thread::panicking() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return;
    }
    tokio::task::block_in_place(|| {
        runtime.block_on(async {
            for client in clients {
                if tokio::time::timeout(CLIENT_SHUTDOWN_WAIT, client.shutdown())
                    .await
                    .is_err()
                {
                    eprintln!(
                        "a client's shutdown waited over {CLIENT_SHUTDOWN_WAIT:?}: a cursor is still open"
                    );
                }
            }
        })
    });
}

pub fn uri() -> String {
    std::env::var("MONGODB_URI").unwrap_or_else(|_| mongo_lease::testkit::shared_uri())
}

impl Fixture {
    pub async fn new(test: &str) -> Fixture {
        let client = Client::with_uri_str(uri()).await.expect("client");
        let name = format!(
            "t_{}_{}",
            test,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Fixture {
            db: client.database(&name),
            client,
            collection: "workitem.lock".into(),
            clients: Default::default(),
            _watchdog: Default::default(),
        }
    }

    /// The raw lock collection, to inspect what the manager stored.
    pub fn raw(&self) -> Collection<Document> {
        self.db.collection(&self.collection)
    }

    /// The lock document stored under `key` (panics if there is none).
    pub async fn doc(&self, key: &str) -> Document {
        self.raw()
            .find_one(mongodb::bson::doc! { "_id": key })
            .await
            .expect("read the lock document")
            .unwrap_or_else(|| panic!("no lock document for {key:?}"))
    }

    /// Makes the lease on `key` look expired on the server, as if its holder
    /// had stopped renewing it 10 s ago: `exp` is 10 s before the server's
    /// `$$NOW` (well past any step back of `$$NOW`), and 50 s short of the
    /// GC grace (60 s) of the TTL index on `exp`, whose monitor (every
    /// second here) would otherwise delete the document under the test.
    pub async fn expire(&self, key: &str) {
        self.raw()
            .update_one(
                mongodb::bson::doc! { "_id": key },
                vec![mongodb::bson::doc! {
                    "$set": { "exp": { "$subtract": ["$$NOW", 10_000_i64] } },
                }],
            )
            .await
            .expect("expire the lease");
    }

    /// Another owner takes `key` over from its holder, as after the holder
    /// paused past its TTL: expires the lease on the server, then
    /// `taker.try_acquire`s it. The holder's manager may renew in between
    /// (renewal keeps a lease nobody took yet), so this tries again until
    /// the takeover wins; each try is two round trips, and the holder
    /// renews at most once per heartbeat, so a few tries suffice.
    pub async fn take_over(&self, key: &str, taker: &LeaseManager) -> mongo_lease::Lease {
        for _ in 0..100 {
            self.expire(key).await;
            if let Some(lease) = taker.try_acquire(key).await.expect("try_acquire") {
                return lease;
            }
        }
        panic!("{key}: the holder renewed before every takeover attempt");
    }

    /// Options for a manager with its own `Client` (as if in another process),
    /// with the [`clock_skew`] of a TTL this short.
    pub async fn options(&self, ttl: Duration) -> LeaseManagerOptions {
        let client = Client::with_uri_str(uri()).await.expect("client");
        self.clients.lock().unwrap().push(client.clone());
        LeaseManagerOptions::builder()
            .database(client.database(self.db.name()))
            .collection(self.collection.clone())
            .ttl(ttl)
            .clock_skew(clock_skew(ttl))
            .build()
    }

    pub async fn manager(&self, ttl: Duration) -> LeaseManager {
        LeaseManager::connect(self.options(ttl).await)
            .await
            .expect("connect")
    }

    /// `n` managers, each with its own `Client` (as if in `n` processes).
    pub async fn managers(&self, n: usize, ttl: Duration) -> Vec<LeaseManager> {
        let mut managers = Vec::with_capacity(n);
        for _ in 0..n {
            managers.push(self.manager(ttl).await);
        }
        managers
    }
}

impl Fixture {
    /// Runs `body` like a process that then crashes: on a thread and a
    /// single-threaded runtime of its own, with a manager whose `Client` is
    /// created on that runtime (so none of its driver tasks lives on the
    /// caller's runtime, nor any of the caller's on this one). When `body`
    /// returns, the runtime is dropped with every task still on it, without
    /// polling them again: nothing is released, and no task runs on a half
    /// torn-down runtime.
    pub fn crashed_process<T, F, Fut>(&self, ttl: Duration, body: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(LeaseManager) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let (db, collection) = (self.db.name().to_owned(), self.collection.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let out = runtime.block_on(async move {
                let client = Client::with_uri_str(uri()).await.expect("client");
                let manager = LeaseManager::connect(
                    LeaseManagerOptions::builder()
                        .database(client.database(&db))
                        .collection(collection)
                        .ttl(ttl)
                        .clock_skew(clock_skew(ttl))
                        .build(),
                )
                .await
                .expect("connect");
                body(manager).await
            });
            drop(runtime);
            out
        })
        .join()
        .expect("the crashing process panicked")
    }
}

/// Commands a client sent, recorded by its command monitor.
#[derive(Clone, Default)]
pub struct CommandLog(std::sync::Arc<std::sync::Mutex<Vec<(String, Document)>>>);

impl CommandLog {
    /// `(command name, command document)` of every command sent so far, and
    /// `("ok:<command name>", reply)` of every successful reply.
    pub fn all(&self) -> Vec<(String, Document)> {
        self.0.lock().unwrap().clone()
    }
    /// How many commands named `name` were sent.
    pub fn count(&self, name: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .count()
    }
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl Fixture {
    /// Options for a manager whose own client records every command it sends.
    /// `uri_options` is appended to the URI (e.g. `"w=1&retryWrites=false"`).
    pub async fn monitored_options(
        &self,
        ttl: Duration,
        uri_options: &str,
    ) -> (LeaseManagerOptions, CommandLog) {
        use mongodb::event::{EventHandler, command::CommandEvent};
        let log = CommandLog::default();
        let mut uri = uri();
        if !uri_options.is_empty() {
            uri.push(if uri.contains('?') { '&' } else { '?' });
            uri.push_str(uri_options);
        }
        let mut client_options = mongodb::options::ClientOptions::parse(&uri)
            .await
            .expect("uri");
        let sink = log.clone();
        client_options.command_event_handler = Some(EventHandler::callback(move |event| {
            let entry = match event {
                CommandEvent::Started(started) => (started.command_name, started.command),
                // Replies are logged as "ok:<command name>" with the reply document.
                CommandEvent::Succeeded(done) => (format!("ok:{}", done.command_name), done.reply),
                _ => return,
            };
            sink.0.lock().unwrap().push(entry);
        }));
        let client = Client::with_options(client_options).expect("client");
        self.clients.lock().unwrap().push(client.clone());
        let options = LeaseManagerOptions::builder()
            .database(client.database(self.db.name()))
            .collection(self.collection.clone())
            .ttl(ttl)
            .clock_skew(clock_skew(ttl))
            .build();
        (options, log)
    }
}

/// The clock skew of the fixture's managers: a tenth of their TTL, at most
/// the library's default (1 s). Their deployment is one member, whose clock
/// steps only when set; the tests of leases of a few seconds keep the
/// skew's place in every deadline without its full default size.
pub fn clock_skew(ttl: Duration) -> Duration {
    (ttl / 10).min(mongo_lease::DEFAULT_CLOCK_SKEW)
}

/// A manager on `db`, lock collection `collection`, with the defaults but
/// its TTL and the fixture's [`clock_skew`].
pub async fn manager_on(db: Database, collection: &str, ttl: Duration) -> LeaseManager {
    LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(db)
            .collection(collection)
            .ttl(ttl)
            .clock_skew(clock_skew(ttl))
            .build(),
    )
    .await
    .expect("connect")
}

/// A dedicated 1-member replica set with a fault proxy in front of it, and a
/// direct-connection URI that goes through the proxy.
pub async fn server_behind_proxy() -> (ReplicaSet, FaultProxy, String) {
    let rs = ReplicaSet::start(ReplicaSetOptions::default())
        .await
        .unwrap();
    let proxy = FaultProxy::start(([127, 0, 0, 1], rs.members()[0].port()).into())
        .await
        .unwrap();
    let uri = format!("mongodb://{}/?directConnection=true", proxy.addr());
    (rs, proxy, uri)
}

/// Awaits `wait`, failing the test with `what` if it is not done within
/// `limit`: a late or hung wait (an acquire, a task's end, a channel) fails
/// with a message instead of hanging. The caller's `limit` is a hang guard,
/// over 10x what the wait takes here, unless the protocol bounds it tighter.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    wait: impl std::future::IntoFuture<Output = T>,
) -> T {
    tokio::time::timeout(limit, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}"))
}

/// Waits (bounded) until `check` holds, polling MongoDB state; panics with `what`.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
