//! Many streams per application: which stream a lease belongs to.
//!
//! The Java KCL's multi-stream mode keys each lease `account:stream:creationEpoch:shardId`
//! (its `StreamIdentifier` serialized, then the shard) and writes the identifier in a
//! `streamName` attribute. flotilla uses the same form, so a KCL multi-stream table
//! carries over both ways. A single-stream application keeps bare shard ids as keys:
//! [`ConsumedStreams::single`] has no identifier, and nothing about its keys changes.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use super::{Checkpoint, LeaseKey, ShardId};

/// A stream as the KCL names it in a multi-stream lease table: the account that owns it,
/// its name, and when it was created (seconds since the epoch), so that a stream deleted
/// and created again under the same name gets new keys and never resumes old
/// checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamIdentifier {
    /// The AWS account id that owns the stream (from its ARN).
    pub account: String,
    /// The stream's name.
    pub name: String,
    /// When the stream was created, in whole seconds since the Unix epoch.
    pub creation_epoch: u64,
}

/// Why a text is not a stream identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamIdError {
    /// The text (carried) is not `account:stream:creationEpoch`: not three parts, or an
    /// empty account or name.
    #[error("{0:?} is not account:stream:creationEpoch")]
    Form(String),
    /// The third part is not a whole number of seconds.
    #[error("{text:?}: the creation epoch {epoch:?} is not a number of seconds")]
    Epoch {
        /// The identifier's text.
        text: String,
        /// Its creation-epoch part, as written.
        epoch: String,
    },
    /// A described stream's ARN (carried) has no account to build the identifier from.
    #[error("stream ARN {0:?} names no account")]
    Account(String),
    /// The text is not a Kinesis stream ARN: a part is missing, or the service or the
    /// resource is not a Kinesis stream's.
    #[error(
        "{arn:?} is not a Kinesis stream ARN (arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME): {why}"
    )]
    Arn {
        /// The text as given.
        arn: String,
        /// Which part is wrong.
        why: &'static str,
    },
}

/// A Kinesis stream named by its ARN, `arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME`.
/// A stream of another account can only be named so (its calls take `StreamARN`), and
/// the account in its multi-stream lease keys is the ARN's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamArn {
    /// The AWS partition: `aws`, `aws-cn`, `aws-us-gov`.
    pub partition: String,
    /// The stream's region, e.g. `us-east-1`.
    pub region: String,
    /// The AWS account id that owns the stream.
    pub account: String,
    /// The stream's name (what follows `stream/`).
    pub name: String,
}

impl StreamArn {
    /// Reads a Kinesis stream ARN. Only the form is checked (every part there, the
    /// service `kinesis`, the resource `stream/NAME`); whether the name is a valid
    /// stream name is the caller's to say, with the key it came from.
    pub fn parse(text: &str) -> Result<Self, StreamIdError> {
        let wrong = |why| StreamIdError::Arn {
            arn: text.to_owned(),
            why,
        };
        let mut parts = text.splitn(6, ':');
        let (
            Some("arn"),
            Some(partition),
            Some(service),
            Some(region),
            Some(account),
            Some(resource),
        ) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        )
        else {
            return Err(wrong("not six parts separated by ':'"));
        };
        if service != "kinesis" {
            return Err(wrong("the service is not kinesis"));
        }
        if partition.is_empty() || region.is_empty() || account.is_empty() {
            return Err(wrong("the partition, region and account must all be set"));
        }
        let name = resource
            .strip_prefix("stream/")
            .filter(|name| !name.is_empty() && !name.contains('/'))
            .ok_or_else(|| wrong("the resource is not stream/NAME"))?;
        Ok(Self {
            partition: partition.to_owned(),
            region: region.to_owned(),
            account: account.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Whether `text` is meant as a Kinesis stream ARN (and is then read with [`parse`]).
    ///
    /// [`parse`]: StreamArn::parse
    pub fn is_kinesis_arn(text: &str) -> bool {
        let mut parts = text.splitn(4, ':');
        parts.next() == Some("arn") && parts.nth(1) == Some("kinesis")
    }
}

impl fmt::Display for StreamArn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "arn:{}:kinesis:{}:{}:stream/{}",
            self.partition, self.region, self.account, self.name
        )
    }
}

impl StreamIdentifier {
    /// The identifier of a described stream: the account from its ARN
    /// (`arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME`) and the creation time in whole
    /// seconds, as the KCL's `StreamIdentifier.multiStreamInstance` builds it.
    pub fn of_stream(name: &str, arn: &str, created: SystemTime) -> Result<Self, StreamIdError> {
        let account = arn
            .split(':')
            .nth(4)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| StreamIdError::Account(arn.to_owned()))?;
        let creation_epoch = created
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(Self {
            account: account.to_owned(),
            name: name.to_owned(),
            creation_epoch,
        })
    }

    /// Reads the serialized form, `account:stream:creationEpoch` (a lease's `streamName`).
    pub fn parse(text: &str) -> Result<Self, StreamIdError> {
        let mut parts = text.split(':');
        let (Some(account), Some(name), Some(epoch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(StreamIdError::Form(text.to_owned()));
        };
        if account.is_empty() || name.is_empty() {
            return Err(StreamIdError::Form(text.to_owned()));
        }
        let creation_epoch = epoch.parse().map_err(|_| StreamIdError::Epoch {
            text: text.to_owned(),
            epoch: epoch.to_owned(),
        })?;
        Ok(Self {
            account: account.to_owned(),
            name: name.to_owned(),
            creation_epoch,
        })
    }

    /// The key of this stream's lease for `shard`.
    pub fn lease_key(&self, shard: &ShardId) -> LeaseKey {
        LeaseKey::new(format!("{self}:{shard}"))
    }
}

impl fmt::Display for StreamIdentifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.account, self.name, self.creation_epoch)
    }
}

/// One stream a worker consumes, with what is per stream: where its shards start, and
/// the enhanced fan-out consumer its shards are subscribed with.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumedStream {
    /// The stream as the `StreamClient` calls take it: a name, a Kinesis stream's ARN
    /// (an entry of `worker.streams` given so), or a table stream's ARN.
    pub stream: String,
    /// `None` for a single-stream application, whose keys are bare shard ids.
    pub id: Option<StreamIdentifier>,
    /// Where a shard with no leased parent starts.
    pub initial: Checkpoint,
    /// The time of `initial` when it is `AT_TIMESTAMP`.
    pub initial_timestamp: Option<SystemTime>,
    /// The ARN of this stream's enhanced fan-out consumer, in fan-out mode (a consumer is
    /// registered on one stream, so each stream has its own); `None` polls.
    pub consumer: Option<Arc<str>>,
    /// The stream's own ARN, once described (`None` before, and where no description
    /// gave one): what a processor's [`ShardInfo`](crate::ShardInfo) names it by beside
    /// its name.
    pub arn: Option<String>,
}

impl ConsumedStream {
    /// The key of this stream's lease for `shard`: the shard id alone for a single
    /// stream, the KCL multi-stream form otherwise.
    pub fn lease_key(&self, shard: &ShardId) -> LeaseKey {
        match &self.id {
            Some(id) => id.lease_key(shard),
            None => LeaseKey::from(shard),
        }
    }

    /// Whether `key` is one of this stream's leases.
    pub fn owns(&self, key: &LeaseKey) -> bool {
        match &self.id {
            Some(id) => key.stream_id() == Some(id.to_string().as_str()),
            None => key.stream_id().is_none(),
        }
    }
}

/// The streams a worker consumes: one without an identifier (single-stream keys), or
/// several, each with its identifier (multi-stream keys).
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumedStreams(Vec<ConsumedStream>);

impl ConsumedStreams {
    /// A single-stream application: lease keys are shard ids.
    pub fn single(stream: ConsumedStream) -> Self {
        Self(vec![ConsumedStream { id: None, ..stream }])
    }

    /// A multi-stream application; each stream must carry its identifier.
    pub fn multi(streams: Vec<ConsumedStream>) -> Self {
        Self(streams)
    }

    /// The streams, in the order they were given.
    pub fn iter(&self) -> impl Iterator<Item = &ConsumedStream> {
        self.0.iter()
    }

    /// Whether lease keys take the multi-stream form (the streams carry identifiers).
    pub fn is_multi(&self) -> bool {
        self.0.iter().any(|s| s.id.is_some())
    }

    /// The stream a lease belongs to; `None` when it is none of these (a row of another
    /// stream, or a single-stream key in a multi-stream application).
    pub fn of_key(&self, key: &LeaseKey) -> Option<&ConsumedStream> {
        self.0.iter().find(|s| s.owns(key))
    }

    /// The streams' names, joined with commas (for status and logs).
    pub fn names(&self) -> String {
        self.0
            .iter()
            .map(|s| s.stream.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stream(id: Option<StreamIdentifier>) -> ConsumedStream {
        ConsumedStream {
            stream: "orders".into(),
            id,
            initial: Checkpoint::TrimHorizon,
            initial_timestamp: None,
            consumer: None,
            arn: None,
        }
    }

    #[test]
    fn identifiers_round_trip_in_the_kcl_form() {
        let id = StreamIdentifier::of_stream(
            "fixture-ms-a",
            "arn:aws:kinesis:us-east-1:123456789012:stream/fixture-ms-a",
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_345_735_900),
        )
        .unwrap();
        assert_eq!(id.to_string(), "123456789012:fixture-ms-a:1795345735");
        assert_eq!(StreamIdentifier::parse(&id.to_string()).unwrap(), id);
        let key = id.lease_key(&ShardId::from_index(1));
        assert_eq!(
            key.as_str(),
            "123456789012:fixture-ms-a:1795345735:shardId-000000000001"
        );
        assert_eq!(key.shard_id(), ShardId::from_index(1));
        assert_eq!(
            key.stream_id(),
            Some("123456789012:fixture-ms-a:1795345735")
        );
    }

    #[test]
    fn malformed_identifiers_say_why() {
        for (text, want) in [
            ("a:b", StreamIdError::Form("a:b".into())),
            ("a:b:c:d", StreamIdError::Form("a:b:c:d".into())),
            (":b:1", StreamIdError::Form(":b:1".into())),
            (
                "a:b:x",
                StreamIdError::Epoch {
                    text: "a:b:x".into(),
                    epoch: "x".into(),
                },
            ),
        ] {
            assert_eq!(StreamIdentifier::parse(text), Err(want), "{text}");
        }
        assert_eq!(
            StreamIdentifier::of_stream("s", "s", SystemTime::UNIX_EPOCH),
            Err(StreamIdError::Account("s".into()))
        );
    }

    #[test]
    fn stream_arns_are_read_and_written_back_and_malformed_ones_say_why() {
        let text = "arn:aws-cn:kinesis:cn-north-1:123456789012:stream/orders";
        let arn = StreamArn::parse(text).unwrap();
        assert_eq!(
            arn,
            StreamArn {
                partition: "aws-cn".into(),
                region: "cn-north-1".into(),
                account: "123456789012".into(),
                name: "orders".into(),
            }
        );
        assert_eq!(arn.to_string(), text);
        assert!(StreamArn::is_kinesis_arn(text));
        for (text, why) in [
            (
                "arn:aws:kinesis:us-east-1:1",
                "not six parts separated by ':'",
            ),
            (
                "arn:aws:dynamodb:us-east-1:1:table/t/stream/2024",
                "the service is not kinesis",
            ),
            (
                "arn:aws:kinesis::1:stream/orders",
                "the partition, region and account must all be set",
            ),
            (
                "arn:aws:kinesis:us-east-1::stream/orders",
                "the partition, region and account must all be set",
            ),
            (
                "arn:aws:kinesis:us-east-1:1:stream/",
                "the resource is not stream/NAME",
            ),
            (
                "arn:aws:kinesis:us-east-1:1:table/orders",
                "the resource is not stream/NAME",
            ),
            (
                "arn:aws:kinesis:us-east-1:1:stream/orders/consumer/app:1",
                "the resource is not stream/NAME",
            ),
        ] {
            assert_eq!(
                StreamArn::parse(text),
                Err(StreamIdError::Arn {
                    arn: text.into(),
                    why
                }),
                "{text}"
            );
        }
        assert!(!StreamArn::is_kinesis_arn("orders"));
        assert!(!StreamArn::is_kinesis_arn(
            "arn:aws:dynamodb:us-east-1:1:table/t/stream/2024"
        ));
    }

    #[test]
    fn keys_are_matched_to_their_stream() {
        let a = StreamIdentifier::parse("1:a:10").unwrap();
        let b = StreamIdentifier::parse("1:b:10").unwrap();
        let shard = ShardId::from_index(0);
        let set = ConsumedStreams::multi(vec![
            ConsumedStream {
                stream: "a".into(),
                ..stream(Some(a.clone()))
            },
            ConsumedStream {
                stream: "b".into(),
                ..stream(Some(b.clone()))
            },
        ]);
        assert_eq!(set.of_key(&b.lease_key(&shard)).unwrap().stream, "b");
        assert_eq!(set.of_key(&a.lease_key(&shard)).unwrap().stream, "a");
        // Same account and name, another creation: another stream.
        let recreated = StreamIdentifier::parse("1:a:11").unwrap();
        assert_eq!(set.of_key(&recreated.lease_key(&shard)), None);
        assert_eq!(set.of_key(&LeaseKey::from(&shard)), None);
        // A single stream owns bare shard ids only.
        let single = ConsumedStreams::single(stream(None));
        assert_eq!(
            single.of_key(&LeaseKey::from(&shard)).unwrap().stream,
            "orders"
        );
        assert_eq!(single.of_key(&a.lease_key(&shard)), None);
        assert_eq!(
            single.iter().next().unwrap().lease_key(&shard),
            LeaseKey::from(&shard)
        );
    }
}
