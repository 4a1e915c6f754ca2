//! flotilla-actors: consume Amazon Kinesis Data Streams with a fleet of workers that
//! share the shards through leases in a DynamoDB table, compatible with the KCL 2.x
//! lease table.
//!
//! The crate's codemap, in short (ARCHITECTURE.md at the repository's root is the long
//! one, with the layers `scripts/module-graph.py` checks), lowest layer first:
//!
//! * `model`: pure types — sequence numbers, shards and their lineage, leases,
//!   checkpoints, the lease-table row codec, stream sets, the memory budget, the ack
//!   window. No I/O, no clock. `backoff`: [`backoff::Backoff`] (exponential, jittered
//!   retry delays) and [`backoff::RestartIntensity`] (when a supervisor stops restarting
//!   a child); pure. `mutants`: deliberate protocol bugs for the fault simulator.
//! * `backend`: the only place that talks to AWS. Three ports ([`backend::StreamClient`],
//!   [`backend::LeaseTable`], [`backend::MetricsSink`]), their AWS adapters, in-memory
//!   adapters that behave like the services, and a fault injector.
//! * Logic and configuration over the ports, no actor: `settings` (every tunable, its
//!   validation, and [`Settings::load`]: defaults, a TOML file, `FLOTILLA__…`
//!   variables); `balance` (which leases to take, ask for, hand over, and which are
//!   lost; pure, and `fleet_sim` runs whole fleets on it); `scale` (how many workers
//!   the stream needs, for an autoscaler; pure); `fencing` (self-fencing:
//!   may a lease deliver now); `kpl` (KPL de-aggregation matching the Java KCL);
//!   `metrics` (what a worker measures, the reporter's pure half); `spans` (the worker's
//!   and each shard's tracing span); `handle` (the [`WorkerHandle`] a processor or the
//!   service asks a worker to stop with); `fanout` (the application's fan-out
//!   consumer); `stream_set` ([`StreamSet`], where a multi-stream worker's streams come
//!   from); `oracle` (the one per-key order and loss rule).
//! * `metrics_reporter`: the actor that publishes the metrics, with its own message
//!   type; the actors reach it only through `telemetry`.
//! * What the actors share, below them, so no actor imports another (only a parent its
//!   children): `protocol` (the messages of the supervisor, keeper, watcher, checkpoint
//!   writer and reader, the reasons that travel with them, and the types a processor
//!   speaks to its reader with); `boards` (what the actors share outside their
//!   mailboxes, each written by one and read by others); `status` (every snapshot);
//!   `telemetry` (events that log and count together); `status_tree` (the supervision
//!   tree a person reads), `status_page` (`/status.html`), `status_history` (the charts'
//!   rings), `prometheus` (the `/metrics` text, and [`metric_families`] as data for
//!   other exporters).
//! * The actors: `stream_watcher`, `lease_keeper`, `shard_reader` (a shell over its
//!   parts in `shard_reader/`), `processor` (the user's trait and its host),
//!   `checkpoint_writer`, `status_server` (the HTTP endpoint; it takes no messages);
//!   with them `renewal` (`lease.java_compat`'s renewals, a wrapper of the lease table)
//!   and `multilang` (KCL MultiLangDaemon record processors as child processes behind
//!   the [`Processor`] trait). They reach the outside only through `backend`; their
//!   decisions are pure cores (`shard_reader/pure.rs`, `lease_keeper/pure.rs`,
//!   `checkpoint_writer/pace.rs`).
//! * `supervisor`: the root actor. Inside `supervisor/`: the shell, the restart and
//!   give-up decisions (`pure.rs`, a table of scenarios), the core actors, the status
//!   snapshot and the graceful stops.
//! * `worker`: the embedding API ([`Worker`], [`Backend`]). Inside `worker/`: the
//!   builder, the backend choice, and `boot.rs`, which resolves every kind of source
//!   (names, ARNs, table streams, stream sets, fan-out consumers) once.

// Every public item says what it is for: the API is deliberate (docs/embedding.md, "The
// library's public API").
#![warn(missing_docs)]

pub mod backend;
pub mod backoff;
pub mod balance;
mod boards;
mod checkpoint_writer;
pub mod failure;
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
pub mod scale;
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
