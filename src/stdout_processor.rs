//! The built-in `stdout` processor of `flotilla run`: one JSON object per record on
//! stdout, so a worker can feed a shell pipeline (`flotilla run ... | jq ...`).
//!
//! Each line holds `stream` (the stream's name: a shard id repeats across the streams of
//! `worker.streams`; a table's stream, which has no name of its own, by its ARN),
//! `stream_arn` (when the worker's description of the stream gave one), `shard_id`,
//! `sequence_number` (a string: Kinesis sequence numbers do not fit a JSON number),
//! `sub_sequence_number`, `partition_key`, `approximate_arrival` (RFC 3339 with
//! milliseconds, or null) and `data`: the payload as text when it is
//! UTF-8, else base64 with `"data_encoding":"base64"` beside it. When the source is a
//! DynamoDB table's stream, `change` replaces `data`: the change record as a JSON
//! object (eventName, dynamodb.Keys/NewImage/OldImage, ...), so `jq .change.dynamodb`
//! reads it without decoding a string.

use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flotilla_actors::model::{ShardId, StreamArn};
use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError, Record, ShardInfo};
use serde::Serialize;

/// Writes each batch to stdout, whole, and flushes before the batch is acked: a record
/// is checkpointed only once its line has left the process.
#[derive(Debug)]
pub struct StdoutProcessor {
    stream: Stream,
    shard: ShardId,
    /// The source is a table's stream: each record's data is a change, as JSON.
    changes: bool,
}

/// The stream as each line names it.
#[derive(Debug)]
struct Stream {
    name: String,
    arn: Option<String>,
}

impl Stream {
    /// The name of the stream `shard` is of: a Kinesis stream named by its ARN (an entry
    /// of `worker.streams`) by the name in it; a table's stream by its ARN, its only
    /// name.
    fn of(shard: &ShardInfo) -> Self {
        let name = match StreamArn::parse(&shard.stream) {
            Ok(arn) => arn.name,
            Err(_) => shard.stream.clone(),
        };
        let arn = shard.stream_arn.clone().or_else(|| {
            (StreamArn::is_kinesis_arn(&shard.stream) || shard.stream.starts_with("arn:"))
                .then(|| shard.stream.clone())
        });
        Self { name, arn }
    }
}

impl StdoutProcessor {
    pub fn new(shard: &ShardInfo, changes: bool) -> Self {
        Self {
            stream: Stream::of(shard),
            shard: shard.shard_id.clone(),
            changes,
        }
    }
}

impl Processor for StdoutProcessor {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        // The lock is held for the whole batch, so lines of two shards never interleave
        // mid-line; the buffer makes it one write per batch rather than one per record.
        let stdout = std::io::stdout().lock();
        let mut out = std::io::BufWriter::new(stdout);
        for record in batch.records() {
            serde_json::to_writer(
                &mut out,
                &RecordLine::new(&self.stream, &self.shard, record, self.changes),
            )?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }
}

/// One output line. Field order is the order written.
#[derive(Debug, Serialize)]
struct RecordLine<'a> {
    stream: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_arn: Option<&'a str>,
    shard_id: &'a str,
    sequence_number: &'a str,
    sub_sequence_number: u64,
    partition_key: &'a str,
    approximate_arrival: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    change: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<std::borrow::Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_encoding: Option<&'static str>,
}

impl<'a> RecordLine<'a> {
    /// With `changes`, data that is JSON is written as `change`, an object; anything
    /// else (never the case on a table's stream) as `data`, so nothing is lost.
    fn new(stream: &'a Stream, shard: &'a ShardId, record: &'a Record, changes: bool) -> Self {
        let change = changes
            .then(|| serde_json::from_slice::<serde_json::Value>(&record.data).ok())
            .flatten();
        let (data, data_encoding) = match (&change, std::str::from_utf8(&record.data)) {
            (Some(_), _) => (None, None),
            (None, Ok(text)) => (Some(text.into()), None),
            (None, Err(_)) => (Some(STANDARD.encode(&record.data).into()), Some("base64")),
        };
        Self {
            stream: &stream.name,
            stream_arn: stream.arn.as_deref(),
            shard_id: shard.as_str(),
            sequence_number: record.sequence_number.as_str(),
            sub_sequence_number: record.sub_sequence_number,
            partition_key: &record.partition_key,
            approximate_arrival: record
                .approximate_arrival
                .map(|at| humantime::format_rfc3339_millis(at).to_string()),
            change,
            data,
            data_encoding,
        }
    }
}

/// The line for one record of stream `orders` (ARN unknown), without the newline.
#[cfg(test)]
fn line(shard: &ShardId, record: &Record) -> String {
    let stream = Stream {
        name: "orders".to_owned(),
        arn: None,
    };
    serde_json::to_string(&RecordLine::new(&stream, shard, record, false)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use flotilla_actors::model::SequenceNumber;

    use super::*;

    fn record(data: &'static [u8], arrival: Option<SystemTime>) -> Record {
        Record {
            sequence_number: SequenceNumber::parse(
                "49590338271490256608559692538361571095921575989136588898",
            )
            .unwrap(),
            sub_sequence_number: 3,
            partition_key: "customer-7".to_owned(),
            explicit_hash_key: None,
            data: Bytes::from_static(data),
            approximate_arrival: arrival,
        }
    }

    fn shard() -> ShardId {
        ShardId::from_index(4)
    }

    const TABLE_STREAM: &str =
        "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2024-05-01T00:00:00.000";

    fn info(stream: &str, arn: Option<&str>) -> ShardInfo {
        ShardInfo {
            shard_id: shard(),
            stream: stream.to_owned(),
            stream_arn: arn.map(str::to_owned),
            parents: Vec::new(),
            hash_range: None,
            starting_at: flotilla_actors::model::Checkpoint::TrimHorizon,
            pending_checkpoint: None,
            pending_checkpoint_state: None,
        }
    }

    /// Every line names its stream: by its name (a shard id repeats across streams),
    /// with its ARN where the worker's description gave one; an entry given by ARN by
    /// the name in it; a table's stream, which has no name, by its ARN.
    #[test]
    fn each_line_names_its_stream_and_its_arn_where_known() {
        let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";
        let fields = |stream: Stream| {
            let text = serde_json::to_string(&RecordLine::new(
                &stream,
                &shard(),
                &record(b"x", None),
                false,
            ))
            .unwrap();
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            (value["stream"].clone(), value.get("stream_arn").cloned())
        };
        assert_eq!(
            fields(Stream::of(&info("orders", Some(arn)))),
            (serde_json::json!("orders"), Some(serde_json::json!(arn)))
        );
        assert_eq!(
            fields(Stream::of(&info("orders", None))),
            (serde_json::json!("orders"), None)
        );
        assert_eq!(
            fields(Stream::of(&info(arn, None))),
            (serde_json::json!("orders"), Some(serde_json::json!(arn)))
        );
        assert_eq!(
            fields(Stream::of(&info(TABLE_STREAM, Some(TABLE_STREAM)))),
            (
                serde_json::json!(TABLE_STREAM),
                Some(serde_json::json!(TABLE_STREAM))
            )
        );
    }

    #[test]
    fn utf8_data_is_written_as_text_in_a_fixed_field_order() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_714_521_600_123);
        let text = line(&shard(), &record("héllo \"world\"".as_bytes(), Some(at)));
        assert_eq!(
            text,
            r#"{"stream":"orders","shard_id":"shardId-000000000004","sequence_number":"49590338271490256608559692538361571095921575989136588898","sub_sequence_number":3,"partition_key":"customer-7","approximate_arrival":"2024-05-01T00:00:00.123Z","data":"héllo \"world\""}"#
        );
    }

    #[test]
    fn non_utf8_data_is_base64_and_says_so() {
        let text = line(&shard(), &record(&[0xff, 0x00, 0xfe, b'a'], None));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["data"], "/wD+YQ==");
        assert_eq!(value["data_encoding"], "base64");
        assert_eq!(
            STANDARD.decode(value["data"].as_str().unwrap()).unwrap(),
            [0xff, 0x00, 0xfe, b'a']
        );
    }

    #[test]
    fn a_change_of_a_table_stream_is_written_as_an_object() {
        let change = br#"{"eventID":"1","eventName":"INSERT","dynamodb":{"Keys":{"pk":{"S":"a"}},"SequenceNumber":"7"}}"#;
        let stream = Stream::of(&info(TABLE_STREAM, None));
        let text = serde_json::to_string(&RecordLine::new(
            &stream,
            &shard(),
            &record(change, None),
            true,
        ))
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["change"]["dynamodb"]["Keys"]["pk"]["S"], "a");
        assert_eq!(value["change"]["eventName"], "INSERT");
        assert!(value.get("data").is_none(), "{text}");
        // Not JSON: kept as data, never dropped.
        let text = serde_json::to_string(&RecordLine::new(
            &stream,
            &shard(),
            &record(b"x", None),
            true,
        ))
        .unwrap();
        assert!(text.contains(r#""data":"x""#), "{text}");
    }

    #[test]
    fn a_missing_arrival_is_null_and_empty_data_is_text() {
        let text = line(&shard(), &record(b"", None));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["approximate_arrival"], serde_json::Value::Null);
        assert_eq!(value["data"], "");
        assert!(value.get("data_encoding").is_none(), "{text}");
        assert!(!text.contains('\n'));
    }
}
