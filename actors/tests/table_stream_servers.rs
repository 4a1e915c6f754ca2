//! Whole workers on a DynamoDB table's change stream, against servers that speak the
//! DynamoDB and DynamoDB Streams wire protocols, through the real adapters
//! (`Backend::from_sdk`, as `Backend::aws` builds it: `DynamoStreams` and the lease
//! table at `aws.dynamodb_endpoint`): dynoxide (in this process) always; AWS's DynamoDB
//! Local 1.25.1 and moto 5.2.5 (started by scripts/test.sh) with the `external-servers`
//! feature, failing loudly without their servers.
//!
//! A writer puts and deletes items of a fresh table (a `n` counter attribute that every
//! put raises, so each change's images say which write made it) and keeps the changes
//! DynamoDB must report, per item; the workers' processors keep what they were given.
//! Per item the two lists must be equal: nothing lost, nothing twice, in order, with the
//! right eventName and images.
//!
//! Neither server ever closes or splits a shard within a test: each stream has one
//! shard, which each tier declares and checks ([`Expect`]), with what else it lacks.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_actors::backend::aws::{DynamoLeaseTable, DynamoStreams};
use flotilla_actors::backend::{ItemWrite, LeaseTable, StreamClient, TableStreamAdmin};
use flotilla_actors::model::change::item_key_text;
use flotilla_actors::model::{Checkpoint, SequenceNumber, Shard};
use flotilla_actors::settings::{InitialPosition, MetricsLevel, ReadMode};
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, ShardInfo, ShutdownReport, Worker,
};
use support::changes::{Change, Model, change_of, counter, item, item_of, key_item};
use support::probe::{fast_settings, wait_until};
use support::servers;

/// How long a test waits for the changes it wrote.
const PATIENCE: Duration = Duration::from_secs(120);
/// After the last expected change: time for a duplicate, if any, to show.
const SETTLE: Duration = Duration::from_millis(1500);
/// How long the second worker of a fleet is watched while the first lives: several
/// heartbeats, shard syncs and balancing rounds of `fast_settings`.
const WATCH_IDLE: Duration = Duration::from_secs(5);

/// What a server lacks of DynamoDB Streams that a worker meets. Each is checked by
/// every test, so a declaration that stops being true fails.
struct Expect {
    /// Shards per stream: DynamoDB starts with one (more under load) and rotates them
    /// about every four hours; these servers keep one for the whole test.
    one_shard: &'static str,
    /// The open shard is listed with an `EndingSequenceNumber` (its last record's)
    /// though it keeps taking records: where a server does so. The worker must read on
    /// past that "end" and never finish the shard.
    open_shard_listed_with_end: Option<&'static str>,
}

struct Tier {
    name: &'static str,
    endpoint: String,
    expect: Expect,
}

impl Tier {
    async fn dynoxide() -> Self {
        Self {
            name: "dynoxide",
            endpoint: servers::start_dynoxide().await,
            expect: Expect {
                one_shard: "dynoxide has one shard per table, for ever",
                open_shard_listed_with_end: Some(
                    "dynoxide lists its one shard with EndingSequenceNumber = its last \
                     record, though the shard stays open",
                ),
            },
        }
    }

    #[cfg(feature = "external-servers")]
    fn dynamodb_local() -> Self {
        Self {
            name: "dynamodb_local",
            endpoint: servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
            expect: Expect {
                one_shard: "DynamoDB Local keeps one open shard per stream within a test",
                open_shard_listed_with_end: None,
            },
        }
    }

    #[cfg(feature = "external-servers")]
    fn moto() -> Self {
        Self {
            name: "moto",
            endpoint: servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT"),
            expect: Expect {
                one_shard: "moto has one shard per stream, for ever",
                open_shard_listed_with_end: None,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------
// What was written, what was delivered
// ---------------------------------------------------------------------------------------

/// One record as a processor got it.
#[derive(Debug, Clone)]
struct Got {
    worker: &'static str,
    sequence: SequenceNumber,
    item: String,
    change: Change,
}

/// What every processor of a test got, in the order processed.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<Got>>>);

impl Sink {
    fn all(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn by(&self, worker: &str) -> Vec<Got> {
        self.all()
            .into_iter()
            .filter(|g| g.worker == worker)
            .collect()
    }

    /// Waits until `count` records have been processed, then [`SETTLE`] more.
    async fn wait_for(&self, count: usize, what: &str) {
        wait_until(what, PATIENCE, Duration::from_millis(50), || {
            self.len() >= count
        })
        .await;
        tokio::time::sleep(SETTLE).await;
    }
}

/// Decodes each record's change, checks what one record alone can show (the key as
/// partition key, the whole new image, the sequence number), and files it.
struct ChangeProbe {
    worker: &'static str,
    sink: Sink,
}

impl Processor for ChangeProbe {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let mut got = Vec::new();
        for record in batch.records() {
            let change = record.dynamodb_change()?;
            let key = item_of(&change);
            assert_eq!(change.dynamodb.keys, key_item(&key));
            assert_eq!(record.partition_key, item_key_text(&key_item(&key)));
            assert_eq!(
                change.dynamodb.sequence_number,
                record.sequence_number.as_str()
            );
            if let (Some(image), Some(n)) = (
                &change.dynamodb.new_image,
                counter(&change.dynamodb.new_image),
            ) {
                assert_eq!(image, &item(&key, n), "the whole new image");
            }
            got.push(Got {
                worker: self.worker,
                sequence: record.sequence_number.clone(),
                item: key,
                change: change_of(&change),
            });
        }
        self.sink.0.lock().unwrap().extend(got);
        Ok(())
    }
}

/// Compares what was got with what is owed, item by item: lost, duplicated and
/// misordered changes all make a list differ. Names a few differing items.
fn assert_per_item(tier: &str, what: &str, got: &[Got], owed: &BTreeMap<String, Vec<Change>>) {
    let mut by_item: BTreeMap<String, Vec<Change>> = BTreeMap::new();
    for g in got {
        by_item.entry(g.item.clone()).or_default().push(g.change);
    }
    let mut sequences = HashSet::new();
    let duplicates = got
        .iter()
        .filter(|g| !sequences.insert(&g.sequence))
        .count();
    let differing: Vec<String> = owed
        .keys()
        .chain(by_item.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|key| by_item.get(*key) != owed.get(*key))
        .take(3)
        .map(|key| {
            format!(
                "{key}: owed {:?}, got {:?}",
                owed.get(key),
                by_item.get(key)
            )
        })
        .collect();
    let owed_total: usize = owed.values().map(Vec::len).sum();
    assert!(
        differing.is_empty() && duplicates == 0,
        "{tier}: {what}: {owed_total} changes owed, {} got, {duplicates} duplicates; \
         differing items: {differing:#?}",
        got.len()
    );
}

// ---------------------------------------------------------------------------------------
// A table, its stream, workers
// ---------------------------------------------------------------------------------------

struct Env {
    tier: Tier,
    streams: DynamoStreams,
    table: String,
    arn: String,
    application: String,
}

impl Env {
    async fn new(tier: Tier) -> Self {
        let streams = DynamoStreams::new(&servers::sdk_config(), Some(&tier.endpoint));
        let table = servers::unique_name("flotilla-tw");
        let arn = streams
            .create_table_with_stream(&table)
            .await
            .unwrap_or_else(|e| panic!("{}: create {table}: {e}", tier.name));
        Self {
            streams,
            table,
            arn,
            application: servers::unique_name("flotilla-tw-app"),
            tier,
        }
    }

    /// `worker.stream = "dynamodb:TABLE"`.
    fn by_table(&self) -> String {
        format!("dynamodb:{}", self.table)
    }

    async fn write(&self, writes: &[ItemWrite]) {
        self.streams
            .write_items(&self.table, writes)
            .await
            .unwrap_or_else(|e| panic!("{}: write to {}: {e}", self.tier.name, self.table));
    }

    /// Writes `rounds` rounds of the model over `keys` items.
    async fn write_rounds(&self, model: &mut Model, rounds: std::ops::Range<u64>, keys: u64) {
        for round in rounds {
            let writes = model.round(round, keys);
            self.write(&writes).await;
        }
    }

    /// A worker `id` of this test's application, reading `stream` (either form) from
    /// TRIM_HORIZON by polling, on the AWS backend built from its own settings.
    async fn start(&self, id: &'static str, stream: &str, sink: &Sink) -> Worker {
        let mut settings = fast_settings(stream, &self.application);
        settings.worker.worker_id = Some(id.to_owned());
        settings.worker.initial_position = InitialPosition::TrimHorizon;
        // DynamoDB Streams are read by polling whatever mode the Kinesis suites run in.
        settings.reader.mode = ReadMode::Polling;
        settings.metrics.level = MetricsLevel::None;
        settings.aws.region = Some("us-east-1".to_owned());
        settings.aws.dynamodb_endpoint = Some(self.tier.endpoint.clone());
        let backend = Backend::from_sdk(&servers::sdk_config(), &settings.aws);
        let sink = sink.clone();
        Worker::builder()
            .settings(settings)
            .backend(backend)
            .processor(move |_: &ShardInfo| ChangeProbe {
                worker: id,
                sink: sink.clone(),
            })
            .start()
            .await
            .unwrap_or_else(|e| panic!("{}: worker {id} on {stream}: {e}", self.tier.name))
    }

    async fn shards(&self) -> Vec<Shard> {
        self.streams.list_shards(&self.arn).await.unwrap()
    }

    fn lease_table(&self) -> DynamoLeaseTable {
        DynamoLeaseTable::new(
            &servers::sdk_config(),
            Some(&self.tier.endpoint),
            &self.application,
        )
    }

    /// Checks the tier's [`Expect`] after a test's writes and workers: one shard, open or
    /// listed with an end as declared, and its lease never finished (the workers read on
    /// past a listed end), unowned, at a checkpoint, naming the stream by its ARN.
    async fn check_declared(&self) {
        let (tier, expect) = (self.tier.name, &self.tier.expect);
        let shards = self.shards().await;
        assert_eq!(shards.len(), 1, "{tier}: {}: {shards:?}", expect.one_shard);
        let shard = &shards[0];
        match expect.open_shard_listed_with_end {
            None => assert!(shard.is_open(), "{tier}: an open shard: {shard:?}"),
            Some(gap) => {
                assert!(!shard.is_open(), "{tier}: declared ({gap}): {shard:?}");
                eprintln!("{tier}: {gap}: the workers read past it");
            }
        }
        let scan = self.lease_table().scan().await.unwrap();
        assert_eq!(scan.leases.len(), 1, "{tier}: {:?}", scan.leases);
        let lease = &scan.leases[0];
        assert_eq!(lease.key.as_str(), shard.id.as_str(), "{tier}");
        assert!(
            matches!(lease.checkpoint, Checkpoint::At(_)),
            "{tier}: the one shard is never finished: {lease:?}"
        );
        assert_eq!(lease.owner, None, "{tier}: released at shutdown: {lease:?}");
        assert_eq!(lease.source.as_deref(), Some(self.arn.as_str()), "{tier}");
    }
}

async fn shutdown_clean(tier: &str, worker: Worker) -> ShutdownReport {
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{tier}: {report:#?}");
    report
}

/// Writes rounds of the model in the background until stopped: changes made while the
/// workers start, hand over and stop.
struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Model>,
}

impl Writer {
    fn start(env: &Env, mut model: Model, first_round: u64, keys: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (streams, table, stopping) = (env.streams.clone(), env.table.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut round = first_round;
            while !stopping.load(Ordering::SeqCst) {
                for write in model.round(round, keys) {
                    streams
                        .write_items(&table, std::slice::from_ref(&write))
                        .await
                        .unwrap();
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            model
        });
        Self { stop, task }
    }

    async fn stop(self) -> Model {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

mod scenarios {
    use super::*;

    /// Hundreds of inserts, updates and deletes of 60 items (some written before the
    /// worker starts, some while it reads), read through `worker.stream =
    /// "dynamodb:TABLE"`: every change once, per item in order, with its images.
    pub async fn changes_arrive_per_item_in_order(tier: Tier) {
        const KEYS: u64 = 60;
        let started = Instant::now();
        let env = Env::new(tier).await;
        let tier = env.tier.name;
        let mut model = Model::default();
        env.write_rounds(&mut model, 1..4, KEYS).await;
        let sink = Sink::default();
        let worker = env.start("w1", &env.by_table(), &sink).await;
        env.write_rounds(&mut model, 4..8, KEYS).await;
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for (kind, _, _) in model.expected.values().flatten() {
            *kinds.entry(kind.as_str()).or_default() += 1;
        }
        sink.wait_for(model.total(), "every change").await;
        let status = worker.status().await.unwrap();
        assert_eq!(status.stream, env.arn, "{tier}: dynamodb:TABLE resolved");
        assert_eq!(status.shard_restarts, 0, "{tier}: {status:#?}");
        shutdown_clean(tier, worker).await;
        assert_per_item(tier, "one worker", &sink.all(), &model.expected);
        env.check_declared().await;
        eprintln!(
            "{tier}: {} changes ({kinds:?}) of {KEYS} items in {:?}",
            model.total(),
            started.elapsed()
        );
    }

    /// A worker reading by the stream's ARN shuts down cleanly; more changes are made;
    /// a new worker of the application resumes at the checkpoint: it gets exactly the
    /// new changes, none of the first worker's again.
    pub async fn resumes_from_the_checkpoint_after_a_clean_shutdown(tier: Tier) {
        const KEYS: u64 = 40;
        let started = Instant::now();
        let env = Env::new(tier).await;
        let tier = env.tier.name;
        let mut model = Model::default();
        env.write_rounds(&mut model, 1..4, KEYS).await;
        let sink = Sink::default();
        let first = env.start("w1", &env.arn, &sink).await;
        sink.wait_for(model.total(), "the first changes").await;
        let report = shutdown_clean(tier, first).await;
        assert_eq!(report.leases.released.len(), 1, "{tier}: {report:#?}");
        let before = model.clone();

        env.write_rounds(&mut model, 4..8, KEYS).await;
        let second = env.start("w2", &env.arn, &sink).await;
        sink.wait_for(model.total(), "the new changes").await;
        shutdown_clean(tier, second).await;
        assert_per_item(tier, "the first worker", &sink.by("w1"), &before.expected);
        assert_per_item(
            tier,
            "the second worker: exactly the new changes",
            &sink.by("w2"),
            &model.since(&before),
        );
        assert_per_item(tier, "both", &sink.all(), &model.expected);
        env.check_declared().await;
        eprintln!(
            "{tier}: {} then {} changes over a clean restart in {:?}",
            before.total(),
            model.total() - before.total(),
            started.elapsed()
        );
    }

    /// Two workers share the lease table, one naming the stream `dynamodb:TABLE`, the
    /// other by its ARN (both the same leases). With one shard, the second holds and
    /// delivers nothing while the first lives; the first shuts down cleanly while
    /// changes are being made and hands the shard over: the second goes on from the
    /// first's last change, nothing lost, nothing twice, per item in order.
    pub async fn a_second_worker_waits_then_takes_the_handoff(tier: Tier) {
        const KEYS: u64 = 30;
        let started = Instant::now();
        let env = Env::new(tier).await;
        let tier = env.tier.name;
        let mut model = Model::default();
        env.write_rounds(&mut model, 1..3, KEYS).await;
        let sink = Sink::default();
        let first = env.start("w1", &env.by_table(), &sink).await;
        sink.wait_for(model.total(), "the first worker's changes")
            .await;
        let writer = Writer::start(&env, model, 3, KEYS);

        let second = env.start("w2", &env.arn, &sink).await;
        let watch = Instant::now();
        while watch.elapsed() < WATCH_IDLE {
            let status = second.status().await.unwrap();
            assert!(
                status.shards.is_empty(),
                "{tier}: the second worker holds nothing while the first lives: {:?}",
                status.shards
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            sink.by("w2").is_empty(),
            "{tier}: w2 delivered while w1 held"
        );
        let first_status = first.status().await.unwrap();
        assert_eq!(first_status.shards.len(), 1, "{tier}: {first_status:#?}");
        let before_handoff = sink.by("w1").len();
        assert!(before_handoff > 0);

        let report = shutdown_clean(tier, first).await;
        assert_eq!(
            report.leases.handed_off.len(),
            1,
            "{tier}: handed to the live worker, not released: {report:#?}"
        );
        // Changes keep coming during and after the handoff.
        let w2_started = Instant::now();
        wait_until(
            "the second worker to deliver",
            PATIENCE,
            Duration::from_millis(50),
            || !sink.by("w2").is_empty(),
        )
        .await;
        let gap = w2_started.elapsed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let model = writer.stop().await;
        sink.wait_for(model.total(), "every change").await;
        shutdown_clean(tier, second).await;

        let (w1, w2) = (sink.by("w1"), sink.by("w2"));
        let last_of_w1 = w1.last().unwrap().sequence.clone();
        let first_of_w2 = w2.first().unwrap().sequence.clone();
        assert!(
            first_of_w2 > last_of_w1,
            "{tier}: w2 starts after w1's last change: {last_of_w1:?} then {first_of_w2:?}"
        );
        assert_per_item(tier, "both workers", &sink.all(), &model.expected);
        env.check_declared().await;
        eprintln!(
            "{tier}: handoff after {} of {} changes, w2's first delivery {gap:?} after \
             w1's shutdown; {} on w2; {:?} in all",
            w1.len(),
            model.total(),
            w2.len(),
            started.elapsed()
        );
    }
}

macro_rules! tier {
    ($tier:ident, $(#[$attr:meta])* start: $start:expr) => {
        $(#[$attr])*
        mod $tier {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn changes_arrive_per_item_in_order() {
                scenarios::changes_arrive_per_item_in_order($start).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resumes_from_the_checkpoint_after_a_clean_shutdown() {
                scenarios::resumes_from_the_checkpoint_after_a_clean_shutdown($start).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_second_worker_waits_then_takes_the_handoff() {
                scenarios::a_second_worker_waits_then_takes_the_handoff($start).await;
            }
        }
    };
}

tier!(dynoxide, start: Tier::dynoxide().await);

tier!(
    dynamodb_local,
    #[cfg(feature = "external-servers")]
    start: Tier::dynamodb_local()
);

tier!(
    moto,
    #[cfg(feature = "external-servers")]
    start: Tier::moto()
);
