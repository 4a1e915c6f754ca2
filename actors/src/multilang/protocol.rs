//! The MultiLangDaemon protocol: one JSON object per line on the child's stdin (from
//! flotilla) and stdout (from the child). Pure: values in, lines out, and lines in,
//! values out, leniently (unknown fields are ignored, blank lines skipped: the npm
//! client writes a blank line before each message).
//!
//! To the child: `initialize`, `processRecords`, `leaseLost`, `shardEnded`,
//! `shutdownRequested`, and the answer to each of its `checkpoint` requests. From the
//! child: `checkpoint` (a sequence number, or none for "the last record delivered"),
//! and `status` with `responseFor` naming the action it finished.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::Record;
use crate::model::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};

/// What flotilla sends a child.
#[derive(Debug, Clone, PartialEq)]
pub enum ToChild<'a> {
    Initialize {
        shard_id: &'a str,
        /// Where the shard starts: a sequence number, or a sentinel (`TRIM_HORIZON`,
        /// `LATEST`, `AT_TIMESTAMP`).
        starting_at: &'a Checkpoint,
    },
    ProcessRecords {
        records: &'a [Record],
        millis_behind_latest: Option<u64>,
    },
    LeaseLost,
    ShardEnded,
    ShutdownRequested,
    /// The answer to a `checkpoint` request: the position it asked for (or the one it
    /// got, for "the last record"), and the KCL's name of the error, if any.
    Checkpoint {
        at: Option<&'a ExtendedSequenceNumber>,
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
    /// Not valid in this state (e.g. no record delivered yet).
    InvalidState,
}

impl CheckpointRefusal {
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
            } => serde_json::to_string(&ProcessRecordsOut {
                action: "processRecords",
                records: records.iter().map(RecordOut::from).collect(),
                millis_behind_latest: millis_behind_latest.unwrap_or(0),
            }),
            ToChild::LeaseLost | ToChild::ShardEnded | ToChild::ShutdownRequested => {
                serde_json::to_string(&ActionOnly {
                    action: self.action(),
                })
            }
            ToChild::Checkpoint { at, error } => serde_json::to_string(&CheckpointOut {
                action: "checkpoint",
                sequence_number: at.map(|a| a.sequence.to_string()),
                sub_sequence_number: at.map(|a| a.sub_sequence),
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
    millis_behind_latest: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordOut<'a> {
    action: &'static str,
    data: String,
    partition_key: &'a str,
    sequence_number: String,
    sub_sequence_number: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    approximate_arrival_timestamp: Option<u64>,
}

impl<'a> From<&'a Record> for RecordOut<'a> {
    fn from(record: &'a Record) -> Self {
        RecordOut {
            action: "record",
            data: base64::engine::general_purpose::STANDARD.encode(&record.data),
            partition_key: &record.partition_key,
            sequence_number: record.sequence_number.to_string(),
            sub_sequence_number: record.sub_sequence_number,
            approximate_arrival_timestamp: record.approximate_arrival.and_then(|at| {
                at.duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64)
            }),
        }
    }
}

#[derive(Serialize)]
struct ActionOnly {
    action: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointOut {
    action: &'static str,
    sequence_number: Option<String>,
    sub_sequence_number: Option<u64>,
    error: Option<&'static str>,
}

/// What a child sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromChild {
    /// It finished the action named.
    Status { response_for: String },
    /// Checkpoint here (`None`: at the last record delivered).
    Checkpoint { at: Option<ExtendedSequenceNumber> },
}

/// A line that is not the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not a JSON object: {line}")]
    NotJson { line: String },
    #[error("no \"action\" in {line}")]
    NoAction { line: String },
    #[error("unknown action {action:?} in {line}")]
    UnknownAction { action: String, line: String },
    #[error("a {action} message without a valid {field}: {line}")]
    BadField {
        action: &'static str,
        field: &'static str,
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
                let bad = || LineError::BadField {
                    action: "checkpoint",
                    field: "sequenceNumber",
                    line: quote(trimmed),
                };
                let sequence = match incoming.sequence_number {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(SequenceNumber::parse(&s).map_err(|_| bad())?),
                    Some(Value::Number(n)) => {
                        Some(SequenceNumber::parse(&n.to_string()).map_err(|_| bad())?)
                    }
                    Some(_) => return Err(bad()),
                };
                let sub = match incoming.sub_sequence_number {
                    None | Some(Value::Null) => 0,
                    Some(Value::Number(n)) => n.as_u64().ok_or_else(|| LineError::BadField {
                        action: "checkpoint",
                        field: "subSequenceNumber",
                        line: quote(trimmed),
                    })?,
                    Some(Value::String(s)) => s.parse().map_err(|_| LineError::BadField {
                        action: "checkpoint",
                        field: "subSequenceNumber",
                        line: quote(trimmed),
                    })?,
                    Some(_) => {
                        return Err(LineError::BadField {
                            action: "checkpoint",
                            field: "subSequenceNumber",
                            line: quote(trimmed),
                        });
                    }
                };
                Ok(Some(FromChild::Checkpoint {
                    at: sequence.map(|s| ExtendedSequenceNumber::new(s, sub)),
                }))
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

        let record = Record {
            sequence_number: SequenceNumber::parse("123").unwrap(),
            sub_sequence_number: 1,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::from_static(b"hello"),
            approximate_arrival: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
        };
        let line = ToChild::ProcessRecords {
            records: std::slice::from_ref(&record),
            millis_behind_latest: Some(42),
        }
        .to_line();
        assert_eq!(
            json(&line),
            serde_json::json!({"action": "processRecords", "millisBehindLatest": 42,
                "records": [{"action": "record", "data": "aGVsbG8=", "partitionKey": "k",
                    "sequenceNumber": "123", "subSequenceNumber": 1,
                    "approximateArrivalTimestamp": 1_700_000_000_123u64}]})
        );
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
        let done = esn("123", 0);
        assert_eq!(
            json(
                &ToChild::Checkpoint {
                    at: Some(&done),
                    error: None
                }
                .to_line()
            ),
            serde_json::json!({"action": "checkpoint", "sequenceNumber": "123",
                "subSequenceNumber": 0, "error": null})
        );
        assert_eq!(
            json(
                &ToChild::Checkpoint {
                    at: None,
                    error: Some(CheckpointRefusal::Shutdown)
                }
                .to_line()
            ),
            serde_json::json!({"action": "checkpoint", "sequenceNumber": null,
                "subSequenceNumber": null, "error": "ShutdownException"})
        );
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
            (
                r#"{"action":"checkpoint","sequenceNumber":null}"#,
                Ok(Some(FromChild::Checkpoint { at: None })),
            ),
            (
                r#"{"action":"checkpoint"}"#,
                Ok(Some(FromChild::Checkpoint { at: None })),
            ),
            (
                r#"{"action":"checkpoint","sequenceNumber":"4950","subSequenceNumber":3,"error":null}"#,
                Ok(Some(FromChild::Checkpoint {
                    at: Some(esn("4950", 3)),
                })),
            ),
            (
                r#"{"action":"checkpoint","sequenceNumber":4950,"extra":[1]}"#,
                Ok(Some(FromChild::Checkpoint {
                    at: Some(esn("4950", 0)),
                })),
            ),
            ("hello there", Err("not a JSON object")),
            (r#"{"responseFor":"x"}"#, Err("no \"action\"")),
            (r#"{"action":"dance"}"#, Err("unknown action \"dance\"")),
            (r#"{"action":"status"}"#, Err("without a valid responseFor")),
            (
                r#"{"action":"checkpoint","sequenceNumber":"12x"}"#,
                Err("without a valid sequenceNumber"),
            ),
            (
                r#"{"action":"checkpoint","sequenceNumber":"12","subSequenceNumber":-1}"#,
                Err("without a valid subSequenceNumber"),
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
    fn a_long_bad_line_is_quoted_short() {
        let line = "x".repeat(10_000);
        let error = FromChild::parse(&line).unwrap_err().to_string();
        assert!(error.len() < 300, "{}", error.len());
    }
}
