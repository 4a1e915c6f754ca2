//! What both kinds of read (polling, fan-out) do with an answer, over the reader's parts
//! borrowed for the step: fencing before delivery, the health of the reads, the stall,
//! and the delivery itself (the outbox makes the batch; this sends it and counts it).
//! A read step ends by saying what the reader does next ([`Next`]); the actor shell
//! turns that into messages to itself. With `reader.batch_window`, what a read brings
//! is gathered first ([`Gather`]), and handed over when the gather says.

use std::time::{Duration, SystemTime};

use ractor::ActorProcessingErr;
use tokio::time::Instant;
use tracing::{error, info};

use super::context::{Ctx, Out};
use super::gather::{Gather, Gathered};
use super::health::{FenceNews, ReadHealth};
use super::outbox::{Outbox, ReadFacts};
use super::pure::{self, Phase};
use super::stall::{StallNews, StallWatch};
use crate::backend::{ChildShard, Record, StreamError};
use crate::telemetry::{
    Call, CallFailed, DeliveryPaused, DeliveryResumed, Metric, RecordsFiltered, Sample,
    ShardStalled, ShardUnstalled,
};

/// What the reader does after a read step.
#[derive(Debug)]
pub(super) enum Next {
    Nothing,
    /// Fetch again after this long (at once for zero).
    Fetch(Duration),
    /// Get a new iterator (or subscription) now.
    Acquire,
    AcquireAfter(Duration),
    /// The shard is read to its end; its children, if the read named them.
    Ended(Option<Vec<ChildShard>>),
}

/// The reader's parts a read step works on, borrowed for the step.
pub(super) struct Reading<'a> {
    pub ctx: &'a Ctx,
    /// The processor, the reader's mailbox and the metrics, as the step sees them.
    pub out: &'a dyn Out,
    pub phase: Phase,
    pub outbox: &'a mut Outbox,
    pub health: &'a mut ReadHealth,
    pub stall: &'a mut StallWatch,
    /// What reads brought and the batching window holds back.
    pub gather: &'a mut Gather,
}

impl Reading<'_> {
    /// Whether this shard may hand records to its processor now (self-fencing); says
    /// each change of verdict once.
    pub fn may_deliver(&mut self) -> bool {
        may_deliver(self.ctx, self.out, self.health)
    }

    /// A call on the stream answered: ends a run of failures.
    pub fn answered(&mut self) {
        self.readable();
        if let Some(after_failures) = self.health.answered() {
            info!(message = "Shard read again.", shard_id = %self.ctx.shard, after_failures);
        }
    }

    /// A read answered: its lag, and for a GetRecords how long the call took (in the
    /// lag's message: no message more per read).
    pub fn read_ok(
        &mut self,
        empty: bool,
        millis_behind_latest: Option<u64>,
        took: Option<Duration>,
    ) {
        self.health.read_ok(empty, millis_behind_latest);
        let key = &self.ctx.key;
        let mut samples = Vec::with_capacity(2);
        if let Some(millis) = millis_behind_latest {
            self.ctx.ports.lags.set(key, millis);
            samples.push(Sample::shard(
                Metric::MillisBehindLatest,
                key,
                millis as f64,
            ));
        }
        if let Some(took) = took {
            let millis = took.as_secs_f64() * 1000.0;
            samples.push(Sample::shard(Metric::GetRecordsTime, key, millis));
        }
        self.out.record(samples);
    }

    /// A stream call failed: counted, said (an ERROR every so many in a row: a shard
    /// that cannot be read is a stall, said once, not at every retry).
    pub fn count_failure(&mut self, call: Call, error: &StreamError) {
        let failures_in_row = self.health.failed(error, Instant::now());
        if failures_in_row >= pure::STALL_REPORT_EVERY {
            self.unreadable(format!(
                "cannot be read: {} failed {failures_in_row} times in a row: {error}",
                call.as_str(),
            ));
        }
        if pure::stall_report_due(failures_in_row) {
            error!(
                message = "Shard not read: its calls keep failing; retrying with backoff.",
                shard_id = %self.ctx.shard,
                failures_in_row,
                %error,
            );
        }
        self.out.emit(&CallFailed {
            call,
            shard: Some(&self.ctx.key),
            error,
        });
        // A stall that lasts is sampled again each metrics interval.
        self.note_stall();
    }

    /// The shard cannot be read, for `why`: the first reason of a run is kept.
    pub fn unreadable(&mut self, why: String) {
        if self.stall.unreadable(why) {
            self.note_stall();
        }
    }

    /// A read or a subscription succeeded: the shard can be read again.
    pub fn readable(&mut self) {
        if self.stall.readable() {
            self.note_stall();
        }
    }

    /// No subscription is open (any more): none is shown, and the budget holds only
    /// the ledger and what is gathered (no event's records are held back).
    pub fn feed_dropped(&mut self) {
        self.ctx.ports.lags.subscribed(&self.ctx.key, None);
        self.settle(0);
    }

    /// Tells the budget what the shard holds: the ledger, what is gathered and `held`
    /// (a fan-out event's records not yet handed on) ([`Outbox::settle`]).
    pub fn settle(&mut self, held: u64) {
        self.outbox.settle(held + self.gather.memory());
    }

    /// Nothing of this shard is in memory ([`Outbox::holds_nothing`]); `held_nothing`:
    /// the source holds no record either.
    pub fn holds_nothing(&self, held_nothing: bool) -> bool {
        self.outbox
            .holds_nothing(held_nothing && self.gather.is_empty())
    }

    /// The batching window's timer: hands what is gathered over once the window has
    /// passed (an earlier window's timer finds nothing due). While the shard may not
    /// deliver, looks again a poll interval later. `held`: as [`Self::deliver`].
    pub fn window_due(&mut self, held: u64) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        if self.phase != Phase::Reading || !self.gather.due(now) {
            return Ok(());
        }
        if !self.may_deliver() {
            let poll = self.ctx.settings().reader.poll_interval;
            self.out.window_due_after(poll);
            return Ok(());
        }
        let Some((records, fetched_at)) = self.gather.take_due(now) else {
            return Ok(());
        };
        let facts = ReadFacts {
            fetched_at,
            end: None,
        };
        self.hand_over(records, facts, held)
    }

    pub fn note_stall(&mut self) {
        note_stall(self.ctx, self.out, self.stall, self.phase);
    }

    /// Hands a read's records over, or gathers them for a later batch
    /// ([`Gather::add`]: `reader.batch_window`); `held` is what a fan-out event still
    /// holds, settled with the budget.
    pub fn deliver(
        &mut self,
        raw: Vec<Record>,
        facts: ReadFacts<'_>,
        held: u64,
    ) -> Result<(), ActorProcessingErr> {
        let (max, now) = (self.ctx.settings().reader.max_records, Instant::now());
        let at_end = facts.end.is_some();
        match self.gather.add(raw, facts.fetched_at, at_end, max, now) {
            Gathered::Kept { arm } => {
                if let Some(after) = arm {
                    self.out.window_due_after(after);
                }
                self.settle(held);
                Ok(())
            }
            Gathered::Deliver {
                records,
                fetched_at,
            } => {
                let facts = ReadFacts {
                    fetched_at,
                    end: facts.end,
                };
                self.hand_over(records, facts, held)
            }
        }
    }

    /// Hands records over ([`Outbox::deliver`]) and counts them.
    fn hand_over(
        &mut self,
        raw: Vec<Record>,
        facts: ReadFacts<'_>,
        held: u64,
    ) -> Result<(), ActorProcessingErr> {
        let ctx = self.ctx;
        let Some(delivery) = self.outbox.deliver(
            raw,
            facts,
            ctx.settings().reader.call_on_empty,
            self.health.millis_behind(),
            held + self.gather.memory(),
            Instant::now(),
        ) else {
            return Ok(());
        };
        if delivery.records > 0 {
            // Put → delivery, from the first (oldest) record's arrival: wall clocks,
            // ours and the stream's, so a skewed clock reads as 0 rather than as a
            // negative wait. In the budget's message: no message more per batch.
            let mut samples = vec![Sample::new(
                Metric::BudgetBytesInUse,
                self.outbox.budget().usage().in_use as f64,
            )];
            if let Some(arrival) = delivery.first_arrival {
                let waited = SystemTime::now()
                    .duration_since(arrival)
                    .unwrap_or_default();
                samples.push(Sample::shard(
                    Metric::PutToDeliveryTime,
                    &ctx.key,
                    waited.as_secs_f64() * 1000.0,
                ));
            }
            self.out.record(samples);
            ctx.ports
                .lags
                .delivered(&ctx.key, delivery.records, delivery.bytes);
        }
        let calls = delivery.calls();
        if !delivery.filtered.is_empty() {
            self.out.emit(&RecordsFiltered {
                shard: &ctx.key,
                records: delivery.filtered.len(),
            });
            self.out.skip(delivery.filtered);
        }
        if calls {
            self.out.process(delivery.batch)?;
        }
        Ok(())
    }
}

/// Whether this shard may deliver now (see [`Reading::may_deliver`]).
pub(super) fn may_deliver(ctx: &Ctx, out: &dyn Out, health: &mut ReadHealth) -> bool {
    let (may, news) = health.fencing(ctx.ports.fencing.check(&ctx.key, &ctx.fence));
    match news {
        Some(FenceNews::Resumed(was)) => out.emit(&DeliveryResumed {
            shard: &ctx.shard,
            was: &was,
        }),
        Some(FenceNews::Paused(reason)) => out.emit(&DeliveryPaused {
            shard: &ctx.shard,
            reason: &reason,
        }),
        None => {}
    }
    may
}

/// Looks at the stall and says what changed ([`StallWatch::note`]).
pub(super) fn note_stall(ctx: &Ctx, out: &dyn Out, stall: &mut StallWatch, phase: Phase) {
    let now = Instant::now();
    let settings = ctx.settings();
    let reason = stall.reason(
        phase,
        ctx.ports.wait.get(),
        settings.reader.processor_timeout,
        now,
    );
    match stall.note(phase, reason, now, settings.metrics.interval) {
        StallNews::Started(reason) => out.emit(&ShardStalled {
            key: &ctx.key,
            reason: &reason,
        }),
        StallNews::Ended(stalled_for) => out.emit(&ShardUnstalled {
            key: &ctx.key,
            stalled_for,
        }),
        StallNews::GaugeOff => {
            out.record(vec![Sample::shard(Metric::ShardsStalled, &ctx.key, 0.0)]);
        }
        StallNews::GaugeOn => {
            out.record(vec![Sample::shard(Metric::ShardsStalled, &ctx.key, 1.0)]);
        }
        StallNews::Nothing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::testing::Rig;
    use super::*;
    use crate::settings::Settings;

    fn throttled() -> StreamError {
        StreamError::Throttled {
            op: "GetRecords",
            message: "slow down".into(),
        }
    }

    fn events(rig: &Rig) -> u32 {
        *rig.out.events.lock().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_the_fencing_verdict_is_said_once() {
        let mut rig = Rig::new(Settings::default()).await;
        let (key, fence) = (rig.ctx.key.clone(), rig.ctx.fence.clone());
        assert!(rig.reading().may_deliver());
        assert_eq!(events(&rig), 0, "no news while delivering");
        rig.ctx.ports.fencing.lock().revoke(&key, &fence, "test");
        assert!(!rig.reading().may_deliver());
        assert!(!rig.reading().may_deliver());
        assert_eq!(events(&rig), 1, "paused: said once");
        let now = Instant::now();
        rig.ctx.ports.fencing.lock().forget(&key, &fence);
        rig.ctx.ports.fencing.lock().hold(&key, &fence, now);
        assert!(rig.reading().may_deliver());
        assert!(rig.reading().may_deliver());
        assert_eq!(events(&rig), 2, "resumed: said once");
    }

    #[tokio::test(start_paused = true)]
    async fn failing_reads_stall_the_shard_with_the_reason_and_an_answer_ends_it() {
        let mut rig = Rig::new(Settings::default()).await;
        for _ in 1..pure::STALL_REPORT_EVERY {
            rig.reading().count_failure(Call::GetRecords, &throttled());
        }
        assert_eq!(rig.out.last(Metric::ShardsStalled), None, "not yet a stall");
        rig.reading().count_failure(Call::GetRecords, &throttled());
        assert_eq!(rig.out.last(Metric::ShardsStalled), Some(1.0));
        let reason = rig
            .stall
            .reason(
                Phase::Reading,
                None,
                Duration::from_secs(60),
                Instant::now(),
            )
            .expect("stalled");
        assert!(
            reason.starts_with("cannot be read: GetRecords failed 20 times in a row"),
            "{reason}"
        );
        // More failures keep the first reason of the run, and say nothing new.
        let said = events(&rig);
        rig.reading().count_failure(Call::GetRecords, &throttled());
        assert_eq!(events(&rig), said + 1, "only the failure itself is counted");
        rig.reading().answered();
        assert_eq!(
            rig.out.last(Metric::ShardsStalled),
            Some(0.0),
            "the stall ended"
        );
        assert_eq!(rig.health.failures_in_row(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_counts_what_it_hands_over_and_an_empty_read_hands_nothing() {
        let mut settings = Settings::default();
        settings.reader.call_on_empty = false;
        let mut rig = Rig::new(settings).await;
        let facts = || ReadFacts {
            fetched_at: Instant::now(),
            end: None,
        };
        rig.reading().deliver(Vec::new(), facts(), 0).unwrap();
        assert!(
            rig.out.delivered().is_empty(),
            "no empty batch unless asked for"
        );
        rig.put(2).await;
        let iterator = rig
            .ctx
            .ports
            .streams
            .get_shard_iterator(
                &rig.ctx.stream,
                &rig.ctx.shard,
                &crate::backend::IteratorPosition::TrimHorizon,
            )
            .await
            .unwrap();
        let read = rig
            .ctx
            .ports
            .streams
            .get_records(&iterator, 10)
            .await
            .unwrap();
        rig.reading().deliver(read.records, facts(), 0).unwrap();
        assert_eq!(
            rig.out.delivered().iter().map(Vec::len).collect::<Vec<_>>(),
            [2]
        );
        assert_eq!(rig.ctx.ports.lags.delivered_total(), 2);
        assert!(rig.out.last(Metric::BudgetBytesInUse).unwrap() > 0.0);
    }
}
