//! The error a processor's call returns ([`ProcessorError`]): below the processor host
//! and the failure policy, which both read it.

use std::error::Error as StdError;
use std::fmt;

use crate::backend::Record;
use crate::model::ExtendedSequenceNumber;

/// An error from user code. Any error converts into it with `?`; it deliberately does
/// not implement `std::error::Error` itself, so that conversion stays unambiguous.
///
/// With `[failure]` set, an error can name the record of the batch that failed
/// ([`ProcessorError::at_record`], Lambda's `batchItemFailures`): the records before it
/// count as processed, and the retry starts at it.
pub struct ProcessorError {
    error: Box<dyn StdError + Send + Sync + 'static>,
    record: Option<ExtendedSequenceNumber>,
}

impl ProcessorError {
    /// An error that is only a message, for a failure with no error type of its own.
    pub fn msg(text: impl fmt::Display) -> Self {
        Self {
            error: text.to_string().into(),
            record: None,
        }
    }

    /// The failure is this record's: the ones before it in the batch were processed.
    /// Name a record of the batch `process` was handed; any other is ignored, and the
    /// whole batch counts as failed.
    pub fn at_record(mut self, record: &Record) -> Self {
        self.record = Some(ExtendedSequenceNumber::new(
            record.sequence_number.clone(),
            record.sub_sequence_number,
        ));
        self
    }

    /// The record this failure names, if it names one.
    pub fn record(&self) -> Option<&ExtendedSequenceNumber> {
        self.record.as_ref()
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for ProcessorError {
    fn from(error: E) -> Self {
        Self {
            error: Box::new(error),
            record: None,
        }
    }
}

impl fmt::Display for ProcessorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl fmt::Debug for ProcessorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}
