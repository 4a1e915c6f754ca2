//! [`StreamClient`] and [`StreamAdmin`] on aws-sdk-kinesis.
//!
//! Streams are addressed by name, never by ARN (ferrokinesis fails on StreamARN), and
//! ListShards pages with `ExclusiveStartShardId` + `StreamName`, never `NextToken`
//! (ferrokinesis ignores it). Retries are the SDK's (its retry config in the
//! `SdkConfig`); this adapter adds none.
//!
//! Error mapping, by the service's error code first and the HTTP status second:
//! throttling codes -> `Throttled`; `ExpiredIteratorException` -> `IteratorExpired`;
//! `ResourceNotFoundException` -> `NotFound`; `InvalidArgumentException` and
//! `ValidationException` -> `InvalidArgument`; no answer, a timeout, an answer cut
//! short, `InternalFailure`/`ServiceUnavailable`, or any 5xx, with or without an error
//! code -> `Transient` (a reader backs off and retries; it does not restart the shard).
//! A bare 500 is also what kinesis-mock and moto answer to a garbage shard iterator:
//! nothing in it tells that apart from a server fault, so it is transient there too
//! (a reader only ever holds iterators the server gave it).
//!
//! Answers are read leniently: each call decodes only what it uses, and what Kinesis
//! marks optional (`MillisBehindLatest`, `ApproximateArrivalTimestamp`, `ChildShards`,
//! a child's `HashKeyRange`) may be missing. Something truly needed that is missing is
//! `IncompleteAnswer`, naming it.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::primitives::event_stream::EventReceiver;
use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError;
use aws_sdk_kinesis::types::{
    PutRecordsRequestEntry, ShardIteratorType, StartingPosition, StreamStatus,
    SubscribeToShardEventStream,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::DateTime;
use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{
    DENIED_CODES, Failure, KMS_THROTTLING, THROTTLING_CODES, TRANSIENT_CODES, cause_chain,
    parse_sequence, sdk_stream_error, stream_error,
};

use crate::backend::{
    Capabilities, ChildShard, Consumer, ConsumerStatus, IteratorPosition, PutRecord, PutResult,
    Record, RecordBatch, ShardEvent, ShardIterator, StreamAdmin, StreamClient, StreamError,
    StreamSummary, Subscription,
};
use crate::model::{HashKeyRange, SequenceRange, Shard, ShardId, StreamArn};

/// PutRecords limits: records per call, and bytes (data plus partition keys) per call.
const MAX_PUT_RECORDS: usize = 500;
const MAX_PUT_BYTES: usize = 5 * 1024 * 1024;

/// How often and how long `create_stream`, `split_shard` and `merge_shards` poll for
/// the stream to be ACTIVE again.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The IAM actions this adapter calls, one per SDK operation in this file; a test
/// (`tests/deploy.rs`) reads the file and keeps the two equal.
///
/// A polling worker ([`StreamClient`]) needs only the first four, on the stream's ARN; a
/// fan-out worker also the next two on the stream and `SubscribeToShard` on its
/// consumer's ARN. `ListStreamConsumers` and `DeregisterStreamConsumer` are for the
/// `flotilla consumer` commands (operators). The rest are [`StreamAdmin`]'s (the demo producer, tests, operators): `deploy/` grants none
/// of them to a worker.
pub const IAM_ACTIONS: &[&str] = &[
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
    "kinesis:DescribeStreamSummary",
    "kinesis:RegisterStreamConsumer",
    "kinesis:DescribeStreamConsumer",
    "kinesis:SubscribeToShard",
    "kinesis:ListStreamConsumers",
    "kinesis:DeregisterStreamConsumer",
    "kinesis:CreateStream",
    "kinesis:DeleteStream",
    "kinesis:PutRecords",
    "kinesis:SplitShard",
    "kinesis:MergeShards",
];

/// A Kinesis stream client.
#[derive(Debug, Clone)]
pub struct KinesisStream {
    client: aws_sdk_kinesis::Client,
    /// Named in transient errors so an operator can tell which endpoint is unreachable.
    endpoint: String,
    capabilities: Capabilities,
    list_page_size: Option<i32>,
}

impl KinesisStream {
    /// `endpoint` replaces the AWS endpoint (a local server in tests and demos).
    pub fn new(sdk: &aws_config::SdkConfig, endpoint: Option<&str>) -> Self {
        let mut config = aws_sdk_kinesis::config::Builder::from(sdk);
        if let Some(url) = endpoint {
            config = config.endpoint_url(url);
        }
        Self {
            client: aws_sdk_kinesis::Client::from_conf(config.build()),
            endpoint: super::endpoint_name(sdk, "kinesis", endpoint),
            capabilities: Capabilities::FULL,
            list_page_size: None,
        }
    }

    /// Asks ListShards for pages of at most `size` shards (the service default is
    /// 1,000), so tests can make a small stream paginate.
    pub fn with_list_page_size(mut self, size: i32) -> Self {
        self.list_page_size = Some(size);
        self
    }

    /// Declares what the server behind this client reports (an emulator reports less
    /// than [`Capabilities::FULL`], the default). It changes no call, only what
    /// [`StreamClient::capabilities`] answers.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    fn classify<E>(&self, op: &'static str, err: SdkError<E, HttpResponse>) -> StreamError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        sdk_stream_error(op, err, &self.endpoint)
    }

    /// A subscription error event's error, by its code first and its [`Failure`] second
    /// (the one mapping, [`stream_error`]).
    fn sorted(
        &self,
        op: &'static str,
        code: Option<&str>,
        failure: Failure,
        message: String,
    ) -> StreamError {
        stream_error(op, code, failure, message, &self.endpoint)
    }

    async fn list(&self, stream: &str) -> Result<Vec<Shard>, StreamError> {
        const OP: &str = "ListShards";
        let mut shards: Vec<Shard> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        loop {
            let mut request = self
                .client
                .list_shards()
                .set_stream_name(by_name(stream))
                .set_stream_arn(by_arn(stream))
                .set_max_results(self.list_page_size);
            if let Some(last) = shards.last() {
                request = request.exclusive_start_shard_id(last.id.as_str());
            }
            let page = request.send().await.map_err(|e| self.classify(OP, e))?;
            let before = shards.len();
            for shard in page.shards() {
                if seen.insert(shard.shard_id().to_owned()) {
                    shards.push(shard_from_sdk(shard)?);
                }
            }
            // The last page carries no NextToken. A server that ignores paging and
            // answers everything every time shows up as a page that adds nothing.
            if page.next_token().is_none() || shards.len() == before {
                return Ok(shards);
            }
        }
    }

    async fn iterator(
        &self,
        stream: &str,
        shard: &ShardId,
        position: &IteratorPosition,
    ) -> Result<ShardIterator, StreamError> {
        const OP: &str = "GetShardIterator";
        let request = self
            .client
            .get_shard_iterator()
            .set_stream_name(by_name(stream))
            .set_stream_arn(by_arn(stream))
            .shard_id(shard.as_str());
        let request = match position {
            IteratorPosition::TrimHorizon => {
                request.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            IteratorPosition::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            IteratorPosition::AtSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .starting_sequence_number(seq.as_str()),
            IteratorPosition::AfterSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq.as_str()),
            IteratorPosition::AtTimestamp(at) => request
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from(*at)),
        };
        let output = request.send().await.map_err(|e| self.classify(OP, e))?;
        output
            .shard_iterator()
            .map(|it| ShardIterator(it.to_owned()))
            .ok_or_else(|| StreamError::IncompleteAnswer {
                op: OP,
                what: format!("{shard} of stream {stream}"),
                missing: "ShardIterator",
            })
    }

    async fn records(
        &self,
        iterator: &ShardIterator,
        limit: u32,
    ) -> Result<RecordBatch, StreamError> {
        const OP: &str = "GetRecords";
        let output = self
            .client
            .get_records()
            .shard_iterator(&iterator.0)
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        let records = output
            .records()
            .iter()
            .map(record_from_sdk)
            .collect::<Result<Vec<_>, _>>()?;
        let millis_behind_latest = output
            .millis_behind_latest()
            .map(|ms| {
                u64::try_from(ms).map_err(|_| StreamError::Other {
                    op: OP,
                    message: format!("MillisBehindLatest {ms} is negative"),
                })
            })
            .transpose()?;
        // Children are a shortcut (the watcher lists the shards when none are
        // reported), and a lease row needs each child's hash range: children reported
        // without one are taken as not reported, and come from ListShards instead.
        let child_shards = output.child_shards.as_deref().and_then(|children| {
            children
                .iter()
                .map(child_from_sdk)
                .collect::<Option<Vec<_>>>()
        });
        Ok(RecordBatch {
            records,
            next_iterator: output
                .next_shard_iterator()
                .map(|it| ShardIterator(it.to_owned())),
            millis_behind_latest,
            child_shards,
        })
    }

    async fn register_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<Consumer, StreamError> {
        const OP: &str = "RegisterStreamConsumer";
        let output = self
            .client
            .register_stream_consumer()
            .stream_arn(stream_arn)
            .consumer_name(name)
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        let consumer = output
            .consumer()
            .ok_or_else(|| StreamError::IncompleteAnswer {
                op: OP,
                what: format!("consumer {name}"),
                missing: "Consumer",
            })?;
        consumer_from_sdk(OP, consumer)
    }

    async fn describe_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<Consumer, StreamError> {
        const OP: &str = "DescribeStreamConsumer";
        let output = self
            .client
            .describe_stream_consumer()
            .stream_arn(stream_arn)
            .consumer_name(name)
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        let consumer =
            output
                .consumer_description()
                .ok_or_else(|| StreamError::IncompleteAnswer {
                    op: OP,
                    what: format!("consumer {name}"),
                    missing: "ConsumerDescription",
                })?;
        consumer_from_sdk(OP, consumer)
    }

    async fn list_consumers(&self, stream_arn: &str) -> Result<Vec<Consumer>, StreamError> {
        const OP: &str = "ListStreamConsumers";
        let mut consumers = Vec::new();
        let mut token: Option<String> = None;
        loop {
            // The SDK needs the stream's ARN on every page (it picks the endpoint by it).
            let request = self
                .client
                .list_stream_consumers()
                .stream_arn(stream_arn)
                .set_next_token(token.clone());
            let page = request.send().await.map_err(|e| self.classify(OP, e))?;
            for consumer in page.consumers() {
                consumers.push(consumer_from_sdk(OP, consumer)?);
            }
            match page.next_token() {
                Some(next) if !page.consumers().is_empty() => token = Some(next.to_owned()),
                _ => return Ok(consumers),
            }
        }
    }

    async fn deregister_consumer(&self, consumer_arn: &str) -> Result<(), StreamError> {
        const OP: &str = "DeregisterStreamConsumer";
        self.client
            .deregister_stream_consumer()
            .consumer_arn(consumer_arn)
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        Ok(())
    }

    async fn subscribe(
        &self,
        consumer_arn: &str,
        shard: &ShardId,
        position: &IteratorPosition,
    ) -> Result<Box<dyn Subscription>, StreamError> {
        const OP: &str = "SubscribeToShard";
        let start = StartingPosition::builder();
        let start = match position {
            IteratorPosition::TrimHorizon => start.r#type(ShardIteratorType::TrimHorizon),
            IteratorPosition::Latest => start.r#type(ShardIteratorType::Latest),
            IteratorPosition::AtSequence(seq) => start
                .r#type(ShardIteratorType::AtSequenceNumber)
                .sequence_number(seq.as_str()),
            IteratorPosition::AfterSequence(seq) => start
                .r#type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq.as_str()),
            IteratorPosition::AtTimestamp(at) => start
                .r#type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from(*at)),
        };
        let start = start.build().map_err(|e| StreamError::InvalidArgument {
            op: OP,
            message: format!("starting position: {e}"),
        })?;
        let output = self
            .client
            .subscribe_to_shard()
            .consumer_arn(consumer_arn)
            .shard_id(shard.as_str())
            .starting_position(start)
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        Ok(Box::new(SdkSubscription {
            events: output.event_stream,
            kinesis: self.clone(),
        }))
    }

    async fn summary(&self, stream: &str) -> Result<StreamSummary, StreamError> {
        const OP: &str = "DescribeStreamSummary";
        let output = self
            .client
            .describe_stream_summary()
            .set_stream_name(by_name(stream))
            .set_stream_arn(by_arn(stream))
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        let summary = output
            .stream_description_summary()
            .ok_or_else(|| StreamError::Other {
                op: OP,
                message: format!("no StreamDescriptionSummary in the answer for stream {stream}"),
            })?;
        // The status is what an admin call waits on; the name is the one asked for.
        if summary.stream_status().as_str().is_empty() {
            return Err(StreamError::IncompleteAnswer {
                op: OP,
                what: format!("stream {stream}"),
                missing: "StreamStatus",
            });
        }
        let count = |what: &str, value: i32| {
            u32::try_from(value).map_err(|_| StreamError::Other {
                op: OP,
                message: format!("stream {stream}: {what} {value} is negative"),
            })
        };
        Ok(StreamSummary {
            name: match summary.stream_name() {
                "" => stream.to_owned(),
                name => name.to_owned(),
            },
            arn: summary.stream_arn().to_owned(),
            status: summary.stream_status().as_str().to_owned(),
            open_shard_count: count("OpenShardCount", summary.open_shard_count())?,
            retention_hours: count("RetentionPeriodHours", summary.retention_period_hours())?,
            // Lenient: a server that leaves it out reads as the epoch (the SDK's default
            // for a missing required field), which names no real stream.
            created: SystemTime::try_from(*summary.stream_creation_timestamp())
                .ok()
                .filter(|at| *at > SystemTime::UNIX_EPOCH),
        })
    }

    /// Polls until the stream is ACTIVE and every shard in `closed` is closed.
    /// `NotFound` is waited out only right after a create (AWS may not list a stream
    /// it has just accepted).
    async fn wait_until_active(
        &self,
        op: &'static str,
        stream: &str,
        closed: &[&ShardId],
        tolerate_not_found: bool,
    ) -> Result<(), StreamError> {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let status = match self.summary(stream).await {
                Ok(summary) => summary.status,
                Err(StreamError::NotFound { .. }) if tolerate_not_found => "not found".to_owned(),
                Err(err) => return Err(err),
            };
            if status == StreamStatus::Active.as_str() {
                if closed.is_empty() {
                    return Ok(());
                }
                let shards = self.list(stream).await?;
                let is_closed = |id: &ShardId| shards.iter().any(|s| &s.id == id && !s.is_open());
                if closed.iter().all(|id| is_closed(id)) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(StreamError::Other {
                    op,
                    message: format!(
                        "stream {stream} not ACTIVE with {closed:?} closed after {WAIT_LIMIT:?} (status {status})"
                    ),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn create(&self, stream: &str, shards: u32) -> Result<(), StreamError> {
        const OP: &str = "CreateStream";
        self.client
            .create_stream()
            .stream_name(stream)
            .shard_count(i32::try_from(shards).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        self.wait_until_active(OP, stream, &[], true).await
    }

    async fn delete(&self, stream: &str) -> Result<(), StreamError> {
        self.client
            .delete_stream()
            .stream_name(stream)
            .enforce_consumer_deletion(true)
            .send()
            .await
            .map_err(|e| self.classify("DeleteStream", e))?;
        Ok(())
    }

    async fn put(
        &self,
        stream: &str,
        records: &[PutRecord],
    ) -> Result<Vec<PutResult>, StreamError> {
        let mut results = Vec::with_capacity(records.len());
        let mut start = 0;
        while start < records.len() {
            let end = chunk_end(records, start);
            results.extend(self.put_chunk(stream, &records[start..end], start).await?);
            start = end;
        }
        Ok(results)
    }

    /// One PutRecords call. `offset` is the chunk's index in the caller's records, for
    /// error messages. A refused entry fails the call; entries after it in the same
    /// chunk may have been written (PutRecords is not atomic), earlier chunks were.
    async fn put_chunk(
        &self,
        stream: &str,
        chunk: &[PutRecord],
        offset: usize,
    ) -> Result<Vec<PutResult>, StreamError> {
        const OP: &str = "PutRecords";
        let entries = chunk
            .iter()
            .map(|record| {
                PutRecordsRequestEntry::builder()
                    .data(Blob::new(record.data.to_vec()))
                    .partition_key(&record.partition_key)
                    .set_explicit_hash_key(record.explicit_hash_key.map(|k| k.to_string()))
                    .build()
                    .map_err(|e| StreamError::InvalidArgument {
                        op: OP,
                        message: format!(
                            "record with partition key {:?}: {e}",
                            record.partition_key
                        ),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .put_records()
            .set_stream_name(by_name(stream))
            .set_stream_arn(by_arn(stream))
            .set_records(Some(entries))
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        if output.records().len() != chunk.len() {
            return Err(StreamError::Other {
                op: OP,
                message: format!(
                    "stream {stream}: {} results for {} records",
                    output.records().len(),
                    chunk.len()
                ),
            });
        }
        let refused = output
            .records()
            .iter()
            .filter(|e| e.error_code().is_some())
            .count();
        let mut results = Vec::with_capacity(chunk.len());
        for (i, (record, entry)) in chunk.iter().zip(output.records()).enumerate() {
            let index = offset + i;
            if let Some(code) = entry.error_code() {
                let message = format!(
                    "stream {stream}: record {index} (partition key {:?}) refused with {code}: {} ({refused} of {} refused in this call)",
                    record.partition_key,
                    entry.error_message().unwrap_or("no message"),
                    chunk.len(),
                );
                return Err(
                    if code == KMS_THROTTLING || THROTTLING_CODES.contains(&code) {
                        StreamError::Throttled { op: OP, message }
                    } else if TRANSIENT_CODES.contains(&code) {
                        StreamError::Transient {
                            op: OP,
                            endpoint: self.endpoint.clone(),
                            message,
                        }
                    } else {
                        StreamError::Other { op: OP, message }
                    },
                );
            }
            let (Some(shard), Some(seq)) = (entry.shard_id(), entry.sequence_number()) else {
                return Err(StreamError::Other {
                    op: OP,
                    message: format!(
                        "stream {stream}: record {index} (partition key {:?}): no ShardId or SequenceNumber and no error code",
                        record.partition_key
                    ),
                });
            };
            results.push(PutResult {
                shard: ShardId::new(shard),
                sequence_number: parse_sequence(OP, format_args!("record {index}"), seq)?,
            });
        }
        Ok(results)
    }

    async fn split(
        &self,
        stream: &str,
        shard: &ShardId,
        new_starting_hash_key: u128,
    ) -> Result<(), StreamError> {
        const OP: &str = "SplitShard";
        self.client
            .split_shard()
            .stream_name(stream)
            .shard_to_split(shard.as_str())
            .new_starting_hash_key(new_starting_hash_key.to_string())
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        self.wait_until_active(OP, stream, &[shard], false).await
    }

    async fn merge(
        &self,
        stream: &str,
        shard: &ShardId,
        adjacent: &ShardId,
    ) -> Result<(), StreamError> {
        const OP: &str = "MergeShards";
        self.client
            .merge_shards()
            .stream_name(stream)
            .shard_to_merge(shard.as_str())
            .adjacent_shard_to_merge(adjacent.as_str())
            .send()
            .await
            .map_err(|e| self.classify(OP, e))?;
        self.wait_until_active(OP, stream, &[shard, adjacent], false)
            .await
    }
}

/// The end (exclusive) of the PutRecords call starting at `start`: at most
/// [`MAX_PUT_RECORDS`] records and [`MAX_PUT_BYTES`] bytes, and at least one record (an
/// oversized record goes alone, for the service to refuse by name).
/// A stream of the reading calls is a name or a Kinesis stream ARN (how `worker.streams`
/// names a stream of another account). An ARN goes in `StreamARN`, which routes the call
/// to the stream's account, and its name in `StreamName` too, as the Java KCL sends
/// them: servers that know only `StreamName` (ferrokinesis) still find the stream.
fn by_arn(stream: &str) -> Option<String> {
    StreamArn::is_kinesis_arn(stream).then(|| stream.to_owned())
}

fn by_name(stream: &str) -> Option<String> {
    match StreamArn::parse(stream) {
        Ok(arn) => Some(arn.name),
        Err(_) => Some(stream.to_owned()),
    }
}

fn chunk_end(records: &[PutRecord], start: usize) -> usize {
    let mut end = start;
    let mut bytes = 0;
    while end < records.len() && end - start < MAX_PUT_RECORDS {
        let size = records[end].data.len() + records[end].partition_key.len();
        if end > start && bytes + size > MAX_PUT_BYTES {
            break;
        }
        bytes += size;
        end += 1;
    }
    end
}

fn parse_range(
    op: &'static str,
    what: &str,
    range: Option<&aws_sdk_kinesis::types::HashKeyRange>,
) -> Result<HashKeyRange, StreamError> {
    let range = range.ok_or_else(|| StreamError::IncompleteAnswer {
        op,
        what: what.to_owned(),
        missing: "HashKeyRange",
    })?;
    HashKeyRange::parse(range.starting_hash_key(), range.ending_hash_key()).map_err(|e| {
        StreamError::Other {
            op,
            message: format!("{what}: malformed hash key range from the server: {e}"),
        }
    })
}

fn shard_from_sdk(shard: &aws_sdk_kinesis::types::Shard) -> Result<Shard, StreamError> {
    const OP: &str = "ListShards";
    let what = format!("shard {}", shard.shard_id());
    let sequences = shard
        .sequence_number_range()
        .ok_or_else(|| StreamError::IncompleteAnswer {
            op: OP,
            what: what.clone(),
            missing: "SequenceNumberRange",
        })?;
    Ok(Shard {
        id: ShardId::new(shard.shard_id()),
        parent: shard.parent_shard_id().map(ShardId::new),
        adjacent_parent: shard.adjacent_parent_shard_id().map(ShardId::new),
        hash_range: parse_range(OP, &what, shard.hash_key_range())?,
        sequence_range: SequenceRange {
            start: parse_sequence(OP, &what, sequences.starting_sequence_number())?,
            end: sequences
                .ending_sequence_number()
                .map(|end| parse_sequence(OP, &what, end))
                .transpose()?,
        },
    })
}

fn record_from_sdk(record: &aws_sdk_kinesis::types::Record) -> Result<Record, StreamError> {
    const OP: &str = "GetRecords";
    let seq = record.sequence_number();
    if seq.is_empty() {
        return Err(StreamError::IncompleteAnswer {
            op: OP,
            what: "a record".to_owned(),
            missing: "SequenceNumber",
        });
    }
    let what = format!("record {seq}");
    let approximate_arrival = record
        .approximate_arrival_timestamp()
        .map(|at| {
            SystemTime::try_from(*at)
                .map(nearest_millisecond)
                .map_err(|e| StreamError::Other {
                    op: OP,
                    message: format!("{what}: ApproximateArrivalTimestamp {at} out of range: {e}"),
                })
        })
        .transpose()?;
    Ok(Record {
        sequence_number: parse_sequence(OP, &what, seq)?,
        sub_sequence_number: 0,
        partition_key: record
            .partition_key()
            .ok_or_else(|| StreamError::IncompleteAnswer {
                op: OP,
                what: what.clone(),
                missing: "PartitionKey",
            })?
            .to_owned(),
        // GetRecords does not return the explicit hash key a producer gave.
        explicit_hash_key: None,
        data: Bytes::copy_from_slice(record.data().as_ref()),
        approximate_arrival,
    })
}

/// A record's arrival time to the millisecond, as Kinesis gives it. The SDK reads the
/// JSON answer's epoch seconds (`1795847954.925`) as a floating-point number, which
/// lands just below the millisecond (`.924999952`): truncated, as every conversion to
/// milliseconds does, it became the millisecond before, and a MultiLang child saw an
/// `approximateArrivalTimestamp` one less than the Java KCL's daemon sends it
/// (tests/kcl.rs, the conformance test, found it).
fn nearest_millisecond(at: SystemTime) -> SystemTime {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) => {
            let millis = (since.as_nanos() + 500_000) / 1_000_000;
            SystemTime::UNIX_EPOCH + Duration::from_millis(millis as u64)
        }
        Err(_) => at,
    }
}

/// What RegisterStreamConsumer's `Consumer`, ListStreamConsumers' `Consumer`s and
/// DescribeStreamConsumer's `ConsumerDescription` have in common.
trait SdkConsumer {
    fn parts(&self) -> (&str, &str, &str, &DateTime);
}

impl SdkConsumer for aws_sdk_kinesis::types::Consumer {
    fn parts(&self) -> (&str, &str, &str, &DateTime) {
        (
            self.consumer_name(),
            self.consumer_arn(),
            self.consumer_status().as_str(),
            self.consumer_creation_timestamp(),
        )
    }
}

impl SdkConsumer for aws_sdk_kinesis::types::ConsumerDescription {
    fn parts(&self) -> (&str, &str, &str, &DateTime) {
        (
            self.consumer_name(),
            self.consumer_arn(),
            self.consumer_status().as_str(),
            self.consumer_creation_timestamp(),
        )
    }
}

fn consumer_from_sdk(
    op: &'static str,
    consumer: &impl SdkConsumer,
) -> Result<Consumer, StreamError> {
    let (name, arn, status, created) = consumer.parts();
    if arn.is_empty() {
        return Err(StreamError::IncompleteAnswer {
            op,
            what: format!("consumer {name}"),
            missing: "ConsumerARN",
        });
    }
    Ok(Consumer {
        name: name.to_owned(),
        arn: arn.to_owned(),
        status: ConsumerStatus::parse(status),
        // Informational only: a missing or odd timestamp is not worth failing over.
        created: SystemTime::try_from(*created).ok(),
    })
}

/// A SubscribeToShard event stream, read one event at a time.
struct SdkSubscription {
    events: EventReceiver<SubscribeToShardEventStream, SubscribeToShardEventStreamError>,
    /// For its error mapping (and the endpoint its errors name).
    kinesis: KinesisStream,
}

impl SdkSubscription {
    async fn next(&mut self) -> Result<Option<ShardEvent>, StreamError> {
        const OP: &str = "SubscribeToShard";
        loop {
            let message = self.events.recv().await.map_err(|e| {
                let message = cause_chain(&e);
                // An exception event names its type by its variant; its metadata may
                // carry no code (kinesis-mock's do not).
                let code = match e.as_service_error() {
                    Some(SubscribeToShardEventStreamError::ResourceInUseException(_)) => {
                        Some("ResourceInUseException")
                    }
                    Some(SubscribeToShardEventStreamError::ResourceNotFoundException(_)) => {
                        Some("ResourceNotFoundException")
                    }
                    Some(SubscribeToShardEventStreamError::KmsThrottlingException(_)) => {
                        Some(KMS_THROTTLING)
                    }
                    Some(other) => other.code(),
                    None => None,
                };
                // No HTTP status to go by: a dropped connection, a reset stream or an
                // internal failure is transient (the reader subscribes again from where
                // it got to), unless the code says otherwise.
                let failure = match code {
                    Some(code) if THROTTLING_CODES.contains(&code) => Failure::Throttled,
                    Some(code) if DENIED_CODES.contains(&code) => Failure::Denied,
                    _ => Failure::Transient,
                };
                self.kinesis.sorted(OP, code, failure, message)
            })?;
            match message {
                None => return Ok(None),
                Some(SubscribeToShardEventStream::SubscribeToShardEvent(event)) => {
                    return event_from_sdk(&event).map(Some);
                }
                // An event type newer than this SDK: nothing in it is needed.
                Some(_) => continue,
            }
        }
    }
}

impl Subscription for SdkSubscription {
    fn next_event(&mut self) -> BoxFuture<'_, Result<Option<ShardEvent>, StreamError>> {
        Box::pin(self.next())
    }
}

fn event_from_sdk(
    event: &aws_sdk_kinesis::types::SubscribeToShardEvent,
) -> Result<ShardEvent, StreamError> {
    const OP: &str = "SubscribeToShard";
    let records = event
        .records()
        .iter()
        .map(record_from_sdk)
        .collect::<Result<Vec<_>, _>>()?;
    // Required by the model, so the SDK fills in "" and 0 when a server leaves them out:
    // an empty continuation is none, and a lag of 0 is what it says.
    let continuation = match event.continuation_sequence_number() {
        "" => None,
        text => Some(parse_sequence(OP, "ContinuationSequenceNumber", text)?),
    };
    let millis_behind_latest = u64::try_from(event.millis_behind_latest()).ok();
    let child_shards = event
        .child_shards()
        .iter()
        .map(child_from_sdk)
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default();
    Ok(ShardEvent {
        records,
        continuation,
        millis_behind_latest,
        child_shards,
    })
}

/// A reported child, or `None` if its hash range is missing or unreadable.
fn child_from_sdk(child: &aws_sdk_kinesis::types::ChildShard) -> Option<ChildShard> {
    let range = child.hash_key_range()?;
    Some(ChildShard {
        id: ShardId::new(child.shard_id()),
        parents: child
            .parent_shards()
            .iter()
            .map(|p| ShardId::new(p.as_str()))
            .collect(),
        hash_range: HashKeyRange::parse(range.starting_hash_key(), range.ending_hash_key()).ok()?,
    })
}

impl StreamClient for KinesisStream {
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        Box::pin(self.list(stream))
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

    fn register_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        Box::pin(self.register_consumer(stream_arn, name))
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        Box::pin(self.describe_consumer(stream_arn, name))
    }

    fn list_stream_consumers<'a>(
        &'a self,
        stream_arn: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Consumer>, StreamError>> {
        Box::pin(self.list_consumers(stream_arn))
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        consumer_arn: &'a str,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.deregister_consumer(consumer_arn))
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        consumer_arn: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<Box<dyn Subscription>, StreamError>> {
        Box::pin(self.subscribe(consumer_arn, shard, position))
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }
}

impl StreamAdmin for KinesisStream {
    fn create_stream<'a>(
        &'a self,
        stream: &'a str,
        shards: u32,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.create(stream, shards))
    }

    fn delete_stream<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.delete(stream))
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: &'a [PutRecord],
    ) -> BoxFuture<'a, Result<Vec<PutResult>, StreamError>> {
        Box::pin(self.put(stream, records))
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        new_starting_hash_key: u128,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.split(stream, shard, new_starting_hash_key))
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        adjacent: &'a ShardId,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.merge(stream, shard, adjacent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arrival_time_read_as_a_float_is_its_millisecond() {
        let table = [
            (1_795_847_954.925, 1_795_847_954_925u128),
            (1_700_000_000.001, 1_700_000_000_001),
            (1_700_000_000.0, 1_700_000_000_000),
            (1_700_000_000.999_5, 1_700_000_001_000),
        ];
        for (secs, millis) in table {
            let read =
                SystemTime::try_from(aws_sdk_kinesis::primitives::DateTime::from_secs_f64(secs))
                    .unwrap();
            let got = nearest_millisecond(read)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            assert_eq!(got, millis, "{secs}");
        }
    }

    fn record(bytes: usize) -> PutRecord {
        PutRecord {
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: Bytes::from(vec![0u8; bytes]),
        }
    }

    #[test]
    fn put_chunks_hold_at_most_500_records_and_5_mib() {
        let small: Vec<_> = (0..1201).map(|_| record(1)).collect();
        assert_eq!(chunk_end(&small, 0), 500);
        assert_eq!(chunk_end(&small, 1000), 1201);
        let big: Vec<_> = (0..6).map(|_| record(1024 * 1024)).collect();
        assert_eq!(
            chunk_end(&big, 0),
            4,
            "4 MiB + 4 keys fit, a fifth MiB does not"
        );
        let huge = vec![record(6 * 1024 * 1024), record(1)];
        assert_eq!(
            chunk_end(&huge, 0),
            1,
            "an oversized record still goes, alone"
        );
    }
}
