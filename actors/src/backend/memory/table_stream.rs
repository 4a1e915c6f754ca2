//! An in-memory DynamoDB table and its stream (DynamoDB Streams), for the demo and the
//! tests of the DynamoDB Streams source.
//!
//! The shards, records, iterators and trimming are [`MemoryStreams`]'s, with DynamoDB
//! Streams' rules ([`ReadRules::DYNAMODB_STREAMS`]: 1,000 records and 1 MB per
//! GetRecords, TrimmedDataAccessException for a position past retention). What this
//! file adds is what DynamoDB does and Kinesis does not:
//! * writes to items become change records (INSERT, MODIFY, REMOVE with the old and new
//!   images); a write that changes nothing records nothing;
//! * a record's partition key is the item's key, so one item's changes are in one shard
//!   at a time, in order;
//! * shards have no hash key ranges for a reader (every shard is listed with the whole
//!   key space), and they rotate: about every four hours a shard closes and one child
//!   names it as parent ([`MemoryTableStreams::rotate_shard`]);
//! * a stream is named by its ARN (or `dynamodb:TABLE`, the table's current stream);
//!   deleting the table disables its stream, which stays readable until retention ends;
//! * there is no enhanced fan-out, no AT_TIMESTAMP iterator, no ChildShards in
//!   GetRecords and no MillisBehindLatest.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;
use md5::{Digest, Md5};
use tokio::time::Instant;

use super::stream::{MemoryStreams, MemoryStreamsConfig, ReadRules};
use crate::backend::clock::Clock;
use crate::backend::{
    Capabilities, ItemWrite, IteratorPosition, RecordBatch, ShardIterator, StreamClient,
    StreamError, StreamSummary, TABLE_KEY, TableStreamAdmin,
};
use crate::model::change::{
    AttributeValue, ChangeBody, ChangeKind, Item, StreamViewType, UserIdentity, item_key_text,
};
use crate::model::source::{TABLE_PREFIX, check_table_name};
use crate::model::{DynamoChange, HashKeyRange, SequenceNumber, Shard, ShardId};

/// The largest item DynamoDB stores: 400 KB.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// How [`MemoryTableStreams`] behaves: iterator lifetime, retention, shards, and the
/// region and account its ARNs name.
#[derive(Debug, Clone)]
pub struct MemoryTableStreamsConfig {
    /// How long a shard iterator stays valid (DynamoDB Streams: 15 minutes).
    pub iterator_ttl: Duration,
    /// How long records are kept (DynamoDB Streams: 24 hours, not configurable).
    pub retention: Duration,
    /// Open shards of a new stream. DynamoDB decides this from the table's partitions;
    /// more than one lets tests see several shards read at once.
    pub shards_per_table: u32,
    /// Named in ARNs and in each record's `awsRegion`.
    pub region: String,
    /// Named in ARNs.
    pub account: String,
}

impl Default for MemoryTableStreamsConfig {
    fn default() -> Self {
        Self {
            iterator_ttl: Duration::from_secs(15 * 60),
            retention: Duration::from_secs(24 * 3600),
            shards_per_table: 1,
            region: "us-east-1".to_owned(),
            account: "000000000000".to_owned(),
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    /// Items by the text of their key attribute.
    items: BTreeMap<String, Item>,
    /// The ARN of the table's stream, if it has one.
    stream: Option<String>,
}

#[derive(Debug)]
struct TableStream {
    table: String,
    /// Set when the table was deleted: the stream is DISABLED, and gone once retention
    /// has passed since.
    disabled_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    tables: BTreeMap<String, Table>,
    /// Every stream made, by ARN, while it can still be read.
    streams: BTreeMap<String, TableStream>,
}

/// Any number of in-memory DynamoDB tables with streams. Clones share state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla_actors::backend::memory::{MemoryTableStreams, MemoryTableStreamsConfig};
/// use flotilla_actors::backend::{IteratorPosition, ItemWrite, StreamClient, TableStreamAdmin};
/// use flotilla_actors::model::change::{AttributeValue, ChangeKind, Item};
///
/// let tables = MemoryTableStreams::new(MemoryTableStreamsConfig::default());
/// let arn = tables.create_table_with_stream("orders").await?;
/// let item = Item::from([("pk".to_owned(), AttributeValue::S("order-1".into()))]);
/// tables.write_items("orders", &[ItemWrite::Put { attributes: item }]).await?;
/// let shard = &tables.list_shards(&arn).await?[0];
/// let iterator = tables
///     .get_shard_iterator(&arn, &shard.id, &IteratorPosition::TrimHorizon)
///     .await?;
/// let batch = tables.get_records(&iterator, 100).await?;
/// assert_eq!(batch.records[0].dynamodb_change()?.event_name, ChangeKind::Insert);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryTableStreams {
    /// The shards and records, one stream per table stream, named by its ARN.
    streams: MemoryStreams,
    /// Tables and streams. Locked before `streams`' lock, never after: a write holds it
    /// while its change is recorded, so changes are recorded in the order items changed.
    state: Arc<Mutex<State>>,
    config: MemoryTableStreamsConfig,
}

impl MemoryTableStreams {
    /// Must be called inside a tokio runtime (the clock starts here).
    pub fn new(config: MemoryTableStreamsConfig) -> Self {
        let streams = MemoryStreams::new(MemoryStreamsConfig {
            iterator_ttl: config.iterator_ttl,
            retention: config.retention,
            read_limits: None,
            read_rules: ReadRules::DYNAMODB_STREAMS,
            ..MemoryStreamsConfig::default()
        });
        Self {
            streams,
            state: Arc::new(Mutex::new(State::default())),
            config,
        }
    }

    /// The clock arrival times are read from (it follows tokio's clock).
    pub fn clock(&self) -> Clock {
        self.streams.clock()
    }

    /// The configuration this backend was made with.
    pub fn config(&self) -> &MemoryTableStreamsConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation under this lock is a single step; a panic cannot leave half of
        // one applied. Keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ARN of `table`'s current stream; `None` for an unknown table or one without
    /// a stream.
    pub fn stream_arn(&self, table: &str) -> Option<String> {
        self.lock().tables.get(table)?.stream.clone()
    }

    /// Creates a table whose changes no stream records: what a consumer pointed at it
    /// must be told to enable.
    pub fn create_table_without_stream(&self, table: &str) -> Result<(), StreamError> {
        self.create_table(table, false).map(|_| ())
    }

    /// Deletes an item as DynamoDB's TTL does: a REMOVE whose `userIdentity` is the
    /// DynamoDB service. Nothing is recorded if the item is not there.
    pub fn expire_item(&self, table: &str, key: &str) -> Result<(), StreamError> {
        let delete = ItemWrite::Delete {
            key: key.to_owned(),
        };
        self.write(table, &delete, Some(UserIdentity::ttl()))
    }

    /// Closes open shard `shard` and opens one child naming it as parent, as DynamoDB
    /// does to every shard about every four hours. Returns the child.
    pub fn rotate_shard(&self, stream_arn: &str, shard: &ShardId) -> Result<ShardId, StreamError> {
        let arn = self.resolve("RotateShard", stream_arn)?;
        self.streams.rotate_shard(&arn, shard)
    }

    /// Rotates every open shard of the stream; returns the new shards.
    pub fn rotate_all(&self, stream_arn: &str) -> Result<Vec<ShardId>, StreamError> {
        let arn = self.resolve("RotateShard", stream_arn)?;
        self.open_shards(&arn)?
            .iter()
            .map(|shard| self.streams.rotate_shard(&arn, &shard.id))
            .collect()
    }

    /// Closes open shard `shard` and opens two children, each naming it as its one
    /// parent, that share its items between them (by the MD5 of the item's key, as
    /// DynamoDB does when a table's partition splits). Returns the children.
    pub fn split_shard(
        &self,
        stream_arn: &str,
        shard: &ShardId,
    ) -> Result<Vec<ShardId>, StreamError> {
        const OP: &str = "SplitShard";
        let arn = self.resolve(OP, stream_arn)?;
        // The shard's routing range is internal: readers see the whole key space.
        let range = self
            .open_shards(&arn)?
            .into_iter()
            .find(|s| &s.id == shard)
            .map(|s| s.hash_range)
            .ok_or_else(|| StreamError::InvalidArgument {
                op: OP,
                message: format!("shard {shard} of {arn} is not an open shard"),
            })?;
        if range.start == range.end {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!("shard {shard} of {arn} holds one hash key; it cannot split"),
            });
        }
        let middle = range.start + (range.end - range.start) / 2 + 1;
        self.streams.split(&arn, shard, middle)
    }

    /// The open shards of stream `arn`, with their internal routing ranges.
    fn open_shards(&self, arn: &str) -> Result<Vec<Shard>, StreamError> {
        Ok(self
            .streams
            .listing(arn)?
            .into_iter()
            .filter(|s| s.sequence_range.end.is_none())
            .collect())
    }

    /// The stream ARN a stream identifier names: the ARN itself, or `dynamodb:TABLE`
    /// (the table's current stream).
    fn resolve(&self, op: &'static str, stream: &str) -> Result<String, StreamError> {
        let now = self.clock().now();
        let state = self.lock();
        if let Some(table) = stream.strip_prefix(TABLE_PREFIX) {
            let found = state
                .tables
                .get(table)
                .ok_or_else(|| StreamError::NotFound {
                    op,
                    message: format!("table {table}"),
                })?;
            return found.stream.clone().ok_or_else(|| StreamError::NotFound {
                op,
                message: format!(
                    "table {table} has no stream; enable one with `aws dynamodb update-table \
                     --table-name {table} --stream-specification \
                     StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES`"
                ),
            });
        }
        match state.streams.get(stream) {
            Some(found) if !self.gone(found, now) => Ok(stream.to_owned()),
            _ => Err(StreamError::NotFound {
                op,
                message: format!("stream {stream}"),
            }),
        }
    }

    /// Whether a disabled stream has been deleted (retention has passed since).
    fn gone(&self, stream: &TableStream, now: Instant) -> bool {
        stream
            .disabled_at
            .is_some_and(|at| now.duration_since(at) > self.config.retention)
    }

    fn create_table(&self, table: &str, with_stream: bool) -> Result<Option<String>, StreamError> {
        const OP: &str = "CreateTable";
        check_table_name(table).map_err(|message| StreamError::InvalidArgument {
            op: OP,
            message: format!("{table:?} {message}"),
        })?;
        let mut state = self.lock();
        if state.tables.contains_key(table) {
            return Err(StreamError::InvalidArgument {
                op: OP,
                message: format!("ResourceInUseException: table {table} already exists"),
            });
        }
        let arn = if with_stream {
            let arn = self.new_stream_arn(&state, table);
            self.streams
                .create(&arn, self.config.shards_per_table)
                .map_err(|e| StreamError::Other {
                    op: OP,
                    message: format!("could not make the stream of table {table}: {e}"),
                })?;
            state.streams.insert(
                arn.clone(),
                TableStream {
                    table: table.to_owned(),
                    disabled_at: None,
                },
            );
            Some(arn)
        } else {
            None
        };
        state.tables.insert(
            table.to_owned(),
            Table {
                items: BTreeMap::new(),
                stream: arn.clone(),
            },
        );
        Ok(arn)
    }

    /// A stream ARN with DynamoDB's label (the creation time, to the millisecond),
    /// moved on a millisecond at a time until no stream of the table has it.
    fn new_stream_arn(&self, state: &State, table: &str) -> String {
        let mut at = self.clock().wall();
        loop {
            let stamp = humantime::format_rfc3339_millis(at).to_string();
            let label = stamp.trim_end_matches('Z');
            let arn = format!(
                "arn:aws:dynamodb:{}:{}:table/{table}/stream/{label}",
                self.config.region, self.config.account
            );
            if !state.streams.contains_key(&arn) {
                return arn;
            }
            at += Duration::from_millis(1);
        }
    }

    fn delete(&self, table: &str) -> Result<(), StreamError> {
        const OP: &str = "DeleteTable";
        let now = self.clock().now();
        let mut state = self.lock();
        let removed = state
            .tables
            .remove(table)
            .ok_or_else(|| StreamError::NotFound {
                op: OP,
                message: format!("table {table}"),
            })?;
        let Some(arn) = removed.stream else {
            return Ok(());
        };
        // The stream is DISABLED: its shards close, and what they hold stays readable
        // until retention passes.
        if let Some(stream) = state.streams.get_mut(&arn) {
            stream.disabled_at = Some(now);
        }
        for shard in self.open_shards(&arn)? {
            self.streams.close_shard(&arn, &shard.id)?;
        }
        Ok(())
    }

    /// Applies one write and records its change on the table's stream, if it has one.
    fn write(
        &self,
        table: &str,
        write: &ItemWrite,
        identity: Option<UserIdentity>,
    ) -> Result<(), StreamError> {
        const OP: &str = "WriteItems";
        let mut state = self.lock();
        let found = state
            .tables
            .get_mut(table)
            .ok_or_else(|| StreamError::NotFound {
                op: OP,
                message: format!("table {table}"),
            })?;
        let Some(change) = apply(&mut found.items, write)? else {
            return Ok(());
        };
        let Some(arn) = found.stream.clone() else {
            return Ok(());
        };
        let region = self.config.region.clone();
        let event_arn = arn.clone();
        self.streams
            .put_with(
                &arn,
                &item_key_text(&change.keys),
                move |sequence, arrival| {
                    Bytes::from(change.record(&event_arn, &region, sequence, arrival, identity))
                },
            )
            .map(|_| ())
    }
}

/// One change of an item, before the stream gives it a place.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ItemChange {
    kind: ChangeKind,
    keys: Item,
    old: Option<Item>,
    new: Option<Item>,
}

impl ItemChange {
    /// The record's data: the change in AWS's stream record JSON, NEW_AND_OLD_IMAGES.
    fn record(
        self,
        stream_arn: &str,
        region: &str,
        sequence: &SequenceNumber,
        arrival: SystemTime,
        identity: Option<UserIdentity>,
    ) -> Vec<u8> {
        let size = [Some(&self.keys), self.old.as_ref(), self.new.as_ref()]
            .into_iter()
            .flatten()
            .map(item_size)
            .sum::<usize>();
        // Unique per record: the stream and the sequence number are.
        let digest = Md5::digest(format!("{stream_arn}/{sequence}").as_bytes());
        let event_id = digest.iter().map(|b| format!("{b:02x}")).collect();
        let seconds = arrival
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        DynamoChange {
            event_id,
            event_name: self.kind,
            event_version: Some(DynamoChange::EVENT_VERSION.to_owned()),
            event_source: Some(DynamoChange::EVENT_SOURCE.to_owned()),
            aws_region: Some(region.to_owned()),
            dynamodb: ChangeBody {
                approximate_creation_secs: Some(i64::try_from(seconds).unwrap_or(i64::MAX)),
                keys: self.keys,
                new_image: self.new,
                old_image: self.old,
                sequence_number: sequence.as_str().to_owned(),
                size_bytes: Some(size as u64),
                stream_view_type: Some(StreamViewType::NewAndOldImages),
            },
            user_identity: identity,
        }
        .to_json()
    }
}

/// Applies `write` to a table's items; the change it made, `None` if it changed nothing
/// (a delete of an absent item, a put of the item as it is: DynamoDB records neither).
fn apply(
    items: &mut BTreeMap<String, Item>,
    write: &ItemWrite,
) -> Result<Option<ItemChange>, StreamError> {
    const OP: &str = "WriteItems";
    let keys_of = |key: &str| Item::from([(TABLE_KEY.to_owned(), AttributeValue::S(key.into()))]);
    match write {
        ItemWrite::Put { attributes } => {
            let key = match attributes.get(TABLE_KEY) {
                Some(AttributeValue::S(key)) if !key.is_empty() => key.clone(),
                other => {
                    return Err(StreamError::InvalidArgument {
                        op: OP,
                        message: format!(
                            "ValidationException: the item's key attribute {TABLE_KEY} must be \
                             a non-empty string (S), not {other:?}"
                        ),
                    });
                }
            };
            let size = item_size(attributes);
            if size > MAX_ITEM_BYTES {
                return Err(StreamError::InvalidArgument {
                    op: OP,
                    message: format!(
                        "ValidationException: item {key} is {size} bytes; items may be at most \
                         {MAX_ITEM_BYTES}"
                    ),
                });
            }
            let old = items.insert(key.clone(), attributes.clone());
            if old.as_ref() == Some(attributes) {
                return Ok(None);
            }
            Ok(Some(ItemChange {
                kind: if old.is_some() {
                    ChangeKind::Modify
                } else {
                    ChangeKind::Insert
                },
                keys: keys_of(&key),
                old,
                new: Some(attributes.clone()),
            }))
        }
        ItemWrite::Delete { key } => Ok(items.remove(key).map(|old| ItemChange {
            kind: ChangeKind::Remove,
            keys: keys_of(key),
            old: Some(old),
            new: None,
        })),
    }
}

/// An item's size as DynamoDB counts it (closely enough for limits and `SizeBytes`):
/// each attribute's name plus its value.
fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

fn value_size(value: &AttributeValue) -> usize {
    // Binary values are base64 text here; DynamoDB counts the bytes.
    let binary = |text: &String| text.len() * 3 / 4;
    match value {
        AttributeValue::S(text) | AttributeValue::N(text) => text.len(),
        AttributeValue::B(data) => binary(data),
        AttributeValue::SS(all) | AttributeValue::NS(all) => all.iter().map(String::len).sum(),
        AttributeValue::BS(all) => all.iter().map(binary).sum(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(k, v)| k.len() + value_size(v) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(list) => 3 + list.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        AttributeValue::Null(_) | AttributeValue::Bool(_) => 1,
    }
}

impl StreamClient for MemoryTableStreams {
    /// DescribeStream's shards: every shard, open and closed (until retention passes
    /// after it closed), each with the whole key space: a table stream's shards have
    /// no hash key ranges.
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        Box::pin(async move {
            let arn = self.resolve("DescribeStream", stream)?;
            let mut shards = self.streams.listing(&arn)?;
            for shard in &mut shards {
                shard.hash_range = HashKeyRange::FULL;
            }
            Ok(shards)
        })
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>> {
        Box::pin(async move {
            const OP: &str = "GetShardIterator";
            if let IteratorPosition::AtTimestamp(_) = position {
                return Err(StreamError::InvalidArgument {
                    op: OP,
                    message: "DynamoDB Streams has no AT_TIMESTAMP iterator: start at \
                              TRIM_HORIZON, LATEST or a sequence number"
                        .into(),
                });
            }
            let arn = self.resolve(OP, stream)?;
            self.streams.get_shard_iterator(&arn, shard, position).await
        })
    }

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>> {
        Box::pin(async move {
            // DynamoDB refuses a Limit above 1,000; the port serves at most that many,
            // as the AWS adapter does (it asks for no more).
            let limit = limit.min(Capabilities::TABLE_STREAM.max_records_per_call);
            let batch = self.streams.get_records(iterator, limit).await?;
            // DynamoDB Streams names neither the children of a closed shard nor the lag.
            Ok(RecordBatch {
                millis_behind_latest: None,
                child_shards: None,
                ..batch
            })
        })
    }

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>> {
        Box::pin(async move {
            const OP: &str = "DescribeStream";
            let arn = self.resolve(OP, stream)?;
            let (table, enabled) = {
                let state = self.lock();
                let found = state
                    .streams
                    .get(&arn)
                    .ok_or_else(|| StreamError::NotFound {
                        op: OP,
                        message: format!("stream {arn}"),
                    })?;
                (found.table.clone(), found.disabled_at.is_none())
            };
            Ok(StreamSummary {
                name: table,
                open_shard_count: self.open_shards(&arn)?.len() as u32,
                arn,
                status: if enabled { "ENABLED" } else { "DISABLED" }.to_owned(),
                retention_hours: (self.config.retention.as_secs() / 3600) as u32,
                created: None,
            })
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::TABLE_STREAM
    }
}

impl TableStreamAdmin for MemoryTableStreams {
    fn create_table_with_stream<'a>(
        &'a self,
        table: &'a str,
    ) -> BoxFuture<'a, Result<String, StreamError>> {
        Box::pin(async move {
            self.create_table(table, true)?
                .ok_or_else(|| StreamError::Other {
                    op: "CreateTable",
                    message: format!("table {table} was made without its stream"),
                })
        })
    }

    fn delete_table<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move { self.delete(table) })
    }

    fn write_items<'a>(
        &'a self,
        table: &'a str,
        writes: &'a [ItemWrite],
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(async move {
            writes
                .iter()
                .try_for_each(|write| self.write(table, write, None))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "orders";

    fn item(key: &str, fields: &[(&str, &str)]) -> Item {
        let mut item = Item::from([(TABLE_KEY.to_owned(), AttributeValue::S(key.into()))]);
        for (name, value) in fields {
            item.insert((*name).to_owned(), AttributeValue::S((*value).into()));
        }
        item
    }

    fn put(key: &str, fields: &[(&str, &str)]) -> ItemWrite {
        ItemWrite::Put {
            attributes: item(key, fields),
        }
    }

    fn delete(key: &str) -> ItemWrite {
        ItemWrite::Delete { key: key.into() }
    }

    async fn table(config: MemoryTableStreamsConfig) -> (MemoryTableStreams, String) {
        let tables = MemoryTableStreams::new(config);
        let arn = tables.create_table_with_stream(TABLE).await.unwrap();
        (tables, arn)
    }

    async fn iterator(
        tables: &MemoryTableStreams,
        arn: &str,
        shard: &ShardId,
        position: IteratorPosition,
    ) -> ShardIterator {
        tables
            .get_shard_iterator(arn, shard, &position)
            .await
            .unwrap()
    }

    /// Every change of one shard from `position` to the end of what it holds (or of
    /// the shard, if closed): the changes, and whether the shard ended.
    async fn read_shard(
        tables: &MemoryTableStreams,
        arn: &str,
        shard: &ShardId,
        position: IteratorPosition,
    ) -> (Vec<DynamoChange>, bool) {
        let mut it = iterator(tables, arn, shard, position).await;
        let mut changes = Vec::new();
        loop {
            let batch = tables.get_records(&it, 1000).await.unwrap();
            let empty = batch.records.is_empty();
            changes.extend(batch.records.iter().map(|r| r.dynamodb_change().unwrap()));
            match batch.next_iterator {
                None => return (changes, true),
                Some(_) if empty => return (changes, false),
                Some(next) => it = next,
            }
        }
    }

    fn only_shard(shards: &[Shard]) -> ShardId {
        assert_eq!(shards.len(), 1, "{shards:?}");
        shards[0].id.clone()
    }

    #[tokio::test(start_paused = true)]
    async fn writes_become_changes_with_the_right_images() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        let a1 = item("a", &[("v", "1")]);
        let a2 = item("a", &[("v", "2")]);
        let b1 = item("b", &[]);
        // (write, the change it records: kind, old image, new image)
        type Expected = Option<(ChangeKind, Option<Item>, Option<Item>)>;
        let cases: Vec<(ItemWrite, Expected)> = vec![
            (
                put("a", &[("v", "1")]),
                Some((ChangeKind::Insert, None, Some(a1.clone()))),
            ),
            (put("a", &[("v", "1")]), None),
            (
                put("a", &[("v", "2")]),
                Some((ChangeKind::Modify, Some(a1.clone()), Some(a2.clone()))),
            ),
            (
                put("b", &[]),
                Some((ChangeKind::Insert, None, Some(b1.clone()))),
            ),
            (
                delete("a"),
                Some((ChangeKind::Remove, Some(a2.clone()), None)),
            ),
            (delete("a"), None),
            (delete("never"), None),
            (
                put("a", &[("v", "2")]),
                Some((ChangeKind::Insert, None, Some(a2.clone()))),
            ),
        ];
        for (write, _) in &cases {
            tables
                .write_items(TABLE, std::slice::from_ref(write))
                .await
                .unwrap();
        }
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let (changes, ended) =
            read_shard(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        assert!(!ended);
        let got: Vec<_> = changes
            .iter()
            .map(|c| {
                (
                    c.event_name,
                    c.dynamodb.old_image.clone(),
                    c.dynamodb.new_image.clone(),
                )
            })
            .collect();
        let expected: Vec<_> = cases.into_iter().filter_map(|(_, e)| e).collect();
        assert_eq!(got, expected);
        assert!(changes.iter().all(|c| !c.is_ttl_delete()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_carries_what_aws_documents() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        tokio::time::advance(Duration::from_millis(1500)).await;
        tables
            .write_items(TABLE, &[put("a", &[("v", "1")]), put("b", &[])])
            .await
            .unwrap();
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let it = iterator(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        let batch = tables.get_records(&it, 10).await.unwrap();
        assert_eq!(batch.millis_behind_latest, None);
        assert_eq!(batch.child_shards, None);
        let arrival = tables.clock().wall();
        let seconds = arrival
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut ids = Vec::new();
        for record in &batch.records {
            let change = record.dynamodb_change().unwrap();
            assert_eq!(record.partition_key, change.key_text());
            assert_eq!(record.approximate_arrival, Some(arrival));
            assert_eq!(
                change.dynamodb.sequence_number,
                record.sequence_number.as_str()
            );
            assert_eq!(change.event_version.as_deref(), Some("1.1"));
            assert_eq!(change.event_source.as_deref(), Some("aws:dynamodb"));
            assert_eq!(change.aws_region.as_deref(), Some("us-east-1"));
            assert_eq!(
                change.dynamodb.stream_view_type,
                Some(StreamViewType::NewAndOldImages)
            );
            assert_eq!(change.dynamodb.approximate_creation_secs, Some(seconds));
            assert!(change.dynamodb.size_bytes.is_some_and(|s| s > 0));
            assert_eq!(change.event_id.len(), 32);
            ids.push(change.event_id);
        }
        assert_eq!(batch.records[0].partition_key, r#"{"pk":{"S":"a"}}"#);
        ids.dedup();
        assert_eq!(ids.len(), 2, "event ids are unique");
    }

    #[tokio::test(start_paused = true)]
    async fn a_put_without_a_string_key_is_refused() {
        let (tables, _) = table(MemoryTableStreamsConfig::default()).await;
        let numbered = Item::from([(TABLE_KEY.to_owned(), AttributeValue::N("1".into()))]);
        let huge = item("big", &[("blob", &"x".repeat(MAX_ITEM_BYTES))]);
        let cases = [
            (
                "no key",
                Item::from([("v".to_owned(), AttributeValue::S("1".into()))]),
            ),
            ("a number key", numbered),
            ("an empty key", item("", &[])),
            ("over 400 KB", huge),
        ];
        for (name, attributes) in cases {
            let error = tables
                .write_items(TABLE, &[ItemWrite::Put { attributes }])
                .await
                .unwrap_err();
            assert!(
                matches!(error, StreamError::InvalidArgument { .. }),
                "{name}: {error}"
            );
        }
        let error = tables
            .write_items("nope", &[put("a", &[])])
            .await
            .unwrap_err();
        assert!(matches!(error, StreamError::NotFound { .. }), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ttl_delete_names_the_dynamodb_service() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        tables.write_items(TABLE, &[put("a", &[])]).await.unwrap();
        tables.expire_item(TABLE, "a").unwrap();
        tables.expire_item(TABLE, "a").unwrap();
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let (changes, _) = read_shard(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        assert_eq!(changes.len(), 2, "expiring an absent item records nothing");
        assert!(changes[1].is_ttl_delete());
        assert_eq!(changes[1].user_identity, Some(UserIdentity::ttl()));
        assert_eq!(changes[1].dynamodb.old_image, Some(item("a", &[])));
    }

    #[tokio::test(start_paused = true)]
    async fn each_item_keeps_its_order_across_rotations_and_splits() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        let keys: Vec<String> = (0..20).map(|i| format!("item-{i}")).collect();
        let mut version = 0;
        let mut write_round = async |tables: &MemoryTableStreams| {
            version += 1;
            let writes: Vec<_> = keys
                .iter()
                .map(|k| put(k, &[("version", &version.to_string())]))
                .collect();
            tables.write_items(TABLE, &writes).await.unwrap();
        };
        write_round(&tables).await;
        let root = only_shard(&tables.list_shards(&arn).await.unwrap());
        let rotated = tables.rotate_shard(&arn, &root).unwrap();
        write_round(&tables).await;
        let halves = tables.split_shard(&arn, &rotated).unwrap();
        write_round(&tables).await;
        let again = tables.rotate_all(&arn).unwrap();
        assert_eq!(again.len(), 2);
        write_round(&tables).await;

        let shards = tables.list_shards(&arn).await.unwrap();
        assert_eq!(shards.len(), 6);
        for shard in &shards {
            assert_eq!(shard.hash_range, HashKeyRange::FULL);
            assert_eq!(shard.adjacent_parent, None);
        }
        let parent_of = |id: &ShardId| {
            shards
                .iter()
                .find(|s| &s.id == id)
                .and_then(|s| s.parent.clone())
        };
        assert_eq!(parent_of(&root), None);
        assert_eq!(parent_of(&rotated), Some(root.clone()));
        for half in &halves {
            assert_eq!(parent_of(half), Some(rotated.clone()));
        }
        for (child, half) in again.iter().zip(&halves) {
            assert_eq!(parent_of(child), Some(half.clone()));
        }
        assert_eq!(
            tables
                .describe_stream_summary(&arn)
                .await
                .unwrap()
                .open_shard_count,
            2
        );

        // Read as a worker does: a parent to its end before its children.
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut closed_ends = 0;
        for shard in [
            &root, &rotated, &halves[0], &halves[1], &again[0], &again[1],
        ] {
            let (changes, ended) =
                read_shard(&tables, &arn, shard, IteratorPosition::TrimHorizon).await;
            closed_ends += usize::from(ended);
            for change in changes {
                let key = change.dynamodb.keys[TABLE_KEY].as_s().unwrap().to_owned();
                let image = change.dynamodb.new_image.unwrap();
                seen.entry(key)
                    .or_default()
                    .push(image["version"].as_s().unwrap().to_owned());
            }
        }
        assert_eq!(
            closed_ends, 4,
            "the closed shards end, the open ones do not"
        );
        for key in &keys {
            assert_eq!(seen[key], ["1", "2", "3", "4"], "{key}");
        }
        let error = tables.rotate_shard(&arn, &root).unwrap_err();
        assert!(error.to_string().contains("is closed"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_checkpoint_past_retention_is_trimmed() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        tables
            .write_items(TABLE, &[put("a", &[]), put("b", &[])])
            .await
            .unwrap();
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let (changes, _) = read_shard(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        let first = SequenceNumber::parse(&changes[0].dynamodb.sequence_number).unwrap();
        let last = SequenceNumber::parse(&changes[1].dynamodb.sequence_number).unwrap();
        tokio::time::advance(Duration::from_secs(24 * 3600 + 1)).await;
        tables.write_items(TABLE, &[put("c", &[])]).await.unwrap();

        for position in [
            IteratorPosition::AtSequence(first.clone()),
            IteratorPosition::AfterSequence(first),
            IteratorPosition::AtSequence(last.clone()),
        ] {
            let error = tables
                .get_shard_iterator(&arn, &shard, &position)
                .await
                .unwrap_err();
            assert!(
                matches!(error, StreamError::Trimmed { .. }),
                "{position:?}: {error}"
            );
        }
        // After the newest trimmed record nothing is missing: the read goes on.
        let (rest, _) =
            read_shard(&tables, &arn, &shard, IteratorPosition::AfterSequence(last)).await;
        assert_eq!(rest.len(), 1);
        let (horizon, _) = read_shard(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        assert_eq!(horizon, rest);
    }

    #[tokio::test(start_paused = true)]
    async fn an_iterator_pointing_at_trimmed_records_is_trimmed() {
        // Retention shorter than an iterator's life, so that one outlives its records.
        let config = MemoryTableStreamsConfig {
            retention: Duration::from_secs(60),
            ..Default::default()
        };
        let (tables, arn) = table(config).await;
        tables.write_items(TABLE, &[put("a", &[])]).await.unwrap();
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let it = iterator(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        tokio::time::advance(Duration::from_secs(61)).await;
        let error = tables.get_records(&it, 10).await.unwrap_err();
        assert!(matches!(error, StreamError::Trimmed { .. }), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_iterator_expires_after_fifteen_minutes() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let it = iterator(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        tokio::time::advance(Duration::from_secs(14 * 60)).await;
        assert!(tables.get_records(&it, 10).await.is_ok());
        tokio::time::advance(Duration::from_secs(61)).await;
        let error = tables.get_records(&it, 10).await.unwrap_err();
        assert!(
            matches!(error, StreamError::IteratorExpired { .. }),
            "{error}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn get_records_returns_at_most_a_thousand_records_and_a_megabyte() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let it = iterator(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        let error = tables.get_records(&it, 0).await.unwrap_err();
        assert!(
            matches!(error, StreamError::InvalidArgument { .. }),
            "{error}"
        );
        let writes: Vec<_> = (0..1500).map(|i| put(&format!("k{i}"), &[])).collect();
        tables.write_items(TABLE, &writes).await.unwrap();
        // More than 1,000 asked: 1,000 served, as the AWS adapter does.
        let batch = tables.get_records(&it, 5000).await.unwrap();
        assert_eq!(batch.records.len(), 1000);
        let rest = tables
            .get_records(&batch.next_iterator.unwrap(), 1000)
            .await
            .unwrap();
        assert_eq!(rest.records.len(), 500);

        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        let blob = "x".repeat(300 * 1024);
        let writes: Vec<_> = (0..4)
            .map(|i| put(&format!("k{i}"), &[("blob", &blob)]))
            .collect();
        tables.write_items(TABLE, &writes).await.unwrap();
        let it = iterator(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        let batch = tables.get_records(&it, 1000).await.unwrap();
        assert_eq!(batch.records.len(), 3, "1 MB per call");
    }

    #[tokio::test(start_paused = true)]
    async fn latest_sees_only_what_is_written_after_it() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        tables.write_items(TABLE, &[put("old", &[])]).await.unwrap();
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let it = iterator(&tables, &arn, &shard, IteratorPosition::Latest).await;
        tables.write_items(TABLE, &[put("new", &[])]).await.unwrap();
        let batch = tables.get_records(&it, 10).await.unwrap();
        let keys: Vec<_> = batch
            .records
            .iter()
            .map(|r| r.dynamodb_change().unwrap().dynamodb.keys[TABLE_KEY].clone())
            .collect();
        assert_eq!(keys, [AttributeValue::S("new".into())]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_table_name_resolves_to_its_current_stream() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        assert!(
            arn.starts_with("arn:aws:dynamodb:us-east-1:000000000000:table/orders/stream/"),
            "{arn}"
        );
        assert_eq!(crate::model::source::table_of_stream_arn(&arn), Some(TABLE));
        assert_eq!(tables.stream_arn(TABLE), Some(arn.clone()));
        let summary = tables
            .describe_stream_summary("dynamodb:orders")
            .await
            .unwrap();
        assert_eq!(
            summary,
            StreamSummary {
                name: TABLE.into(),
                arn: arn.clone(),
                status: "ENABLED".into(),
                open_shard_count: 1,
                retention_hours: 24,
                created: None,
            }
        );
        assert_eq!(tables.describe_stream_summary(&arn).await.unwrap(), summary);

        tables.create_table_without_stream("plain").unwrap();
        tables.write_items("plain", &[put("a", &[])]).await.unwrap();
        let error = tables
            .describe_stream_summary("dynamodb:plain")
            .await
            .unwrap_err();
        assert!(matches!(error, StreamError::NotFound { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("table plain has no stream"), "{message}");
        assert!(
            message.contains(
                "aws dynamodb update-table --table-name plain --stream-specification \
                 StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES"
            ),
            "{message}"
        );
        for unknown in [
            "dynamodb:missing",
            "arn:aws:dynamodb:us-east-1:0:table/x/stream/y",
        ] {
            let error = tables.describe_stream_summary(unknown).await.unwrap_err();
            assert!(
                matches!(error, StreamError::NotFound { .. }),
                "{unknown}: {error}"
            );
        }
        let error = tables.create_table_with_stream(TABLE).await.unwrap_err();
        assert!(error.to_string().contains("already exists"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_table_leaves_its_stream_readable_but_disabled() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        tables.write_items(TABLE, &[put("a", &[])]).await.unwrap();
        tables.delete_table(TABLE).await.unwrap();
        let summary = tables.describe_stream_summary(&arn).await.unwrap();
        assert_eq!(
            (summary.status.as_str(), summary.open_shard_count),
            ("DISABLED", 0)
        );
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let (changes, ended) =
            read_shard(&tables, &arn, &shard, IteratorPosition::TrimHorizon).await;
        assert_eq!((changes.len(), ended), (1, true));
        assert!(
            tables
                .describe_stream_summary("dynamodb:orders")
                .await
                .is_err()
        );

        // A new table of the same name has a new stream, with its own label.
        let again = tables.create_table_with_stream(TABLE).await.unwrap();
        assert_ne!(again, arn);
        tokio::time::advance(Duration::from_secs(24 * 3600 + 1)).await;
        let error = tables.list_shards(&arn).await.unwrap_err();
        assert!(matches!(error, StreamError::NotFound { .. }), "{error}");
        assert!(tables.list_shards(&again).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_shard_leaves_the_listing_after_retention_and_its_child_stays() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        tables.write_items(TABLE, &[put("a", &[])]).await.unwrap();
        let root = only_shard(&tables.list_shards(&arn).await.unwrap());
        let child = tables.rotate_shard(&arn, &root).unwrap();
        let listed = tables.list_shards(&arn).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(
            listed[0].sequence_range.end.is_some(),
            "the parent is closed"
        );
        tokio::time::advance(Duration::from_secs(24 * 3600 + 1)).await;
        let listed = tables.list_shards(&arn).await.unwrap();
        assert_eq!(only_shard(&listed), child);
        assert_eq!(
            listed[0].parent,
            Some(root),
            "the child still names its parent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn kinesis_only_calls_are_refused() {
        let (tables, arn) = table(MemoryTableStreamsConfig::default()).await;
        assert_eq!(tables.capabilities(), Capabilities::TABLE_STREAM);
        let shard = only_shard(&tables.list_shards(&arn).await.unwrap());
        let error = tables
            .get_shard_iterator(
                &arn,
                &shard,
                &IteratorPosition::AtTimestamp(SystemTime::now()),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(error, StreamError::InvalidArgument { .. }),
            "{error}"
        );
        let errors = [
            tables
                .register_stream_consumer(&arn, "c")
                .await
                .unwrap_err(),
            tables.list_stream_consumers(&arn).await.unwrap_err(),
            tables
                .subscribe_to_shard("c", &shard, &IteratorPosition::Latest)
                .await
                .unwrap_err(),
        ];
        for error in errors {
            assert!(error.to_string().contains("read by polling"), "{error}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn several_shards_share_the_items_by_key() {
        let config = MemoryTableStreamsConfig {
            shards_per_table: 4,
            ..Default::default()
        };
        let (tables, arn) = table(config).await;
        let writes: Vec<_> = (0..200).map(|i| put(&format!("k{i}"), &[])).collect();
        tables.write_items(TABLE, &writes).await.unwrap();
        let shards = tables.list_shards(&arn).await.unwrap();
        assert_eq!(shards.len(), 4);
        let mut total = 0;
        for shard in &shards {
            let (changes, _) =
                read_shard(&tables, &arn, &shard.id, IteratorPosition::TrimHorizon).await;
            assert!(!changes.is_empty(), "{} got nothing", shard.id);
            total += changes.len();
        }
        assert_eq!(total, 200);
    }
}
