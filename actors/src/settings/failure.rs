//! `[failure]`: what happens to a record the processor cannot handle (issue 32). The
//! names are AWS Lambda's event source mapping's, so an operator coming from Lambda finds
//! them: `MaximumRetryAttempts` is `max_retries`, `BisectBatchOnFunctionError` is
//! `bisect`, `MaximumRecordAgeInSeconds` is `max_record_age`, the on-failure destination
//! is `destination`.
//!
//! Every setting off (the default) is the behaviour before it: a failed batch fails the
//! shard, which restarts from its checkpoint.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{SettingsError, duration_text, invalid, looks_like_url, quoted};

/// `[failure]`: bounded retries, bisection, a maximum record age and where discarded
/// records go.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailureSettings {
    /// How many times a failing batch (or, with `bisect`, a failing single record) is
    /// retried before its failing records are discarded to `destination`. `None`:
    /// retried without end.
    pub max_retries: Option<u32>,
    /// On a failure, split the batch in two and deliver each half, down to the single
    /// record that fails: one bad record costs about log2(batch) attempts, and the good
    /// records around it are delivered.
    pub bisect: bool,
    /// Records older than this (by their arrival time) when they would be handed to the
    /// processor are discarded to `destination` instead. `None`: no limit.
    #[serde(with = "duration_text::option")]
    pub max_record_age: Option<Duration>,
    /// Where a discarded record is written before the checkpoint moves past it. `None`:
    /// nothing is discarded; a record past its retries is retried on, and its shard
    /// reports the wait as a stall.
    pub destination: Option<Destination>,
}

impl FailureSettings {
    /// Whether any of the policy is on: failures are then handled inside the shard (the
    /// processor host retries, bisects and discards) rather than by restarting it.
    pub fn policy_on(&self) -> bool {
        self.max_retries.is_some()
            || self.bisect
            || self.max_record_age.is_some()
            || self.destination.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if let Some(age) = self.max_record_age {
            if age < Duration::from_secs(1) {
                return Err(invalid(
                    "failure.max_record_age",
                    humantime::format_duration(age),
                    "must be at least 1s (Lambda's MaximumRecordAgeInSeconds starts at 60s); \
                     remove it to keep records of any age",
                ));
            }
            if self.destination.is_none() {
                return Err(invalid(
                    "failure.max_record_age",
                    humantime::format_duration(age),
                    "needs failure.destination: a record is discarded only after it is \
                     written there (kinesis:STREAM, sqs:QUEUE_URL or file:PATH)",
                ));
            }
        }
        Ok(())
    }
}

/// Where discarded records are written (`failure.destination`), as
/// `kinesis:STREAM`, `sqs:QUEUE_URL` or `file:PATH`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Destination {
    /// Another Kinesis stream (a name or an ARN), each record put with its own partition
    /// key, so the records of one key stay in order there too.
    Kinesis(String),
    /// An SQS queue, by its URL.
    Sqs(String),
    /// A file of JSON lines, appended to (a single host's dead letters).
    File(std::path::PathBuf),
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Kinesis(stream) => write!(f, "kinesis:{stream}"),
            Destination::Sqs(url) => write!(f, "sqs:{url}"),
            Destination::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

impl FromStr for Destination {
    type Err = SettingsError;

    fn from_str(text: &str) -> Result<Self, SettingsError> {
        let bad = |why: &str| invalid("failure.destination", quoted(text), why);
        let (kind, rest) = text
            .split_once(':')
            .ok_or_else(|| bad("must be kinesis:STREAM, sqs:QUEUE_URL or file:PATH"))?;
        let rest = rest.trim();
        match kind.trim() {
            "kinesis" if !rest.is_empty() => Ok(Destination::Kinesis(rest.to_owned())),
            "kinesis" => Err(bad("names no stream after \"kinesis:\"")),
            "sqs" if looks_like_url(rest) => Ok(Destination::Sqs(rest.to_owned())),
            "sqs" => Err(bad("needs the queue's URL after \"sqs:\", e.g. \
                 sqs:https://sqs.eu-west-1.amazonaws.com/123456789012/dead-letters")),
            "file" if !rest.is_empty() => Ok(Destination::File(rest.into())),
            "file" => Err(bad("names no path after \"file:\"")),
            _ => Err(bad(
                "must start with kinesis:, sqs: or file: (SNS and S3 are not supported)",
            )),
        }
    }
}

impl TryFrom<String> for Destination {
    type Error = SettingsError;

    fn try_from(text: String) -> Result<Self, SettingsError> {
        text.parse()
    }
}

impl From<Destination> for String {
    fn from(destination: Destination) -> String {
        destination.to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn destinations_parse_and_print_back_or_say_what_is_wrong() {
        for (text, parsed) in [
            ("kinesis:dead", Destination::Kinesis("dead".into())),
            (
                "sqs:http://127.0.0.1:5000/123456789012/dl",
                Destination::Sqs("http://127.0.0.1:5000/123456789012/dl".into()),
            ),
            (
                "file:/var/lib/dl.jsonl",
                Destination::File("/var/lib/dl.jsonl".into()),
            ),
        ] {
            let got: Destination = text.parse().unwrap();
            assert_eq!(got, parsed);
            assert_eq!(got.to_string(), text);
        }
        for (text, says) in [
            ("dead", "must be kinesis:STREAM"),
            ("kinesis:", "names no stream"),
            ("sqs:dead-letters", "needs the queue's URL"),
            ("file: ", "names no path"),
            (
                "sns:arn:aws:sns:eu-west-1:1:t",
                "SNS and S3 are not supported",
            ),
        ] {
            let error = text.parse::<Destination>().unwrap_err().to_string();
            assert!(error.contains("failure.destination"), "{error}");
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn an_age_limit_needs_a_destination_and_a_second() {
        let mut settings = FailureSettings {
            max_record_age: Some(Duration::from_secs(60)),
            ..FailureSettings::default()
        };
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("needs failure.destination"), "{error}");
        settings.destination = Some(Destination::File("/tmp/dl".into()));
        settings.validate().unwrap();
        settings.max_record_age = Some(Duration::from_millis(10));
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("at least 1s"), "{error}");
        assert!(!FailureSettings::default().policy_on());
        assert!(settings.policy_on());
    }

    #[test]
    fn a_destination_stream_the_worker_reads_is_refused() {
        let mut settings = crate::settings::Settings::default();
        settings.worker.stream = "orders".into();
        settings.worker.application = "orders-app".into();
        settings.failure.destination = Some(Destination::Kinesis(
            "arn:aws:kinesis:eu-west-1:123456789012:stream/orders".into(),
        ));
        let error = settings.validate().unwrap_err().to_string();
        assert!(
            error.contains("names a stream this worker reads"),
            "{error}"
        );
        settings.failure.destination = Some(Destination::Kinesis("orders-dead".into()));
        settings.validate().unwrap();
    }
}
