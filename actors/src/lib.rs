//! flotilla-actors: consume Amazon Kinesis Data Streams with a fleet of workers that
//! share the shards through leases in a DynamoDB table, compatible with the KCL 2.x
//! lease table.
//!
//! * `model`: pure types — sequence numbers, shards and their lineage, leases,
//!   checkpoints, the lease-table row codec. No I/O, no clock.
//! * `backend`: the only place that talks to AWS. Three ports ([`backend::StreamClient`],
//!   [`backend::LeaseTable`], [`backend::MetricsSink`]), their AWS adapters, in-memory
//!   adapters that behave like the services, and a fault injector.
//! * `kpl`: KPL aggregate de-aggregation (and aggregation, for tests and demos), matching
//!   the Java KCL record for record. Pure: no I/O.
//! * `backoff`: [`backoff::Backoff`] (exponential, jittered retry delays) and
//!   [`backoff::RestartIntensity`] (when a supervisor stops restarting a child). Pure:
//!   the random draw and the current instant are parameters.

//! * `balance`: which leases to take, ask for, hand over, and which are lost. Pure:
//!   time is a parameter. `fleet_sim` runs whole fleets on it, round by round.
//! * `renewal`: `lease.java_compat`'s renewals, a wrapper of the lease table that bumps
//!   held leases' counters for Java KCL workers while everything above keeps the
//!   counter it took the lease with (`Lives`: the pure bookkeeping).
//! * `settings`: every tunable with its default and its validation, and
//!   [`Settings::load`] (defaults, a TOML file, `FLOTILLA__…` variables).
//! * `protocol`: every message the actors exchange, the reasons that travel with them,
//!   and the types a processor speaks to its reader with; `status`: every snapshot;
//!   `telemetry`: events that log and count together. Below the actors, so no actor
//!   imports another (only a parent its children).
//! * The actors, one module each: `supervisor` (the root), `stream_watcher`,
//!   `lease_keeper`, `shard_reader`, `processor` (the user's trait and its host),
//!   `checkpoint_writer`, `metrics_reporter`. They reach the outside only through
//!   `backend`; the reader's and the keeper's decisions are their pure cores
//!   (`shard_reader/pure.rs`, `lease_keeper/pure.rs`).
//! * `multilang`: KCL MultiLangDaemon record processors (Python, Node.js, …) as child
//!   processes, one per shard, behind the [`Processor`] trait; the binary's `flotilla
//!   multilang` reads the daemon's properties file.
//! * `stream_set`: [`StreamSet`], where a multi-stream worker's streams come from (a
//!   fixed list, or a source asked at every shard sync).
//! * `worker`: the embedding API ([`Worker`], [`Backend`]); `handle`: the
//!   [`WorkerHandle`] a processor or the service asks a worker to stop with; `status`:
//!   the snapshots it returns. `status_server`: the HTTP endpoint; `prometheus`: its
//!   `/metrics` text, every family named from a `metrics::Metric` by one rule; `status_tree`: the supervision tree a person reads,
//!   one pure function of a snapshot (the page draws it, `flotilla status` prints it);
//!   `status_page`: `/status.html`, that tree and its charts drawn as one page;
//!   `status_history`: the bounded rings of the last 10 minutes the charts draw;
//!   [`metric_families`]: the `/metrics` families as data for other exporters (the
//!   binary's OTLP push).
//! * `spans`: the worker's and each shard's tracing span, and `Spanned`, which runs an
//!   actor's callbacks in its span (the subscriber and format are the embedder's).
//! * Inside `supervisor/`: the shell, the restart and give-up decisions (`pure.rs`, a
//!   table of scenarios), the status snapshot and the graceful stops; inside `worker/`:
//!   the builder, the backend choice, and `boot.rs`, which resolves every kind of source
//!   (names, ARNs, table streams, stream sets, fan-out consumers) once.

// Every public item says what it is for: the API is deliberate (README, "The library's
// public API").
#![warn(missing_docs)]

pub mod backend;
pub mod backoff;
pub mod balance;
mod checkpoint_writer;
pub mod fanout;
mod fencing;
/// Not public API: a pure simulation of fleets deciding with `balance`, for its property
/// tests and the fleet benchmark. Public only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub mod fleet_sim;
mod handle;
pub mod kpl;
mod lease_keeper;
mod metrics;
/// Not public API: the worker starts its own reporter; public only with the `testing`
/// feature, for `tests/metrics_reporter.rs`, which drives the actor alone.
#[cfg(feature = "testing")]
pub mod metrics_reporter;
#[cfg(not(feature = "testing"))]
mod metrics_reporter;
pub mod model;
pub mod multilang;
/// Not public API: deliberate protocol bugs for the fault simulator; public only with
/// the `testing` feature, for `examples/simulate.rs`, which switches them on.
#[cfg(feature = "testing")]
pub mod mutants;
#[cfg(not(feature = "testing"))]
mod mutants;
pub mod oracle;
mod processor;
#[cfg(feature = "status-server")]
mod prometheus;
mod protocol;
mod renewal;
pub mod settings;
mod shard_reader;
mod spans;
pub mod status;
pub mod status_history;
pub mod status_page;
#[cfg(feature = "status-server")]
mod status_server;
pub mod status_tree;
pub mod stream_set;
mod stream_watcher;
mod supervisor;
mod telemetry;
mod worker;

pub use backend::Record;
pub use backend::aws::Endpoints;
pub use fencing::FenceReason;
pub use handle::WorkerHandle;
pub use processor::{Processor, ProcessorError};
#[cfg(feature = "status-server")]
pub use prometheus::{FamilyPoints, MetricFamily, metric_families};
pub use protocol::{
    AckToken, Batch, CheckpointError, Checkpointer, PreparedCheckpoint, ProcessorMsg, ShardInfo,
};
pub use settings::{
    AwsSettings, CheckpointMode, InitialPosition, LoadError, MetricsLevel, Settings,
};
pub use status::{
    BudgetView, CheckpointView, KeeperStatus, ReleaseReport, ShardShutdown, ShardState,
    ShardStatus, ShutdownReport, WatcherStatus, WorkerStatus,
};
pub use stream_set::StreamSet;
pub use worker::{
    Backend, ProcessorActorFactory, RequestedShutdown, StatusProbe, Worker, WorkerBuilder,
    WorkerError,
};
