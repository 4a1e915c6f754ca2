//! The MultiLangDaemon protocol (unchanged since KCL 2.1.0): one JSON object per line
//! on the child's stdin (from flotilla) and stdout (from the child). Pure: values in,
//! lines out, and lines in, values out.
//!
//! Written as the Java daemon writes it: every field present, `null` when empty (the
//! Python client fails on a missing key), no blank lines (it fails on those too), each
//! record with `"action":"record"`. Read more leniently than the daemon reads: blank
//! lines are skipped (both clients write one before each message), unknown fields are
//! ignored, numbers may be strings and the reverse.
//!
//! To the child: `initialize`, `processRecords`, `leaseLost`, `shardEnded`,
//! `shutdownRequested`, and the answer to each of its `checkpoint` requests. From the
//! child: `checkpoint` (a sequence number, or none for "the last record delivered"),
//! and `status` with `responseFor` naming the action it finished.

use std::time::SystemTime;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::Record;
use crate::model::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};

/// What flotilla sends a child.
#[derive(Debug, Clone, PartialEq)]
pub enum ToChild<'a> {
    /// Sent first, once the child is started: the shard it processes and where it starts.
    Initialize {
        /// The shard's id (`shardId-000000000001`).
        shard_id: &'a str,
        /// Where the shard starts: a sequence number, or a sentinel (`TRIM_HORIZON`,
        /// `LATEST`, `AT_TIMESTAMP`).
        starting_at: &'a Checkpoint,
    },
    /// A batch of records (data base64-encoded); the child may checkpoint before its `status`.
    ProcessRecords {
        /// The batch's records, each sent with `"action":"record"`.
        records: &'a [Record],
        /// How far the batch is behind the shard's tip, in milliseconds (Kinesis's
        /// `MillisBehindLatest`); `None`: not known.
        millis_behind_latest: Option<u64>,
        /// When flotilla received the batch: the arrival time of a record whose server
        /// did not say (Kinesis always does; emulators and stripped answers may not).
        /// The Python client cannot take a null there.
        received_at: SystemTime,
    },
    /// The lease is gone (taken, or handed over after `shutdownRequested`): no checkpoint now.
    LeaseLost,
    /// The shard's last record was processed: the child must checkpoint at SHARD_END.
    ShardEnded,
    /// The worker is stopping gracefully: the child may checkpoint; `leaseLost` follows.
    ShutdownRequested,
    /// The answer to a `checkpoint` request: the request's own position, echoed as the
    /// daemon echoes it, and the KCL's name of the error, if any.
    Checkpoint {
        /// The request answered, whose position is echoed.
        request: &'a CheckpointRequest,
        /// Why the checkpoint was refused; `None`: it was written.
        error: Option<CheckpointRefusal>,
    },
}

/// The KCL's names for why a checkpoint was refused, which the client libraries pass to
/// the record processor as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointRefusal {
    /// A malformed sequence number, one past the last record delivered, or one before
    /// the last checkpoint.
    IllegalArgument,
    /// The lease is gone (another worker has it, or the shard is stopping).
    Shutdown,
    /// The lease table could not be written now.
    Throttling,
    /// The lease table failed.
    Dependency,
    /// No checkpoint is possible now: during `initialize` and `leaseLost`.
    InvalidState,
}

impl CheckpointRefusal {
    /// The Java exception's simple name, as the `error` field of the checkpoint answer carries it.
    pub const fn kcl_name(self) -> &'static str {
        match self {
            CheckpointRefusal::IllegalArgument => "IllegalArgumentException",
            CheckpointRefusal::Shutdown => "ShutdownException",
            CheckpointRefusal::Throttling => "ThrottlingException",
            CheckpointRefusal::Dependency => "KinesisClientLibDependencyException",
            CheckpointRefusal::InvalidState => "InvalidStateException",
        }
    }
}

impl ToChild<'_> {
    /// The action's name, which the child's `status` answer names in `responseFor`.
    pub const fn action(&self) -> &'static str {
        match self {
            ToChild::Initialize { .. } => "initialize",
            ToChild::ProcessRecords { .. } => "processRecords",
            ToChild::LeaseLost => "leaseLost",
            ToChild::ShardEnded => "shardEnded",
            ToChild::ShutdownRequested => "shutdownRequested",
            ToChild::Checkpoint { .. } => "checkpoint",
        }
    }

    /// The message as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut out = match self {
            ToChild::Initialize {
                shard_id,
                starting_at,
            } => {
                let (sequence, sub) = match starting_at {
                    Checkpoint::At(at) => (at.sequence.to_string(), at.sub_sequence),
                    other => (other.to_string(), 0),
                };
                serde_json::to_string(&InitializeOut {
                    action: "initialize",
                    shard_id,
                    sequence_number: sequence,
                    sub_sequence_number: sub,
                })
            }
            ToChild::ProcessRecords {
                records,
                millis_behind_latest,
                received_at,
            } => serde_json::to_string(&ProcessRecordsOut {
                action: "processRecords",
                records: records
                    .iter()
                    .map(|r| RecordOut::new(r, *received_at))
                    .collect(),
                millis_behind_latest: *millis_behind_latest,
            }),
            ToChild::LeaseLost | ToChild::ShardEnded | ToChild::ShutdownRequested => {
                serde_json::to_string(&ActionOnly {
                    action: self.action(),
                })
            }
            ToChild::Checkpoint { request, error } => serde_json::to_string(&CheckpointOut {
                action: "checkpoint",
                sequence_number: request.sequence.as_deref(),
                sub_sequence_number: request.sub_sequence.clone(),
                error: error.map(CheckpointRefusal::kcl_name),
            }),
        }
        // Serialising these plain structs cannot fail; an empty object would be
        // refused by the child, which is the visible failure if it ever did.
        .unwrap_or_else(|_| "{}".to_owned());
        out.push('\n');
        out
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitializeOut<'a> {
    action: &'static str,
    shard_id: &'a str,
    sequence_number: String,
    sub_sequence_number: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProcessRecordsOut<'a> {
    action: &'static str,
    records: Vec<RecordOut<'a>>,
    millis_behind_latest: Option<u64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordOut<'a> {
    action: &'static str,
    data: String,
    partition_key: &'a str,
    sequence_number: String,
    sub_sequence_number: u64,
    approximate_arrival_timestamp: u64,
}

impl<'a> RecordOut<'a> {
    fn new(record: &'a Record, received_at: SystemTime) -> Self {
        RecordOut {
            action: "record",
            data: base64::engine::general_purpose::STANDARD.encode(&record.data),
            partition_key: &record.partition_key,
            sequence_number: record.sequence_number.to_string(),
            sub_sequence_number: record.sub_sequence_number,
            approximate_arrival_timestamp: record
                .approximate_arrival
                .unwrap_or(received_at)
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }
}

#[derive(Serialize)]
struct ActionOnly {
    action: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointOut<'a> {
    action: &'static str,
    sequence_number: Option<&'a str>,
    sub_sequence_number: Option<Value>,
    error: Option<&'static str>,
}

/// What a child sends.
#[derive(Debug, Clone, PartialEq)]
pub enum FromChild {
    /// It finished the action named.
    Status {
        /// The action finished (`responseFor`): must be the one flotilla last sent.
        response_for: String,
    },
    /// It asks for a checkpoint; flotilla answers with a `checkpoint` message before it goes on.
    Checkpoint(CheckpointRequest),
}

/// A child's checkpoint request, as it wrote it (the answer echoes it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointRequest {
    /// `None`: at the last record delivered (during `shardEnded`: SHARD_END).
    pub sequence: Option<String>,
    /// The `subSequenceNumber` as written (number or string); `None`: absent or null, i.e. 0.
    pub sub_sequence: Option<Value>,
}

/// A checkpoint request whose sequence or sub-sequence number is not one (the KCL
/// answers `IllegalArgumentException`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a checkpoint position: sequenceNumber {sequence:?}, subSequenceNumber {sub_sequence}")]
pub struct NotAPosition {
    /// The `sequenceNumber` as written.
    pub sequence: String,
    /// The `subSequenceNumber` as written, as JSON text (`null` when absent).
    pub sub_sequence: String,
}

impl CheckpointRequest {
    /// The position asked for: `Ok(None)` for "the last record delivered".
    pub fn position(&self) -> Result<Option<ExtendedSequenceNumber>, NotAPosition> {
        let Some(text) = &self.sequence else {
            return Ok(None);
        };
        let bad = || NotAPosition {
            sequence: text.clone(),
            sub_sequence: self
                .sub_sequence
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "null".to_owned()),
        };
        let sequence = SequenceNumber::parse(text).map_err(|_| bad())?;
        let sub = match &self.sub_sequence {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n.as_u64().ok_or_else(bad)?,
            Some(Value::String(s)) => s.parse().map_err(|_| bad())?,
            Some(_) => return Err(bad()),
        };
        Ok(Some(ExtendedSequenceNumber::new(sequence, sub)))
    }
}

/// A line that is not a message. The daemon skips such lines (a child may print to
/// stdout: the Python sample does); [`LineError::is_skippable`] says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not JSON (e.g. text the child printed); skipped.
    #[error("not a JSON object: {line}")]
    NotJson {
        /// The line (its first 200 characters).
        line: String,
    },
    /// JSON without an `action`; skipped.
    #[error("no \"action\" in {line}")]
    NoAction {
        /// The line (its first 200 characters).
        line: String,
    },
    /// An action a child does not send (only `status` and `checkpoint` are read); skipped.
    #[error("unknown action {action:?} in {line}")]
    UnknownAction {
        /// The action named.
        action: String,
        /// The line (its first 200 characters).
        line: String,
    },
    /// A `status` or `checkpoint` message without a valid `field`: a protocol violation.
    #[error("a {action} message without a valid {field}: {line}")]
    BadField {
        /// The message's action.
        action: &'static str,
        /// The field missing or of the wrong type (`responseFor`, `sequenceNumber`).
        field: &'static str,
        /// The line (its first 200 characters).
        line: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Incoming {
    action: Option<String>,
    #[serde(default)]
    response_for: Option<String>,
    #[serde(default)]
    sequence_number: Option<Value>,
    #[serde(default)]
    sub_sequence_number: Option<Value>,
}

/// Longest part of a bad line quoted in an error.
const QUOTE: usize = 200;

fn quote(line: &str) -> String {
    match line.char_indices().nth(QUOTE) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

impl LineError {
    /// Not a message at all (text, JSON without a known action): skipped, as the daemon
    /// skips it. A known message without what it must carry is a protocol violation.
    pub fn is_skippable(&self) -> bool {
        !matches!(self, LineError::BadField { .. })
    }
}

impl FromChild {
    /// One line from the child's stdout: `Ok(None)` for a blank line.
    pub fn parse(line: &str) -> Result<Option<FromChild>, LineError> {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return Ok(None);
        }
        let incoming: Incoming = serde_json::from_str(trimmed).map_err(|_| LineError::NotJson {
            line: quote(trimmed),
        })?;
        let Some(action) = incoming.action else {
            return Err(LineError::NoAction {
                line: quote(trimmed),
            });
        };
        match action.as_str() {
            "status" => match incoming.response_for {
                Some(response_for) => Ok(Some(FromChild::Status { response_for })),
                None => Err(LineError::BadField {
                    action: "status",
                    field: "responseFor",
                    line: quote(trimmed),
                }),
            },
            "checkpoint" => {
                let sequence = match incoming.sequence_number {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s),
                    Some(Value::Number(n)) => Some(n.to_string()),
                    Some(_) => {
                        return Err(LineError::BadField {
                            action: "checkpoint",
                            field: "sequenceNumber",
                            line: quote(trimmed),
                        });
                    }
                };
                Ok(Some(FromChild::Checkpoint(CheckpointRequest {
                    sequence,
                    sub_sequence: incoming.sub_sequence_number.filter(|v| !v.is_null()),
                })))
            }
            other => Err(LineError::UnknownAction {
                action: other.to_owned(),
                line: quote(trimmed),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn esn(seq: &str, sub: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::parse(seq).unwrap(), sub)
    }

    fn json(line: &str) -> Value {
        assert!(line.ends_with('\n'), "{line:?}");
        serde_json::from_str(line.trim_end()).unwrap()
    }

    #[test]
    fn messages_to_the_child() {
        let at = Checkpoint::At(esn("4950", 2));
        let line = ToChild::Initialize {
            shard_id: "shardId-000000000001",
            starting_at: &at,
        }
        .to_line();
        assert_eq!(
            json(&line),
            serde_json::json!({"action": "initialize", "shardId": "shardId-000000000001",
                "sequenceNumber": "4950", "subSequenceNumber": 2})
        );
        let line = ToChild::Initialize {
            shard_id: "s",
            starting_at: &Checkpoint::TrimHorizon,
        }
        .to_line();
        assert_eq!(json(&line)["sequenceNumber"], "TRIM_HORIZON");

        let record = |arrival: Option<u64>| Record {
            sequence_number: SequenceNumber::parse("123").unwrap(),
            sub_sequence_number: 1,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::from_static(&[0xfb, 0xff, b'h']),
            approximate_arrival: arrival.map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        };
        let records = [record(Some(1_700_000_000_123)), record(None)];
        let received_at = UNIX_EPOCH + Duration::from_millis(1_700_000_005_000);
        let line = ToChild::ProcessRecords {
            records: &records,
            millis_behind_latest: Some(42),
            received_at,
        }
        .to_line();
        // Every field present, null when unknown, as the Java daemon writes them; an
        // arrival time the server did not give is when flotilla received the batch.
        assert_eq!(
            json(&line),
            serde_json::json!({"action": "processRecords", "millisBehindLatest": 42,
                "records": [
                    {"action": "record", "data": "+/9o", "partitionKey": "k",
                     "sequenceNumber": "123", "subSequenceNumber": 1,
                     "approximateArrivalTimestamp": 1_700_000_000_123u64},
                    {"action": "record", "data": "+/9o", "partitionKey": "k",
                     "sequenceNumber": "123", "subSequenceNumber": 1,
                     "approximateArrivalTimestamp": 1_700_000_005_000u64}]})
        );
        let line = ToChild::ProcessRecords {
            records: &[],
            millis_behind_latest: None,
            received_at,
        }
        .to_line();
        assert_eq!(
            json(&line),
            serde_json::json!({"action": "processRecords", "records": [], "millisBehindLatest": null})
        );
        assert_eq!(line.matches('\n').count(), 1, "one line, no blank ones");
        for (message, action) in [
            (ToChild::LeaseLost, "leaseLost"),
            (ToChild::ShardEnded, "shardEnded"),
            (ToChild::ShutdownRequested, "shutdownRequested"),
        ] {
            assert_eq!(
                json(&message.to_line()),
                serde_json::json!({"action": action})
            );
        }
        // The answer echoes the request, as the daemon does.
        let asked = CheckpointRequest {
            sequence: Some("123".into()),
            sub_sequence: None,
        };
        assert_eq!(
            json(
                &ToChild::Checkpoint {
                    request: &asked,
                    error: None
                }
                .to_line()
            ),
            serde_json::json!({"action": "checkpoint", "sequenceNumber": "123",
                "subSequenceNumber": null, "error": null})
        );
        assert_eq!(
            json(
                &ToChild::Checkpoint {
                    request: &CheckpointRequest::default(),
                    error: Some(CheckpointRefusal::InvalidState)
                }
                .to_line()
            ),
            serde_json::json!({"action": "checkpoint", "sequenceNumber": null,
                "subSequenceNumber": null, "error": "InvalidStateException"})
        );
    }

    fn request(sequence: Option<&str>, sub: Option<Value>) -> FromChild {
        FromChild::Checkpoint(CheckpointRequest {
            sequence: sequence.map(str::to_owned),
            sub_sequence: sub,
        })
    }

    #[test]
    fn lines_from_the_child() {
        let table: &[(&str, Result<Option<FromChild>, &str>)] = &[
            ("", Ok(None)),
            ("   ", Ok(None)),
            (
                r#"{"action":"status","responseFor":"processRecords"}"#,
                Ok(Some(FromChild::Status {
                    response_for: "processRecords".into(),
                })),
            ),
            // The Python client's spacing; the Node client's checkpoint without a sub.
            (
                r#"{"action": "status", "responseFor": "initialize"}"#,
                Ok(Some(FromChild::Status {
                    response_for: "initialize".into(),
                })),
            ),
            (
                r#"{"action":"checkpoint","sequenceNumber":null}"#,
                Ok(Some(request(None, None))),
            ),
            (r#"{"action":"checkpoint"}"#, Ok(Some(request(None, None)))),
            (
                r#"{"action": "checkpoint", "sequenceNumber": "4950", "subSequenceNumber": 3}"#,
                Ok(Some(request(Some("4950"), Some(serde_json::json!(3))))),
            ),
            (
                r#"{"action":"checkpoint","sequenceNumber":4950,"extra":[1]}"#,
                Ok(Some(request(Some("4950"), None))),
            ),
            // A bad number is the checkpoint's to refuse, not the line's.
            (
                r#"{"action":"checkpoint","sequenceNumber":"12x"}"#,
                Ok(Some(request(Some("12x"), None))),
            ),
            ("hello there", Err("not a JSON object")),
            (r#"{"responseFor":"x"}"#, Err("no \"action\"")),
            (
                r#"{"action":"log","message":"hi"}"#,
                Err("unknown action \"log\""),
            ),
            (r#"{"action":"status"}"#, Err("without a valid responseFor")),
            (
                r#"{"action":"checkpoint","sequenceNumber":[1]}"#,
                Err("without a valid sequenceNumber"),
            ),
        ];
        for (line, want) in table {
            let got = FromChild::parse(line);
            match (want, &got) {
                (Ok(want), Ok(got)) => assert_eq!(got, want, "{line}"),
                (Err(text), Err(error)) => {
                    assert!(error.to_string().contains(text), "{line}: {error}")
                }
                _ => panic!("{line}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn what_is_skipped_and_what_is_a_violation() {
        for (line, skippable) in [
            ("print from the child", true),
            ("[1, 2]", true),
            (r#"{"action":"dance"}"#, true),
            (r#"{"action":"status"}"#, false),
        ] {
            assert_eq!(
                FromChild::parse(line).unwrap_err().is_skippable(),
                skippable,
                "{line}"
            );
        }
    }

    #[test]
    fn checkpoint_positions() {
        let position = |seq: Option<&str>, sub: Option<Value>| {
            CheckpointRequest {
                sequence: seq.map(str::to_owned),
                sub_sequence: sub,
            }
            .position()
        };
        assert_eq!(position(None, None), Ok(None));
        assert_eq!(position(Some("77"), None), Ok(Some(esn("77", 0))));
        assert_eq!(
            position(Some("77"), Some(serde_json::json!("4"))),
            Ok(Some(esn("77", 4)))
        );
        assert!(position(Some("77x"), None).is_err());
        let error = position(Some("77"), Some(serde_json::json!(-1))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "not a checkpoint position: sequenceNumber \"77\", subSequenceNumber -1"
        );
    }

    #[test]
    fn a_long_bad_line_is_quoted_short() {
        let line = "x".repeat(10_000);
        let error = FromChild::parse(&line).unwrap_err().to_string();
        assert!(error.len() < 300, "{}", error.len());
    }
}
