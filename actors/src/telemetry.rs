//! Telemetry as types (after vector's `internal_events`): one struct per event, whose
//! [`Event::log`] writes the log line and [`Event::samples`] the metric, and
//! [`Telemetry::emit`] does both, so the two cannot drift apart. An actor reaches the
//! metrics reporter only through [`Telemetry`]: it imports this module, not the
//! reporter's.
//!
//! Per-batch events (records processed, lag) count without a log line: at thousands of
//! batches a second a line each would be the bottleneck. Everything that is news (a
//! lease moving, a shard failing, a checkpoint refused, delivery paused) logs.

use std::fmt::Display;
use std::time::Duration;

use ractor::ActorRef;
use tracing::{debug, error, info, warn};

use crate::backend::{CallFailure, ChildShard, Classified, LeaseError};
use crate::balance::Gain;
use crate::fencing::FenceReason;
pub(crate) use crate::metrics::{Metric, Sample};
use crate::metrics_reporter::MetricsMsg;
use crate::model::{LeaseKey, ShardId, WorkerId};
use crate::protocol::LeaseMove;

mod failures;
pub(crate) use failures::{DeliveryFailed, DestinationFailed, RecordsDiscarded};
mod scaling;
pub(crate) use scaling::ScaleRecommended;

/// Something that happened, with its log line and its samples.
pub(crate) trait Event {
    /// Writes the event's log line (if it has one).
    fn log(&self);
    /// What it counts (nothing, for an event that is only news).
    fn samples(&self) -> Vec<Sample> {
        Vec::new()
    }
}

/// The metrics reporter as the actors see it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Telemetry(ActorRef<MetricsMsg>);

impl Telemetry {
    pub(crate) fn new(reporter: ActorRef<MetricsMsg>) -> Self {
        Self(reporter)
    }

    /// Logs the event and counts it: one call, so a site cannot do one and forget the
    /// other.
    pub(crate) fn emit(&self, event: impl Event) {
        self.emit_dyn(&event);
    }

    /// [`Telemetry::emit`] for an event behind a reference, for the ports a part sees
    /// its peers through (the reader's `Out`, the keeper's `Outbox`).
    pub(crate) fn emit_dyn(&self, event: &dyn Event) {
        event.log();
        self.record(event.samples());
    }

    /// Gauges and counts that are not events (held leases, lag): no log line.
    pub(crate) fn record(&self, samples: Vec<Sample>) {
        if !samples.is_empty() {
            let _ = self.0.cast(MetricsMsg::Record(samples));
        }
    }
}

/// The AWS calls whose failures are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    GetRecords,
    GetShardIterator,
    SubscribeToShard,
    ListShards,
    Heartbeat,
    Checkpoint,
}

impl Call {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Call::GetRecords => "GetRecords",
            Call::GetShardIterator => "GetShardIterator",
            Call::SubscribeToShard => "SubscribeToShard",
            Call::ListShards => "ListShards",
            Call::Heartbeat => "heartbeat",
            Call::Checkpoint => "checkpoint",
        }
    }
}

/// An AWS call failed. The one rule for "throttle or API error" is
/// [`Classified::call_failure`] (through [`Metric::failed_call`]); every call site
/// emits this event, so no site can count it differently. The DEBUG line is per
/// failure; what a run of failures means (a stall) is the site's own WARN or ERROR.
pub(crate) struct CallFailed<'a, E> {
    pub call: Call,
    /// The lease of the shard the call was for, when it was for one.
    pub shard: Option<&'a LeaseKey>,
    pub error: &'a E,
}

impl<E: Classified + Display> Event for CallFailed<'_, E> {
    fn log(&self) {
        let kind = match self.error.call_failure() {
            CallFailure::Throttled => "throttled",
            CallFailure::Failed => "failed",
        };
        debug!(
            message = "AWS call failed.",
            call = self.call.as_str(),
            kind,
            lease_key = self.shard.map(|s| s.as_str()),
            error = %self.error,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        let metric = Metric::failed_call(self.error);
        vec![match self.shard {
            Some(shard) => Sample::shard(metric, shard, 1.0),
            None => Sample::new(metric, 1.0),
        }]
    }
}

/// `lease.java_compat`: a held lease was renewed (its counter bumped) so Java workers
/// see it alive. Counted: the write cost of running beside a Java fleet.
pub(crate) struct LeaseRenewed<'a> {
    pub key: &'a LeaseKey,
    /// The row's counter now (flotilla's own fence stays the one the lease was taken with).
    pub counter: u64,
}

impl Event for LeaseRenewed<'_> {
    fn log(&self) {
        debug!(message = "Lease renewed.", lease_key = %self.key, counter = self.counter);
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::new(Metric::LeaseRenewals, 1.0)]
    }
}

/// `lease.java_compat`: a renewal was refused, or a lost renewal's row showed another
/// owner: the lease is revoked on the fencing board at once; the keeper's next scan
/// counts it lost.
pub(crate) struct LeaseRenewalRefused<'a> {
    pub key: &'a LeaseKey,
    pub owner: Option<&'a WorkerId>,
}

impl Event for LeaseRenewalRefused<'_> {
    fn log(&self) {
        warn!(
            message = "Lease renewal refused: the lease has another owner; delivery stops.",
            lease_key = %self.key,
            owner = self.owner.map(|o| o.as_str()),
        );
    }
}

/// `lease.java_compat`: a renewal failed or went unanswered (it may have landed: the
/// row is read before the lease's next write).
pub(crate) struct LeaseRenewalFailed<'a> {
    pub key: &'a LeaseKey,
    pub error: &'a LeaseError,
}

impl Event for LeaseRenewalFailed<'_> {
    fn log(&self) {
        warn!(message = "Lease renewal failed.", lease_key = %self.key, error = %self.error);
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(
            Metric::failed_call(self.error),
            self.key,
            1.0,
        )]
    }
}

/// A lease came to this worker.
pub(crate) struct LeaseGained<'a> {
    pub key: &'a LeaseKey,
    pub counter: u64,
    pub from: Option<&'a WorkerId>,
    pub to: &'a WorkerId,
    pub why: Gain,
}

impl Event for LeaseGained<'_> {
    fn log(&self) {
        info!(
            message = "Lease moved.",
            event = "lease_moved",
            reason = self.why.as_str(),
            lease_key = %self.key,
            from = self.from.map(|o| o.as_str()).unwrap_or("nobody"),
            to = %self.to,
            counter = self.counter,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        let mut samples = vec![Sample::new(Metric::LeasesTaken, 1.0)];
        match self.why {
            Gain::Expired => samples.push(Sample::new(Metric::LeasesExpired, 1.0)),
            Gain::HandedOff => samples.push(Sample::new(Metric::LeasesStolen, 1.0)),
            Gain::New | Gain::Released | Gain::Resumed => {}
        }
        samples
    }
}

/// A lease left this worker.
pub(crate) struct LeaseGiven<'a> {
    pub key: &'a LeaseKey,
    pub from: &'a WorkerId,
    pub to: Option<&'a WorkerId>,
    pub why: LeaseMove,
}

impl Event for LeaseGiven<'_> {
    fn log(&self) {
        info!(
            message = "Lease moved.",
            event = "lease_moved",
            reason = self.why.as_str(),
            lease_key = %self.key,
            from = %self.from,
            to = self.to.map(|w| w.as_str()).unwrap_or("nobody"),
        );
    }

    fn samples(&self) -> Vec<Sample> {
        let metric = match self.why {
            LeaseMove::HandedOff => Metric::LeasesHandedOff,
            LeaseMove::Released => Metric::LeasesReleased,
            LeaseMove::ShardEnded => Metric::LeasesEnded,
            LeaseMove::Lost | LeaseMove::Unreadable => Metric::LeasesLost,
        };
        vec![Sample::new(metric, 1.0)]
    }
}

/// A shard reached SHARD_END and its checkpoint says so (the lease's move is
/// [`LeaseGiven`] with `ShardEnded`, counted there).
pub(crate) struct ShardEnded<'a> {
    pub key: &'a LeaseKey,
    /// The children the last GetRecords named; `None` when the server named none.
    pub children: Option<&'a [ChildShard]>,
}

impl Event for ShardEnded<'_> {
    fn log(&self) {
        info!(
            message = "Shard finished.",
            lease_key = %self.key,
            children = ?self.children.map(|c| c.iter().map(|c| c.id.to_string()).collect::<Vec<_>>()),
        );
    }
}

/// What the supervisor does about a failed shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recovery {
    Restart {
        attempt: u32,
        delay: Duration,
    },
    /// Failed too often: the lease is released and the shard cools down.
    GiveUp {
        restarts_in_window: u32,
    },
}

/// A shard's reader failed.
pub(crate) struct ShardFailed<'a> {
    pub key: &'a LeaseKey,
    pub error: &'a str,
    pub recovery: Recovery,
}

impl Event for ShardFailed<'_> {
    fn log(&self) {
        match self.recovery {
            Recovery::Restart { attempt, delay } => warn!(
                message = "Shard failed; restarting from its last checkpoint.",
                lease_key = %self.key,
                error = %self.error,
                attempt,
                delay_ms = delay.as_millis() as u64,
            ),
            Recovery::GiveUp { restarts_in_window } => error!(
                message = "Shard failed too often; releasing its lease and cooling down.",
                lease_key = %self.key,
                error = %self.error,
                restarts_in_window,
            ),
        }
    }

    fn samples(&self) -> Vec<Sample> {
        // A failed reader says nothing more: whatever stall it had ended with it.
        vec![
            Sample::shard(Metric::ActorRestarts, self.key, 1.0),
            Sample::shard(Metric::ShardsStalled, self.key, 0.0),
        ]
    }
}

/// A held shard stalled: its processor waits past its stall time, or it cannot be read.
/// An ERROR when it starts (an INFO when it ends, [`ShardUnstalled`]); the gauge is 1
/// meanwhile.
pub(crate) struct ShardStalled<'a> {
    pub key: &'a LeaseKey,
    pub reason: &'a str,
}

impl Event for ShardStalled<'_> {
    fn log(&self) {
        error!(
            message = "Shard stalled: held and not processed.",
            lease_key = %self.key,
            reason = %self.reason,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(Metric::ShardsStalled, self.key, 1.0)]
    }
}

/// A stalled shard is processed again (its processor answered, its subscription opened,
/// its reads answer).
pub(crate) struct ShardUnstalled<'a> {
    pub key: &'a LeaseKey,
    pub stalled_for: Duration,
}

impl Event for ShardUnstalled<'_> {
    fn log(&self) {
        info!(
            message = "Shard no longer stalled.",
            lease_key = %self.key,
            stalled_ms = self.stalled_for.as_millis() as u64,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(Metric::ShardsStalled, self.key, 0.0)]
    }
}

/// One of the worker's core actors failed.
pub(crate) struct CoreActorFailed<'a> {
    pub actor: &'static str,
    pub error: &'a str,
    /// Past the restart intensity: the worker stops.
    pub giving_up: bool,
}

impl Event for CoreActorFailed<'_> {
    fn log(&self) {
        if self.giving_up {
            error!(message = "Worker stopping: a core actor keeps failing.", actor = self.actor, error = %self.error);
        } else {
            warn!(message = "Core actor failed; restarting the worker's actors.", actor = self.actor, error = %self.error);
        }
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::new(Metric::ActorRestarts, 1.0)]
    }
}

/// A checkpoint was written.
pub(crate) struct CheckpointWritten<'a> {
    pub key: &'a LeaseKey,
    pub at: &'a dyn Display,
    /// How long the conditional write took.
    pub took: Duration,
}

impl Event for CheckpointWritten<'_> {
    fn log(&self) {
        debug!(message = "Checkpoint written.", lease_key = %self.key, checkpoint = %self.at);
    }

    fn samples(&self) -> Vec<Sample> {
        vec![
            Sample::shard(Metric::CheckpointWrites, self.key, 1.0),
            Sample::shard(
                Metric::CheckpointWriteTime,
                self.key,
                self.took.as_secs_f64() * 1000.0,
            ),
        ]
    }
}

/// A checkpoint write was refused: the lease has another owner or epoch.
pub(crate) struct CheckpointRefused<'a> {
    pub key: &'a LeaseKey,
    /// The owner the row names, when it names one.
    pub owner: Option<&'a WorkerId>,
}

impl Event for CheckpointRefused<'_> {
    fn log(&self) {
        warn!(
            message = "Checkpoint refused: the lease has another owner or epoch.",
            lease_key = %self.key,
            owner = ?self.owner,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(Metric::CheckpointFailures, self.key, 1.0)]
    }
}

/// Self-fencing paused a shard's delivery (logged once per change of reason; the fleet
/// count of fenced shards is the keeper's gauge).
pub(crate) struct DeliveryPaused<'a> {
    pub shard: &'a ShardId,
    pub reason: &'a FenceReason,
}

impl Event for DeliveryPaused<'_> {
    fn log(&self) {
        warn!(message = "Delivery paused (self-fencing).", shard_id = %self.shard, reason = %self.reason);
    }
}

/// Self-fencing let a shard deliver again.
pub(crate) struct DeliveryResumed<'a> {
    pub shard: &'a ShardId,
    pub was: &'a FenceReason,
}

impl Event for DeliveryResumed<'_> {
    fn log(&self) {
        info!(message = "Delivery resumed.", shard_id = %self.shard, was_fenced_because = %self.was);
    }
}

/// Records of a read matched no `processor.filter` pattern: acked without a call (per
/// batch: counted, not logged).
pub(crate) struct RecordsFiltered<'a> {
    pub shard: &'a LeaseKey,
    pub records: usize,
}

impl Event for RecordsFiltered<'_> {
    fn log(&self) {}

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(
            Metric::RecordsFiltered,
            self.shard,
            self.records as f64,
        )]
    }
}

/// Acks moved a shard's processed prefix (per batch: counted, not logged).
pub(crate) struct RecordsProcessed<'a> {
    /// The shard's lease (which names its stream when the worker reads several).
    pub shard: &'a LeaseKey,
    /// Records and bytes of the batches the prefix passed entirely.
    pub records: u64,
    pub bytes: u64,
    /// For a batch ack: from delivery to ack.
    pub processing_time: Option<Duration>,
}

impl Event for RecordsProcessed<'_> {
    fn log(&self) {}

    fn samples(&self) -> Vec<Sample> {
        let mut samples = Vec::new();
        if let Some(took) = self.processing_time {
            let millis = took.as_secs_f64() * 1000.0;
            samples.push(Sample::shard(Metric::ProcessingTime, self.shard, millis));
        }
        if self.records > 0 {
            samples.push(Sample::shard(
                Metric::RecordsProcessed,
                self.shard,
                self.records as f64,
            ));
            samples.push(Sample::shard(
                Metric::BytesProcessed,
                self.shard,
                self.bytes as f64,
            ));
        }
        samples
    }
}

/// A shard's checkpoint is past the stream's retention: the changes between it and the
/// oldest one kept are lost. Always an ERROR and a count, whether the reader stops
/// there or goes on from TRIM_HORIZON (`reader.trimmed_checkpoint`).
pub(crate) struct CheckpointTrimmed<'a> {
    /// The shard's lease (which names its stream when the worker reads several).
    pub shard: &'a LeaseKey,
    /// Where reading was to resume: the last record delivered, or the checkpoint.
    pub from: &'a str,
    /// The oldest change the shard still keeps, and when it was made, as far as known.
    pub oldest_kept: &'a str,
    pub going_on: bool,
}

impl Event for CheckpointTrimmed<'_> {
    fn log(&self) {
        let action = if self.going_on {
            "going on from the oldest change kept (reader.trimmed_checkpoint = \"trim_horizon\")"
        } else {
            "the shard is not read until an operator decides: flotilla rewind, or \
             reader.trimmed_checkpoint = \"trim_horizon\""
        };
        error!(
            message = "Shard's checkpoint is past the stream's retention: the changes after it up to the oldest one kept are lost.",
            lease_key = %self.shard,
            from = self.from,
            oldest_kept = self.oldest_kept,
            action,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(Metric::TrimmedCheckpoints, self.shard, 1.0)]
    }
}

/// The stream-set source failed, or gave a list that was refused: the last good set is
/// kept. ERROR at each failure: a source that fails for good must not go unnoticed.
pub(crate) struct StreamSetRefused<'a> {
    pub error: &'a str,
}

impl Event for StreamSetRefused<'_> {
    fn log(&self) {
        error!(
            message = "Stream set not updated; keeping the last good set.",
            error = self.error
        );
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::new(Metric::StreamSetErrors, 1.0)]
    }
}

/// Streams joined or left the set (or were found deleted).
pub(crate) struct StreamSetChanged<'a> {
    pub added: &'a [String],
    pub former: &'a [String],
}

impl Event for StreamSetChanged<'_> {
    fn log(&self) {
        info!(
            message = "Stream set changed.",
            added = ?self.added,
            former = ?self.former,
        );
    }
}

/// A stream of the set could not be described (it may not exist yet); asked again at
/// every sync. Logged when it starts or its error changes.
pub(crate) struct StreamUnresolved<'a> {
    pub stream: &'a str,
    pub error: &'a str,
}

impl Event for StreamUnresolved<'_> {
    fn log(&self) {
        error!(
            message =
                "Stream of the set cannot be described; not read, asked again at every shard sync.",
            stream = self.stream,
            error = self.error,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{LeaseError, StreamError};

    fn metrics(samples: Vec<Sample>) -> Vec<Metric> {
        samples.into_iter().map(|s| s.metric).collect()
    }

    /// The one throttle rule: every call's failure is counted by the error's
    /// classification, whichever call and whichever port it came from.
    #[test]
    fn every_call_counts_failures_by_the_one_rule() {
        let shard = LeaseKey::from(&ShardId::from_index(1));
        let throttled_stream = StreamError::Throttled {
            op: "GetRecords",
            message: "slow down".into(),
        };
        let failed_stream = StreamError::Transient {
            op: "GetRecords",
            endpoint: "local".into(),
            message: "500".into(),
        };
        let throttled_table = LeaseError::Throttled {
            op: "UpdateItem",
            message: "slow down".into(),
        };
        let failed_table = LeaseError::Transient {
            op: "UpdateItem",
            endpoint: "local".into(),
            message: "500".into(),
        };
        for call in [Call::GetRecords, Call::GetShardIterator, Call::ListShards] {
            for shard in [None, Some(&shard)] {
                let got = |error| metrics(CallFailed { call, shard, error }.samples());
                assert_eq!(got(&throttled_stream), [Metric::Throttles], "{call:?}");
                assert_eq!(got(&failed_stream), [Metric::ApiErrors], "{call:?}");
            }
        }
        for call in [Call::Heartbeat, Call::Checkpoint] {
            let got = |error| {
                metrics(
                    CallFailed {
                        call,
                        shard: None,
                        error,
                    }
                    .samples(),
                )
            };
            assert_eq!(got(&throttled_table), [Metric::Throttles], "{call:?}");
            assert_eq!(got(&failed_table), [Metric::ApiErrors], "{call:?}");
        }
    }

    #[test]
    fn lease_moves_count_by_their_reason() {
        let key = LeaseKey::from(&ShardId::from_index(0));
        let me = WorkerId::new("me");
        let gained = [
            (Gain::New, vec![Metric::LeasesTaken]),
            (Gain::Released, vec![Metric::LeasesTaken]),
            (Gain::Resumed, vec![Metric::LeasesTaken]),
            (
                Gain::Expired,
                vec![Metric::LeasesTaken, Metric::LeasesExpired],
            ),
            (
                Gain::HandedOff,
                vec![Metric::LeasesTaken, Metric::LeasesStolen],
            ),
        ];
        for (why, want) in gained {
            let event = LeaseGained {
                key: &key,
                counter: 1,
                from: None,
                to: &me,
                why,
            };
            assert_eq!(metrics(event.samples()), want, "{why:?}");
        }
        let given = [
            (LeaseMove::HandedOff, Metric::LeasesHandedOff),
            (LeaseMove::Released, Metric::LeasesReleased),
            (LeaseMove::ShardEnded, Metric::LeasesEnded),
            (LeaseMove::Lost, Metric::LeasesLost),
            (LeaseMove::Unreadable, Metric::LeasesLost),
        ];
        for (why, want) in given {
            let event = LeaseGiven {
                key: &key,
                from: &me,
                to: None,
                why,
            };
            assert_eq!(metrics(event.samples()), [want], "{why:?}");
        }
    }

    #[test]
    fn processed_records_count_only_what_the_prefix_passed() {
        let shard = LeaseKey::from(&ShardId::from_index(0));
        let event = |records, took| RecordsProcessed {
            shard: &shard,
            records,
            bytes: records * 10,
            processing_time: took,
        };
        assert!(event(0, None).samples().is_empty());
        assert_eq!(
            metrics(event(0, Some(Duration::from_millis(5))).samples()),
            [Metric::ProcessingTime]
        );
        assert_eq!(
            metrics(event(3, None).samples()),
            [Metric::RecordsProcessed, Metric::BytesProcessed]
        );
    }

    /// A written checkpoint counts once and samples how long its write took (the
    /// `flotilla_checkpoint_write_time_milliseconds` histogram), in milliseconds.
    #[test]
    fn a_written_checkpoint_counts_and_times_its_write() {
        let key = LeaseKey::from(&ShardId::from_index(0));
        let event = CheckpointWritten {
            key: &key,
            at: &"49590338271490256608559692538361571095921575989136588898",
            took: Duration::from_micros(2_500),
        };
        let samples = event.samples();
        assert_eq!(
            metrics(samples.clone()),
            [Metric::CheckpointWrites, Metric::CheckpointWriteTime]
        );
        assert_eq!(samples[1].value, 2.5);
        assert_eq!(samples[1].shard.as_ref(), Some(&key));
    }
}
