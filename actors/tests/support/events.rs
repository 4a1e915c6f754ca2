//! Captures structured log events (their fields as text) from everything running on the
//! test's thread: with `#[tokio::test]`'s current-thread runtime, every actor of every
//! worker. For asserting on events such as `lease_moved`, whose fields are the contract.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One event: its fields by name, `message` and `level` among them.
pub type Event = BTreeMap<String, String>;

#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<Event>>>);

impl Events {
    /// Records every event on this thread until the guard is dropped.
    pub fn capture() -> (Events, tracing::subscriber::DefaultGuard) {
        // While a single dispatcher is registered, tracing caches a callsite's interest
        // from the dispatcher of whichever thread first reaches it: a test running
        // beside this one (no subscriber) could switch an event off for this capture
        // too (seen: `lease_moved` events of the giving side missing, about one run in
        // ten of fleet_handoff). A second dispatcher, kept for the process, makes it
        // combine every dispatcher's interest instead.
        static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let events = Events::default();
        let subscriber = tracing_subscriber::registry().with(events.clone());
        (events, tracing::subscriber::set_default(subscriber))
    }

    /// Every event whose field `name` is `value`.
    pub fn with(&self, name: &str, value: &str) -> Vec<Event> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.get(name).is_some_and(|v| v == value))
            .cloned()
            .collect()
    }
}

struct Fields<'a>(&'a mut Event);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Event::new();
        fields.insert("level".into(), event.metadata().level().to_string());
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
}
