//! The ack window of one shard reader, and the checkpoint watermark it yields.
//!
//! The reader delivers records in batches, in sequence order; the processor acks them
//! per batch or per record, in any order. A checkpoint must never pass a record that
//! is not acked, or a restart would skip it; so the checkpoint may only advance over
//! the contiguous acked prefix of everything delivered. That prefix ends at the
//! [`Watermark`].
//!
//! The window knows records only as `(BatchId, index)`: the reader keeps the batches
//! and maps a watermark back to a sequence number. Memory is per batch (a struct and a
//! bitset), never per record, and fully acked batches at the head are dropped, so it is
//! bounded by the span of batches from the oldest un-acked one to the newest.

use std::collections::VecDeque;
use std::fmt;

/// Names a delivered batch. Ids are handed out in delivery order, so they order
/// batches as their records order in the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch {}", self.0)
    }
}

/// The last record of the contiguous acked prefix: everything up to and including it
/// is acked, so the reader may checkpoint at its sequence number.
///
/// Ordered as the records are (by batch, then index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watermark {
    /// The batch the record was delivered in.
    pub batch: BatchId,
    /// The record's position in that batch, from 0.
    pub index: usize,
}

impl fmt::Display for Watermark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} record {}", self.batch, self.index)
    }
}

/// An ack that names no delivered record. Both mean a bug in the caller (a batch id
/// from another window, or an index past the batch), never a race.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// The batch id was never handed out by this window.
    #[error("ack of {0}, which was never delivered")]
    UnknownBatch(BatchId),
    /// The batch exists, but has no record at `index`.
    #[error("ack of {batch} record {index}, but the batch has {len} records")]
    IndexOutOfRange {
        /// The batch acked.
        batch: BatchId,
        /// The record index the ack named.
        index: usize,
        /// How many records the batch has.
        len: usize,
    },
}

/// The records one shard reader has delivered and not yet seen acked.
///
/// ```
/// use flotilla_actors::model::{AckWindow, BatchId, Watermark};
///
/// let mut window = AckWindow::new();
/// let first = window.deliver(3, 300);
/// let second = window.deliver(2, 200);
/// // Acks out of order: nothing is checkpointable while record 0 is pending.
/// assert_eq!(window.ack(first, 2)?, None);
/// assert_eq!(window.ack_batch(second)?, None);
/// assert_eq!(window.ack(first, 0)?, Some(Watermark { batch: first, index: 0 }));
/// // Acking record 1 closes the gap: the watermark jumps over both batches.
/// assert_eq!(window.ack(first, 1)?, Some(Watermark { batch: second, index: 1 }));
/// assert!(window.is_empty());
/// # Ok::<(), flotilla_actors::model::AckError>(())
/// ```
#[derive(Debug, Default)]
pub struct AckWindow {
    /// Batches from the oldest one with an un-acked record to the newest delivered.
    /// Invariant: the front (if any) has an un-acked record; ids are contiguous.
    batches: VecDeque<Batch>,
    /// Id of `batches[0]`; when `batches` is empty, the id the next batch gets.
    base: u64,
    watermark: Option<Watermark>,
    in_flight_records: usize,
    in_flight_bytes: u64,
}

#[derive(Debug)]
struct Batch {
    len: usize,
    bytes: u64,
    acked_count: usize,
    /// One bit per record; freed once the batch is fully acked.
    acked: Box<[u64]>,
    /// Leading records known acked. Only kept up to date for the front batch.
    prefix: usize,
}

impl Batch {
    fn new(len: usize, bytes: u64) -> Self {
        Self {
            len,
            bytes,
            acked_count: 0,
            acked: vec![0; len.div_ceil(64)].into_boxed_slice(),
            prefix: 0,
        }
    }

    fn is_full(&self) -> bool {
        self.acked_count == self.len
    }

    fn is_acked(&self, index: usize) -> bool {
        self.is_full() || self.acked[index / 64] & (1 << (index % 64)) != 0
    }

    /// Extends `prefix` over the acked run that follows it, a word at a time.
    fn scan_prefix(&mut self) {
        if self.is_full() {
            self.prefix = self.len;
            return;
        }
        let mut at = self.prefix;
        while at < self.len {
            let offset = at % 64;
            // Shifting brings in zeros, so the run never counts bits past this word.
            let run = (self.acked[at / 64] >> offset).trailing_ones() as usize;
            at += run;
            if run < 64 - offset {
                break;
            }
        }
        // Bits past `len` are never set, so `at` cannot pass it; `min` is belt and braces.
        self.prefix = at.min(self.len);
    }
}

impl AckWindow {
    /// An empty window: nothing delivered, no watermark; the first batch gets id 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a delivered batch of `len` records totalling `bytes`; ids increase by
    /// one per call. An empty batch is born acked: it holds no record to checkpoint.
    pub fn deliver(&mut self, len: usize, bytes: u64) -> BatchId {
        let id = BatchId(self.base + self.batches.len() as u64);
        let batch = Batch::new(len, bytes);
        if batch.is_full() {
            if self.batches.is_empty() {
                // Nothing pending before it: it is passed at once.
                self.base += 1;
            } else {
                self.batches.push_back(batch);
            }
        } else {
            self.in_flight_records += len;
            self.in_flight_bytes += bytes;
            self.batches.push_back(batch);
        }
        id
    }

    /// Acks every record of a batch. Returns the new watermark if it moved.
    ///
    /// A batch the watermark has already passed is `Ok(None)`: acks are idempotent.
    pub fn ack_batch(&mut self, id: BatchId) -> Result<Option<Watermark>, AckError> {
        let Some(slot) = self.slot(id)? else {
            return Ok(None);
        };
        let batch = &mut self.batches[slot];
        if batch.is_full() {
            return Ok(None);
        }
        self.in_flight_records -= batch.len - batch.acked_count;
        self.in_flight_bytes -= batch.bytes;
        batch.acked_count = batch.len;
        batch.acked = Box::default();
        Ok(if slot == 0 { self.advance() } else { None })
    }

    /// Acks one record. Idempotent. Returns the new watermark if it moved.
    ///
    /// A record of a batch the watermark has already passed is `Ok(None)`, whatever its
    /// index: the batch is gone and its length with it.
    pub fn ack(&mut self, id: BatchId, index: usize) -> Result<Option<Watermark>, AckError> {
        let Some(slot) = self.slot(id)? else {
            return Ok(None);
        };
        let batch = &mut self.batches[slot];
        if index >= batch.len {
            return Err(AckError::IndexOutOfRange {
                batch: id,
                index,
                len: batch.len,
            });
        }
        if batch.is_acked(index) {
            return Ok(None);
        }
        batch.acked[index / 64] |= 1 << (index % 64);
        batch.acked_count += 1;
        self.in_flight_records -= 1;
        if batch.is_full() {
            self.in_flight_bytes -= batch.bytes;
            batch.acked = Box::default();
        }
        // Only an ack that extends the front batch's prefix can move the watermark.
        let extends_prefix = slot == 0 && index == batch.prefix;
        Ok(if extends_prefix { self.advance() } else { None })
    }

    /// Records delivered and not acked (acked records behind a gap do not count).
    pub fn in_flight_records(&self) -> usize {
        self.in_flight_records
    }

    /// Bytes of the batches with an un-acked record. A partly acked batch counts in
    /// full: the window keeps no per-record sizes.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// The records delivered and not acked, in order, as `(batch, index)`: what holds
    /// the watermark back, for a view of who holds it (each lane's lag).
    pub fn pending(&self) -> impl Iterator<Item = (BatchId, usize)> + '_ {
        self.batches
            .iter()
            .enumerate()
            .filter(|(_, batch)| !batch.is_full())
            .flat_map(move |(slot, batch)| {
                let id = BatchId(self.base + slot as u64);
                (0..batch.len)
                    .filter(|&index| !batch.is_acked(index))
                    .map(move |index| (id, index))
            })
    }

    /// Every delivered record is acked: the watermark is at the last delivered record.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// The last record of the contiguous acked prefix of everything ever delivered;
    /// `None` until the very first record is acked.
    pub fn watermark(&self) -> Option<Watermark> {
        self.watermark
    }

    /// Where `id` sits in `batches`: `Ok(None)` if the watermark has passed it.
    fn slot(&self, id: BatchId) -> Result<Option<usize>, AckError> {
        if id.0 < self.base {
            return Ok(None);
        }
        let slot = id.0 - self.base;
        match usize::try_from(slot) {
            Ok(slot) if slot < self.batches.len() => Ok(Some(slot)),
            _ => Err(AckError::UnknownBatch(id)),
        }
    }

    /// Moves the watermark over the acked prefix, dropping the batches it passes whole.
    fn advance(&mut self) -> Option<Watermark> {
        let before = self.watermark;
        while let Some(front) = self.batches.front_mut() {
            front.scan_prefix();
            if front.prefix > 0 {
                self.watermark = Some(Watermark {
                    batch: BatchId(self.base),
                    index: front.prefix - 1,
                });
            }
            if !front.is_full() {
                break;
            }
            self.batches.pop_front();
            self.base += 1;
        }
        // The watermark only moves forward, so any change is a move.
        self.watermark.filter(|_| self.watermark != before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn wm(batch: u64, index: usize) -> Option<Watermark> {
        Some(Watermark {
            batch: BatchId(batch),
            index,
        })
    }

    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// Deliver a batch of this many records (bytes: 10 per record).
        Deliver(usize),
        Ack(u64, usize),
        AckBatch(u64),
    }
    use Step::{Ack, AckBatch, Deliver};

    /// Each row: steps, and after each step what it returned and the window's
    /// (watermark, in-flight records, in-flight bytes).
    type Expect = (
        Result<Option<Watermark>, AckError>,
        Option<Watermark>,
        usize,
        u64,
    );

    fn run(name: &str, steps: &[(Step, Expect)]) {
        let mut window = AckWindow::new();
        for (n, (step, (returned, watermark, records, bytes))) in steps.iter().enumerate() {
            let got = match *step {
                Deliver(len) => {
                    window.deliver(len, 10 * len as u64);
                    Ok(None)
                }
                Ack(batch, index) => window.ack(BatchId(batch), index),
                AckBatch(batch) => window.ack_batch(BatchId(batch)),
            };
            let at = format!("{name}, step {n} {step:?}");
            assert_eq!(&got, returned, "{at}: returned");
            assert_eq!(window.watermark(), *watermark, "{at}: watermark");
            assert_eq!(window.in_flight_records(), *records, "{at}: records");
            assert_eq!(window.in_flight_bytes(), *bytes, "{at}: bytes");
            assert_eq!(window.is_empty(), *records == 0, "{at}: is_empty");
        }
    }

    #[test]
    fn scenarios() {
        let table: &[(&str, &[(Step, Expect)])] = &[
            (
                "batch acks in order",
                &[
                    (Deliver(2), (Ok(None), None, 2, 20)),
                    (Deliver(3), (Ok(None), None, 5, 50)),
                    (AckBatch(0), (Ok(wm(0, 1)), wm(0, 1), 3, 30)),
                    (AckBatch(1), (Ok(wm(1, 2)), wm(1, 2), 0, 0)),
                ],
            ),
            (
                "batch acks out of order",
                &[
                    (Deliver(2), (Ok(None), None, 2, 20)),
                    (Deliver(3), (Ok(None), None, 5, 50)),
                    (AckBatch(1), (Ok(None), None, 2, 20)),
                    (AckBatch(0), (Ok(wm(1, 2)), wm(1, 2), 0, 0)),
                ],
            ),
            (
                "record acks out of order",
                &[
                    (Deliver(3), (Ok(None), None, 3, 30)),
                    (Ack(0, 2), (Ok(None), None, 2, 30)),
                    (Ack(0, 1), (Ok(None), None, 1, 30)),
                    (Ack(0, 0), (Ok(wm(0, 2)), wm(0, 2), 0, 0)),
                ],
            ),
            (
                "a gap holds the watermark, closing it jumps batches",
                &[
                    (Deliver(2), (Ok(None), None, 2, 20)),
                    (Deliver(2), (Ok(None), None, 4, 40)),
                    (Deliver(2), (Ok(None), None, 6, 60)),
                    (Ack(0, 0), (Ok(wm(0, 0)), wm(0, 0), 5, 60)),
                    (AckBatch(1), (Ok(None), wm(0, 0), 3, 40)),
                    (Ack(2, 0), (Ok(None), wm(0, 0), 2, 40)),
                    (Ack(0, 1), (Ok(wm(2, 0)), wm(2, 0), 1, 20)),
                    (Ack(2, 1), (Ok(wm(2, 1)), wm(2, 1), 0, 0)),
                ],
            ),
            (
                "duplicates are idempotent",
                &[
                    (Deliver(3), (Ok(None), None, 3, 30)),
                    (Ack(0, 1), (Ok(None), None, 2, 30)),
                    (Ack(0, 1), (Ok(None), None, 2, 30)),
                    (Ack(0, 0), (Ok(wm(0, 1)), wm(0, 1), 1, 30)),
                    (Ack(0, 0), (Ok(None), wm(0, 1), 1, 30)),
                    (AckBatch(0), (Ok(wm(0, 2)), wm(0, 2), 0, 0)),
                    // The batch is passed and dropped: acks of it are no-ops.
                    (AckBatch(0), (Ok(None), wm(0, 2), 0, 0)),
                    (Ack(0, 2), (Ok(None), wm(0, 2), 0, 0)),
                ],
            ),
            (
                "a fully acked batch behind a gap takes duplicate acks",
                &[
                    (Deliver(1), (Ok(None), None, 1, 10)),
                    (Deliver(2), (Ok(None), None, 3, 30)),
                    (AckBatch(1), (Ok(None), None, 1, 10)),
                    (Ack(1, 1), (Ok(None), None, 1, 10)),
                    (AckBatch(1), (Ok(None), None, 1, 10)),
                    (
                        Ack(1, 2),
                        (
                            Err(AckError::IndexOutOfRange {
                                batch: BatchId(1),
                                index: 2,
                                len: 2,
                            }),
                            None,
                            1,
                            10,
                        ),
                    ),
                    (Ack(0, 0), (Ok(wm(1, 1)), wm(1, 1), 0, 0)),
                ],
            ),
            (
                "unknown batch and out-of-range index",
                &[
                    (
                        AckBatch(0),
                        (Err(AckError::UnknownBatch(BatchId(0))), None, 0, 0),
                    ),
                    (Deliver(2), (Ok(None), None, 2, 20)),
                    (
                        Ack(1, 0),
                        (Err(AckError::UnknownBatch(BatchId(1))), None, 2, 20),
                    ),
                    (
                        Ack(0, 2),
                        (
                            Err(AckError::IndexOutOfRange {
                                batch: BatchId(0),
                                index: 2,
                                len: 2,
                            }),
                            None,
                            2,
                            20,
                        ),
                    ),
                    (
                        Ack(u64::MAX, 0),
                        (Err(AckError::UnknownBatch(BatchId(u64::MAX))), None, 2, 20),
                    ),
                ],
            ),
            (
                "empty batches are born acked",
                &[
                    (Deliver(0), (Ok(None), None, 0, 0)),
                    (Deliver(1), (Ok(None), None, 1, 10)),
                    (Deliver(0), (Ok(None), None, 1, 10)),
                    (Deliver(1), (Ok(None), None, 2, 20)),
                    (AckBatch(2), (Ok(None), None, 2, 20)),
                    (AckBatch(3), (Ok(None), None, 1, 10)),
                    (Ack(1, 0), (Ok(wm(3, 0)), wm(3, 0), 0, 0)),
                    (AckBatch(0), (Ok(None), wm(3, 0), 0, 0)),
                ],
            ),
            (
                "runs across bitset words",
                &[
                    (Deliver(130), (Ok(None), None, 130, 1300)),
                    (AckBatch(0), (Ok(wm(0, 129)), wm(0, 129), 0, 0)),
                    (Deliver(130), (Ok(None), wm(0, 129), 130, 1300)),
                    (Ack(1, 64), (Ok(None), wm(0, 129), 129, 1300)),
                    (Ack(1, 63), (Ok(None), wm(0, 129), 128, 1300)),
                    (Ack(1, 0), (Ok(wm(1, 0)), wm(1, 0), 127, 1300)),
                ],
            ),
        ];
        for (name, steps) in table {
            run(name, steps);
        }
    }

    #[test]
    fn prefix_scan_crosses_words() {
        let mut window = AckWindow::new();
        let id = window.deliver(200, 0);
        for index in 1..200 {
            assert_eq!(window.ack(id, index), Ok(None));
        }
        assert_eq!(window.ack(id, 0), Ok(wm(0, 199)));
        assert!(window.is_empty());
    }

    #[test]
    fn passed_batches_are_dropped() {
        let mut window = AckWindow::new();
        for _ in 0..1000 {
            let id = window.deliver(5, 50);
            window.deliver(5, 50);
            assert_eq!(window.ack_batch(BatchId(id.0 + 1)), Ok(None));
            assert_eq!(window.ack_batch(id).map(|w| w.is_some()), Ok(true));
        }
        assert!(window.batches.is_empty());
        assert_eq!(window.watermark(), wm(1999, 4));
        assert_eq!(window.deliver(1, 1), BatchId(2000));
    }

    /// The window as a list of per-record flags: obviously right, and slow.
    #[derive(Debug, Default)]
    struct Model {
        batches: Vec<(Vec<bool>, u64)>,
    }

    impl Model {
        fn watermark(&self) -> Option<Watermark> {
            let mut last = None;
            for (b, (flags, _)) in self.batches.iter().enumerate() {
                for (i, acked) in flags.iter().enumerate() {
                    if !acked {
                        return last;
                    }
                    last = wm(b as u64, i);
                }
            }
            last
        }

        fn in_flight_records(&self) -> usize {
            let flags = self.batches.iter().flat_map(|(f, _)| f);
            flags.filter(|acked| !**acked).count()
        }

        fn in_flight_bytes(&self) -> u64 {
            let pending = self.batches.iter().filter(|(f, _)| f.contains(&false));
            pending.map(|(_, bytes)| bytes).sum()
        }

        fn last_record(&self) -> Option<Watermark> {
            let (b, (flags, _)) = self
                .batches
                .iter()
                .enumerate()
                .rfind(|(_, (f, _))| !f.is_empty())?;
            wm(b as u64, flags.len() - 1)
        }
    }

    /// Checks the window against the model after an ack that returned `returned`.
    fn check(
        window: &AckWindow,
        model: &Model,
        before: Option<Watermark>,
        returned: Option<Watermark>,
    ) -> Result<(), TestCaseError> {
        let now = window.watermark();
        prop_assert_eq!(now, model.watermark(), "watermark");
        prop_assert!(
            now >= before,
            "watermark went back from {:?} to {:?}",
            before,
            now
        );
        prop_assert_eq!(returned, now.filter(|_| now != before), "returned");
        // Never past an un-acked record: everything up to the watermark is acked.
        if let Some(w) = now {
            for (b, (flags, _)) in model
                .batches
                .iter()
                .enumerate()
                .take(w.batch.0 as usize + 1)
            {
                let upto = if b as u64 == w.batch.0 {
                    w.index + 1
                } else {
                    flags.len()
                };
                prop_assert!(
                    flags[..upto].iter().all(|a| *a),
                    "watermark {} passes a gap",
                    w
                );
            }
        }
        prop_assert_eq!(window.in_flight_records(), model.in_flight_records());
        prop_assert_eq!(window.in_flight_bytes(), model.in_flight_bytes());
        prop_assert_eq!(window.is_empty(), model.in_flight_records() == 0);
        // Memory: nothing is kept before the oldest batch with an un-acked record.
        let oldest = model.batches.iter().position(|(f, _)| f.contains(&false));
        let kept = oldest.map_or(0, |o| model.batches.len() - o);
        prop_assert_eq!(window.batches.len(), kept);
        Ok(())
    }

    #[derive(Debug, Clone)]
    enum Op {
        Deliver(usize, u64),
        /// Picks among delivered batches and records by modulo.
        Ack(usize, usize),
        AckBatch(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0usize..140, 0u64..10_000).prop_map(|(l, b)| Op::Deliver(l, b)),
            6 => (any::<usize>(), any::<usize>()).prop_map(|(b, i)| Op::Ack(b, i)),
            1 => any::<usize>().prop_map(Op::AckBatch),
        ]
    }

    /// Batches of records, then every record in a random order.
    fn deliveries_and_order() -> impl Strategy<Value = (Vec<usize>, Vec<(usize, usize)>)> {
        prop::collection::vec(1usize..100, 1..12).prop_flat_map(|lens| {
            let records: Vec<(usize, usize)> = lens
                .iter()
                .enumerate()
                .flat_map(|(b, len)| (0..*len).map(move |i| (b, i)))
                .collect();
            (Just(lens), Just(records).prop_shuffle())
        })
    }

    proptest! {
        #[test]
        fn random_acks_match_the_model(ops in prop::collection::vec(op(), 1..200)) {
            let mut window = AckWindow::new();
            let mut model = Model::default();
            for op in ops {
                let before = window.watermark();
                let returned = match op {
                    Op::Deliver(len, bytes) => {
                        let id = window.deliver(len, bytes);
                        prop_assert_eq!(id, BatchId(model.batches.len() as u64));
                        model.batches.push((vec![false; len], bytes));
                        None
                    }
                    Op::Ack(_, _) | Op::AckBatch(_) if model.batches.is_empty() => continue,
                    Op::Ack(b, i) => {
                        let b = b % model.batches.len();
                        let flags = &mut model.batches[b].0;
                        if flags.is_empty() {
                            continue;
                        }
                        let i = i % flags.len();
                        flags[i] = true;
                        window.ack(BatchId(b as u64), i)?
                    }
                    Op::AckBatch(b) => {
                        let b = b % model.batches.len();
                        model.batches[b].0.fill(true);
                        window.ack_batch(BatchId(b as u64))?
                    }
                };
                check(&window, &model, before, returned)?;
            }
            let next = model.batches.len() as u64;
            prop_assert_eq!(window.ack_batch(BatchId(next)), Err(AckError::UnknownBatch(BatchId(next))));
        }

        #[test]
        fn any_ack_order_reaches_the_last_record((lens, order) in deliveries_and_order()) {
            let mut window = AckWindow::new();
            let mut model = Model::default();
            for len in &lens {
                window.deliver(*len, 7);
                model.batches.push((vec![false; *len], 7));
            }
            for (b, i) in order {
                let before = window.watermark();
                model.batches[b].0[i] = true;
                let returned = window.ack(BatchId(b as u64), i)?;
                check(&window, &model, before, returned)?;
                // A second ack of the same record changes nothing.
                prop_assert_eq!(window.ack(BatchId(b as u64), i), Ok(None));
            }
            prop_assert!(window.is_empty());
            prop_assert_eq!(window.watermark(), model.last_record());
        }
    }
}
