//! The shard reader's pure core: its phase machine, the rules each step follows, and
//! the ledger of what it has delivered and seen acked.
//!
//! The actor around it receives a message, asks this core what to do, and does the
//! I/O. Nothing here awaits, reads a clock or touches a channel: time arrives as
//! parameters, and every rule is a function with a table of scenarios below, so a
//! broken rule fails a test that names it rather than showing up as "lost records"
//! seconds of paused time away from its cause.

use std::time::{Duration, SystemTime};

use crate::backend::{ChildShard, IteratorPosition, Record, StreamError};
use crate::model::{Checkpoint, ExtendedSequenceNumber, HashKeyRange, SequenceNumber};
use crate::settings::CheckpointMode;
use crate::status::ShardState;

/// Transient GetRecords failures in a row after which the iterator is replaced.
pub(crate) const FRESH_ITERATOR_AFTER: u32 = 3;
/// Failed calls in a row that make an ERROR line (and every this many more).
pub(crate) const STALL_REPORT_EVERY: u32 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Starting,
    BlockedOnParent,
    Reading,
    /// The shard's last batch is delivered; waiting for every record to be acked.
    Draining,
    /// `shard_ended` sent to the processor.
    Ending,
    ShuttingDown,
    LeaseLost,
    /// The processor failed; the reader fails after counting the acks already sent.
    Failing,
}

impl Phase {
    /// Whether the shard is still on its way to reading. A shutdown or a lost lease can
    /// arrive between the start-up steps (each is a message, and each awaits the table):
    /// the steps still queued must not start the processor and the reads after it, or
    /// the shutdown waits for an answer nobody will give.
    pub(crate) fn starting(self) -> bool {
        matches!(self, Phase::Starting | Phase::BlockedOnParent)
    }
}

/// What the reader knows about its last read, for the state it shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Signals {
    /// Delivery is paused by self-fencing.
    pub fenced: bool,
    /// The last GetRecords was throttled.
    pub throttled: bool,
    /// The last GetRecords returned nothing and said the shard is at its tip.
    pub caught_up: bool,
    /// The shard holds its share of the worker's memory budget and waits for its acks
    /// (or for others' acks to free room) before reading more.
    pub budget_wait: bool,
    /// The shard is stalled: its processor waits past its stall time, or it cannot be
    /// read (a subscription refused, reads failing in a row).
    pub stalled: bool,
}

/// The state the status page shows for a phase. Fencing outranks a stall, which
/// outranks throttling, which outranks waiting on the memory budget, which outranks
/// being caught up: the most actionable reason a shard is not delivering. A processor
/// that does not answer stalls a shard being read to its end too.
pub(crate) fn shard_state(phase: Phase, signals: Signals) -> ShardState {
    match phase {
        Phase::Starting => ShardState::Initializing,
        Phase::BlockedOnParent => ShardState::BlockedOnParent,
        Phase::Reading if signals.fenced => ShardState::Fenced,
        Phase::Reading | Phase::Draining | Phase::Ending if signals.stalled => ShardState::Stalled,
        Phase::Reading if signals.throttled => ShardState::Throttled,
        Phase::Reading if signals.budget_wait => ShardState::WaitingOnBudget,
        Phase::Reading if signals.caught_up => ShardState::CaughtUp,
        Phase::Reading => ShardState::Processing,
        Phase::Draining | Phase::Ending => ShardState::ShardEnding,
        Phase::ShuttingDown => ShardState::ShuttingDown,
        Phase::LeaseLost => ShardState::LeaseLost,
        Phase::Failing => ShardState::Restarting,
    }
}

/// Where reading starts from a lease's checkpoint: the iterator position, and the
/// position whose records (and everything before) are skipped. `None`: nothing to read.
///
/// A checkpoint is read AT its record and that record skipped, not AFTER it: a
/// checkpoint may fall inside a KPL aggregate, whose rest must still be delivered.
pub(crate) fn start_position(
    checkpoint: &Checkpoint,
    initial_timestamp: Option<SystemTime>,
) -> Result<Option<(IteratorPosition, Option<ExtendedSequenceNumber>)>, StartError> {
    Ok(Some(match checkpoint {
        Checkpoint::TrimHorizon => (IteratorPosition::TrimHorizon, None),
        Checkpoint::Latest => (IteratorPosition::Latest, None),
        Checkpoint::AtTimestamp => match initial_timestamp {
            Some(at) => (IteratorPosition::AtTimestamp(at), None),
            None => return Err(StartError::NoInitialTimestamp),
        },
        Checkpoint::At(at) => (
            IteratorPosition::AtSequence(at.sequence.clone()),
            Some(at.clone()),
        ),
        Checkpoint::ShardEnd => return Ok(None),
    }))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StartError {
    #[error("the lease says AT_TIMESTAMP but worker.initial_timestamp is not set")]
    NoInitialTimestamp,
}

/// Where a new iterator starts: after the last record delivered (so nothing delivered
/// is read twice and nothing after it is skipped), or at the start position.
pub(crate) fn iterator_position(
    last_delivered: Option<&ExtendedSequenceNumber>,
    start: Option<&IteratorPosition>,
) -> Option<IteratorPosition> {
    match last_delivered {
        Some(last) => Some(IteratorPosition::AfterSequence(last.sequence.clone())),
        None => start.cloned(),
    }
}

/// Kinesis allows one SubscribeToShard per second per consumer and shard.
pub(crate) const SUBSCRIBE_INTERVAL: Duration = Duration::from_secs(1);

/// Where a fan-out subscription starts, and which records it must drop.
///
/// After the first event, from the last event's continuation: it moves on through empty
/// stretches, so a shard started at LATEST or past trimmed data loses nothing between
/// two subscriptions. Servers disagree on what the continuation is: Kinesis and
/// kinesis-mock send the last record sent, ferrokinesis a position just after it (and
/// its AFTER_SEQUENCE_NUMBER of that replays the shard from its start). So AT it, which
/// never skips on either; the last record sent comes again where the continuation is
/// that record, and records at or before the last one delivered are dropped, so the
/// seam has no duplicate either. Before any event, where an iterator would start (the
/// start position, whose aggregate skip the caller keeps), dropping what was delivered
/// too: ferrokinesis starts every subscription at a sequence number at the shard's
/// start instead.
pub(crate) fn subscribe_position(
    continuation: Option<&SequenceNumber>,
    last_delivered: Option<&ExtendedSequenceNumber>,
    start: Option<&IteratorPosition>,
) -> Option<(IteratorPosition, Option<ExtendedSequenceNumber>)> {
    match continuation {
        Some(at) => Some((
            IteratorPosition::AtSequence(at.clone()),
            last_delivered.cloned(),
        )),
        None => iterator_position(last_delivered, start).map(|p| (p, last_delivered.cloned())),
    }
}

/// How long to wait before subscribing to a shard again, `since_last` after the last
/// subscription was made.
pub(crate) fn subscribe_delay(since_last: Option<Duration>) -> Duration {
    since_last.map_or(Duration::ZERO, |since| {
        SUBSCRIBE_INTERVAL.saturating_sub(since)
    })
}

/// Whether a GetRecords answer, read where a fan-out subscription went idle, shows the
/// shard ended: at its end (no next iterator) with nothing past what was covered (the
/// last record delivered, or the checkpoint a restart skips to). A server that reads a
/// sequence position inclusively sends the covered record again; that is not news.
pub(crate) fn idle_shard_ended(
    at_end: bool,
    records: &[Record],
    covered: Option<&ExtendedSequenceNumber>,
) -> bool {
    at_end
        && records
            .iter()
            .all(|r| covered.is_some_and(|c| &position_of(r) <= c))
}

/// The children a shard's end reports, if they can be trusted to name all their
/// parents; `None` sends the watcher to list the shards instead (its answer names both
/// parents of a merge). A child reaching outside this shard's hash range came of a merge
/// and must name the other parent too: ferrokinesis names only the shard being read,
/// and a merged child made from that would be read before its other parent ended.
pub(crate) fn reported_children(
    children: Option<Vec<ChildShard>>,
    range: Option<&HashKeyRange>,
) -> Option<Vec<ChildShard>> {
    let children = children?;
    let Some(range) = range else {
        return Some(children);
    };
    let named_all = children.iter().all(|c| {
        c.parents.len() > 1
            || (range.contains(c.hash_range.start) && range.contains(c.hash_range.end))
    });
    named_all.then_some(children)
}

/// What a scheduled fetch does, in the order the checks are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FetchStep {
    /// Not reading (starting, draining, stopping): nothing to do.
    Skip,
    /// The processor has acked nothing for `processor_timeout` with records pending:
    /// the shard fails (and restarts from its checkpoint).
    ProcessorStalled,
    /// Fenced, or the window is full: look again after `poll_interval` (acks also
    /// wake a full window).
    Wait,
    /// No iterator: get one first.
    Acquire,
    /// Call GetRecords.
    Read,
}

/// What a fetch checks, gathered by the actor. `may_deliver` is asked only when the
/// earlier checks pass, as it logs each change of the fencing verdict.
pub(crate) struct FetchGate<F: FnOnce() -> bool> {
    pub phase: Phase,
    pub stalled: bool,
    pub may_deliver: F,
    pub window_full: bool,
    pub has_iterator: bool,
}

pub(crate) fn fetch_step<F: FnOnce() -> bool>(gate: FetchGate<F>) -> FetchStep {
    if gate.phase != Phase::Reading {
        return FetchStep::Skip;
    }
    if gate.stalled {
        return FetchStep::ProcessorStalled;
    }
    if !(gate.may_deliver)() || gate.window_full {
        return FetchStep::Wait;
    }
    if !gate.has_iterator {
        return FetchStep::Acquire;
    }
    FetchStep::Read
}

/// How long a processor may wait on something outside the worker (a MultiLang child's
/// answer) before its shard shows as stalled: half the processor's own limit on the
/// wait (the MultiLang watchdog, `timeoutInSeconds`, which replaces the child at the
/// limit), or [`PROCESSOR_STALL_TIME`] without one; at most half of
/// `reader.processor_timeout`, which fails a shard whose processor acks nothing. So a
/// stall shows for at least half of each wait before the shard restarts.
pub(crate) fn processor_stall_time(
    limit: Option<Duration>,
    processor_timeout: Duration,
) -> Duration {
    limit
        .map_or(PROCESSOR_STALL_TIME, |limit| limit / 2)
        .min(processor_timeout / 2)
}

/// A processor's wait with no limit of its own shows as a stall after this.
pub(crate) const PROCESSOR_STALL_TIME: Duration = Duration::from_secs(30);

/// Whether a failed SubscribeToShard is a refusal, which stalls the shard at once: any
/// failure but the two a subscription waits out, the previous owner's subscription still
/// open (`InUse`, a handoff) and the once-a-second limit (`Throttled`).
pub(crate) fn subscription_refused(error: &StreamError) -> bool {
    !matches!(
        error,
        StreamError::InUse { .. } | StreamError::Throttled { .. }
    )
}

/// Whether a shard in `phase` can be stalled: while it is read, or read to its end and
/// waiting on its processor (a stop has its own time limit, `shutdown_timeout`).
pub(crate) fn may_stall(phase: Phase) -> bool {
    matches!(phase, Phase::Reading | Phase::Draining | Phase::Ending)
}

/// Whether the processor is stalled: records pending and no ack for longer than the
/// timeout.
pub(crate) fn processor_stalled(
    window_empty: bool,
    since_progress: Duration,
    timeout: Duration,
) -> bool {
    !window_empty && since_progress > timeout
}

/// When to read again after an answer that did not end the shard, and the idle delay
/// to use next time. Calls start `poll` apart (Kinesis counts calls per second), not a
/// pause after each: a shard that is behind loses no time to a slow answer. A shard at
/// its tip backs off from `poll` to `idle_max`, doubling. Where calls are not metered
/// (DynamoDB Streams), a full batch means a backlog: read on at once.
pub(crate) fn next_read(
    read: Read,
    poll: Duration,
    idle: Duration,
    idle_max: Duration,
    call_took: Duration,
) -> (Duration, Duration) {
    let Read {
        got_records,
        caught_up,
        full_unmetered,
    } = read;
    if full_unmetered {
        (Duration::ZERO, poll)
    } else if got_records || !caught_up {
        (poll.saturating_sub(call_took), poll)
    } else {
        (idle, (idle * 2).min(idle_max))
    }
}

/// What one GetRecords answer said, for [`next_read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Read {
    pub got_records: bool,
    pub caught_up: bool,
    /// As many records as asked for, from a source that meters no calls per second.
    pub full_unmetered: bool,
}

/// Whether a retryable GetRecords failure replaces the iterator: a server that keeps
/// failing one iterator (kinesis-mock and moto answer a bad one with a bare 500) is not
/// waited out. Throttling is not the iterator's fault.
pub(crate) fn renew_iterator(transient: bool, failures_in_row: u32) -> bool {
    transient && failures_in_row.is_multiple_of(FRESH_ITERATOR_AFTER)
}

/// Whether this failure in a row makes an ERROR line: a shard that cannot be read is a
/// stall, said at ERROR, but not at every retry.
pub(crate) fn stall_report_due(failures_in_row: u32) -> bool {
    failures_in_row > 0 && failures_in_row.is_multiple_of(STALL_REPORT_EVERY)
}

/// What follows an ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterAck {
    /// The shard is read to its end: end it if nothing is pending any more.
    MaybeEnd,
    /// Room in the window again: fetch now.
    Fetch,
    Nothing,
}

pub(crate) fn after_ack(phase: Phase, window_full: bool) -> AfterAck {
    match phase {
        Phase::Draining => AfterAck::MaybeEnd,
        Phase::Reading if !window_full => AfterAck::Fetch,
        _ => AfterAck::Nothing,
    }
}

/// Whether a read that kept no records becomes an empty call to the processor: only when
/// `reader.call_on_empty` asks for it (the KCL's
/// `callProcessRecordsEvenForEmptyRecordList`), and not while the last empty call is
/// still waiting for the processor, so a slow processor's mailbox holds at most one and
/// its calls do not pile up behind a long `process`.
pub(crate) fn call_on_empty(enabled: bool, empty_call_waiting: bool) -> bool {
    enabled && !empty_call_waiting
}

/// A drained shard ends (`shard_ended` to the processor) once every record is acked.
pub(crate) fn ready_to_end(phase: Phase, window_empty: bool) -> bool {
    phase == Phase::Draining && window_empty
}

/// What the reader does when its processor actor stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcessorExit {
    /// The lease is lost anyway: stop as lost.
    StopLeaseLost,
    /// It failed: stop fetching now, and fail once the acks it sent are counted.
    FailAfterAcks,
    /// It was asked to stop (shutdown, shard end): expected.
    Expected,
    /// It stopped on its own: the shard fails.
    Fail,
}

pub(crate) fn processor_exit(phase: Phase, failed: bool) -> ProcessorExit {
    match (phase, failed) {
        (Phase::LeaseLost, _) => ProcessorExit::StopLeaseLost,
        (_, true) => ProcessorExit::FailAfterAcks,
        (Phase::ShuttingDown | Phase::Ending, false) => ProcessorExit::Expected,
        (_, false) => ProcessorExit::Fail,
    }
}

/// Whether a shutdown request starts one, or finds the shard already stopping.
pub(crate) fn already_stopping(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::LeaseLost | Phase::ShuttingDown | Phase::Ending
    )
}

/// Why a manual checkpoint is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    LeaseLost,
    /// Past the last record delivered (or nothing delivered yet): a restart would skip
    /// records.
    BeyondDelivered,
    /// A prepared checkpoint before the last checkpoint.
    BeforeCheckpoint,
    /// A prepared checkpoint outside manual mode.
    NotManual,
}

pub(crate) fn manual_checkpoint(
    phase: Phase,
    at: &ExtendedSequenceNumber,
    last_delivered: Option<&ExtendedSequenceNumber>,
) -> Result<(), Refusal> {
    if phase == Phase::LeaseLost {
        return Err(Refusal::LeaseLost);
    }
    match last_delivered {
        Some(last) if at <= last => Ok(()),
        _ => Err(Refusal::BeyondDelivered),
    }
}

/// Whether a prepared (two-phase) checkpoint at `at` may be written: only in manual
/// mode (the other modes checkpoint by themselves, and each write removes a prepared
/// checkpoint), within what a manual checkpoint may name, and not before the last
/// checkpoint (`checkpoint`: the last one sent to the writer or read from the row), as
/// the KCL's `ShardRecordProcessorCheckpointer.prepareCheckpoint` refuses.
pub(crate) fn prepare_checkpoint(
    mode: CheckpointMode,
    phase: Phase,
    at: &ExtendedSequenceNumber,
    last_delivered: Option<&ExtendedSequenceNumber>,
    checkpoint: Option<&Checkpoint>,
) -> Result<(), Refusal> {
    match mode {
        CheckpointMode::Manual => {}
        CheckpointMode::Auto | CheckpointMode::Watermark => return Err(Refusal::NotManual),
    }
    manual_checkpoint(phase, at, last_delivered)?;
    match checkpoint {
        Some(Checkpoint::At(done)) if at < done => Err(Refusal::BeforeCheckpoint),
        _ => Ok(()),
    }
}

/// De-aggregates a GetRecords answer (keeping the sub-records in this shard's hash
/// range) and drops what a checkpoint inside an aggregate already covers; `skip` is
/// cleared once a record past it is seen.
pub(crate) fn fresh_records(
    raw: Vec<Record>,
    range: Option<&HashKeyRange>,
    skip: &mut Option<ExtendedSequenceNumber>,
) -> Vec<Record> {
    let mut records = Vec::with_capacity(raw.len());
    for record in raw {
        crate::kpl::deaggregate(record, range, &mut records);
    }
    if let Some(through) = skip {
        records.retain(|r| {
            (&r.sequence_number, r.sub_sequence_number) > (&through.sequence, through.sub_sequence)
        });
        if !records.is_empty() {
            *skip = None;
        }
    }
    records
}

pub(crate) fn position_of(record: &Record) -> ExtendedSequenceNumber {
    ExtendedSequenceNumber::new(record.sequence_number.clone(), record.sub_sequence_number)
}

/// The bytes a record counts for in the window: its data and partition key.
pub(crate) fn record_bytes(records: &[Record]) -> u64 {
    records
        .iter()
        .map(|r| (r.data.len() + r.partition_key.len()) as u64)
        .sum()
}

/// What a record costs in memory while a reader holds it, for the worker's budget:
/// the `Record` struct itself, its payload, partition key, sequence number and
/// explicit hash key. The one definition: the ledger, the held records of a fan-out
/// event and the read's size estimate all count with it.
pub(crate) fn record_memory(record: &Record) -> u64 {
    (std::mem::size_of::<Record>()
        + record.data.len()
        + record.partition_key.len()
        + record.sequence_number.as_str().len()
        + record.explicit_hash_key.as_ref().map_or(0, String::len)) as u64
}

/// The guess of a record's in-memory size before a shard has read any: a read's
/// `Limit` is the budget granted over it. Records of 1 KB or less then fit.
pub(crate) const FIRST_GUESS_RECORD_MEMORY: u64 = 1_200;

/// The `Limit` of the next GetRecords under the memory budget: as many records as the
/// grant holds at the shard's observed in-memory size per record, at most `max`.
/// `None`: nothing fits, wait for acks. A shard holding nothing always reads one
/// record at least (else a budget taken by others, or a record larger than the grant,
/// would stop it for good): so a read overruns its grant by at most the records'
/// excess over the estimate, and a shard holding nothing by one record.
pub(crate) fn fetch_limit(
    max: u32,
    granted: u64,
    per_record: u64,
    holds_nothing: bool,
) -> Option<u32> {
    let fits = (granted / per_record.max(1)).min(u64::from(max));
    match u32::try_from(fits) {
        Ok(0) | Err(_) if holds_nothing => Some(1),
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// Fan-out: whether to ask the subscription for its next event under the memory
/// budget. An event cannot be limited (it brings what arrived, up to 10 MB), so the
/// grant must hold one as large as the largest this shard has had; a shard holding
/// nothing always may (as [`fetch_limit`]).
pub(crate) fn may_pull(granted: u64, largest_event: u64, holds_nothing: bool) -> bool {
    holds_nothing || (granted > 0 && granted >= largest_event)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::ledger::batch_memory;
    use super::*;

    const ALL_PHASES: [Phase; 8] = [
        Phase::Starting,
        Phase::BlockedOnParent,
        Phase::Reading,
        Phase::Draining,
        Phase::Ending,
        Phase::ShuttingDown,
        Phase::LeaseLost,
        Phase::Failing,
    ];

    fn sig(fenced: bool, throttled: bool, caught_up: bool) -> Signals {
        Signals {
            fenced,
            throttled,
            caught_up,
            budget_wait: false,
            stalled: false,
        }
    }

    fn waiting(mut signals: Signals) -> Signals {
        signals.budget_wait = true;
        signals
    }

    fn stalled(mut signals: Signals) -> Signals {
        signals.stalled = true;
        signals
    }

    /// A wait shows as a stall at half the processor's own limit, or after 30 s with no
    /// limit, and never later than half of `processor_timeout`.
    #[test]
    fn a_processors_wait_is_a_stall_at_half_its_limit() {
        let secs = Duration::from_secs;
        assert_eq!(processor_stall_time(None, secs(300)), secs(30));
        assert_eq!(processor_stall_time(Some(secs(60)), secs(300)), secs(30));
        assert_eq!(processor_stall_time(Some(secs(10)), secs(300)), secs(5));
        assert_eq!(processor_stall_time(Some(secs(900)), secs(300)), secs(150));
        assert_eq!(processor_stall_time(None, secs(20)), secs(10));
        assert!(
            may_stall(Phase::Reading) && may_stall(Phase::Draining) && may_stall(Phase::Ending)
        );
        assert!(!may_stall(Phase::ShuttingDown) && !may_stall(Phase::Starting));
    }

    #[test]
    fn the_state_shown_for_each_phase() {
        use ShardState as S;
        let table: &[(Phase, Signals, ShardState)] = &[
            (Phase::Starting, sig(true, true, true), S::Initializing),
            (
                Phase::BlockedOnParent,
                sig(true, false, false),
                S::BlockedOnParent,
            ),
            (Phase::Reading, sig(false, false, false), S::Processing),
            (Phase::Reading, sig(false, false, true), S::CaughtUp),
            (Phase::Reading, sig(false, true, true), S::Throttled),
            (Phase::Reading, sig(true, true, true), S::Fenced),
            (
                Phase::Reading,
                waiting(sig(false, false, false)),
                S::WaitingOnBudget,
            ),
            (
                Phase::Reading,
                waiting(sig(false, false, true)),
                S::WaitingOnBudget,
            ),
            (
                Phase::Reading,
                waiting(sig(false, true, false)),
                S::Throttled,
            ),
            (Phase::Reading, waiting(sig(true, false, false)), S::Fenced),
            (
                Phase::Draining,
                waiting(sig(false, false, false)),
                S::ShardEnding,
            ),
            (Phase::Draining, sig(true, false, false), S::ShardEnding),
            (Phase::Ending, sig(false, false, false), S::ShardEnding),
            (
                Phase::ShuttingDown,
                sig(true, false, false),
                S::ShuttingDown,
            ),
            (Phase::LeaseLost, sig(false, false, false), S::LeaseLost),
            (Phase::Failing, sig(false, false, false), S::Restarting),
            // A stall outranks everything but fencing while the shard is read, and
            // shows while it is read to its end; a stop and a restart are what they are.
            (Phase::Reading, stalled(sig(false, true, true)), S::Stalled),
            (
                Phase::Reading,
                stalled(waiting(sig(false, false, false))),
                S::Stalled,
            ),
            (Phase::Reading, stalled(sig(true, false, false)), S::Fenced),
            (
                Phase::Draining,
                stalled(sig(false, false, false)),
                S::Stalled,
            ),
            (Phase::Ending, stalled(sig(false, false, false)), S::Stalled),
            (
                Phase::ShuttingDown,
                stalled(sig(false, false, false)),
                S::ShuttingDown,
            ),
            (
                Phase::Failing,
                stalled(sig(false, false, false)),
                S::Restarting,
            ),
            (
                Phase::Starting,
                stalled(sig(false, false, false)),
                S::Initializing,
            ),
        ];
        for (phase, signals, want) in table {
            assert_eq!(
                shard_state(*phase, *signals),
                *want,
                "{phase:?} {signals:?}"
            );
        }
    }

    #[test]
    fn what_a_fetch_does() {
        use FetchStep::*;
        // (phase, stalled, may deliver, window full, has iterator) → step
        let table: &[(Phase, bool, bool, bool, bool, FetchStep)] = &[
            (Phase::Reading, false, true, false, true, Read),
            (Phase::Reading, false, true, false, false, Acquire),
            (Phase::Reading, false, true, true, true, Wait),
            (Phase::Reading, false, false, false, true, Wait),
            (Phase::Reading, true, true, false, true, ProcessorStalled),
            // A stalled processor fails the shard even while fenced or full.
            (Phase::Reading, true, false, true, true, ProcessorStalled),
            (Phase::Draining, false, true, false, true, Skip),
            (Phase::Starting, false, true, false, true, Skip),
            (Phase::ShuttingDown, true, true, false, true, Skip),
            (Phase::LeaseLost, false, true, false, true, Skip),
        ];
        for &(phase, stalled, may, full, iterator, want) in table {
            let got = fetch_step(FetchGate {
                phase,
                stalled,
                may_deliver: || may,
                window_full: full,
                has_iterator: iterator,
            });
            assert_eq!(
                got, want,
                "{phase:?} stalled={stalled} may={may} full={full} it={iterator}"
            );
        }
    }

    #[test]
    fn the_fencing_verdict_is_asked_only_when_it_matters() {
        for phase in ALL_PHASES {
            for stalled in [false, true] {
                let mut asked = false;
                fetch_step(FetchGate {
                    phase,
                    stalled,
                    may_deliver: || {
                        asked = true;
                        true
                    },
                    window_full: false,
                    has_iterator: true,
                });
                assert_eq!(
                    asked,
                    phase == Phase::Reading && !stalled,
                    "{phase:?} {stalled}"
                );
            }
        }
    }

    #[test]
    fn what_a_prepared_checkpoint_may_name() {
        let at = |n: u128| ExtendedSequenceNumber::new(SequenceNumber::from_u128(n), 0);
        let done = |n: u128| Checkpoint::At(at(n));
        use CheckpointMode::{Auto, Manual, Watermark};
        use Refusal::*;
        // (mode, phase, prepare at, last delivered, checkpoint) -> answer
        let table = [
            ((Manual, Phase::Reading, 5, Some(9), Some(done(3))), Ok(())),
            ((Manual, Phase::Reading, 9, Some(9), Some(done(9))), Ok(())),
            (
                (
                    Manual,
                    Phase::Reading,
                    5,
                    Some(9),
                    Some(Checkpoint::TrimHorizon),
                ),
                Ok(()),
            ),
            ((Manual, Phase::Reading, 5, Some(9), None), Ok(())),
            (
                (Manual, Phase::Reading, 2, Some(9), Some(done(3))),
                Err(BeforeCheckpoint),
            ),
            (
                (Manual, Phase::Reading, 10, Some(9), Some(done(3))),
                Err(BeyondDelivered),
            ),
            (
                (Manual, Phase::Reading, 1, None, None),
                Err(BeyondDelivered),
            ),
            (
                (Manual, Phase::LeaseLost, 5, Some(9), Some(done(3))),
                Err(LeaseLost),
            ),
            (
                (Auto, Phase::Reading, 5, Some(9), Some(done(3))),
                Err(NotManual),
            ),
            (
                (Watermark, Phase::Reading, 5, Some(9), Some(done(3))),
                Err(NotManual),
            ),
        ];
        for ((mode, phase, n, last, checkpoint), want) in table {
            let last = last.map(at);
            let got = prepare_checkpoint(mode, phase, &at(n), last.as_ref(), checkpoint.as_ref());
            assert_eq!(got, want, "{mode:?} {phase:?} {n} {last:?} {checkpoint:?}");
        }
    }

    #[test]
    fn an_empty_read_is_a_call_only_when_asked_and_none_is_waiting() {
        // (reader.call_on_empty, an empty call still waiting) -> call
        let table = [
            ((false, false), false),
            ((false, true), false),
            ((true, false), true),
            ((true, true), false),
        ];
        for ((enabled, waiting), want) in table {
            assert_eq!(call_on_empty(enabled, waiting), want, "{enabled} {waiting}");
        }
    }

    #[test]
    fn processor_stall() {
        let t = Duration::from_secs(10);
        let table = [
            (true, Duration::from_secs(60), false),
            (false, Duration::from_secs(10), false),
            (false, Duration::from_millis(10_001), true),
        ];
        for (empty, since, want) in table {
            assert_eq!(
                processor_stalled(empty, since, t),
                want,
                "{empty} {since:?}"
            );
        }
    }

    #[test]
    fn when_to_read_again() {
        let ms = Duration::from_millis;
        let (poll, max) = (ms(200), ms(1_600));
        // (got records, caught up, full and unmetered, idle now, call took)
        //   → (delay, idle next)
        let table = [
            ((true, true, false, ms(800), ms(50)), (ms(150), ms(200))),
            ((false, false, false, ms(800), ms(50)), (ms(150), ms(200))),
            ((true, false, false, ms(200), ms(500)), (ms(0), ms(200))),
            ((false, true, false, ms(200), ms(5)), (ms(200), ms(400))),
            ((false, true, false, ms(800), ms(5)), (ms(800), ms(1_600))),
            (
                (false, true, false, ms(1_600), ms(5)),
                (ms(1_600), ms(1_600)),
            ),
            // A full batch where calls are not metered: a backlog, read on at once.
            ((true, true, true, ms(800), ms(5)), (ms(0), ms(200))),
        ];
        for ((got_records, caught_up, full_unmetered, idle, took), want) in table {
            let read = Read {
                got_records,
                caught_up,
                full_unmetered,
            };
            assert_eq!(
                next_read(read, poll, idle, max, took),
                want,
                "{read:?} idle={idle:?}"
            );
        }
    }

    #[test]
    fn failures_renew_the_iterator_and_report_a_stall() {
        let table = [
            // (transient, failures in row) → (renew, report)
            ((true, 1), (false, false)),
            ((true, 3), (true, false)),
            ((false, 3), (false, false)),
            ((true, 6), (true, false)),
            ((false, 20), (false, true)),
            ((true, 40), (false, true)),
            ((true, 60), (true, true)),
        ];
        for ((transient, n), (renew, report)) in table {
            assert_eq!(renew_iterator(transient, n), renew, "renew {transient} {n}");
            assert_eq!(stall_report_due(n), report, "report {n}");
        }
    }

    #[test]
    fn what_follows_an_ack_and_a_processor_exit() {
        for phase in ALL_PHASES {
            for full in [false, true] {
                let want = match phase {
                    Phase::Draining => AfterAck::MaybeEnd,
                    Phase::Reading if !full => AfterAck::Fetch,
                    _ => AfterAck::Nothing,
                };
                assert_eq!(after_ack(phase, full), want, "{phase:?} full={full}");
            }
            assert_eq!(ready_to_end(phase, true), phase == Phase::Draining);
            assert!(!ready_to_end(phase, false));
        }
        use ProcessorExit::*;
        let table = [
            (Phase::LeaseLost, true, StopLeaseLost),
            (Phase::LeaseLost, false, StopLeaseLost),
            (Phase::Reading, true, FailAfterAcks),
            (Phase::ShuttingDown, true, FailAfterAcks),
            (Phase::ShuttingDown, false, Expected),
            (Phase::Ending, false, Expected),
            (Phase::Reading, false, Fail),
            (Phase::Draining, false, Fail),
        ];
        for (phase, failed, want) in table {
            assert_eq!(
                processor_exit(phase, failed),
                want,
                "{phase:?} failed={failed}"
            );
        }
        let stopping: Vec<Phase> = ALL_PHASES
            .into_iter()
            .filter(|p| already_stopping(*p))
            .collect();
        assert_eq!(
            stopping,
            [Phase::Ending, Phase::ShuttingDown, Phase::LeaseLost]
        );
        let starting: Vec<Phase> = ALL_PHASES.into_iter().filter(|p| p.starting()).collect();
        assert_eq!(starting, [Phase::Starting, Phase::BlockedOnParent]);
    }

    fn esn(seq: u64, sub: u64) -> ExtendedSequenceNumber {
        ExtendedSequenceNumber::new(SequenceNumber::parse(&seq.to_string()).unwrap(), sub)
    }

    #[test]
    fn manual_checkpoints() {
        let table = [
            (Phase::Reading, esn(5, 0), Some(esn(9, 0)), Ok(())),
            (Phase::Reading, esn(9, 0), Some(esn(9, 0)), Ok(())),
            (
                Phase::Reading,
                esn(9, 1),
                Some(esn(9, 0)),
                Err(Refusal::BeyondDelivered),
            ),
            (
                Phase::Reading,
                esn(1, 0),
                None,
                Err(Refusal::BeyondDelivered),
            ),
            (
                Phase::LeaseLost,
                esn(5, 0),
                Some(esn(9, 0)),
                Err(Refusal::LeaseLost),
            ),
            (Phase::Draining, esn(9, 0), Some(esn(9, 0)), Ok(())),
        ];
        for (phase, at, last, want) in table {
            assert_eq!(
                manual_checkpoint(phase, &at, last.as_ref()),
                want,
                "{phase:?} {at}"
            );
        }
    }

    #[test]
    fn where_reading_starts() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let cp = esn(7, 2);
        assert_eq!(
            start_position(&Checkpoint::TrimHorizon, None),
            Ok(Some((IteratorPosition::TrimHorizon, None)))
        );
        assert_eq!(
            start_position(&Checkpoint::Latest, Some(at)),
            Ok(Some((IteratorPosition::Latest, None)))
        );
        assert_eq!(
            start_position(&Checkpoint::AtTimestamp, Some(at)),
            Ok(Some((IteratorPosition::AtTimestamp(at), None)))
        );
        assert_eq!(
            start_position(&Checkpoint::AtTimestamp, None),
            Err(StartError::NoInitialTimestamp)
        );
        assert_eq!(
            start_position(&Checkpoint::At(cp.clone()), None),
            Ok(Some((
                IteratorPosition::AtSequence(cp.sequence.clone()),
                Some(cp.clone())
            )))
        );
        assert_eq!(start_position(&Checkpoint::ShardEnd, None), Ok(None));
        // A new iterator resumes after the last record delivered, whatever the start.
        let start = IteratorPosition::TrimHorizon;
        assert_eq!(
            iterator_position(Some(&cp), Some(&start)),
            Some(IteratorPosition::AfterSequence(cp.sequence.clone()))
        );
        assert_eq!(iterator_position(None, Some(&start)), Some(start));
        assert_eq!(iterator_position(None, None), None);
    }

    #[test]
    fn a_subscription_resumes_after_the_continuation_and_drops_what_was_delivered() {
        let seq = |n: u64| SequenceNumber::parse(&n.to_string()).unwrap();
        let delivered = ExtendedSequenceNumber::new(seq(40), 2);
        let start = IteratorPosition::Latest;
        let table = [
            // First subscription: the start position, nothing to drop.
            (None, None, Some(start.clone()), Some((start.clone(), None))),
            // Resubscribed before any record was delivered (LATEST, idle): at the
            // continuation, not LATEST again (that would skip what came in between).
            (
                Some(seq(77)),
                None,
                Some(start.clone()),
                Some((IteratorPosition::AtSequence(seq(77)), None)),
            ),
            // After records: at the continuation, dropping up to the last delivered
            // (a server whose continuation is the last record sends it again).
            (
                Some(seq(41)),
                Some(delivered.clone()),
                Some(start.clone()),
                Some((
                    IteratorPosition::AtSequence(seq(41)),
                    Some(delivered.clone()),
                )),
            ),
            // No continuation yet but records delivered (the first subscription's first
            // event failed after records came by another path): after the last one,
            // dropping it and what came before wherever the server starts.
            (
                None,
                Some(delivered.clone()),
                Some(start.clone()),
                Some((
                    IteratorPosition::AfterSequence(seq(40)),
                    Some(delivered.clone()),
                )),
            ),
            (None, None, None, None),
        ];
        for (continuation, last, start, expected) in table {
            assert_eq!(
                subscribe_position(continuation.as_ref(), last.as_ref(), start.as_ref()),
                expected,
                "continuation {continuation:?}, last delivered {last:?}"
            );
        }
    }

    #[test]
    fn an_idle_shard_has_ended_when_nothing_past_what_was_covered_remains() {
        let covered = ExtendedSequenceNumber::new(SequenceNumber::parse("40").unwrap(), 0);
        let table = [
            // (at end, records, covered, ended)
            (true, vec![], Some(covered.clone()), true),
            (true, vec![], None, true),
            // The covered record again (AT a position): nothing new.
            (true, vec![record(40, 0)], Some(covered.clone()), true),
            (
                true,
                vec![record(39, 0), record(40, 0)],
                Some(covered.clone()),
                true,
            ),
            // Something past it: the subscription will bring it first.
            (true, vec![record(41, 0)], Some(covered.clone()), false),
            (true, vec![record(40, 1)], Some(covered.clone()), false),
            (true, vec![record(40, 0)], None, false),
            // Not at the end.
            (false, vec![], Some(covered.clone()), false),
            (false, vec![record(40, 0)], Some(covered.clone()), false),
        ];
        for (at_end, records, covered, ended) in table {
            assert_eq!(
                idle_shard_ended(at_end, &records, covered.as_ref()),
                ended,
                "at end {at_end}, {} records, covered {covered:?}",
                records.len()
            );
        }
    }

    #[test]
    fn a_merged_child_naming_one_parent_is_left_to_the_listing() {
        use crate::model::ShardId;
        let shard = |n: u64| ShardId::from_index(n);
        let range = |start: u128, end: u128| HashKeyRange { start, end };
        let child = |parents: &[u64], r: HashKeyRange| ChildShard {
            id: shard(9),
            parents: parents.iter().map(|&p| shard(p)).collect(),
            hash_range: r,
        };
        let mine = range(100, 199);
        let table = [
            // A split: both children inside this shard's range.
            (
                Some(vec![
                    child(&[0], range(100, 149)),
                    child(&[0], range(150, 199)),
                ]),
                true,
            ),
            // A merge that names both parents.
            (Some(vec![child(&[0, 1], range(100, 299))]), true),
            // A merge that names only this shard (ferrokinesis): not trusted.
            (Some(vec![child(&[0], range(100, 299))]), false),
            (Some(vec![child(&[1], range(0, 199))]), false),
            (Some(vec![]), true),
        ];
        for (children, kept) in table {
            let out = reported_children(children.clone(), Some(&mine));
            assert_eq!(out.is_some(), kept, "{children:?}");
        }
        assert_eq!(reported_children(None, Some(&mine)), None);
        let merged = Some(vec![child(&[0], range(100, 299))]);
        assert_eq!(
            reported_children(merged.clone(), None),
            merged,
            "no range known"
        );
    }

    #[test]
    fn subscriptions_to_a_shard_are_at_least_a_second_apart() {
        let ms = Duration::from_millis;
        for (since, wait) in [
            (None, ms(0)),
            (Some(ms(0)), ms(1000)),
            (Some(ms(300)), ms(700)),
            (Some(ms(1000)), ms(0)),
            (Some(ms(300_000)), ms(0)),
        ] {
            assert_eq!(subscribe_delay(since), wait, "{since:?}");
        }
    }

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

    #[test]
    fn records_a_checkpoint_inside_an_aggregate_covers_are_skipped_once() {
        let mut skip = Some(esn(5, 1));
        let got = fresh_records(vec![record(5, 0), record(5, 1)], None, &mut skip);
        assert!(got.is_empty());
        assert_eq!(skip, Some(esn(5, 1)), "kept until a record past it is seen");
        let got = fresh_records(
            vec![record(5, 1), record(5, 2), record(6, 0)],
            None,
            &mut skip,
        );
        let seen: Vec<(String, u64)> = got
            .iter()
            .map(|r| (r.sequence_number.to_string(), r.sub_sequence_number))
            .collect();
        assert_eq!(seen, [("5".to_owned(), 2), ("6".to_owned(), 0)]);
        assert_eq!(skip, None);
        let got = fresh_records(vec![record(4, 0)], None, &mut skip);
        assert_eq!(got.len(), 1, "no skip once cleared");
    }

    #[test]
    fn the_read_limit_under_the_budget() {
        // (max, granted, per record, holds nothing) → limit
        let table: &[(u32, u64, u64, bool, Option<u32>)] = &[
            (10_000, 1_000_000, 200, false, Some(5_000)),
            (10_000, 1_000_000_000, 200, false, Some(10_000)),
            (10_000, 199, 200, false, None),
            (10_000, 0, 200, false, None),
            // Holding nothing, a shard always reads: else it could wait forever.
            (10_000, 0, 200, true, Some(1)),
            (10_000, 199, 200, true, Some(1)),
            (10_000, 400, 200, true, Some(2)),
            // A zero estimate is taken as one byte.
            (3, 10, 0, false, Some(3)),
        ];
        for &(max, granted, per, nothing, want) in table {
            assert_eq!(
                fetch_limit(max, granted, per, nothing),
                want,
                "max {max} granted {granted} per {per} nothing {nothing}"
            );
        }
        // (granted, largest event, holds nothing) → pull
        let pulls: &[(u64, u64, bool, bool)] = &[
            (1_000, 1_000, false, true),
            (999, 1_000, false, false),
            (0, 0, false, false),
            (1, 0, false, true),
            (0, 1_000, true, true),
        ];
        for &(granted, largest, nothing, want) in pulls {
            assert_eq!(
                may_pull(granted, largest, nothing),
                want,
                "{granted} {largest} {nothing}"
            );
        }
    }

    #[test]
    fn a_records_memory_counts_more_than_its_payload() {
        let r = record(7, 0);
        let payload = (r.data.len() + r.partition_key.len()) as u64;
        let memory = record_memory(&r);
        assert_eq!(
            memory,
            payload + std::mem::size_of::<Record>() as u64 + 1,
            "struct + payload + key + the sequence number's one digit"
        );
        let batch: Vec<Record> = (0..65).map(|s| record(s, 0)).collect();
        let records: u64 = batch.iter().map(record_memory).sum();
        let whole = batch_memory(&batch);
        assert!(whole > records, "the batch's own share counts too");
        assert!(
            whole < records + 1_000,
            "and is small: {whole} for {records}"
        );
    }
}
