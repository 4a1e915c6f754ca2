//! `processor.parallelism`: lanes within a shard, on the memory backend in paused time.
//! Each test names what it guards: per-key order while lanes work at once, the
//! checkpoint as the watermark across lanes (a slow lane holds it back, and `/status`
//! says which), every lane stopped by a shutdown, manual checkpoints per lane, and a
//! user's own actor per lane.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::model::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};
use flotilla_actors::{
    Batch, CheckpointError, CheckpointMode, Checkpointer, Processor, ProcessorError, ProcessorMsg,
    Settings, ShardInfo, Worker,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use support::probe::{Producer, Seen, fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM, shutdown_clean};
use tokio::sync::Notify;

/// What every lane of a test saw and did.
#[derive(Default)]
struct Shared {
    seen: Mutex<Seen>,
    /// `process` calls running now, and the most ever at once.
    inside: AtomicUsize,
    most_inside: AtomicUsize,
    /// Calls begun since the test said so (`watch`).
    begun_after: AtomicUsize,
    watch: AtomicBool,
    processors: AtomicUsize,
    shutdowns: AtomicUsize,
    /// Batches holding a record of this key wait for `gate` (until `open`).
    held_key: Mutex<Option<String>>,
    gate: Notify,
    open: AtomicBool,
    /// Manual mode: the checkpoint errors seen (a prepared checkpoint with lanes).
    refused: Mutex<Vec<CheckpointError>>,
    /// The processors (by the order they were initialized in) that had an empty call.
    empty_calls: Mutex<HashSet<usize>>,
}

/// A lane's processor: takes `per_record` of (virtual) time per record, counts how many
/// lanes are inside `process` at once, and records each key's order.
struct LaneProbe {
    shared: Arc<Shared>,
    per_record: Duration,
    manual: bool,
    /// Which processor this is, in the order of `initialize`.
    me: usize,
}

impl LaneProbe {
    fn holds(&self, batch: &Batch) -> bool {
        let held = self.shared.held_key.lock().unwrap().clone();
        held.is_some_and(|key| batch.records().iter().any(|r| r.partition_key == key))
    }
}

impl Processor for LaneProbe {
    async fn initialize(&mut self, _: &ShardInfo) -> Result<(), ProcessorError> {
        self.me = self.shared.processors.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let shared = &self.shared;
        if batch.is_empty() {
            shared.empty_calls.lock().unwrap().insert(self.me);
            return Ok(());
        }
        if shared.watch.load(Ordering::SeqCst) {
            shared.begun_after.fetch_add(1, Ordering::SeqCst);
        }
        let now = shared.inside.fetch_add(1, Ordering::SeqCst) + 1;
        shared.most_inside.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.per_record * batch.len() as u32).await;
        let held = self.holds(batch);
        while held && !shared.open.load(Ordering::SeqCst) {
            let _ = tokio::time::timeout(Duration::from_millis(50), shared.gate.notified()).await;
        }
        {
            let mut seen = shared.seen.lock().unwrap();
            for record in batch.records() {
                seen.deliveries += 1;
                let text = String::from_utf8_lossy(&record.data).into_owned();
                if let Some((key, seq)) = text.split_once(':') {
                    let seq: u64 = seq.parse().unwrap();
                    seen.by_key.entry(key.to_owned()).or_default().push(seq);
                }
            }
        }
        shared.inside.fetch_sub(1, Ordering::SeqCst);
        if self.manual {
            // A lane's checkpoint: its own records up to here are done.
            cp.checkpoint_batch(batch).await?;
            if let Some(last) = batch.records().last() {
                let at = ExtendedSequenceNumber::new(last.sequence_number.clone(), 0);
                if let Err(error) = cp.prepare_checkpoint(at, None).await {
                    shared.refused.lock().unwrap().push(error);
                }
            }
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.shared.shutdowns.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn settings(parallelism: u16, mode: CheckpointMode) -> Settings {
    let mut settings = fast_settings(STREAM, APP);
    settings.processor.parallelism = parallelism;
    settings.checkpoint.mode = mode;
    settings
}

async fn start(
    rig: &Rig,
    shared: &Arc<Shared>,
    settings: Settings,
    per_record: Duration,
) -> Worker {
    let manual = settings.checkpoint.mode == CheckpointMode::Manual;
    let shared = shared.clone();
    Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| LaneProbe {
            shared: shared.clone(),
            per_record,
            manual,
            me: 0,
        })
        .start()
        .await
        .unwrap()
}

/// Every record of `producer` processed once, each key in order.
fn assert_all_in_order(shared: &Shared, producer: &Producer) {
    let verdict = shared.seen.lock().unwrap().verdict(&producer.produced);
    assert_eq!(
        (verdict.lost, verdict.order_violations),
        (0, 0),
        "{verdict:?}"
    );
}

async fn wait_processed(shared: &Arc<Shared>, count: u64) {
    let s = shared.clone();
    wait_until(
        "every record",
        Duration::from_secs(600),
        Duration::from_millis(50),
        move || s.seen.lock().unwrap().distinct() >= count,
    )
    .await;
}

/// The one shard's checkpoint, as its lease row has it.
async fn checkpoint(rig: &Rig) -> Checkpoint {
    let shard = rig.shards().await.remove(0).id;
    rig.lease_of(&shard).await.checkpoint
}

/// Starts a worker with 4 lanes in `mode` whose lane of `key-0` is held, puts 16 keys ×
/// 20 records, and waits until the other lanes are done. Checks that the shard's
/// checkpoint stayed before the held key's first record, and returns the worker, the
/// producer and the last record's sequence number.
async fn hold_one_lane(
    rig: &Rig,
    shared: &Arc<Shared>,
    mode: CheckpointMode,
) -> (Worker, Producer, SequenceNumber) {
    *shared.held_key.lock().unwrap() = Some("key-0".to_owned());
    let worker = start(rig, shared, settings(4, mode), Duration::ZERO).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 16, 20).await;
    let records = rig.records(&rig.shards().await[0].id).await;
    let first_held = records
        .iter()
        .find(|r| r.partition_key == "key-0")
        .unwrap()
        .sequence_number
        .clone();
    let s = shared.clone();
    wait_until(
        "the other lanes",
        Duration::from_secs(60),
        Duration::from_millis(50),
        move || s.seen.lock().unwrap().by_key.len() >= 10,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Checkpoint::At(at) = checkpoint(rig).await {
        assert!(
            at.sequence < first_held,
            "{mode:?}: {at:?} passed the held lane"
        );
    }
    let last = records.last().unwrap().sequence_number.clone();
    (worker, producer, last)
}

/// Releases the held lane and waits until every record is processed and the shard's
/// checkpoint is at `last`.
async fn release_and_reach(
    rig: &Rig,
    shared: &Arc<Shared>,
    producer: &Producer,
    last: &SequenceNumber,
) {
    shared.open.store(true, Ordering::SeqCst);
    wait_processed(shared, producer.total()).await;
    for _ in 0..100 {
        if matches!(checkpoint(rig).await, Checkpoint::At(at) if at.sequence == *last) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the checkpoint never reached the last record once the lane was released");
}

/// With 8 lanes, batches of one shard are processed at once, and each key's records
/// still come in order, none lost; with 1 lane (the default) never two at once. Breaks
/// if the dealer deals by anything but the key (order), or the reader waits for each
/// batch before the next (no overlap).
#[tokio::test(start_paused = true)]
async fn lanes_work_at_once_and_keep_each_key_in_order() {
    for (parallelism, overlap) in [(1u16, false), (8, true)] {
        let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
        let shared = Arc::new(Shared::default());
        let mut s = settings(parallelism, CheckpointMode::Auto);
        s.reader.max_records = 50;
        let worker = start(&rig, &shared, s, Duration::from_millis(5)).await;
        let mut producer = Producer::default();
        for _ in 0..4 {
            producer.put_round(&rig.streams, STREAM, 32, 10).await;
        }
        wait_processed(&shared, producer.total()).await;
        shutdown_clean(worker).await;
        assert_all_in_order(&shared, &producer);
        let most = shared.most_inside.load(Ordering::SeqCst);
        assert_eq!(
            most > 1,
            overlap,
            "parallelism {parallelism}: {most} at once"
        );
        assert!(most <= usize::from(parallelism), "{most} > {parallelism}");
        assert_eq!(
            shared.processors.load(Ordering::SeqCst),
            usize::from(parallelism),
            "one processor per lane"
        );
        match checkpoint(&rig).await {
            Checkpoint::At(at) => {
                let last = rig.records(&rig.shards().await[0].id).await;
                assert_eq!(at.sequence, last.last().unwrap().sequence_number);
            }
            other => panic!("parallelism {parallelism}: checkpoint {other:?}"),
        }
    }
}

/// One lane is held: the other lanes go on, the shard's checkpoint stays before the
/// held key's first record (the acked prefix across the lanes), and `/status` shows
/// the held lane with its records pending and the others with none. Once released,
/// the checkpoint reaches the last record. Breaks if a lane's share is acked as the
/// whole batch (the checkpoint would pass the held records).
#[tokio::test(start_paused = true)]
async fn a_slow_lane_holds_the_checkpoint_back_and_shows_in_status() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let shared = Arc::new(Shared::default());
    let (worker, producer, last) = hold_one_lane(&rig, &shared, CheckpointMode::Auto).await;
    let status = worker.status().await.unwrap();
    let lanes = &status.shards[0].lanes;
    assert_eq!(lanes.len(), 4, "{lanes:?}");
    let holding: Vec<_> = lanes.iter().filter(|l| l.pending_records > 0).collect();
    assert!(!holding.is_empty(), "{lanes:?}");
    assert!(
        holding.iter().all(|l| l.oldest_pending_ms.is_some()),
        "{lanes:?}"
    );
    assert!(
        lanes.iter().any(|l| l.pending_records == 0),
        "the other lanes are done: {lanes:?}"
    );
    release_and_reach(&rig, &shared, &producer, &last).await;
    shutdown_clean(worker).await;
    assert_all_in_order(&shared, &producer);
}

/// A shutdown while every lane is busy: each lane is asked `shutdown_requested`, no
/// lane begins a batch after the shutdown returns, and the next worker processes what
/// was left, nothing lost. Breaks if the dealer leaves a lane running (it would go on
/// with its queued batches) or answers before every lane has.
#[tokio::test(start_paused = true)]
async fn a_shutdown_stops_every_lane() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let shared = Arc::new(Shared::default());
    let mut s = settings(4, CheckpointMode::Auto);
    s.reader.max_records = 20;
    let worker = start(&rig, &shared, s.clone(), Duration::from_millis(200)).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 16, 20).await;
    let sh = shared.clone();
    wait_until(
        "all lanes busy",
        Duration::from_secs(60),
        Duration::from_millis(10),
        move || sh.inside.load(Ordering::SeqCst) >= 2,
    )
    .await;
    shutdown_clean(worker).await;
    assert_eq!(
        shared.shutdowns.load(Ordering::SeqCst),
        4,
        "each lane asked"
    );
    shared.watch.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        shared.begun_after.load(Ordering::SeqCst),
        0,
        "a lane went on after the shutdown"
    );
    assert!(
        shared.seen.lock().unwrap().distinct() < producer.total(),
        "the shutdown came before the end"
    );
    shared.watch.store(false, Ordering::SeqCst);
    let next = start(&rig, &shared, s, Duration::ZERO).await;
    wait_processed(&shared, producer.total()).await;
    shutdown_clean(next).await;
    let verdict = shared.seen.lock().unwrap().verdict(&producer.produced);
    assert_eq!(verdict.lost, 0, "{verdict:?}");
}

/// Manual mode with lanes: each lane checkpoints its own batches; the shard's
/// checkpoint is the watermark across lanes, so a held lane keeps it before its first
/// record even though later lanes checkpointed past it. A prepared checkpoint is
/// refused, naming the setting.
#[tokio::test(start_paused = true)]
async fn manual_checkpoints_of_lanes_move_the_shard_as_a_watermark() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let shared = Arc::new(Shared::default());
    let (worker, producer, last) = hold_one_lane(&rig, &shared, CheckpointMode::Manual).await;
    release_and_reach(&rig, &shared, &producer, &last).await;
    shutdown_clean(worker).await;
    let refused = shared.refused.lock().unwrap();
    assert!(!refused.is_empty());
    assert!(
        refused
            .iter()
            .all(|e| matches!(e, CheckpointError::PrepareNeedsOneLane { .. })),
        "{refused:?}"
    );
    assert!(refused[0].to_string().contains("processor.parallelism"));
}

/// `reader.call_on_empty` with lanes: a read that brings nothing is an empty call to
/// every lane's processor. Breaks if the dealer sends the empty batch to one lane.
#[tokio::test(start_paused = true)]
async fn an_empty_read_calls_every_lane() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let shared = Arc::new(Shared::default());
    let mut s = settings(4, CheckpointMode::Auto);
    s.reader.call_on_empty = true;
    let worker = start(&rig, &shared, s, Duration::ZERO).await;
    let sh = shared.clone();
    wait_until(
        "an empty call in every lane",
        Duration::from_secs(60),
        Duration::from_millis(50),
        move || sh.empty_calls.lock().unwrap().len() == 4,
    )
    .await;
    shutdown_clean(worker).await;
}

/// A user's own processor actor: with lanes, the factory is called once per lane, and
/// every record reaches one of them once.
struct OwnActor(Arc<Mutex<Vec<String>>>);

impl Actor for OwnActor {
    type Msg = ProcessorMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<ProcessorMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ProcessorMsg>,
        message: ProcessorMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProcessorMsg::Initialize(_) => {}
            ProcessorMsg::Process(batch, checkpointer) => {
                self.0.lock().unwrap().extend(
                    batch
                        .records()
                        .iter()
                        .map(|r| String::from_utf8_lossy(&r.data).into_owned()),
                );
                checkpointer.ack_batch(&batch);
            }
            ProcessorMsg::LeaseLost => myself.stop(None),
            ProcessorMsg::ShardEnded(_, reply) | ProcessorMsg::ShutdownRequested(_, reply) => {
                let _ = reply.send(Ok(()));
            }
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_users_own_actor_serves_each_lane() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let made = Arc::new(AtomicUsize::new(0));
    let (for_factory, m) = (seen.clone(), made.clone());
    let worker = Worker::builder()
        .settings(settings(4, CheckpointMode::Watermark))
        .backend(rig.backend())
        .processor_actor(move |_shard| {
            let seen = for_factory.clone();
            m.fetch_add(1, Ordering::SeqCst);
            async move {
                let (actor, _) = Actor::spawn(None, OwnActor(seen), ())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(actor)
            }
        })
        .start()
        .await
        .unwrap();
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 16, 20).await;
    let total = producer.total() as usize;
    let s = seen.clone();
    wait_until(
        "every record",
        Duration::from_secs(60),
        Duration::from_millis(50),
        move || s.lock().unwrap().len() >= total,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    shutdown_clean(worker).await;
    assert_eq!(
        made.load(Ordering::SeqCst),
        8,
        "4 lanes on each of 2 shards"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), total, "no duplicates");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), total);
    for shard in rig.shards().await {
        let records = rig.records(&shard.id).await;
        let Some(last) = records.last() else { continue };
        match rig.lease_of(&shard.id).await.checkpoint {
            Checkpoint::At(at) => assert_eq!(at.sequence, last.sequence_number),
            other => panic!("{other:?}"),
        }
    }
}
