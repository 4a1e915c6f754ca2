//! The Kinesis ports' error: [`StreamError`], one variant per thing the caller does
//! about it (how each counts in telemetry is [`super::Classified`]'s rule).

/// Kinesis errors, by what the caller should do about them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// Back off with jitter and retry.
    #[error("{op}: throttled by Kinesis: {message}")]
    Throttled {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// Get a new iterator from the last delivered record.
    #[error("{op}: shard iterator expired: {message}")]
    IteratorExpired {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// The stream, shard or consumer does not exist (ResourceNotFoundException): a
    /// wrong name, a deleted stream, or a lease naming a shard the stream lacks.
    /// Repeating fails the same way.
    #[error("{op}: not found: {message}")]
    NotFound {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// The request was refused as wrong (InvalidArgumentException, ValidationException):
    /// a position not in the shard, a garbage iterator, a fan-out call to a source
    /// without fan-out. Repeating fails the same way.
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// A network failure, a timeout or a 5xx: retry.
    #[error("{op}: transient failure talking to {endpoint}: {message}")]
    Transient {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The URL the call went to, so an operator can tell which one is unreachable.
        endpoint: String,
        /// The server's error text, for logs.
        message: String,
    },
    /// The server's answer lacks what the call needs from it. The adapter reads only
    /// what a call uses, so this names the one thing that was missing; it means the
    /// server returned less than Kinesis promises for that call.
    #[error("{op}: the answer about {what} has no {missing}")]
    IncompleteAnswer {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// What the answer was about (e.g. `"record 4960…"`, `"consumer app"`).
        what: String,
        /// The field the answer lacked, as AWS names it (e.g. `"SequenceNumber"`).
        missing: &'static str,
    },
    /// The resource is busy: a consumer still being created or deleted, or a shard
    /// subscription of the same consumer still open (the previous owner's, during a
    /// handoff). Back off and retry.
    #[error("{op}: resource in use: {message}")]
    InUse {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// The position asked for is older than the oldest record the shard still keeps
    /// (DynamoDB Streams' TrimmedDataAccessException: a checkpoint past the 24-hour
    /// retention). Repeating the call fails the same way: what lies between the
    /// position and the shard's trim horizon is gone.
    #[error("{op}: the records asked for are past the stream's retention: {message}")]
    Trimmed {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// Any other failure, including an answer the adapter could not read (a malformed
    /// sequence number). Not retryable: the caller gives up on the call.
    #[error("{op}: {message}")]
    Other {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
    /// The credentials may not make this call, or are not valid (expired, unknown, a
    /// bad signature): it fails the same way until IAM or the credentials change.
    #[error("{op}: access denied: {message}")]
    AccessDenied {
        /// The API call that failed (e.g. `"GetRecords"`).
        op: &'static str,
        /// The server's error text, for logs.
        message: String,
    },
}

impl StreamError {
    /// Whether the same call may succeed if repeated after a pause.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StreamError::Throttled { .. }
                | StreamError::Transient { .. }
                | StreamError::InUse { .. }
        )
    }
}
