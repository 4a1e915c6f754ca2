//! What both kinds of read (polling, fan-out) do with an answer, over the reader's parts
//! borrowed for the step: fencing before delivery, the health of the reads, the stall,
//! and the delivery itself (the outbox makes the batch; this sends it and counts it).
//! A read step ends by saying what the reader does next ([`Next`]); the actor shell
//! turns that into messages to itself.

use std::time::{Duration, SystemTime};

use ractor::{ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::{error, info};

use super::context::Ctx;
use super::health::{FenceNews, ReadHealth};
use super::outbox::{Outbox, ReadFacts};
use super::pure::{self, Phase};
use super::stall::{StallNews, StallWatch};
use crate::backend::{ChildShard, Record, StreamError};
use crate::protocol::{Batch, ProcessorMsg};
use crate::telemetry::{
    Call, CallFailed, DeliveryPaused, DeliveryResumed, Metric, Sample, ShardStalled, ShardUnstalled,
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
    pub phase: Phase,
    pub outbox: &'a mut Outbox,
    pub health: &'a mut ReadHealth,
    pub stall: &'a mut StallWatch,
    pub processor: Option<&'a ActorRef<ProcessorMsg>>,
}

impl Reading<'_> {
    /// Whether this shard may hand records to its processor now (self-fencing); says
    /// each change of verdict once.
    pub fn may_deliver(&mut self) -> bool {
        may_deliver(self.ctx, self.health)
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
        self.ctx.report(samples);
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
        self.ctx.ports.telemetry.emit(CallFailed {
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
    /// the ledger (nothing read is held back undelivered).
    pub fn feed_dropped(&mut self) {
        self.ctx.ports.lags.subscribed(&self.ctx.key, None);
        self.outbox.settle(0);
    }

    pub fn note_stall(&mut self) {
        note_stall(self.ctx, self.stall, self.phase);
    }

    /// Hands a read's records over ([`Outbox::deliver`]) and counts them; `held` is what
    /// a fan-out event still holds, settled with the budget.
    pub fn deliver(
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
            held,
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
            ctx.report(samples);
            ctx.ports
                .lags
                .delivered(&ctx.key, delivery.records, delivery.bytes);
        }
        send_batch(ctx, self.processor, delivery.batch)
    }
}

/// Whether this shard may deliver now (see [`Reading::may_deliver`]).
pub(super) fn may_deliver(ctx: &Ctx, health: &mut ReadHealth) -> bool {
    let (may, news) = health.fencing(ctx.ports.fencing.check(&ctx.key, &ctx.fence));
    match news {
        Some(FenceNews::Resumed(was)) => ctx.ports.telemetry.emit(DeliveryResumed {
            shard: &ctx.shard,
            was: &was,
        }),
        Some(FenceNews::Paused(reason)) => ctx.ports.telemetry.emit(DeliveryPaused {
            shard: &ctx.shard,
            reason: &reason,
        }),
        None => {}
    }
    may
}

/// Looks at the stall and says what changed ([`StallWatch::note`]).
pub(super) fn note_stall(ctx: &Ctx, stall: &mut StallWatch, phase: Phase) {
    let now = Instant::now();
    let settings = ctx.settings();
    let reason = stall.reason(
        phase,
        ctx.ports.wait.get(),
        settings.reader.processor_timeout,
        now,
    );
    match stall.note(phase, reason, now, settings.metrics.interval) {
        StallNews::Started(reason) => ctx.ports.telemetry.emit(ShardStalled {
            key: &ctx.key,
            reason: &reason,
        }),
        StallNews::Ended(stalled_for) => ctx.ports.telemetry.emit(ShardUnstalled {
            key: &ctx.key,
            stalled_for,
        }),
        StallNews::GaugeOff => {
            ctx.report(vec![Sample::shard(Metric::ShardsStalled, &ctx.key, 0.0)]);
        }
        StallNews::GaugeOn => {
            ctx.report(vec![Sample::shard(Metric::ShardsStalled, &ctx.key, 1.0)]);
        }
        StallNews::Nothing => {}
    }
}

pub(super) fn send_batch(
    ctx: &Ctx,
    processor: Option<&ActorRef<ProcessorMsg>>,
    batch: Batch,
) -> Result<(), ActorProcessingErr> {
    if let Some(processor) = processor {
        processor.cast(ProcessorMsg::Process(batch, ctx.checkpointer()))?;
    }
    Ok(())
}
