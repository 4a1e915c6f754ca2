//! An in-memory Kinesis: streams, shards, records, iterators, splits and merges.
//!
//! It routes partition keys by MD5 hash-key range exactly as Kinesis does, closes
//! parents with an ending sequence number when resharding, reports ChildShards at the
//! end of a closed shard, expires iterators, trims past retention, caps GetRecords at
//! 10,000 records / 10 MB, and (optionally) throttles reads at 5 calls/s and 2 MB/s per
//! shard. All time comes from tokio's clock (see [`Clock`]), so tests can pause it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::backend::clock::Clock;
use crate::backend::{
    ChildShard, Consumer, ConsumerStatus, IteratorPosition, PutRecord, PutResult, Record,
    RecordBatch, ShardEvent, ShardIterator, StreamAdmin, StreamClient, StreamError, StreamSummary,
    Subscription,
};
use crate::model::{
    HashKeyRange, SequenceNumber, SequenceRange, Shard, ShardId, StreamArn, partition_key_hash,
};

/// Per-shard read limits of a provisioned Kinesis stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// GetRecords calls a shard serves in any one second; more are `Throttled`.
    pub calls_per_second: usize,
    /// Bytes a shard returns in any one second; once reached, calls are `Throttled`.
    pub bytes_per_second: usize,
}

impl ReadLimits {
    /// What Kinesis allows per shard: 5 GetRecords calls and 2 MB per second.
    pub const KINESIS: ReadLimits = ReadLimits {
        calls_per_second: 5,
        bytes_per_second: 2 * 1024 * 1024,
    };
}

/// What GetRecords and GetShardIterator do where Kinesis and DynamoDB Streams differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRules {
    /// The largest `limit` GetRecords accepts (a larger one is `InvalidArgument`).
    pub max_records: u32,
    /// GetRecords stops before the record that would take the answer past this size.
    pub max_bytes: usize,
    /// Whether a position older than the shard's trim horizon (an AT/AFTER sequence
    /// number whose following records were trimmed, or an iterator pointing at trimmed
    /// records) is `StreamError::Trimmed`. Kinesis silently starts at the horizon;
    /// DynamoDB Streams answers TrimmedDataAccessException, so that a consumer knows it
    /// lost changes instead of skipping them unawares.
    pub trimmed_position_is_error: bool,
}

impl ReadRules {
    /// Kinesis: 10,000 records and 10 MB per call; old positions start at the horizon.
    pub const KINESIS: ReadRules = ReadRules {
        max_records: MAX_RECORDS_PER_CALL,
        max_bytes: MAX_BYTES_PER_CALL,
        trimmed_position_is_error: false,
    };

    /// DynamoDB Streams: 1,000 records and 1 MB per call; a trimmed position is an error.
    pub const DYNAMODB_STREAMS: ReadRules = ReadRules {
        max_records: 1_000,
        max_bytes: 1024 * 1024,
        trimmed_position_is_error: true,
    };
}

/// How [`MemoryStreams`] behaves: timeouts, retention, limits. The default is Kinesis'
/// rules without read limits, with consumers ACTIVE after half a second.
#[derive(Debug, Clone)]
pub struct MemoryStreamsConfig {
    /// How long an iterator stays valid after it is issued (Kinesis: 5 minutes).
    pub iterator_ttl: Duration,
    /// How long records are kept (Kinesis default: 24 hours).
    pub retention: Duration,
    /// `None` reads without limits; `Some` throttles like a provisioned shard.
    pub read_limits: Option<ReadLimits>,
    /// How long a SubscribeToShard subscription lasts before the server ends it
    /// (Kinesis: 5 minutes).
    pub subscription_ttl: Duration,
    /// How long a registered consumer stays CREATING before it is ACTIVE.
    pub consumer_activation: Duration,
    /// A subscription sends an event at least this often, records or not (its lag and
    /// its continuation move on through idle stretches).
    pub subscription_heartbeat: Duration,
    /// Kinesis's by default; see [`ReadRules`].
    pub read_rules: ReadRules,
}

impl Default for MemoryStreamsConfig {
    fn default() -> Self {
        Self {
            iterator_ttl: Duration::from_secs(300),
            retention: Duration::from_secs(24 * 3600),
            read_limits: None,
            subscription_ttl: Duration::from_secs(300),
            consumer_activation: Duration::from_millis(500),
            subscription_heartbeat: Duration::from_secs(1),
            read_rules: ReadRules::KINESIS,
        }
    }
}

/// Registered consumers per stream, as Kinesis allows: at most 20.
pub const MAX_CONSUMERS_PER_STREAM: usize = 20;
/// A second subscription of one consumer to one shard within this long of the first is
/// refused (ResourceInUse); after it, the new one replaces the old.
const SUBSCRIPTION_REPLACE_AFTER: Duration = Duration::from_secs(5);
/// SubscribeToShard may be called once per second per consumer and shard.
const SUBSCRIBE_INTERVAL: Duration = Duration::from_secs(1);

/// GetRecords caps: 10,000 records and 10 MB per call.
pub const MAX_RECORDS_PER_CALL: u32 = 10_000;
pub const MAX_BYTES_PER_CALL: usize = 10 * 1024 * 1024;
/// A record's data plus partition key may not exceed 1 MiB.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// Kinesis-style sequence numbers are 56 digits; ours are too, so the 128-bit-plus
/// path is exercised everywhere the memory backend is used.
fn sequence_number(counter: u64) -> SequenceNumber {
    // Cannot fail: the text is 56 ASCII digits.
    SequenceNumber::parse(&format!("49{counter:054}"))
        .unwrap_or_else(|_| SequenceNumber::from_u128(u128::from(counter)))
}

/// The counter behind a sequence number this stream issued; `None` for any other.
fn counter_of(sequence: &SequenceNumber) -> Option<u64> {
    let text = sequence.as_str();
    (text.len() == 56)
        .then(|| text.strip_prefix("49"))
        .flatten()
        .and_then(|rest| rest.parse().ok())
}

#[derive(Debug)]
struct StoredRecord {
    counter: u64,
    sequence: SequenceNumber,
    partition_key: String,
    explicit_hash_key: Option<u128>,
    data: Bytes,
    arrival: SystemTime,
    arrived_at: Instant,
}

#[derive(Debug)]
struct ShardState {
    id: ShardId,
    parent: Option<ShardId>,
    adjacent_parent: Option<ShardId>,
    range: HashKeyRange,
    start_counter: u64,
    /// Set when the shard is closed: the last counter it will ever hold.
    end_counter: Option<u64>,
    closed_at: Option<Instant>,
    children: Vec<ShardId>,
    records: VecDeque<StoredRecord>,
    /// Records trimmed from the front: the logical offset of `records[0]`.
    trimmed: u64,
    /// The counter of the newest trimmed record: positions up to it are gone.
    last_trimmed: Option<u64>,
    /// Recent GetRecords calls, for the read limits: (when, bytes returned).
    reads: VecDeque<(Instant, usize)>,
}

impl ShardState {
    fn total(&self) -> u64 {
        self.trimmed + self.records.len() as u64
    }

    fn to_shard(&self) -> Shard {
        Shard {
            id: self.id.clone(),
            parent: self.parent.clone(),
            adjacent_parent: self.adjacent_parent.clone(),
            hash_range: self.range,
            sequence_range: SequenceRange {
                start: sequence_number(self.start_counter),
                end: self.end_counter.map(sequence_number),
            },
        }
    }

    fn trim(&mut self, now: Instant, retention: Duration) {
        while let Some(front) = self.records.front() {
            if now.duration_since(front.arrived_at) <= retention {
                break;
            }
            self.last_trimmed = Some(front.counter);
            self.records.pop_front();
            self.trimmed += 1;
        }
    }

    /// The logical offset of the first record whose counter is `>= counter`.
    fn offset_of(&self, counter: u64) -> u64 {
        self.trimmed + self.records.partition_point(|r| r.counter < counter) as u64
    }
}

#[derive(Debug)]
struct StreamState {
    shards: Vec<ShardState>,
    /// When it was created (the clock's wall time), as DescribeStreamSummary says.
    created: SystemTime,
}

impl StreamState {
    fn shard_mut(
        &mut self,
        op: &'static str,
        stream: &str,
        id: &ShardId,
    ) -> Result<(usize, &mut ShardState), StreamError> {
        self.shards
            .iter_mut()
            .enumerate()
            .find(|(_, s)| &s.id == id)
            .ok_or_else(|| StreamError::NotFound {
                op,
                message: format!("shard {id} in stream {stream}"),
            })
    }
}

#[derive(Debug, Default)]
struct State {
    streams: BTreeMap<String, StreamState>,
    next_counter: u64,
    /// Registered consumers by stream name.
    consumers: BTreeMap<String, Vec<ConsumerState>>,
    /// Per (consumer ARN, stream, shard index): the open subscription's id and when it
    /// was made, and when SubscribeToShard was last called.
    subscriptions: BTreeMap<(String, String, usize), OpenSubscription>,
    next_subscription: u64,
}

#[derive(Debug)]
struct ConsumerState {
    name: String,
    arn: String,
    created: SystemTime,
    active_at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct OpenSubscription {
    id: u64,
    open: bool,
    since: Instant,
}

impl State {
    fn allocate(&mut self) -> u64 {
        self.next_counter += 1;
        self.next_counter
    }

    fn stream_mut(
        &mut self,
        op: &'static str,
        name: &str,
    ) -> Result<&mut StreamState, StreamError> {
        self.streams
            .get_mut(name)
            .ok_or_else(|| StreamError::NotFound {
                op,
                message: format!("stream {name}"),
            })
    }
}

/// Any number of in-memory streams. Clones share state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use bytes::Bytes;
/// use flotilla_actors::backend::memory::{MemoryStreams, MemoryStreamsConfig};
/// use flotilla_actors::backend::{IteratorPosition, PutRecord, StreamAdmin, StreamClient};
///
/// let streams = MemoryStreams::new(MemoryStreamsConfig::default());
/// streams.create_stream("orders", 2).await?;
/// let put = streams
///     .put_records("orders", &[PutRecord {
///         partition_key: "customer-7".into(),
///         explicit_hash_key: None,
///         data: Bytes::from_static(b"{\"total\": 12}"),
///     }])
///     .await?;
/// // The record went to the shard whose hash-key range holds MD5("customer-7").
/// let iterator = streams
///     .get_shard_iterator("orders", &put[0].shard, &IteratorPosition::TrimHorizon)
///     .await?;
/// let batch = streams.get_records(&iterator, 100).await?;
/// assert_eq!(batch.records[0].partition_key, "customer-7");
/// assert_eq!(batch.records[0].sequence_number, put[0].sequence_number);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStreams {
    state: Arc<Mutex<State>>,
    config: MemoryStreamsConfig,
    clock: Clock,
    /// Woken on every change of the streams, for subscriptions waiting on records.
    changed: Arc<tokio::sync::Notify>,
}

/// What an iterator string holds. It is self-contained (no server-side table to grow):
/// the stream, the shard, the logical offset of the next record, and when it was issued.
#[derive(Debug)]
struct IteratorToken {
    stream: String,
    shard: usize,
    offset: u64,
    issued_nanos: u128,
}

impl IteratorToken {
    fn encode(&self) -> ShardIterator {
        let text = format!(
            "{}|{}|{}|{}",
            self.stream, self.shard, self.offset, self.issued_nanos
        );
        ShardIterator(URL_SAFE_NO_PAD.encode(text))
    }

    fn decode(iterator: &ShardIterator) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(&iterator.0).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let mut parts = text.rsplitn(4, '|');
        let issued_nanos = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let shard = parts.next()?.parse().ok()?;
        let stream = parts.next()?.to_owned();
        Some(Self {
            stream,
            shard,
            offset,
            issued_nanos,
        })
    }
}

impl MemoryStreams {
    /// Must be called inside a tokio runtime (the clock starts here).
    pub fn new(config: MemoryStreamsConfig) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            config,
            clock: Clock::new(),
            changed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied change here:
        // every mutation is a single step. Keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock arrival times are read from (it follows tokio's clock).
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The configuration this backend was made with.
    pub fn config(&self) -> &MemoryStreamsConfig {
        &self.config
    }

    pub(super) fn create(&self, name: &str, shards: u32) -> Result<(), StreamError> {
        if shards == 0 {
            return Err(StreamError::InvalidArgument {
                op: "CreateStream",
                message: "shard count must be at least 1".into(),
            });
        }
        let mut state = self.lock();
        if state.streams.contains_key(name) {
            return Err(StreamError::InvalidArgument {
                op: "CreateStream",
                message: format!("stream {name} already exists"),
            });
        }
        let created = self.clock.wall();
        let mut list = Vec::new();
        for (i, range) in HashKeyRange::even_split(shards).into_iter().enumerate() {
            let start = state.allocate();
            list.push(new_shard(
                ShardId::from_index(i as u64),
                None,
                None,
                range,
                start,
            ));
        }
        state.streams.insert(
            name.to_owned(),
            StreamState {
                shards: list,
                created,
            },
        );
        Ok(())
    }

    fn put(&self, stream: &str, records: &[PutRecord]) -> Result<Vec<PutResult>, StreamError> {
        const OP: &str = "PutRecords";
        for record in records {
            if record.partition_key.is_empty() || record.partition_key.chars().count() > 256 {
                return Err(StreamError::InvalidArgument {
                    op: OP,
                    message: format!(
                        "partition key {:?} must be 1 to 256 characters",
                        record.partition_key
                    ),
                });
            }
            let size = record.partition_key.len() + record.data.len();
            if size > MAX_RECORD_BYTES {
                return Err(StreamError::InvalidArgument {
                    op: OP,
                    message: format!(
                        "record with partition key {:?} is {size} bytes; the limit is {MAX_RECORD_BYTES}",
                        record.partition_key
                    ),
                });
            }
        }
        let mut state = self.lock();
        state.stream_mut(OP, stream)?;
        records
            .iter()
            .map(|record| {
                self.append(
                    &mut state,
                    OP,
                    stream,
                    &record.partition_key,
                    record.explicit_hash_key,
                    |_, _| record.data.clone(),
                )
            })
            .collect()
    }

    /// Puts one record whose data is made once its sequence number and arrival time are
    /// known: a DynamoDB change record carries both. The partition key is not checked
    /// against Kinesis's limits (an item's key may be longer than 256 characters).
    pub(super) fn put_with(
        &self,
        stream: &str,
        partition_key: &str,
        data: impl FnOnce(&SequenceNumber, SystemTime) -> Bytes,
    ) -> Result<PutResult, StreamError> {
        let put = self.append(
            &mut self.lock(),
            "PutRecord",
            stream,
            partition_key,
            None,
            data,
        );
        self.changed.notify_waiters();
        put
    }

    /// Appends one record to the open shard of `stream` whose range holds the hash key.
    fn append(
        &self,
        state: &mut State,
        op: &'static str,
        stream: &str,
        partition_key: &str,
        explicit_hash_key: Option<u128>,
        data: impl FnOnce(&SequenceNumber, SystemTime) -> Bytes,
    ) -> Result<PutResult, StreamError> {
        let now = self.clock.now();
        let arrival = self.clock.wall();
        let hash = explicit_hash_key.unwrap_or_else(|| partition_key_hash(partition_key));
        state.stream_mut(op, stream)?;
        let counter = state.allocate();
        let target = state.stream_mut(op, stream)?;
        let shard = target
            .shards
            .iter_mut()
            .find(|s| s.end_counter.is_none() && s.range.contains(hash))
            .ok_or_else(|| StreamError::Other {
                op,
                message: format!("no open shard of {stream} covers hash key {hash}"),
            })?;
        let sequence = sequence_number(counter);
        shard.trim(now, self.config.retention);
        shard.records.push_back(StoredRecord {
            counter,
            data: data(&sequence, arrival),
            sequence: sequence.clone(),
            partition_key: partition_key.to_owned(),
            explicit_hash_key,
            arrival,
            arrived_at: now,
        });
        Ok(PutResult {
            shard: shard.id.clone(),
            sequence_number: sequence,
        })
    }

    fn iterator(
        &self,
        stream: &str,
        shard_id: &ShardId,
        position: &IteratorPosition,
    ) -> Result<ShardIterator, StreamError> {
        const OP: &str = "GetShardIterator";
        let now = self.clock.now();
        let mut state = self.lock();
        let (index, shard) = state
            .stream_mut(OP, stream)?
            .shard_mut(OP, stream, shard_id)?;
        shard.trim(now, self.config.retention);
        let in_range = |seq: &SequenceNumber| -> Result<u64, StreamError> {
            let invalid = || StreamError::InvalidArgument {
                op: OP,
                message: format!(
                    "sequence number {seq} is not in shard {shard_id} of stream {stream}"
                ),
            };
            let counter = counter_of(seq).ok_or_else(invalid)?;
            let last = shard.end_counter.unwrap_or(u64::MAX);
            if counter < shard.start_counter || counter > last {
                return Err(invalid());
            }
            Ok(counter)
        };
        // The first counter the position asks for: a trimmed record at or after it means
        // records between the position and the horizon are gone.
        let trimmed = |first: u64| -> Result<u64, StreamError> {
            match shard.last_trimmed {
                Some(last) if self.config.read_rules.trimmed_position_is_error && first <= last => {
                    Err(StreamError::Trimmed {
                        op: OP,
                        message: format!(
                            "shard {shard_id} of stream {stream} no longer holds the records \
                             from {} on: its oldest retained record is after {}",
                            sequence_number(first),
                            sequence_number(last)
                        ),
                    })
                }
                _ => Ok(shard.offset_of(first)),
            }
        };
        let offset = match position {
            IteratorPosition::TrimHorizon => shard.trimmed,
            IteratorPosition::Latest => shard.total(),
            IteratorPosition::AtSequence(seq) => trimmed(in_range(seq)?)?,
            IteratorPosition::AfterSequence(seq) => trimmed(in_range(seq)?.saturating_add(1))?,
            IteratorPosition::AtTimestamp(at) => {
                shard.trimmed + shard.records.partition_point(|r| r.arrival < *at) as u64
            }
        };
        Ok(IteratorToken {
            stream: stream.to_owned(),
            shard: index,
            offset,
            issued_nanos: self.clock.elapsed().as_nanos(),
        }
        .encode())
    }

    fn read(&self, iterator: &ShardIterator, limit: u32) -> Result<RecordBatch, StreamError> {
        self.read_from(iterator, limit, true)
    }

    /// GetRecords; `limited`: counted against the shard's read limits (a subscription's
    /// reads are not: each consumer has its own throughput).
    fn read_from(
        &self,
        iterator: &ShardIterator,
        limit: u32,
        limited: bool,
    ) -> Result<RecordBatch, StreamError> {
        const OP: &str = "GetRecords";
        let rules = self.config.read_rules;
        if limit == 0 || limit > rules.max_records {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!("limit {limit} must be between 1 and {}", rules.max_records),
            });
        }
        let token =
            IteratorToken::decode(iterator).ok_or_else(|| StreamError::InvalidArgument {
                op: OP,
                message: "shard iterator is not one this server issued".into(),
            })?;
        let age = self
            .clock
            .elapsed()
            .as_nanos()
            .saturating_sub(token.issued_nanos);
        if age > self.config.iterator_ttl.as_nanos() {
            return Err(StreamError::IteratorExpired {
                op: OP,
                message: format!(
                    "iterator issued {:.0} s ago; iterators expire after {} s",
                    age as f64 / 1e9,
                    self.config.iterator_ttl.as_secs()
                ),
            });
        }
        let now = self.clock.now();
        let wall = self.clock.wall();
        let mut state = self.lock();
        let stream = state.stream_mut(OP, &token.stream)?;
        let Some(shard) = stream.shards.get_mut(token.shard) else {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: "shard iterator names no shard of this stream".into(),
            });
        };
        if limited && let Some(limits) = self.config.read_limits {
            while shard
                .reads
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) >= Duration::from_secs(1))
            {
                shard.reads.pop_front();
            }
            let bytes: usize = shard.reads.iter().map(|(_, b)| b).sum();
            if shard.reads.len() >= limits.calls_per_second || bytes >= limits.bytes_per_second {
                return Err(StreamError::Throttled {
                    op: OP,
                    message: format!(
                        "rate exceeded for shard {}: {} calls and {bytes} bytes in the last second",
                        shard.id,
                        shard.reads.len()
                    ),
                });
            }
        }
        shard.trim(now, self.config.retention);
        if rules.trimmed_position_is_error && token.offset < shard.trimmed {
            return Err(StreamError::Trimmed {
                op: OP,
                message: format!(
                    "the iterator points at records of shard {} that are past retention ({} \
                     records were trimmed, it points at the {}th)",
                    shard.id,
                    shard.trimmed,
                    token.offset + 1
                ),
            });
        }
        let start = token.offset.max(shard.trimmed);
        let skip = (start - shard.trimmed) as usize;
        let mut records = Vec::new();
        let mut bytes = 0usize;
        for stored in shard.records.iter().skip(skip).take(limit as usize) {
            let size = stored.data.len() + stored.partition_key.len();
            if !records.is_empty() && bytes + size > rules.max_bytes {
                break;
            }
            bytes += size;
            records.push(Record {
                sequence_number: stored.sequence.clone(),
                sub_sequence_number: 0,
                partition_key: stored.partition_key.clone(),
                explicit_hash_key: stored.explicit_hash_key.map(|k| k.to_string()),
                data: stored.data.clone(),
                approximate_arrival: Some(stored.arrival),
            });
        }
        if limited && self.config.read_limits.is_some() {
            shard.reads.push_back((now, bytes));
        }
        let next = start + records.len() as u64;
        let at_end = next >= shard.total();
        let millis_behind_latest = if at_end {
            0
        } else {
            shard
                .records
                .get((next - shard.trimmed) as usize)
                .map(|r| {
                    wall.duration_since(r.arrival)
                        .unwrap_or_default()
                        .as_millis() as u64
                })
                .unwrap_or(0)
        };
        if at_end && shard.end_counter.is_some() {
            // SHARD_END: report the children, as GetRecords does with the last batch.
            let children = shard.children.clone();
            let child_shards = children
                .iter()
                .filter_map(|c| stream.shards.iter().find(|s| &s.id == c))
                .map(|c| ChildShard {
                    id: c.id.clone(),
                    parents: c
                        .parent
                        .iter()
                        .chain(c.adjacent_parent.iter())
                        .cloned()
                        .collect(),
                    hash_range: c.range,
                })
                .collect();
            return Ok(RecordBatch {
                records,
                next_iterator: None,
                millis_behind_latest: Some(0),
                child_shards: Some(child_shards),
            });
        }
        Ok(RecordBatch {
            records,
            next_iterator: Some(
                IteratorToken {
                    stream: token.stream,
                    shard: token.shard,
                    offset: next,
                    issued_nanos: self.clock.elapsed().as_nanos(),
                }
                .encode(),
            ),
            millis_behind_latest: Some(millis_behind_latest),
            child_shards: None,
        })
    }

    fn close(
        state: &mut State,
        stream: &str,
        id: &ShardId,
        op: &'static str,
    ) -> Result<usize, StreamError> {
        let end = state.allocate();
        let (index, shard) = state.stream_mut(op, stream)?.shard_mut(op, stream, id)?;
        if shard.end_counter.is_some() {
            return Err(StreamError::InvalidArgument {
                op,
                message: format!("shard {id} of stream {stream} is closed"),
            });
        }
        // The ending sequence number is the last record's, or a fresh one if it holds none.
        shard.end_counter = Some(shard.records.back().map(|r| r.counter).unwrap_or(end));
        Ok(index)
    }

    /// SplitShard; returns the two children.
    pub(super) fn split(
        &self,
        stream: &str,
        id: &ShardId,
        at: u128,
    ) -> Result<Vec<ShardId>, StreamError> {
        const OP: &str = "SplitShard";
        let now = self.clock.now();
        let mut state = self.lock();
        let (_, shard) = state.stream_mut(OP, stream)?.shard_mut(OP, stream, id)?;
        let range = shard.range;
        if shard.end_counter.is_some() {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!("shard {id} of stream {stream} is closed"),
            });
        }
        if at <= range.start || at > range.end {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!(
                    "new starting hash key {at} is not inside ({}, {}] of shard {id}",
                    range.start, range.end
                ),
            });
        }
        let halves = [
            HashKeyRange {
                start: range.start,
                end: at - 1,
            },
            HashKeyRange {
                start: at,
                end: range.end,
            },
        ];
        Self::replace(&mut state, OP, stream, id, now, &halves)
    }

    /// Closes open shard `id` and opens one child per range, each naming `id` as its
    /// only parent (no ranges: the shard just closes). The caller checks the ranges.
    fn replace(
        state: &mut State,
        op: &'static str,
        stream: &str,
        id: &ShardId,
        now: Instant,
        ranges: &[HashKeyRange],
    ) -> Result<Vec<ShardId>, StreamError> {
        let index = Self::close(state, stream, id, op)?;
        let starts: Vec<u64> = ranges.iter().map(|_| state.allocate()).collect();
        let target = state.stream_mut(op, stream)?;
        let mut children = Vec::with_capacity(ranges.len());
        for (range, start) in ranges.iter().zip(starts) {
            let child = ShardId::from_index(target.shards.len() as u64);
            target.shards.push(new_shard(
                child.clone(),
                Some(id.clone()),
                None,
                *range,
                start,
            ));
            children.push(child);
        }
        target.shards[index].children = children.clone();
        target.shards[index].closed_at = Some(now);
        Ok(children)
    }

    /// Closes open shard `shard` and opens one child with the same hash key range,
    /// naming it as parent: what DynamoDB Streams does to every shard about every four
    /// hours. Returns the child.
    pub fn rotate_shard(&self, stream: &str, shard: &ShardId) -> Result<ShardId, StreamError> {
        const OP: &str = "RotateShard";
        let now = self.clock.now();
        let mut state = self.lock();
        let range = state
            .stream_mut(OP, stream)?
            .shard_mut(OP, stream, shard)?
            .1
            .range;
        let children = Self::replace(&mut state, OP, stream, shard, now, &[range])?;
        drop(state);
        self.changed.notify_waiters();
        children
            .into_iter()
            .next()
            .ok_or_else(|| StreamError::Other {
                op: OP,
                message: format!("rotating {shard} of {stream} opened no child"),
            })
    }

    /// Closes open shard `shard` without children: what disabling a table's stream (or
    /// deleting the table) does. Its records stay readable until retention passes.
    pub fn close_shard(&self, stream: &str, shard: &ShardId) -> Result<(), StreamError> {
        let now = self.clock.now();
        let closed = Self::replace(&mut self.lock(), "CloseShard", stream, shard, now, &[]);
        self.changed.notify_waiters();
        closed.map(|_| ())
    }

    fn merge(&self, stream: &str, first: &ShardId, second: &ShardId) -> Result<(), StreamError> {
        const OP: &str = "MergeShards";
        let now = self.clock.now();
        let mut state = self.lock();
        let target = state.stream_mut(OP, stream)?;
        let (a, a_open) = {
            let s = target.shard_mut(OP, stream, first)?.1;
            (s.range, s.end_counter.is_none())
        };
        let (b, b_open) = {
            let s = target.shard_mut(OP, stream, second)?.1;
            (s.range, s.end_counter.is_none())
        };
        if !a_open || !b_open || first == second {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!("shards {first} and {second} must be two different open shards"),
            });
        }
        let adjacent =
            a.end.checked_add(1) == Some(b.start) || b.end.checked_add(1) == Some(a.start);
        if !adjacent {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!("shards {first} {a} and {second} {b} are not adjacent"),
            });
        }
        let ia = Self::close(&mut state, stream, first, OP)?;
        let ib = Self::close(&mut state, stream, second, OP)?;
        let start = state.allocate();
        let target = state.stream_mut(OP, stream)?;
        let child = new_shard(
            ShardId::from_index(target.shards.len() as u64),
            Some(first.clone()),
            Some(second.clone()),
            HashKeyRange {
                start: a.start.min(b.start),
                end: a.end.max(b.end),
            },
            start,
        );
        for i in [ia, ib] {
            target.shards[i].children = vec![child.id.clone()];
            target.shards[i].closed_at = Some(now);
        }
        target.shards.push(child);
        Ok(())
    }

    /// ListShards: every shard, a closed one until retention has passed since it closed.
    pub(super) fn listing(&self, stream: &str) -> Result<Vec<Shard>, StreamError> {
        const OP: &str = "ListShards";
        let now = self.clock.now();
        let retention = self.config.retention;
        let mut state = self.lock();
        let target = state.stream_mut(OP, stream)?;
        // A closed shard leaves the listing once its records are past retention.
        Ok(target
            .shards
            .iter_mut()
            .filter_map(|s| {
                s.trim(now, retention);
                let expired = s
                    .closed_at
                    .is_some_and(|at| now.duration_since(at) > retention)
                    && s.records.is_empty();
                (!expired).then(|| s.to_shard())
            })
            .collect())
    }
}

/// The stream named by a stream ARN (`arn:...:stream/NAME`) or a consumer ARN
/// (`arn:...:stream/NAME/consumer/CONSUMER:EPOCH`).
fn stream_of_arn(op: &'static str, arn: &str) -> Result<String, StreamError> {
    arn.split_once(":stream/")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest).to_owned())
        .filter(|name| !name.is_empty())
        .ok_or_else(|| StreamError::InvalidArgument {
            op,
            message: format!("{arn} is not a stream or consumer ARN"),
        })
}

/// The stream a reading call names: by its name, or (as a stream of another account
/// is named) by its ARN. Lenient, as the local servers are: any Kinesis stream ARN
/// names the stream of its name here, whatever its account or region; the worker checks
/// the ARN against DescribeStreamSummary's.
fn by_name(op: &'static str, stream: &str) -> Result<String, StreamError> {
    if StreamArn::is_kinesis_arn(stream) {
        stream_of_arn(op, stream)
    } else {
        Ok(stream.to_owned())
    }
}

impl MemoryStreams {
    fn consumer_view(&self, consumer: &ConsumerState) -> Consumer {
        Consumer {
            name: consumer.name.clone(),
            arn: consumer.arn.clone(),
            status: if self.clock.now() >= consumer.active_at {
                ConsumerStatus::Active
            } else {
                ConsumerStatus::Creating
            },
            created: Some(consumer.created),
        }
    }

    fn register_consumer(&self, stream_arn: &str, name: &str) -> Result<Consumer, StreamError> {
        const OP: &str = "RegisterStreamConsumer";
        let stream = stream_of_arn(OP, stream_arn)?;
        let now = self.clock.now();
        let created = self.clock.wall();
        let mut state = self.lock();
        state.stream_mut(OP, &stream)?;
        let consumers = state.consumers.entry(stream.clone()).or_default();
        if consumers.iter().any(|c| c.name == name) {
            return Err(StreamError::InUse {
                op: OP,
                message: format!("consumer {name} of stream {stream} already exists"),
            });
        }
        if consumers.len() >= MAX_CONSUMERS_PER_STREAM {
            return Err(StreamError::Throttled {
                op: OP,
                message: format!(
                    "LimitExceededException: stream {stream} has {MAX_CONSUMERS_PER_STREAM} \
                     consumers, the most allowed"
                ),
            });
        }
        let epoch = created
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        consumers.push(ConsumerState {
            name: name.to_owned(),
            arn: format!("{stream_arn}/consumer/{name}:{epoch}"),
            created,
            active_at: now + self.config.consumer_activation,
        });
        let view = consumers.last().map(|c| self.consumer_view(c));
        view.ok_or_else(|| StreamError::Other {
            op: OP,
            message: "consumer vanished".into(),
        })
    }

    fn find_consumer(
        &self,
        op: &'static str,
        stream_arn: &str,
        name: &str,
    ) -> Result<Consumer, StreamError> {
        let stream = stream_of_arn(op, stream_arn)?;
        let state = self.lock();
        state
            .consumers
            .get(&stream)
            .and_then(|all| all.iter().find(|c| c.name == name))
            .map(|c| self.consumer_view(c))
            .ok_or_else(|| StreamError::NotFound {
                op,
                message: format!("consumer {name} of stream {stream}"),
            })
    }

    fn list_consumers(&self, stream_arn: &str) -> Result<Vec<Consumer>, StreamError> {
        const OP: &str = "ListStreamConsumers";
        let stream = stream_of_arn(OP, stream_arn)?;
        let mut state = self.lock();
        state.stream_mut(OP, &stream)?;
        Ok(state
            .consumers
            .get(&stream)
            .map(|all| all.iter().map(|c| self.consumer_view(c)).collect())
            .unwrap_or_default())
    }

    fn deregister_consumer(&self, consumer_arn: &str) -> Result<(), StreamError> {
        const OP: &str = "DeregisterStreamConsumer";
        let stream = stream_of_arn(OP, consumer_arn)?;
        let mut state = self.lock();
        let all = state.consumers.entry(stream.clone()).or_default();
        let before = all.len();
        all.retain(|c| c.arn != consumer_arn);
        if all.len() == before {
            return Err(StreamError::NotFound {
                op: OP,
                message: format!("consumer {consumer_arn}"),
            });
        }
        // Its subscriptions end.
        state
            .subscriptions
            .retain(|(arn, _, _), _| arn != consumer_arn);
        drop(state);
        self.changed.notify_waiters();
        Ok(())
    }

    fn subscribe(
        &self,
        consumer_arn: &str,
        shard: &ShardId,
        position: &IteratorPosition,
    ) -> Result<MemorySubscription, StreamError> {
        const OP: &str = "SubscribeToShard";
        let stream = stream_of_arn(OP, consumer_arn)?;
        let consumer = {
            let state = self.lock();
            state
                .consumers
                .get(&stream)
                .and_then(|all| all.iter().find(|c| c.arn == consumer_arn))
                .map(|c| self.consumer_view(c))
        };
        match consumer {
            None => {
                return Err(StreamError::NotFound {
                    op: OP,
                    message: format!("consumer {consumer_arn}"),
                });
            }
            Some(c) if c.status != ConsumerStatus::Active => {
                return Err(StreamError::InUse {
                    op: OP,
                    message: format!("consumer {consumer_arn} is {}, not ACTIVE", c.status),
                });
            }
            Some(_) => {}
        }
        let iterator = self
            .iterator(&stream, shard, position)
            .map_err(|e| match e {
                StreamError::InvalidArgument { message, .. } => {
                    StreamError::InvalidArgument { op: OP, message }
                }
                StreamError::NotFound { message, .. } => StreamError::NotFound { op: OP, message },
                other => other,
            })?;
        let token = IteratorToken::decode(&iterator).ok_or_else(|| StreamError::Other {
            op: OP,
            message: "an iterator this server issued does not decode".into(),
        })?;
        let now = self.clock.now();
        let mut state = self.lock();
        let key = (consumer_arn.to_owned(), stream.clone(), token.shard);
        if let Some(last) = state.subscriptions.get(&key) {
            let since = now.duration_since(last.since);
            if last.open && since < SUBSCRIPTION_REPLACE_AFTER {
                return Err(StreamError::InUse {
                    op: OP,
                    message: format!(
                        "another subscription of this consumer to {shard} is open (made {} ms \
                         ago)",
                        since.as_millis()
                    ),
                });
            }
            if since < SUBSCRIBE_INTERVAL {
                return Err(StreamError::Throttled {
                    op: OP,
                    message: format!(
                        "LimitExceededException: {shard} was subscribed {} ms ago by the same \
                         consumer; once per second is allowed",
                        since.as_millis()
                    ),
                });
            }
        }
        state.next_subscription += 1;
        let id = state.next_subscription;
        state.subscriptions.insert(
            key.clone(),
            OpenSubscription {
                id,
                open: true,
                since: now,
            },
        );
        Ok(MemorySubscription {
            streams: self.clone(),
            key,
            id,
            offset: token.offset,
            started: now,
            last_event: now,
            done: false,
        })
    }

    /// How many subscriptions to `shard` of `stream` are open, of any consumer: what a
    /// test checks to see a subscription cancelled.
    pub fn open_subscriptions(&self, stream: &str, shard: &ShardId) -> usize {
        let state = self.lock();
        let Some(index) = state
            .streams
            .get(stream)
            .and_then(|s| s.shards.iter().position(|s| &s.id == shard))
        else {
            return 0;
        };
        state
            .subscriptions
            .iter()
            .filter(|((_, name, i), open)| name == stream && *i == index && open.open)
            .count()
    }

    /// A sequence number `c` such that AFTER_SEQUENCE_NUMBER `c` starts at `offset`.
    fn continuation(&self, stream: &str, shard: usize, offset: u64) -> Option<SequenceNumber> {
        let state = self.lock();
        let s = state.streams.get(stream)?.shards.get(shard)?;
        let next = offset.max(s.trimmed);
        let counter = match s.records.get((next - s.trimmed) as usize) {
            Some(record) => record.counter - 1,
            // Nothing after `offset` yet: what comes will have a higher counter.
            None => state.next_counter.max(s.start_counter),
        };
        Some(sequence_number(counter))
    }
}

/// A subscription of the memory backend: reads the shard from its own offset, outside
/// the shard's GetRecords limits, and sends an event when records arrive, at the end of
/// the shard, or after `subscription_heartbeat` without either.
#[derive(Debug)]
struct MemorySubscription {
    streams: MemoryStreams,
    key: (String, String, usize),
    id: u64,
    offset: u64,
    started: Instant,
    last_event: Instant,
    done: bool,
}

impl MemorySubscription {
    fn current(&self) -> bool {
        self.streams
            .lock()
            .subscriptions
            .get(&self.key)
            .is_some_and(|s| s.id == self.id && s.open)
    }

    fn close(&mut self) {
        self.done = true;
        let mut state = self.streams.lock();
        if let Some(open) = state.subscriptions.get_mut(&self.key)
            && open.id == self.id
        {
            open.open = false;
        }
    }

    async fn next(&mut self) -> Result<Option<ShardEvent>, StreamError> {
        const OP: &str = "SubscribeToShard";
        if self.done {
            return Ok(None);
        }
        let deadline = self.started + self.streams.config.subscription_ttl;
        loop {
            if !self.current() {
                self.done = true;
                return Err(StreamError::InUse {
                    op: OP,
                    message: "the subscription was replaced or its consumer deregistered".into(),
                });
            }
            let now = self.streams.clock.now();
            if now >= deadline {
                self.close();
                return Ok(None);
            }
            let changed = self.streams.changed.clone();
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (stream, shard) = (self.key.1.clone(), self.key.2);
            let token = IteratorToken {
                stream: stream.clone(),
                shard,
                offset: self.offset,
                issued_nanos: self.streams.clock.elapsed().as_nanos(),
            }
            .encode();
            let batch = self
                .streams
                .read_from(&token, self.streams.config.read_rules.max_records, false)
                .map_err(|e| match e {
                    StreamError::NotFound { message, .. } => {
                        StreamError::NotFound { op: OP, message }
                    }
                    other => other,
                })?;
            let at_end = batch.next_iterator.is_none();
            let heartbeat = now >= self.last_event + self.streams.config.subscription_heartbeat;
            if !batch.records.is_empty() || at_end || heartbeat {
                self.offset = batch
                    .next_iterator
                    .as_ref()
                    .and_then(IteratorToken::decode)
                    .map(|t| t.offset)
                    .unwrap_or(self.offset + batch.records.len() as u64);
                self.last_event = now;
                let continuation = if at_end {
                    self.close();
                    None
                } else {
                    self.streams.continuation(&stream, shard, self.offset)
                };
                return Ok(Some(ShardEvent {
                    records: batch.records,
                    continuation,
                    millis_behind_latest: batch.millis_behind_latest,
                    child_shards: batch.child_shards.unwrap_or_default(),
                }));
            }
            let wake = (self.last_event + self.streams.config.subscription_heartbeat).min(deadline);
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }
}

impl Drop for MemorySubscription {
    fn drop(&mut self) {
        self.close();
    }
}

impl Subscription for MemorySubscription {
    fn next_event(&mut self) -> BoxFuture<'_, Result<Option<ShardEvent>, StreamError>> {
        Box::pin(self.next())
    }
}

fn new_shard(
    id: ShardId,
    parent: Option<ShardId>,
    adjacent_parent: Option<ShardId>,
    range: HashKeyRange,
    start_counter: u64,
) -> ShardState {
    ShardState {
        id,
        parent,
        adjacent_parent,
        range,
        start_counter,
        end_counter: None,
        closed_at: None,
        children: Vec::new(),
        records: VecDeque::new(),
        trimmed: 0,
        last_trimmed: None,
        reads: VecDeque::new(),
    }
}

impl StreamClient for MemoryStreams {
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        Box::pin(async move { self.listing(&by_name("ListShards", stream)?) })
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>> {
        Box::pin(async move {
            let stream = by_name("GetShardIterator", stream)?;
            self.iterator(&stream, shard, position)
        })
    }

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>> {
        Box::pin(async move { self.read(iterator, limit) })
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        Box::pin(async move { self.register_consumer(stream_arn, name) })
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        Box::pin(async move { self.find_consumer("DescribeStreamConsumer", stream_arn, name) })
    }

    fn list_stream_consumers<'a>(
        &'a self,
        stream_arn: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Consumer>, StreamError>> {
        Box::pin(async move { self.list_consumers(stream_arn) })
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        consumer_arn: &'a str,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move { self.deregister_consumer(consumer_arn) })
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        consumer_arn: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<Box<dyn Subscription>, StreamError>> {
        Box::pin(async move {
            let subscription = self.subscribe(consumer_arn, shard, position)?;
            Ok(Box::new(subscription) as Box<dyn Subscription>)
        })
    }

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>> {
        Box::pin(async move {
            const OP: &str = "DescribeStreamSummary";
            let stream = by_name(OP, stream)?;
            let stream = stream.as_str();
            let mut state = self.lock();
            let target = state.stream_mut(OP, stream)?;
            Ok(StreamSummary {
                name: stream.to_owned(),
                arn: format!("arn:aws:kinesis:us-east-1:000000000000:stream/{stream}"),
                status: "ACTIVE".into(),
                open_shard_count: target
                    .shards
                    .iter()
                    .filter(|s| s.end_counter.is_none())
                    .count() as u32,
                retention_hours: (self.config.retention.as_secs() / 3600) as u32,
                created: Some(target.created),
            })
        })
    }
}

impl StreamAdmin for MemoryStreams {
    fn create_stream<'a>(
        &'a self,
        stream: &'a str,
        shards: u32,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move { self.create(stream, shards) })
    }

    fn delete_stream<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move {
            self.lock()
                .streams
                .remove(stream)
                .map(|_| ())
                .ok_or_else(|| StreamError::NotFound {
                    op: "DeleteStream",
                    message: format!("stream {stream}"),
                })
        })
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: &'a [PutRecord],
    ) -> BoxFuture<'a, Result<Vec<PutResult>, StreamError>> {
        Box::pin(async move {
            let put = self.put(stream, records);
            self.changed.notify_waiters();
            put
        })
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        new_starting_hash_key: u128,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move {
            let split = self.split(stream, shard, new_starting_hash_key);
            self.changed.notify_waiters();
            split.map(|_| ())
        })
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        adjacent: &'a ShardId,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move {
            let merged = self.merge(stream, shard, adjacent);
            self.changed.notify_waiters();
            merged
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, size: usize) -> PutRecord {
        PutRecord {
            partition_key: key.into(),
            explicit_hash_key: None,
            data: Bytes::from(vec![7u8; size]),
        }
    }

    async fn one_shard(config: MemoryStreamsConfig) -> (MemoryStreams, ShardIterator) {
        let streams = MemoryStreams::new(config);
        streams.create_stream("s", 1).await.unwrap();
        let it = streams
            .get_shard_iterator("s", &ShardId::from_index(0), &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        (streams, it)
    }

    #[tokio::test(start_paused = true)]
    async fn get_records_stops_at_ten_thousand_records_and_ten_megabytes() {
        let (streams, it) = one_shard(MemoryStreamsConfig::default()).await;
        let small: Vec<_> = (0..12_000).map(|i| record(&format!("k{i}"), 1)).collect();
        streams.put_records("s", &small).await.unwrap();
        let batch = streams.get_records(&it, 10_000).await.unwrap();
        assert_eq!(batch.records.len(), 10_000);
        let rest = streams
            .get_records(&batch.next_iterator.unwrap(), 10_000)
            .await
            .unwrap();
        assert_eq!(rest.records.len(), 2_000);
        assert!(streams.get_records(&it, 10_001).await.is_err());

        let (streams, it) = one_shard(MemoryStreamsConfig::default()).await;
        let big: Vec<_> = (0..15)
            .map(|i| record(&format!("k{i}"), 1024 * 1024 - 8))
            .collect();
        streams.put_records("s", &big).await.unwrap();
        let batch = streams.get_records(&it, 10_000).await.unwrap();
        assert_eq!(batch.records.len(), 10, "10 MB per call");
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_over_one_megabyte_is_refused_by_name() {
        let (streams, _) = one_shard(MemoryStreamsConfig::default()).await;
        assert!(
            streams
                .put_records("s", &[record("k", MAX_RECORD_BYTES - 1)])
                .await
                .is_ok()
        );
        let err = streams
            .put_records("s", &[record("big", MAX_RECORD_BYTES)])
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("partition key \"big\" is 1048579 bytes"),
            "{err}"
        );
        let err = streams
            .put_records("s", &[record("", 1)])
            .await
            .unwrap_err();
        assert!(matches!(err, StreamError::InvalidArgument { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn read_limits_throttle_per_shard_and_recover() {
        let config = MemoryStreamsConfig {
            read_limits: Some(ReadLimits::KINESIS),
            ..Default::default()
        };
        let (streams, mut it) = one_shard(config).await;
        for _ in 0..5 {
            it = streams
                .get_records(&it, 10)
                .await
                .unwrap()
                .next_iterator
                .unwrap();
        }
        let err = streams.get_records(&it, 10).await.unwrap_err();
        assert!(matches!(err, StreamError::Throttled { .. }), "{err:?}");
        tokio::time::advance(Duration::from_secs(1)).await;
        it = streams
            .get_records(&it, 10)
            .await
            .unwrap()
            .next_iterator
            .unwrap();

        // Bytes: 3 MB in one call leaves no budget for the rest of that second.
        let big: Vec<_> = (0..3)
            .map(|i| record(&format!("k{i}"), 1024 * 1024 - 8))
            .collect();
        streams.put_records("s", &big).await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        it = streams
            .get_records(&it, 10)
            .await
            .unwrap()
            .next_iterator
            .unwrap();
        assert!(matches!(
            streams.get_records(&it, 10).await,
            Err(StreamError::Throttled { .. })
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(streams.get_records(&it, 10).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn retention_trims_old_records_and_drops_old_closed_shards() {
        let config = MemoryStreamsConfig {
            retention: Duration::from_secs(3600),
            ..Default::default()
        };
        let (streams, _) = one_shard(config).await;
        streams.put_records("s", &[record("old", 1)]).await.unwrap();
        tokio::time::advance(Duration::from_secs(1800)).await;
        streams.put_records("s", &[record("new", 1)]).await.unwrap();
        tokio::time::advance(Duration::from_secs(1801)).await;
        let shard = ShardId::from_index(0);
        let it = streams
            .get_shard_iterator("s", &shard, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        let got = streams.get_records(&it, 100).await.unwrap().records;
        assert_eq!(
            got.iter()
                .map(|r| r.partition_key.as_str())
                .collect::<Vec<_>>(),
            ["new"]
        );

        streams.split_shard("s", &shard, 1 << 127).await.unwrap();
        assert_eq!(streams.list_shards("s").await.unwrap().len(), 3);
        tokio::time::advance(Duration::from_secs(3601)).await;
        let listed: Vec<ShardId> = streams
            .list_shards("s")
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(
            listed,
            [ShardId::from_index(1), ShardId::from_index(2)],
            "the parent aged out"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_trimmed_position_starts_at_the_horizon_unless_the_rules_say_trimmed() {
        let retention = Duration::from_secs(60);
        let rules = [
            (ReadRules::KINESIS, false),
            (ReadRules::DYNAMODB_STREAMS, true),
        ];
        for (read_rules, refused) in rules {
            let config = MemoryStreamsConfig {
                retention,
                read_rules,
                ..Default::default()
            };
            let (streams, it) = one_shard(config).await;
            let put = streams
                .put_records("s", &[record("old", 1), record("older", 1)])
                .await
                .unwrap();
            tokio::time::advance(retention + Duration::from_secs(1)).await;
            streams.put_records("s", &[record("new", 1)]).await.unwrap();
            let at = IteratorPosition::AtSequence(put[0].sequence_number.clone());
            let shard = ShardId::from_index(0);
            let positioned = streams.get_shard_iterator("s", &shard, &at).await;
            let read = streams.get_records(&it, 10).await;
            if refused {
                assert!(matches!(positioned, Err(StreamError::Trimmed { .. })));
                assert!(matches!(read, Err(StreamError::Trimmed { .. })));
            } else {
                let from = streams.get_records(&positioned.unwrap(), 10).await.unwrap();
                assert_eq!(from.records[0].partition_key, "new");
                assert_eq!(read.unwrap().records[0].partition_key, "new");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_that_ends_empty_reports_its_children() {
        let (streams, it) = one_shard(MemoryStreamsConfig::default()).await;
        streams
            .split_shard("s", &ShardId::from_index(0), 5)
            .await
            .unwrap();
        let end = streams.get_records(&it, 10).await.unwrap();
        assert!(end.is_shard_end());
        let children: Vec<_> = end
            .child_shards
            .unwrap()
            .into_iter()
            .map(|c| (c.id, c.parents, c.hash_range))
            .collect();
        assert_eq!(
            children,
            [
                (
                    ShardId::from_index(1),
                    vec![ShardId::from_index(0)],
                    HashKeyRange { start: 0, end: 4 }
                ),
                (
                    ShardId::from_index(2),
                    vec![ShardId::from_index(0)],
                    HashKeyRange {
                        start: 5,
                        end: u128::MAX
                    }
                ),
            ]
        );
        let err = streams
            .split_shard("s", &ShardId::from_index(0), 9)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is closed"), "{err}");
        let err = streams
            .merge_shards("s", &ShardId::from_index(1), &ShardId::from_index(1))
            .await
            .unwrap_err();
        assert!(matches!(err, StreamError::InvalidArgument { .. }));
    }
}
