//! The MetricsReporter: one per worker. Every actor sends it batched [`Sample`]s; it keeps
//! running totals for the status snapshot and publishes each interval's statistics to
//! CloudWatch through the [`MetricsSink`] port.
//!
//! * `crate::metrics`: the pure part — what is measured, samples to datums per level,
//!   running totals, the retry backlog, the snapshot. No I/O, no clock.
//! * this file: the thin actor — a timer, and the publish it does each tick.
//!
//! Invariants: at most one publish in flight, and at most one per tick (plus one per
//! [`MetricsMsg::Flush`]), so a worker sends one PutMetricData batch per interval, split
//! only by [`batches`] where the API limits force it. The publish runs in its own task,
//! so a slow or unreachable CloudWatch never holds up `Record` or `Snapshot`. At level
//! `None` the sink is never called.
//!
//! [`Sample`]: crate::metrics_reporter::Sample
//! [`MetricsSink`]: crate::backend::MetricsSink
//! [`MetricsMsg::Flush`]: crate::metrics_reporter::MetricsMsg::Flush
//! [`batches`]: crate::backend::batches

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::{error, warn};

use crate::metrics::Backlog;
// The whole vocabulary a caller of the reporter needs; without `testing` the module is
// the crate's own and only part of it is used here.
#[cfg_attr(not(feature = "testing"), allow(unused_imports))]
pub use crate::metrics::{
    APPLICATION_DIMENSION, Aggregator, Kind, Metric, MetricsSnapshot, RETRY_INTERVALS,
    SHARD_DIMENSION, STREAM_DIMENSION, STREAM_ID_DIMENSION, Sample,
};

use crate::backend::clock::Clock;
use crate::backend::{MetricDatum, MetricsError, MetricsSink, batches};
use crate::settings::{MetricsLevel, MetricsSettings};

/// What the [`MetricsReporter`] is sent.
pub enum MetricsMsg {
    /// Samples from any actor; fire-and-forget. Send one message per batch of records.
    Record(Vec<Sample>),
    /// Totals since start, for the status endpoint.
    Snapshot(RpcReplyPort<MetricsSnapshot>),
    /// Publishes everything pending now (at shutdown). `Ok` carries the number of datums
    /// this publish delivered; `Err` the failure, the datums being kept for a retry.
    Flush(RpcReplyPort<Result<usize, String>>),
    /// The reporter's own messages; other actors cannot make one.
    Internal(Internal),
}

impl fmt::Debug for MetricsMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsMsg::Record(samples) => write!(f, "Record({} samples)", samples.len()),
            MetricsMsg::Snapshot(_) => f.write_str("Snapshot"),
            MetricsMsg::Flush(_) => f.write_str("Flush"),
            MetricsMsg::Internal(internal) => internal.fmt(f),
        }
    }
}

/// Opaque, so only the reporter can arm its timer or report a publish to itself.
#[derive(Debug)]
pub struct Internal(InternalMsg);

#[derive(Debug)]
enum InternalMsg {
    Tick,
    Published(Published),
}

/// What a publish task reports back.
#[derive(Debug, Default)]
struct Published {
    calls: u64,
    sent: usize,
    /// Not delivered, to be retried: the failed call's datums and every one after it.
    unsent: Vec<MetricDatum>,
    /// Refused as invalid: retrying would fail the same way.
    refused: usize,
    error: Option<MetricsError>,
    flushes: Vec<RpcReplyPort<Result<usize, String>>>,
}

/// What a [`MetricsReporter`] is started with.
pub struct MetricsArgs {
    /// Where each interval's datums are published (CloudWatch, or an in-memory sink in tests).
    pub sink: Arc<dyn MetricsSink>,
    /// `[metrics]`: level, namespace and publish interval.
    pub settings: MetricsSettings,
    /// The application's name: every datum's `Application` dimension.
    pub application: String,
    /// The stream of a single-stream worker (its `StreamName` dimension); `None` for a
    /// worker of several streams, whose datums name each shard's own stream.
    pub stream: Option<String>,
    /// Only for logs: a worker-id dimension would split the fleet's figures into one
    /// metric per worker.
    pub worker_id: String,
    /// The datums' timestamps; follows tokio's clock, so a paused test controls them.
    pub clock: Clock,
}

impl fmt::Debug for MetricsArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsArgs")
            .field("settings", &self.settings)
            .field("application", &self.application)
            .field("stream", &self.stream)
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

/// The metrics actor: one per worker; takes samples, keeps totals, publishes per interval.
#[derive(Debug)]
pub struct MetricsReporter;

/// The reporter's state: the running totals, the datums waiting to be published, and the
/// publish record shown in its [`MetricsSnapshot`]. Opaque.
pub struct MetricsState {
    args: MetricsArgs,
    aggregator: Aggregator,
    backlog: Backlog,
    /// Datums held by the publish task, if one runs.
    in_flight: Option<usize>,
    /// Flushes that arrived while a publish was in flight; served by the next one.
    waiting_flushes: Vec<RpcReplyPort<Result<usize, String>>>,
    published_batches: u64,
    published_datums: u64,
    publish_failures: u64,
    last_error: Option<String>,
    dropped_datums: u64,
}

impl fmt::Debug for MetricsState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsState")
            .field("args", &self.args)
            .field("pending", &self.backlog.len())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Actor for MetricsReporter {
    type Msg = MetricsMsg;
    type State = MetricsState;
    type Arguments = MetricsArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<MetricsMsg>,
        args: MetricsArgs,
    ) -> Result<MetricsState, ActorProcessingErr> {
        if args.settings.interval.is_zero() {
            return Err("metrics.interval must be longer than zero".into());
        }
        Ok(MetricsState {
            args,
            aggregator: Aggregator::new(),
            backlog: Backlog::default(),
            in_flight: None,
            waiting_flushes: Vec::new(),
            published_batches: 0,
            published_datums: 0,
            publish_failures: 0,
            last_error: None,
            dropped_datums: 0,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<MetricsMsg>,
        state: &mut MetricsState,
    ) -> Result<(), ActorProcessingErr> {
        arm_tick(&myself, state.args.settings.interval);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<MetricsMsg>,
        message: MetricsMsg,
        state: &mut MetricsState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            MetricsMsg::Record(samples) => state.aggregator.record_all(samples),
            MetricsMsg::Snapshot(reply) => {
                // The asker may have given up waiting; nothing to do then.
                let _ = reply.send(state.snapshot());
            }
            MetricsMsg::Flush(reply) => {
                state.end_interval();
                if state.in_flight.is_some() {
                    state.waiting_flushes.push(reply);
                } else {
                    state.publish(&myself, vec![reply]);
                }
            }
            MetricsMsg::Internal(Internal(InternalMsg::Tick)) => {
                state.end_interval();
                if state.in_flight.is_none() {
                    state.publish(&myself, Vec::new());
                }
                // Re-armed after the work, so ticks never pile up behind a busy mailbox.
                arm_tick(&myself, state.args.settings.interval);
            }
            MetricsMsg::Internal(Internal(InternalMsg::Published(published))) => {
                state.published(published);
                if !state.waiting_flushes.is_empty() {
                    state.end_interval();
                    let flushes = std::mem::take(&mut state.waiting_flushes);
                    state.publish(&myself, flushes);
                }
            }
        }
        Ok(())
    }
}

fn arm_tick(myself: &ActorRef<MetricsMsg>, interval: Duration) {
    // A failed send means the reporter has stopped; there is nothing left to tick.
    drop(myself.send_after(interval, || {
        MetricsMsg::Internal(Internal(InternalMsg::Tick))
    }));
}

impl MetricsState {
    fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            totals: self.aggregator.totals(),
            per_shard: self.aggregator.per_shard(),
            published_batches: self.published_batches,
            published_datums: self.published_datums,
            publish_failures: self.publish_failures,
            last_error: self.last_error.clone(),
            pending_datums: (self.backlog.len() + self.in_flight.unwrap_or(0)) as u64,
            dropped_datums: self.dropped_datums,
            rejected_samples: self.aggregator.rejected_samples(),
            histograms: self.aggregator.histograms(),
        }
    }

    /// Moves the interval's datums to the backlog, and drops what has waited too long.
    fn end_interval(&mut self) {
        let settings = &self.args.settings;
        let now = self.args.clock.wall();
        let data = self.aggregator.drain(
            settings.level,
            &self.args.application,
            self.args.stream.as_deref(),
            now,
        );
        self.backlog.push_new(data);
        let kept_for = settings.interval.saturating_mul(RETRY_INTERVALS);
        if let Some(cutoff) = now.checked_sub(kept_for) {
            let dropped = self.backlog.expire(cutoff);
            if dropped > 0 {
                self.dropped_datums += dropped as u64;
                warn!(
                    message = "Dropped metrics that could not be published in time.",
                    worker_id = %self.args.worker_id,
                    dropped,
                    kept_for = %humantime::format_duration(kept_for),
                );
            }
        }
    }

    /// Starts a task publishing the whole backlog; `flushes` are answered when it ends.
    fn publish(
        &mut self,
        myself: &ActorRef<MetricsMsg>,
        flushes: Vec<RpcReplyPort<Result<usize, String>>>,
    ) {
        if self.args.settings.level == MetricsLevel::None || self.backlog.is_empty() {
            for reply in flushes {
                let _ = reply.send(Ok(0));
            }
            return;
        }
        let data = self.backlog.take();
        self.in_flight = Some(data.len());
        let sink = self.args.sink.clone();
        let namespace = self.args.settings.namespace.clone();
        let myself = myself.clone();
        tokio::spawn(async move {
            let published = Published {
                flushes,
                ..put_all(sink.as_ref(), &namespace, data).await
            };
            // A stopped reporter has no use for the outcome; its flush callers see the
            // reply port dropped.
            let _ = myself.cast(MetricsMsg::Internal(Internal(InternalMsg::Published(
                published,
            ))));
        });
    }

    fn published(&mut self, published: Published) {
        self.in_flight = None;
        self.published_batches += published.calls;
        self.published_datums += published.sent as u64;
        self.dropped_datums += published.refused as u64;
        let result = match published.error {
            None => Ok(published.sent),
            Some(e) => {
                self.publish_failures += 1;
                self.last_error = Some(e.to_string());
                if published.refused > 0 {
                    error!(
                        message = "CloudWatch refused metrics as invalid; they are dropped.",
                        worker_id = %self.args.worker_id,
                        dropped = published.refused,
                        error = %e,
                    );
                } else {
                    warn!(
                        message = "Publishing metrics failed; they are kept for the next interval.",
                        worker_id = %self.args.worker_id,
                        pending = published.unsent.len(),
                        error = %e,
                    );
                }
                self.backlog.requeue(published.unsent);
                Err(e.to_string())
            }
        };
        for reply in published.flushes {
            let _ = reply.send(result.clone());
        }
    }
}

/// One `put` per [`batches`] chunk, stopping at the first failure so what follows is
/// retried in order. Splitting here rather than leaving it to the sink means a failure
/// re-sends only the chunks CloudWatch did not take.
async fn put_all(sink: &dyn MetricsSink, namespace: &str, data: Vec<MetricDatum>) -> Published {
    let mut out = Published::default();
    let mut chunks = batches(data).into_iter();
    for chunk in chunks.by_ref() {
        let size = chunk.len();
        // A panicking sink must not leave the reporter waiting forever for this task.
        let result = AssertUnwindSafe(sink.put(namespace, chunk.clone()))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                Err(MetricsError::Other {
                    message: "the metrics sink panicked".to_owned(),
                })
            });
        match result {
            Ok(()) => {
                out.calls += 1;
                out.sent += size;
            }
            Err(e) => {
                if matches!(e, MetricsError::Invalid { .. }) {
                    out.refused = size;
                } else {
                    out.unsent = chunk;
                }
                out.error = Some(e);
                break;
            }
        }
    }
    out.unsent.extend(chunks.flatten());
    out
}
