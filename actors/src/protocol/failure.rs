//! What the failure policy (`[failure]`, run in the processor host) tells the shard's
//! reader: below both, like every message between actors.

/// Why records are discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// They failed `max_retries` retries.
    Retries,
    /// They were older than `max_record_age` when they would have been delivered.
    Age,
}

impl Reason {
    /// As the envelope, the metric and the status name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Retries => "retries",
            Reason::Age => "age",
        }
    }
}

/// What the reader hears of a batch's failures.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FailureNews {
    /// A delivery failed and will be retried (or its records discarded).
    Failed {
        /// The first record of the part that failed, as `sequence/sub`.
        first: String,
        records: usize,
        /// How many times this part failed before.
        retry: u32,
        error: String,
    },
    /// Records were written to the destination and are done.
    Discarded(Discard),
    /// The batch cannot go on, for this reason: the destination cannot be written
    /// (`destination_failed`), or the retries are spent and there is no destination.
    /// The shard is stalled.
    Waiting {
        why: String,
        destination_failed: bool,
    },
    /// The batch goes on again.
    Resumed,
}

/// Records written to the destination.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Discard {
    /// Each record, as `sequence/sub (key partition-key)`.
    pub records: Vec<String>,
    pub reason: Reason,
    pub destination: String,
    pub attempts: u32,
    pub error: Option<String>,
}
