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
        let name = format!("t_{}_{}", test, &uuid::Uuid::new_v4().simple().to_string()[..8]);
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
        LockManager::connect(self.options(ttl).await).await.expect("connect")
    }
}
