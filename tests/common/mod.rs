//! Shared fixture: a real MongoDB (the test kit's throwaway replica set, or
//! `MONGODB_URI`) and managers on fresh lock collections.
#![allow(dead_code)]

use std::time::Duration;

use mongo_lease::{LockManager, LockManagerOptions};
use mongodb::bson::Document;
use mongodb::{Client, Collection, Database};

/// A database on the shared test deployment, unique to one test.
pub struct Fixture {
    pub client: Client,
    pub db: Database,
    pub collection: String,
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
    /// had stopped renewing it long ago.
    pub async fn expire(&self, key: &str) {
        self.raw()
            .update_one(
                mongodb::bson::doc! { "_id": key },
                mongodb::bson::doc! { "$set": { "exp": mongodb::bson::DateTime::from_millis(0) } },
            )
            .await
            .expect("expire the lease");
    }

    /// Options for a manager with its own `Client` (as if in another process).
    pub async fn options(&self, ttl: Duration) -> LockManagerOptions {
        let client = Client::with_uri_str(uri()).await.expect("client");
        LockManagerOptions::builder()
            .database(client.database(self.db.name()))
            .collection(self.collection.clone())
            .ttl(ttl)
            .build()
    }

    pub async fn manager(&self, ttl: Duration) -> LockManager {
        LockManager::connect(self.options(ttl).await)
            .await
            .expect("connect")
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
    ) -> (LockManagerOptions, CommandLog) {
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
        let options = LockManagerOptions::builder()
            .database(client.database(self.db.name()))
            .collection(self.collection.clone())
            .ttl(ttl)
            .build();
        (options, log)
    }
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
