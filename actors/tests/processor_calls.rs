//! What a processor is handed beside its records, on the memory backend in paused time:
//! empty calls on an idle shard (`reader.call_on_empty`), when a batch was fetched and
//! delivered, the shard's end with its children on the last batch, records gathered
//! into fewer calls (`reader.batch_window`), and two-phase checkpoints (a prepared
//! position and state shown to the next owner).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::model::{
    Checkpoint, ExtendedSequenceNumber, LeaseKey, SequenceNumber, ShardId,
};
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{
    Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, Record, ShardInfo, Worker,
};
use support::probe::{Producer, fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM, wait_held};
use tokio::time::Instant;

/// One call to `process`, as the processor saw it.
#[derive(Debug, Clone)]
struct Call {
    shard: ShardId,
    records: usize,
    millis_behind: Option<u64>,
    /// `delivered_at - fetched_at`; `None` if delivered before fetched.
    waited: Option<Duration>,
    at_end: bool,
    children: Vec<ShardId>,
    /// When `process` was called (paused time).
    at: Instant,
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// Records each call; checkpoints each batch in manual mode (an empty one too: that
/// must change nothing); sleeps `slow_first_empty` on its first empty call and
/// `slow_first_batch` on its first batch with records.
#[derive(Clone)]
struct Recorder {
    calls: Calls,
    slow_first_empty: Duration,
    slow_first_batch: Duration,
}

impl Recorder {
    fn new() -> Self {
        Self {
            calls: Calls::default(),
            slow_first_empty: Duration::ZERO,
            slow_first_batch: Duration::ZERO,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn empty_calls(&self) -> usize {
        self.calls().iter().filter(|c| c.records == 0).count()
    }
}

impl Processor for Recorder {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let first_of_its_kind = !self
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| (c.records == 0) == batch.is_empty());
        self.calls.lock().unwrap().push(Call {
            shard: batch.shard_id().clone(),
            records: batch.len(),
            millis_behind: batch.millis_behind_latest(),
            waited: batch
                .delivered_at()
                .checked_duration_since(batch.fetched_at()),
            at_end: batch.is_at_shard_end(),
            children: batch.child_shards().to_vec(),
            at: Instant::now(),
        });
        if first_of_its_kind {
            let pause = if batch.is_empty() {
                self.slow_first_empty
            } else {
                self.slow_first_batch
            };
            tokio::time::sleep(pause).await;
        }
        if cp.mode() == CheckpointMode::Manual {
            cp.checkpoint_batch(batch).await?;
        }
        Ok(())
    }
}

async fn start(rig: &Rig, mode: CheckpointMode, on_empty: bool, processor: &Recorder) -> Worker {
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = mode;
    settings.reader.call_on_empty = on_empty;
    settings.reader.max_records = 10;
    let processor = processor.clone();
    Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| processor.clone())
        .start()
        .await
        .unwrap()
}

/// In every checkpoint mode: an idle shard's processor is called with empty batches
/// only when asked for, each saying the shard is caught up (`millis_behind_latest`
/// 0), and the checkpoint after many of them is where the records put it.
#[tokio::test(start_paused = true)]
async fn an_idle_shard_is_called_empty_only_when_asked_and_its_checkpoint_stays() {
    for mode in [
        CheckpointMode::Auto,
        CheckpointMode::Manual,
        CheckpointMode::Watermark,
    ] {
        for on_empty in [false, true] {
            let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
            let mut producer = Producer::default();
            producer.put_round(&rig.streams, STREAM, 1, 30).await;
            let processor = Recorder::new();
            let worker = start(&rig, mode, on_empty, &processor).await;
            let p = processor.clone();
            wait_until(
                "every record",
                Duration::from_secs(60),
                Duration::from_millis(50),
                || p.calls().iter().map(|c| c.records).sum::<usize>() == 30,
            )
            .await;
            // Long enough for the checkpoint interval to pass many times over.
            tokio::time::sleep(Duration::from_secs(10)).await;
            let shard = rig.shards().await[0].id.clone();
            let row = rig.lease_of(&shard).await;
            let empty = processor.empty_calls();
            if on_empty {
                assert!(empty >= 10, "{mode:?}: {empty} empty calls in 10 s idle");
                for call in processor.calls().iter().filter(|c| c.records == 0) {
                    assert_eq!(call.millis_behind, Some(0), "{mode:?}: {call:?}");
                    assert!(!call.at_end, "{mode:?}: {call:?}");
                }
            } else {
                assert_eq!(empty, 0, "{mode:?}");
            }
            // Where the records alone put the checkpoint (watermark: nothing acked).
            let want_at_last = mode != CheckpointMode::Watermark;
            let last = rig
                .records(&shard)
                .await
                .last()
                .unwrap()
                .sequence_number
                .clone();
            match &row.checkpoint {
                Checkpoint::At(at) => {
                    assert!(want_at_last, "{mode:?} {on_empty}: {:?}", row.checkpoint);
                    assert_eq!(at.sequence, last, "{mode:?} {on_empty}");
                }
                other => assert!(!want_at_last, "{mode:?} {on_empty}: {other:?}"),
            }
            worker.abort();
        }
    }
}

/// A processor busy with an empty call for a long time finds at most one more waiting
/// when it returns, not one per read made meanwhile: a wait of more than a few polls
/// between fetch and delivery happens once.
#[tokio::test(start_paused = true)]
async fn empty_calls_do_not_pile_up_behind_a_slow_processor() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut processor = Recorder::new();
    processor.slow_first_empty = Duration::from_secs(5);
    let worker = start(&rig, CheckpointMode::Auto, true, &processor).await;
    let p = processor.clone();
    wait_until(
        "empty calls after the slow one",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || p.empty_calls() >= 10,
    )
    .await;
    let stale: Vec<Call> = processor
        .calls()
        .into_iter()
        .filter(|c| c.waited.unwrap() > Duration::from_secs(1))
        .collect();
    assert!(stale.len() <= 1, "{stale:#?}");
    worker.abort();
}

/// Each batch says when it was fetched and when it was handed over: a batch queued
/// behind a slow one shows the wait; none is delivered before it was fetched.
#[tokio::test(start_paused = true)]
async fn a_batch_says_when_it_was_fetched_and_delivered() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 50).await;
    let mut processor = Recorder::new();
    processor.slow_first_batch = Duration::from_secs(3);
    let worker = start(&rig, CheckpointMode::Auto, false, &processor).await;
    let p = processor.clone();
    wait_until(
        "every record",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || p.calls().iter().map(|c| c.records).sum::<usize>() == 50,
    )
    .await;
    let calls = processor.calls();
    assert!(calls.iter().all(|c| c.waited.is_some()), "{calls:#?}");
    assert!(
        calls[0].waited.unwrap() < Duration::from_secs(1),
        "{calls:#?}"
    );
    assert!(
        calls[1].waited.unwrap() >= Duration::from_secs(2),
        "the second batch waited behind the first: {calls:#?}"
    );
    worker.abort();
}

/// A split parent's last batch says the shard has ended and names both children; no
/// batch before it says so. With `call_on_empty` the ending read is delivered even
/// when it brings no records.
#[tokio::test(start_paused = true)]
async fn the_last_batch_of_a_split_shard_names_its_children() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 20).await;
    let parent = rig.shards().await[0].clone();
    rig.split_in_half(&parent).await;
    let children: Vec<ShardId> = rig.open_shards().await.into_iter().map(|s| s.id).collect();
    assert_eq!(children.len(), 2);
    let processor = Recorder::new();
    let worker = start(&rig, CheckpointMode::Auto, true, &processor).await;
    let key = LeaseKey::from(&parent.id);
    let mut ended = false;
    for _ in 0..600 {
        let row = rig.table().get(&key).await.unwrap();
        if row.is_some_and(|r| r.checkpoint.is_shard_end()) {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "the parent never reached SHARD_END");
    let of_parent: Vec<Call> = processor
        .calls()
        .into_iter()
        .filter(|c| c.shard == parent.id)
        .collect();
    let (last, before) = of_parent.split_last().unwrap();
    assert!(last.at_end, "{of_parent:#?}");
    let mut named = last.children.clone();
    named.sort();
    let mut want = children.clone();
    want.sort();
    assert_eq!(named, want);
    assert!(
        before.iter().all(|c| !c.at_end && c.children.is_empty()),
        "{of_parent:#?}"
    );
    assert_eq!(of_parent.iter().map(|c| c.records).sum::<usize>(), 20);
    worker.abort();
}

/// A worker on a one-shard stream, reading in `mode` with `reader.batch_window` =
/// `window` and `reader.max_records` = `max`, once reading: `n` records put 300 ms
/// apart (one per read), then a wait for all of them. Every call, and when the first
/// record was put.
async fn trickle(mode: ReadMode, window: Duration, max: u32, n: usize) -> (Vec<Call>, Instant) {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let processor = Recorder::new();
    let mut settings = fast_settings(STREAM, APP);
    settings.reader.mode = mode;
    settings.reader.batch_window = window;
    settings.reader.max_records = max;
    let worker = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor({
            let processor = processor.clone();
            move |_| processor.clone()
        })
        .start()
        .await
        .unwrap();
    wait_held(&[&worker], &[1], Duration::from_secs(30)).await;
    // Reading (in fan-out mode, subscribed) before the first record.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first_put = Instant::now();
    let mut producer = Producer::default();
    for _ in 0..n {
        producer.put_round(&rig.streams, STREAM, 1, 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let p = processor.clone();
    wait_until(
        "every record",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || p.calls().iter().map(|c| c.records).sum::<usize>() == n,
    )
    .await;
    worker.abort();
    let calls = processor.calls();
    assert!(calls.iter().all(|c| c.records > 0), "{mode:?}: {calls:#?}");
    (calls, first_put)
}

fn sizes(calls: &[Call]) -> Vec<usize> {
    calls.iter().map(|c| c.records).collect()
}

/// `reader.batch_window` (Lambda's `MaximumBatchingWindowInSeconds`), in both read
/// modes: records trickling in one per read make one call once the window has passed
/// since the first was read (the batch's `fetched_at`), with no read to trigger it;
/// `max_records` reached hands them over sooner; without a window each read is a call.
#[tokio::test(start_paused = true)]
async fn a_batching_window_gathers_records_read_one_at_a_time_into_one_call() {
    let secs = Duration::from_secs;
    for mode in [ReadMode::Polling, ReadMode::Fanout] {
        // Five records over 1.2 s, a window of 2 s: one call, 2 s after the first read.
        let (calls, first_put) = trickle(mode, secs(2), 10, 5).await;
        assert_eq!(sizes(&calls), [5], "{mode:?}: {calls:#?}");
        let after = calls[0].at - first_put;
        assert!(
            after >= secs(2) && after < Duration::from_millis(2_500),
            "{mode:?}: called {after:?} after the first put"
        );
        // From the first gathered read (the batch's fetched_at) to the call: the
        // window, by its timer (no read comes then in fan-out mode: the next event is
        // the subscription's heartbeat, a second after the last record's).
        let waited = calls[0].waited.unwrap();
        assert!(
            waited >= secs(2) && waited < Duration::from_millis(2_100),
            "{mode:?}: {waited:?} from the first gathered read"
        );

        // max_records 3: the third record (600 ms) hands three over, long before the
        // window of 10 s; the other two wait for theirs.
        let (calls, first_put) = trickle(mode, secs(10), 3, 5).await;
        assert_eq!(sizes(&calls), [3, 2], "{mode:?}: {calls:#?}");
        let after = calls[0].at - first_put;
        assert!(after < secs(1), "{mode:?}: the first call {after:?} after");
        let after = calls[1].at - first_put;
        assert!(
            after >= secs(10),
            "{mode:?}: the second call {after:?} after"
        );

        // No window: a call per read, as each record comes.
        let (calls, first_put) = trickle(mode, Duration::ZERO, 10, 5).await;
        assert_eq!(sizes(&calls), [1, 1, 1, 1, 1], "{mode:?}: {calls:#?}");
        let after = calls[0].at - first_put;
        assert!(after < Duration::from_millis(300), "{mode:?}: {after:?}");
    }
}

/// What a two-phase processor saw and was answered.
#[derive(Debug, Default)]
struct TwoPhaseLog {
    infos: Vec<ShardInfo>,
    answers: Vec<String>,
    prepared: bool,
    /// Where the next owner committed.
    committed: Option<ExtendedSequenceNumber>,
}

/// Manual mode. The first worker's processor (`first`) checkpoints each batch (paced,
/// not flushed) and, at
/// the batch holding record `key-0:54`, only prepares a checkpoint at that record, with
/// state, and stops there (the test then kills its worker). The next owner's
/// processor checks the refusals, then prepares at its first batch's last record and
/// commits it.
struct TwoPhase {
    first: bool,
    log: Arc<Mutex<TwoPhaseLog>>,
}

impl Processor for TwoPhase {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.log.lock().unwrap().infos.push(shard.clone());
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let Some(last) = batch.records().last() else {
            return Ok(());
        };
        let position = |r: &Record| ExtendedSequenceNumber::new(r.sequence_number.clone(), 0);
        if self.first {
            if self.log.lock().unwrap().prepared {
                return Ok(());
            }
            match batch.records().iter().find(|r| &r.data[..] == b"key-0:54") {
                Some(at54) => {
                    cp.prepare_checkpoint(position(at54), Some(b"state-54".to_vec()))
                        .await?;
                    self.log.lock().unwrap().prepared = true;
                }
                // Not flushed: the last of these is still to be written when the
                // prepare comes, and must not remove the prepared one afterwards.
                None => cp.checkpoint_batch(batch).await?,
            }
            return Ok(());
        }
        if self.log.lock().unwrap().committed.is_some() {
            return Ok(());
        }
        let beyond = ExtendedSequenceNumber::new(SequenceNumber::parse(&"9".repeat(60))?, 0);
        let refusals = [
            cp.prepare_checkpoint(beyond, None).await.err(),
            // Before the checkpoint the last owner committed (and within what was
            // delivered).
            cp.prepare_checkpoint(
                ExtendedSequenceNumber::new(SequenceNumber::parse("1")?, 0),
                None,
            )
            .await
            .err(),
        ];
        let prepared = cp
            .prepare_checkpoint(position(last), Some(b"state-b".to_vec()))
            .await?;
        prepared.checkpoint().await?;
        let mut log = self.log.lock().unwrap();
        log.answers
            .extend(refusals.iter().map(|r| format!("{r:?}")));
        log.committed = Some(position(last));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_prepared_checkpoint_and_its_state_reach_the_next_owner() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 100).await;
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Manual;
    settings.reader.max_records = 10;
    let log = Arc::new(Mutex::new(TwoPhaseLog::default()));
    let start = |first: bool| {
        let log = log.clone();
        Worker::builder()
            .settings(settings.clone())
            .backend(rig.backend())
            .processor(move |_| TwoPhase {
                first,
                log: log.clone(),
            })
            .start()
    };
    let worker = start(true).await.unwrap();
    let l = log.clone();
    wait_until(
        "the prepare",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || l.lock().unwrap().prepared,
    )
    .await;
    // Several checkpoint intervals: a paced write of an earlier position would land now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    worker.abort();

    let shard = rig.shards().await[0].id.clone();
    let all = rig.records(&shard).await;
    let at = |data: &str| {
        let r = all.iter().find(|r| &r.data[..] == data.as_bytes()).unwrap();
        ExtendedSequenceNumber::new(r.sequence_number.clone(), 0)
    };
    let row = rig.lease_of(&shard).await;
    assert_eq!(row.checkpoint, Checkpoint::At(at("key-0:49")));
    assert_eq!(row.pending_checkpoint, Some(at("key-0:54")));
    assert_eq!(row.pending_checkpoint_state, Some(b"state-54".to_vec()));

    let next = start(false).await.unwrap();
    let l = log.clone();
    wait_until(
        "the next owner's commit",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || l.lock().unwrap().committed.is_some(),
    )
    .await;
    let row = rig.lease_of(&shard).await;
    let log = log.lock().unwrap();
    let info = log.infos.last().unwrap();
    assert_eq!(info.starting_at, Checkpoint::At(at("key-0:49")));
    assert_eq!(info.pending_checkpoint, Some(at("key-0:54")));
    assert_eq!(
        info.pending_checkpoint_state.as_deref(),
        Some(&b"state-54"[..])
    );
    assert!(
        log.answers[0].contains("BeyondDelivered"),
        "{:?}",
        log.answers
    );
    assert!(
        log.answers[1].contains("BeforeCheckpoint"),
        "{:?}",
        log.answers
    );
    assert_eq!(
        row.checkpoint,
        Checkpoint::At(log.committed.clone().unwrap())
    );
    assert!(log.committed.clone().unwrap() > at("key-0:54"), "{row:?}");
    assert_eq!(row.pending_checkpoint, None);
    assert_eq!(row.pending_checkpoint_state, None);
    drop(log);
    next.abort();
}

/// Outside manual mode a prepare is refused with its reason: the reader's own
/// checkpoints would remove it.
#[tokio::test(start_paused = true)]
async fn a_prepare_outside_manual_mode_is_refused() {
    struct PreparesOnce(Arc<Mutex<Vec<String>>>);
    impl Processor for PreparesOnce {
        async fn process(
            &mut self,
            batch: &Batch,
            cp: &Checkpointer,
        ) -> Result<(), ProcessorError> {
            if let Some(last) = batch.records().last() {
                let at = ExtendedSequenceNumber::new(last.sequence_number.clone(), 0);
                let answer = cp.prepare_checkpoint(at, None).await;
                self.0.lock().unwrap().push(format!("{:?}", answer.err()));
            }
            Ok(())
        }
    }
    for mode in [CheckpointMode::Auto, CheckpointMode::Watermark] {
        let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
        let mut producer = Producer::default();
        producer.put_round(&rig.streams, STREAM, 1, 5).await;
        let mut settings = fast_settings(STREAM, APP);
        settings.checkpoint.mode = mode;
        let answers = Arc::new(Mutex::new(Vec::new()));
        let a = answers.clone();
        let worker = Worker::builder()
            .settings(settings)
            .backend(rig.backend())
            .processor(move |_| PreparesOnce(a.clone()))
            .start()
            .await
            .unwrap();
        let a = answers.clone();
        wait_until(
            "an answer",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || !a.lock().unwrap().is_empty(),
        )
        .await;
        let got = answers.lock().unwrap()[0].clone();
        assert!(got.contains("PrepareNeedsManualMode"), "{mode:?}: {got}");
        let shard = rig.shards().await[0].id.clone();
        assert_eq!(rig.lease_of(&shard).await.pending_checkpoint, None);
        worker.abort();
    }
}
