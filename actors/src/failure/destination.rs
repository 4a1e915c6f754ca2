//! Where a discarded record goes before its checkpoint moves past it: the [`Envelope`]
//! it is written as, and the [`DeadLetters`] port that writes it. A record is discarded
//! only once `write` has returned `Ok` for it: a destination that cannot be written keeps
//! the shard waiting, and nothing is lost.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// One discarded record, as written to the destination: enough to find the record in its
/// stream, to know why it was discarded, and to process it again by hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The stream the record was read from (as `worker.stream` names it).
    pub stream: String,
    /// The shard it was read from.
    pub shard: String,
    /// Its `SequenceNumber`.
    pub sequence_number: String,
    /// Its index inside a KPL aggregate (0 for a plain record).
    pub sub_sequence_number: u64,
    /// Its `PartitionKey`.
    pub partition_key: String,
    /// When the stream received it (`ApproximateArrivalTimestamp`), in milliseconds since
    /// the Unix epoch; `None` when the stream did not say.
    pub arrival_ms: Option<u64>,
    /// When it was discarded, in milliseconds since the Unix epoch.
    pub discarded_ms: u64,
    /// Why: `"retries"` (it failed `failure.max_retries` retries) or `"age"` (it was
    /// older than `failure.max_record_age`).
    pub reason: String,
    /// How many times the processor was handed it.
    pub attempts: u32,
    /// The processor's last error on it; `None` for a record discarded for its age before
    /// any attempt.
    pub error: Option<String>,
    /// The worker that discarded it.
    pub worker: String,
    /// The record's data, base64 (standard alphabet, padded).
    pub data: String,
}

/// A destination that could not be written: nothing was discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{destination}: {why}")]
pub struct DestinationError {
    /// The destination, as `failure.destination` names it.
    pub destination: String,
    /// What went wrong: the service's error, or what the file system said.
    pub why: String,
}

/// Writes discarded records somewhere durable. Implemented for a Kinesis stream, an SQS
/// queue and a file (see [`crate::Backend`]); any other implementation can be given to
/// the worker.
pub trait DeadLetters: Send + Sync + 'static {
    /// Writes every envelope, in order, or fails. `Ok` means each one is durably stored;
    /// after an `Err` some may have been written and are written again on the retry
    /// (the destination sees a record at least once).
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>>;

    /// The destination as `failure.destination` names it, for log lines and status.
    fn name(&self) -> String;
}
