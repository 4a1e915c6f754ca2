//! Everything one reader has delivered and not yet seen acked, as one structure (see
//! [`Ledger`]); the outbox keeps it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::pure::{position_of, record_memory};
use crate::backend::Record;
use crate::model::lanes::lane_of;
use crate::model::{AckError, AckWindow, BatchId, ExtendedSequenceNumber, Watermark};
use crate::status::LaneLag;

/// What a delivered batch costs in memory: its records, plus the batch's own share (the
/// ledger's entry and the `Arc`'s counts, the ack window's per-batch struct and its
/// bitset of one bit per record).
pub(crate) fn batch_memory(records: &[Record]) -> u64 {
    const PER_BATCH: usize = std::mem::size_of::<Entry>() + 2 * std::mem::size_of::<usize>() + 64;
    records.iter().map(record_memory).sum::<u64>()
        + (PER_BATCH + records.len().div_ceil(64) * 8) as u64
}

/// Everything one reader has delivered and not yet seen acked: the ack window (which
/// records are acked, where the contiguous acked prefix ends) and, per batch, the
/// records it maps back to sequence numbers. One structure, so the two can never
/// disagree about which batches are pending.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    window: AckWindow,
    /// The batches from the oldest not yet passed by the watermark to the newest.
    batches: VecDeque<Entry>,
    /// The in-memory size of those batches ([`batch_memory`]): what the shard holds of
    /// the worker's budget. A batch is freed when the watermark passes it, not when it
    /// is acked: until then the ledger keeps its records.
    memory: u64,
}

#[derive(Debug)]
struct Entry {
    id: BatchId,
    records: Arc<[Record]>,
    bytes: u64,
    memory: u64,
    delivered_at: Instant,
}

/// How far an ack moved the shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Acked {
    /// Records the acks covered (counted once each).
    pub records: usize,
    /// For a batch ack: how long the batch took from delivery to ack.
    pub processing_time: Option<Duration>,
    /// The last record of the contiguous acked prefix, when the prefix moved: where
    /// the checkpoint may now be.
    pub checkpointable: Option<ExtendedSequenceNumber>,
    /// Records and bytes of the batches the prefix passed entirely (processed).
    pub processed_records: u64,
    pub processed_bytes: u64,
    /// Acks that named no delivered record (a bug in the caller): ignored, reported.
    pub errors: Vec<AckError>,
}

/// One ack, as the processor sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ack {
    Batch(BatchId),
    Record(BatchId, usize),
}

impl Ledger {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Registers a delivered batch; its id orders it after every earlier one.
    pub(crate) fn deliver(&mut self, records: Arc<[Record]>, bytes: u64, at: Instant) -> BatchId {
        let id = self.window.deliver(records.len(), bytes);
        let memory = batch_memory(&records);
        self.memory += memory;
        self.batches.push_back(Entry {
            id,
            records,
            bytes,
            memory,
            delivered_at: at,
        });
        id
    }

    /// The in-memory size of every batch not yet passed by the watermark.
    pub(crate) fn memory(&self) -> u64 {
        self.memory
    }

    pub(crate) fn in_flight_records(&self) -> usize {
        self.window.in_flight_records()
    }

    pub(crate) fn in_flight_bytes(&self) -> u64 {
        self.window.in_flight_bytes()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// Whether the un-acked records or bytes reach their limit.
    pub(crate) fn is_full(&self, records: u64, bytes: u64) -> bool {
        self.in_flight_records() as u64 >= records || self.in_flight_bytes() >= bytes
    }

    /// Each lane's records not yet acked (`processor.parallelism`), and how long the
    /// oldest has waited since its delivery: a slow lane holds the watermark back, and
    /// this says which. Computed when asked (the status page), never per ack.
    pub(crate) fn lanes(&self, lanes: u16, now: Instant) -> Vec<LaneLag> {
        let mut lags: Vec<LaneLag> = (0..usize::from(lanes))
            .map(|lane| LaneLag {
                lane,
                pending_records: 0,
                oldest_pending_ms: None,
            })
            .collect();
        let Some(first) = self.batches.front().map(|e| e.id.0) else {
            return lags;
        };
        for (id, index) in self.window.pending() {
            let Some(entry) = usize::try_from(id.0 - first)
                .ok()
                .and_then(|slot| self.batches.get(slot))
            else {
                continue;
            };
            let Some(record) = entry.records.get(index) else {
                continue;
            };
            if let Some(lag) = lags.get_mut(lane_of(&record.partition_key, lanes)) {
                lag.pending_records += 1;
                let waited = now
                    .saturating_duration_since(entry.delivered_at)
                    .as_millis() as u64;
                lag.oldest_pending_ms =
                    Some(lag.oldest_pending_ms.map_or(waited, |w| w.max(waited)));
            }
        }
        lags
    }

    /// Applies acks (in any order) and says what moved.
    pub(crate) fn ack(&mut self, acks: impl IntoIterator<Item = Ack>, now: Instant) -> Acked {
        let mut acked = Acked::default();
        let mut moved: Option<Watermark> = None;
        for ack in acks {
            match ack {
                Ack::Batch(id) => {
                    if let Some(entry) = self.batches.iter().find(|e| e.id == id) {
                        acked.records += entry.records.len();
                        acked.processing_time =
                            Some(now.saturating_duration_since(entry.delivered_at));
                    }
                    match self.window.ack_batch(id) {
                        Ok(m) => moved = m.or(moved),
                        Err(error) => acked.errors.push(error),
                    }
                }
                Ack::Record(id, index) => match self.window.ack(id, index) {
                    Ok(m) => {
                        acked.records += 1;
                        moved = m.or(moved);
                    }
                    Err(error) => acked.errors.push(error),
                },
            }
        }
        if let Some(watermark) = moved {
            self.advance(watermark, &mut acked);
        }
        acked
    }

    /// The contiguous acked prefix now ends at `watermark`: drop the batches it passed
    /// entirely, and name the record it ends at.
    fn advance(&mut self, watermark: Watermark, acked: &mut Acked) {
        while let Some(front) = self.batches.front() {
            if front.id < watermark.batch {
                acked.processed_records += front.records.len() as u64;
                acked.processed_bytes += front.bytes;
                acked.checkpointable = front.records.last().map(position_of);
                self.memory -= front.memory;
                self.batches.pop_front();
            } else if front.id == watermark.batch {
                acked.checkpointable = front.records.get(watermark.index).map(position_of);
                if watermark.index + 1 >= front.records.len() {
                    acked.processed_records += front.records.len() as u64;
                    acked.processed_bytes += front.bytes;
                    self.memory -= front.memory;
                    self.batches.pop_front();
                }
                break;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::pure::record_bytes;
    use super::*;
    use crate::model::SequenceNumber;

    fn record(seq: u64, sub: u64) -> Record {
        Record {
            sequence_number: SequenceNumber::parse(&seq.to_string()).unwrap(),
            sub_sequence_number: sub,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::from_static(b"abcd"),
            approximate_arrival: None,
        }
    }

    /// One step of a ledger scenario.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// Deliver a batch of records with these sequence numbers (sub 0).
        Deliver(&'static [u64]),
        AckBatch(u64),
        AckRecord(u64, usize),
        /// Several record acks in one message.
        AckRecords(&'static [(u64, usize)]),
    }

    /// After the step: (records acked, checkpointable sequence, processed records, in
    /// flight records, errors).
    type Expect = (usize, Option<u64>, u64, usize, usize);

    #[test]
    fn ledger_scenarios() {
        use Step::*;
        let table: &[(&str, &[(Step, Expect)])] = &[
            (
                "batch acks in order checkpoint each batch's last record",
                &[
                    (Deliver(&[1, 2]), (0, None, 0, 2, 0)),
                    (Deliver(&[3, 4, 5]), (0, None, 0, 5, 0)),
                    (AckBatch(0), (2, Some(2), 2, 3, 0)),
                    (AckBatch(1), (3, Some(5), 3, 0, 0)),
                ],
            ),
            (
                "a later batch acked first checkpoints nothing until the gap closes",
                &[
                    (Deliver(&[1, 2]), (0, None, 0, 2, 0)),
                    (Deliver(&[3, 4, 5]), (0, None, 0, 5, 0)),
                    (AckBatch(1), (3, None, 0, 2, 0)),
                    (AckBatch(0), (2, Some(5), 5, 0, 0)),
                ],
            ),
            (
                "record acks checkpoint inside a batch without counting it processed",
                &[
                    (Deliver(&[1, 2, 3]), (0, None, 0, 3, 0)),
                    (AckRecord(0, 1), (1, None, 0, 2, 0)),
                    (AckRecord(0, 0), (1, Some(2), 0, 1, 0)),
                    (AckRecord(0, 2), (1, Some(3), 3, 0, 0)),
                ],
            ),
            (
                "several acks in one message move the checkpoint to the furthest",
                &[
                    (Deliver(&[1, 2, 3]), (0, None, 0, 3, 0)),
                    (Deliver(&[4]), (0, None, 0, 4, 0)),
                    (
                        AckRecords(&[(0, 0), (0, 1), (0, 2), (1, 0)]),
                        (4, Some(4), 4, 0, 0),
                    ),
                ],
            ),
            (
                "acks of unknown batches or indexes are errors and move nothing",
                &[
                    (Deliver(&[1]), (0, None, 0, 1, 0)),
                    (AckBatch(7), (0, None, 0, 1, 1)),
                    (AckRecord(0, 3), (0, None, 0, 1, 1)),
                    (AckRecord(0, 0), (1, Some(1), 1, 0, 0)),
                ],
            ),
        ];
        for (name, steps) in table {
            let mut ledger = Ledger::new();
            let t0 = Instant::now();
            for (i, (step, want)) in steps.iter().enumerate() {
                let got = match *step {
                    Deliver(seqs) => {
                        let records: Arc<[Record]> = seqs.iter().map(|s| record(*s, 0)).collect();
                        let bytes = record_bytes(&records);
                        ledger.deliver(records, bytes, t0);
                        Acked::default()
                    }
                    AckBatch(id) => ledger.ack([Ack::Batch(BatchId(id))], t0),
                    AckRecord(id, index) => ledger.ack([Ack::Record(BatchId(id), index)], t0),
                    AckRecords(acks) => ledger.ack(
                        acks.iter()
                            .map(|(id, index)| Ack::Record(BatchId(*id), *index)),
                        t0,
                    ),
                };
                let checkpointable = got
                    .checkpointable
                    .as_ref()
                    .map(|p| p.sequence.to_string().parse::<u64>().unwrap());
                let seen: Expect = (
                    got.records,
                    checkpointable,
                    got.processed_records,
                    ledger.in_flight_records(),
                    got.errors.len(),
                );
                assert_eq!(seen, *want, "{name}, step {i} ({step:?})");
                assert_eq!(
                    got.processed_bytes,
                    got.processed_records * 5,
                    "{name}, step {i}"
                );
            }
        }
    }

    #[test]
    fn the_ledger_holds_a_batch_in_memory_until_the_watermark_passes_it() {
        let mut ledger = Ledger::new();
        let t0 = Instant::now();
        let first: Arc<[Record]> = (1..=2).map(|s| record(s, 0)).collect();
        let second: Arc<[Record]> = (3..=4).map(|s| record(s, 0)).collect();
        let (m1, m2) = (batch_memory(&first), batch_memory(&second));
        let a = ledger.deliver(first, 10, t0);
        let b = ledger.deliver(second, 10, t0);
        assert_eq!(ledger.memory(), m1 + m2);
        // The second batch acked first: still held (the watermark has not passed it).
        ledger.ack([Ack::Batch(b)], t0);
        assert_eq!(ledger.memory(), m1 + m2);
        ledger.ack([Ack::Record(a, 0)], t0);
        assert_eq!(
            ledger.memory(),
            m1 + m2,
            "a batch partly passed stays whole"
        );
        ledger.ack([Ack::Record(a, 1)], t0);
        assert_eq!(ledger.memory(), 0);
    }

    #[test]
    fn ledger_limits_and_processing_time() {
        let mut ledger = Ledger::new();
        let t0 = Instant::now();
        let records: Arc<[Record]> = (1..=4).map(|s| record(s, 0)).collect();
        let id = ledger.deliver(records, 20, t0);
        assert!(ledger.is_full(4, 1_000));
        assert!(ledger.is_full(100, 20));
        assert!(!ledger.is_full(5, 21));
        let acked = ledger.ack([Ack::Batch(id)], t0 + Duration::from_millis(250));
        assert_eq!(acked.processing_time, Some(Duration::from_millis(250)));
        assert!(ledger.is_empty());
        assert!(!ledger.is_full(1, 1));
    }
}
