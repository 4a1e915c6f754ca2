//! The reader's one kind of read: polling or enhanced fan-out, chosen once at start (by
//! whether the stream has a consumer for this worker). Nothing outside this file asks
//! which mode reads; each step dispatches here.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorProcessingErr;
use tokio::time::Instant;

use super::fanout::FanOut;
use super::polling::Polling;
use super::reading::{Next, Reading};
use crate::backend::{ShardEvent, StreamError};
use crate::status::SubscriptionView;

pub(super) enum Source {
    Polling(Polling),
    /// Boxed: a fan-out source holds its subscription and an event's records.
    FanOut(Box<FanOut>),
}

impl Source {
    /// Fan-out where a consumer is given, polling otherwise; `idle` is polling's first
    /// wait between empty reads.
    pub fn new(consumer: Option<Arc<str>>, idle: Duration, now: Instant) -> Self {
        match consumer {
            Some(consumer) => Source::FanOut(Box::new(FanOut::new(consumer, now))),
            None => Source::Polling(Polling::new(idle)),
        }
    }

    /// Whether a read can be made now (an iterator, an open subscription).
    pub fn ready(&self) -> bool {
        match self {
            Source::Polling(polling) => polling.has_iterator(),
            Source::FanOut(fanout) => fanout.subscribed(),
        }
    }

    /// Memory held by records read and not yet delivered.
    pub fn held_memory(&self) -> u64 {
        match self {
            Source::Polling(_) => 0,
            Source::FanOut(fanout) => fanout.held_memory(),
        }
    }

    /// Gets what reads: an iterator, or a subscription.
    pub async fn acquire(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        match self {
            Source::Polling(polling) => polling.acquire(r).await,
            Source::FanOut(fanout) => fanout.subscribe(r).await,
        }
    }

    /// One read (the reader's gate has passed).
    pub async fn read(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        match self {
            Source::Polling(polling) => polling.read(r).await,
            Source::FanOut(fanout) => fanout.read(r).await,
        }
    }

    /// A subscription's event (polling has none: ignored).
    pub async fn on_event(
        &mut self,
        r: &mut Reading<'_>,
        generation: u64,
        event: Result<Option<ShardEvent>, StreamError>,
    ) -> Result<Next, ActorProcessingErr> {
        match self {
            Source::Polling(_) => Ok(Next::Nothing),
            Source::FanOut(fanout) => fanout.on_event(r, generation, event).await,
        }
    }

    /// Stops reading where it is: cancels a subscription and forgets what its last
    /// event held (polling keeps its iterator: nothing is read without the gate), shows
    /// no subscription, and settles the budget with what is left.
    pub fn drop_feed(&mut self, r: &mut Reading<'_>) {
        match self {
            Source::Polling(_) => r.feed_dropped(),
            Source::FanOut(fanout) => fanout.drop_feed(r),
        }
    }

    /// The subscription, for the status page (`None` when polling).
    pub fn view(&self, now: Instant) -> Option<SubscriptionView> {
        match self {
            Source::Polling(_) => None,
            Source::FanOut(fanout) => Some(fanout.view(now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_chosen_once_by_the_consumer_and_shown_only_for_fan_out() {
        let now = Instant::now();
        let poll = Duration::from_millis(200);
        let polling = Source::new(None, poll, now);
        assert!(matches!(polling, Source::Polling(_)));
        assert!(!polling.ready(), "no iterator before the first acquire");
        assert_eq!(polling.held_memory(), 0);
        assert!(polling.view(now).is_none());

        let arn: Arc<str> =
            Arc::from("arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1");
        let fanout = Source::new(Some(arn), poll, now);
        assert!(matches!(fanout, Source::FanOut(_)));
        assert!(!fanout.ready(), "no subscription before the first acquire");
        let view = fanout.view(now).expect("fan-out shows its subscription");
        assert_eq!(
            (view.state, view.age_ms, view.events, view.subscriptions),
            ("none", None, 0, 0)
        );
    }
}
