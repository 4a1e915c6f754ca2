//! The Kinesis port: the [`StreamClient`], [`StreamAdmin`] and [`TableStreamAdmin`]
//! traits and the values they pass. Their error is [`StreamError`] (`stream_error`).

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::StreamError;
use crate::model::change::{ChangeError, Item};
use crate::model::{DynamoChange, HashKeyRange, SequenceNumber, Shard, ShardId};

/// Where a shard iterator starts: the five iterator types of GetShardIterator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IteratorPosition {
    /// The oldest record still retained.
    TrimHorizon,
    /// Just after the newest record: only records put from now on.
    Latest,
    /// The record with this sequence number (AT_SEQUENCE_NUMBER).
    AtSequence(SequenceNumber),
    /// The record after this sequence number (AFTER_SEQUENCE_NUMBER): resuming after a
    /// checkpoint.
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
    /// The record's `SequenceNumber` in its shard; shared by every user record of one
    /// KPL aggregate.
    pub sequence_number: SequenceNumber,
    /// The user record's index inside its KPL aggregate; 0 for a plain record.
    pub sub_sequence_number: u64,
    /// The producer's `PartitionKey`; for a DynamoDB table's stream, the item's key as
    /// text.
    pub partition_key: String,
    /// The explicit hash key (a decimal 128-bit number) of a de-aggregated KPL user
    /// record; `None` for a plain record, since GetRecords does not return the producer's.
    pub explicit_hash_key: Option<String>,
    /// The payload; for a DynamoDB table's stream, the change as JSON.
    pub data: Bytes,
    /// When the service received the record (`ApproximateArrivalTimestamp`, or
    /// DynamoDB Streams' `ApproximateCreationDateTime`); `None` when not reported.
    pub approximate_arrival: Option<SystemTime>,
}

impl Record {
    /// The change this record carries, when the source is a DynamoDB table's stream:
    /// its `data` is the change as JSON (see [`DynamoChange`]). An error for a record of
    /// a Kinesis stream, or any data not in that shape.
    pub fn dynamodb_change(&self) -> Result<DynamoChange, ChangeError> {
        DynamoChange::from_json(&self.data)
    }
}

/// A shard created by a split or merge, as GetRecords reports it at the end of a parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildShard {
    /// The child's shard id.
    pub id: ShardId,
    /// Its parents: one after a split, two after a merge.
    pub parents: Vec<ShardId>,
    /// The hash keys the child covers.
    pub hash_range: HashKeyRange,
}

/// The answer to one GetRecords call.
#[derive(Debug, Clone, Default)]
pub struct RecordBatch {
    /// The records read, in increasing sequence order; may be empty on a live shard.
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
    /// Whether a closed shard has been read to its end (SHARD_END): there is no next
    /// iterator, and nothing more will ever be read from this shard.
    pub fn is_shard_end(&self) -> bool {
        self.next_iterator.is_none()
    }
}

/// A registered enhanced fan-out consumer of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// The `ConsumerName`, unique per stream.
    pub name: String,
    /// The `ConsumerARN`, which SubscribeToShard and DeregisterStreamConsumer take.
    pub arn: String,
    /// The `ConsumerStatus`.
    pub status: ConsumerStatus,
    /// The `ConsumerCreationTimestamp`, informational; `None` when the server's is
    /// missing or out of range.
    pub created: Option<SystemTime>,
}

/// A consumer's status: only an `Active` one can subscribe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerStatus {
    /// `CREATING`: registered, not yet usable; poll until `Active`.
    Creating,
    /// `ACTIVE`: may subscribe to shards.
    Active,
    /// `DELETING`: being deregistered; the name is taken until it is gone.
    Deleting,
    /// A status this code does not know, kept as the server spelled it.
    Other(String),
}

impl ConsumerStatus {
    /// The status from the server's spelling (`"ACTIVE"`, …); an unknown one is
    /// [`Self::Other`], never an error.
    pub fn parse(text: &str) -> Self {
        match text {
            "CREATING" => Self::Creating,
            "ACTIVE" => Self::Active,
            "DELETING" => Self::Deleting,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for ConsumerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Creating => "CREATING",
            Self::Active => "ACTIVE",
            Self::Deleting => "DELETING",
            Self::Other(other) => other,
        })
    }
}

/// One event of a shard subscription.
#[derive(Debug, Clone, Default)]
pub struct ShardEvent {
    /// The records of this event, in increasing sequence order; often empty.
    pub records: Vec<Record>,
    /// Where a subscription after this event resumes: it moves on through empty
    /// stretches too. Kinesis sends the last record's sequence number, some emulators
    /// the position after it (see `subscribe_position` in the reader). `None` when the
    /// server sent none (the last event of a shard).
    pub continuation: Option<SequenceNumber>,
    /// How far behind the tip of the shard this event is, in milliseconds
    /// (`MillisBehindLatest`); `None` when not reported.
    pub millis_behind_latest: Option<u64>,
    /// The children of the shard, reported once it is closed. Empty when not reported.
    pub child_shards: Vec<ChildShard>,
}

impl ShardEvent {
    /// Whether this event ends the shard: it names the children and nothing follows
    /// (no records in it, or no continuation). Children alone do not end it: a server
    /// may name them on every event of a closed shard still being read.
    pub fn is_shard_end(&self) -> bool {
        !self.child_shards.is_empty() && (self.records.is_empty() || self.continuation.is_none())
    }
}

/// An open SubscribeToShard: events pulled one at a time. Dropping it closes the
/// subscription (the connection's stream is reset), so nothing more is received.
pub trait Subscription: Send + 'static {
    /// The next event; `Ok(None)` when the server ended the subscription (after five
    /// minutes, or at the end of the shard).
    fn next_event(&mut self) -> BoxFuture<'_, Result<Option<ShardEvent>, StreamError>>;
}

impl fmt::Debug for dyn Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Subscription")
    }
}

/// DescribeStreamSummary, reduced to what a consumer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// The `StreamName` (for a DynamoDB table's stream, the table's name).
    pub name: String,
    /// The `StreamARN`: what fan-out consumers are registered on.
    pub arn: String,
    /// The `StreamStatus` as the server spells it (`"ACTIVE"`, `"CREATING"`, …).
    pub status: String,
    /// The `OpenShardCount`: shards still being written to.
    pub open_shard_count: u32,
    /// How long records are kept, in hours (`RetentionPeriodHours`; 24 for DynamoDB
    /// Streams).
    pub retention_hours: u32,
    /// When the stream was created (Kinesis' `StreamCreationTimestamp`): with the
    /// account in the ARN, it names the stream in multi-stream lease keys. `None` where
    /// the server gives none (an emulator's missing or zero timestamp; DynamoDB
    /// Streams, which multi-stream mode does not read).
    pub created: Option<std::time::SystemTime>,
}

/// What a Kinesis server reports beyond the bare minimum. The real service does all of
/// these; emulators skip some, and the contract tests say so per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// GetRecords names a closed shard's children (`ChildShards`) with its last batch;
    /// without it, the reader finds them by listing the shards.
    pub child_shards_in_get_records: bool,
    /// GetRecords and subscription events report `MillisBehindLatest`; without it the
    /// lag is unknown.
    pub millis_behind_latest: bool,
    /// A subscription to a closed shard ends with an event naming its children.
    /// kinesis-mock's never does (it sends empty events until its five minutes are up),
    /// so a fan-out reader there asks GetRecords whether an idle shard has ended every
    /// `parent_poll_interval` instead of every `shard_sync_interval`.
    pub shard_end_in_subscriptions: bool,
    /// Shards carry hash key ranges that together cover every key once, so a listing
    /// whose open shards do not is one taken mid-reshard. A DynamoDB table's stream has
    /// no ranges (its adapters give every shard the whole key space, and several open
    /// shards at once are normal), so its listing is not checked for coverage.
    pub hash_ranges: bool,
    /// The largest `limit` GetRecords takes: 10,000 on Kinesis, 1,000 on DynamoDB
    /// Streams (which refuses more). Readers ask for at most this, whatever
    /// `reader.max_records` says.
    pub max_records_per_call: u32,
    /// Reads of a shard are metered per call (Kinesis: 5 GetRecords a second per shard,
    /// shared by every consumer), so a reader spaces its calls `reader.poll_interval`
    /// apart even with a backlog. DynamoDB Streams meters no calls per second (at most
    /// two readers per shard), and a call returns at most 1,000 changes, so a reader
    /// that got a full batch reads on at once: spaced, a backlog would drain at 5,000
    /// changes a second.
    pub calls_metered: bool,
}

impl Capabilities {
    /// The real Kinesis service: everything reported, 10,000 records a call, calls
    /// metered per shard.
    pub const FULL: Capabilities = Capabilities {
        child_shards_in_get_records: true,
        millis_behind_latest: true,
        shard_end_in_subscriptions: true,
        hash_ranges: true,
        max_records_per_call: 10_000,
        calls_metered: true,
    };

    /// A DynamoDB table's stream: GetRecords names no children and no lag, there is no
    /// SubscribeToShard, and shards have no hash key ranges.
    pub const TABLE_STREAM: Capabilities = Capabilities {
        child_shards_in_get_records: false,
        millis_behind_latest: false,
        shard_end_in_subscriptions: false,
        hash_ranges: false,
        max_records_per_call: 1_000,
        calls_metered: false,
    };
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
/// * `get_records` returns at most `limit` records (1..=10,000; a DynamoDB Streams adapter
///   serves at most [`Capabilities::max_records_per_call`], 1,000), in increasing sequence
///   order, none twice across successive iterators. An iterator older than five minutes
///   is `IteratorExpired`; a garbage iterator is `InvalidArgument` (or `Transient` where
///   the server answers with a bare 500, as kinesis-mock and moto do: a 5xx is always
///   transient). At the end of a closed shard `next_iterator` is
///   `None`.
pub trait StreamClient: Send + Sync + 'static {
    /// ListShards: every shard of `stream` (a Kinesis stream's name, a DynamoDB Streams
    /// ARN), open and closed, every page.
    fn list_shards<'a>(&'a self, stream: &'a str)
    -> BoxFuture<'a, Result<Vec<Shard>, StreamError>>;

    /// GetShardIterator: an iterator of `shard` of `stream` starting at `position`.
    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>>;

    /// GetRecords: at most `limit` records from `iterator`, and the iterator to read on
    /// with.
    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>>;

    /// DescribeStreamSummary of `stream`; an unknown stream is `NotFound`.
    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>>;

    /// RegisterStreamConsumer: registers an enhanced fan-out consumer of the stream
    /// (by its ARN). A consumer of that name already there is `InUse`.
    ///
    /// The five fan-out calls default to `no_fan_out`: a source without enhanced
    /// fan-out (a DynamoDB table's stream) leaves them out; every Kinesis adapter
    /// implements them.
    fn register_stream_consumer<'a>(
        &'a self,
        _stream_arn: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        Box::pin(async { Err(no_fan_out("RegisterStreamConsumer")) })
    }

    /// DescribeStreamConsumer by the stream's ARN and the consumer's name; an unknown
    /// consumer is `NotFound`.
    fn describe_stream_consumer<'a>(
        &'a self,
        _stream_arn: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        Box::pin(async { Err(no_fan_out("DescribeStreamConsumer")) })
    }

    /// ListStreamConsumers, every page.
    fn list_stream_consumers<'a>(
        &'a self,
        _stream_arn: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Consumer>, StreamError>> {
        Box::pin(async { Err(no_fan_out("ListStreamConsumers")) })
    }

    /// DeregisterStreamConsumer by the consumer's ARN (by name, moto deletes every
    /// other consumer of the stream instead).
    fn deregister_stream_consumer<'a>(
        &'a self,
        _consumer_arn: &'a str,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async { Err(no_fan_out("DeregisterStreamConsumer")) })
    }

    /// SubscribeToShard: opens a push subscription of `consumer_arn` to `shard`. The
    /// answer is a [`Subscription`] the caller pulls events from, one at a time: what
    /// it does not pull, the server is not sent for (flow control holds it).
    fn subscribe_to_shard<'a>(
        &'a self,
        _consumer_arn: &'a str,
        _shard: &'a ShardId,
        _position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<Box<dyn Subscription>, StreamError>> {
        Box::pin(async { Err(no_fan_out("SubscribeToShard")) })
    }

    /// What this server reports; see [`Capabilities`].
    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL
    }
}

/// The answer of a fan-out call to a source that has no enhanced fan-out.
pub fn no_fan_out(op: &'static str) -> StreamError {
    StreamError::InvalidArgument {
        op,
        message: "enhanced fan-out is a Kinesis feature; DynamoDB Streams are read by polling \
                  (reader.mode = \"polling\")"
            .to_owned(),
    }
}

/// Where a put landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    /// The shard the record was written to.
    pub shard: ShardId,
    /// The sequence number the record was given there.
    pub sequence_number: SequenceNumber,
}

/// A record to put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRecord {
    /// The `PartitionKey`: its MD5 hash picks the shard unless `explicit_hash_key` is set.
    pub partition_key: String,
    /// The `ExplicitHashKey` that picks the shard instead of the partition key's hash.
    pub explicit_hash_key: Option<u128>,
    /// The payload.
    pub data: Bytes,
}

/// Writing and resharding a stream: what the demo producer and the tests need. A
/// consumer never calls these.
///
/// Contract: `create_stream` returns once the stream is ACTIVE; `split_shard` and
/// `merge_shards` return once the stream is ACTIVE again, with the parents closed (an
/// ending sequence number) and the children open, naming their parents.
pub trait StreamAdmin: StreamClient {
    /// CreateStream with `shards` shards, returning once the stream is ACTIVE.
    fn create_stream<'a>(
        &'a self,
        stream: &'a str,
        shards: u32,
    ) -> BoxFuture<'a, Result<(), StreamError>>;

    /// DeleteStream.
    fn delete_stream<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<(), StreamError>>;

    /// Puts records in order (PutRecords, split into calls of at most 500). A record
    /// the service refuses is an error naming it, never dropped silently.
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: &'a [PutRecord],
    ) -> BoxFuture<'a, Result<Vec<PutResult>, StreamError>>;

    /// SplitShard: closes `shard` and opens two children, the second starting at hash
    /// key `new_starting_hash_key`.
    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        new_starting_hash_key: u128,
    ) -> BoxFuture<'a, Result<(), StreamError>>;

    /// MergeShards: closes `shard` and `adjacent` (whose hash key ranges must touch) and
    /// opens one child covering both.
    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        adjacent: &'a ShardId,
    ) -> BoxFuture<'a, Result<(), StreamError>>;
}

/// One write to a table whose changes a stream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemWrite {
    /// PutItem: an INSERT, or a MODIFY of an item already there. `attributes` must hold
    /// the table's key attribute ([`TABLE_KEY`], a string).
    Put {
        /// The whole item, key included.
        attributes: Item,
    },
    /// DeleteItem by key: a REMOVE (nothing, if the item is not there).
    Delete {
        /// The item's [`TABLE_KEY`] value.
        key: String,
    },
}

/// The key attribute of the tables [`TableStreamAdmin`] creates: a string named `pk`.
pub const TABLE_KEY: &str = "pk";

/// Making tables with streams and writing their items: what the demo, the tests and the
/// benchmarks need of a DynamoDB Streams source. A consumer never calls these.
///
/// Contract: `create_table_with_stream` returns the stream's ARN once table and stream
/// are ACTIVE (key [`TABLE_KEY`], stream view NEW_AND_OLD_IMAGES); `write_items`
/// applies the writes one after another, in order, each a change on the stream.
pub trait TableStreamAdmin: StreamClient {
    /// CreateTable with a stream; returns the stream's ARN once both are ACTIVE.
    fn create_table_with_stream<'a>(
        &'a self,
        table: &'a str,
    ) -> BoxFuture<'a, Result<String, StreamError>>;

    /// DeleteTable, and with it its stream.
    fn delete_table<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<(), StreamError>>;

    /// Applies `writes` to `table` one after another, in order.
    fn write_items<'a>(
        &'a self,
        table: &'a str,
        writes: &'a [ItemWrite],
    ) -> BoxFuture<'a, Result<(), StreamError>>;
}
