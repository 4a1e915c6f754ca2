//! Reading by enhanced fan-out (`reader.mode = "fanout"`): the reader subscribes
//! (SubscribeToShard) and pulls one event at a time from a small task that owns the
//! subscription ([`Feed`]): an event is asked for only when the window has room, so a
//! slow processor holds the server back through flow control instead of filling memory.
//! Everything after the answer (fencing, de-aggregation, the ledger, acks, the shard's
//! end) is the polling path's. Dropping the feed cancels the subscription: lease loss,
//! fencing and shutdown do so at once, and its late events are recognised and dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ractor::ActorProcessingErr;
use tokio::time::Instant;
use tracing::debug;

use super::context::FeedSink;
use super::outbox::ReadFacts;
use super::pure::{self, Phase};
use super::reading::{Next, Reading};
use crate::backend::{ChildShard, Record, ShardEvent, StreamError, Subscription};
use crate::model::SequenceNumber;
use crate::status::SubscriptionView;
use crate::telemetry::{Call, Metric, Sample};

/// An open fan-out subscription: a task that owns it and sends one event to the reader
/// per pull. Dropping the feed aborts the task, which drops (closes) the subscription.
struct Feed {
    generation: u64,
    pull: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    since: Instant,
    /// An event has been asked for and not yet received.
    pulling: bool,
    events: u64,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Feed {
    fn open(subscription: Box<dyn Subscription>, sink: FeedSink, generation: u64) -> Feed {
        let (pull, mut pulls) = tokio::sync::mpsc::channel::<()>(1);
        let task = tokio::spawn(async move {
            let mut subscription = subscription;
            while pulls.recv().await.is_some() {
                let event = subscription.next_event().await;
                let last = !matches!(event, Ok(Some(_)));
                if !sink(generation, event) || last {
                    return;
                }
            }
        });
        Feed {
            generation,
            pull,
            task,
            since: Instant::now(),
            pulling: false,
            events: 0,
        }
    }
}

/// What a fan-out event says beyond its records, acted on once they are delivered.
struct HeldAfter {
    continuation: Option<SequenceNumber>,
    /// The shard ended, with these children.
    end: Option<Vec<ChildShard>>,
    /// The event had no records.
    idle: bool,
    /// When the event arrived (each batch of it carries this as `fetched_at`).
    fetched_at: Instant,
}

pub(super) struct FanOut {
    /// The consumer's ARN.
    consumer: Arc<str>,
    feed: Option<Feed>,
    /// The last event's continuation: where the next subscription starts.
    continuation: Option<SequenceNumber>,
    /// When the last subscription was made, and how many have been.
    subscribed_at: Option<Instant>,
    subscriptions: u64,
    /// When GetRecords was last asked whether an idle fan-out shard has ended.
    last_end_probe: Instant,
    /// Records of the last event not yet delivered (the window was full), and what to
    /// do once they are.
    held: VecDeque<Record>,
    held_after: Option<HeldAfter>,
    /// The in-memory size of `held` ([`pure::record_memory`]).
    held_memory: u64,
    /// The in-memory size of the largest event so far: a pull is made when the grant
    /// holds one as large.
    largest_event: u64,
}

impl FanOut {
    pub fn new(consumer: Arc<str>, now: Instant) -> Self {
        Self {
            consumer,
            feed: None,
            continuation: None,
            subscribed_at: None,
            subscriptions: 0,
            last_end_probe: now,
            held: VecDeque::new(),
            held_after: None,
            held_memory: 0,
            largest_event: 0,
        }
    }

    pub fn subscribed(&self) -> bool {
        self.feed.is_some()
    }

    pub fn held_memory(&self) -> u64 {
        self.held_memory
    }

    /// Forgets the subscription and any records of its last event not yet delivered
    /// (the continuation stays before them, so the next subscription brings them again).
    pub fn forget(&mut self) {
        self.feed = None;
        self.held.clear();
        self.held_after = None;
        self.held_memory = 0;
    }

    pub fn view(&self, now: Instant) -> SubscriptionView {
        SubscriptionView {
            state: if self.feed.is_some() { "open" } else { "none" },
            age_ms: self
                .feed
                .as_ref()
                .map(|f| now.saturating_duration_since(f.since).as_millis() as u64),
            events: self.feed.as_ref().map_or(0, |f| f.events),
            subscriptions: self.subscriptions,
        }
    }

    /// Forgets the subscription ([`Self::forget`]) and says so ([`Reading::feed_dropped`]).
    pub fn drop_feed(&mut self, r: &mut Reading<'_>) {
        self.forget();
        r.feed_dropped();
    }

    /// Opens a subscription where reading continues, at most once a second.
    pub async fn subscribe(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        if self.feed.is_some() {
            return Ok(Next::Nothing);
        }
        let wait = pure::subscribe_delay(self.subscribed_at.map(|at| at.elapsed()));
        if !wait.is_zero() {
            return Ok(Next::AcquireAfter(wait));
        }
        let Some((position, skip)) = pure::subscribe_position(
            self.continuation.as_ref(),
            r.outbox.last_delivered(),
            r.outbox.start_position(),
        ) else {
            return Ok(Next::Nothing);
        };
        self.subscribed_at = Some(Instant::now());
        let ctx = r.ctx;
        match ctx
            .ports
            .streams
            .subscribe_to_shard(&self.consumer, &ctx.shard, &position)
            .await
        {
            Ok(subscription) => {
                if let Some(skip) = skip {
                    r.outbox.skip_to(skip);
                }
                self.subscriptions += 1;
                r.out
                    .record(vec![Sample::shard(Metric::Subscriptions, &ctx.key, 1.0)]);
                self.feed = Some(Feed::open(
                    subscription,
                    r.out.feed_sink(),
                    self.subscriptions,
                ));
                ctx.ports.lags.subscribed(&ctx.key, Some(Instant::now()));
                r.readable();
                debug!(message = "Shard subscribed.", shard_id = %ctx.shard, ?position);
                Ok(Next::Fetch(Duration::ZERO))
            }
            // The previous owner's subscription still open (a handoff, a failover), the
            // once-a-second limit, a network failure: back off and subscribe again. The
            // lease stays held.
            Err(error) if error.is_retryable() => {
                r.count_failure(Call::SubscribeToShard, &error);
                // A refusal stalls the shard at once, with its reason; the previous
                // owner's subscription still open (a handoff) and the once-a-second
                // limit are waited out (a stall only if they last, as any failure).
                if pure::subscription_refused(&error) {
                    r.unreadable(format!("cannot subscribe: {error}"));
                }
                Ok(Next::AcquireAfter(r.health.backoff.next_random()))
            }
            Err(error @ StreamError::NotFound { .. }) => Err(format!(
                "shard {} of stream {} cannot be subscribed to (is the consumer still \
                 registered?): {error}",
                ctx.shard, ctx.stream
            )
            .into()),
            Err(error) => Err(format!("shard {}: SubscribeToShard: {error}", ctx.shard).into()),
        }
    }

    /// One event of the subscription, handled as a GetRecords answer is.
    pub async fn on_event(
        &mut self,
        r: &mut Reading<'_>,
        generation: u64,
        event: Result<Option<ShardEvent>, StreamError>,
    ) -> Result<Next, ActorProcessingErr> {
        match self.feed.as_mut() {
            Some(feed) if feed.generation == generation => {
                feed.pulling = false;
                feed.events += 1;
            }
            // A cancelled subscription's late event.
            _ => return Ok(Next::Nothing),
        }
        if !matches!(r.phase, Phase::Reading) {
            self.drop_feed(r);
            return Ok(Next::Nothing);
        }
        if event.is_ok() {
            r.answered();
        }
        match event {
            // Fenced while the event was on its way: not handed over. The subscription
            // is cancelled; the next one starts after the last event delivered.
            Ok(Some(_)) if !r.may_deliver() => {
                self.drop_feed(r);
                Ok(Next::Fetch(r.ctx.settings().reader.poll_interval))
            }
            Ok(Some(event)) => {
                r.read_ok(event.records.is_empty(), event.millis_behind_latest, None);
                let at_end = event.is_shard_end();
                self.held_after = Some(HeldAfter {
                    continuation: event.continuation.filter(|_| !at_end),
                    end: at_end.then_some(event.child_shards),
                    idle: event.records.is_empty(),
                    fetched_at: Instant::now(),
                });
                let memory: u64 = event.records.iter().map(pure::record_memory).sum();
                self.largest_event = self.largest_event.max(memory);
                self.held_memory += memory;
                r.outbox.wants_more(!event.records.is_empty());
                self.held.extend(event.records);
                r.settle(self.held_memory);
                self.advance(r).await
            }
            // The server ended the subscription (its five minutes are up): the next
            // starts from the continuation.
            Ok(None) => {
                self.drop_feed(r);
                Ok(Next::Acquire)
            }
            Err(error) if error.is_retryable() => {
                self.drop_feed(r);
                r.count_failure(Call::SubscribeToShard, &error);
                Ok(Next::AcquireAfter(r.health.backoff.next_random()))
            }
            Err(error) => Err(format!("shard {}: SubscribeToShard: {error}", r.ctx.shard).into()),
        }
    }

    /// The reader's fetch (its gate has passed): hands over what is held, or asks for
    /// the next event.
    pub async fn read(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        if self.held_after.is_some() {
            return self.advance(r).await;
        }
        Ok(self.pull(r))
    }

    /// Hands the held event's records over in batches of at most max_records while the
    /// window has room (an event holds up to 10,000 records, more than a small window:
    /// the rest waits here for acks, as polling's next call would wait); while records
    /// are gathered (`reader.batch_window`), each batch is what is missing up to
    /// max_records, so the gathered never pass it. Once all are
    /// delivered, takes the event's continuation, ends the shard if the event (or, for
    /// an idle one, GetRecords) says so, and asks for the next event.
    async fn advance(&mut self, r: &mut Reading<'_>) -> Result<Next, ActorProcessingErr> {
        let ctx = r.ctx;
        let reader = &ctx.settings().reader;
        while !self.held.is_empty() && !r.outbox.window_full(reader) {
            let most = r.gather.room(reader.max_records.max(1)) as usize;
            let take = most.min(self.held.len());
            let batch: Vec<Record> = self.held.drain(..take).collect();
            let memory: u64 = batch.iter().map(pure::record_memory).sum();
            self.held_memory = self.held_memory.saturating_sub(memory);
            let after = self.held_after.as_ref();
            let facts = ReadFacts {
                fetched_at: after.map_or_else(Instant::now, |a| a.fetched_at),
                // The event's last records are the shard's last.
                end: after
                    .and_then(|a| a.end.as_deref())
                    .filter(|_| self.held.is_empty()),
            };
            r.deliver(batch, facts, self.held_memory)?;
        }
        let poll = reader.poll_interval;
        if !self.held.is_empty() {
            return Ok(Next::Fetch(poll));
        }
        let Some(after) = self.held_after.take() else {
            return Ok(Next::Nothing);
        };
        if after.idle {
            let facts = ReadFacts {
                fetched_at: after.fetched_at,
                end: after.end.as_deref(),
            };
            r.deliver(Vec::new(), facts, self.held_memory)?;
        }
        if let Some(continuation) = after.continuation {
            self.continuation = Some(continuation);
        }
        let mut ended = after.end.map(Some);
        // Not while records are gathered: they come before any end.
        if ended.is_none() && after.idle && r.gather.is_empty() && self.end_probe_due(r) {
            ended = self.probe_end(r).await;
        }
        if let Some(children) = ended {
            self.drop_feed(r);
            return Ok(Next::Ended(children));
        }
        if r.outbox.window_full(reader) {
            return Ok(Next::Fetch(poll));
        }
        Ok(self.pull(r))
    }

    /// Whether to ask GetRecords if this idle shard has ended: rarely where the server
    /// ends subscriptions at a shard's end (a safety net), often where it does not.
    fn end_probe_due(&self, r: &Reading<'_>) -> bool {
        let reader = &r.ctx.settings().reader;
        let every = if r
            .ctx
            .ports
            .streams
            .capabilities()
            .shard_end_in_subscriptions
        {
            reader.shard_sync_interval
        } else {
            reader.parent_poll_interval
        };
        self.last_end_probe.elapsed() >= every
    }

    /// One GetRecords where the subscription would resume: `Some(children)` if the shard
    /// is at its end there (everything before it was delivered), `None` if not or if the
    /// calls failed (asked again later).
    async fn probe_end(&mut self, r: &Reading<'_>) -> Option<Option<Vec<ChildShard>>> {
        self.last_end_probe = Instant::now();
        // Where polling would read next (a continuation is no GetShardIterator position
        // on every server).
        let position = r.outbox.iterator_position()?;
        let covered = std::cmp::max(
            r.outbox.last_delivered().cloned(),
            r.outbox.skip_through().cloned(),
        );
        let ctx = r.ctx;
        let streams = &ctx.ports.streams;
        let probe = async {
            let iterator = streams
                .get_shard_iterator(&ctx.stream, &ctx.shard, &position)
                .await?;
            streams.get_records(&iterator, 2).await
        };
        match probe.await {
            Ok(batch)
                if pure::idle_shard_ended(
                    batch.is_shard_end(),
                    &batch.records,
                    covered.as_ref(),
                ) =>
            {
                debug!(message = "The idle subscription's shard has ended (found by GetRecords).", shard_id = %ctx.shard);
                Some(batch.child_shards)
            }
            Ok(_) => None,
            Err(error) => {
                debug!(message = "Asking GetRecords whether the shard ended failed.", shard_id = %ctx.shard, %error);
                None
            }
        }
    }

    /// Asks the subscription for its next event, unless one is on its way. The
    /// periodic fetch keeps running meanwhile, for the processor-stall check.
    ///
    /// Only when the shard's allowance in the memory budget holds an event as large as
    /// the largest so far (or the shard holds nothing). Nothing is reserved: a pull can
    /// wait minutes on a quiet shard. So fan-out's bound is looser than polling's: each
    /// shard may overrun by one event (its first, or one larger than any before).
    fn pull(&mut self, r: &mut Reading<'_>) -> Next {
        let holds_nothing = r.holds_nothing(self.held.is_empty());
        if let Some(feed) = self.feed.as_mut()
            && !feed.pulling
        {
            if pure::may_pull(
                r.outbox.budget().allowance(),
                self.largest_event,
                holds_nothing,
            ) {
                r.health.budget_wait = false;
                feed.pulling = true;
                if feed.pull.try_send(()).is_err() {
                    // The task ended (its last event was an error or the end, still
                    // queued for us): that event says what to do next.
                    feed.pulling = false;
                }
            } else {
                r.health.budget_wait = true;
            }
        }
        Next::Fetch(r.ctx.settings().reader.poll_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::testing::{Rig, STREAM};
    use super::*;
    use crate::backend::StreamClient;
    use crate::settings::Settings;

    /// A rig and a fan-out source over a registered, active consumer.
    async fn rig() -> (Rig, FanOut) {
        rig_with(Duration::ZERO).await
    }

    /// The same with `reader.batch_window` = `window`.
    async fn rig_with(window: Duration) -> (Rig, FanOut) {
        let mut settings = Settings::default();
        settings.reader.max_records = 2;
        settings.reader.batch_window = window;
        let rig = Rig::new(settings).await;
        let summary = rig.streams.describe_stream_summary(STREAM).await.unwrap();
        let consumer = rig
            .streams
            .register_stream_consumer(&summary.arn, "c")
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        rig.beat();
        let fanout = FanOut::new(Arc::from(consumer.arn.as_str()), Instant::now());
        (rig, fanout)
    }

    /// Subscribes, pulls one event and hands it to the source.
    async fn one_event(rig: &mut Rig, fanout: &mut FanOut) -> Next {
        if !fanout.subscribed() {
            tokio::time::advance(Duration::from_secs(1)).await;
            rig.beat();
            let next = fanout.subscribe(&mut rig.reading()).await.unwrap();
            assert!(matches!(next, Next::Fetch(d) if d.is_zero()), "{next:?}");
        }
        fanout.read(&mut rig.reading()).await.unwrap();
        let (generation, event) = rig.feed.recv().await.expect("an event");
        fanout
            .on_event(&mut rig.reading(), generation, event)
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_is_handed_over_in_batches_of_at_most_max_records() {
        let (mut rig, mut fanout) = rig().await;
        rig.put(5).await;
        let mut got = 0;
        for _ in 0..5 {
            one_event(&mut rig, &mut fanout).await;
            got = rig.all_delivered().len();
            if got == 5 {
                break;
            }
        }
        assert_eq!(got, 5, "every record, once");
        assert!(
            rig.out.delivered().iter().all(|b| b.len() <= 2),
            "{:?}",
            rig.out.delivered()
        );
        assert_eq!(rig.out.last(Metric::Subscriptions), Some(1.0));
        assert!(rig.ctx.ports.lags.delivered_total() == 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batching_window_gathers_events_up_to_max_records() {
        let (mut rig, mut fanout) = rig_with(Duration::from_secs(2)).await;
        let sizes = |rig: &Rig| rig.out.delivered().iter().map(Vec::len).collect::<Vec<_>>();
        rig.put(1).await;
        one_event(&mut rig, &mut fanout).await;
        assert!(rig.out.delivered().is_empty(), "gathered");
        assert_eq!(
            *rig.out.window_timers.lock().unwrap(),
            [Duration::from_secs(2)]
        );
        // An event of two: the first fills the batch (max_records 2), the second opens
        // the next window.
        tokio::time::advance(Duration::from_millis(100)).await;
        rig.put(2).await;
        one_event(&mut rig, &mut fanout).await;
        assert_eq!(sizes(&rig), [2]);
        assert_eq!(fanout.held_memory(), 0, "all of the event handed on");
        assert_eq!(rig.out.window_timers.lock().unwrap().len(), 2);
        let first = rig.out.batches.lock().unwrap()[0].fetched_at;
        rig.ack_all();
        // No event more: the window's timer hands the last one over.
        tokio::time::advance(Duration::from_secs(2)).await;
        rig.reading().window_due(0).unwrap();
        assert_eq!(sizes(&rig), [1]);
        let second = rig.out.batches.lock().unwrap()[0].fetched_at;
        assert!(
            second > first,
            "each batch fetched when its first record was"
        );
        assert_eq!(
            rig.ctx.ports.lags.delivered_total(),
            3,
            "every record, once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_event_of_a_cancelled_subscription_is_dropped() {
        let (mut rig, mut fanout) = rig().await;
        rig.put(2).await;
        let next = one_event(&mut rig, &mut fanout).await;
        assert!(!matches!(next, Next::Ended(_)), "{next:?}");
        let before = rig.all_delivered().len();
        let late = Ok(Some(ShardEvent {
            records: Vec::new(),
            continuation: None,
            millis_behind_latest: Some(0),
            child_shards: Vec::new(),
        }));
        let next = fanout.on_event(&mut rig.reading(), 99, late).await.unwrap();
        assert!(matches!(next, Next::Nothing), "{next:?}");
        assert_eq!(rig.all_delivered().len(), before);
        assert!(fanout.subscribed(), "the open subscription is untouched");
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_that_arrives_fenced_cancels_the_subscription_and_nothing_is_lost() {
        let (mut rig, mut fanout) = rig().await;
        tokio::time::advance(Duration::from_secs(1)).await;
        rig.beat();
        fanout.subscribe(&mut rig.reading()).await.unwrap();
        rig.put(3).await;
        let (key, fence) = (rig.ctx.key.clone(), rig.ctx.fence.clone());
        fanout.read(&mut rig.reading()).await.unwrap();
        let (generation, event) = rig.feed.recv().await.expect("an event");
        rig.ctx.ports.fencing.lock().revoke(&key, &fence, "test");
        let next = fanout
            .on_event(&mut rig.reading(), generation, event)
            .await
            .unwrap();
        assert!(matches!(next, Next::Fetch(_)), "{next:?}");
        assert!(!fanout.subscribed(), "cancelled at once");
        assert!(
            rig.out.delivered().is_empty(),
            "nothing handed over while fenced"
        );
        assert_eq!(fanout.held_memory(), 0);

        rig.ctx.ports.fencing.lock().forget(&key, &fence);
        rig.beat();
        rig.ctx
            .ports
            .fencing
            .lock()
            .hold(&key, &fence, Instant::now());
        for _ in 0..5 {
            one_event(&mut rig, &mut fanout).await;
            if rig.all_delivered().len() >= 3 {
                break;
            }
        }
        assert_eq!(
            rig.all_delivered().len(),
            3,
            "the next subscription brings them"
        );
    }
}
