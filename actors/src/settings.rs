//! Every tunable of a worker, with its default. `config/default.toml` at the project root
//! repeats each one with a comment; a test keeps the two in step.
//!
//! Durations are written as text ("10s", "250ms", "5min"), so a file says what it means.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// All settings of one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct Settings {
    pub worker: WorkerSettings,
    pub lease: LeaseSettings,
    pub reader: ReaderSettings,
    pub checkpoint: CheckpointSettings,
    pub supervision: SupervisionSettings,
    pub metrics: MetricsSettings,
    pub aws: AwsSettings,
}

/// Where a shard with no checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InitialPosition {
    #[serde(rename = "TRIM_HORIZON")]
    TrimHorizon,
    #[serde(rename = "LATEST")]
    Latest,
    #[serde(rename = "AT_TIMESTAMP")]
    AtTimestamp,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSettings {
    /// The Kinesis stream to consume.
    pub stream: String,
    /// The application name; also the lease table's name.
    pub application: String,
    /// This worker's id in the lease table; a random one when absent.
    pub worker_id: Option<String>,
    pub initial_position: InitialPosition,
    /// RFC 3339; required when `initial_position` is AT_TIMESTAMP.
    pub initial_timestamp: Option<String>,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            stream: String::new(),
            application: String::new(),
            worker_id: None,
            initial_position: InitialPosition::TrimHorizon,
            initial_timestamp: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSettings {
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
    /// The most leases this worker holds; 0 means no limit.
    pub max_leases: u32,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            failover_time: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            fence_margin: Duration::from_secs(3),
            max_leases: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReaderSettings {
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
    /// Backoff bounds after throttling or a transient error.
    #[serde(with = "duration_text")]
    pub backoff_min: Duration,
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
}

impl Default for ReaderSettings {
    fn default() -> Self {
        Self {
            max_records: 10_000,
            poll_interval: Duration::from_millis(200),
            idle_max: Duration::from_secs(1),
            window_records: 50_000,
            window_bytes: 64 * 1024 * 1024,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            processor_timeout: Duration::from_secs(300),
            parent_poll_interval: Duration::from_secs(1),
            shard_sync_interval: Duration::from_secs(60),
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSettings {
    pub mode: CheckpointMode,
    /// At most one checkpoint write per shard per interval; SHARD_END, shutdown and
    /// handoff flush at once.
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionSettings {
    /// Backoff bounds between restarts of a failed shard reader or processor.
    #[serde(with = "duration_text")]
    pub restart_backoff_min: Duration,
    #[serde(with = "duration_text")]
    pub restart_backoff_max: Duration,
    /// More than this many restarts of one shard within `shard_restart_window` releases
    /// the shard's lease and cools it down locally.
    pub shard_max_restarts: u32,
    #[serde(with = "duration_text")]
    pub shard_restart_window: Duration,
    /// How long a given-up shard is left alone by this worker.
    #[serde(with = "duration_text")]
    pub shard_cooldown: Duration,
    /// More than this many restarts of a core actor within `core_restart_window` stops
    /// the worker with an error.
    pub core_max_restarts: u32,
    #[serde(with = "duration_text")]
    pub core_restart_window: Duration,
    /// How long a graceful shutdown waits for processors to finish.
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    pub level: MetricsLevel,
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AwsSettings {
    /// The region; the default chain's when absent.
    pub region: Option<String>,
    /// Endpoint URLs for local servers; AWS when absent.
    pub kinesis_endpoint: Option<String>,
    pub dynamodb_endpoint: Option<String>,
    pub cloudwatch_endpoint: Option<String>,
}

/// Durations as human text ("10s", "250ms") in files and environment variables.
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration ({e}); write e.g. \"10s\" or \"250ms\""
            ))
        })
    }
}
