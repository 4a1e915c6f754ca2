//! Snapshots of a worker's state, as `Worker::status()` returns them and the status
//! endpoint serves them. Plain data: no credentials, no endpoints with secrets. Every
//! actor's snapshot type lives here, below the actors, so this module imports none.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::balance::Peer;
// The metrics part of a `WorkerStatus`, nameable here now that the reporter that fills
// it is not public API.
pub use crate::metrics::{Histogram, HistogramSnapshot, Metric, MetricsSnapshot};
use crate::model::ShardId;

mod fleet;
mod scaling;
#[cfg(feature = "status-server")]
pub(crate) use fleet::overlay_own_shards;
pub use fleet::{FleetLease, FleetLeaseState, FleetView, FleetWorker};
pub(crate) use fleet::{FleetScan, fleet_view};
pub use scaling::FleetScaling;
#[cfg(feature = "status-server")]
pub(crate) use scaling::overlay_scaling;

/// Where a held shard is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    /// Just started: checking its parents and starting its processor; nothing read yet.
    Initializing,
    /// Waiting for its parents to reach SHARD_END (per-key order across reshards).
    BlockedOnParent,
    /// Reading and delivering batches to its processor.
    Processing,
    /// Reading, and the last read found nothing new: at the tip of the shard.
    CaughtUp,
    /// Reading, and the last read was throttled: backing off.
    Throttled,
    /// Reading, and holding its share of the worker's memory budget
    /// (`reader.worker_budget_bytes`): it reads more once its processor acks, or once
    /// others free room. Back-pressure, not a stall: a processor that acks nothing for
    /// `reader.processor_timeout` fails the shard as a stalled processor.
    WaitingOnBudget,
    /// Delivery paused: this worker's heartbeat has not been confirmed recently.
    Fenced,
    /// Held and not processed, and it will not be until something changes: its
    /// processor waits past its stall time (a MultiLang child that does not answer), or
    /// the shard cannot be read (a subscription refused, reads failing in a row).
    /// `stall` says which.
    Stalled,
    /// Read to its end; waiting for the last acks and the SHARD_END checkpoint.
    ShardEnding,
    /// The worker is stopping: the processor's `shutdown_requested` runs, then the
    /// shard's checkpoint is flushed.
    ShuttingDown,
    /// Finishing its batch and checkpoint before passing the lease to the worker that
    /// asked for it.
    HandingOff,
    /// Another worker owns the lease now (or a write under it was refused): the
    /// processor is told `lease_lost` and the reader stops, without checkpointing.
    LeaseLost,
    /// Failed; restarting after a backoff.
    Restarting,
}

/// One held shard, as its reader reports it (a reader that does not answer within 2 s
/// shows as `restarting`, its counters 0).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardStatus {
    /// The shard's id within its stream.
    pub shard_id: ShardId,
    /// The shard's stream when the worker reads several (`worker.streams`); `None` for
    /// the one stream of `worker.stream`, named once in `WorkerStatus::stream`.
    pub stream: Option<String>,
    /// Where the shard is in its life.
    pub state: ShardState,
    /// The lease epoch this worker holds the shard under.
    pub lease_counter: u64,
    /// The last position handed to the checkpoint writer.
    pub checkpoint: Option<String>,
    /// The position of the last record handed to the processor, as `sequence/sub`;
    /// `None` before the first.
    pub last_delivered: Option<String>,
    /// MillisBehindLatest of the shard's last read: how far behind the stream's tip, in
    /// ms; `None` before the first read.
    pub millis_behind_latest: Option<u64>,
    /// Records handed to the processor by this reader (counted afresh after a restart).
    pub records_delivered: u64,
    /// Bytes (data and partition key) of those records.
    pub bytes_delivered: u64,
    /// Records delivered per second, over about the last second.
    pub records_per_second: f64,
    /// Bytes delivered per second, over about the last second.
    pub bytes_per_second: f64,
    /// The last failed call (throttling, an expired iterator, a transient error).
    pub last_error: Option<String>,
    /// How long ago `last_error` happened: an old error is history, a fresh one news.
    pub last_error_ms_ago: Option<u64>,
    /// Records delivered to the processor and not acked yet.
    pub in_flight_records: u64,
    /// Bytes of the batches with a record not acked yet (a partly acked batch counts in
    /// full).
    pub in_flight_bytes: u64,
    /// What the shard holds of the worker's memory budget: the in-memory size of its
    /// records not yet passed by the checkpoint watermark (and of a fan-out event's
    /// records not yet delivered).
    pub memory_bytes: u64,
    /// Restarts of this shard's reader and processor on this worker.
    pub restarts: u32,
    /// Why delivery is paused (state `fenced`): the heartbeat is not confirmed, the
    /// lease awaits a fresh read after a gap, or it was revoked.
    pub fenced: Option<crate::fencing::FenceReason>,
    /// Why the shard is stalled (state `stalled`, or a stalled shard that is fenced or
    /// ending): `the MultiLang child has not answered processRecords for 31 s`,
    /// `cannot subscribe: SubscribeToShard: …`.
    pub stall: Option<String>,
    /// The shard's enhanced fan-out subscription (fan-out mode only).
    pub subscription: Option<SubscriptionView>,
    /// Records this reader wrote to `failure.destination` and skipped (counted afresh
    /// after a restart; the metrics keep the total).
    #[serde(default)]
    pub records_discarded: u64,
    /// The processor's last failure under `[failure]`: the record and the error.
    #[serde(default)]
    pub last_failure: Option<String>,
    /// Each lane's records not yet done, with `processor.parallelism` above 1 (empty
    /// with one lane): the checkpoint waits for the slowest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneLag>,
}

/// One lane of a shard (`processor.parallelism`): what it has been handed and not yet
/// finished. The shard's checkpoint cannot pass a lane's oldest pending record, so a
/// lane far behind the others is the one holding the checkpoint (and the reader's
/// window) back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaneLag {
    /// The lane, from 0.
    pub lane: usize,
    /// Records handed to the lane and not yet acked (in manual mode: not yet
    /// checkpointed past by the lane).
    pub pending_records: u64,
    /// How long ago the oldest of them was delivered; `None` when none is pending.
    pub oldest_pending_ms: Option<u64>,
}

/// A shard's fan-out subscription, for the status page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriptionView {
    /// `open` (events flow), or `none` between two subscriptions (backing off after a
    /// failure, waiting out the once-a-second limit, fenced, or at the shard's end).
    pub state: &'static str,
    /// How long the open subscription has lasted (Kinesis ends each after 5 minutes).
    pub age_ms: Option<u64>,
    /// Events received over the open subscription.
    pub events: u64,
    /// Subscriptions this reader has made for the shard.
    pub subscriptions: u64,
}

/// One of the worker's long-lived actors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoreActorStatus {
    /// `stream_watcher`, `lease_keeper`, `checkpoint_writer`, `metrics_reporter` or
    /// `status_server`.
    pub name: &'static str,
    /// `running`, `starting`, `stopping`, … as ractor reports it.
    pub state: String,
    /// Restarts of the core, whose actors restart together (so all show one count);
    /// always 0 for the status server, which restarts alone.
    pub restarts: u32,
}

/// A whole worker's snapshot: what [`Worker::status`](crate::Worker::status) returns and
/// `GET /status` serves. A core actor that does not answer within 2 s leaves its part
/// empty.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    /// This worker's id (`worker.worker_id`, or the generated `host-xxxxxxxx`).
    pub worker_id: String,
    /// The application name, which is also the lease table's name.
    pub application: String,
    /// The stream read (a table's stream by its ARN); with several streams, the names
    /// the worker started with, joined by commas.
    pub stream: String,
    /// What `stream` is: `kinesis` or `dynamodb-streams` (a table's change stream).
    pub source: &'static str,
    /// How the worker reads: `polling` or `fanout`.
    pub read_mode: &'static str,
    /// `running`, `draining` (handing leases over before it stops) or `stopping`.
    pub state: &'static str,
    /// Milliseconds since the worker's supervisor started.
    pub uptime_ms: u64,
    /// The shutdown is past its drain: shards are being stopped (state `stopping`).
    pub shutting_down: bool,
    /// Each shard this worker holds (one whose reader is restarting included).
    pub shards: Vec<ShardStatus>,
    /// Restarts of shard readers and processors since the worker started.
    pub shard_restarts: u64,
    /// The supervisor's long-lived actors, then the status server when enabled.
    pub core: Vec<CoreActorStatus>,
    /// The lease keeper's view; `None` if it did not answer in time.
    pub leases: Option<KeeperStatus>,
    /// The stream watcher's view; `None` if it did not answer in time.
    pub stream_watcher: Option<WatcherStatus>,
    /// The checkpoint writer's view of each shard, by lease key; empty if it did not
    /// answer in time.
    pub checkpoints: BTreeMap<String, CheckpointView>,
    /// The metrics reporter's running figures; `None` if it did not answer in time.
    pub metrics: Option<MetricsSnapshot>,
    /// The worker's memory budget for un-acked records.
    pub budget: BudgetView,
}

/// The worker's memory budget (`reader.worker_budget_bytes`), for the status page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetView {
    /// The whole budget, in bytes.
    pub total_bytes: u64,
    /// Held by the shards' un-acked records, and reserved by reads on their way.
    pub in_use_bytes: u64,
    /// What each shard is guaranteed now: the budget over the shards that hold a place.
    pub share_bytes: u64,
    /// Readers holding a place in the budget (one per shard being read).
    pub shards: usize,
    /// Shards in state `waiting_on_budget`.
    pub shards_waiting: usize,
    /// The most ever in use at once since the worker started.
    pub peak_bytes: u64,
}

/// What a graceful shutdown achieved. `clean()` is true only when every processor
/// finished, every checkpoint was flushed and every lease released.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShutdownReport {
    /// How each shard's processor and final checkpoint fared (handed-off shards too), by
    /// shard id.
    pub shards: Vec<ShardShutdown>,
    /// Checkpoints the final flush of every shard could not write, one line each.
    pub checkpoint_failures: Vec<String>,
    /// Which leases were handed over, released, or could not be let go.
    pub leases: ReleaseReport,
    /// Anything else that failed: a core actor that did not answer or stop in time.
    pub errors: Vec<String>,
}

impl ShutdownReport {
    /// Whether the shutdown lost nothing: no error, no checkpoint failure, no lease left
    /// unreleased, and every shard's processor and flush succeeded.
    pub fn clean(&self) -> bool {
        self.errors.is_empty()
            && self.checkpoint_failures.is_empty()
            && self.leases.failed.is_empty()
            && self
                .shards
                .iter()
                .all(|s| s.processor_ok && s.checkpoint_flushed && s.error.is_none())
    }
}

/// What one shard's graceful stop achieved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ShardShutdown {
    /// The shard that stopped.
    pub shard_id: ShardId,
    /// `shutdown_requested` returned Ok (or the processor had not started).
    pub processor_ok: bool,
    /// The shard's last position was written to the lease table after the processor
    /// finished.
    pub checkpoint_flushed: bool,
    /// What went wrong, if anything: the processor's error, the flush's, or why the
    /// shard's reader could not be asked.
    pub error: Option<String>,
}

/// What leaving the fleet at shutdown achieved.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReleaseReport {
    /// Leases passed to a worker that asked for them, each at its final checkpoint.
    pub handed_off: Vec<String>,
    /// Leases released (owner removed, epoch raised) for any worker to take at once.
    pub released: Vec<String>,
    /// What could not be let go, each as `what: why` (a lease not released, the
    /// heartbeat row not removed); a lease not released waits out the failover time.
    pub failed: Vec<String>,
    /// How the processors of handed-off shards finished.
    #[serde(skip)]
    pub handed_off_shards: Vec<ShardShutdown>,
}

/// The lease keeper's view, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeeperStatus {
    /// The lease keys this worker holds.
    pub held: Vec<String>,
    /// Workers whose heartbeat row moved within the failover time (draining ones too).
    pub live_workers: Vec<String>,
    /// Every worker seen in the table, alive or not, with its last reported load.
    pub peers: Vec<Peer>,
    /// This worker's heartbeat counter as of its last confirmed heartbeat.
    pub heartbeat_counter: u64,
    /// Milliseconds since the last confirmed heartbeat was sent; `None` before the first.
    pub heartbeat_age_ms: Option<u64>,
    /// Heartbeats that failed in a row since the last confirmed one, and the last error.
    pub heartbeat_failures: u32,
    /// The last failed heartbeat's error; `None` since the last confirmed one.
    pub heartbeat_error: Option<String>,
    /// Rows of the last scan that could not be read, each with why.
    pub malformed_rows: Vec<String>,
    /// Leases given up after their shard failed too often, left to other workers until
    /// `supervision.shard_cooldown` has passed.
    pub cooling: Vec<String>,
    /// Requests this worker made that are not answered yet.
    pub requested: Vec<String>,
    /// Held leases being handed over now.
    pub handing_off: Vec<String>,
    /// This worker is draining: handing its leases over before it stops.
    pub draining: bool,
    /// Leases this worker gained, counted by how: `new` (never owned before), `released`
    /// (let go by its last owner), `expired` (its owner died), `handed_off` (given to
    /// this worker on request), `resumed` (already this worker's by name).
    pub gained: BTreeMap<String, u64>,
    /// Leases this worker gave up, counted by why: `handed_off`, `released`,
    /// `shard_ended`, `lost` (taken by another worker or refused a write),
    /// `unreadable` (its row can no longer be read).
    pub given: BTreeMap<String, u64>,
}

/// The watcher's view, for status pages.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct WatcherStatus {
    /// Shards of the last complete listing, over every stream read.
    pub shards: usize,
    /// Of those, the shards still open (not closed by a split or merge).
    pub open_shards: usize,
    /// Lease rows this worker created for new shards since it started.
    pub leases_created: u64,
    /// Rows of finished shards deleted after their children started.
    pub leases_deleted: u64,
    /// Why the last shard sync failed; `None` once one succeeds.
    pub last_error: Option<String>,
    /// Each stream of a multi-stream worker's set: read, former (left the set, its rows
    /// deleted after `worker.former_stream_grace`) or unresolved (listed, not described).
    pub streams: Vec<StreamView>,
    /// The stream-set source's last failure (a failed call or a refused list), while
    /// the last good set is kept; `None` once it answers well again.
    pub stream_set_error: Option<String>,
    /// Failed or refused answers of the stream-set source since the worker started.
    pub stream_set_errors: u64,
}

/// One stream of the set, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamView {
    /// The stream as the set names it (a name, or an ARN).
    pub stream: String,
    /// `active`, `former` or `unresolved`.
    pub state: &'static str,
    /// The KCL's `account:stream:creationEpoch`, once described.
    pub stream_id: Option<String>,
    /// A former stream: how long since it left the set (or was found deleted).
    pub former_for_ms: Option<u64>,
    /// A former stream: how long until its unowned rows are deleted (0: due now).
    pub deletion_in_ms: Option<u64>,
    /// Why it is unresolved, or deleted.
    pub error: Option<String>,
}

impl StreamView {
    /// Every stream of `view`, active first, as of `now`.
    pub(crate) fn all(
        view: &crate::model::StreamSetView<tokio::time::Instant>,
        now: tokio::time::Instant,
        grace: std::time::Duration,
    ) -> Vec<Self> {
        let mut out: Vec<Self> = view
            .active
            .iter()
            .map(|s| Self {
                stream: s.stream.clone(),
                state: "active",
                stream_id: s.id.as_ref().map(|id| id.to_string()),
                former_for_ms: None,
                deletion_in_ms: None,
                error: None,
            })
            .collect();
        out.extend(view.former.iter().map(|f| {
            Self {
                stream: f.stream.stream.clone(),
                state: "former",
                stream_id: f.stream.id.as_ref().map(|id| id.to_string()),
                former_for_ms: Some(now.saturating_duration_since(f.since).as_millis() as u64),
                deletion_in_ms: Some(
                    f.deletion_due(grace)
                        .saturating_duration_since(now)
                        .as_millis() as u64,
                ),
                error: match &f.why {
                    crate::model::FormerWhy::Removed => None,
                    crate::model::FormerWhy::Deleted(why) => Some(why.clone()),
                },
            }
        }));
        out.extend(view.unresolved.iter().map(|u| Self {
            stream: u.stream.clone(),
            state: "unresolved",
            stream_id: None,
            former_for_ms: None,
            deletion_in_ms: None,
            error: Some(u.error.clone()),
        }));
        out
    }
}

/// What the writer knows of one shard, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CheckpointView {
    /// The last position written to the lease table by this worker.
    pub written: Option<String>,
    /// A position waiting for the next write.
    pub pending: Option<String>,
    /// Writes of the shard's row that succeeded (checkpoints and prepared checkpoints).
    pub writes: u64,
}
