//! A record the processor cannot handle never stops its shard (`[failure]`, issue 32):
//! bisection to the bad record, partial batch failures, bounded retries, a maximum record
//! age, and a destination that is written before anything is discarded. Each test runs a
//! worker on the memory backend and checks the guarantee: every record is processed or
//! written to the destination, never neither, never both; the records of a key are
//! processed in order; what waits is a visible stall.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::failure::{DeadLetters, DestinationError, Envelope};
use flotilla_actors::settings::{CheckpointMode, Destination};
use flotilla_actors::{
    Batch, Checkpointer, Processor, ProcessorError, Settings, ShardState, Worker, WorkerStatus,
};

use support::http::json_until;
use support::probe::fast_settings;
use support::rig::{APP, Rig, STREAM};

/// What the processors of a test did: each record processed, as (key, data), in order.
#[derive(Clone, Default)]
struct Log {
    processed: Arc<Mutex<Vec<(String, String)>>>,
    calls: Arc<AtomicU32>,
}

/// Refuses any part holding a record whose data starts with `poison`. `partial`: it
/// processes the records before the bad one and names it (Lambda's
/// `batchItemFailures`); otherwise it processes nothing of a part it refuses (an
/// all-or-nothing write).
struct Refusing {
    log: Log,
    partial: bool,
}

impl Processor for Refusing {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.log.calls.fetch_add(1, Ordering::SeqCst);
        let records = batch.records();
        let bad = records.iter().position(|r| r.data.starts_with(b"poison"));
        let good = match (bad, self.partial) {
            (None, _) => records,
            (Some(at), true) => &records[..at],
            (Some(_), false) => &records[..0],
        };
        let mut processed = self.log.processed.lock().unwrap();
        for record in good {
            let data = String::from_utf8_lossy(&record.data).into_owned();
            processed.push((record.partition_key.clone(), data));
        }
        match bad {
            None => Ok(()),
            Some(at) => {
                let error = ProcessorError::msg("cannot parse the record");
                Err(if self.partial {
                    error.at_record(&records[at])
                } else {
                    error
                })
            }
        }
    }
}

/// A destination in memory that refuses writes while `down` is set.
#[derive(Clone, Default)]
struct Recording {
    written: Arc<Mutex<Vec<Envelope>>>,
    down: Arc<AtomicBool>,
    refused: Arc<AtomicU32>,
}

impl DeadLetters for Recording {
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>> {
        Box::pin(async move {
            if self.down.load(Ordering::SeqCst) {
                self.refused.fetch_add(1, Ordering::SeqCst);
                return Err(DestinationError {
                    destination: self.name(),
                    why: "connection refused".into(),
                });
            }
            self.written.lock().unwrap().extend_from_slice(envelopes);
            Ok(())
        })
    }

    fn name(&self) -> String {
        "test:recording".into()
    }
}

impl Recording {
    fn data(&self) -> Vec<String> {
        use base64::Engine as _;
        self.written
            .lock()
            .unwrap()
            .iter()
            .map(|e| {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(&e.data)
                    .unwrap();
                String::from_utf8(bytes).unwrap()
            })
            .collect()
    }
}

fn settings(max_retries: Option<u32>, bisect: bool, destination: bool) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some("w".into());
    s.failure.max_retries = max_retries;
    s.failure.bisect = bisect;
    // The recording destination is given to the backend; the setting says one is set.
    s.failure.destination = destination.then(|| Destination::File("unused".into()));
    s.supervision.restart_backoff_min = Duration::from_millis(5);
    s.supervision.restart_backoff_max = Duration::from_millis(40);
    s
}

/// Puts `n` records over 10 keys into the one shard; the `bad` ones carry poison.
async fn put(rig: &Rig, n: usize, bad: &[usize]) -> Vec<(String, String)> {
    let mut sent = Vec::new();
    let records: Vec<PutRecord> = (0..n)
        .map(|i| {
            let key = format!("k{}", i % 10);
            let data = if bad.contains(&i) {
                format!("poison-{i}")
            } else {
                format!("good-{i}")
            };
            sent.push((key.clone(), data.clone()));
            PutRecord {
                partition_key: key,
                explicit_hash_key: None,
                data: data.into(),
            }
        })
        .collect();
    rig.streams.put_records(STREAM, &records).await.unwrap();
    sent
}

/// A worker with the processors `make` builds (each given the test's log), and the
/// recording destination `dl` if any.
async fn launch<P: Processor>(
    rig: &Rig,
    settings: Settings,
    dl: Option<&Recording>,
    log: &Log,
    make: impl Fn(Log) -> P + Send + Sync + 'static,
) -> Worker {
    let mut backend = rig.backend();
    if let Some(dl) = dl {
        backend = backend.with_dead_letters(Arc::new(dl.clone()));
    }
    let log = log.clone();
    Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_| make(log.clone()))
        .start()
        .await
        .unwrap()
}

async fn start(rig: &Rig, settings: Settings, log: &Log, partial: bool, dl: &Recording) -> Worker {
    launch(rig, settings, Some(dl), log, move |log| Refusing {
        log,
        partial,
    })
    .await
}

/// Waits until `done` holds, for up to 20 s.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

/// The worker's one shard, as its status shows it, once `ok` holds.
async fn shard_until(
    worker: &Worker,
    what: &str,
    ok: impl Fn(&flotilla_actors::ShardStatus) -> bool,
) -> WorkerStatus {
    for _ in 0..400 {
        let status = worker.status().await.unwrap();
        if status.shards.first().is_some_and(&ok) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the shard never showed {what}: {:?}", worker.status().await);
}

/// The guarantee: each record processed or discarded, not both, not neither; each key's
/// records processed in the order they were put.
fn check(sent: &[(String, String)], log: &Log, dl: &Recording) {
    let processed = log.processed.lock().unwrap().clone();
    let discarded: BTreeSet<String> = dl.data().into_iter().collect();
    let done: BTreeSet<String> = processed.iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(done.len(), processed.len(), "a record processed twice");
    for (_, data) in sent {
        let (p, d) = (done.contains(data), discarded.contains(data));
        assert!(p != d, "{data}: processed {p}, discarded {d}");
    }
    let mut order: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let index = |data: &str| sent.iter().position(|(_, d)| d == data).unwrap();
    for (key, data) in &processed {
        order.entry(key).or_default().push(index(data));
    }
    for (key, seen) in order {
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "{key} out of order: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bisection_finds_the_poison_record_and_delivers_the_rest_in_order() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 300, &[57, 211]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let worker = start(&rig, settings(Some(1), true, true), &log, false, &dl).await;
    until("300 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 300
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.data(), ["poison-57", "poison-211"]);
    let envelope = dl.written.lock().unwrap()[0].clone();
    assert_eq!(envelope.stream, STREAM);
    assert_eq!(envelope.partition_key, "k7");
    assert_eq!(envelope.reason, "retries");
    assert_eq!(envelope.worker, "w");
    assert_eq!(envelope.error.as_deref(), Some("cannot parse the record"));
    // Alone, it was handed over twice (max_retries = 1), and in each half above it.
    assert!(envelope.attempts >= 2, "{envelope:?}");
    let status = shard_until(&worker, "2 discarded", |s| s.records_discarded == 2).await;
    let shard = &status.shards[0];
    let last = shard.last_failure.clone().unwrap();
    assert!(last.contains("cannot parse the record"), "{last}");
    assert_ne!(shard.state, ShardState::Stalled);
    // The fleet view, on the owner's own `/fleet`: the lease carries them too.
    let fleet = json_until(&worker, "/fleet", "the lease's discards", |fleet| {
        fleet["leases"][0]["records_discarded"] == 2
    })
    .await;
    let lease = &fleet["leases"][0];
    let last = lease["last_failure"].as_str().unwrap();
    assert!(last.contains("cannot parse the record"), "{lease}");
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_failure_keeps_the_records_before_it_and_retries_from_it() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 100, &[40]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let worker = start(&rig, settings(Some(2), false, true), &log, true, &dl).await;
    until("100 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 100
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.data(), ["poison-40"]);
    assert_eq!(dl.written.lock().unwrap()[0].attempts, 3);
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bisect_the_whole_failing_batch_is_discarded_after_its_retries() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 20, &[5]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let worker = start(&rig, settings(Some(1), false, true), &log, false, &dl).await;
    until("20 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 20
    })
    .await;
    check(&sent, &log, &dl);
    assert!(dl.data().contains(&"poison-5".to_owned()));
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_destination_nothing_is_discarded_and_the_shard_says_why_it_waits() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    put(&rig, 30, &[10]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let mut s = settings(Some(0), true, false);
    s.supervision.restart_backoff_max = Duration::from_millis(100);
    let worker = launch(&rig, s, None, &log, move |log| Refusing {
        log,
        partial: false,
    })
    .await;
    let status = shard_until(&worker, "a stall", |s| s.state == ShardState::Stalled).await;
    let why = status.shards[0].stall.clone().unwrap();
    assert!(why.contains("failure.destination is not set"), "{why}");
    assert!(why.contains("cannot parse the record"), "{why}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let processed = log.processed.lock().unwrap().clone();
    // Records 0..10 are through; the poison and everything after it wait.
    assert_eq!(processed.len(), 10, "{processed:?}");
    assert!(dl.written.lock().unwrap().is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_cannot_be_written_holds_the_shard_until_it_can() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 50, &[20]).await;
    let (log, dl) = (Log::default(), Recording::default());
    dl.down.store(true, Ordering::SeqCst);
    let worker = start(&rig, settings(Some(0), true, true), &log, false, &dl).await;
    let status = shard_until(&worker, "a stall", |s| s.state == ShardState::Stalled).await;
    let why = status.shards[0].stall.clone().unwrap();
    assert!(why.contains("cannot be written"), "{why}");
    assert!(why.contains("connection refused"), "{why}");
    until("refused again", || dl.refused.load(Ordering::SeqCst) >= 3).await;
    assert_eq!(
        log.processed.lock().unwrap().len(),
        20,
        "nothing past the poison"
    );
    dl.down.store(false, Ordering::SeqCst);
    until("50 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 50
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.data(), ["poison-20"]);
    shard_until(&worker, "no stall", |s| s.state != ShardState::Stalled).await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_older_than_the_age_limit_are_discarded_for_their_age() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut sent = put(&rig, 10, &[]).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (log, dl) = (Log::default(), Recording::default());
    let mut s = settings(None, false, true);
    s.failure.max_record_age = Some(Duration::from_secs(1));
    let worker = start(&rig, s, &log, false, &dl).await;
    let fresh: Vec<PutRecord> = (0..5)
        .map(|i| PutRecord {
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: format!("fresh-{i}").into(),
        })
        .collect();
    rig.streams.put_records(STREAM, &fresh).await.unwrap();
    sent.extend((0..5).map(|i| ("k".to_owned(), format!("fresh-{i}"))));
    until("15 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 15
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.written.lock().unwrap().len(), 10);
    assert!(
        dl.written
            .lock()
            .unwrap()
            .iter()
            .all(|e| e.reason == "age" && e.attempts == 0)
    );
    assert_eq!(log.processed.lock().unwrap().len(), 5);
    worker.shutdown().await.unwrap();
}

/// Watermark mode: the processor acks each record itself; the discarded ones are acked
/// for it, so the checkpoint moves past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_watermark_mode_the_checkpoint_moves_past_a_discarded_record() {
    struct Acking(Refusing);
    impl Processor for Acking {
        async fn process(
            &mut self,
            batch: &Batch,
            cp: &Checkpointer,
        ) -> Result<(), ProcessorError> {
            self.0.process(batch, cp).await?;
            cp.ack_all(batch.iter_with_tokens().map(|(token, _)| token));
            Ok(())
        }
    }
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 40, &[39]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let mut s = settings(Some(0), true, true);
    s.checkpoint.mode = CheckpointMode::Watermark;
    let worker = launch(&rig, s, Some(&dl), &log, move |log| {
        Acking(Refusing {
            log,
            partial: false,
        })
    })
    .await;
    until("40 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 40
    })
    .await;
    check(&sent, &log, &dl);
    // The last record was the discarded one: the checkpoint reaches it.
    let last = dl.written.lock().unwrap()[0].sequence_number.clone();
    shard_until(&worker, "the checkpoint at the discarded record", |s| {
        s.checkpoint
            .as_deref()
            .is_some_and(|c| c.starts_with(&last))
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// A processor written as an actor of its own: it reports a part it cannot process
/// with `Checkpointer::fail_batch` (`fails`), or panics on it (the actor fails and a new
/// one from the factory takes the retry).
struct RefusingActor;

struct ActorArgs {
    log: Log,
    panics: bool,
}

impl ractor::Actor for RefusingActor {
    type Msg = flotilla_actors::ProcessorMsg;
    type State = ActorArgs;
    type Arguments = ActorArgs;

    async fn pre_start(
        &self,
        _: ractor::ActorRef<Self::Msg>,
        args: ActorArgs,
    ) -> Result<ActorArgs, ractor::ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _: ractor::ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut ActorArgs,
    ) -> Result<(), ractor::ActorProcessingErr> {
        use flotilla_actors::ProcessorMsg;
        match message {
            ProcessorMsg::Process(batch, cp) => {
                let mut refusing = Refusing {
                    log: state.log.clone(),
                    partial: false,
                };
                match refusing.process(&batch, &cp).await {
                    Ok(()) => cp.ack_batch(&batch),
                    Err(error) if state.panics => panic!("cannot go on: {error}"),
                    Err(error) => cp.fail_batch(&batch, error),
                }
            }
            ProcessorMsg::ShardEnded(_, reply) | ProcessorMsg::ShutdownRequested(_, reply) => {
                let _ = reply.send(Ok(()));
            }
            _ => {}
        }
        Ok(())
    }
}

async fn start_actor(rig: &Rig, log: &Log, panics: bool, dl: &Recording) -> Worker {
    let log = log.clone();
    Worker::builder()
        .settings(settings(Some(1), true, true))
        .backend(rig.backend().with_dead_letters(Arc::new(dl.clone())))
        .processor_actor(move |_| {
            let log = log.clone();
            async move {
                let (actor, _) =
                    ractor::Actor::spawn(None, RefusingActor, ActorArgs { log, panics })
                        .await
                        .map_err(|e| e.to_string())?;
                Ok(actor)
            }
        })
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_actor_gets_the_same_policy_through_its_checkpointer() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 120, &[33, 90]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let worker = start_actor(&rig, &log, false, &dl).await;
    until("120 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 120
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.data(), ["poison-33", "poison-90"]);
    shard_until(&worker, "2 discarded", |s| s.records_discarded == 2).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_actor_that_fails_on_a_record_is_replaced_for_the_retry() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 60, &[41]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let worker = start_actor(&rig, &log, true, &dl).await;
    until("60 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 60
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.data(), ["poison-41"]);
    let error = dl.written.lock().unwrap()[0].error.clone().unwrap();
    assert!(error.contains("the processor actor stopped"), "{error}");
    let status = worker.status().await.unwrap();
    assert_eq!(
        status.shards[0].restarts, 0,
        "the shard itself never restarted"
    );
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
}

/// The stalled-processor watchdog: a call that does not return within
/// `reader.processor_timeout` counts as a failed delivery (it is abandoned), so a record
/// the processor hangs on is bisected out and discarded like one it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_processor_timeout_counts_as_a_failure() {
    struct Hanging(Refusing);
    impl Processor for Hanging {
        async fn process(
            &mut self,
            batch: &Batch,
            cp: &Checkpointer,
        ) -> Result<(), ProcessorError> {
            if batch
                .records()
                .iter()
                .any(|r| r.data.starts_with(b"poison"))
            {
                std::future::pending::<()>().await;
            }
            self.0.process(batch, cp).await
        }
    }
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let sent = put(&rig, 16, &[9]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let mut s = settings(Some(0), true, true);
    s.reader.processor_timeout = Duration::from_millis(300);
    let worker = launch(&rig, s, Some(&dl), &log, move |log| {
        Hanging(Refusing {
            log,
            partial: false,
        })
    })
    .await;
    until("16 records accounted for", || {
        log.processed.lock().unwrap().len() + dl.written.lock().unwrap().len() == 16
    })
    .await;
    check(&sent, &log, &dl);
    assert_eq!(dl.data(), ["poison-9"]);
    let error = dl.written.lock().unwrap()[0].error.clone().unwrap();
    assert!(
        error.contains("did not finish within reader.processor_timeout"),
        "{error}"
    );
    let status = worker.status().await.unwrap();
    assert_eq!(
        status.shards[0].restarts, 0,
        "the shard itself never restarted"
    );
    worker.shutdown().await.unwrap();
}

/// A shutdown while a batch waits out a retry's backoff (longer than the shutdown's
/// time) is clean: the wait is cut short, the batch is left un-acked for the next owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_cuts_a_retry_backoff_short() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    put(&rig, 10, &[4]).await;
    let (log, dl) = (Log::default(), Recording::default());
    let mut s = settings(Some(5), false, false);
    s.supervision.restart_backoff_min = Duration::from_secs(60);
    s.supervision.restart_backoff_max = Duration::from_secs(60);
    s.supervision.shutdown_timeout = Duration::from_secs(5);
    let worker = launch(&rig, s, None, &log, move |log| Refusing {
        log,
        partial: false,
    })
    .await;
    until("the first refusal", || {
        log.calls.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    assert_eq!(
        log.calls.load(Ordering::SeqCst),
        1,
        "no retry after the shutdown"
    );
    assert!(log.processed.lock().unwrap().is_empty());
    assert!(dl.written.lock().unwrap().is_empty());
}
