//! Where a multi-stream worker's stream set comes from: a fixed list, or a source the
//! stream watcher asks at every shard sync (`reader.shard_sync_interval`), as the Java
//! KCL polls its `MultiStreamTracker`. What changes is decided by
//! [`crate::model::StreamSetView`]; this module only asks and describes.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::backend::{StreamClient, StreamError};
use crate::model::{Checkpoint, ConsumedStream, StreamIdentifier};
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
            initial_position,
            initial_timestamp: None,
        }
    }

    /// The entry of `worker.streams` that says the same.
    pub(crate) fn entry(&self) -> crate::settings::StreamEntry {
        crate::settings::StreamEntry::Table(crate::settings::StreamTable {
            name: self.name.clone(),
            initial_position: Some(self.initial_position),
            initial_timestamp: self
                .initial_timestamp
                .map(|t| humantime::format_rfc3339(t).to_string()),
        })
    }

    /// The stream as the model holds a wanted one (no identifier yet).
    pub(crate) fn wanted(&self) -> ConsumedStream {
        ConsumedStream {
            stream: self.name.clone(),
            id: None,
            initial: match self.initial_position {
                InitialPosition::TrimHorizon => Checkpoint::TrimHorizon,
                InitialPosition::Latest => Checkpoint::Latest,
                InitialPosition::AtTimestamp => Checkpoint::AtTimestamp,
            },
            initial_timestamp: self.initial_timestamp,
        }
    }
}

/// Why a stream could not be named for multi-stream lease keys.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdentifyError {
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The server gave no creation time, or an ARN without an account.
    #[error("{0}")]
    Identity(String),
}

/// Describes one stream (DescribeStreamSummary, once) and names it as the KCL does in
/// multi-stream lease keys: the account from the ARN, the creation time in seconds.
pub(crate) async fn identify(
    client: &dyn StreamClient,
    name: &str,
) -> Result<StreamIdentifier, IdentifyError> {
    let summary = client.describe_stream_summary(name).await?;
    let created = summary.created.ok_or_else(|| {
        IdentifyError::Identity("DescribeStreamSummary gave no StreamCreationTimestamp".into())
    })?;
    StreamIdentifier::of_stream(name, &summary.arn, created)
        .map_err(|e| IdentifyError::Identity(e.to_string()))
}
