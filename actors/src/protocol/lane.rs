//! What a lane's processor has been handed and not yet checkpointed past, in manual mode
//! with lanes (`processor.parallelism` above 1, `checkpoint.mode = "manual"`).
//!
//! A manual checkpoint says "everything up to here is done". With one processor per
//! shard that is the shard's checkpoint. With lanes, a lane's processor sees only the
//! keys dealt to it, so its checkpoint can only speak for its own records: the records
//! of other lanes before that position may still be in progress. So a lane's
//! checkpoint acks the lane's records up to it, and the shard's checkpoint is the acked
//! prefix across the lanes (the reader's watermark), as in watermark mode. The book is
//! bounded by the reader's window: records not acked keep their place in it.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::shard::{AckToken, Batch};
use crate::model::ExtendedSequenceNumber;

/// The records handed to one lane's processor and not yet checkpointed past, in order.
#[derive(Debug, Default)]
pub(crate) struct LaneBook {
    pending: Mutex<VecDeque<(ExtendedSequenceNumber, AckToken)>>,
}

impl LaneBook {
    /// The lane's processor is handed `batch`.
    pub(crate) fn handed(&self, batch: &Batch) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.extend(batch.iter_with_tokens().map(|(token, record)| {
                (
                    ExtendedSequenceNumber::new(
                        record.sequence_number.clone(),
                        record.sub_sequence_number,
                    ),
                    token,
                )
            }));
        }
    }

    /// The lane's processor checkpointed at `at`: the tokens of its records up to and
    /// including it, taken out of the book (to be acked). A lane's records come in
    /// sequence order, so they are a prefix.
    pub(crate) fn through(&self, at: &ExtendedSequenceNumber) -> Vec<AckToken> {
        let Ok(mut pending) = self.pending.lock() else {
            return Vec::new();
        };
        let done = pending.partition_point(|(position, _)| position <= at);
        pending.drain(..done).map(|(_, token)| token).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;
    use crate::backend::Record;
    use crate::model::{BatchId, SequenceNumber, ShardId};

    fn batch(seqs: &[u64], positions: &[usize]) -> Batch {
        let records: Vec<Record> = seqs
            .iter()
            .map(|seq| Record {
                sequence_number: SequenceNumber::parse(&seq.to_string()).unwrap(),
                sub_sequence_number: 0,
                partition_key: "k".into(),
                explicit_hash_key: None,
                data: bytes::Bytes::new(),
                approximate_arrival: None,
            })
            .collect();
        let now = std::time::Instant::now();
        Batch {
            shard: ShardId::from_index(0),
            id: BatchId(7),
            records: Arc::from(records),
            millis_behind_latest: None,
            fetched_at: now,
            delivered_at: now,
            at_shard_end: false,
            child_shards: Arc::from(Vec::new()),
            _empty_slot: None,
            positions: Some(Arc::from(positions.to_vec())),
        }
    }

    fn esn(seq: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::parse(&seq.to_string()).unwrap(), 0)
    }

    /// A lane's checkpoint acks its own records up to the position, once each, and
    /// nothing past it.
    #[test]
    fn a_lane_checkpoint_takes_its_records_up_to_the_position() {
        let book = LaneBook::default();
        book.handed(&batch(&[10, 30, 50], &[0, 2, 4]));
        let indices = |tokens: Vec<AckToken>| tokens.iter().map(|t| t.index).collect::<Vec<_>>();
        assert_eq!(indices(book.through(&esn(5))), Vec::<usize>::new());
        assert_eq!(indices(book.through(&esn(30))), vec![0, 2]);
        assert_eq!(indices(book.through(&esn(30))), Vec::<usize>::new());
        assert_eq!(indices(book.through(&esn(1000))), vec![4]);
    }
}
