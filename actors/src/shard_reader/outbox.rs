//! What the reader has handed its processor and not yet seen acked, and where reading
//! resumes: the ledger, the reader's place in the worker's memory budget, the slot of
//! the empty batch (`reader.call_on_empty`), the positions (delivered, skipped, the
//! checkpoint the reader knows of) and the rules a processor's manual and prepared
//! checkpoints are held to.
//!
//! No actor, no channel, no clock read: time comes in as a parameter, and what a
//! delivery makes (the batch and its counts) goes back to the caller, which sends it.
//! So every rule here is tested with plain values.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use super::ledger::{Ack, Acked, Ledger};
use super::pure::{self, Phase, Refusal};
use crate::backend::{ChildShard, IteratorPosition, Record};
use crate::model::RecordFilter;
use crate::model::{
    BatchId, BudgetSlot, Checkpoint, ExtendedSequenceNumber, HashKeyRange, ShardId,
};
use crate::protocol::{AckToken, Acks, Batch, CheckpointError};
use crate::settings::{CheckpointMode, ReaderSettings};

/// What the read that brought a batch said beside its records.
pub(super) struct ReadFacts<'a> {
    pub fetched_at: Instant,
    /// The shard ended with this read, and the children it named.
    pub end: Option<&'a [ChildShard]>,
}

/// A batch to send, and what it counts for.
pub(super) struct Delivery {
    pub batch: Batch,
    pub records: u64,
    pub bytes: u64,
    /// When the batch's first (oldest) record reached the stream, for put → delivery.
    pub first_arrival: Option<SystemTime>,
    /// The records of the read that matched no `processor.filter` pattern: left out of
    /// `batch`, to be acked at once. When it holds every record, `batch` is empty and
    /// there is no call.
    pub filtered: Vec<AckToken>,
}

impl Delivery {
    /// Whether the processor is called with `batch`: not when a filter left nothing of
    /// a read that brought records.
    pub fn calls(&self) -> bool {
        !(self.batch.is_empty() && self.records > 0)
    }
}

/// The records of `batch` that `keep` lets through, as a batch with their own ack
/// tokens ([`Batch::pick`]), and the tokens of the others (acked without a call). The
/// batch as it is when every record is kept.
fn let_through(batch: Batch, keep: impl Fn(&Record) -> bool) -> (Batch, Vec<AckToken>) {
    let (mut kept, mut left) = (Vec::new(), Vec::new());
    for (index, record) in batch.records().iter().enumerate() {
        if keep(record) {
            kept.push(index);
        } else {
            left.push(batch.ack_token(index));
        }
    }
    if left.is_empty() {
        return (batch, left);
    }
    (batch.pick(&kept), left)
}

/// The ids of the children a shard's end named (none if it named none), for its last
/// batch and its SHARD_END checkpoint.
pub(super) fn child_ids<C: FromIterator<ShardId>>(end: Option<&[ChildShard]>) -> C {
    end.unwrap_or(&[]).iter().map(|c| c.id.clone()).collect()
}

pub(super) struct Outbox {
    shard: ShardId,
    mode: CheckpointMode,
    /// What has been delivered and not yet seen acked.
    ledger: Ledger,
    /// This reader's place in the worker's memory budget; dropping it returns the bytes.
    budget: BudgetSlot,
    /// Held by the empty batch on its way to the processor (`reader.call_on_empty`);
    /// shared with nobody when none is.
    empty_slot: Arc<()>,
    /// In-memory bytes per record of the last batch: a read's `Limit` is its grant over
    /// this.
    record_memory: u64,
    /// The last read brought records: the shard has a backlog (for the budget).
    wants_more: bool,
    /// When the processor last made progress (or the window last became non-empty).
    last_progress: Instant,
    start_position: Option<IteratorPosition>,
    /// After a restart inside an aggregate: records at or before this were processed.
    skip_through: Option<ExtendedSequenceNumber>,
    last_delivered: Option<ExtendedSequenceNumber>,
    /// The checkpoint as this reader knows it (read at start, then what it sent).
    checkpoint: Option<Checkpoint>,
    /// The lease's hash keys.
    range: Option<HashKeyRange>,
    throughput: Throughput,
    /// `processor.filter`, parsed; `None` hands every record over.
    filter: Option<Arc<RecordFilter>>,
}

impl Outbox {
    pub fn new(shard: ShardId, mode: CheckpointMode, budget: BudgetSlot, now: Instant) -> Self {
        Self {
            shard,
            mode,
            ledger: Ledger::new(),
            budget,
            empty_slot: Arc::new(()),
            record_memory: pure::FIRST_GUESS_RECORD_MEMORY,
            wants_more: false,
            last_progress: now,
            start_position: None,
            skip_through: None,
            last_delivered: None,
            checkpoint: None,
            range: None,
            throughput: Throughput::new(now),
            filter: None,
        }
    }

    /// Hands over only the records `filter` lets through; the others are acked unseen.
    pub fn filter(mut self, filter: Option<Arc<RecordFilter>>) -> Self {
        self.filter = filter;
        self
    }

    /// Reading starts from `checkpoint`: at `position`, skipping through `skip`, keeping
    /// the records of `range` (the lease's hash keys: a de-aggregated KPL record outside
    /// it belongs to a sibling after a reshard).
    pub fn begin(
        &mut self,
        checkpoint: Checkpoint,
        position: IteratorPosition,
        skip: Option<ExtendedSequenceNumber>,
        range: Option<HashKeyRange>,
        now: Instant,
    ) {
        self.range = range;
        self.checkpoint = Some(checkpoint);
        self.start_position = Some(position);
        self.skip_through = skip;
        self.last_progress = now;
    }

    /// The checkpoint was trimmed away and the settings say go on: from the oldest
    /// change kept, forgetting what was delivered (it is gone from the stream).
    pub fn restart_at_trim_horizon(&mut self) {
        self.last_delivered = None;
        self.skip_through = None;
        self.start_position = Some(IteratorPosition::TrimHorizon);
    }

    /// Where a GetShardIterator resumes ([`pure::iterator_position`]).
    pub fn iterator_position(&self) -> Option<IteratorPosition> {
        pure::iterator_position(self.last_delivered.as_ref(), self.start_position.as_ref())
    }

    pub fn last_delivered(&self) -> Option<&ExtendedSequenceNumber> {
        self.last_delivered.as_ref()
    }

    pub fn start_position(&self) -> Option<&IteratorPosition> {
        self.start_position.as_ref()
    }

    pub fn skip_through(&self) -> Option<&ExtendedSequenceNumber> {
        self.skip_through.as_ref()
    }

    /// A subscription resumes inside an aggregate: its records through `skip` are done.
    pub fn skip_to(&mut self, skip: ExtendedSequenceNumber) {
        self.skip_through = Some(skip);
    }

    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// The shard's SHARD_END checkpoint is written.
    pub fn shard_end_written(&mut self) {
        self.checkpoint = Some(Checkpoint::ShardEnd);
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn budget(&self) -> &BudgetSlot {
        &self.budget
    }

    pub fn record_memory(&self) -> u64 {
        self.record_memory
    }

    /// The processor is at work (the failure policy retries or discards its batch):
    /// progress for the watchdog, though nothing was acked.
    pub fn progressed(&mut self, now: Instant) {
        self.last_progress = now;
    }

    pub fn since_progress(&self, now: Instant) -> std::time::Duration {
        now.saturating_duration_since(self.last_progress)
    }

    pub fn throughput(&self) -> &Throughput {
        &self.throughput
    }

    pub fn window_full(&self, reader: &ReaderSettings) -> bool {
        self.ledger
            .is_full(u64::from(reader.window_records), reader.window_bytes)
    }

    /// Nothing of this shard is in memory: it may read even with no grant (else it
    /// could wait forever for room others hold). `held` is what a fan-out event holds
    /// not yet delivered.
    pub fn holds_nothing(&self, held_nothing: bool) -> bool {
        self.ledger.memory() == 0 && held_nothing
    }

    /// Tells the worker's budget what this shard holds in memory now (its ledger and
    /// `held`, a fan-out event's records not yet delivered), ending any reservation.
    pub fn settle(&self, held: u64) {
        self.budget
            .settle(self.ledger.memory() + held, self.wants_more);
    }

    /// A read answered with `incoming` bytes of records: the grant becomes exactly that
    /// (before any other reader asks); the delivery settles again with what is kept.
    pub fn read_answered(&mut self, got_records: bool, incoming: u64, held: u64) {
        self.wants_more = got_records;
        self.budget
            .settle(self.ledger.memory() + held + incoming, self.wants_more);
    }

    /// A fan-out event arrived: whether it brought records (a backlog).
    pub fn wants_more(&mut self, wants: bool) {
        self.wants_more = wants;
    }

    /// De-aggregates, drops what a checkpoint inside an aggregate already covers, and
    /// makes one batch for the processor; an empty one only as `reader.call_on_empty`
    /// asks ([`pure::call_on_empty`]). `held` is settled with the budget.
    pub fn deliver(
        &mut self,
        raw: Vec<Record>,
        facts: ReadFacts<'_>,
        call_on_empty: bool,
        millis_behind_latest: Option<u64>,
        held: u64,
        now: Instant,
    ) -> Option<Delivery> {
        let read_nothing = raw.is_empty();
        let records = pure::fresh_records(raw, self.range.as_ref(), &mut self.skip_through);
        let Some(last) = records.last() else {
            if !read_nothing {
                // All skipped: what the read brought is not kept.
                self.settle(held);
            }
            let waiting = Arc::strong_count(&self.empty_slot) > 1;
            if !pure::call_on_empty(call_on_empty, waiting) {
                return None;
            }
            return Some(Delivery {
                batch: Batch {
                    shard: self.shard.clone(),
                    // No real batch has this id: an ack of it (there should be none,
                    // `ack_batch` skips empty batches) acks nothing.
                    id: BatchId(u64::MAX),
                    records: Arc::from(Vec::new()),
                    millis_behind_latest,
                    fetched_at: facts.fetched_at.into_std(),
                    delivered_at: now.into_std(),
                    at_shard_end: facts.end.is_some(),
                    child_shards: child_ids(facts.end),
                    positions: None,
                    _empty_slot: Some(self.empty_slot.clone()),
                },
                records: 0,
                bytes: 0,
                first_arrival: None,
                filtered: Vec::new(),
            });
        };
        self.last_delivered = Some(pure::position_of(last));
        let first_arrival = records.first().and_then(|r| r.approximate_arrival);
        let bytes = pure::record_bytes(&records);
        let len = records.len();
        if self.ledger.is_empty() {
            self.last_progress = now;
        }
        let records: Arc<[Record]> = Arc::from(records);
        let before = self.ledger.memory();
        let id = self.ledger.deliver(records.clone(), bytes, now);
        self.record_memory = ((self.ledger.memory() - before) / len as u64).max(1);
        self.settle(held);
        self.throughput.add(len as u64, bytes, now);
        let batch = Batch {
            shard: self.shard.clone(),
            id,
            records,
            millis_behind_latest,
            fetched_at: facts.fetched_at.into_std(),
            delivered_at: now.into_std(),
            at_shard_end: facts.end.is_some(),
            child_shards: child_ids(facts.end),
            positions: None,
            _empty_slot: None,
        };
        let (batch, filtered) = match &self.filter {
            Some(filter) => let_through(batch, |record| {
                filter.matches(&record.partition_key, &record.data)
            }),
            None => (batch, Vec::new()),
        };
        Some(Delivery {
            batch,
            records: len as u64,
            bytes,
            first_arrival,
            filtered,
        })
    }

    /// Counts the processor's acks; `held` is settled with the budget. What the reader
    /// checkpoints (in the modes where it checkpoints the acked prefix) is in
    /// `checkpointable`, and is the checkpoint it knows of from now on.
    pub fn ack(&mut self, acks: Acks, held: u64, now: Instant) -> Acked {
        let mut acked = match acks {
            Acks::Batch(id) => self.ledger.ack([Ack::Batch(id)], now),
            Acks::Records(tokens) => self
                .ledger
                .ack(tokens.iter().map(|t| Ack::Record(t.batch, t.index)), now),
        };
        self.settle(held);
        if acked.records > 0 {
            self.last_progress = now;
        }
        if !self.mode.reader_checkpoints_acked_prefix() {
            acked.checkpointable = None;
        }
        if let Some(at) = &acked.checkpointable {
            self.advanced(at.clone());
        }
        acked
    }

    /// The reader asked the writer to checkpoint `at`.
    fn advanced(&mut self, at: ExtendedSequenceNumber) {
        self.checkpoint = Some(Checkpoint::At(at));
    }

    /// `Checkpointer::checkpoint(at)` by the processor: `Ok` if `at` may be written (and
    /// is the checkpoint the reader knows of from now on).
    pub fn manual(
        &mut self,
        phase: Phase,
        at: &ExtendedSequenceNumber,
    ) -> Result<(), CheckpointError> {
        match pure::manual_checkpoint(phase, at, self.last_delivered.as_ref()) {
            Ok(()) => {
                self.advanced(at.clone());
                Ok(())
            }
            Err(refusal) => Err(self.refused(refusal, at.clone())),
        }
    }

    /// `Checkpointer::prepare_checkpoint(at)`: `Ok` if it may be prepared.
    pub fn prepare(
        &self,
        phase: Phase,
        at: &ExtendedSequenceNumber,
    ) -> Result<(), CheckpointError> {
        pure::prepare_checkpoint(
            self.mode,
            phase,
            at,
            self.last_delivered.as_ref(),
            self.checkpoint.as_ref(),
        )
        .map_err(|refusal| self.refused(refusal, at.clone()))
    }

    /// `PreparedCheckpoint::checkpoint()`: `Ok` if the prepared `at` may be committed
    /// (the manual rules), which becomes the known checkpoint unless one past it is.
    pub fn commit(
        &mut self,
        phase: Phase,
        at: &ExtendedSequenceNumber,
    ) -> Result<(), CheckpointError> {
        if let Err(refusal) = pure::manual_checkpoint(phase, at, self.last_delivered.as_ref()) {
            return Err(self.refused(refusal, at.clone()));
        }
        if !matches!(&self.checkpoint, Some(Checkpoint::At(done)) if done >= at) {
            self.advanced(at.clone());
        }
        Ok(())
    }

    /// The error a processor is given for a refused checkpoint.
    fn refused(&self, refusal: Refusal, requested: ExtendedSequenceNumber) -> CheckpointError {
        let shard = self.shard.clone();
        match refusal {
            Refusal::LeaseLost => CheckpointError::LeaseLost { shard },
            Refusal::BeyondDelivered => CheckpointError::BeyondDelivered {
                shard,
                requested,
                last: self
                    .last_delivered
                    .as_ref()
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "none".to_owned()),
            },
            Refusal::BeforeCheckpoint => CheckpointError::BeforeCheckpoint {
                shard,
                requested,
                checkpoint: self
                    .checkpoint
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "none".to_owned()),
            },
            Refusal::NotManual => CheckpointError::PrepareNeedsManualMode {
                shard,
                mode: self.mode,
            },
        }
    }
}

/// Records and bytes delivered in all, and per second over the last full second (or,
/// after a pause, since the last delivery), for the status page.
pub(super) struct Throughput {
    pub records: u64,
    pub bytes: u64,
    since: Instant,
    window: (u64, u64),
    last: (f64, f64),
}

impl Throughput {
    fn new(now: Instant) -> Self {
        Self {
            records: 0,
            bytes: 0,
            since: now,
            window: (0, 0),
            last: (0.0, 0.0),
        }
    }

    fn add(&mut self, records: u64, bytes: u64, now: Instant) {
        self.records += records;
        self.bytes += bytes;
        self.window.0 += records;
        self.window.1 += bytes;
        let secs = now.saturating_duration_since(self.since).as_secs_f64();
        if secs >= 1.0 {
            self.last = (self.window.0 as f64 / secs, self.window.1 as f64 / secs);
            self.since = now;
            self.window = (0, 0);
        }
    }

    /// (records, bytes) per second.
    pub fn per_second(&self, now: Instant) -> (f64, f64) {
        let secs = now.saturating_duration_since(self.since).as_secs_f64();
        if secs >= 2.0 {
            (self.window.0 as f64 / secs, self.window.1 as f64 / secs)
        } else {
            self.last
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::{SequenceNumber, WorkerBudget};

    fn esn(seq: u64, sub: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::parse(&seq.to_string()).unwrap(), sub)
    }

    fn record(seq: u64) -> Record {
        Record {
            sequence_number: SequenceNumber::parse(&seq.to_string()).unwrap(),
            sub_sequence_number: 0,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::from_static(b"abcd"),
            approximate_arrival: None,
        }
    }

    fn outbox(mode: CheckpointMode) -> (Outbox, WorkerBudget, Instant) {
        let budget = WorkerBudget::new(1 << 20);
        let now = Instant::now();
        let mut outbox = Outbox::new(
            ShardId::new("shardId-000000000000"),
            mode,
            budget.join(),
            now,
        );
        outbox.begin(
            Checkpoint::TrimHorizon,
            IteratorPosition::TrimHorizon,
            None,
            None,
            now,
        );
        (outbox, budget, now)
    }

    fn facts(now: Instant) -> ReadFacts<'static> {
        ReadFacts {
            fetched_at: now,
            end: None,
        }
    }

    fn deliver(outbox: &mut Outbox, records: &[u64], now: Instant) -> Option<Delivery> {
        let raw = records.iter().map(|s| record(*s)).collect();
        outbox.deliver(raw, facts(now), false, Some(0), 0, now)
    }

    #[test]
    fn a_delivery_holds_budget_until_acked_and_the_acked_prefix_is_the_checkpoint() {
        let (mut outbox, budget, now) = outbox(CheckpointMode::Auto);
        let delivery = deliver(&mut outbox, &[1, 2, 3], now).unwrap();
        assert_eq!(
            (delivery.records, delivery.bytes),
            (3, outbox.ledger().in_flight_bytes())
        );
        assert_eq!(outbox.last_delivered(), Some(&esn(3, 0)));
        assert!(
            budget.usage().in_use > 0,
            "the ledger's bytes are held in the budget"
        );
        assert_eq!(
            outbox.iterator_position(),
            Some(IteratorPosition::AfterSequence(esn(3, 0).sequence))
        );

        let acked = outbox.ack(Acks::Batch(delivery.batch.id), 0, now);
        assert_eq!(acked.records, 3);
        assert_eq!(acked.checkpointable, Some(esn(3, 0)));
        assert_eq!(outbox.checkpoint(), Some(&Checkpoint::At(esn(3, 0))));
        assert_eq!(budget.usage().in_use, 0, "acked records are let go of");
        assert!(outbox.holds_nothing(true));
        assert!(
            !outbox.holds_nothing(false),
            "a fan-out event's records still held"
        );
    }

    #[test]
    fn in_manual_mode_acks_never_move_the_checkpoint() {
        let (mut outbox, _budget, now) = outbox(CheckpointMode::Manual);
        let delivery = deliver(&mut outbox, &[1, 2], now).unwrap();
        let acked = outbox.ack(Acks::Batch(delivery.batch.id), 0, now);
        assert_eq!(acked.records, 2);
        assert_eq!(
            acked.checkpointable, None,
            "the processor checkpoints itself"
        );
        assert_eq!(outbox.checkpoint(), Some(&Checkpoint::TrimHorizon));
    }

    #[test]
    fn an_empty_batch_is_made_only_as_asked_and_one_at_a_time() {
        let (mut outbox, _budget, now) = outbox(CheckpointMode::Auto);
        assert!(
            outbox
                .deliver(Vec::new(), facts(now), false, None, 0, now)
                .is_none()
        );
        let first = outbox
            .deliver(Vec::new(), facts(now), true, None, 0, now)
            .expect("call_on_empty asks for it");
        assert!(first.batch.records.is_empty());
        assert_eq!(first.records, 0);
        assert!(
            outbox
                .deliver(Vec::new(), facts(now), true, None, 0, now)
                .is_none(),
            "one empty batch on its way at a time"
        );
        drop(first);
        assert!(
            outbox
                .deliver(Vec::new(), facts(now), true, None, 0, now)
                .is_some()
        );
    }

    #[test]
    fn records_a_checkpoint_inside_an_aggregate_covers_are_not_delivered_again() {
        let (mut outbox, _budget, now) = outbox(CheckpointMode::Auto);
        outbox.skip_to(esn(2, 0));
        let delivery = deliver(&mut outbox, &[1, 2, 3], now).unwrap();
        let seen: Vec<String> = delivery
            .batch
            .records
            .iter()
            .map(|r| r.sequence_number.to_string())
            .collect();
        assert_eq!(seen, ["3"]);
        assert!(deliver(&mut outbox, &[], now).is_none());
    }

    #[test]
    fn manual_and_prepared_checkpoints_follow_the_rules_and_never_go_back() {
        let (mut outbox, _budget, now) = outbox(CheckpointMode::Manual);
        deliver(&mut outbox, &[1, 2, 3], now).unwrap();
        match outbox.manual(Phase::Reading, &esn(4, 0)) {
            Err(CheckpointError::BeyondDelivered { last, .. }) => assert_eq!(last, "3/0"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            outbox.manual(Phase::LeaseLost, &esn(2, 0)),
            Err(CheckpointError::LeaseLost { .. })
        ));
        outbox.manual(Phase::Reading, &esn(3, 0)).unwrap();
        assert_eq!(outbox.checkpoint(), Some(&Checkpoint::At(esn(3, 0))));
        // A prepared checkpoint committed late does not move the known one back.
        outbox.commit(Phase::Reading, &esn(2, 0)).unwrap();
        assert_eq!(outbox.checkpoint(), Some(&Checkpoint::At(esn(3, 0))));
        assert!(matches!(
            outbox.prepare(Phase::Reading, &esn(1, 0)),
            Err(CheckpointError::BeforeCheckpoint { .. })
        ));
        let (auto, _budget, _) = self::outbox(CheckpointMode::Auto);
        assert!(matches!(
            auto.prepare(Phase::Reading, &esn(1, 0)),
            Err(CheckpointError::PrepareNeedsManualMode { .. })
        ));
    }

    #[test]
    fn a_trimmed_checkpoint_restarts_at_the_trim_horizon_forgetting_what_was_delivered() {
        let (mut outbox, _budget, now) = outbox(CheckpointMode::Auto);
        outbox.skip_to(esn(1, 0));
        deliver(&mut outbox, &[2], now).unwrap();
        outbox.restart_at_trim_horizon();
        assert_eq!(outbox.last_delivered(), None);
        assert_eq!(outbox.skip_through(), None);
        assert_eq!(
            outbox.iterator_position(),
            Some(IteratorPosition::TrimHorizon)
        );
    }

    #[test]
    fn throughput_is_per_second_over_the_last_full_second() {
        let start = Instant::now();
        let mut rate = Throughput::new(start);
        rate.add(10, 100, start + Duration::from_millis(500));
        assert_eq!(
            rate.per_second(start + Duration::from_millis(600)),
            (0.0, 0.0)
        );
        rate.add(10, 100, start + Duration::from_secs(1));
        assert_eq!(
            rate.per_second(start + Duration::from_millis(1500)),
            (20.0, 200.0)
        );
        assert_eq!((rate.records, rate.bytes), (20, 200));
        // After a pause, since the last delivery.
        assert_eq!(rate.per_second(start + Duration::from_secs(5)), (0.0, 0.0));
    }
}
