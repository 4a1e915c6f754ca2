//! Ports to the outside world, and their adapters. Actors talk to Kinesis, DynamoDB and
//! CloudWatch only through these three traits.
//!
//! * `aws`: thin adapters over the AWS SDK: translate calls and errors, nothing else.
//! * `memory`: in-process adapters that keep state and conditions like the services do;
//!   the embedded default of `flotilla demo` and the fast test double.
//! * `faults`: a wrapper that injects throttling, errors, latency and timeouts.
//! * `clock`: wall-clock time derived from tokio's clock, so paused tests move it too.

pub mod aws;
pub mod clock;
pub mod faults;
mod lease_table;
pub mod memory;
mod metrics;
mod stream;

pub use lease_table::{LeaseError, LeaseTable, ScanOutput, TableState};
pub use metrics::{
    MAX_BYTES_PER_CALL, MAX_DATUMS_PER_CALL, MAX_DIMENSIONS, MetricDatum, MetricValue,
    MetricsError, MetricsSink, Unit, batches, validate,
};
pub use stream::{
    Capabilities, ChildShard, IteratorPosition, PutRecord, PutResult, Record, RecordBatch,
    ShardIterator, StreamAdmin, StreamClient, StreamError, StreamSummary,
};
