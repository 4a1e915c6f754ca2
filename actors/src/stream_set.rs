//! Where a multi-stream worker's stream set comes from: a fixed list, or a source the
//! stream watcher asks at every shard sync (`reader.shard_sync_interval`), as the Java
//! KCL polls its `MultiStreamTracker`. What changes is decided by
//! [`crate::model::StreamSetView`]; this module only asks and describes.
//!
//! A stream that leaves the set keeps its fan-out consumer, as the KCL's
//! `FanOutConsumerRegistration` never deregisters one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::backend::{StreamClient, StreamError};
use crate::fanout::ConsumerError;
use crate::model::{Checkpoint, ConsumedStream, Resolved, StreamArn, StreamIdentifier};
use crate::settings::{InitialPosition, StreamSpec};

/// The answer of a stream-set source: the streams to read now, or why there is none.
pub type StreamListResult = Result<Vec<StreamSpec>, String>;

/// The streams a multi-stream worker reads.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use flotilla_actors::settings::{InitialPosition, StreamSpec};
/// use flotilla_actors::StreamSet;
///
/// let current = Arc::new(Mutex::new(vec![StreamSpec::named("orders", InitialPosition::TrimHorizon)]));
/// let set = StreamSet::polled({
///     let current = current.clone();
///     move || {
///         let list = current.lock().map(|l| l.clone()).map_err(|e| e.to_string());
///         async move { list }
///     }
/// });
/// // Later: the next shard sync reads "orders" and "audit".
/// current.lock().unwrap().push(StreamSpec::named("audit", InitialPosition::Latest));
/// # drop(set);
/// ```
#[derive(Clone)]
pub enum StreamSet {
    /// Read at start, never changed.
    Fixed(Vec<StreamSpec>),
    /// Asked at start and then at every shard sync. A failed answer, or a list that is
    /// empty, names a stream twice or names no Kinesis stream, keeps the last good set
    /// (ERROR log, `StreamSetErrors` metric, and the watcher's status say so).
    Polled(Arc<dyn Fn() -> BoxFuture<'static, StreamListResult> + Send + Sync>),
}

impl fmt::Debug for StreamSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(list) => f.debug_tuple("Fixed").field(list).finish(),
            Self::Polled(_) => f.write_str("Polled(..)"),
        }
    }
}

impl StreamSet {
    /// A source asked at every shard sync; sync or async, fallible.
    pub fn polled<F, Fut>(source: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = StreamListResult> + Send + 'static,
    {
        Self::Polled(Arc::new(move || Box::pin(source())))
    }

    /// The list now.
    pub async fn current(&self) -> StreamListResult {
        match self {
            Self::Fixed(list) => Ok(list.clone()),
            Self::Polled(source) => source().await,
        }
    }

    /// Whether the watcher asks it again.
    pub(crate) fn changes(&self) -> bool {
        matches!(self, Self::Polled(_))
    }
}

impl StreamSpec {
    /// A stream by name, starting new shards at `initial_position` (not AT_TIMESTAMP,
    /// which needs a time: build the struct for that).
    pub fn named(name: impl Into<String>, initial_position: InitialPosition) -> Self {
        Self {
            name: name.into(),
            arn: None,
            initial_position,
            initial_timestamp: None,
        }
    }

    /// The entry of `worker.streams` that says the same.
    pub(crate) fn entry(&self) -> crate::settings::StreamEntry {
        crate::settings::StreamEntry::Table(crate::settings::StreamTable {
            // The ARN when the entry gave one: it is what names a stream of another account.
            name: self.stream(),
            initial_position: Some(self.initial_position),
            initial_timestamp: self
                .initial_timestamp
                .map(|t| humantime::format_rfc3339(t).to_string()),
        })
    }

    /// The stream as the model holds a wanted one (no identifier yet).
    pub(crate) fn wanted(&self) -> ConsumedStream {
        ConsumedStream {
            stream: self.stream(),
            id: None,
            initial: match self.initial_position {
                InitialPosition::TrimHorizon => Checkpoint::TrimHorizon,
                InitialPosition::Latest => Checkpoint::Latest,
                InitialPosition::AtTimestamp => Checkpoint::AtTimestamp,
            },
            initial_timestamp: self.initial_timestamp,
            consumer: None,
            arn: None,
        }
    }
}

/// Why a stream could not be named for multi-stream lease keys, or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdentifyError {
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The server gave no creation time, or an ARN without an account.
    #[error("{0}")]
    Identity(String),
    /// The entry named the stream by an ARN that is not the stream's: the account of
    /// the keys is the ARN's, so a typo'd account would key (and later orphan) every
    /// lease under it.
    #[error(
        "the entry's ARN is not the stream's: DescribeStreamSummary says its ARN is \
         {described:?} (account, region and name must match; a stream of another region \
         is read by a worker of that region)"
    )]
    ArnMismatch { described: String },
    /// Fan-out mode: the stream's consumer could not be found or registered.
    #[error("{}", chain(.0))]
    Consumer(#[from] ConsumerError),
}

impl IdentifyError {
    /// Whether asking again soon may succeed (a throttle, a timeout).
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Self::Stream(e) => e.is_retryable(),
            Self::Identity(_) | Self::ArnMismatch { .. } | Self::Consumer(_) => false,
        }
    }
}

/// An error with its causes, for a status line that must say why.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// A stream described: its identifier in multi-stream lease keys, and its ARN as
/// DescribeStreamSummary gave it (what a consumer is registered on).
#[derive(Debug, Clone)]
pub(crate) struct Identified {
    pub id: StreamIdentifier,
    pub arn: String,
}

/// Describes one stream of a set (DescribeStreamSummary, once) and names it as the KCL
/// does in multi-stream lease keys: the account from the ARN, the creation time in
/// seconds. `stream` is as the calls take it, a name or an ARN; an ARN must be the
/// stream's own. The one description for the start (`worker.streams`) and for streams
/// that join the set later.
pub(crate) async fn identify(
    client: &dyn StreamClient,
    stream: &str,
) -> Result<Identified, IdentifyError> {
    let summary = client.describe_stream_summary(stream).await?;
    let given = if StreamArn::is_kinesis_arn(stream) {
        Some(StreamArn::parse(stream).map_err(|e| IdentifyError::Identity(e.to_string()))?)
    } else {
        None
    };
    if let Some(given) = &given
        && StreamArn::parse(&summary.arn).ok().as_ref() != Some(given)
    {
        return Err(IdentifyError::ArnMismatch {
            described: summary.arn,
        });
    }
    let name = given.as_ref().map_or(stream, |arn| arn.name.as_str());
    let created = summary.created.ok_or_else(|| {
        IdentifyError::Identity("DescribeStreamSummary gave no StreamCreationTimestamp".into())
    })?;
    let id = StreamIdentifier::of_stream(name, &summary.arn, created)
        .map_err(|e| IdentifyError::Identity(e.to_string()))?;
    Ok(Identified {
        id,
        arn: summary.arn,
    })
}

/// A stream that joined the set while running, made ready to read: described
/// ([`identify`]) and, in fan-out mode (`consumer` is the consumer's name), its own
/// consumer found or registered and ACTIVE (at most `wait`) with the same
/// `fanout::ensure_consumer` as at start, so its readers subscribe from their first
/// read. A consumer that cannot be had leaves the stream unresolved: never polled in
/// its place.
pub(crate) async fn resolve(
    client: &dyn StreamClient,
    stream: &str,
    consumer: Option<&str>,
    wait: Duration,
) -> Result<Resolved, IdentifyError> {
    let found = identify(client, stream).await?;
    let consumer = match consumer {
        Some(name) => Some(Arc::from(
            crate::fanout::ensure_consumer(client, stream, &found.arn, name, wait)
                .await?
                .arn,
        )),
        None => None,
    };
    Ok(Resolved {
        id: found.id,
        consumer,
        arn: Some(found.arn),
    })
}
