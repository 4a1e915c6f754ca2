//! Every tunable of a worker, with its default. `config/default.toml` at the project root
//! repeats each one with a comment; tests in `settings/load.rs` keep the two in step (and
//! the guide's configuration reference, `docs/configuration.md`), so a new field must be
//! documented there.
//!
//! [`Settings::load`] (in `load`) layers the defaults, a TOML file and `FLOTILLA__…`
//! variables, naming the file or variable a bad value came from.
//!
//! Durations are written as text ("10s", "250ms", "5min"), so a file says what it means.
//!
//! Serde checks each value's type; [`Settings::validate`] checks what a type cannot say:
//! ranges AWS imposes, names AWS would reject, and relations between settings (a
//! heartbeat slower than the failover time fences a healthy worker). A worker must not
//! start on settings that fail it.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

mod failure;
mod load;
mod processor;
mod scaling;

pub use failure::{Destination, FailureSettings};
pub use load::{CONFIG_FILE_VAR, LoadError};
pub use processor::{MAX_PARALLELISM, ProcessorSettings};
pub use scaling::ScalingSettings;

/// The longest application name: the lease table's name, whose worker table
/// (`crate::backend::layout::worker_table_name`) adds 16 characters to it within
/// DynamoDB's 255.
pub const MAX_APPLICATION: usize = 255 - crate::backend::layout::WORKER_TABLE_SUFFIX.len();

/// All settings of one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct Settings {
    /// `[worker]`: what to consume, as which application and worker, and where new shards start.
    pub worker: WorkerSettings,
    /// `[lease]`: heartbeats, failover, fencing and how leases are balanced across the fleet.
    pub lease: LeaseSettings,
    /// `[reader]`: how each shard is read, and how far a reader may run ahead of its processor.
    pub reader: ReaderSettings,
    /// `[checkpoint]`: how acked records become checkpoints, and how often they are written.
    pub checkpoint: CheckpointSettings,
    /// `[supervision]`: restarts of failed actors, when to give up on them, and shutdown time.
    pub supervision: SupervisionSettings,
    /// `[metrics]`: what is published to CloudWatch, under which namespace, how often.
    pub metrics: MetricsSettings,
    /// `[status]`: the HTTP status endpoint.
    pub status: StatusSettings,
    /// `[aws]`: region, endpoints, timeouts and retries of the AWS clients.
    pub aws: AwsSettings,
    /// `[failure]`: retries, bisection, a maximum record age and a destination for
    /// records the processor cannot handle.
    pub failure: FailureSettings,
    /// `[processor]`: lanes within a shard (records of one key in order) and record
    /// filters.
    pub processor: ProcessorSettings,
    /// `[scaling]`: what the fleet's recommended worker count is judged against (a
    /// worker's target load, the lag tolerated), for an autoscaler to follow.
    pub scaling: ScalingSettings,
}

/// Where a shard with no checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InitialPosition {
    /// `TRIM_HORIZON`: the oldest record the stream still keeps.
    #[serde(rename = "TRIM_HORIZON")]
    TrimHorizon,
    /// `LATEST`: only records written after the reader first opens the shard.
    #[serde(rename = "LATEST")]
    Latest,
    /// `AT_TIMESTAMP`: the first record that arrived at or after `initial_timestamp`.
    #[serde(rename = "AT_TIMESTAMP")]
    AtTimestamp,
}

/// `[worker]`: the source to consume, the application (and lease table) it is consumed as, this
/// worker's id, and where shards with no checkpoint start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSettings {
    /// The source to consume: a Kinesis stream's name, a DynamoDB table's stream by its
    /// ARN, or `dynamodb:TABLE` for the table's current stream (see [`crate::model::Source`]).
    pub stream: String,
    /// Many streams for one application (instead of `stream`): one fleet and one lease
    /// table for all, keys in the KCL's multi-stream form. Kinesis streams only.
    pub streams: Vec<StreamEntry>,
    /// The application name; also the lease table's name, unless `lease.table` names it.
    pub application: String,
    /// This worker's id in the lease table; a random one when absent.
    pub worker_id: Option<String>,
    /// Where a shard with no checkpoint starts (a shard with one always resumes from it).
    #[serde(deserialize_with = "choice::deserialize")]
    pub initial_position: InitialPosition,
    /// RFC 3339; required when `initial_position` is AT_TIMESTAMP.
    pub initial_timestamp: Option<String>,
    /// How long the rows of a stream that left the set (or was deleted) are kept before
    /// they are deleted: listed again within it, a stream resumes from its checkpoints.
    /// The KCL's `waitPeriodToDeleteFormerStreams`.
    #[serde(with = "duration_text")]
    pub former_stream_grace: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            stream: String::new(),
            streams: Vec::new(),
            application: String::new(),
            worker_id: None,
            initial_position: InitialPosition::TrimHorizon,
            initial_timestamp: None,
            former_stream_grace: Duration::from_secs(3600),
        }
    }
}

/// One stream of `worker.streams`: a name or a Kinesis stream ARN (a stream of another
/// account is named by its ARN), or a table with what differs for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StreamEntry {
    /// A stream's name, or a Kinesis stream ARN; it starts at `worker.initial_position`.
    Name(String),
    /// A stream with its own initial position (`{ name = "...", initial_position = "LATEST" }`).
    Table(StreamTable),
}

/// Text is a name, a table is a [`StreamTable`], read as such: a misspelt key in a table
/// is named with the keys there are (serde's `untagged` would only say that the entry
/// matched no form).
impl<'de> Deserialize<'de> for StreamEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = StreamEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a stream's name or ARN, or a table such as \
                     { name = \"orders\", initial_position = \"LATEST\" }",
                )
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<StreamEntry, E> {
                Ok(StreamEntry::Name(text.to_owned()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<StreamEntry, A::Error> {
                StreamTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(StreamEntry::Table)
            }
        }
        deserializer.deserialize_any(Entry)
    }
}

/// A stream of `worker.streams` with its own settings; what it leaves out is the
/// worker's (`worker.initial_position`, `worker.initial_timestamp`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamTable {
    /// The stream's name or its ARN; `arn = "..."` is the same key spelt for an ARN.
    #[serde(alias = "arn")]
    pub name: String,
    /// Where this stream's shards with no checkpoint start; `None`: `worker.initial_position`.
    #[serde(default, deserialize_with = "choice::optional")]
    pub initial_position: Option<InitialPosition>,
    /// The time for `AT_TIMESTAMP` (RFC 3339, UTC). `None`: the worker's
    /// `initial_timestamp`, but only when the entry sets no `initial_position` either.
    #[serde(default)]
    pub initial_timestamp: Option<String>,
}

/// A stream of `worker.streams` as read: its name, and where its new shards start.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpec {
    /// The stream's name (an ARN's last part).
    pub name: String,
    /// The ARN the entry named the stream by; `None` for a name.
    pub arn: Option<crate::model::StreamArn>,
    /// Where this stream's shards with no checkpoint start (the entry's, else the worker's).
    pub initial_position: InitialPosition,
    /// The start time when `initial_position` is `AT_TIMESTAMP`; `None` otherwise.
    pub initial_timestamp: Option<SystemTime>,
}

/// `[lease]`: how workers prove they are alive (heartbeats), when a silent one's leases may be
/// taken (failover), when a worker stops itself first (fencing), and how leases are balanced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSettings {
    /// The lease table's name; `None`: `worker.application`'s, as the Java KCL names it
    /// by default. Its worker table is named after it (`TABLE-FlotillaWorkers`). For an
    /// application whose table is named otherwise (the KCL's `tableName`).
    pub table: Option<String>,
    /// A worker whose heartbeat has not moved for this long is dead; its leases may be taken.
    #[serde(with = "duration_text")]
    pub failover_time: Duration,
    /// How often this worker bumps its heartbeat and scans the lease table.
    #[serde(with = "duration_text")]
    pub heartbeat_interval: Duration,
    /// A reader stops delivering when the heartbeat has not been written for
    /// `failover_time - fence_margin`, so no other worker can take its lease while it
    /// still processes.
    #[serde(with = "duration_text")]
    pub fence_margin: Duration,
    /// The most leases this worker holds; 0 means no limit beyond its fair share.
    pub max_leases: u32,
    /// The most leases this worker asks live workers to hand over in one round (leases
    /// of dead or draining workers do not count), unless its shortfall is more: then its
    /// whole shortfall when its scan agrees with every peer's heartbeat lease count, else
    /// half of it. Bounds how much moves at once when views of the fleet disagree for a
    /// moment, while a joining worker whose view is current fills its share at once.
    pub max_moves_per_round: u32,
    /// A handoff request the owner has not honoured for this long, although it is
    /// alive, is withdrawn (and logged); the balance is tried again next round.
    #[serde(with = "duration_text")]
    pub handoff_timeout: Duration,
    /// While a handoff is under way, how often the lease row is read (by the requester,
    /// to start as soon as the lease is its own) and the table scanned by a draining
    /// worker (to hand over as soon as someone asks). Sets the handoff gap.
    #[serde(with = "duration_text")]
    pub handoff_poll_interval: Duration,
    /// The longest a worker goes without reading every row of the table. Between such
    /// scans a round reads only the heartbeat rows, and scans when a peer's change
    /// counter moved, a worker joined, left, drained or died, or this worker changed
    /// something; this scan is the safety net for what none of those show (a row edited
    /// by hand, a worker of an older version).
    #[serde(with = "duration_text")]
    pub full_scan_interval: Duration,
    /// A dead worker's heartbeat row is deleted once it has stood still this long (by
    /// one live worker, only while its counter has not moved), so that the rows every
    /// round reads do not grow with every worker that ever ran.
    #[serde(with = "duration_text")]
    pub dead_worker_retention: Duration,
    /// What balance evens out: lease counts only, or throughput as well (bytes/s per
    /// worker, from the per-lease rates every worker publishes in its heartbeat).
    #[serde(deserialize_with = "choice::deserialize")]
    pub balance: BalanceMode,
    /// Throughput balance: a worker more than this many percent above the fleet's mean
    /// bytes/s sheds leases, one more than this below it takes (KCL 3's
    /// `reBalanceThresholdPercentage`). Inside the band nothing moves, which is what
    /// keeps rate noise from moving shards.
    pub balance_threshold_percent: u32,
    /// Throughput balance: the share of a worker's distance from the mean that may move
    /// in one round (KCL 3's `dampeningPercentage`), so the fleet approaches the mean
    /// instead of overshooting while moved leases' rates are re-measured.
    pub balance_dampening_percent: u32,
    /// Throughput balance: how far a worker's lease count may stray from its fair share
    /// (floor or ceil of leases / workers) to even out throughput. Past it, counts are
    /// evened first, as in count-only balance.
    pub balance_count_slack: u32,
    /// Live migration beside a running Java KCL fleet (docs/lease-protocol.md, "Java KCL
    /// workers"): an owner with no heartbeat row is alive while the counters of its
    /// leases move (the KCL's own rule), and this worker bumps the counter of each lease
    /// it holds every `failover_time / 3` so Java workers see its leases alive. Costs one
    /// write per held lease per renewal while on. Off: owners without a heartbeat row
    /// are dead after `failover_time`, and nothing is renewed (a cold cutover).
    pub java_compat: bool,
}

/// What lease balance evens out across the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceMode {
    /// Throughput (bytes/s) within `balance_threshold_percent` of the mean, counts
    /// within `balance_count_slack` of fair shares, and even where throughput does not
    /// tell the workers apart (an idle fleet ends as count balance leaves it). Falls
    /// back to count-only while any member publishes no rates (an older flotilla, or a
    /// count-only worker). The default.
    Throughput,
    /// Lease counts only: everyone holds the floor or ceil of leases / workers.
    Count,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            table: None,
            // Chosen by the soak in BENCHMARKS.md, "Failover defaults": the lowest of
            // 10 s / 2 s, 5 s / 1 s and 4 s / 1 s with no false failover on an
            // oversubscribed host whose workers stall for up to 3 s.
            failover_time: Duration::from_secs(4),
            heartbeat_interval: Duration::from_secs(1),
            fence_margin: Duration::from_secs(1),
            max_leases: 0,
            max_moves_per_round: 10,
            handoff_timeout: Duration::from_secs(10),
            handoff_poll_interval: Duration::from_millis(200),
            full_scan_interval: Duration::from_secs(600),
            dead_worker_retention: Duration::from_secs(3600),
            balance: BalanceMode::Throughput,
            balance_threshold_percent: 10,
            balance_dampening_percent: 60,
            balance_count_slack: 2,
            java_compat: false,
        }
    }
}

/// `[reader]`: how each shard is read (polling or fan-out, call pacing, backoff), how much may
/// be delivered and not yet acked, and when a processor counts as stalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReaderSettings {
    /// How records are read: GetRecords polling, or enhanced fan-out (SubscribeToShard).
    #[serde(deserialize_with = "choice::deserialize")]
    pub mode: ReadMode,
    /// The enhanced fan-out consumer's name; `None`: the application's name (as the
    /// Java KCL names it). Only read in fan-out mode.
    pub consumer_name: Option<String>,
    /// The `Limit` of each GetRecords call (1..=10000).
    pub max_records: u32,
    /// The least time between two GetRecords calls on one shard (Kinesis allows five
    /// per second per shard, shared by every consumer).
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// When a shard is caught up, the pause between calls doubles up to this.
    #[serde(with = "duration_text")]
    pub idle_max: Duration,
    /// Most records delivered to a processor and not yet acked; fetching pauses above it.
    pub window_records: u32,
    /// Most bytes delivered to a processor and not yet acked; fetching pauses above it.
    pub window_bytes: u64,
    /// One memory budget for the un-acked records of all the worker's shards, counted
    /// as their in-memory size (payload, key, sequence number, the structs around them).
    /// Each shard is guaranteed an equal share and may borrow the shares of idle ones; a
    /// shard at its share waits for its acks. See `model::budget`.
    pub worker_budget_bytes: u64,
    /// Backoff bounds after throttling or a transient error.
    #[serde(with = "duration_text")]
    pub backoff_min: Duration,
    /// The longest backoff: each delay is drawn between `backoff_min` and a cap that doubles
    /// per failure from `backoff_min` up to this. Raise both when many workers throttle the
    /// same stream.
    #[serde(with = "duration_text")]
    pub backoff_max: Duration,
    /// A processor that acks nothing for this long while records are pending is stalled
    /// and treated as failed.
    #[serde(with = "duration_text")]
    pub processor_timeout: Duration,
    /// How often a child shard checks whether its parents have reached SHARD_END.
    #[serde(with = "duration_text")]
    pub parent_poll_interval: Duration,
    /// How often the shard list is read (with jitter), to find new shards.
    #[serde(with = "duration_text")]
    pub shard_sync_interval: Duration,
    /// What a reader does when its checkpoint is past the stream's retention (DynamoDB
    /// Streams keeps 24 hours): the changes between the checkpoint and the oldest one
    /// kept are gone either way.
    #[serde(deserialize_with = "choice::deserialize")]
    pub trimmed_checkpoint: TrimmedCheckpoint,
    /// Call `process` with an empty batch when a read brings no records (the Java KCL's
    /// `callProcessRecordsEvenForEmptyRecordList`), so a processor that flushes on time
    /// is called on an idle shard too. At most one empty call waits for the processor
    /// at a time; an empty call never moves a checkpoint.
    pub call_on_empty: bool,
    /// How long a reader may gather records before calling the processor (AWS Lambda's
    /// `MaximumBatchingWindowInSeconds`), for processors that pay per call: the records
    /// reads bring are handed over as one batch once they reach `max_records` (counted
    /// as read, a KPL aggregate as one), once this has passed since the first of them was
    /// read, or when the shard ends. Zero (the default) hands each read over at once. At
    /// most [`MAX_BATCH_WINDOW`].
    #[serde(with = "duration_text")]
    pub batch_window: Duration,
}

/// The longest `reader.batch_window`: Lambda's `MaximumBatchingWindowInSeconds` is at
/// most 300.
pub const MAX_BATCH_WINDOW: Duration = Duration::from_secs(300);

/// What to do about a checkpoint past the stream's retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrimmedCheckpoint {
    /// Stop reading the shard, with an error that names it and the lost window; the
    /// shard shows as failing until an operator decides (`flotilla rewind`, or this
    /// setting).
    Fail,
    /// Say so at ERROR, count it (`TrimmedCheckpoints`), and go on from the oldest
    /// change still kept (TRIM_HORIZON).
    TrimHorizon,
}

impl Default for ReaderSettings {
    fn default() -> Self {
        Self {
            mode: ReadMode::Polling,
            consumer_name: None,
            max_records: 10_000,
            poll_interval: Duration::from_millis(200),
            idle_max: Duration::from_secs(1),
            window_records: 50_000,
            window_bytes: 64 * 1024 * 1024,
            worker_budget_bytes: 256 * 1024 * 1024,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            processor_timeout: Duration::from_secs(300),
            parent_poll_interval: Duration::from_secs(1),
            shard_sync_interval: Duration::from_secs(60),
            trimmed_checkpoint: TrimmedCheckpoint::Fail,
            call_on_empty: false,
            batch_window: Duration::ZERO,
        }
    }
}

/// How a reader gets records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadMode {
    /// GetRecords calls: 5 per second and 2 MB/s per shard, shared by every polling
    /// application of the stream. No extra cost.
    Polling,
    /// Enhanced fan-out: a registered consumer gets its own 2 MB/s per shard, pushed
    /// over HTTP/2 (SubscribeToShard). Billed per consumer-shard-hour and per GB.
    Fanout,
}

impl ReadMode {
    /// The name used in files (`reader.mode = "polling"`) and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Polling => "polling",
            Self::Fanout => "fanout",
        }
    }
}

/// How records become checkpointed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMode {
    /// A batch is acked when `process` returns `Ok`.
    Auto,
    /// The processor checkpoints itself, at a record or a sequence number.
    Manual,
    /// The processor acks records in any order; the checkpoint follows the contiguous
    /// acked prefix.
    Watermark,
}

/// The checkpoint-mode rules, each one exhaustive `match`: a new mode is a compile error
/// here, not a silent "behaves as auto" at a site that compared with `==`.
impl CheckpointMode {
    /// Whether the processor host acks a whole batch when `process` returns `Ok`. In
    /// watermark mode the processor acks records itself, in any order.
    pub(crate) fn host_acks_each_batch(self) -> bool {
        match self {
            CheckpointMode::Auto | CheckpointMode::Manual => true,
            CheckpointMode::Watermark => false,
        }
    }

    /// Whether the shard reader moves the checkpoint along the acked prefix. In manual
    /// mode only the processor's own checkpoint calls write it.
    pub(crate) fn reader_checkpoints_acked_prefix(self) -> bool {
        match self {
            CheckpointMode::Auto | CheckpointMode::Watermark => true,
            CheckpointMode::Manual => false,
        }
    }
}

/// `[checkpoint]`: how records become checkpointed, and how often a shard's checkpoint is written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSettings {
    /// How records become checkpointed: per batch (`auto`), by the processor itself
    /// (`manual`), or along the acked prefix (`watermark`).
    #[serde(deserialize_with = "choice::deserialize")]
    pub mode: CheckpointMode,
    /// A shard's checkpoint is written at once when none was written in the last
    /// interval, then at most once per interval; SHARD_END, shutdown and handoff flush
    /// at once.
    #[serde(with = "duration_text")]
    pub interval: Duration,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        Self {
            mode: CheckpointMode::Auto,
            interval: Duration::from_secs(5),
        }
    }
}

/// `[supervision]`: how failed shard readers, processors and core actors are restarted, when
/// restarting is given up, and how long a graceful shutdown may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionSettings {
    /// Backoff bounds between restarts of a failed shard reader or processor.
    #[serde(with = "duration_text")]
    pub restart_backoff_min: Duration,
    /// The longest backoff between restarts: each delay is drawn between
    /// `restart_backoff_min` and a cap that doubles per restart up to this.
    #[serde(with = "duration_text")]
    pub restart_backoff_max: Duration,
    /// More than this many restarts of one shard within `shard_restart_window` releases
    /// the shard's lease and cools it down locally.
    pub shard_max_restarts: u32,
    /// The window in which restarts of one shard are counted against `shard_max_restarts`.
    #[serde(with = "duration_text")]
    pub shard_restart_window: Duration,
    /// How long a given-up shard is left alone by this worker.
    #[serde(with = "duration_text")]
    pub shard_cooldown: Duration,
    /// More than this many restarts of a core actor within `core_restart_window` stops
    /// the worker with an error.
    pub core_max_restarts: u32,
    /// The window in which restarts of core actors are counted against `core_max_restarts`.
    #[serde(with = "duration_text")]
    pub core_restart_window: Duration,
    /// How long each step of a graceful shutdown may take (processors finishing their
    /// batch and checkpointing, the handoffs in flight) before leases are released
    /// anyway. Keep the whole stop below the platform's kill timeout.
    #[serde(with = "duration_text")]
    pub shutdown_timeout: Duration,
}

impl Default for SupervisionSettings {
    fn default() -> Self {
        Self {
            restart_backoff_min: Duration::from_millis(100),
            restart_backoff_max: Duration::from_secs(30),
            shard_max_restarts: 5,
            shard_restart_window: Duration::from_secs(60),
            shard_cooldown: Duration::from_secs(60),
            core_max_restarts: 3,
            core_restart_window: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// How much goes to CloudWatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsLevel {
    /// Nothing is published (the numbers still feed the status endpoint).
    None,
    /// Per application and stream.
    Summary,
    /// Per shard as well.
    Detailed,
}

/// `[metrics]`: what the worker publishes to CloudWatch, under which namespace, how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// How much is published; anything but `none` needs the `cloudwatch` feature.
    #[serde(deserialize_with = "choice::deserialize")]
    pub level: MetricsLevel,
    /// The CloudWatch namespace every metric is filed under; must not start with `AWS/`.
    pub namespace: String,
    /// One PutMetricData batch per interval (split only where the API limits force it).
    #[serde(with = "duration_text")]
    pub interval: Duration,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            level: MetricsLevel::Summary,
            namespace: "flotilla".to_owned(),
            interval: Duration::from_secs(60),
        }
    }
}

/// `[status]`: the read-only HTTP status endpoint (needs the `status-server` feature).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusSettings {
    /// Serve the read-only status endpoint (`/status`, `/fleet`, `/fleet.html`,
    /// `/healthz`, `/readyz`, `/metrics`).
    pub enabled: bool,
    /// Where it listens. Loopback unless you mean otherwise: it is read-only and shows
    /// nothing secret, but it is not meant for the internet. Port 0 picks a free port
    /// (`Worker::status_addr` tells which).
    pub bind: String,
}

impl Default for StatusSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1:9797".to_owned(),
        }
    }
}

impl StatusSettings {
    fn validate(&self) -> Result<(), SettingsError> {
        if self.enabled && self.bind.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "status.bind",
                quoted(&self.bind),
                "must be an IP address and port, e.g. \"127.0.0.1:9797\" or \"0.0.0.0:9797\"",
            ));
        }
        Ok(())
    }
}

/// Where the AWS backend goes, and how long its calls may take. `Backend::aws(&settings.aws)`
/// builds the backend from these, so the worker and its backend agree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AwsSettings {
    /// The region; the default chain's when absent.
    pub region: Option<String>,
    /// Endpoint URLs for local servers; AWS when absent.
    pub kinesis_endpoint: Option<String>,
    /// Endpoint URL of the lease table's DynamoDB (e.g. DynamoDB Local); AWS's when absent.
    pub dynamodb_endpoint: Option<String>,
    /// Endpoint URL for CloudWatch metrics; AWS's when absent.
    pub cloudwatch_endpoint: Option<String>,
    /// Endpoint URL for SQS, where `failure.destination = "sqs:QUEUE_URL"` sends
    /// discarded records (e.g. a local emulator, or a VPC endpoint); AWS's when absent.
    /// The requests go here whatever host the queue's URL names.
    pub sqs_endpoint: Option<String>,
    /// How long one Kinesis (or DynamoDB Streams) call may take, every attempt included.
    /// The KCL's 30 s. A fan-out subscription is bounded by it until its first answer
    /// only; the events that follow are not (they last up to five minutes by design).
    /// It bounds the dead-letter destination's calls too (PutRecords to a `kinesis:`
    /// one, SendMessageBatch to an `sqs:` one): they are few, and a setting of their own
    /// would be one more to get right for no gain.
    #[serde(with = "duration_text")]
    pub kinesis_timeout: Duration,
    /// How long one DynamoDB (lease table) call may take, every attempt included. The
    /// KCL's one minute.
    #[serde(with = "duration_text")]
    pub dynamodb_timeout: Duration,
    /// How long one CloudWatch PutMetricData may take, every attempt included.
    #[serde(with = "duration_text")]
    pub cloudwatch_timeout: Duration,
    /// How long one attempt of any call may take before it is abandoned and retried
    /// (within the call's timeout). Unset: an attempt may take the whole call's time, as
    /// with the KCL's defaults.
    #[serde(with = "duration_text::option")]
    pub attempt_timeout: Option<Duration>,
    /// Attempts per call, the first included (the AWS SDK's standard retry mode, with its
    /// exponential backoff and retry quota). 1 turns the SDK's retries off; flotilla's own
    /// retries (a failed read, heartbeat or checkpoint is tried again later) remain.
    pub max_attempts: u32,
}

impl Default for AwsSettings {
    fn default() -> Self {
        Self {
            region: None,
            kinesis_endpoint: None,
            dynamodb_endpoint: None,
            cloudwatch_endpoint: None,
            sqs_endpoint: None,
            kinesis_timeout: Duration::from_secs(30),
            dynamodb_timeout: Duration::from_secs(60),
            cloudwatch_timeout: Duration::from_secs(30),
            attempt_timeout: None,
            max_attempts: 3,
        }
    }
}

/// A setting that cannot work. `key` is the dotted path as written in a file
/// (`lease.failover_time`; `FLOTILLA__LEASE__FAILOVER_TIME` in the environment), so the
/// message points at the line to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// The value of `key` cannot work; the worker must not start until it is changed.
    #[error("settings: {key} = {value}: {why}")]
    Invalid {
        /// The dotted key at fault, as written in a file (`lease.failover_time`).
        key: String,
        /// The value as found, rendered as it would be written (`"text"`, `12s`, `(unset)`).
        value: String,
        /// Why the value cannot work, and usually what to write instead.
        why: String,
    },
}

impl SettingsError {
    /// The dotted key at fault.
    pub fn key(&self) -> &str {
        match self {
            Self::Invalid { key, .. } => key,
        }
    }
}

/// The largest Kinesis record. A window must be able to admit one, or a reader waiting
/// for room it can never have stalls its shard for good.
pub const MIN_WINDOW_BYTES: u64 = 1024 * 1024;

/// The optional parts this build of the library has (its cargo features). Settings that
/// need a part the build left out are refused by name rather than ignored, so a worker
/// never runs silently without the endpoint or the metrics it was configured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Built {
    /// The `status-server` feature: the HTTP status endpoint.
    pub status_server: bool,
    /// The `cloudwatch` feature: the CloudWatch metrics adapter.
    pub cloudwatch: bool,
}

impl Built {
    /// This build's features.
    pub const THIS: Built = Built {
        status_server: cfg!(feature = "status-server"),
        cloudwatch: cfg!(feature = "cloudwatch"),
    };
}

/// Why `status.enabled = true` is refused by a build without the endpoint.
pub const NO_STATUS_SERVER: &str =
    "built without the status-server feature: set status.enabled = false or enable the feature";
pub use crate::backend::aws::NO_CLOUDWATCH;

impl Settings {
    /// The settings' demands on what was built: `status.enabled` needs the
    /// `status-server` feature, and publishing metrics (`metrics.level` other than
    /// `none`) the `cloudwatch` feature. Pure and given the build, so both answers are
    /// tested in every build; [`Settings::validate`] asks it about [`Built::THIS`].
    pub fn check_built(&self, built: Built) -> Result<(), SettingsError> {
        if self.status.enabled && !built.status_server {
            return Err(invalid("status.enabled", true, NO_STATUS_SERVER));
        }
        let level = match self.metrics.level {
            MetricsLevel::None => None,
            MetricsLevel::Summary => Some("summary"),
            MetricsLevel::Detailed => Some("detailed"),
        };
        if let Some(level) = level
            && !built.cloudwatch
        {
            return Err(invalid("metrics.level", quoted(level), NO_CLOUDWATCH));
        }
        Ok(())
    }

    /// Returns the first problem, in the order of `config/default.toml`, so each message
    /// can say one thing and how to fix it; fixing it may reveal the next. What this
    /// build of the library lacks comes first ([`Settings::check_built`]).
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.check_built(Built::THIS)?;
        self.worker.validate()?;
        self.lease.validate()?;
        self.status.validate()?;
        self.reader.validate()?;
        self.checkpoint.validate()?;
        self.supervision.validate()?;
        self.metrics.validate()?;
        self.aws.validate()?;
        self.failure.validate()?;
        self.processor.validate()?;
        self.scaling.validate(match self.lease.balance {
            BalanceMode::Throughput => true,
            BalanceMode::Count => false,
        })?;
        self.check_dead_letters_are_not_read()?;
        self.check_lease_table_is_not_read()?;
        if !self.worker.streams.is_empty() {
            // Kinesis streams only (checked per entry): fan-out works on every one.
            return self.check_stream_regions();
        }
        let source = self.worker.source()?;
        if source.is_table_stream() && self.reader.mode == ReadMode::Fanout {
            return Err(invalid(
                "reader.mode",
                quoted(self.reader.mode.as_str()),
                format!(
                    "enhanced fan-out is a Kinesis feature, and worker.stream = {} is a \
                     DynamoDB table's stream, which is read by polling: set reader.mode = \
                     \"polling\"",
                    quoted(&self.worker.stream)
                ),
            ));
        }
        Ok(())
    }
}

impl Settings {
    /// The checkpoint mode a shard's reader and processor hosts work in: the worker's,
    /// except that manual mode with lanes works as watermark mode: a lane's checkpoint
    /// acks its own records (`protocol/lane.rs`), the host acks nothing on `Ok`, and
    /// the reader checkpoints the acked prefix across the lanes.
    pub(crate) fn reader_mode(&self) -> CheckpointMode {
        match self.checkpoint.mode {
            CheckpointMode::Manual if self.processor.has_lanes() => CheckpointMode::Watermark,
            mode => mode,
        }
    }

    /// Whether the shard's end is asked of the processor as soon as everything is
    /// delivered, rather than once everything is acked: in manual mode with lanes,
    /// where a lane acks by checkpointing and may checkpoint its last records only in
    /// `shard_ended` (as a MultiLang child does). Each lane answers after the batches
    /// queued before the question.
    pub(crate) fn ends_before_acked(&self) -> bool {
        self.checkpoint.mode == CheckpointMode::Manual && self.processor.has_lanes()
    }

    /// The lease table's name: `lease.table`, else `worker.application`.
    pub fn lease_table(&self) -> &str {
        self.lease
            .table
            .as_deref()
            .unwrap_or(&self.worker.application)
    }

    /// Discarded records written to the stream being read would be read again, fail
    /// again and be written again, without end.
    fn check_dead_letters_are_not_read(&self) -> Result<(), SettingsError> {
        let Some(Destination::Kinesis(stream)) = &self.failure.destination else {
            return Ok(());
        };
        let name = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
        let read = std::iter::once(self.worker.stream.as_str()).chain(
            self.worker.streams.iter().map(|entry| match entry {
                StreamEntry::Name(name) => name.as_str(),
                StreamEntry::Table(table) => table.name.as_str(),
            }),
        );
        if read.map(name).any(|r| r == name(stream)) {
            return Err(invalid(
                "failure.destination",
                quoted(&format!("kinesis:{stream}")),
                "names a stream this worker reads: its discarded records would be read and \
                 fail again without end; name another stream",
            ));
        }
        Ok(())
    }

    /// A worker reading the changes of its own lease table would read its every lease
    /// write as a change, without end.
    fn check_lease_table_is_not_read(&self) -> Result<(), SettingsError> {
        if !self.worker.streams.is_empty() {
            return Ok(());
        }
        let table = self.lease_table();
        if self.worker.source()?.table() != Some(table) {
            return Ok(());
        }
        let (key, rename) = match &self.lease.table {
            Some(_) => ("lease.table", "name the lease table differently"),
            None => ("worker.application", "name the application differently"),
        };
        Err(invalid(
            key,
            quoted(table),
            format!(
                "is the lease table's name, and {} reads the changes of that same table: \
                 every lease write would be a change to read, without end; {rename}",
                quoted(&self.worker.stream)
            ),
        ))
    }

    /// A stream of `worker.streams` named by an ARN of another region than
    /// `aws.region` cannot be read: Kinesis serves a stream in its own region only. (With
    /// no `aws.region`, the region comes from the environment, and the worker checks the
    /// ARN against the stream's own when it starts.)
    fn check_stream_regions(&self) -> Result<(), SettingsError> {
        let Some(region) = &self.aws.region else {
            return Ok(());
        };
        for (i, spec) in self.worker.stream_specs()?.iter().enumerate() {
            if let Some(arn) = &spec.arn
                && &arn.region != region
            {
                return Err(invalid(
                    &format!("worker.streams[{i}]"),
                    quoted(&arn.to_string()),
                    format!(
                        "is a stream of region {}, and this worker's clients are of \
                         aws.region = {}: Kinesis serves a stream in its own region only; \
                         read it with a worker of its region",
                        quoted(&arn.region),
                        quoted(region)
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl StreamSpec {
    /// The stream as the `StreamClient` calls take it: its ARN when the entry gave one
    /// (the only way to name a stream of another account), else its name.
    pub fn stream(&self) -> String {
        match &self.arn {
            Some(arn) => arn.to_string(),
            None => self.name.clone(),
        }
    }
}

impl InitialPosition {
    /// The name used in files and by Kinesis.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TrimHorizon => "TRIM_HORIZON",
            Self::Latest => "LATEST",
            Self::AtTimestamp => "AT_TIMESTAMP",
        }
    }
}

impl WorkerSettings {
    /// The start time for AT_TIMESTAMP, `None` when no timestamp is set. Kept as text in
    /// the struct so a file round-trips as written; parsed here so the error names the key.
    ///
    /// Only UTC is accepted (`Z` or `+00:00`): a time without a zone would have to be
    /// guessed, and a wrong guess moves the start of every new shard by hours.
    pub fn initial_timestamp(&self) -> Result<Option<SystemTime>, SettingsError> {
        let Some(text) = self.initial_timestamp.as_deref() else {
            return Ok(None);
        };
        humantime::parse_rfc3339(text).map(Some).map_err(|e| {
            invalid(
                "worker.initial_timestamp",
                quoted(text),
                format!("not an RFC 3339 time in UTC ({e}); write e.g. \"2024-05-01T00:00:00Z\""),
            )
        })
    }

    /// `worker.stream` as a source: a Kinesis stream or a DynamoDB table's stream.
    pub fn source(&self) -> Result<crate::model::Source, SettingsError> {
        crate::model::Source::parse(&self.stream)
            .map_err(|why| invalid("worker.stream", quoted(&self.stream), why))
    }

    /// `worker.streams` as read, each with its initial position; empty for a worker of
    /// one stream (`worker.stream`). The error names the entry at fault.
    pub fn stream_specs(&self) -> Result<Vec<StreamSpec>, SettingsError> {
        let mut specs: Vec<StreamSpec> = Vec::new();
        for (i, entry) in self.streams.iter().enumerate() {
            let (text, position, timestamp) = match entry {
                StreamEntry::Name(text) => (text, None, None),
                StreamEntry::Table(t) => {
                    (&t.name, t.initial_position, t.initial_timestamp.as_ref())
                }
            };
            let key = format!("worker.streams[{i}]");
            // The same rule as a stream-set source's list.
            let (name, arn) =
                crate::model::stream_entry(text).map_err(|why| invalid(&key, quoted(text), why))?;
            let name = &name;
            if specs.iter().any(|s| &s.name == name) {
                return Err(invalid(
                    &key,
                    quoted(text),
                    format!(
                        "names stream {} a second time (status, the fleet page and \
                         `position export --stream` tell streams apart by name)",
                        quoted(name)
                    ),
                ));
            }
            // What the entry leaves out is the worker's; a timestamp goes with the
            // position it belongs to.
            let (position, timestamp) = match position {
                Some(position) => (position, timestamp.map(String::as_str)),
                None => (
                    self.initial_position,
                    timestamp
                        .map(String::as_str)
                        .or(self.initial_timestamp.as_deref()),
                ),
            };
            let initial_timestamp = check_timestamp(&key, position, timestamp)?;
            specs.push(StreamSpec {
                name: name.clone(),
                arn,
                initial_position: position,
                initial_timestamp,
            });
        }
        Ok(specs)
    }

    fn validate(&self) -> Result<(), SettingsError> {
        if !self.streams.is_empty() && !self.stream.is_empty() {
            return Err(invalid(
                "worker.streams",
                format!("{} streams", self.streams.len()),
                format!(
                    "and worker.stream = {} are both set: a worker reads either one stream \
                     or a list; keep one of them",
                    quoted(&self.stream)
                ),
            ));
        }
        if self.streams.is_empty() {
            self.source()?;
        } else {
            self.stream_specs()?;
        }

        if self.former_stream_grace.is_zero() {
            return Err(invalid(
                "worker.former_stream_grace",
                duration(self.former_stream_grace),
                "must be more than 0: with no grace, a stream left out of the list by \
                 mistake for one sync loses every checkpoint",
            ));
        }

        let key = "worker.application";
        if self.application.is_empty() {
            return Err(invalid(
                key,
                quoted(&self.application),
                "must be set: it names the DynamoDB lease table, which every worker of \
                 the application shares",
            ));
        }
        aws_name(
            key,
            &self.application,
            3..=MAX_APPLICATION,
            "the application name is the lease table's name, and its worker table is named \
             APPLICATION-FlotillaWorkers: DynamoDB table names are 3 to 255 characters of \
             A-Z a-z 0-9 _ . -, so the application is 3 to 239",
        )?;

        if let Some(id) = &self.worker_id {
            let key = "worker.worker_id";
            if id.is_empty() {
                return Err(invalid(
                    key,
                    quoted(id),
                    "must not be empty; remove it to get a random id",
                ));
            }
            if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    key,
                    quoted(id),
                    "must not contain whitespace or control characters: the id is written \
                     as the owner of every lease this worker holds and shown in logs, where \
                     such characters cannot be seen",
                ));
            }
        }

        let key = "worker.initial_timestamp";
        match (self.initial_position, &self.initial_timestamp) {
            (InitialPosition::AtTimestamp, None) => Err(invalid(
                key,
                UNSET,
                "required when worker.initial_position is AT_TIMESTAMP: it is where a shard \
                 with no checkpoint starts",
            )),
            (InitialPosition::AtTimestamp, Some(_)) => self.initial_timestamp().map(drop),
            (position, Some(text)) => Err(invalid(
                key,
                quoted(text),
                format!(
                    "only used when worker.initial_position is AT_TIMESTAMP, and it is {}: \
                     set initial_position = \"AT_TIMESTAMP\" or remove the timestamp",
                    position.as_str()
                ),
            )),
            (_, None) => Ok(()),
        }
    }
}

impl Settings {
    /// The longest a graceful shutdown spends handing leases to peers: two scans for
    /// them to notice and ask, a poll, and the handoffs in flight finishing.
    pub fn drain_limit(&self) -> Duration {
        self.lease.heartbeat_interval * 2
            + self.lease.handoff_poll_interval
            + self.supervision.shutdown_timeout
            + Duration::from_secs(1)
    }
}

impl LeaseSettings {
    /// How long after its last confirmed heartbeat (from when it was sent) a worker
    /// still delivers: `failover_time - fence_margin`. Past it, peers may soon judge it
    /// dead, so it fences itself first.
    pub fn fence_time(&self) -> Duration {
        self.failover_time.saturating_sub(self.fence_margin)
    }

    fn validate(&self) -> Result<(), SettingsError> {
        if let Some(table) = &self.table {
            aws_name(
                "lease.table",
                table,
                3..=MAX_APPLICATION,
                "it is the lease table's name, and its worker table is named \
                 TABLE-FlotillaWorkers: DynamoDB table names are 3 to 255 characters of \
                 A-Z a-z 0-9 _ . -, so the lease table's is 3 to 239; remove lease.table to \
                 name the table after worker.application",
            )?;
        }
        nonzero(
            "lease.failover_time",
            self.failover_time,
            "it is how long a silent worker keeps its leases; zero would call every worker dead",
        )?;
        nonzero(
            "lease.heartbeat_interval",
            self.heartbeat_interval,
            "it is the pause between two heartbeat writes",
        )?;
        nonzero(
            "lease.fence_margin",
            self.fence_margin,
            "peers see a heartbeat only when they scan and time it on their own clocks; \
             without a margin this worker could still be processing when another takes its \
             lease",
        )?;
        if self.fence_margin >= self.failover_time {
            return Err(invalid(
                "lease.fence_margin",
                duration(self.fence_margin),
                format!(
                    "must be below lease.failover_time ({}): a worker fences itself \
                     failover_time - fence_margin after its last heartbeat write, so it would \
                     stop at once",
                    duration(self.failover_time)
                ),
            ));
        }
        let fence_after = self.failover_time - self.fence_margin;
        if self.heartbeat_interval >= fence_after {
            return Err(invalid(
                "lease.heartbeat_interval",
                duration(self.heartbeat_interval),
                format!(
                    "must be below lease.failover_time - lease.fence_margin ({}), or this \
                     worker would fence itself, and peers declare it dead, between two \
                     heartbeats",
                    duration(fence_after)
                ),
            ));
        }
        if self.max_moves_per_round == 0 {
            return Err(invalid(
                "lease.max_moves_per_round",
                0,
                "must be at least 1, or a worker that joins would never get a share",
            ));
        }
        if !(1..=100).contains(&self.balance_threshold_percent) {
            return Err(invalid(
                "lease.balance_threshold_percent",
                self.balance_threshold_percent,
                "must be 1 to 100: with 0 every flicker of a rate would move a lease, and past \
                 100 a worker below the mean would never take",
            ));
        }
        if !(1..=100).contains(&self.balance_dampening_percent) {
            return Err(invalid(
                "lease.balance_dampening_percent",
                self.balance_dampening_percent,
                "must be 1 to 100 (the share of a worker's distance from the mean moved per \
                 round): 0 would move nothing, more would push it past the mean",
            ));
        }
        nonzero(
            "lease.handoff_poll_interval",
            self.handoff_poll_interval,
            "it is the pause between two reads of a lease being handed over",
        )?;
        if self.handoff_timeout <= self.handoff_poll_interval {
            return Err(invalid(
                "lease.handoff_timeout",
                duration(self.handoff_timeout),
                format!(
                    "must be above lease.handoff_poll_interval ({}): a request is read at \
                     least once before it is given up",
                    duration(self.handoff_poll_interval)
                ),
            ));
        }
        if self.full_scan_interval < self.heartbeat_interval {
            return Err(invalid(
                "lease.full_scan_interval",
                duration(self.full_scan_interval),
                format!(
                    "must be at least lease.heartbeat_interval ({}): rounds come no more \
                     often than that",
                    duration(self.heartbeat_interval)
                ),
            ));
        }
        if self.dead_worker_retention < self.failover_time {
            return Err(invalid(
                "lease.dead_worker_retention",
                duration(self.dead_worker_retention),
                format!(
                    "must be at least lease.failover_time ({}): a worker is not dead before \
                     that",
                    duration(self.failover_time)
                ),
            ));
        }
        Ok(())
    }
}

impl ReaderSettings {
    /// The fan-out consumer's name for an application.
    pub fn consumer_name_for<'a>(&'a self, application: &'a str) -> &'a str {
        self.consumer_name.as_deref().unwrap_or(application)
    }

    fn validate(&self) -> Result<(), SettingsError> {
        if let Some(name) = &self.consumer_name {
            let valid = (1..=128).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if !valid {
                return Err(invalid(
                    "reader.consumer_name",
                    format!("{name:?}"),
                    "Kinesis consumer names are 1 to 128 letters, digits, '_', '.' or '-'",
                ));
            }
        }
        if !(1..=10_000).contains(&self.max_records) {
            return Err(invalid(
                "reader.max_records",
                self.max_records,
                "GetRecords takes a Limit of 1 to 10000",
            ));
        }
        nonzero(
            "reader.poll_interval",
            self.poll_interval,
            "Kinesis allows five GetRecords calls per second per shard, shared by every \
             consumer; polling without a pause spends them all on throttling",
        )?;
        if self.idle_max < self.poll_interval {
            return Err(invalid(
                "reader.idle_max",
                duration(self.idle_max),
                format!(
                    "must not be below reader.poll_interval ({}): an idle shard's pause starts \
                     at poll_interval and doubles up to idle_max",
                    duration(self.poll_interval)
                ),
            ));
        }
        // A GetRecords batch is delivered whole. A window below one batch would either be
        // overrun by every batch or make the reader shrink its Limit below max_records;
        // asking for both to move together keeps each setting meaning what it says.
        if self.window_records < self.max_records {
            return Err(invalid(
                "reader.window_records",
                self.window_records,
                format!(
                    "must be at least reader.max_records ({}): a batch is delivered whole, so \
                     a smaller window could not hold one; lower max_records too to deliver \
                     fewer records at a time",
                    self.max_records
                ),
            ));
        }
        if self.window_bytes < MIN_WINDOW_BYTES {
            return Err(invalid(
                "reader.window_bytes",
                self.window_bytes,
                format!(
                    "must be at least {MIN_WINDOW_BYTES} (1 MiB): one Kinesis record can be \
                     that large, and a window that cannot admit it stalls the shard for good"
                ),
            ));
        }
        if self.worker_budget_bytes < MIN_WINDOW_BYTES {
            return Err(invalid(
                "reader.worker_budget_bytes",
                self.worker_budget_bytes,
                format!(
                    "must be at least {MIN_WINDOW_BYTES} (1 MiB): one Kinesis record can be \
                     that large; each shard is guaranteed budget / leases held"
                ),
            ));
        }
        nonzero(
            "reader.backoff_min",
            self.backoff_min,
            "a throttled call retried at once is throttled again",
        )?;
        if self.backoff_max < self.backoff_min {
            return Err(invalid(
                "reader.backoff_max",
                duration(self.backoff_max),
                format!(
                    "must not be below reader.backoff_min ({})",
                    duration(self.backoff_min)
                ),
            ));
        }
        nonzero(
            "reader.processor_timeout",
            self.processor_timeout,
            "it is how long a processor may hold records without acking any; zero would call \
             every processor stalled",
        )?;
        nonzero(
            "reader.parent_poll_interval",
            self.parent_poll_interval,
            "a child shard waiting on its parents would read the lease table without pause",
        )?;
        nonzero(
            "reader.shard_sync_interval",
            self.shard_sync_interval,
            "ListShards would be called without pause, and it is throttled per account",
        )?;
        if self.batch_window > MAX_BATCH_WINDOW {
            return Err(invalid(
                "reader.batch_window",
                duration(self.batch_window),
                "must be at most 5m (AWS Lambda's MaximumBatchingWindowInSeconds is at most \
                 300 s): records gathered longer wait too long before their first call",
            ));
        }
        Ok(())
    }
}

impl CheckpointSettings {
    fn validate(&self) -> Result<(), SettingsError> {
        nonzero(
            "checkpoint.interval",
            self.interval,
            "it bounds checkpoint writes per shard; zero would write DynamoDB on every ack",
        )
    }
}

impl SupervisionSettings {
    fn validate(&self) -> Result<(), SettingsError> {
        nonzero(
            "supervision.restart_backoff_min",
            self.restart_backoff_min,
            "a restart at once repeats a failure from outside (a throttle, a network blip) \
             before it can pass",
        )?;
        if self.restart_backoff_max < self.restart_backoff_min {
            return Err(invalid(
                "supervision.restart_backoff_max",
                duration(self.restart_backoff_max),
                format!(
                    "must not be below supervision.restart_backoff_min ({})",
                    duration(self.restart_backoff_min)
                ),
            ));
        }
        if self.shard_max_restarts == 0 {
            return Err(invalid(
                "supervision.shard_max_restarts",
                self.shard_max_restarts,
                "must be at least 1: with none allowed, every transient error would give the \
                 shard's lease away and bounce it around the fleet",
            ));
        }
        nonzero(
            "supervision.shard_restart_window",
            self.shard_restart_window,
            "restarts are counted within this window; an empty one counts none, so a \
             failing shard would restart forever",
        )?;
        nonzero(
            "supervision.shard_cooldown",
            self.shard_cooldown,
            "a shard given up would be taken again at once, and fail again",
        )?;
        // core_max_restarts may be 0: stop the worker at the first core failure and let the
        // process supervisor (systemd, Kubernetes) restart it.
        nonzero(
            "supervision.core_restart_window",
            self.core_restart_window,
            "restarts are counted within this window; an empty one counts none, so a \
             failing core actor would restart forever",
        )?;
        nonzero(
            "supervision.shutdown_timeout",
            self.shutdown_timeout,
            "processors need time to finish their batch and checkpoint, or the next owner \
             processes those records again",
        )
    }
}

impl MetricsSettings {
    fn validate(&self) -> Result<(), SettingsError> {
        let key = "metrics.namespace";
        let ns = &self.namespace;
        if ns.is_empty() {
            return Err(invalid(
                key,
                quoted(ns),
                "must be set: CloudWatch files every metric under a namespace",
            ));
        }
        if ns.starts_with("AWS/") {
            return Err(invalid(
                key,
                quoted(ns),
                "must not start with \"AWS/\": CloudWatch keeps those namespaces for AWS \
                 services and rejects PutMetricData to them",
            ));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || ".-_/#: ".contains(c);
        if ns.len() > 255 || ns.starts_with(':') || !ns.chars().all(allowed) {
            return Err(invalid(
                key,
                quoted(ns),
                "CloudWatch namespaces are 1 to 255 characters of A-Z a-z 0-9 . - _ / # : and \
                 space, not starting with ':'",
            ));
        }
        if self.interval < Duration::from_secs(1) {
            return Err(invalid(
                "metrics.interval",
                duration(self.interval),
                "must be at least 1s: CloudWatch stores nothing finer than one second, so a \
                 shorter interval only multiplies PutMetricData calls",
            ));
        }
        Ok(())
    }
}

impl AwsSettings {
    /// The limits on `service`'s calls (`backend::aws::tuned_for` applies them).
    pub fn call_limits(
        &self,
        service: crate::backend::aws::Service,
    ) -> crate::backend::aws::CallLimits {
        use crate::backend::aws::Service;
        crate::backend::aws::CallLimits {
            operation: match service {
                Service::Stream | Service::DeadLetters => self.kinesis_timeout,
                Service::LeaseTable => self.dynamodb_timeout,
                Service::Metrics => self.cloudwatch_timeout,
            },
            attempt: self.attempt_timeout,
            max_attempts: self.max_attempts,
        }
    }

    /// The endpoint URLs, as the AWS adapters take them.
    pub fn endpoints(&self) -> crate::backend::aws::Endpoints {
        crate::backend::aws::Endpoints {
            kinesis: self.kinesis_endpoint.clone(),
            dynamodb: self.dynamodb_endpoint.clone(),
            cloudwatch: self.cloudwatch_endpoint.clone(),
            sqs: self.sqs_endpoint.clone(),
        }
    }

    fn validate(&self) -> Result<(), SettingsError> {
        if let Some(region) = &self.region {
            let ok = !region.is_empty()
                && region
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                return Err(invalid(
                    "aws.region",
                    quoted(region),
                    "must be a region name such as \"eu-west-1\"; remove it to use the SDK's \
                     default chain (AWS_REGION, the profile)",
                ));
            }
        }
        for (key, endpoint) in [
            ("aws.kinesis_endpoint", &self.kinesis_endpoint),
            ("aws.dynamodb_endpoint", &self.dynamodb_endpoint),
            ("aws.cloudwatch_endpoint", &self.cloudwatch_endpoint),
            ("aws.sqs_endpoint", &self.sqs_endpoint),
        ] {
            if let Some(url) = endpoint
                && !looks_like_url(url)
            {
                return Err(invalid(
                    key,
                    quoted(url),
                    "must be an http:// or https:// URL such as \"http://127.0.0.1:4567\"; \
                     remove it to use AWS's endpoint",
                ));
            }
        }
        let timeouts = [
            ("aws.kinesis_timeout", self.kinesis_timeout),
            ("aws.dynamodb_timeout", self.dynamodb_timeout),
            ("aws.cloudwatch_timeout", self.cloudwatch_timeout),
        ];
        for (key, timeout) in timeouts {
            if timeout < Duration::from_millis(100) {
                return Err(invalid(
                    key,
                    duration(timeout),
                    "must be at least 100ms: no AWS call answers sooner, so every call would \
                     fail",
                ));
            }
        }
        if let Some(attempt) = self.attempt_timeout {
            if attempt < Duration::from_millis(100) {
                return Err(invalid(
                    "aws.attempt_timeout",
                    duration(attempt),
                    "must be at least 100ms (or unset, to let an attempt take the whole call's \
                     time)",
                ));
            }
            if let Some((key, timeout)) = timeouts.iter().find(|(_, t)| attempt > *t) {
                return Err(invalid(
                    "aws.attempt_timeout",
                    duration(attempt),
                    format!(
                        "is longer than {key} ({}), so it could never end an attempt; make it \
                         shorter, or unset it",
                        duration(*timeout)
                    ),
                ));
            }
        }
        if self.max_attempts == 0 {
            return Err(invalid(
                "aws.max_attempts",
                "0".to_owned(),
                "must be at least 1 (the first attempt); 1 turns the SDK's retries off",
            ));
        }
        Ok(())
    }
}

/// How an absent optional value is shown in an error.
const UNSET: &str = "(unset)";

/// A stream entry's start time: required with AT_TIMESTAMP, refused otherwise (the
/// worker's own keys are checked by the same rules in `WorkerSettings::validate`).
fn check_timestamp(
    key: &str,
    position: InitialPosition,
    timestamp: Option<&str>,
) -> Result<Option<SystemTime>, SettingsError> {
    match (position, timestamp) {
        (InitialPosition::AtTimestamp, None) => Err(invalid(
            key,
            UNSET,
            "starts at AT_TIMESTAMP and has no initial_timestamp (nor has the worker)",
        )),
        (InitialPosition::AtTimestamp, Some(text)) => {
            humantime::parse_rfc3339(text).map(Some).map_err(|e| {
                invalid(
                    key,
                    quoted(text),
                    format!("initial_timestamp is not an RFC 3339 time in UTC ({e})"),
                )
            })
        }
        (position, Some(text)) => Err(invalid(
            key,
            quoted(text),
            format!(
                "initial_timestamp is only used with AT_TIMESTAMP, and this stream starts at {}",
                position.as_str()
            ),
        )),
        (_, None) => Ok(None),
    }
}

fn invalid(key: &str, value: impl fmt::Display, why: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.to_owned(),
        value: value.to_string(),
        why: why.into(),
    }
}

fn nonzero(key: &str, value: Duration, why: &str) -> Result<(), SettingsError> {
    if value.is_zero() {
        return Err(invalid(
            key,
            duration(value),
            format!("must be above zero: {why}"),
        ));
    }
    Ok(())
}

/// Kinesis stream and DynamoDB table names share one alphabet; only the lengths differ.
fn aws_name(
    key: &str,
    name: &str,
    len: std::ops::RangeInclusive<usize>,
    rule: &str,
) -> Result<(), SettingsError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
    if !len.contains(&name.len()) || !name.chars().all(allowed) {
        return Err(invalid(key, quoted(name), rule));
    }
    Ok(())
}

/// A scheme and something after it: enough to catch a bare host or a typo, which the SDK
/// would otherwise report only at the first call, far from the setting.
fn looks_like_url(text: &str) -> bool {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"));
    match rest {
        Some(rest) => {
            !rest.is_empty() && !rest.starts_with('/') && !text.chars().any(char::is_whitespace)
        }
        None => false,
    }
}

fn quoted(text: &str) -> String {
    format!("{text:?}")
}

fn duration(value: Duration) -> String {
    humantime::format_duration(value).to_string()
}

/// Durations as text with their unit ("10s", "250ms", "5min") in files and variables,
/// both ways. A value that is not one is refused saying what is wrong with it and how to
/// write one (humantime-serde's own refusal says neither, and calls a bare number a
/// string, since the settings loader hands every value over as text).
mod duration_text {
    use std::fmt;
    use std::time::Duration;

    use serde::Deserializer;
    use serde::de::{Error, Visitor};

    pub use humantime_serde::serialize;

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        deserializer.deserialize_any(Text)
    }

    /// An optional duration; absent (or commented out) is `None`.
    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer};

        pub use humantime_serde::option::serialize;

        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            #[derive(Deserialize)]
            struct Present(#[serde(with = "super")] Duration);
            Ok(Option::<Present>::deserialize(deserializer)?.map(|Present(d)| d))
        }
    }

    struct Text;

    impl Visitor<'_> for Text {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration with its unit, e.g. \"10s\" or \"250ms\"")
        }

        fn visit_str<E: Error>(self, text: &str) -> Result<Duration, E> {
            parse(text).map_err(E::custom)
        }

        fn visit_u64<E: Error>(self, number: u64) -> Result<Duration, E> {
            Err(E::custom(no_unit(number)))
        }

        fn visit_i64<E: Error>(self, number: i64) -> Result<Duration, E> {
            Err(E::custom(no_unit(number)))
        }

        fn visit_f64<E: Error>(self, number: f64) -> Result<Duration, E> {
            Err(E::custom(no_unit(number)))
        }
    }

    /// A number where a duration belongs: its unit is missing.
    fn no_unit(number: impl fmt::Display) -> String {
        format!(
            "{number} is not a duration: it has no unit; write it as text with one, e.g. \
             \"{number}s\" or \"250ms\""
        )
    }

    /// `text` as a duration, or what is wrong with it and how to write one.
    pub(super) fn parse(text: &str) -> Result<Duration, String> {
        humantime::parse_duration(text).map_err(|error| match error {
            humantime::DurationError::UnknownUnit { unit, value, .. } if unit.is_empty() => {
                format!(
                    "{text:?} is not a duration: it has no unit; write e.g. \"{value}s\" or \
                     \"{value}ms\""
                )
            }
            humantime::DurationError::UnknownUnit { unit, value, .. } => format!(
                "{text:?} is not a duration: {unit:?} is not a unit (ns, us, ms, s, min, h, d, \
                 w, or their names: sec, hours, days, ...); write e.g. \"{value}s\" or \
                 \"250ms\""
            ),
            other => {
                format!("{text:?} is not a duration ({other}); write e.g. \"10s\" or \"250ms\"")
            }
        })
    }
}

/// A setting that is one of a few words (`reader.mode = "fanout"`), read as text and
/// then as its enum, so that a wrong word is refused naming the right ones: the config
/// crate reads an enum itself and says only that it "does not have variant
/// constructor" the word.
mod choice {
    use std::fmt;

    use serde::de::value::{Error as ValueError, StrDeserializer};
    use serde::de::{DeserializeOwned, Error, IntoDeserializer, Visitor};
    use serde::{Deserialize, Deserializer, forward_to_deserialize_any};

    pub fn deserialize<'de, D: Deserializer<'de>, T: DeserializeOwned>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        word(&String::deserialize(deserializer)?)
    }

    /// An optional choice; absent is `None`.
    pub fn optional<'de, D: Deserializer<'de>, T: DeserializeOwned>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| word(&text))
            .transpose()
    }

    fn word<T: DeserializeOwned, E: Error>(text: &str) -> Result<T, E> {
        let words: StrDeserializer<'_, ValueError> = text.into_deserializer();
        T::deserialize(words).map_err(|_| {
            let choices: Vec<String> = words_of::<T>().iter().map(|w| format!("{w:?}")).collect();
            E::custom(format!(
                "{text:?} is not one of the choices: write one of {}",
                choices.join(", ")
            ))
        })
    }

    /// The words `T` accepts, as its derived `Deserialize` names them when it asks for an
    /// enum (renames applied), so the list cannot drift from the type.
    pub(super) fn words_of<T: DeserializeOwned>() -> Vec<&'static str> {
        match T::deserialize(Words) {
            Err(Listed(words)) => words,
            Ok(_) => Vec::new(),
        }
    }

    /// A deserializer that only listens: it answers every request with the enum's words
    /// (none, when `T` asked for something else).
    struct Words;

    #[derive(Debug)]
    struct Listed(Vec<&'static str>);

    impl fmt::Display for Listed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }

    impl std::error::Error for Listed {}

    impl Error for Listed {
        fn custom<M: fmt::Display>(_: M) -> Self {
            Listed(Vec::new())
        }
    }

    impl<'de> Deserializer<'de> for Words {
        type Error = Listed;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Listed> {
            Err(Listed(Vec::new()))
        }

        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Listed> {
            Err(Listed(variants.to_vec()))
        }

        forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            struct identifier ignored_any
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Who acks and who checkpoints, per mode: (host acks each batch, reader
    /// checkpoints the acked prefix).
    #[test]
    fn each_checkpoint_mode_says_who_acks_and_who_checkpoints() {
        let table = [
            (CheckpointMode::Auto, (true, true)),
            (CheckpointMode::Manual, (true, false)),
            (CheckpointMode::Watermark, (false, true)),
        ];
        for (mode, expected) in table {
            assert_eq!(
                (
                    mode.host_acks_each_batch(),
                    mode.reader_checkpoints_acked_prefix()
                ),
                expected,
                "{mode:?}"
            );
        }
    }

    /// The defaults plus the two settings that have none.
    fn valid() -> Settings {
        let mut s = Settings::default();
        s.worker.stream = "orders".to_owned();
        s.worker.application = "orders-consumer".to_owned();
        s
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn defaults_with_stream_and_application_are_valid() {
        assert_eq!(valid().validate(), Ok(()));
    }

    #[test]
    fn defaults_alone_ask_for_the_stream() {
        let err = Settings::default().validate().unwrap_err();
        assert_eq!(err.key(), "worker.stream");
        assert!(err.to_string().contains("must be set"), "{err}");
    }

    /// `worker.streams` takes names and tables in one list; what a table leaves out is
    /// the worker's.
    #[test]
    fn streams_are_names_or_tables_with_their_own_start() {
        let settings: Settings = toml::from_str(
            r#"
            [worker]
            application = "app"
            initial_position = "LATEST"
            streams = [
                "orders",
                { name = "audit", initial_position = "TRIM_HORIZON" },
                { name = "clicks", initial_position = "AT_TIMESTAMP", initial_timestamp = "2024-05-01T00:00:00Z" },
            ]
            "#,
        )
        .unwrap();
        settings.validate().unwrap();
        let specs = settings.worker.stream_specs().unwrap();
        let got: Vec<(&str, InitialPosition, bool)> = specs
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.initial_position,
                    s.initial_timestamp.is_some(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("orders", InitialPosition::Latest, false),
                ("audit", InitialPosition::TrimHorizon, false),
                ("clicks", InitialPosition::AtTimestamp, true),
            ]
        );
        // A misspelt key in a table is refused, not ignored.
        assert!(
            toml::from_str::<Settings>(
                r#"
                [worker]
                streams = [{ name = "a", initial_postion = "LATEST" }]
                "#
            )
            .is_err()
        );
    }

    /// An entry may name its stream by ARN, as a string or as `arn` in a table; the
    /// account, region and name are the ARN's, and calls are made with the ARN.
    #[test]
    fn streams_may_be_named_by_their_arn() {
        let settings: Settings = toml::from_str(
            r#"
            [worker]
            application = "app"
            streams = [
                "orders",
                "arn:aws:kinesis:eu-west-1:111111111111:stream/audit",
                { arn = "arn:aws:kinesis:eu-west-1:222222222222:stream/clicks", initial_position = "LATEST" },
            ]
            [aws]
            region = "eu-west-1"
            "#,
        )
        .unwrap();
        settings.validate().unwrap();
        let specs = settings.worker.stream_specs().unwrap();
        let got: Vec<(&str, Option<&str>, String, InitialPosition)> = specs
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.arn.as_ref().map(|a| a.account.as_str()),
                    s.stream(),
                    s.initial_position,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "orders",
                    None,
                    "orders".to_owned(),
                    InitialPosition::TrimHorizon
                ),
                (
                    "audit",
                    Some("111111111111"),
                    "arn:aws:kinesis:eu-west-1:111111111111:stream/audit".to_owned(),
                    InitialPosition::TrimHorizon
                ),
                (
                    "clicks",
                    Some("222222222222"),
                    "arn:aws:kinesis:eu-west-1:222222222222:stream/clicks".to_owned(),
                    InitialPosition::Latest
                ),
            ]
        );
        // Without aws.region, the region is checked against the stream's when the
        // worker starts.
        let mut anywhere = settings.clone();
        anywhere.aws.region = None;
        anywhere.validate().unwrap();
        // A name and an ARN in one table are one key given twice.
        assert!(
            toml::from_str::<Settings>(
                r#"
                [worker]
                streams = [{ name = "a", arn = "arn:aws:kinesis:eu-west-1:1:stream/a" }]
                "#
            )
            .is_err()
        );
    }

    #[test]
    fn each_bad_value_names_its_key() {
        type Case = (&'static str, fn(&mut Settings));
        let cases: &[Case] = &[
            ("worker.stream", |s| s.worker.stream.clear()),
            ("worker.stream", |s| s.worker.stream = "my stream".into()),
            ("worker.stream", |s| s.worker.stream = "x".repeat(129)),
            ("worker.stream", |s| {
                s.worker.stream = "arn:aws:kinesis:us-east-1:123456789012:stream/orders".into()
            }),
            ("worker.former_stream_grace", |s| {
                s.worker.former_stream_grace = Duration::ZERO
            }),
            ("worker.application", |s| s.worker.application.clear()),
            ("worker.application", |s| s.worker.application = "ab".into()),
            ("worker.application", |s| {
                s.worker.application = "a".repeat(MAX_APPLICATION + 1)
            }),
            ("worker.application", |s| {
                s.worker.application = "orders/consumer".into()
            }),
            ("worker.stream", |s| s.worker.stream = "dynamodb:x".into()),
            ("worker.application", |s| {
                s.worker.stream = "dynamodb:orders-audit".into();
                s.worker.application = "orders-audit".into();
            }),
            ("worker.application", |s| {
                s.worker.stream =
                    "arn:aws:dynamodb:us-east-1:1:table/orders-audit/stream/2024".into();
                s.worker.application = "orders-audit".into();
            }),
            ("lease.table", |s| s.lease.table = Some("ab".into())),
            ("lease.table", |s| {
                s.lease.table = Some("t".repeat(MAX_APPLICATION + 1))
            }),
            ("lease.table", |s| {
                s.lease.table = Some("orders table".into())
            }),
            ("lease.table", |s| {
                s.worker.stream = "dynamodb:orders-leases".into();
                s.lease.table = Some("orders-leases".into());
            }),
            ("worker.worker_id", |s| {
                s.worker.worker_id = Some(String::new())
            }),
            ("worker.worker_id", |s| {
                s.worker.worker_id = Some("worker a".into())
            }),
            ("worker.worker_id", |s| {
                s.worker.worker_id = Some("worker-a\n".into())
            }),
            ("worker.initial_timestamp", |s| {
                s.worker.initial_position = InitialPosition::AtTimestamp
            }),
            ("worker.initial_timestamp", |s| {
                s.worker.initial_position = InitialPosition::AtTimestamp;
                s.worker.initial_timestamp = Some("yesterday".into());
            }),
            ("worker.initial_timestamp", |s| {
                s.worker.initial_position = InitialPosition::AtTimestamp;
                s.worker.initial_timestamp = Some("2024-05-01T00:00:00+02:00".into());
            }),
            ("worker.initial_timestamp", |s| {
                s.worker.initial_timestamp = Some("2024-05-01T00:00:00Z".into())
            }),
            ("worker.streams", |s| {
                s.worker.streams = vec![StreamEntry::Name("a".into())]
            }),
            ("worker.streams[1]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![
                    StreamEntry::Name("a".into()),
                    StreamEntry::Name("dynamodb:t".into()),
                ]
            }),
            ("worker.streams[1]", |s| {
                s.worker.stream.clear();
                s.worker.streams =
                    vec![StreamEntry::Name("a".into()), StreamEntry::Name("a".into())]
            }),
            ("worker.streams[0]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![StreamEntry::Name("my stream".into())]
            }),
            ("worker.streams[0]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![StreamEntry::Table(StreamTable {
                    name: "a".into(),
                    initial_position: Some(InitialPosition::AtTimestamp),
                    initial_timestamp: None,
                })]
            }),
            ("worker.streams[0]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![StreamEntry::Table(StreamTable {
                    name: "a".into(),
                    initial_position: Some(InitialPosition::Latest),
                    initial_timestamp: Some("2024-05-01T00:00:00Z".into()),
                })]
            }),
            ("worker.streams[1]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![
                    StreamEntry::Name("a".into()),
                    StreamEntry::Name("arn:aws:kinesis:us-east-1:123456789012:stream/".into()),
                ]
            }),
            ("worker.streams[0]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![StreamEntry::Name(
                    "arn:aws:kinesis:us-east-1:123456789012:stream/my stream".into(),
                )]
            }),
            ("worker.streams[0]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![StreamEntry::Name(
                    "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2024".into(),
                )]
            }),
            // One name in two accounts: status and `--stream` could not tell them apart.
            ("worker.streams[1]", |s| {
                s.worker.stream.clear();
                s.worker.streams = vec![
                    StreamEntry::Name("arn:aws:kinesis:us-east-1:111111111111:stream/a".into()),
                    StreamEntry::Name("arn:aws:kinesis:us-east-1:222222222222:stream/a".into()),
                ]
            }),
            ("worker.streams[1]", |s| {
                s.worker.stream.clear();
                s.aws.region = Some("eu-west-1".into());
                s.worker.streams = vec![
                    StreamEntry::Name("arn:aws:kinesis:eu-west-1:123456789012:stream/a".into()),
                    StreamEntry::Name("arn:aws:kinesis:us-east-1:123456789012:stream/b".into()),
                ]
            }),
            ("lease.failover_time", |s| s.lease.failover_time = secs(0)),
            ("lease.balance_threshold_percent", |s| {
                s.lease.balance_threshold_percent = 0
            }),
            ("lease.balance_threshold_percent", |s| {
                s.lease.balance_threshold_percent = 101
            }),
            ("lease.balance_dampening_percent", |s| {
                s.lease.balance_dampening_percent = 0
            }),
            ("lease.balance_dampening_percent", |s| {
                s.lease.balance_dampening_percent = 150
            }),
            ("lease.heartbeat_interval", |s| {
                s.lease.heartbeat_interval = secs(0)
            }),
            ("lease.fence_margin", |s| s.lease.fence_margin = secs(0)),
            ("lease.max_moves_per_round", |s| {
                s.lease.max_moves_per_round = 0
            }),
            ("lease.handoff_poll_interval", |s| {
                s.lease.handoff_poll_interval = secs(0)
            }),
            ("lease.handoff_timeout", |s| {
                s.lease.handoff_timeout = s.lease.handoff_poll_interval
            }),
            // The lease timings' bounds, relative to the defaults (which issue 34 moved).
            ("lease.full_scan_interval", |s| {
                s.lease.full_scan_interval = s.lease.heartbeat_interval - Duration::from_millis(1)
            }),
            ("lease.dead_worker_retention", |s| {
                s.lease.dead_worker_retention = s.lease.failover_time - Duration::from_millis(1)
            }),
            ("lease.fence_margin", |s| {
                s.lease.fence_margin = s.lease.failover_time
            }),
            ("lease.heartbeat_interval", |s| {
                s.lease.heartbeat_interval = s.lease.fence_time()
            }),
            ("reader.max_records", |s| s.reader.max_records = 0),
            ("reader.max_records", |s| s.reader.max_records = 10_001),
            ("reader.poll_interval", |s| s.reader.poll_interval = secs(0)),
            ("reader.idle_max", |s| {
                s.reader.idle_max = Duration::from_millis(100)
            }),
            ("reader.window_records", |s| s.reader.window_records = 0),
            ("reader.window_records", |s| s.reader.window_records = 9_999),
            ("reader.window_bytes", |s| {
                s.reader.window_bytes = MIN_WINDOW_BYTES - 1
            }),
            ("reader.worker_budget_bytes", |s| {
                s.reader.worker_budget_bytes = MIN_WINDOW_BYTES - 1
            }),
            ("reader.backoff_min", |s| s.reader.backoff_min = secs(0)),
            ("reader.backoff_max", |s| {
                s.reader.backoff_max = Duration::from_millis(50)
            }),
            ("reader.processor_timeout", |s| {
                s.reader.processor_timeout = secs(0)
            }),
            ("reader.parent_poll_interval", |s| {
                s.reader.parent_poll_interval = secs(0)
            }),
            ("reader.shard_sync_interval", |s| {
                s.reader.shard_sync_interval = secs(0)
            }),
            ("reader.batch_window", |s| {
                s.reader.batch_window = Duration::from_millis(300_001)
            }),
            ("checkpoint.interval", |s| s.checkpoint.interval = secs(0)),
            ("supervision.restart_backoff_min", |s| {
                s.supervision.restart_backoff_min = secs(0)
            }),
            ("supervision.restart_backoff_max", |s| {
                s.supervision.restart_backoff_max = Duration::from_millis(10)
            }),
            ("supervision.shard_max_restarts", |s| {
                s.supervision.shard_max_restarts = 0
            }),
            ("supervision.shard_restart_window", |s| {
                s.supervision.shard_restart_window = secs(0)
            }),
            ("supervision.shard_cooldown", |s| {
                s.supervision.shard_cooldown = secs(0)
            }),
            ("supervision.core_restart_window", |s| {
                s.supervision.core_restart_window = secs(0)
            }),
            ("supervision.shutdown_timeout", |s| {
                s.supervision.shutdown_timeout = secs(0)
            }),
            ("metrics.namespace", |s| s.metrics.namespace.clear()),
            ("metrics.namespace", |s| {
                s.metrics.namespace = "AWS/Kinesis".into()
            }),
            ("metrics.namespace", |s| s.metrics.namespace = ":app".into()),
            ("metrics.namespace", |s| {
                s.metrics.namespace = "app\u{e9}".into()
            }),
            ("metrics.namespace", |s| {
                s.metrics.namespace = "n".repeat(256)
            }),
            ("metrics.interval", |s| {
                s.metrics.interval = Duration::from_millis(999)
            }),
            ("aws.region", |s| s.aws.region = Some(String::new())),
            ("aws.region", |s| s.aws.region = Some("US East 1".into())),
            ("aws.kinesis_endpoint", |s| {
                s.aws.kinesis_endpoint = Some("127.0.0.1:4567".into())
            }),
            ("aws.dynamodb_endpoint", |s| {
                s.aws.dynamodb_endpoint = Some("http://".into())
            }),
            ("aws.cloudwatch_endpoint", |s| {
                s.aws.cloudwatch_endpoint = Some("https:// example.com".into())
            }),
            ("aws.sqs_endpoint", |s| {
                s.aws.sqs_endpoint = Some("sqs.eu-west-1.amazonaws.com".into())
            }),
            ("aws.kinesis_timeout", |s| {
                s.aws.kinesis_timeout = Duration::from_millis(99)
            }),
            ("aws.dynamodb_timeout", |s| s.aws.dynamodb_timeout = secs(0)),
            ("aws.cloudwatch_timeout", |s| {
                s.aws.cloudwatch_timeout = Duration::from_millis(99)
            }),
            ("aws.attempt_timeout", |s| {
                s.aws.attempt_timeout = Some(Duration::from_millis(99))
            }),
            ("aws.attempt_timeout", |s| {
                s.aws.attempt_timeout = Some(Duration::from_secs(31))
            }),
            ("aws.max_attempts", |s| s.aws.max_attempts = 0),
        ];
        for (i, (key, spoil)) in cases.iter().enumerate() {
            let mut settings = valid();
            spoil(&mut settings);
            let err = settings
                .validate()
                .expect_err(&format!("case {i} ({key}) passed validation"));
            assert_eq!(err.key(), *key, "case {i}: {err}");
            assert!(
                err.to_string().starts_with(&format!("settings: {key} = ")),
                "case {i}: {err}"
            );
        }
    }

    #[test]
    fn values_on_the_boundary_pass() {
        let cases: &[fn(&mut Settings)] = &[
            |s| s.worker.stream = "s".into(),
            |s| s.worker.stream = "a.B_c-9".repeat(19)[..128].to_owned(),
            |s| s.worker.application = "abc".into(),
            |s| s.worker.application = "a".repeat(MAX_APPLICATION),
            |s| s.lease.table = Some("abc".into()),
            |s| s.lease.table = Some("t".repeat(MAX_APPLICATION)),
            // Reading the application's table is fine when the lease table is another.
            |s| {
                s.worker.stream = "dynamodb:orders-audit".into();
                s.worker.application = "orders-audit".into();
                s.lease.table = Some("orders-audit-leases".into());
            },
            |s| s.worker.worker_id = Some("i-0abc:worker/1".into()),
            |s| {
                s.worker.initial_position = InitialPosition::AtTimestamp;
                s.worker.initial_timestamp = Some("2024-05-01T00:00:00Z".into());
            },
            |s| {
                s.worker.initial_position = InitialPosition::AtTimestamp;
                s.worker.initial_timestamp = Some("2024-05-01T00:00:00.250+00:00".into());
            },
            |s| {
                s.lease.fence_margin = s.lease.failover_time - Duration::from_millis(1);
                s.lease.heartbeat_interval = Duration::from_micros(999);
            },
            |s| s.lease.heartbeat_interval = s.lease.fence_time() - Duration::from_millis(1),
            |s| {
                s.reader.max_records = 1;
                s.reader.window_records = 1;
            },
            |s| s.reader.window_records = 10_000,
            |s| s.reader.window_bytes = MIN_WINDOW_BYTES,
            |s| s.reader.worker_budget_bytes = MIN_WINDOW_BYTES,
            |s| s.reader.idle_max = s.reader.poll_interval,
            |s| s.reader.backoff_max = s.reader.backoff_min,
            |s| s.reader.batch_window = MAX_BATCH_WINDOW,
            |s| s.supervision.restart_backoff_max = s.supervision.restart_backoff_min,
            |s| s.supervision.shard_max_restarts = 1,
            |s| s.supervision.core_max_restarts = 0,
            |s| s.lease.max_leases = 1,
            |s| s.lease.max_moves_per_round = 1,
            |s| s.status.bind = "[::1]:0".into(),
            |s| {
                s.status.enabled = false;
                s.status.bind = "not parsed when disabled".into();
            },
            |s| s.lease.handoff_timeout = s.lease.handoff_poll_interval + Duration::from_millis(1),
            |s| s.metrics.namespace = "My App/orders#1:x".into(),
            |s| s.metrics.interval = secs(1),
            |s| s.aws.region = Some("us-gov-west-1".into()),
            |s| s.aws.kinesis_endpoint = Some("http://127.0.0.1:4567".into()),
            |s| s.aws.dynamodb_endpoint = Some("https://dynamodb.eu-west-1.amazonaws.com/".into()),
            |s| s.aws.sqs_endpoint = Some("http://127.0.0.1:9324".into()),
            |s| {
                s.aws.kinesis_timeout = Duration::from_millis(100);
                s.aws.attempt_timeout = Some(Duration::from_millis(100));
                s.aws.max_attempts = 1;
            },
            |s| s.aws.attempt_timeout = Some(secs(30)),
        ];
        for (i, adjust) in cases.iter().enumerate() {
            let mut settings = valid();
            adjust(&mut settings);
            assert_eq!(settings.validate(), Ok(()), "case {i}");
        }
    }

    #[test]
    fn what_was_built_decides_the_endpoint_and_the_metrics() {
        const ALL: Built = Built {
            status_server: true,
            cloudwatch: true,
        };
        const BARE: Built = Built {
            status_server: false,
            cloudwatch: false,
        };
        let endpoint_only = Built {
            cloudwatch: false,
            ..ALL
        };
        let cloudwatch_only = Built {
            status_server: false,
            ..ALL
        };
        let quiet = |s: &mut Settings| {
            s.status.enabled = false;
            s.metrics.level = MetricsLevel::None;
        };
        let status_error = "settings: status.enabled = true: built without the status-server feature: set \
             status.enabled = false or enable the feature";
        let cloudwatch_error = |level: &str| {
            format!(
                "settings: metrics.level = \"{level}\": built without the cloudwatch feature: \
                 set metrics.level = \"none\" or enable the feature"
            )
        };
        type Adjust = fn(&mut Settings);
        let cases: Vec<(Built, Adjust, Option<String>)> = vec![
            // The defaults need both.
            (ALL, |_| {}, None),
            (BARE, |_| {}, Some(status_error.to_owned())),
            (endpoint_only, |_| {}, Some(cloudwatch_error("summary"))),
            (cloudwatch_only, |_| {}, Some(status_error.to_owned())),
            // With neither asked for, any build will do.
            (BARE, quiet, None),
            (ALL, quiet, None),
            // Each feature serves its own setting, not the other's.
            (
                endpoint_only,
                |s| s.metrics.level = MetricsLevel::None,
                None,
            ),
            (cloudwatch_only, |s| s.status.enabled = false, None),
            (
                BARE,
                |s| s.status.enabled = false,
                Some(cloudwatch_error("summary")),
            ),
            (
                BARE,
                |s| {
                    s.status.enabled = false;
                    s.metrics.level = MetricsLevel::Detailed;
                },
                Some(cloudwatch_error("detailed")),
            ),
        ];
        for (i, (built, adjust, want)) in cases.into_iter().enumerate() {
            let mut settings = valid();
            adjust(&mut settings);
            let got = settings.check_built(built).map_err(|e| e.to_string());
            assert_eq!(got, want.map_or(Ok(()), Err), "case {i}");
        }
        let mut settings = valid();
        settings.metrics.level = MetricsLevel::Summary;
        assert_eq!(
            settings
                .check_built(endpoint_only)
                .map_err(|e| e.key().to_owned()),
            Err("metrics.level".to_owned())
        );
    }

    /// Fails only in a build without a feature (`.ci/run` runs it in one) if `validate`
    /// forgot to ask.
    #[test]
    fn validate_asks_about_this_build() {
        let mut settings = valid();
        settings.status.enabled = true;
        settings.metrics.level = MetricsLevel::Detailed;
        assert_eq!(settings.validate(), settings.check_built(Built::THIS));
    }

    #[test]
    fn the_lease_table_is_the_application_unless_named() {
        let mut settings = valid();
        assert_eq!(settings.lease_table(), "orders-consumer");
        settings.lease.table = Some("orders-leases".into());
        assert_eq!(settings.lease_table(), "orders-leases");
        assert_eq!(settings.worker.application, "orders-consumer");
    }

    #[test]
    fn heartbeat_error_says_why_with_the_numbers() {
        let mut settings = valid();
        settings.lease.failover_time = secs(10);
        settings.lease.fence_margin = secs(3);
        settings.lease.heartbeat_interval = secs(12);
        assert_eq!(
            settings.validate().unwrap_err().to_string(),
            "settings: lease.heartbeat_interval = 12s: must be below lease.failover_time - \
             lease.fence_margin (7s), or this worker would fence itself, and peers declare it \
             dead, between two heartbeats"
        );
    }

    #[test]
    fn strings_are_quoted_and_unset_values_say_so() {
        let mut settings = valid();
        settings.worker.stream = "my stream".into();
        let text = settings.validate().unwrap_err().to_string();
        assert!(
            text.starts_with(r#"settings: worker.stream = "my stream": "#),
            "{text}"
        );

        let mut settings = valid();
        settings.worker.initial_position = InitialPosition::AtTimestamp;
        let text = settings.validate().unwrap_err().to_string();
        assert!(
            text.starts_with("settings: worker.initial_timestamp = (unset): required when"),
            "{text}"
        );
    }

    #[test]
    fn initial_timestamp_parses_utc_rfc3339() {
        let mut worker = valid().worker;
        assert_eq!(worker.initial_timestamp(), Ok(None));

        worker.initial_timestamp = Some("2024-05-01T00:00:10Z".into());
        let expected = SystemTime::UNIX_EPOCH + secs(1_714_521_610);
        assert_eq!(worker.initial_timestamp(), Ok(Some(expected)));

        worker.initial_timestamp = Some("2024-05-01 00:00:10".into());
        let err = worker.initial_timestamp().unwrap_err();
        assert_eq!(err.key(), "worker.initial_timestamp");
        assert!(err.to_string().contains("2024-05-01T00:00:00Z"), "{err}");
    }

    /// The words a choice lists in its error are the enum's own, renames applied.
    #[test]
    fn each_choice_lists_its_words() {
        assert_eq!(
            choice::words_of::<InitialPosition>(),
            ["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"]
        );
        assert_eq!(
            choice::words_of::<MetricsLevel>(),
            ["none", "summary", "detailed"]
        );
        assert_eq!(choice::words_of::<ReadMode>(), ["polling", "fanout"]);
        assert_eq!(
            choice::words_of::<TrimmedCheckpoint>(),
            ["fail", "trim_horizon"]
        );
        assert_eq!(choice::words_of::<BalanceMode>(), ["throughput", "count"]);
        assert_eq!(
            choice::words_of::<CheckpointMode>(),
            ["auto", "manual", "watermark"]
        );
    }

    #[test]
    fn initial_position_names_match_serde() {
        for position in [
            InitialPosition::TrimHorizon,
            InitialPosition::Latest,
            InitialPosition::AtTimestamp,
        ] {
            assert_eq!(
                serde_json::to_value(position).unwrap(),
                serde_json::Value::from(position.as_str())
            );
        }
    }
}
