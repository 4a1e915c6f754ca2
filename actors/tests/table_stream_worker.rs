//! The worker end to end over a DynamoDB table's stream (`MemoryTableStreams`), in
//! paused time: item writes become INSERT, MODIFY and REMOVE changes that reach the
//! processors once each and in each item's order, across shard rotations and splits, a
//! fleet of two workers, a restart from checkpoints, AT_TIMESTAMP (by scanning), a
//! checkpoint past retention and an iterator past its fifteen minutes.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::backend::faults::{FaultPlan, Faulty};
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig, MemoryTableStreams,
    MemoryTableStreamsConfig,
};
use flotilla_actors::backend::{
    ItemWrite, IteratorPosition, LeaseError, LeaseTable, StreamClient, TABLE_KEY, TableStreamAdmin,
};
use flotilla_actors::model::change::{AttributeValue, ChangeKind, Item};
use flotilla_actors::model::{Checkpoint, LeaseKey, SequenceNumber, ShardId};
use flotilla_actors::settings::{InitialPosition, ReadMode, TrimmedCheckpoint};
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, Settings, ShardInfo, ShardState,
    Worker, WorkerError,
};
use support::probe::{fast_settings, wait_until};
use support::rig::{shutdown_clean, wait_held};

const TABLE: &str = "orders";
const APP: &str = "orders-app";
/// The attribute that counts an item's writes: every change's image carries it.
const VERSION: &str = "v";
/// How long a paused-time test waits (virtual time: it costs nothing).
const PATIENCE: Duration = Duration::from_secs(600);
const STEP: Duration = Duration::from_millis(100);

/// One change as a processor was given it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    worker: String,
    shard: ShardId,
    key: String,
    kind: ChangeKind,
    /// The item's `v`: of the new image, or of the old one for a REMOVE.
    version: u64,
    sequence: SequenceNumber,
}

/// What every processor of a test was given, in the order processed; clones share it.
#[derive(Clone, Default)]
struct Log {
    got: Arc<Mutex<Vec<Got>>>,
    /// Records whose data was not a change this test wrote.
    bad: Arc<Mutex<Vec<String>>>,
}

impl Log {
    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    /// Per item, its changes in the order processed.
    fn by_key(&self) -> BTreeMap<String, Vec<(ChangeKind, u64)>> {
        let mut by_key: BTreeMap<String, Vec<(ChangeKind, u64)>> = BTreeMap::new();
        for got in self.got() {
            by_key
                .entry(got.key)
                .or_default()
                .push((got.kind, got.version));
        }
        by_key
    }

    fn assert_parsed(&self) {
        let bad = self.bad.lock().unwrap();
        assert!(bad.is_empty(), "records that were not changes: {bad:?}");
    }

    fn processor(&self, worker: &str, shard: &ShardInfo, pause: Option<Pause>) -> ChangeProbe {
        ChangeProbe {
            log: self.clone(),
            worker: worker.to_owned(),
            shard: shard.shard_id.clone(),
            pause,
        }
    }
}

/// Makes the first `process()` call of a worker take this long.
#[derive(Clone)]
struct Pause {
    length: Duration,
    done: Arc<AtomicBool>,
}

struct ChangeProbe {
    log: Log,
    worker: String,
    shard: ShardId,
    pause: Option<Pause>,
}

impl Processor for ChangeProbe {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        if let Some(pause) = &self.pause
            && !pause.done.swap(true, Ordering::SeqCst)
        {
            tokio::time::sleep(pause.length).await;
        }
        for record in batch.records() {
            // A panic in an actor fails no test: a record that does not parse is logged.
            let change = match record.dynamodb_change() {
                Ok(change) => change,
                Err(error) => {
                    self.log
                        .bad
                        .lock()
                        .unwrap()
                        .push(format!("{}: {error}", record.sequence_number));
                    continue;
                }
            };
            let key = change.dynamodb.keys.get(TABLE_KEY).and_then(|k| k.as_s());
            let image = match change.event_name {
                ChangeKind::Insert | ChangeKind::Modify => change.dynamodb.new_image.as_ref(),
                ChangeKind::Remove => change.dynamodb.old_image.as_ref(),
            };
            let version = image.and_then(|i| match i.get(VERSION) {
                Some(AttributeValue::N(n)) => n.parse::<u64>().ok(),
                _ => None,
            });
            let sequence_agrees =
                change.dynamodb.sequence_number == record.sequence_number.as_str();
            match (key, version) {
                (Some(key), Some(version)) if sequence_agrees => {
                    self.log.got.lock().unwrap().push(Got {
                        worker: self.worker.clone(),
                        shard: self.shard.clone(),
                        key: key.to_owned(),
                        kind: change.event_name,
                        version,
                        sequence: record.sequence_number.clone(),
                    })
                }
                _ => self
                    .log
                    .bad
                    .lock()
                    .unwrap()
                    .push(format!("{}: {change:?}", record.sequence_number)),
            }
        }
        Ok(())
    }
}

/// The items as the test wrote them, and every change each write must produce.
#[derive(Debug, Default)]
struct Items {
    version: BTreeMap<String, u64>,
    present: BTreeSet<String>,
    expected: BTreeMap<String, Vec<(ChangeKind, u64)>>,
}

impl Items {
    /// A put of `key` with its next version: an INSERT, or a MODIFY if it is there.
    fn put(&mut self, key: &str) -> ItemWrite {
        let version = self.version.entry(key.to_owned()).or_default();
        *version += 1;
        let kind = if self.present.insert(key.to_owned()) {
            ChangeKind::Insert
        } else {
            ChangeKind::Modify
        };
        self.expected
            .entry(key.to_owned())
            .or_default()
            .push((kind, *version));
        ItemWrite::Put {
            attributes: Item::from([
                (TABLE_KEY.to_owned(), AttributeValue::S(key.to_owned())),
                (VERSION.to_owned(), AttributeValue::N(version.to_string())),
            ]),
        }
    }

    /// A delete of `key`, which must be there: a REMOVE of its last version.
    fn delete(&mut self, key: &str) -> ItemWrite {
        assert!(self.present.remove(key), "{key} is not there");
        self.expected
            .entry(key.to_owned())
            .or_default()
            .push((ChangeKind::Remove, self.version[key]));
        ItemWrite::Delete {
            key: key.to_owned(),
        }
    }

    fn total(&self) -> usize {
        self.expected.values().map(Vec::len).sum()
    }

    /// Forgets what was expected so far: what comes next is what a later worker must get.
    fn take_expected(&mut self) -> BTreeMap<String, Vec<(ChangeKind, u64)>> {
        std::mem::take(&mut self.expected)
    }
}

fn key(i: usize) -> String {
    format!("item-{i:03}")
}

/// A table with a stream, the lease tables and the metrics sink workers share.
struct Rig {
    tables: MemoryTableStreams,
    arn: String,
    dynamo: MemoryDynamo,
    metrics: MemoryMetrics,
}

impl Rig {
    async fn new(config: MemoryTableStreamsConfig) -> Self {
        let tables = MemoryTableStreams::new(config);
        let arn = tables.create_table_with_stream(TABLE).await.unwrap();
        Self {
            tables,
            arn,
            dynamo: MemoryDynamo::new(),
            metrics: MemoryMetrics::new(),
        }
    }

    fn backend_on(&self, streams: Arc<dyn StreamClient>) -> Backend {
        Backend::memory(
            MemoryStreams::new(MemoryStreamsConfig::default()),
            self.dynamo.clone(),
            self.metrics.clone(),
        )
        .with_table_streams(streams)
    }

    fn backend(&self) -> Backend {
        self.backend_on(Arc::new(self.tables.clone()))
    }

    /// Settings for worker `worker` of the table's stream, named by its ARN.
    fn settings(&self, worker: &str) -> Settings {
        let mut s = fast_settings(&self.arn, APP);
        s.worker.worker_id = Some(worker.to_owned());
        s.reader.mode = ReadMode::Polling;
        s
    }

    async fn try_start(
        &self,
        backend: Backend,
        settings: Settings,
        log: &Log,
        pause: Option<Pause>,
    ) -> Result<Worker, WorkerError> {
        let worker = settings.worker.worker_id.clone().unwrap_or_default();
        let log = log.clone();
        Worker::builder()
            .settings(settings)
            .backend(backend)
            .processor(move |shard| log.processor(&worker, shard, pause.clone()))
            .start()
            .await
    }

    async fn start(&self, settings: Settings, log: &Log) -> Worker {
        self.try_start(self.backend(), settings, log, None)
            .await
            .unwrap()
    }

    async fn write(&self, writes: &[ItemWrite]) {
        self.tables.write_items(TABLE, writes).await.unwrap();
    }

    fn lease_table(&self) -> impl LeaseTable {
        self.dynamo.lease_table(APP)
    }

    async fn open_shards(&self) -> Vec<ShardId> {
        self.tables
            .list_shards(&self.arn)
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.is_open())
            .map(|s| s.id)
            .collect()
    }
}

/// Waits until `log` holds `count` changes, then a while longer, so that a duplicate
/// or a straggler would be there to see.
async fn wait_for(log: &Log, count: usize) {
    wait_until(&format!("{count} changes"), PATIENCE, STEP, || {
        log.len() >= count
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
}

/// An error and its causes, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

#[tokio::test(start_paused = true)]
async fn a_fleet_of_two_gets_every_change_once_in_item_order_across_rotations_and_a_split() {
    let rig = Rig::new(MemoryTableStreamsConfig {
        shards_per_table: 4,
        ..Default::default()
    })
    .await;
    let log = Log::default();
    let mut settings = rig.settings("w1");
    // Small reads: children are readable while their parents still have a backlog.
    settings.reader.max_records = 50;
    settings.reader.window_records = 50;
    settings.reader.shard_sync_interval = Duration::from_millis(200);
    let w1 = rig.start(settings.clone(), &log).await;
    settings.worker.worker_id = Some("w2".to_owned());
    let w2 = rig.start(settings, &log).await;
    wait_held(&[&w1, &w2], &[2, 2], PATIENCE).await;

    let mut items = Items::default();
    const KEYS: usize = 300;
    // Inserts of every item, then updates of each, deletes of every fifth.
    let writes: Vec<_> = (0..KEYS).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    let writes: Vec<_> = (0..KEYS)
        .map(|i| match i % 5 {
            0 => items.delete(&key(i)),
            _ => items.put(&key(i)),
        })
        .collect();
    rig.write(&writes).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rotated = rig.tables.rotate_all(&rig.arn).unwrap();
    assert_eq!(rotated.len(), 4);

    // Updates, and the deleted items back (INSERTs).
    let writes: Vec<_> = (0..KEYS).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let halves = rig.tables.split_shard(&rig.arn, &rotated[0]).unwrap();
    assert_eq!(halves.len(), 2);

    // Two more rounds of updates, with deletes of every seventh in between.
    for round in 0..2 {
        let writes: Vec<_> = (0..KEYS)
            .map(|i| match (round, i % 7) {
                (1, 0) => items.delete(&key(i)),
                _ => items.put(&key(i)),
            })
            .collect();
        rig.write(&writes).await;
    }
    assert_eq!(rig.open_shards().await.len(), 5);
    // 300 INSERTs, 240 MODIFYs + 60 REMOVEs, 240 MODIFYs + 60 INSERTs, 300 MODIFYs,
    // 257 MODIFYs + 43 REMOVEs.
    assert_eq!(items.total(), 1500);

    wait_for(&log, items.total()).await;
    shutdown_clean(w1).await;
    shutdown_clean(w2).await;

    log.assert_parsed();
    let got = log.by_key();
    let wrong: Vec<_> = items
        .expected
        .iter()
        .filter(|(key, want)| got.get(*key) != Some(want))
        .map(|(key, want)| format!("{key}: want {want:?}, got {:?}", got.get(key)))
        .collect();
    assert!(wrong.is_empty(), "{} items wrong: {wrong:#?}", wrong.len());
    assert_eq!(log.len(), items.total(), "no duplicates, nothing else");

    let all = log.got();
    for worker in ["w1", "w2"] {
        assert!(
            all.iter().any(|g| g.worker == worker),
            "{worker} processed nothing"
        );
    }
    let shards: BTreeSet<&ShardId> = all.iter().map(|g| &g.shard).collect();
    assert_eq!(shards.len(), 4 + 4 + 2, "every shard delivered changes");
    // Every lease row names the stream it belongs to.
    let rows = rig.lease_table().scan().await.unwrap().leases;
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(row.source.as_deref(), Some(rig.arn.as_str()), "{row:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_table_name_resolves_to_its_stream_and_misnamed_sources_are_refused() {
    let rig = Rig::new(MemoryTableStreamsConfig::default()).await;
    let log = Log::default();
    let mut items = Items::default();
    let writes: Vec<_> = (0..20).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;

    let mut settings = rig.settings("w1");
    settings.worker.stream = format!("dynamodb:{TABLE}");
    let worker = rig.start(settings.clone(), &log).await;
    let writes: Vec<_> = (0..20).map(|i| items.delete(&key(i))).collect();
    rig.write(&writes).await;
    wait_for(&log, items.total()).await;
    shutdown_clean(worker).await;
    log.assert_parsed();
    assert_eq!(log.by_key(), items.expected);
    let rows = rig.lease_table().scan().await.unwrap().leases;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].source.as_deref(), Some(rig.arn.as_str()));

    // A table whose changes no stream records: the error says how to enable one, and
    // no lease table is made for it.
    rig.tables.create_table_without_stream("plain").unwrap();
    let mut plain = rig.settings("w2");
    plain.worker.stream = "dynamodb:plain".to_owned();
    plain.worker.application = "plain-app".to_owned();
    let Err(error) = rig.try_start(rig.backend(), plain, &log, None).await else {
        panic!("a table without a stream cannot be read");
    };
    let text = chain(&error);
    assert!(text.contains("table plain has no stream"), "{text}");
    assert!(
        text.contains("--stream-specification StreamEnabled=true"),
        "{text}"
    );
    let scan = rig.dynamo.lease_table("plain-app").scan().await;
    assert!(
        matches!(scan, Err(LeaseError::NotFound { .. })),
        "no lease table is made for it: {scan:?}"
    );

    // The lease table must not be the source table.
    for stream in [format!("dynamodb:{TABLE}"), rig.arn.clone()] {
        let mut same = rig.settings("w3");
        same.worker.stream = stream.clone();
        same.worker.application = TABLE.to_owned();
        let error = rig
            .try_start(rig.backend(), same, &log, None)
            .await
            .err()
            .unwrap_or_else(|| panic!("{stream}: a lease table named like the source"));
        let text = chain(&error);
        assert!(text.contains("worker.application"), "{stream}: {text}");
        assert!(text.contains(TABLE), "{stream}: {text}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_after_a_clean_shutdown_gets_only_the_new_changes() {
    let rig = Rig::new(MemoryTableStreamsConfig {
        shards_per_table: 2,
        ..Default::default()
    })
    .await;
    let first = Log::default();
    let mut items = Items::default();
    let writes: Vec<_> = (0..100).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    let worker = rig.start(rig.settings("w1"), &first).await;
    let writes: Vec<_> = (0..100).step_by(3).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    wait_for(&first, items.total()).await;
    shutdown_clean(worker).await;
    first.assert_parsed();
    assert_eq!(first.by_key(), items.take_expected());

    // Written while no worker runs, across a rotation.
    let writes: Vec<_> = (0..100).step_by(2).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    rig.tables.rotate_all(&rig.arn).unwrap();
    let writes: Vec<_> = (0..100).step_by(5).map(|i| items.delete(&key(i))).collect();
    rig.write(&writes).await;

    let second = Log::default();
    let worker = rig.start(rig.settings("w2"), &second).await;
    wait_for(&second, items.total()).await;
    shutdown_clean(worker).await;
    second.assert_parsed();
    assert_eq!(
        second.by_key(),
        items.expected,
        "only the new changes, once"
    );
    assert_eq!(second.len(), 50 + 20);
}

#[tokio::test(start_paused = true)]
async fn at_timestamp_starts_each_shard_at_its_first_change_at_or_after_the_time() {
    let rig = Rig::new(MemoryTableStreamsConfig {
        shards_per_table: 2,
        ..Default::default()
    })
    .await;
    let mut items = Items::default();
    const KEYS: usize = 40;
    // Before the time: inserts; a rotation of one shard; updates (some into its child).
    let writes: Vec<_> = (0..KEYS).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let before = rig.open_shards().await;
    let child = rig.tables.rotate_shard(&rig.arn, &before[0]).unwrap();
    let writes: Vec<_> = (0..KEYS).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    items.take_expected();

    // A change 0.1 s into a second and the time 0.6 s into it: DynamoDB keeps creation
    // times in whole seconds, so the change counts as at the time, and is delivered.
    let fraction = rig
        .tables
        .clock()
        .wall()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    tokio::time::advance(Duration::from_millis(u64::from(1100 - fraction))).await;
    let early = items.put(&key(0));
    rig.write(&[early]).await;
    tokio::time::advance(Duration::from_millis(500)).await;
    let at = rig.tables.clock().wall();
    let writes: Vec<_> = (1..KEYS).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let writes: Vec<_> = (0..KEYS)
        .map(|i| match i % 4 {
            0 => items.delete(&key(i)),
            _ => items.put(&key(i)),
        })
        .collect();
    rig.write(&writes).await;

    let log = Log::default();
    let mut settings = rig.settings("w1");
    settings.worker.initial_position = InitialPosition::AtTimestamp;
    settings.worker.initial_timestamp = Some(humantime::format_rfc3339_millis(at).to_string());
    let worker = rig.start(settings, &log).await;
    wait_for(&log, items.total()).await;
    shutdown_clean(worker).await;
    log.assert_parsed();
    assert_eq!(
        log.by_key(),
        items.expected,
        "exactly the changes from the time on"
    );
    assert_eq!(log.len(), 2 * KEYS);
    let shards: BTreeSet<ShardId> = log.got().into_iter().map(|g| g.shard).collect();
    assert_eq!(
        shards,
        BTreeSet::from([before[1].clone(), child.clone()]),
        "the rotated shard ended before the time: its child has the changes"
    );
}

/// A shard's checkpoint pointing at changes since trimmed: the rig, the checkpoint, the
/// changes lost and those kept.
struct Trimmed {
    rig: Rig,
    shard: ShardId,
    checkpoint: SequenceNumber,
    kept: BTreeMap<String, Vec<(ChangeKind, u64)>>,
    kept_count: usize,
    first_kept: SequenceNumber,
}

/// One shard read up to a checkpoint by a worker that then stops cleanly; changes
/// written after it and trimmed (retention passes); changes written after that, kept.
async fn trimmed_checkpoint() -> Trimmed {
    let rig = Rig::new(MemoryTableStreamsConfig {
        retention: Duration::from_secs(60),
        ..Default::default()
    })
    .await;
    let mut items = Items::default();
    let writes: Vec<_> = (0..10).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    let log = Log::default();
    let worker = rig.start(rig.settings("w1"), &log).await;
    wait_for(&log, items.total()).await;
    shutdown_clean(worker).await;
    let checkpoint = log.got().last().unwrap().sequence.clone();
    let shard = rig.open_shards().await.remove(0);
    let lease = rig
        .lease_table()
        .get(&LeaseKey::from(&shard))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&lease.checkpoint, Checkpoint::At(at) if at.sequence == checkpoint),
        "{:?}",
        lease.checkpoint
    );

    // Lost: written after the checkpoint, gone past retention before a worker came back.
    let writes: Vec<_> = (0..10).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    tokio::time::advance(Duration::from_secs(61)).await;
    items.take_expected();
    let writes: Vec<_> = (0..10)
        .map(|i| match i % 2 {
            0 => items.delete(&key(i)),
            _ => items.put(&key(i)),
        })
        .collect();
    rig.write(&writes).await;
    let kept_count = items.total();
    let first_kept = {
        let it = rig
            .tables
            .get_shard_iterator(&rig.arn, &shard, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        rig.tables.get_records(&it, 1).await.unwrap().records[0]
            .sequence_number
            .clone()
    };
    Trimmed {
        rig,
        shard,
        checkpoint,
        kept: items.take_expected(),
        kept_count,
        first_kept,
    }
}

#[tokio::test(start_paused = true)]
async fn a_trimmed_checkpoint_fails_the_shard_naming_the_lost_window() {
    let t = trimmed_checkpoint().await;
    let log = Log::default();
    let mut settings = t.rig.settings("w2");
    settings.reader.trimmed_checkpoint = TrimmedCheckpoint::Fail;
    let worker = t.rig.start(settings, &log).await;

    let mut seen = None;
    let limit = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < limit && seen.is_none() {
        tokio::time::sleep(STEP).await;
        let status = worker.status().await.unwrap();
        seen = status
            .shards
            .iter()
            .find(|s| s.shard_id == t.shard && s.last_error.is_some())
            .cloned();
    }
    let shard = seen.expect("the failing shard's error in the status");
    assert_eq!(shard.state, ShardState::Restarting, "{shard:?}");
    let error = shard.last_error.unwrap();
    assert!(error.contains("lost"), "{error}");
    assert!(error.contains(t.checkpoint.as_str()), "{error}");
    assert!(error.contains(t.first_kept.as_str()), "{error}");
    assert!(error.contains("trim_horizon"), "{error}");

    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = worker.status().await.unwrap();
    assert!(status.shard_restarts >= 1, "{status:?}");
    let trimmed = status
        .metrics
        .as_ref()
        .and_then(|m| m.totals.get("TrimmedCheckpoints").copied())
        .unwrap_or_default();
    assert!(trimmed >= 1.0, "{:?}", status.metrics);
    let _ = worker.shutdown().await.unwrap();
    assert_eq!(log.len(), 0, "the shard was not processed: {:?}", log.got());
    let lease = t
        .rig
        .lease_table()
        .get(&LeaseKey::from(&t.shard))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&lease.checkpoint, Checkpoint::At(at) if at.sequence == t.checkpoint),
        "the checkpoint stays for an operator to decide: {:?}",
        lease.checkpoint
    );
}

#[tokio::test(start_paused = true)]
async fn a_trimmed_checkpoint_goes_on_from_the_oldest_change_kept_when_allowed() {
    let t = trimmed_checkpoint().await;
    let log = Log::default();
    let mut settings = t.rig.settings("w2");
    settings.reader.trimmed_checkpoint = TrimmedCheckpoint::TrimHorizon;
    let worker = t.rig.start(settings, &log).await;
    wait_for(&log, t.kept_count).await;
    let status = worker.status().await.unwrap();
    shutdown_clean(worker).await;
    log.assert_parsed();
    assert_eq!(log.by_key(), t.kept, "the changes kept, once each");
    assert_eq!(log.got()[0].sequence, t.first_kept);
    let trimmed = status
        .metrics
        .as_ref()
        .and_then(|m| m.totals.get("TrimmedCheckpoints").copied());
    assert_eq!(trimmed, Some(1.0), "{:?}", status.metrics);
    assert_eq!(status.shard_restarts, 0);
}

#[tokio::test(start_paused = true)]
async fn an_iterator_held_past_fifteen_minutes_is_renewed_without_loss_or_duplicates() {
    let rig = Rig::new(MemoryTableStreamsConfig::default()).await;
    let streams = Faulty::new(rig.tables.clone(), FaultPlan::seeded(1));
    let mut items = Items::default();
    let writes: Vec<_> = (0..30).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;

    let log = Log::default();
    let mut settings = rig.settings("w1");
    // One batch fills the window: the reader holds its next iterator while the first
    // batch takes sixteen minutes.
    settings.reader.max_records = 10;
    settings.reader.window_records = 10;
    settings.reader.processor_timeout = Duration::from_secs(3600);
    let pause = Pause {
        length: Duration::from_secs(16 * 60),
        done: Arc::default(),
    };
    let worker = rig
        .try_start(
            rig.backend_on(Arc::new(streams.clone())),
            settings,
            &log,
            Some(pause),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let writes: Vec<_> = (0..30).map(|i| items.put(&key(i))).collect();
    rig.write(&writes).await;
    assert_eq!(log.len(), 0, "the first batch is still being processed");
    assert_eq!(streams.calls("GetShardIterator"), 1);
    tokio::time::sleep(Duration::from_secs(16 * 60)).await;
    wait_for(&log, items.total()).await;
    // And a long idle at the tip: the reader's iterator is renewed as it polls.
    tokio::time::sleep(Duration::from_secs(20 * 60)).await;
    let writes: Vec<_> = (0..30).map(|i| items.delete(&key(i))).collect();
    rig.write(&writes).await;
    wait_for(&log, items.total()).await;
    shutdown_clean(worker).await;
    log.assert_parsed();
    assert_eq!(log.by_key(), items.expected);
    assert_eq!(log.len(), 90);
    assert_eq!(
        streams.calls("GetShardIterator"),
        2,
        "one iterator at the start, one for the expired one"
    );
}
