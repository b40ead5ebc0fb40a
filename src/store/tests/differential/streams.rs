//! The streams of writes ([`Store::watch_releases`]) of both sides, read
//! after each step: what each announced during the step, as an answer of
//! the step (compared as the others are). One stream of every write (owner
//! `a`, [`Announced::Writes`]) and one of a waiter's (owner `b`,
//! [`Announced::Waits`]) on each side. The twin announces a write as it
//! applies it; a change stream, a little later: after the step the mongod's
//! streams are read up to a sentinel, a document written and deleted by the
//! test (of a key no step uses), whose two events come after every write
//! of the step.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use mongodb::bson::doc;

use super::norm::V;
use super::world::World;
use crate::error::Result;
use crate::key::LeaseKey;
use crate::store::{Announced, Announcement, Store};

type Writes = BoxStream<'static, Result<Announcement>>;

/// The sentinel's key.
const SENTINEL: &str = "~sentinel";

/// How long the mongod's streams may take to show the sentinel.
const PATIENCE: Duration = Duration::from_secs(10);

/// The streams of both sides: every write (owner `a`), a waiter's (owner
/// `b`).
pub(super) struct Streams {
    twin: [Writes; 2],
    mongo: [Writes; 2],
}

impl Streams {
    /// Opens the streams, each once it reports [`Announcement::Opened`].
    pub async fn open(world: &World) -> Streams {
        let forms = [(0, Announced::Writes), (1, Announced::Waits)];
        let mut twin = forms.map(|(o, a)| world.owners[o].twin.watch_releases(a));
        let mut mongo = forms.map(|(o, a)| world.owners[o].mongo.watch_releases(a));
        for stream in twin.iter_mut().chain(mongo.iter_mut()) {
            let first = tokio::time::timeout(PATIENCE, stream.next()).await;
            match first {
                Ok(Some(Ok(Announcement::Opened))) => {}
                other => panic!("a stream of writes did not open: {other:?}"),
            }
        }
        Streams { twin, mongo }
    }

    /// What each side's streams announced since the last call: the twin's
    /// at once, the mongod's up to the sentinel's two writes; none of the
    /// mongod's after a step that `writes` nothing (a later step's read of
    /// the streams would show what it did write).
    pub async fn step(&mut self, world: &World, writes: bool) -> (V, V) {
        let twin = self.twin.each_mut().map(|stream| {
            let mut items = Vec::new();
            while let Some(Some(item)) = stream.next().now_or_never() {
                items.push(item);
            }
            items
        });
        let mut mongo: [Vec<Result<Announcement>>; 2] = [Vec::new(), Vec::new()];
        if !writes {
            return (announced(&twin), announced(&mongo));
        }
        let key = LeaseKey::from(SENTINEL);
        // The insert acknowledged by the primary alone, the delete by a
        // majority (which commits the insert too): one journal wait.
        let one = mongodb::options::WriteConcern::nodes(1);
        world
            .coll
            .insert_one(doc! { "_id": SENTINEL })
            .write_concern(one)
            .await
            .expect("the sentinel's insert");
        world
            .coll
            .delete_one(doc! { "_id": SENTINEL })
            .write_concern(mongodb::options::WriteConcern::majority())
            .await
            .expect("the sentinel's delete");
        for (stream, items) in self.mongo.iter_mut().zip(&mut mongo) {
            let mut sentinels = 0;
            while sentinels < 2 {
                match tokio::time::timeout(PATIENCE, stream.next()).await {
                    Ok(Some(Ok(Announcement::Write(w)))) if w.key == key => sentinels += 1,
                    Ok(Some(item)) => items.push(item),
                    Ok(None) => break,
                    Err(_) => panic!("the sentinel never came through a change stream"),
                }
            }
        }
        (announced(&twin), announced(&mongo))
    }
}

/// A side's announcements, per stream, as a multiset (a write of several
/// documents announces them in the server's order, the twin in its own).
fn announced(streams: &[Vec<Result<Announcement>>; 2]) -> V {
    let names = ["writes (a)", "waits (b)"];
    let per_stream = streams.iter().zip(names).map(|(items, name)| {
        let mut items: Vec<(String, V)> = items.iter().map(announcement).collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        let items = items.into_iter().map(|(_, v)| v).collect();
        (name.to_string(), V::List(items))
    });
    V::Map(per_stream.collect())
}

/// One announcement, with what it is sorted by (all but its token).
fn announcement(item: &Result<Announcement>) -> (String, V) {
    let text = |s: &str| V::Str(s.to_string());
    let (order, v) = match item {
        Err(e) => (format!("error {e}"), text("error")),
        Ok(Announcement::Opened) => ("opened".into(), text("opened")),
        Ok(Announcement::RevocationRequested { key, by }) => {
            let v = [
                ("revocation requested", V::Str(key.to_extended_json())),
                ("by", text(by)),
            ];
            (format!("revocation requested {key:?} {by}"), map(v))
        }
        Ok(Announcement::Write(w)) => {
            let v = [
                ("key", V::Str(w.key.to_extended_json())),
                ("freed", V::Bool(w.freed)),
                ("lid", w.lease_id.map_or(V::Null, V::Id)),
                ("owner", w.owner.clone().map_or(V::Null, V::Str)),
                (
                    "token",
                    w.token.map_or(V::Null, |t| V::Token(w.key.clone(), t)),
                ),
            ];
            let order = format!(
                "write {:?} {} {:?} {:?}",
                w.key, w.freed, w.lease_id, w.owner
            );
            (order, map(v))
        }
    };
    (order, v)
}

fn map<const N: usize>(entries: [(&str, V); N]) -> V {
    V::Map(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}
