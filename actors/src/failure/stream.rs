//! `failure.destination = "kinesis:STREAM"`: discarded records put to another Kinesis
//! stream, each [`Envelope`] as one record under the record's own partition key, so that
//! the dead letters of one key stay in order there as they were in the source.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::destination::{DeadLetters, DestinationError, Envelope};
use crate::backend::{PutRecord, StreamAdmin};
use crate::settings::Destination;

/// The IAM actions a worker writing to a dead-letter stream makes, on that stream: the
/// one [`StreamAdmin`] call here (the Kinesis adapter declares it too). `tests/deploy.rs`
/// keeps this equal to the calls in this file and the policies in `deploy/` to it.
pub const IAM_ACTIONS: &[&str] = &["kinesis:PutRecords"];

/// The most a Kinesis record holds, data and partition key together.
const MAX_RECORD_BYTES: usize = 1024 * 1024;

/// The longest partition key Kinesis takes, in characters.
const MAX_KEY_CHARS: usize = 256;

/// Puts envelopes to a Kinesis stream (a name or an ARN) with PutRecords.
pub struct StreamDeadLetters {
    streams: Arc<dyn StreamAdmin>,
    stream: String,
}

impl std::fmt::Debug for StreamDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDeadLetters")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl StreamDeadLetters {
    /// A destination putting to `stream` with `streams` (a [`crate::backend::aws::KinesisStream`],
    /// or the memory backend's streams). The stream must exist: it is not created here,
    /// since its shards and retention are the operator's to choose.
    pub fn new(streams: Arc<dyn StreamAdmin>, stream: impl Into<String>) -> Self {
        Self {
            streams,
            stream: stream.into(),
        }
    }

    fn error(&self, why: String) -> DestinationError {
        DestinationError {
            destination: self.name(),
            why,
        }
    }

    fn record(&self, envelope: &Envelope) -> Result<PutRecord, DestinationError> {
        let what = || {
            format!(
                "the envelope of {} {} record {}",
                envelope.stream, envelope.shard, envelope.sequence_number
            )
        };
        let data = serde_json::to_vec(envelope)
            .map_err(|e| self.error(format!("cannot encode {}: {e}", what())))?;
        let partition_key = partition_key(envelope);
        let size = data.len() + partition_key.len();
        if size > MAX_RECORD_BYTES {
            return Err(self.error(format!(
                "{} is {size} bytes with its partition key, more than a Kinesis record holds \
                 ({MAX_RECORD_BYTES}); it cannot be discarded to a stream: use a file: \
                 destination for records this large",
                what()
            )));
        }
        Ok(PutRecord {
            partition_key,
            explicit_hash_key: None,
            data: Bytes::from(data),
        })
    }
}

/// The key an envelope is put under: the record's own, so one key's dead letters share
/// a shard and keep their order. A key Kinesis would refuse (a DynamoDB table's stream
/// names items by keys of any length) is cut to its first 256 characters, which keeps
/// one key on one shard; an empty one becomes the shard's id, which keeps the shard's
/// order. The envelope still carries the key as it was.
fn partition_key(envelope: &Envelope) -> String {
    let key = &envelope.partition_key;
    if key.is_empty() {
        return envelope.shard.clone();
    }
    match key.char_indices().nth(MAX_KEY_CHARS) {
        Some((cut, _)) => key[..cut].to_owned(),
        None => key.clone(),
    }
}

impl DeadLetters for StreamDeadLetters {
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>> {
        Box::pin(async move {
            if envelopes.is_empty() {
                return Ok(());
            }
            let records = envelopes
                .iter()
                .map(|envelope| self.record(envelope))
                .collect::<Result<Vec<_>, _>>()?;
            // put_records keeps the order, and fails on any record the stream refuses.
            let put = self
                .streams
                .put_records(&self.stream, &records)
                .await
                .map_err(|e| self.error(e.to_string()))?;
            if put.len() != records.len() {
                return Err(self.error(format!(
                    "{} records put, {} answered",
                    records.len(),
                    put.len()
                )));
            }
            Ok(())
        })
    }

    fn name(&self) -> String {
        Destination::Kinesis(self.stream.clone()).to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::backend::memory::{MemoryStreams, MemoryStreamsConfig};
    use crate::failure::file::tests::envelope;

    #[test]
    fn an_envelope_goes_under_its_own_key_or_one_kinesis_takes() {
        let mut sample = envelope(1, "");
        assert_eq!(partition_key(&sample), "customer-1");
        sample.partition_key = "é".repeat(300);
        let cut = partition_key(&sample);
        assert_eq!(cut, "é".repeat(256));
        sample.partition_key = "k".repeat(256);
        assert_eq!(partition_key(&sample), "k".repeat(256));
        sample.partition_key.clear();
        assert_eq!(partition_key(&sample), "shardId-000000000001");
    }

    #[tokio::test(start_paused = true)]
    async fn an_envelope_too_large_for_a_record_is_refused_before_any_call() {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream("dead", 1).await.unwrap();
        let dead = StreamDeadLetters::new(Arc::new(streams), "dead");
        assert_eq!(dead.name(), "kinesis:dead");
        // 800,000 bytes of data are 1,066,668 of base64: the envelope exceeds 1 MiB.
        let data = base64_of(800_000);
        let error = dead.write(&[envelope(1, &data)]).await.unwrap_err();
        assert_eq!(error.destination, "kinesis:dead");
        assert!(
            error.why.contains("more than a Kinesis record holds"),
            "{error}"
        );
        let fits = base64_of(700_000);
        dead.write(&[envelope(1, &fits)]).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_stream_is_an_error_naming_the_destination() {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        let dead = StreamDeadLetters::new(Arc::new(streams), "nowhere");
        let error = dead.write(&[envelope(1, "")]).await.unwrap_err();
        assert!(
            error.to_string().starts_with("kinesis:nowhere: "),
            "{error}"
        );
    }

    fn base64_of(bytes: usize) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(vec![7u8; bytes])
    }
}
