//! Snapshots of a worker's state, as `Worker::status()` returns them and the status
//! endpoint serves them. Plain data: no credentials, no endpoints with secrets.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::checkpoint_writer::CheckpointView;
use crate::lease_keeper::{KeeperStatus, ReleaseReport};
use crate::metrics_reporter::MetricsSnapshot;
use crate::model::ShardId;
use crate::shard_reader::ShardShutdown;
use crate::stream_watcher::WatcherStatus;

/// Where a held shard is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    Initializing,
    /// Waiting for its parents to reach SHARD_END (per-key order across reshards).
    BlockedOnParent,
    Processing,
    /// Reading, and the last read found nothing new: at the tip of the shard.
    CaughtUp,
    /// Reading, and the last read was throttled: backing off.
    Throttled,
    /// Delivery paused: this worker's heartbeat has not been confirmed recently.
    Fenced,
    /// Read to its end; waiting for the last acks and the SHARD_END checkpoint.
    ShardEnding,
    ShuttingDown,
    /// Finishing its batch and checkpoint before passing the lease to the worker that
    /// asked for it.
    HandingOff,
    LeaseLost,
    /// Failed; restarting after a backoff.
    Restarting,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardStatus {
    pub shard_id: ShardId,
    pub state: ShardState,
    /// The lease epoch this worker holds the shard under.
    pub lease_counter: u64,
    /// The last position handed to the checkpoint writer.
    pub checkpoint: Option<String>,
    pub last_delivered: Option<String>,
    pub millis_behind_latest: Option<u64>,
    pub records_delivered: u64,
    pub bytes_delivered: u64,
    pub records_per_second: f64,
    pub bytes_per_second: f64,
    /// The last failed call (throttling, an expired iterator, a transient error).
    pub last_error: Option<String>,
    pub in_flight_records: u64,
    pub in_flight_bytes: u64,
    /// Restarts of this shard's reader and processor on this worker.
    pub restarts: u32,
    /// Why delivery is paused (state `fenced`): the heartbeat is not confirmed, the
    /// lease awaits a fresh read after a gap, or it was revoked.
    pub fenced: Option<crate::fencing::FenceReason>,
}

/// One of the worker's long-lived actors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoreActorStatus {
    pub name: &'static str,
    /// `running`, `starting`, `stopping`, … as ractor reports it.
    pub state: String,
    pub restarts: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    pub worker_id: String,
    pub application: String,
    pub stream: String,
    /// `running`, `draining` (handing leases over before it stops) or `stopping`.
    pub state: &'static str,
    pub uptime_ms: u64,
    pub shutting_down: bool,
    pub shards: Vec<ShardStatus>,
    /// Restarts of shard readers and processors since the worker started.
    pub shard_restarts: u64,
    pub core: Vec<CoreActorStatus>,
    pub leases: Option<KeeperStatus>,
    pub stream_watcher: Option<WatcherStatus>,
    pub checkpoints: BTreeMap<String, CheckpointView>,
    pub metrics: Option<MetricsSnapshot>,
}

/// What a graceful shutdown achieved. `clean()` is true only when every processor
/// finished, every checkpoint was flushed and every lease released.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShutdownReport {
    pub shards: Vec<ShardShutdown>,
    pub checkpoint_failures: Vec<String>,
    pub leases: ReleaseReport,
    pub errors: Vec<String>,
}

impl ShutdownReport {
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

/// The whole fleet as one worker sees it from its last lease-table scan: every worker
/// that has a heartbeat row or owns a lease, and every lease. Served as `GET /fleet`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FleetView {
    pub application: String,
    pub stream: String,
    /// The worker whose view this is.
    pub observer: String,
    /// Milliseconds since that worker's last scan.
    pub scanned_ms_ago: u64,
    pub workers: Vec<FleetWorker>,
    pub leases: Vec<FleetLease>,
    /// Processable leases with no live owner.
    pub unassigned: Vec<String>,
    /// Leases waiting for a parent to finish.
    pub blocked: Vec<String>,
    /// Leases nobody processes and nobody will until something outside changes, each
    /// as `lease key: reason` (an unreadable row, a shard the stream does not have).
    pub stalled: Vec<String>,
    /// Every row that could not be read (lease rows among them, also in `stalled`).
    pub malformed_rows: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetWorker {
    pub worker_id: String,
    /// Its heartbeat moved within the failover time, on the observer's clock.
    pub alive: bool,
    pub draining: bool,
    /// False for an owner that never wrote a heartbeat row.
    pub has_heartbeat: bool,
    /// Leases it owns in the table (not finished).
    pub leases: u64,
    /// Records per second it delivered, from its heartbeat.
    pub records_per_second: u64,
    /// How long its heartbeat has stood still.
    pub silent_ms: u64,
}

/// A lease's place in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetLeaseState {
    /// Owned by a live worker.
    Held,
    /// A live worker asked for it; the owner is handing it over.
    HandingOff,
    /// Processable, no live owner: the next scan deals it to someone.
    Unassigned,
    /// Waiting for a parent shard to finish.
    Blocked,
    /// SHARD_END.
    Finished,
    /// Nobody processes it, and nobody will until something outside changes: its row is
    /// unreadable, or its shard is not in the stream. `reason` says which.
    Stalled,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetLease {
    pub lease_key: String,
    pub shard_id: String,
    pub owner: Option<String>,
    pub state: FleetLeaseState,
    /// Why it is stalled (state `stalled`).
    pub reason: Option<String>,
    /// `None` when the row is unreadable.
    pub checkpoint: Option<String>,
    pub counter: Option<u64>,
    pub handoff_to: Option<String>,
    pub parents: Vec<String>,
    pub children: Vec<String>,
    /// The owner's last reported MillisBehindLatest for it (from its heartbeat).
    pub millis_behind_latest: Option<u64>,
}

/// MillisBehindLatest of the shards this worker reads, written by readers as they
/// fetch and read by the lease keeper for its heartbeat: the fleet page shows every
/// shard's lag from the table alone.
#[derive(Debug, Clone, Default)]
pub(crate) struct LagBoard(Arc<Mutex<BTreeMap<String, u64>>>);

impl LagBoard {
    pub fn set(&self, shard: &ShardId, millis: u64) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(shard.as_str().to_owned(), millis);
        }
    }

    pub fn remove(&self, shard: &ShardId) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(shard.as_str());
        }
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// The shards of the stream's last complete listing, and when it was requested: the
/// lease keeper tells orphan rows (shards the stream does not have) from new ones.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardListing {
    pub shards: std::collections::BTreeSet<ShardId>,
    pub sent: tokio::time::Instant,
}

/// The stream watcher's last listing, read by the lease keeper.
pub(crate) type ListingBoard = Arc<tokio::sync::watch::Sender<Option<Arc<ShardListing>>>>;

/// The keeper's latest fleet view and when its scan was taken.
pub(crate) type FleetBoard =
    Arc<tokio::sync::watch::Sender<Option<Arc<(FleetView, tokio::time::Instant)>>>>;
