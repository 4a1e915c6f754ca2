//! The Kinesis port.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::model::{HashKeyRange, SequenceNumber, Shard, ShardId};

/// Where a shard iterator starts: the five iterator types of GetShardIterator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IteratorPosition {
    /// The oldest record still retained.
    TrimHorizon,
    /// Just after the newest record: only records put from now on.
    Latest,
    AtSequence(SequenceNumber),
    AfterSequence(SequenceNumber),
    /// The first record that arrived at or after this instant.
    AtTimestamp(SystemTime),
}

/// An opaque shard iterator. Kinesis expires them five minutes after they are issued.
#[derive(Clone, PartialEq, Eq)]
pub struct ShardIterator(pub String);

impl fmt::Debug for ShardIterator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Iterators are long and say nothing to a reader of logs; show a prefix.
        let shown: String = self.0.chars().take(16).collect();
        write!(f, "ShardIterator({shown}…)")
    }
}

/// One record as GetRecords returns it. `sub_sequence_number` is 0 for a plain record
/// and the index inside the aggregate for a de-aggregated KPL user record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub sequence_number: SequenceNumber,
    pub sub_sequence_number: u64,
    pub partition_key: String,
    pub explicit_hash_key: Option<String>,
    pub data: Bytes,
    pub approximate_arrival: Option<SystemTime>,
}

/// A shard created by a split or merge, as GetRecords reports it at the end of a parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildShard {
    pub id: ShardId,
    pub parents: Vec<ShardId>,
    pub hash_range: HashKeyRange,
}

/// The answer to one GetRecords call.
#[derive(Debug, Clone, Default)]
pub struct RecordBatch {
    pub records: Vec<Record>,
    /// `None` once a closed shard has been read to its end (SHARD_END).
    pub next_iterator: Option<ShardIterator>,
    /// How far behind the tip of the shard this batch is; `None` when not reported.
    pub millis_behind_latest: Option<u64>,
    /// The children of a closed shard, reported with its last batch. Some servers never
    /// report them (see [`Capabilities`]); the caller then finds them by listing.
    pub child_shards: Option<Vec<ChildShard>>,
}

impl RecordBatch {
    pub fn is_shard_end(&self) -> bool {
        self.next_iterator.is_none()
    }
}

/// DescribeStreamSummary, reduced to what a consumer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    pub name: String,
    pub arn: String,
    pub status: String,
    pub open_shard_count: u32,
    pub retention_hours: u32,
}

/// What a Kinesis server reports beyond the bare minimum. The real service does all of
/// these; emulators skip some, and the contract tests say so per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub child_shards_in_get_records: bool,
    pub millis_behind_latest: bool,
}

impl Capabilities {
    pub const FULL: Capabilities = Capabilities {
        child_shards_in_get_records: true,
        millis_behind_latest: true,
    };
}

/// Kinesis errors, by what the caller should do about them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// Back off with jitter and retry.
    #[error("{op}: throttled by Kinesis: {message}")]
    Throttled { op: &'static str, message: String },
    /// Get a new iterator from the last delivered record.
    #[error("{op}: shard iterator expired: {message}")]
    IteratorExpired { op: &'static str, message: String },
    #[error("{op}: not found: {message}")]
    NotFound { op: &'static str, message: String },
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument { op: &'static str, message: String },
    /// A network failure, a timeout or a 5xx: retry.
    #[error("{op}: transient failure talking to {endpoint}: {message}")]
    Transient {
        op: &'static str,
        endpoint: String,
        message: String,
    },
    /// The server's answer lacks what the call needs from it. The adapter reads only
    /// what a call uses, so this names the one thing that was missing; it means the
    /// server returned less than Kinesis promises for that call.
    #[error("{op}: the answer about {what} has no {missing}")]
    IncompleteAnswer {
        op: &'static str,
        what: String,
        missing: &'static str,
    },
    #[error("{op}: {message}")]
    Other { op: &'static str, message: String },
    /// The credentials may not make this call, or are not valid (expired, unknown, a
    /// bad signature): it fails the same way until IAM or the credentials change.
    #[error("{op}: access denied: {message}")]
    AccessDenied { op: &'static str, message: String },
}

impl StreamError {
    /// Whether the same call may succeed if repeated after a pause.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StreamError::Throttled { .. } | StreamError::Transient { .. }
        )
    }
}

/// Reading a Kinesis stream.
///
/// Contract (checked by `tests/contract_stream.rs` on every backend):
/// * `list_shards` returns every shard of the stream, open and closed, paginating with
///   `ExclusiveStartShardId` and the stream name until a page returns nothing new.
///   An unknown stream is `NotFound`.
/// * `get_shard_iterator` with `AtSequence`/`AfterSequence` of a number that is not in
///   the shard is `InvalidArgument` (kinesis-mock answers `NotFound`); an unknown shard
///   is `NotFound`.
/// * `get_records` returns at most `limit` records (1..=10,000), in increasing sequence
///   order, none twice across successive iterators. An iterator older than five minutes
///   is `IteratorExpired`; a garbage iterator is `InvalidArgument` (or `Transient` where
///   the server answers with a bare 500, as kinesis-mock and moto do: a 5xx is always
///   transient). At the end of a closed shard `next_iterator` is
///   `None`.
pub trait StreamClient: Send + Sync + 'static {
    fn list_shards<'a>(&'a self, stream: &'a str)
    -> BoxFuture<'a, Result<Vec<Shard>, StreamError>>;

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>>;

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>>;

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>>;

    /// What this server reports; see [`Capabilities`].
    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL
    }
}

/// Where a put landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    pub shard: ShardId,
    pub sequence_number: SequenceNumber,
}

/// A record to put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRecord {
    pub partition_key: String,
    pub explicit_hash_key: Option<u128>,
    pub data: Bytes,
}

/// Writing and resharding a stream: what the demo producer and the tests need. A
/// consumer never calls these.
///
/// Contract: `create_stream` returns once the stream is ACTIVE; `split_shard` and
/// `merge_shards` return once the stream is ACTIVE again, with the parents closed (an
/// ending sequence number) and the children open, naming their parents.
pub trait StreamAdmin: StreamClient {
    fn create_stream<'a>(
        &'a self,
        stream: &'a str,
        shards: u32,
    ) -> BoxFuture<'a, Result<(), StreamError>>;

    fn delete_stream<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<(), StreamError>>;

    /// Puts records in order (PutRecords, split into calls of at most 500). A record
    /// the service refuses is an error naming it, never dropped silently.
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: &'a [PutRecord],
    ) -> BoxFuture<'a, Result<Vec<PutResult>, StreamError>>;

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        new_starting_hash_key: u128,
    ) -> BoxFuture<'a, Result<(), StreamError>>;

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        adjacent: &'a ShardId,
    ) -> BoxFuture<'a, Result<(), StreamError>>;
}
