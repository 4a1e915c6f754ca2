//! Records the processor cannot handle (issue 32): bounded retries, bisection to the bad
//! record, a maximum record age, partial batch failures, and the destination discarded
//! records are written to first. The settings are `[failure]`
//! ([`crate::settings::FailureSettings`]).
//!
//! - `destination`: the envelope a discarded record is written as, and the port that
//!   writes it ([`DeadLetters`]), with its three kinds (a Kinesis stream, an SQS queue,
//!   a file of JSON lines).

pub mod destination;

pub use destination::{DeadLetters, DestinationError, Envelope};
pub(crate) mod driver;
pub(crate) mod plan;
