//! Records the processor cannot handle (issue 32): bounded retries, bisection to the bad
//! record, a maximum record age, partial batch failures, and the destination discarded
//! records are written to first. The settings are `[failure]`
//! ([`crate::settings::FailureSettings`]).
//!
//! - `destination`: the envelope a discarded record is written as, and the port that
//!   writes it ([`DeadLetters`]), with its three kinds (a Kinesis stream, an SQS queue,
//!   a file of JSON lines).
//! - `file`: [`FileDeadLetters`], `file:PATH`: one JSON line an envelope, appended and
//!   synced to disk before the write answers.
//! - `stream`: [`StreamDeadLetters`], `kinesis:STREAM`: one record an envelope, put
//!   under the record's own partition key, so a key's dead letters keep their order.
//! - `sqs`: [`SqsDeadLetters`], `sqs:QUEUE_URL`: one message an envelope, ten to a
//!   SendMessageBatch; an envelope over SQS's 256 KiB is refused, never truncated.

pub mod destination;
pub mod file;
pub mod sqs;
pub mod stream;

pub use destination::{DeadLetters, DestinationError, Envelope};
pub use file::FileDeadLetters;
pub use sqs::SqsDeadLetters;
pub use stream::StreamDeadLetters;
pub(crate) mod driver;
pub(crate) mod plan;
