//! Ports to the outside world, and their adapters. Actors talk to Kinesis, DynamoDB and
//! CloudWatch only through these traits: [`StreamClient`] (and its admin ports),
//! [`LeaseTable`] with [`WorkerRows`] (the lease rows, and the heartbeat and roster rows
//! beside them), and [`MetricsSink`].
//!
//! * `lease_table`, `worker_rows`: the two DynamoDB ports, their contracts and errors.
//! * `hook`: each lease-table call as a typed value, and the [`hook::Hook`] trait that
//!   decorators of both ports (faults, `lease.java_compat` renewal) implement once
//!   instead of re-typing every method.
//! * `aws`: thin adapters over the AWS SDK: translate calls and errors, nothing else.
//! * `memory`: in-process adapters that keep state and conditions like the services do;
//!   the embedded default of `flotilla demo` and the fast test double.
//! * `faults`: a wrapper that injects throttling, errors, latency and timeouts: the seeded
//!   plan apart from the decorator of each port.
//! * `layout`: where flotilla's own rows live (the worker table), and how a table of an
//!   older version moves there.
//! * `time_scan`: AT_TIMESTAMP for DynamoDB Streams, which has no such iterator.
//! * `clock`: wall-clock time derived from tokio's clock, so paused tests move it too.

pub mod aws;
pub mod clock;
pub mod faults;
pub mod hook;
pub mod layout;
mod lease_table;
pub mod memory;
mod metrics;
mod stream;
mod stream_error;
pub mod time_scan;
mod worker_rows;

pub use lease_table::{LeaseError, LeaseTable, ScanOutput, TableState};
pub use metrics::{
    MAX_BYTES_PER_CALL, MAX_DATUMS_PER_CALL, MAX_DIMENSIONS, MetricDatum, MetricValue,
    MetricsError, MetricsSink, Unit, batches, validate,
};
pub use worker_rows::{HeartbeatDetail, HeartbeatsOutput, WorkerRows};
/// How a failed call counts in telemetry: a throttle (the service asked us to slow down)
/// or any other failure. One rule for every port's error, so that the `Throttles` and
/// `ApiErrors` metrics mean the same whichever actor made the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// The service asked us to slow down (a throttling code, HTTP 429).
    Throttled,
    /// Any other failure: a 5xx, a timeout, a refused or malformed request.
    Failed,
}

/// An error of a port's call, classified by [`CallFailure`]'s rule.
pub trait Classified {
    /// Whether this error counts as a throttle or as another failure.
    fn call_failure(&self) -> CallFailure;
}

impl Classified for LeaseError {
    fn call_failure(&self) -> CallFailure {
        match self {
            LeaseError::Throttled { .. } => CallFailure::Throttled,
            _ => CallFailure::Failed,
        }
    }
}

impl Classified for StreamError {
    fn call_failure(&self) -> CallFailure {
        match self {
            StreamError::Throttled { .. } => CallFailure::Throttled,
            _ => CallFailure::Failed,
        }
    }
}

impl Classified for MetricsError {
    fn call_failure(&self) -> CallFailure {
        match self {
            MetricsError::Throttled { .. } => CallFailure::Throttled,
            _ => CallFailure::Failed,
        }
    }
}

pub use stream::{
    Capabilities, ChildShard, Consumer, ConsumerStatus, ItemWrite, IteratorPosition, PutRecord,
    PutResult, Record, RecordBatch, ShardEvent, ShardIterator, StreamAdmin, StreamClient,
    StreamSummary, Subscription, TABLE_KEY, TableStreamAdmin,
};
pub use stream_error::StreamError;

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule, for every port: only the service's "slow down" is a throttle; a 5xx, a
    /// timeout or a refused request is a failure, retryable or not.
    #[test]
    fn only_throttles_count_as_throttles_on_every_port() {
        let op = "Op";
        let m = || "m".to_owned();
        let lease = [
            (
                LeaseError::Throttled { op, message: m() },
                CallFailure::Throttled,
            ),
            (
                LeaseError::Transient {
                    op,
                    endpoint: m(),
                    message: m(),
                },
                CallFailure::Failed,
            ),
            (
                LeaseError::NotFound { op, message: m() },
                CallFailure::Failed,
            ),
            (LeaseError::Other { op, message: m() }, CallFailure::Failed),
        ];
        for (error, expected) in lease {
            assert_eq!(error.call_failure(), expected, "{error}");
        }
        let stream = [
            (
                StreamError::Throttled { op, message: m() },
                CallFailure::Throttled,
            ),
            (
                StreamError::Transient {
                    op,
                    endpoint: m(),
                    message: m(),
                },
                CallFailure::Failed,
            ),
            (
                StreamError::IteratorExpired { op, message: m() },
                CallFailure::Failed,
            ),
            (
                StreamError::NotFound { op, message: m() },
                CallFailure::Failed,
            ),
            (StreamError::Other { op, message: m() }, CallFailure::Failed),
        ];
        for (error, expected) in stream {
            assert_eq!(error.call_failure(), expected, "{error}");
        }
        let metrics = [
            (
                MetricsError::Throttled { message: m() },
                CallFailure::Throttled,
            ),
            (
                MetricsError::Transient {
                    endpoint: m(),
                    message: m(),
                },
                CallFailure::Failed,
            ),
            (MetricsError::Other { message: m() }, CallFailure::Failed),
        ];
        for (error, expected) in metrics {
            assert_eq!(error.call_failure(), expected, "{error}");
        }
    }
}
