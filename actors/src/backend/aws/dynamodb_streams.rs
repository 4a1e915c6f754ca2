//! [`StreamClient`] and [`TableStreamAdmin`] on aws-sdk-dynamodbstreams (and
//! aws-sdk-dynamodb for the table calls): a DynamoDB table's change stream read as a
//! stream of records, so the same fleet consumes it.
//!
//! The stream is addressed by its ARN. `describe_stream_summary` also takes
//! `dynamodb:TABLE` and resolves it with DescribeTable's `LatestStreamArn`; the worker
//! uses the summary's ARN for every later call. Local servers (DynamoDB Local, moto,
//! dynoxide) serve both APIs on one URL, so one endpoint configures both clients.
//!
//! What DynamoDB Streams is not, and how this adapter says so:
//! * shards have no hash key ranges: every shard gets the whole key space, and
//!   [`Capabilities::TABLE_STREAM`] tells the caller not to check coverage;
//! * there is no AT_TIMESTAMP iterator and no enhanced fan-out: both are
//!   `InvalidArgument` naming the alternative, never a silent substitute;
//! * GetRecords reports no children and no lag (`child_shards` and
//!   `millis_behind_latest` are `None`): the caller finds children by listing.
//!
//! Each record's `data` is the change as the JSON AWS documents for stream records
//! ([`DynamoChange`]), its partition key the item's key as text ([`item_key_text`]):
//! per-key order is per-item order. A record this code cannot translate (an unknown
//! `eventName`, an attribute type newer than the SDK) fails the call naming it; no
//! record is ever dropped.
//!
//! Errors go through the one stream mapping in `aws/mod.rs` (`stream_error`):
//! `TrimmedDataAccessException` -> `Trimmed`, `ExpiredIteratorException` ->
//! `IteratorExpired`, `ResourceNotFoundException` -> `NotFound`, throttling codes
//! (`LimitExceededException` among them) -> `Throttled`, no answer / timeouts / 5xx ->
//! `Transient`, access denied or unknown credentials -> `AccessDenied`,
//! `ValidationException` -> `InvalidArgument`. Retries are the SDK's; this adapter
//! adds none.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, TableStatus,
};
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use aws_smithy_types::Blob;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{parse_sequence, sdk_stream_error};

use crate::backend::{
    Capabilities, ItemWrite, IteratorPosition, Record, RecordBatch, ShardIterator, StreamClient,
    StreamError, StreamSummary, TABLE_KEY, TableStreamAdmin,
};
use crate::model::change::{
    AttributeValue, ChangeBody, ChangeKind, Item, StreamViewType, UserIdentity, item_key_text,
};
use crate::model::source::TABLE_PREFIX;
use crate::model::{DynamoChange, HashKeyRange, SequenceNumber, SequenceRange, Shard, ShardId};

/// GetRecords' largest `Limit` on DynamoDB Streams (Kinesis allows 10,000).
const MAX_GET_RECORDS: u32 = 1000;

/// How long a table stream keeps its records: fixed by DynamoDB, not configurable.
const RETENTION_HOURS: u32 = 24;

/// How often and how long `create_table_with_stream` polls for the table to be ACTIVE
/// with its stream ENABLED.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The IAM actions this adapter's [`StreamClient`] calls, one per SDK operation a
/// consumer makes; a test (`tests/deploy.rs`) reads the file and keeps the two equal.
///
/// DynamoDB Streams' actions are in the `dynamodb:` namespace, on the stream's ARN.
/// `dynamodb:DescribeTable` (on the table's ARN) is needed only when the source is
/// named `dynamodb:TABLE`, to find the table's current stream. [`TableStreamAdmin`]'s
/// calls (CreateTable, DeleteTable, PutItem, DeleteItem) are for the demo and tests:
/// `deploy/` grants none of them to a worker.
pub const IAM_ACTIONS: &[&str] = &[
    "dynamodb:DescribeStream",
    "dynamodb:GetShardIterator",
    "dynamodb:GetRecords",
    "dynamodb:DescribeTable",
];

/// A DynamoDB Streams client (and the DynamoDB client its table calls need).
#[derive(Debug, Clone)]
pub struct DynamoStreams {
    streams: aws_sdk_dynamodbstreams::Client,
    tables: aws_sdk_dynamodb::Client,
    /// Named in transient errors so an operator can tell which endpoint is unreachable.
    endpoint: String,
}

/// One DescribeStream, every page: what the summary and the listing need.
struct Description {
    status: String,
    table: Option<String>,
    shards: Vec<Shard>,
}

impl DynamoStreams {
    /// `endpoint` replaces the AWS endpoints of both DynamoDB Streams and DynamoDB (a
    /// local server, which serves both on one URL).
    pub fn new(sdk: &aws_config::SdkConfig, endpoint: Option<&str>) -> Self {
        let mut streams = aws_sdk_dynamodbstreams::config::Builder::from(sdk);
        let mut tables = aws_sdk_dynamodb::config::Builder::from(sdk);
        if let Some(url) = endpoint {
            streams = streams.endpoint_url(url);
            tables = tables.endpoint_url(url);
        }
        Self {
            streams: aws_sdk_dynamodbstreams::Client::from_conf(streams.build()),
            tables: aws_sdk_dynamodb::Client::from_conf(tables.build()),
            endpoint: super::endpoint_name(sdk, "streams.dynamodb", endpoint),
        }
    }

    /// The ARN of `table`'s current stream (DescribeTable's `LatestStreamArn`); a table
    /// without one is `NotFound`, saying how to enable it.
    async fn latest_stream_arn(&self, table: &str) -> Result<String, StreamError> {
        const OP: &str = "DescribeTable";
        let output = self
            .tables
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| sdk_stream_error(OP, e, &self.endpoint))?;
        match output.table().and_then(|t| t.latest_stream_arn()) {
            Some(arn) if !arn.is_empty() => Ok(arn.to_owned()),
            _ => Err(StreamError::NotFound {
                op: OP,
                message: no_stream_message(table),
            }),
        }
    }

    /// DescribeStream, paged by `ExclusiveStartShardId` = `LastEvaluatedShardId` until
    /// the server names none.
    async fn describe(&self, arn: &str) -> Result<Description, StreamError> {
        const OP: &str = "DescribeStream";
        let mut described = Description {
            status: String::new(),
            table: None,
            shards: Vec::new(),
        };
        let mut start: Option<String> = None;
        loop {
            let output = self
                .streams
                .describe_stream()
                .stream_arn(arn)
                .set_exclusive_start_shard_id(start.clone())
                .send()
                .await
                .map_err(|e| sdk_stream_error(OP, e, &self.endpoint))?;
            let page =
                output
                    .stream_description()
                    .ok_or_else(|| StreamError::IncompleteAnswer {
                        op: OP,
                        what: format!("stream {arn}"),
                        missing: "StreamDescription",
                    })?;
            if let Some(status) = page.stream_status() {
                described.status = status.as_str().to_owned();
            }
            if let Some(table) = page.table_name() {
                described.table = Some(table.to_owned());
            }
            for shard in page.shards() {
                described.shards.push(shard_from_sdk(arn, shard)?);
            }
            match page.last_evaluated_shard_id() {
                // A server that answers the same page again names the same last shard:
                // stop rather than loop.
                Some(last) if start.as_deref() != Some(last) => start = Some(last.to_owned()),
                _ => return Ok(described),
            }
        }
    }

    async fn summary(&self, stream: &str) -> Result<StreamSummary, StreamError> {
        const OP: &str = "DescribeStream";
        let (arn, asked_table) = match stream.strip_prefix(TABLE_PREFIX) {
            Some(table) => (self.latest_stream_arn(table).await?, Some(table)),
            None => (stream.to_owned(), None),
        };
        let described = self.describe(&arn).await?;
        if described.status.is_empty() {
            return Err(StreamError::IncompleteAnswer {
                op: OP,
                what: format!("stream {arn}"),
                missing: "StreamStatus",
            });
        }
        let name = described
            .table
            .or_else(|| asked_table.map(str::to_owned))
            .or_else(|| crate::model::source::table_of_stream_arn(&arn).map(str::to_owned))
            .unwrap_or_else(|| arn.clone());
        let open = described.shards.iter().filter(|s| s.is_open()).count();
        Ok(StreamSummary {
            name,
            open_shard_count: u32::try_from(open).unwrap_or(u32::MAX),
            status: described.status,
            arn,
            retention_hours: RETENTION_HOURS,
            created: None,
        })
    }

    async fn iterator(
        &self,
        arn: &str,
        shard: &ShardId,
        position: &IteratorPosition,
    ) -> Result<ShardIterator, StreamError> {
        const OP: &str = "GetShardIterator";
        let request = self
            .streams
            .get_shard_iterator()
            .stream_arn(arn)
            .shard_id(shard.as_str());
        let request = match position {
            IteratorPosition::TrimHorizon => {
                request.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            IteratorPosition::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            IteratorPosition::AtSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .sequence_number(seq.as_str()),
            IteratorPosition::AfterSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq.as_str()),
            IteratorPosition::AtTimestamp(_) => {
                return Err(StreamError::InvalidArgument {
                    op: OP,
                    message: format!(
                        "stream {arn}, shard {shard}: DynamoDB Streams has no AT_TIMESTAMP \
                         iterator (start at TRIM_HORIZON and skip records created before \
                         the time)"
                    ),
                });
            }
        };
        let output = request
            .send()
            .await
            .map_err(|e| sdk_stream_error(OP, e, &self.endpoint))?;
        match output.shard_iterator() {
            Some(iterator) if !iterator.is_empty() => Ok(ShardIterator(iterator.to_owned())),
            _ => Err(StreamError::IncompleteAnswer {
                op: OP,
                what: format!("shard {shard}"),
                missing: "ShardIterator",
            }),
        }
    }

    async fn records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, StreamError> {
        const OP: &str = "GetRecords";
        let limit = i32::try_from(limit.min(MAX_GET_RECORDS)).unwrap_or(i32::MAX);
        let output = self
            .streams
            .get_records()
            .shard_iterator(&iterator.0)
            .limit(limit)
            .send()
            .await
            .map_err(|e| sdk_stream_error(OP, e, &self.endpoint))?;
        let records = output
            .records()
            .iter()
            .map(record_from_sdk)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RecordBatch {
            records,
            // No next iterator: the shard is closed and read to its end.
            next_iterator: output
                .next_shard_iterator()
                .filter(|next| !next.is_empty())
                .map(|next| ShardIterator(next.to_owned())),
            millis_behind_latest: None,
            child_shards: None,
        })
    }

    async fn create_table(&self, table: &str) -> Result<String, StreamError> {
        const OP: &str = "CreateTable";
        let build = |e: aws_sdk_dynamodb::error::BuildError| StreamError::Other {
            op: OP,
            message: format!("table {table}: {e}"),
        };
        let created = self
            .tables
            .create_table()
            .table_name(table)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(TABLE_KEY)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(build)?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(TABLE_KEY)
                    .key_type(KeyType::Hash)
                    .build()
                    .map_err(build)?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(aws_sdk_dynamodb::types::StreamViewType::NewAndOldImages)
                    .build()
                    .map_err(build)?,
            )
            .send()
            .await
            .map_err(|e| sdk_stream_error(OP, e, &self.endpoint));
        match created {
            Ok(_) => {}
            // The table is already there: its stream, if it has one, is the answer.
            Err(StreamError::InUse { .. }) => {}
            Err(err) => return Err(err),
        }
        self.wait_until_streaming(OP, table).await
    }

    /// Polls until `table` is ACTIVE with a stream, and the stream ENABLED; returns the
    /// stream's ARN. `NotFound` is waited out (AWS may not describe a table it has
    /// just accepted), and so is a table without its stream yet.
    async fn wait_until_streaming(
        &self,
        op: &'static str,
        table: &str,
    ) -> Result<String, StreamError> {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let state = match self.tables.describe_table().table_name(table).send().await {
                Ok(output) => {
                    let described = output.table();
                    let status = described.and_then(|t| t.table_status());
                    let arn = described.and_then(|t| t.latest_stream_arn());
                    match (status, arn) {
                        (Some(TableStatus::Active), Some(arn)) if !arn.is_empty() => {
                            let stream = self.describe(arn).await?;
                            if stream.status == "ENABLED" {
                                return Ok(arn.to_owned());
                            }
                            format!("table ACTIVE, stream {}", stream.status)
                        }
                        (status, arn) => format!(
                            "table {}, {}",
                            status.map_or("without a status", |s| s.as_str()),
                            if arn.is_some() {
                                "a stream"
                            } else {
                                "no stream"
                            }
                        ),
                    }
                }
                Err(err) => match sdk_stream_error("DescribeTable", err, &self.endpoint) {
                    StreamError::NotFound { .. } => "not found".to_owned(),
                    other => return Err(other),
                },
            };
            if Instant::now() >= deadline {
                return Err(StreamError::Other {
                    op,
                    message: format!(
                        "table {table} not ACTIVE with an ENABLED stream after {WAIT_LIMIT:?} \
                         ({state})"
                    ),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn drop_table(&self, table: &str) -> Result<(), StreamError> {
        self.tables
            .delete_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| sdk_stream_error("DeleteTable", e, &self.endpoint))?;
        Ok(())
    }

    async fn write(&self, table: &str, writes: &[ItemWrite]) -> Result<(), StreamError> {
        for (index, write) in writes.iter().enumerate() {
            match write {
                ItemWrite::Put { attributes } => {
                    const OP: &str = "PutItem";
                    let item = super::dynamodb::item_to_sdk(OP, attributes).map_err(|why| {
                        StreamError::InvalidArgument {
                            op: OP,
                            message: format!("table {table}: write {index}: {why}"),
                        }
                    })?;
                    self.tables
                        .put_item()
                        .table_name(table)
                        .set_item(Some(item))
                        .send()
                        .await
                        .map_err(|e| sdk_stream_error(OP, e, &self.endpoint))?;
                }
                ItemWrite::Delete { key } => {
                    self.tables
                        .delete_item()
                        .table_name(table)
                        .key(
                            TABLE_KEY,
                            aws_sdk_dynamodb::types::AttributeValue::S(key.clone()),
                        )
                        .send()
                        .await
                        .map_err(|e| sdk_stream_error("DeleteItem", e, &self.endpoint))?;
                }
            }
        }
        Ok(())
    }
}

/// The `NotFound` message for a table without a stream: what to run to enable one.
fn no_stream_message(table: &str) -> String {
    format!(
        "table {table} has no stream enabled; enable one with `aws dynamodb update-table \
         --table-name {table} --stream-specification \
         StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES`"
    )
}

/// A shard of DescribeStream. DynamoDB shards have no hash key ranges: each gets the
/// whole key space ([`Capabilities::TABLE_STREAM`] says not to check coverage). A shard
/// without a `StartingSequenceNumber` (dynoxide's, before its first record) starts at
/// 0: before every record, and nothing reads a shard's start but to show it.
fn shard_from_sdk(
    arn: &str,
    shard: &aws_sdk_dynamodbstreams::types::Shard,
) -> Result<Shard, StreamError> {
    const OP: &str = "DescribeStream";
    let id = match shard.shard_id() {
        Some(id) if !id.is_empty() => id,
        _ => {
            return Err(StreamError::IncompleteAnswer {
                op: OP,
                what: format!("a shard of stream {arn}"),
                missing: "ShardId",
            });
        }
    };
    let what = format!("shard {id}");
    let range = shard.sequence_number_range();
    let start = match range.and_then(|r| r.starting_sequence_number()) {
        Some(text) => parse_sequence(OP, &what, text)?,
        None => SequenceNumber::from_u128(0),
    };
    let end = range
        .and_then(|r| r.ending_sequence_number())
        .map(|text| parse_sequence(OP, &what, text))
        .transpose()?;
    Ok(Shard {
        id: ShardId::new(id),
        parent: shard.parent_shard_id().map(ShardId::new),
        adjacent_parent: None,
        hash_range: HashKeyRange::FULL,
        sequence_range: SequenceRange { start, end },
    })
}

/// A stream record as a [`Record`] whose `data` is the [`DynamoChange`] JSON.
/// "record SEQ", for the errors about one record.
struct RecordName<'a>(&'a str);

impl std::fmt::Display for RecordName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "record {}", self.0)
    }
}

fn record_from_sdk(record: &aws_sdk_dynamodbstreams::types::Record) -> Result<Record, StreamError> {
    const OP: &str = "GetRecords";
    let incomplete = |what: &str, missing: &'static str| StreamError::IncompleteAnswer {
        op: OP,
        what: what.to_owned(),
        missing,
    };
    let body = record
        .dynamodb()
        .ok_or_else(|| incomplete("a record", "dynamodb"))?;
    let seq = body
        .sequence_number()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| incomplete("a record", "SequenceNumber"))?;
    // Named only in errors: nothing is formatted per record on the way through.
    let what = RecordName(seq);
    let event_id = record
        .event_id()
        .ok_or_else(|| incomplete(&what.to_string(), "eventID"))?;
    let event_name = record
        .event_name()
        .ok_or_else(|| incomplete(&what.to_string(), "eventName"))?;
    let event_name = ChangeKind::parse(event_name.as_str()).ok_or_else(|| StreamError::Other {
        op: OP,
        message: format!(
            "{what}: eventName {:?} is none of INSERT, MODIFY, REMOVE (the record is not \
             skipped: this version cannot say what it means)",
            event_name.as_str()
        ),
    })?;
    let image =
        |name: &str, image: &HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>| {
            item_from_sdk(image).map_err(|why| StreamError::Other {
                op: OP,
                message: format!("{what}: {name}: {why}"),
            })
        };
    let keys = image(
        "Keys",
        body.keys()
            .ok_or_else(|| incomplete(&what.to_string(), "Keys"))?,
    )?;
    let created = body.approximate_creation_date_time();
    let approximate_arrival = created
        .map(|at| {
            SystemTime::try_from(*at).map_err(|e| StreamError::Other {
                op: OP,
                message: format!("{what}: ApproximateCreationDateTime {at} out of range: {e}"),
            })
        })
        .transpose()?;
    let change = DynamoChange {
        event_id: event_id.to_owned(),
        event_name,
        event_version: record.event_version().map(str::to_owned),
        event_source: record.event_source().map(str::to_owned),
        aws_region: record.aws_region().map(str::to_owned),
        dynamodb: ChangeBody {
            // Whole seconds, as AWS documents the field (moto sends fractions).
            approximate_creation_secs: created.map(|at| at.secs()),
            new_image: body.new_image().map(|i| image("NewImage", i)).transpose()?,
            old_image: body.old_image().map(|i| image("OldImage", i)).transpose()?,
            sequence_number: seq.to_owned(),
            size_bytes: body.size_bytes().and_then(|n| u64::try_from(n).ok()),
            // Informational: a view this code does not know is left out, not fatal.
            stream_view_type: body
                .stream_view_type()
                .and_then(|v| StreamViewType::parse(v.as_str())),
            keys,
        },
        user_identity: record.user_identity().map(|identity| UserIdentity {
            kind: identity.r#type().unwrap_or_default().to_owned(),
            principal_id: identity.principal_id().unwrap_or_default().to_owned(),
        }),
    };
    Ok(Record {
        sequence_number: parse_sequence(OP, &what, seq)?,
        sub_sequence_number: 0,
        partition_key: item_key_text(&change.dynamodb.keys),
        explicit_hash_key: None,
        data: Bytes::from(change.to_json()),
        approximate_arrival,
    })
}

/// An image (or key) of a stream record in [`DynamoChange`]'s terms; binary values as
/// base64, as DynamoDB's JSON carries them.
fn item_from_sdk(
    item: &HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>,
) -> Result<Item, String> {
    item.iter()
        .map(|(name, value)| {
            attribute_from_sdk(value)
                .map(|v| (name.clone(), v))
                .map_err(|why| format!("attribute {name}: {why}"))
        })
        .collect()
}

fn attribute_from_sdk(
    value: &aws_sdk_dynamodbstreams::types::AttributeValue,
) -> Result<AttributeValue, String> {
    use aws_sdk_dynamodbstreams::types::AttributeValue as Sdk;
    let base64 = |blob: &Blob| BASE64.encode(blob.as_ref());
    Ok(match value {
        Sdk::S(s) => AttributeValue::S(s.clone()),
        Sdk::N(n) => AttributeValue::N(n.clone()),
        Sdk::B(b) => AttributeValue::B(base64(b)),
        Sdk::Ss(ss) => AttributeValue::SS(ss.clone()),
        Sdk::Ns(ns) => AttributeValue::NS(ns.clone()),
        Sdk::Bs(bs) => AttributeValue::BS(bs.iter().map(base64).collect()),
        Sdk::M(map) => AttributeValue::M(
            map.iter()
                .map(|(k, v)| attribute_from_sdk(v).map(|v| (k.clone(), v)))
                .collect::<Result<_, _>>()?,
        ),
        Sdk::L(list) => AttributeValue::L(
            list.iter()
                .map(attribute_from_sdk)
                .collect::<Result<_, _>>()?,
        ),
        Sdk::Null(n) => AttributeValue::Null(*n),
        Sdk::Bool(b) => AttributeValue::Bool(*b),
        _ => return Err("an attribute type this SDK does not know".to_owned()),
    })
}

impl StreamClient for DynamoStreams {
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        Box::pin(async move { Ok(self.describe(stream).await?.shards) })
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>> {
        Box::pin(self.iterator(stream, shard, position))
    }

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>> {
        Box::pin(self.records(iterator, limit))
    }

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>> {
        Box::pin(self.summary(stream))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::TABLE_STREAM
    }
}

impl TableStreamAdmin for DynamoStreams {
    fn create_table_with_stream<'a>(
        &'a self,
        table: &'a str,
    ) -> BoxFuture<'a, Result<String, StreamError>> {
        Box::pin(self.create_table(table))
    }

    fn delete_table<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.drop_table(table))
    }

    fn write_items<'a>(
        &'a self,
        table: &'a str,
        writes: &'a [ItemWrite],
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.write(table, writes))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use aws_sdk_dynamodbstreams::types::{
        AttributeValue as Sdk, Identity, OperationType, SequenceNumberRange, StreamRecord,
    };
    use aws_smithy_types::DateTime;
    use serde_json::json;

    use super::super::{Failure, stream_error};
    use super::*;

    fn sdk_record(
        name: Option<OperationType>,
        body: Option<StreamRecord>,
    ) -> aws_sdk_dynamodbstreams::types::Record {
        aws_sdk_dynamodbstreams::types::Record::builder()
            .event_id("e-1")
            .set_event_name(name)
            .event_version("1.1")
            .event_source("aws:dynamodb")
            .aws_region("us-east-1")
            .set_dynamodb(body)
            .build()
    }

    fn body() -> aws_sdk_dynamodbstreams::types::builders::StreamRecordBuilder {
        StreamRecord::builder()
            .keys("pk", Sdk::S("a".into()))
            .sequence_number("000000000000000000042")
            .size_bytes(12)
            .stream_view_type(aws_sdk_dynamodbstreams::types::StreamViewType::NewAndOldImages)
            .approximate_creation_date_time(DateTime::from_secs_f64(1_700_000_000.75))
    }

    #[test]
    fn every_attribute_type_becomes_dynamodb_json() {
        let cases: Vec<(&str, Sdk, serde_json::Value)> = vec![
            ("s", Sdk::S("x".into()), json!({"S": "x"})),
            ("n", Sdk::N("-1.5e3".into()), json!({"N": "-1.5e3"})),
            ("b", Sdk::B(Blob::new(vec![0, 1])), json!({"B": "AAE="})),
            (
                "ss",
                Sdk::Ss(vec!["a".into(), "b".into()]),
                json!({"SS": ["a", "b"]}),
            ),
            ("ns", Sdk::Ns(vec!["1".into()]), json!({"NS": ["1"]})),
            (
                "bs",
                Sdk::Bs(vec![Blob::new(vec![0]), Blob::new(vec![255])]),
                json!({"BS": ["AA==", "/w=="]}),
            ),
            (
                "m",
                Sdk::M(HashMap::from([("k".to_owned(), Sdk::Bool(true))])),
                json!({"M": {"k": {"BOOL": true}}}),
            ),
            (
                "l",
                Sdk::L(vec![Sdk::Null(true), Sdk::N("2".into())]),
                json!({"L": [{"NULL": true}, {"N": "2"}]}),
            ),
            ("null", Sdk::Null(true), json!({"NULL": true})),
            ("bool", Sdk::Bool(false), json!({"BOOL": false})),
        ];
        for (name, value, want) in cases {
            let record = sdk_record(
                Some(OperationType::Insert),
                Some(body().new_image(name, value.clone()).build()),
            );
            let record = record_from_sdk(&record).unwrap_or_else(|e| panic!("{name}: {e}"));
            let data: serde_json::Value = serde_json::from_slice(&record.data).unwrap();
            assert_eq!(data["dynamodb"]["NewImage"][name], want, "{name}");
            // And back, for writes: the same value as aws-sdk-dynamodb's.
            let ours = Item::from([(name.to_owned(), attribute_from_sdk(&value).unwrap())]);
            let written = super::super::dynamodb::item_to_sdk("PutItem", &ours)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                format!("{:?}", written[name]),
                format!("{value:?}"),
                "{name}"
            );
        }
    }

    #[test]
    fn a_record_becomes_the_documented_change_json() {
        let modify = sdk_record(
            Some(OperationType::Modify),
            Some(
                body()
                    .new_image("pk", Sdk::S("a".into()))
                    .new_image("v", Sdk::N("2".into()))
                    .old_image("pk", Sdk::S("a".into()))
                    .old_image("v", Sdk::N("1".into()))
                    .build(),
            ),
        );
        let record = record_from_sdk(&modify).unwrap();
        assert_eq!(record.sequence_number.as_str(), "000000000000000000042");
        assert_eq!(record.sub_sequence_number, 0);
        assert_eq!(record.partition_key, r#"{"pk":{"S":"a"}}"#);
        assert_eq!(record.explicit_hash_key, None);
        assert_eq!(
            record.approximate_arrival,
            SystemTime::try_from(DateTime::from_secs_f64(1_700_000_000.75)).ok()
        );
        let data: serde_json::Value = serde_json::from_slice(&record.data).unwrap();
        assert_eq!(
            data,
            json!({
                "eventID": "e-1",
                "eventName": "MODIFY",
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": "us-east-1",
                "dynamodb": {
                    "ApproximateCreationDateTime": 1_700_000_000,
                    "Keys": {"pk": {"S": "a"}},
                    "NewImage": {"pk": {"S": "a"}, "v": {"N": "2"}},
                    "OldImage": {"pk": {"S": "a"}, "v": {"N": "1"}},
                    "SequenceNumber": "000000000000000000042",
                    "SizeBytes": 12,
                    "StreamViewType": "NEW_AND_OLD_IMAGES"
                }
            })
        );
        let change = record.dynamodb_change().unwrap();
        assert_eq!(change.event_name, ChangeKind::Modify);
        assert_eq!(change.key_text(), record.partition_key);
    }

    #[test]
    fn a_ttl_delete_keeps_its_identity() {
        let mut remove = sdk_record(
            Some(OperationType::Remove),
            Some(body().old_image("pk", Sdk::S("a".into())).build()),
        );
        remove.user_identity = Some(
            Identity::builder()
                .r#type("Service")
                .principal_id("dynamodb.amazonaws.com")
                .build(),
        );
        let change = record_from_sdk(&remove).unwrap().dynamodb_change().unwrap();
        assert!(change.is_ttl_delete());
        assert_eq!(change.dynamodb.new_image, None);
    }

    #[test]
    fn what_a_record_lacks_is_named_never_skipped() {
        type Edit = fn(&mut aws_sdk_dynamodbstreams::types::Record);
        let cases: [(&str, Edit, &str); 6] = [
            ("no dynamodb", |r| r.dynamodb = None, "no dynamodb"),
            (
                "no sequence number",
                |r| {
                    if let Some(b) = r.dynamodb.as_mut() {
                        b.sequence_number = None;
                    }
                },
                "no SequenceNumber",
            ),
            ("no eventID", |r| r.event_id = None, "no eventID"),
            ("no eventName", |r| r.event_name = None, "no eventName"),
            (
                "unknown eventName",
                |r| r.event_name = Some(OperationType::from("UPSERT")),
                "\"UPSERT\" is none of INSERT, MODIFY, REMOVE",
            ),
            (
                "no keys",
                |r| {
                    if let Some(b) = r.dynamodb.as_mut() {
                        b.keys = None;
                    }
                },
                "no Keys",
            ),
        ];
        for (name, edit, says) in cases {
            let mut record = sdk_record(Some(OperationType::Insert), Some(body().build()));
            edit(&mut record);
            let error = record_from_sdk(&record).expect_err(name);
            assert!(error.to_string().contains(says), "{name}: {error}");
        }
    }

    #[test]
    fn optional_fields_may_be_missing() {
        let bare = aws_sdk_dynamodbstreams::types::Record::builder()
            .event_id("e")
            .event_name(OperationType::Insert)
            .dynamodb(
                StreamRecord::builder()
                    .keys("pk", Sdk::S("a".into()))
                    .sequence_number("7")
                    .build(),
            )
            .build();
        let record = record_from_sdk(&bare).unwrap();
        assert_eq!(record.approximate_arrival, None);
        let data: serde_json::Value = serde_json::from_slice(&record.data).unwrap();
        assert_eq!(
            data,
            json!({"eventID": "e", "eventName": "INSERT",
                   "dynamodb": {"Keys": {"pk": {"S": "a"}}, "SequenceNumber": "7"}})
        );
    }

    #[test]
    fn shards_have_the_whole_key_space_and_a_lenient_start() {
        let range = |start: Option<&str>, end: Option<&str>| {
            SequenceNumberRange::builder()
                .set_starting_sequence_number(start.map(str::to_owned))
                .set_ending_sequence_number(end.map(str::to_owned))
                .build()
        };
        let shard = |id: Option<&str>, parent: Option<&str>, r: Option<SequenceNumberRange>| {
            aws_sdk_dynamodbstreams::types::Shard::builder()
                .set_shard_id(id.map(str::to_owned))
                .set_parent_shard_id(parent.map(str::to_owned))
                .set_sequence_number_range(r)
                .build()
        };
        // (shard, start, end, parent)
        let cases = [
            (
                shard(Some("s1"), None, Some(range(Some("100"), None))),
                "100",
                None,
                None,
            ),
            (
                shard(
                    Some("s2"),
                    Some("s1"),
                    Some(range(Some("100"), Some("200"))),
                ),
                "100",
                Some("200"),
                Some("s1"),
            ),
            (
                shard(Some("s3"), None, Some(range(None, None))),
                "0",
                None,
                None,
            ),
            (shard(Some("s4"), None, None), "0", None, None),
        ];
        for (sdk, start, end, parent) in cases {
            let ours = shard_from_sdk("arn", &sdk).unwrap();
            assert_eq!(ours.hash_range, HashKeyRange::FULL, "{sdk:?}");
            assert_eq!(ours.adjacent_parent, None);
            assert_eq!(ours.sequence_range.start.as_str(), start, "{sdk:?}");
            assert_eq!(
                ours.sequence_range.end.as_ref().map(|e| e.as_str()),
                end,
                "{sdk:?}"
            );
            assert_eq!(ours.parent.as_ref().map(|p| p.as_str()), parent);
        }
        let error = shard_from_sdk("arn", &shard(None, None, None)).unwrap_err();
        assert!(matches!(
            error,
            StreamError::IncompleteAnswer {
                missing: "ShardId",
                ..
            }
        ));
    }

    #[test]
    fn writes_refuse_binary_that_is_not_base64() {
        let item: Item = BTreeMap::from([
            ("pk".to_owned(), AttributeValue::S("a".into())),
            ("b".to_owned(), AttributeValue::B("not base64!".into())),
        ]);
        let error = super::super::dynamodb::item_to_sdk("PutItem", &item)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("binary attribute value is not base64"),
            "{error}"
        );
    }

    #[test]
    fn stream_codes_map_to_what_the_caller_does() {
        type Check = fn(&StreamError) -> bool;
        let cases: [(&str, Failure, Check); 8] = [
            ("TrimmedDataAccessException", Failure::Other, |e| {
                matches!(e, StreamError::Trimmed { .. })
            }),
            ("ExpiredIteratorException", Failure::Other, |e| {
                matches!(e, StreamError::IteratorExpired { .. })
            }),
            ("ResourceNotFoundException", Failure::Other, |e| {
                matches!(e, StreamError::NotFound { .. })
            }),
            ("LimitExceededException", Failure::Throttled, |e| {
                matches!(e, StreamError::Throttled { .. })
            }),
            ("InternalServerError", Failure::Transient, |e| {
                matches!(e, StreamError::Transient { .. })
            }),
            ("UnrecognizedClientException", Failure::Denied, |e| {
                matches!(e, StreamError::AccessDenied { .. })
            }),
            ("ValidationException", Failure::Other, |e| {
                matches!(e, StreamError::InvalidArgument { .. })
            }),
            ("SomethingNew", Failure::Other, |e| {
                matches!(e, StreamError::Other { .. })
            }),
        ];
        for (code, failure, want) in cases {
            let error = stream_error("GetRecords", Some(code), failure, code.to_owned(), "e");
            assert!(want(&error), "{code}: {error:?}");
        }
    }

    fn offline() -> DynamoStreams {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        // Nothing listens here: the calls under test must answer without the network.
        DynamoStreams::new(&sdk, Some("http://127.0.0.1:9"))
    }

    #[tokio::test]
    async fn what_dynamodb_streams_lacks_is_refused_naming_the_alternative() {
        let streams = offline();
        let shard = ShardId::new("s");
        let at = IteratorPosition::AtTimestamp(SystemTime::UNIX_EPOCH);
        let error = streams
            .get_shard_iterator("arn", &shard, &at)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StreamError::InvalidArgument { message, .. }
                if message.contains("no AT_TIMESTAMP")),
            "{error}"
        );
        let fan_out = [
            streams.register_stream_consumer("arn", "c").await.err(),
            streams.describe_stream_consumer("arn", "c").await.err(),
            streams.list_stream_consumers("arn").await.err(),
            streams.deregister_stream_consumer("c").await.err(),
            streams
                .subscribe_to_shard("c", &shard, &IteratorPosition::Latest)
                .await
                .err(),
        ];
        for error in fan_out {
            assert!(
                matches!(&error, Some(StreamError::InvalidArgument { message, .. })
                    if message.contains("read by polling")),
                "{error:?}"
            );
        }
        assert_eq!(streams.capabilities(), Capabilities::TABLE_STREAM);
        assert!(no_stream_message("orders").contains(
            "aws dynamodb update-table --table-name orders --stream-specification \
             StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES"
        ));
    }
}
