//! The failure policy's events (`[failure]`): a failed delivery, records discarded, a
//! destination that refused a write.

use tracing::{error, warn};

use super::{Event, Metric, Sample};
use crate::model::LeaseKey;
use crate::protocol::{Discard, Reason};

/// The processor failed a batch (or a part of one) and the failure policy (`[failure]`)
/// retries it: a WARN and a count; what is finally discarded is [`RecordsDiscarded`].
pub(crate) struct DeliveryFailed<'a> {
    pub key: &'a LeaseKey,
    /// The first record of the failed part (the named one, for a partial failure).
    pub first: &'a str,
    pub records: usize,
    /// How many times the part failed before.
    pub retry: u32,
    pub error: &'a str,
}

impl Event for DeliveryFailed<'_> {
    fn log(&self) {
        warn!(
            message = "Processor failed; the records will be retried.",
            lease_key = %self.key,
            first_record = %self.first,
            records = self.records,
            retry = self.retry,
            error = %self.error,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(Metric::DeliveryFailures, self.key, 1.0)]
    }
}

/// Records written to the failure destination and skipped: an ERROR naming each one and
/// where it went, and a count by reason.
pub(crate) struct RecordsDiscarded<'a> {
    pub key: &'a LeaseKey,
    pub discard: &'a Discard,
}

impl Event for RecordsDiscarded<'_> {
    fn log(&self) {
        let discard = self.discard;
        error!(
            message = "Records discarded to the failure destination.",
            lease_key = %self.key,
            reason = discard.reason.as_str(),
            records = %discard.records.join(", "),
            destination = %discard.destination,
            attempts = discard.attempts,
            last_error = discard.error.as_deref().unwrap_or("none"),
        );
    }

    fn samples(&self) -> Vec<Sample> {
        let metric = match self.discard.reason {
            Reason::Retries => Metric::RecordsDiscardedRetries,
            Reason::Age => Metric::RecordsDiscardedAge,
        };
        vec![Sample::shard(
            metric,
            self.key,
            self.discard.records.len() as f64,
        )]
    }
}

/// The failure destination refused a write: nothing was discarded, and the shard waits
/// (its stall is the ERROR; this counts each refusal).
pub(crate) struct DestinationFailed<'a> {
    pub key: &'a LeaseKey,
}

impl Event for DestinationFailed<'_> {
    fn log(&self) {}

    fn samples(&self) -> Vec<Sample> {
        vec![Sample::shard(Metric::DestinationFailures, self.key, 1.0)]
    }
}
