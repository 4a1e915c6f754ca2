//! Checkpoint modes and routing on the memory backend, in paused time: a user's own
//! processor actor, manual checkpoints, and the ack window's backpressure.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::model::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};
use flotilla_actors::{
    AckToken, Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, ProcessorMsg, Record,
    Worker,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use support::probe::{ProbeFactory, Producer, fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM, shutdown_clean};

/// A user's own actor instead of a `Processor`: it must ack and answer by itself.
struct OwnActor;

impl Actor for OwnActor {
    type Msg = ProcessorMsg;
    type State = Arc<Mutex<Vec<String>>>;
    type Arguments = Arc<Mutex<Vec<String>>>;

    async fn pre_start(
        &self,
        _: ActorRef<ProcessorMsg>,
        seen: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(seen)
    }

    async fn handle(
        &self,
        myself: ActorRef<ProcessorMsg>,
        message: ProcessorMsg,
        seen: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProcessorMsg::Initialize(_) => {}
            ProcessorMsg::Process(batch, checkpointer) => {
                seen.lock().unwrap().extend(
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
async fn batches_can_go_to_a_users_own_actor() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let for_factory = seen.clone();
    let worker = Worker::builder()
        .settings(fast_settings(STREAM, APP))
        .backend(rig.backend())
        .processor_actor(move |_shard| {
            let seen = for_factory.clone();
            async move {
                let (actor, _) = Actor::spawn(None, OwnActor, seen)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(actor)
            }
        })
        .start()
        .await
        .unwrap();
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 10, 30).await;
    let total = producer.total() as usize;
    let s = seen.clone();
    wait_until(
        "every record",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || s.lock().unwrap().len() >= total,
    )
    .await;
    shutdown_clean(worker).await;
    let table = rig.table();
    for lease in table.scan().await.unwrap().leases {
        assert!(matches!(lease.checkpoint, Checkpoint::At(_)), "{lease:?}");
    }
    assert_eq!(seen.lock().unwrap().len(), total, "no duplicates");
}

/// Manual mode: checkpoints only at "k:54", and checks that a checkpoint past what was
/// delivered is refused.
struct ManualAt54 {
    refused: Arc<Mutex<Vec<String>>>,
}

impl Processor for ManualAt54 {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let beyond = ExtendedSequenceNumber::new(SequenceNumber::parse(&"9".repeat(60))?, 0);
        if let Err(e) = cp.checkpoint(beyond).await {
            // Checked by the test (a panic here would only restart the shard).
            self.refused.lock().unwrap().push(e.to_string());
        }
        if let Some(record) = batch.records().iter().find(|r| &r.data[..] == b"key-0:54") {
            cp.checkpoint_record(record).await?;
            cp.flush().await?;
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn manual_checkpoints_are_where_the_processor_puts_them() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 100).await;
    let refused = Arc::new(Mutex::new(Vec::new()));
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Manual;
    settings.reader.max_records = 10;
    let r = refused.clone();
    let worker = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| ManualAt54 { refused: r.clone() })
        .start()
        .await
        .unwrap();
    let r = refused.clone();
    wait_until(
        "ten batches",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || r.lock().unwrap().len() >= 10,
    )
    .await;
    // Several checkpoint intervals later, the checkpoint is still where it was put.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let shard = rig.shards().await[0].id.clone();
    let lease = rig.table().get(&(&shard).into()).await.unwrap().unwrap();
    let all = read_all(&rig).await;
    let at54 = all.iter().find(|r| &r.data[..] == b"key-0:54").unwrap();
    assert_eq!(
        lease.checkpoint,
        Checkpoint::At(ExtendedSequenceNumber::new(at54.sequence_number.clone(), 0))
    );
    worker.abort();

    // The next worker starts right after it.
    let probes = ProbeFactory::new(Default::default());
    let next = rig.start(&probes).await;
    probes.wait_distinct(45, Duration::from_secs(120)).await;
    next.shutdown().await.unwrap();
    assert_eq!(
        probes.snapshot().by_key["key-0"],
        (55..100).collect::<Vec<u64>>()
    );
    assert!(
        refused.lock().unwrap()[0].contains("cannot checkpoint"),
        "{:?}",
        refused.lock().unwrap()
    );
}

/// Every record of the rig's only shard.
async fn read_all(rig: &Rig) -> Vec<Record> {
    rig.records(&rig.shards().await[0].id).await
}

/// Watermark mode, acking nothing by itself: the test acks from outside.
struct Holder {
    pending: Arc<Mutex<Vec<(Checkpointer, AckToken)>>>,
    delivered: Arc<Mutex<u64>>,
}

impl Processor for Holder {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        *self.delivered.lock().unwrap() += batch.len() as u64;
        let mut pending = self.pending.lock().unwrap();
        pending.extend(batch.iter_with_tokens().map(|(t, _)| (cp.clone(), t)));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_ack_window_bounds_what_is_in_flight() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 4, 50).await;
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Watermark;
    settings.reader.max_records = 10;
    settings.reader.window_records = 30;
    let pending = Arc::new(Mutex::new(Vec::new()));
    let delivered = Arc::new(Mutex::new(0u64));
    let (p, d) = (pending.clone(), delivered.clone());
    let worker = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| Holder {
            pending: p.clone(),
            delivered: d.clone(),
        })
        .start()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        *delivered.lock().unwrap(),
        30,
        "fetching stops at the window"
    );
    let status = worker.status().await.unwrap();
    assert_eq!(status.shards[0].in_flight_records, 30);

    // Acking frees the window; everything arrives, 30 at a time at most.
    let mut most_in_flight = 0;
    while *delivered.lock().unwrap() < producer.total() {
        let acks: Vec<(Checkpointer, AckToken)> = pending.lock().unwrap().drain(..).collect();
        for (cp, token) in acks {
            cp.ack(token);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let status = worker.status().await.unwrap();
        most_in_flight = most_in_flight.max(status.shards[0].in_flight_records);
    }
    assert!(most_in_flight <= 30, "{most_in_flight}");
    for (cp, token) in pending.lock().unwrap().drain(..) {
        cp.ack(token);
    }
    shutdown_clean(worker).await;
    let all = read_all(&rig).await;
    let shard = rig.shards().await[0].id.clone();
    let lease = rig.table().get(&(&shard).into()).await.unwrap().unwrap();
    assert_eq!(
        lease.checkpoint,
        Checkpoint::At(ExtendedSequenceNumber::new(
            all.last().unwrap().sequence_number.clone(),
            0
        ))
    );
}

/// Watermark mode: acks each record once handled, and fails once at "key-0:25".
struct AckAsYouGo {
    seen: Arc<Mutex<Vec<String>>>,
    failed: Arc<AtomicBool>,
}

impl Processor for AckAsYouGo {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        for (token, record) in batch.iter_with_tokens() {
            if &record.data[..] == b"key-0:25" && !self.failed.swap(true, Ordering::SeqCst) {
                return Err(ProcessorError::msg("downstream unavailable"));
            }
            self.seen
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&record.data).into_owned());
            cp.ack(token);
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_records_acked_before_it_are_not_delivered_again() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 50).await;
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Watermark;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicBool::new(false));
    let (s, f) = (seen.clone(), failed.clone());
    let worker = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| AckAsYouGo {
            seen: s.clone(),
            failed: f.clone(),
        })
        .start()
        .await
        .unwrap();
    let s = seen.clone();
    wait_until(
        "every record",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || s.lock().unwrap().len() >= 50,
    )
    .await;
    let status = worker.status().await.unwrap();
    assert_eq!(status.shard_restarts, 1);
    worker.shutdown().await.unwrap();
    let expected: Vec<String> = (0..50).map(|i| format!("key-0:{i}")).collect();
    assert_eq!(*seen.lock().unwrap(), expected, "in order, none twice");
}

#[tokio::test(start_paused = true)]
async fn latest_starts_at_the_tip_and_at_timestamp_at_the_instant() {
    use flotilla_actors::InitialPosition;

    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 4, 10).await; // key-N:0..9, before any worker
    tokio::time::sleep(Duration::from_secs(10)).await;
    let instant = rig.streams.clock().wall();
    tokio::time::sleep(Duration::from_secs(1)).await;
    producer.put_round(&rig.streams, STREAM, 4, 10).await; // key-N:10..19, after `instant`

    // AT_TIMESTAMP: from the instant on.
    let mut settings = fast_settings(STREAM, "at-timestamp-app");
    settings.worker.initial_position = InitialPosition::AtTimestamp;
    settings.worker.initial_timestamp = Some(humantime::format_rfc3339_millis(instant).to_string());
    let at_ts = ProbeFactory::new(Default::default());
    let worker = rig.start_with(&at_ts, settings).await;
    at_ts.wait_distinct(40, Duration::from_secs(60)).await;
    worker.shutdown().await.unwrap();
    for k in 0..4 {
        assert_eq!(
            at_ts.snapshot().by_key[&format!("key-{k}")],
            (10..20).collect::<Vec<u64>>()
        );
    }

    // LATEST: nothing already in the stream, only what comes after the start.
    let mut settings = fast_settings(STREAM, "latest-app");
    settings.worker.initial_position = InitialPosition::Latest;
    let latest = ProbeFactory::new(Default::default());
    let worker = rig.start_with(&latest, settings).await;
    let table = rig.dynamo.lease_table("latest-app");
    wait_until(
        "leases at LATEST",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || latest.snapshot().initialized.len() == 2,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    producer.put_round(&rig.streams, STREAM, 4, 10).await; // key-N:20..29
    latest.wait_distinct(40, Duration::from_secs(60)).await;
    worker.shutdown().await.unwrap();
    for k in 0..4 {
        assert_eq!(
            latest.snapshot().by_key[&format!("key-{k}")],
            (20..30).collect::<Vec<u64>>()
        );
    }
    assert_eq!(table.scan().await.unwrap().leases.len(), 2);
}

/// Acks or checkpoints every batch as its mode asks: watermark acks each record, manual
/// checkpoints the batch's last record (and never flushes).
struct CheckpointsEachBatch {
    mode: CheckpointMode,
    delivered: Arc<Mutex<u64>>,
}

impl Processor for CheckpointsEachBatch {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        match self.mode {
            CheckpointMode::Auto => {}
            CheckpointMode::Watermark => {
                for (token, _) in batch.iter_with_tokens() {
                    cp.ack(token);
                }
            }
            CheckpointMode::Manual => cp.checkpoint_batch(batch).await?,
        }
        *self.delivered.lock().unwrap() += batch.len() as u64;
        Ok(())
    }
}

/// In every mode a position goes through the same writer: the first one of a shard is
/// written at once, so a worker killed a second after its first batch leaves none of it
/// to be delivered again. Watermark mode acks record by record here: the positions of
/// those acks queue behind the first one and share its write (in this single-threaded
/// paused-time runtime they all arrive before it; in a live process, those that come
/// later wait for the trailing write).
#[tokio::test(start_paused = true)]
async fn in_every_mode_a_crash_a_second_after_the_first_batch_delivers_none_of_it_again() {
    let mut again = Vec::new();
    for mode in [
        CheckpointMode::Auto,
        CheckpointMode::Watermark,
        CheckpointMode::Manual,
    ] {
        let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
        let mut producer = Producer::default();
        producer.put_round(&rig.streams, STREAM, 1, 100).await;
        let mut settings = fast_settings(STREAM, APP);
        settings.checkpoint.mode = mode;
        settings.checkpoint.interval = Duration::from_secs(5);
        let delivered = Arc::new(Mutex::new(0u64));
        let d = delivered.clone();
        let worker = Worker::builder()
            .settings(settings.clone())
            .backend(rig.backend())
            .processor(move |_| CheckpointsEachBatch {
                mode,
                delivered: d.clone(),
            })
            .start()
            .await
            .unwrap();
        wait_until(
            "the first batch",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || *delivered.lock().unwrap() >= 100,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        worker.abort();

        settings.checkpoint.mode = CheckpointMode::Auto;
        let probes = ProbeFactory::new(Default::default());
        let next = rig.start_with(&probes, settings).await;
        producer.put_round(&rig.streams, STREAM, 1, 10).await;
        probes.wait_distinct(10, Duration::from_secs(120)).await;
        next.shutdown().await.unwrap();
        let seqs = probes.snapshot().by_key["key-0"].clone();
        assert_eq!(seqs.last(), Some(&109), "{mode:?}: {seqs:?}");
        again.push((mode, seqs.iter().filter(|s| **s < 100).count()));
    }
    assert_eq!(
        again,
        [
            (CheckpointMode::Auto, 0),
            (CheckpointMode::Watermark, 0),
            (CheckpointMode::Manual, 0)
        ],
        "records of the first batch delivered again, per mode"
    );
}
