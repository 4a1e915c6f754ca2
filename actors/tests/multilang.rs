#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure should panic
//! MultiLang record processors run under flotilla with no JVM: the npm `aws-kcl`
//! package's client, with a processor written as its sample consumer is
//! (`multilang/consumer.js`), and a child that misbehaves on purpose
//! (`multilang/scripted.py`), and the Python client's own published sample
//! (amazon_kclpy's `samples/sample_kclpy_app.py`), on the memory backend in real time
//! (child processes). `scripts/test.sh` unpacks the packages and names them in
//! `FLOTILLA_TEST_AWS_KCL` and `FLOTILLA_TEST_AMAZON_KCLPY`.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{PutRecord, StreamAdmin as _};
use flotilla_actors::model::{Checkpoint, ShardId};
use flotilla_actors::multilang::{ChildCommand, MultiLangProcessor};
use flotilla_actors::oracle::OrderCheck;
use flotilla_actors::settings::Destination;
use flotilla_actors::{CheckpointMode, Worker};
use support::counted::Counted;
use support::probe::{Producer, fast_settings};
use support::rig::{APP, Rig, STREAM};

/// The unpacked npm package; the test fails loudly without it.
fn aws_kcl() -> String {
    std::env::var("FLOTILLA_TEST_AWS_KCL").expect(
        "FLOTILLA_TEST_AWS_KCL must name the unpacked npm aws-kcl package (scripts/test.sh sets it)",
    )
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("flotilla-multilang-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("out.txt")
}

fn consumer(out: &Path, crash_at: Option<u32>) -> Arc<ChildCommand> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/multilang/consumer.js");
    let mut argv = vec![
        "node".to_owned(),
        script.display().to_string(),
        out.display().to_string(),
    ];
    if let Some(n) = crash_at {
        argv.push(n.to_string());
    }
    // The child finds the package through the environment it inherits.
    aws_kcl();
    Arc::new(ChildCommand {
        argv,
        watchdog: Some(Duration::from_secs(30)),
    })
}

/// The lines the consumer wrote, through the library's order oracle.
fn check(out: &Path) -> (OrderCheck, usize) {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let mut check = OrderCheck::default();
    let mut lines = 0;
    for line in text.lines() {
        let mut parts = line.splitn(3, ' ');
        let (_shard, key, data) = (parts.next(), parts.next(), parts.next());
        if let (Some(key), Some(data)) = (key, data) {
            check.observe(key, data.as_bytes());
            lines += 1;
        }
    }
    (check, lines)
}

/// Every record produced reached the child, in order for its key; the lines written.
fn assert_all_in_order(out: &Path, producer: &Producer) -> usize {
    let (seen, lines) = check(out);
    assert_eq!(seen.violations(), 0, "{:?}", seen.examples());
    assert_eq!(seen.lost(producer.produced.iter().map(|(k, n)| (k, *n))), 0);
    lines
}

async fn wait_for(out: &Path, distinct: u64, limit: Duration) {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let (check, _) = check(out);
        if check.processed() >= distinct {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "only {} of {distinct} records processed by the child",
            check.processed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start(rig: &Rig, command: Arc<ChildCommand>) -> Worker {
    start_with(rig, command, |_| {}).await
}

/// A worker of MultiLang processors (manual mode, as `flotilla multilang` runs them),
/// with `edit`'s changes to the tests' settings.
async fn start_with(
    rig: &Rig,
    command: Arc<ChildCommand>,
    edit: impl FnOnce(&mut flotilla_actors::Settings),
) -> Worker {
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Manual;
    edit(&mut settings);
    Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| MultiLangProcessor::new(command.clone()))
        .start()
        .await
        .unwrap()
}

/// The sample processor consumes every record in order per key; its checkpoints (the
/// last record of each batch, then one more at shutdown) are what the lease table
/// holds afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_clients_sample_processor_consumes_and_checkpoints() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 4, 25).await;
    let out = scratch("sample");
    let worker = start(&rig, consumer(&out, None)).await;
    wait_for(&out, producer.total(), Duration::from_secs(30)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let lines = assert_all_in_order(&out, &producer);
    assert_eq!(
        lines as u64,
        producer.total(),
        "no record twice without a crash"
    );
    for shard in 0..2 {
        let lease = rig.lease_of(&ShardId::from_index(shard)).await;
        assert!(
            matches!(lease.checkpoint, Checkpoint::At(_)),
            "shard {shard}: {:?}",
            lease.checkpoint
        );
    }
    // A new worker with new children resumes at the children's checkpoints: nothing is
    // processed again, and what is put now is.
    let worker = start(&rig, consumer(&out, None)).await;
    producer.put_round(&rig.streams, STREAM, 4, 5).await;
    wait_for(&out, producer.total(), Duration::from_secs(30)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let (again, lines) = check(&out);
    assert_eq!(again.duplicates(), 0, "{:?}", again.examples());
    assert_eq!(lines as u64, producer.total());
}

/// A child that dies mid-batch: its shard restarts from the child's last checkpoint
/// with a new child, and nothing is lost (records after that checkpoint come again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_child_restarts_its_shard_from_its_checkpoint() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 10).await;
    let out = scratch("crash");
    let worker = start(&rig, consumer(&out, Some(7))).await;
    wait_for(&out, producer.total(), Duration::from_secs(30)).await;
    assert!(
        Path::new(&format!("{}.crashed", out.display())).exists(),
        "the child was to crash once"
    );
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    assert_all_in_order(&out, &producer);
}

/// A read to the end of a split parent: the sample's `checkpoint()` in `shardEnded`
/// ends it at SHARD_END, the children start after it, every key stays in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_processor_ends_a_split_parent_and_its_children_follow() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 8, 10).await;
    let parent = rig.shards().await[0].clone();
    rig.split_in_half(&parent).await;
    producer.put_round(&rig.streams, STREAM, 8, 10).await;
    let out = scratch("split");
    let worker = start(&rig, consumer(&out, None)).await;
    wait_for(&out, producer.total(), Duration::from_secs(30)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    assert_all_in_order(&out, &producer);
    let row = rig.lease_of(&parent.id).await;
    assert!(row.checkpoint.is_shard_end(), "{:?}", row.checkpoint);
}

/// With 4 lanes per shard (`processor.parallelism`), 4 children per shard: each key
/// stays in order, a child's checkpoint speaks for its own lane (the shard's checkpoint
/// is the watermark across lanes, so a restart processes nothing again), and a split
/// parent ends at SHARD_END once every lane's child has answered `shardEnded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_children_per_shard_keep_each_key_in_order_and_end_a_split_parent() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 16, 10).await;
    let parent = rig.shards().await[0].clone();
    rig.split_in_half(&parent).await;
    producer.put_round(&rig.streams, STREAM, 16, 10).await;
    let out = scratch("lanes");
    let lanes = |s: &mut flotilla_actors::Settings| s.processor.parallelism = 4;
    let worker = start_with(&rig, consumer(&out, None), lanes).await;
    wait_for(&out, producer.total(), Duration::from_secs(60)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let lines = assert_all_in_order(&out, &producer);
    assert_eq!(lines as u64, producer.total(), "no record twice");
    let row = rig.lease_of(&parent.id).await;
    assert!(row.checkpoint.is_shard_end(), "{:?}", row.checkpoint);
    // The children's lanes checkpointed what they processed: a new worker resumes
    // there and processes only what is put now.
    let worker = start_with(&rig, consumer(&out, None), lanes).await;
    producer.put_round(&rig.streams, STREAM, 16, 2).await;
    wait_for(&out, producer.total(), Duration::from_secs(60)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let (again, lines) = check(&out);
    assert_eq!(again.duplicates(), 0, "{:?}", again.examples());
    assert_eq!(lines as u64, producer.total());
}

fn scripted(mode: &str, out: &Path, watchdog: Option<Duration>) -> Arc<ChildCommand> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/multilang/scripted.py");
    Arc::new(ChildCommand {
        argv: vec![
            "python3".to_owned(),
            script.display().to_string(),
            mode.to_owned(),
            out.display().to_string(),
        ],
        watchdog,
    })
}

fn lines(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn wait_line(out: &Path, what: &str, count: usize, limit: Duration) {
    let end = tokio::time::Instant::now() + limit;
    while lines(out).iter().filter(|l| l.starts_with(what)).count() < count {
        assert!(
            tokio::time::Instant::now() < end,
            "no {count} × {what:?} in {:?}",
            lines(out)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the KCL refuses, flotilla refuses with the same names: a checkpoint past the
/// last record delivered (`IllegalArgumentException`, echoing what was asked), any
/// checkpoint during `initialize` (`InvalidStateException`); a checkpoint at the last
/// record is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_refused_with_the_kcls_names() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 5).await;
    let out = scratch("beyond");
    let worker = start(&rig, scripted("beyond", &out, None)).await;
    wait_line(&out, "last-answer", 1, Duration::from_secs(30)).await;
    let seen = lines(&out);
    assert!(
        seen.contains(&"initialize-checkpoint-answer InvalidStateException".to_owned()),
        "{seen:?}"
    );
    let beyond = seen
        .iter()
        .find(|l| l.starts_with("beyond-answer"))
        .unwrap();
    assert!(
        beyond.starts_with("beyond-answer IllegalArgumentException "),
        "{beyond}"
    );
    assert!(
        !beyond.ends_with(" None"),
        "the answer echoes the request: {beyond}"
    );
    assert!(seen.contains(&"last-answer None".to_owned()), "{seen:?}");
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let row = rig.lease_of(&ShardId::from_index(0)).await;
    assert!(
        matches!(row.checkpoint, Checkpoint::At(_)),
        "{:?}",
        row.checkpoint
    );
}

/// Text and unknown JSON on the child's stdout are skipped, as the daemon skips them
/// (the Python sample prints there); the records are processed all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_that_are_not_messages_are_skipped() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 5).await;
    let out = scratch("garbage");
    let worker = start(&rig, scripted("garbage", &out, None)).await;
    wait_line(&out, "processRecords", 1, Duration::from_secs(30)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    assert_eq!(
        lines(&out).iter().filter(|l| *l == "started").count(),
        1,
        "no restart: {:?}",
        lines(&out)
    );
}

/// With `callProcessRecordsEvenForEmptyRecordList = true` (`reader.call_on_empty`) the
/// child is sent `processRecords` with `"records": []` once the shard is read through,
/// as the KCL's daemon sends it; its records came first, in their own calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_shard_is_still_called_when_asked_as_the_kcl_asks() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 5).await;
    let out = scratch("empty");
    let command = scripted("empty", &out, None);
    let worker = start_with(&rig, command, |s| s.reader.call_on_empty = true).await;
    wait_line(&out, "processRecords 0", 3, Duration::from_secs(30)).await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let calls: Vec<String> = lines(&out)
        .into_iter()
        .filter(|l| l.starts_with("processRecords"))
        .collect();
    let first_empty = calls.iter().position(|l| l == "processRecords 0").unwrap();
    let records: usize = calls[..first_empty]
        .iter()
        .map(|l| l["processRecords ".len()..].parse::<usize>().unwrap())
        .sum();
    assert_eq!(records, 10, "{calls:?}");
}

/// A child that stops answering is stopped by the watchdog (`timeoutInSeconds`) and
/// its shard restarts with a new child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_stops_answering_is_replaced_after_the_watchdog() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 5).await;
    let out = scratch("hang");
    let worker = start(&rig, scripted("hang", &out, Some(Duration::from_secs(1)))).await;
    wait_line(&out, "started", 2, Duration::from_secs(30)).await;
    worker.abort();
}

/// A child that answers `shardEnded` without checkpointing does not end its shard (the
/// KCL's rule): the shard fails and is tried again, SHARD_END is not written, and the
/// children do not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_shard_end_checkpoint_the_shard_does_not_end() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 5).await;
    let parent = rig.shards().await[0].clone();
    rig.split_in_half(&parent).await;
    let out = scratch("no-shard-end");
    let worker = start(&rig, scripted("no-shard-end", &out, None)).await;
    wait_line(&out, "shardEnded", 2, Duration::from_secs(30)).await;
    let row = rig.lease_of(&parent.id).await;
    assert!(!row.checkpoint.is_shard_end(), "{:?}", row.checkpoint);
    assert!(
        !lines(&out)
            .iter()
            .any(|l| l.starts_with("initialize shardId-000000000001")),
        "a child started before its parent ended: {:?}",
        lines(&out)
    );
    worker.abort();
}

/// The Python client's published sample processor, unchanged (it checkpoints its
/// largest sequence and sub-sequence number at its first batch and at
/// `shutdown_requested`, and prints to stdout now and then): once the child has finished
/// every record, a graceful shutdown leaves each shard's checkpoint at its last record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_clients_published_sample_runs_unchanged() {
    let kclpy = std::env::var("FLOTILLA_TEST_AMAZON_KCLPY").expect(
        "FLOTILLA_TEST_AMAZON_KCLPY must name the unpacked amazon_kclpy source package (scripts/test.sh sets it)",
    );
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 4, 10).await;
    let sample = Path::new(&kclpy).join("samples/sample_kclpy_app.py");
    let command = Arc::new(ChildCommand {
        argv: vec![
            "env".to_owned(),
            format!("PYTHONPATH={kclpy}"),
            "python3".to_owned(),
            sample.display().to_string(),
        ],
        watchdog: Some(Duration::from_secs(30)),
    });
    // Delivered is not processed: a batch still queued when the shutdown comes is
    // skipped (and not checkpointed), so wait for the child's answers.
    let finished = Arc::new(AtomicU64::new(0));
    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Manual;
    let counter = finished.clone();
    let worker = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| Counted {
            inner: MultiLangProcessor::new(command.clone()),
            count: counter.clone(),
        })
        .start()
        .await
        .unwrap();
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while finished.load(Ordering::Relaxed) < producer.total() {
        assert!(
            tokio::time::Instant::now() < end,
            "the child finished {} of {} records",
            finished.load(Ordering::Relaxed),
            producer.total()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    for shard in rig.shards().await {
        let lease = rig.lease_of(&shard.id).await;
        let last = rig
            .records(&shard.id)
            .await
            .last()
            .map(|r| r.sequence_number.clone());
        match &lease.checkpoint {
            Checkpoint::At(at) => assert_eq!(Some(&at.sequence), last.as_ref(), "{}", shard.id),
            other => assert!(
                last.is_none(),
                "{}: {other:?} with records in the shard",
                shard.id
            ),
        }
    }
}

/// `[failure]` for a MultiLang child: a child that raises on a batch (and exits) counts as
/// a failed batch; with `bisect` the halves go to a new child, down to the poison record,
/// which is written to the destination file; every other record is processed once, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_raises_on_a_poison_record_has_it_bisected_out_and_discarded() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let records: Vec<PutRecord> = (0..24)
        .map(|i| PutRecord {
            partition_key: format!("k{}", i % 3),
            explicit_hash_key: None,
            data: if i == 13 {
                "poison-13".into()
            } else {
                format!("good-{i}").into()
            },
        })
        .collect();
    rig.streams.put_records(STREAM, &records).await.unwrap();
    let out = scratch("poison");
    let dead = scratch("poison-dead-letters");
    let command = scripted("poison", &out, None);
    let worker = start_with(&rig, command, |s| {
        s.failure.max_retries = Some(1);
        s.failure.bisect = true;
        s.failure.destination = Some(Destination::File(dead.clone()));
        s.supervision.restart_backoff_min = Duration::from_millis(5);
        s.supervision.restart_backoff_max = Duration::from_millis(20);
    })
    .await;
    wait_line(&out, "processed ", 23, Duration::from_secs(60)).await;
    let processed: Vec<String> = lines(&out)
        .into_iter()
        .filter_map(|l| l.strip_prefix("processed ").map(str::to_owned))
        .collect();
    let expected: Vec<String> = (0..24)
        .filter(|&i| i != 13)
        .map(|i| format!("good-{i}"))
        .collect();
    assert_eq!(processed, expected, "each good record once, in order");
    let mut written = String::new();
    for _ in 0..100 {
        written = std::fs::read_to_string(&dead).unwrap_or_default();
        if !written.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let envelopes: Vec<flotilla_actors::failure::Envelope> = written
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(envelopes.len(), 1, "{written}");
    assert_eq!(envelopes[0].partition_key, "k1");
    assert_eq!(envelopes[0].reason, "retries");
    assert!(
        envelopes[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("MultiLang child"),
        "{:?}",
        envelopes[0]
    );
    // Several children were started: the first, and one per failed delivery after it.
    assert!(lines(&out).iter().filter(|l| *l == "started").count() >= 3);
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
}
