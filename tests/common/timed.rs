//! A client whose command monitor records, on this machine's monotonic
//! clock, when each command was sent and when its reply came back: the
//! bracket, in local time, of the server's `$$NOW` for that command.

use std::sync::{Arc, Mutex};

use mongodb::Client;
use mongodb::event::{EventHandler, command::CommandEvent};
use tokio::time::Instant;

/// One command, as its monitor saw it.
#[derive(Debug, Clone)]
pub struct TimedCommand {
    /// The command's name (`findAndModify`, `update`...).
    pub name: String,
    /// Just before it went out: the server ran it after this instant.
    pub sent: Instant,
    /// When its successful reply came back (the server ran it before
    /// this instant); `None` while none came, or after a failure.
    pub replied: Option<Instant>,
}

/// The commands one client sent, in the order they were sent.
#[derive(Clone, Default)]
pub struct TimedLog(Arc<Mutex<Vec<(i32, TimedCommand)>>>);

impl TimedLog {
    /// The last command named one of `names` whose successful reply came
    /// back before `before`, by the time it was sent.
    pub fn last_confirmed(&self, names: &[&str], before: Instant) -> Option<TimedCommand> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, command)| command)
            .filter(|c| names.contains(&c.name.as_str()))
            .filter(|c| c.replied.is_some_and(|replied| replied < before))
            .max_by_key(|c| c.sent)
            .cloned()
    }
}

impl super::Clients {
    /// A client for `uri` (shut down with the others) whose commands are
    /// timed in the returned log.
    pub async fn connect_timed(&self, uri: &str) -> (Client, TimedLog) {
        let log = TimedLog::default();
        let mut options = mongodb::options::ClientOptions::parse(uri)
            .await
            .expect("uri");
        let sink = log.clone();
        options.command_event_handler = Some(EventHandler::callback(move |event| {
            let now = Instant::now();
            let mut log = sink.0.lock().unwrap();
            match event {
                CommandEvent::Started(started) => log.push((
                    started.request_id,
                    TimedCommand {
                        name: started.command_name,
                        sent: now,
                        replied: None,
                    },
                )),
                CommandEvent::Succeeded(done) => {
                    if let Some((_, command)) =
                        log.iter_mut().rev().find(|(id, _)| *id == done.request_id)
                    {
                        command.replied = Some(now);
                    }
                }
                _ => {}
            }
        }));
        let client = Client::with_options(options).expect("client");
        self.0.lock().unwrap().push(client.clone());
        (client, log)
    }
}
