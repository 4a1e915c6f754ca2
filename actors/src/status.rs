//! Snapshots of a worker's state, as `Worker::status()` returns them and the status
//! endpoint serves them. Plain data: no credentials, no endpoints with secrets.

use std::collections::BTreeMap;

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
    pub in_flight_records: u64,
    pub in_flight_bytes: u64,
    /// Restarts of this shard's reader and processor on this worker.
    pub restarts: u32,
}

/// One of the worker's long-lived actors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoreActorStatus {
    pub name: &'static str,
    pub restarts: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    pub worker_id: String,
    pub application: String,
    pub stream: String,
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
