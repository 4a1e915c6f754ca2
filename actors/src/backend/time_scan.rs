//! AT_TIMESTAMP for a source that has no such iterator: DynamoDB Streams.
//!
//! Kinesis starts a shard at a time by itself; DynamoDB Streams only at TRIM_HORIZON,
//! LATEST or a sequence number. The coordinators flotilla replaces can still move a
//! whole table stream to a time, so [`TimeScan`] does it the only way there is: it
//! reads the shard from TRIM_HORIZON and starts at its first record created at or
//! after the time. A shard that ended before the time starts at its end, so its reader
//! finds SHARD_END at once and hands over to the children, which are scanned the same
//! way. The cost is a read of everything the shard retains before the time (up to 24
//! hours of changes): it is paid once per shard, when a worker starts one at a time
//! (`initial_position = AT_TIMESTAMP`, or after `flotilla rewind --to TIME`).
//!
//! Nothing is skipped: a record whose creation time is unknown counts as at or after,
//! and DynamoDB rounds creation times down to the second, so the time is too.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;

use crate::backend::{
    Capabilities, Consumer, IteratorPosition, Record, RecordBatch, ShardIterator, StreamClient,
    StreamError, StreamSummary, Subscription,
};
use crate::backoff::Backoff;
use crate::model::{SequenceNumber, Shard, ShardId};

/// GetRecords' largest batch on DynamoDB Streams.
const SCAN_BATCH: u32 = 1000;
/// An open shard answering empty this many times in a row has nothing more yet: the
/// scan starts after its last record (what comes next is at or after the time).
const EMPTY_ANSWERS_AT_TIP: u32 = 3;
/// Failed calls a scan rides out (throttles, brief outages) before it gives up; the
/// reader then retries the whole acquisition as it does any retryable failure.
const SCAN_ATTEMPTS: u32 = 8;

/// A [`StreamClient`] that answers `AtTimestamp` by scanning; every other call goes
/// to the inner client unchanged.
pub struct TimeScan {
    inner: Arc<dyn StreamClient>,
}

impl std::fmt::Debug for TimeScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TimeScan")
    }
}

impl TimeScan {
    /// Wraps `inner` (a DynamoDB Streams client), adding AT_TIMESTAMP by scanning.
    pub fn new(inner: Arc<dyn StreamClient>) -> Self {
        Self { inner }
    }

    /// Where a shard starts for `at`: the iterator of its first record at or after it.
    async fn scan(
        &self,
        stream: &str,
        shard: &ShardId,
        at: SystemTime,
    ) -> Result<ShardIterator, StreamError> {
        let at = whole_seconds(at);
        let mut last: Option<SequenceNumber> = None;
        let mut iterator = self.start(stream, shard, last.as_ref()).await?;
        let mut empty = 0;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let batch = match self.inner.get_records(&iterator, SCAN_BATCH).await {
                Ok(batch) => batch,
                Err(StreamError::IteratorExpired { .. }) => {
                    iterator = self.start(stream, shard, last.as_ref()).await?;
                    continue;
                }
                Err(error) if error.is_retryable() && backoff.attempts() < SCAN_ATTEMPTS => {
                    tokio::time::sleep(backoff.next_random()).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            backoff.reset();
            match scan_step(&batch, at, &mut empty) {
                Step::StartAt(sequence) => {
                    let position = IteratorPosition::AtSequence(sequence);
                    return self
                        .inner
                        .get_shard_iterator(stream, shard, &position)
                        .await;
                }
                Step::StartAfterLast => {
                    if let Some(record) = batch.records.last() {
                        last = Some(record.sequence_number.clone());
                    }
                    return self.start(stream, shard, last.as_ref()).await;
                }
                Step::ReadOn => {
                    if let Some(record) = batch.records.last() {
                        last = Some(record.sequence_number.clone());
                    }
                    if let Some(next) = batch.next_iterator {
                        iterator = next;
                    }
                }
            }
        }
    }

    /// An iterator after `last`, or at TRIM_HORIZON before any record was seen.
    async fn start(
        &self,
        stream: &str,
        shard: &ShardId,
        last: Option<&SequenceNumber>,
    ) -> Result<ShardIterator, StreamError> {
        let position = match last {
            Some(sequence) => IteratorPosition::AfterSequence(sequence.clone()),
            None => IteratorPosition::TrimHorizon,
        };
        self.inner
            .get_shard_iterator(stream, shard, &position)
            .await
    }
}

/// What a scan does after one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Start at this record: the first at or after the time.
    StartAt(SequenceNumber),
    /// Start after the last record read: the shard ended before the time, or an open
    /// shard has nothing at or after it yet.
    StartAfterLast,
    /// Read the next batch.
    ReadOn,
}

/// The scan's one decision, pure: where in `batch` the shard starts for a time of `at`
/// (whole seconds), given how many empty answers came in a row before it.
fn scan_step(batch: &RecordBatch, at: SystemTime, empty_in_row: &mut u32) -> Step {
    if let Some(record) = batch.records.iter().find(|r| at_or_after(r, at)) {
        return Step::StartAt(record.sequence_number.clone());
    }
    if batch.next_iterator.is_none() {
        return Step::StartAfterLast;
    }
    if batch.records.is_empty() {
        *empty_in_row += 1;
        if *empty_in_row >= EMPTY_ANSWERS_AT_TIP {
            return Step::StartAfterLast;
        }
    } else {
        *empty_in_row = 0;
    }
    Step::ReadOn
}

/// A record of unknown creation time counts as at or after: delivered, never skipped.
fn at_or_after(record: &Record, at: SystemTime) -> bool {
    record.approximate_arrival.is_none_or(|t| t >= at)
}

/// DynamoDB rounds creation times down to the second; so is the time compared with
/// them, or a change made in the same second before `at` would be skipped.
fn whole_seconds(at: SystemTime) -> SystemTime {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) => SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs()),
        Err(_) => at,
    }
}

impl StreamClient for TimeScan {
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        self.inner.list_shards(stream)
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>> {
        match position {
            IteratorPosition::AtTimestamp(at) => Box::pin(self.scan(stream, shard, *at)),
            other => self.inner.get_shard_iterator(stream, shard, other),
        }
    }

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>> {
        self.inner.get_records(iterator, limit)
    }

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>> {
        self.inner.describe_stream_summary(stream)
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        self.inner.register_stream_consumer(stream_arn, name)
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Consumer, StreamError>> {
        self.inner.describe_stream_consumer(stream_arn, name)
    }

    fn list_stream_consumers<'a>(
        &'a self,
        stream_arn: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Consumer>, StreamError>> {
        self.inner.list_stream_consumers(stream_arn)
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        consumer_arn: &'a str,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        self.inner.deregister_stream_consumer(consumer_arn)
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        consumer_arn: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<Box<dyn Subscription>, StreamError>> {
        self.inner.subscribe_to_shard(consumer_arn, shard, position)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(n)
    }

    fn record(seq: u64, created: Option<u64>) -> Record {
        Record {
            sequence_number: SequenceNumber::from_u128(u128::from(seq)),
            sub_sequence_number: 0,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::new(),
            approximate_arrival: created.map(secs),
        }
    }

    fn batch(records: Vec<Record>, open: bool) -> RecordBatch {
        RecordBatch {
            records,
            next_iterator: open.then(|| ShardIterator("next".into())),
            ..RecordBatch::default()
        }
    }

    #[test]
    fn where_a_scan_starts_after_each_batch() {
        let seq = |n: u128| SequenceNumber::from_u128(n);
        // (batch, empty answers before it, time) → step
        let cases = [
            // The first record at or after the time, within the batch.
            (
                batch(
                    vec![record(1, Some(9)), record(2, Some(10)), record(3, Some(11))],
                    true,
                ),
                0,
                10,
                Step::StartAt(seq(2)),
            ),
            // Everything before the time: read on.
            (batch(vec![record(1, Some(9))], true), 0, 10, Step::ReadOn),
            // A closed shard that ended before the time: start at its end.
            (
                batch(vec![record(1, Some(9))], false),
                0,
                10,
                Step::StartAfterLast,
            ),
            (batch(vec![], false), 0, 10, Step::StartAfterLast),
            // An unknown creation time is delivered, not skipped.
            (
                batch(vec![record(1, None)], true),
                0,
                10,
                Step::StartAt(seq(1)),
            ),
            // Empty answers of an open shard: read on, until it is plainly at its tip.
            (batch(vec![], true), 0, 10, Step::ReadOn),
            (
                batch(vec![], true),
                EMPTY_ANSWERS_AT_TIP - 1,
                10,
                Step::StartAfterLast,
            ),
        ];
        for (i, (batch, empty, at, want)) in cases.into_iter().enumerate() {
            let mut empty_in_row = empty;
            assert_eq!(
                scan_step(&batch, secs(at), &mut empty_in_row),
                want,
                "case {i}"
            );
        }
    }

    #[test]
    fn records_reset_the_empty_count() {
        let mut empty = EMPTY_ANSWERS_AT_TIP - 1;
        scan_step(&batch(vec![record(1, Some(1))], true), secs(10), &mut empty);
        assert_eq!(empty, 0);
    }

    #[test]
    fn the_time_is_rounded_down_like_dynamodb_creation_times() {
        let at = secs(10) + Duration::from_millis(900);
        assert_eq!(whole_seconds(at), secs(10));
        // A change made at 10.2 s shows as 10 s: it is at or after 10.9 s's second.
        assert!(at_or_after(&record(1, Some(10)), whole_seconds(at)));
    }
}
