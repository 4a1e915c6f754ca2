//! The worker end to end against servers that speak the AWS wire protocols, through the
//! real adapters: in-process dynoxide + ferrokinesis always; DynamoDB Local +
//! kinesis-mock, and moto for both services (started by scripts/test.sh), with the
//! `external-servers` feature.
//! Real time and real sockets: small streams, short intervals.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use flotilla_actors::backend::aws::{DynamoLeaseTable, KinesisStream};
use flotilla_actors::backend::{LeaseTable, StreamAdmin, StreamClient};
use flotilla_actors::model::{Checkpoint, Shard};
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{Backend, ShardState, Worker};
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings, read_mode, wait_until};
use support::rig::shutdown_clean;
use support::servers;
use support::stripping_proxy::{Fault, Options, StrippingProxy};

struct Env {
    kinesis: KinesisStream,
    dynamodb_endpoint: String,
    stream: String,
    application: String,
}

impl Env {
    async fn new(kinesis_endpoint: String, dynamodb_endpoint: String, shards: u32) -> Self {
        let sdk = servers::sdk_config();
        let kinesis = KinesisStream::new(&sdk, Some(&kinesis_endpoint));
        let stream = servers::unique_name("worker");
        kinesis.create_stream(&stream, shards).await.unwrap();
        Self {
            kinesis,
            dynamodb_endpoint,
            application: servers::unique_name("worker-app"),
            stream,
        }
    }

    fn table(&self) -> DynamoLeaseTable {
        DynamoLeaseTable::new(
            &servers::sdk_config(),
            Some(&self.dynamodb_endpoint),
            &self.application,
        )
    }

    async fn start(&self, probes: &ProbeFactory) -> Worker {
        let f = probes.clone();
        Worker::builder()
            .settings(fast_settings(&self.stream, &self.application))
            .backend(self.backend())
            .processor(move |shard| f.make(shard))
            .start()
            .await
            .unwrap()
    }

    fn backend(&self) -> Backend {
        servers::dynamo_backend(&self.kinesis, &self.dynamodb_endpoint)
    }

    async fn open_shards(&self) -> Vec<Shard> {
        let mut open: Vec<Shard> = self
            .kinesis
            .list_shards(&self.stream)
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.is_open())
            .collect();
        open.sort_by_key(|s| s.hash_range.start);
        open
    }
}

/// How long a real-time test waits for records.
const PATIENCE: Duration = Duration::from_secs(180);

/// What a split or merge does on a tier's Kinesis beyond the listing.
#[derive(Debug, Clone, Copy)]
enum Resharding {
    /// Parents end (SHARD_END) after their records; new records go to the children.
    Full,
    /// Only the listing changes (moto): a closed shard never ends and keeps taking new
    /// records. Nothing may be lost or reordered all the same; the parents are never
    /// finished, so the children are never started.
    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    ListingOnly(&'static str),
}

mod scenarios {
    use super::*;

    /// A worker whose shard cannot be read (here: the server has no SubscribeToShard)
    /// keeps its lease and says so on its status, with the failing call; nothing is
    /// restarted in a loop.
    pub async fn an_unreadable_shard_is_reported(kinesis: String, dynamodb: String, why: &str) {
        eprintln!("fan-out cannot read here ({why}): checking that the shard says so");
        let env = Env::new(kinesis, dynamodb, 1).await;
        let probes = ProbeFactory::new(Misbehave::default());
        let worker = env.start(&probes).await;
        let started = tokio::time::Instant::now();
        let deadline = started + PATIENCE;
        loop {
            let status = worker.status().await.unwrap();
            // Stalled from the first refusal, with it as the reason (it showed
            // `processing`, ready, for 94 s: until 20 failures in a row).
            let reported = status.shards.first().is_some_and(|shard| {
                shard.state == ShardState::Stalled
                    && shard
                        .subscription
                        .as_ref()
                        .is_some_and(|s| s.state == "none")
                    && shard
                        .stall
                        .as_deref()
                        .is_some_and(|e| e.starts_with("cannot subscribe: SubscribeToShard"))
            });
            if reported {
                assert_eq!(status.read_mode, "fanout");
                assert_eq!(status.shard_restarts, 0, "{status:#?}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the unread shard was never reported: {status:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "reported at the first refusal, not after a run of them: {:?}",
            started.elapsed()
        );
        // /readyz reads a snapshot up to a second old (or, while the supervisor does not
        // answer, the last one): it may predate the stall just seen. It must follow.
        let url = support::http::url(&worker, "/readyz");
        let stalled = "shard shardId-000000000000 is stalled: cannot subscribe: SubscribeToShard";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let (code, _, body) = support::http::get(&url, "*/*").await;
            if code == 503 && body.contains(stalled) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "/readyz never said the shard is stalled: {code} {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        shutdown_clean(worker).await;
    }

    pub async fn consumes_a_resharded_stream_in_order(
        kinesis: String,
        dynamodb: String,
        resharding: Resharding,
    ) {
        let env = Env::new(kinesis, dynamodb, 4).await;
        let probes = ProbeFactory::new(Misbehave::default());
        let worker = env.start(&probes).await;
        let mut producer = Producer::default();
        producer.put_round(&env.kinesis, &env.stream, 50, 10).await;
        let first = env.open_shards().await[0].clone();
        let mid = first.hash_range.start + (first.hash_range.end - first.hash_range.start) / 2;
        env.kinesis
            .split_shard(&env.stream, &first.id, mid)
            .await
            .unwrap();
        producer.put_round(&env.kinesis, &env.stream, 50, 10).await;
        let open = env.open_shards().await;
        let (a, b) = (open[3].clone(), open[4].clone());
        env.kinesis
            .merge_shards(&env.stream, &a.id, &b.id)
            .await
            .unwrap();
        producer.put_round(&env.kinesis, &env.stream, 50, 10).await;

        probes.wait_distinct(producer.total(), PATIENCE).await;
        shutdown_clean(worker).await;
        probes.assert_nothing_lost(&producer);
        let seen = probes.snapshot();
        let table = env.table();
        for id in [first.id.clone(), a.id.clone(), b.id.clone()] {
            let lease = table.get(&(&id).into()).await.unwrap().unwrap();
            match resharding {
                Resharding::Full => {
                    assert_eq!(lease.checkpoint, Checkpoint::ShardEnd, "{id}");
                    assert!(seen.shard_ended.contains(&id), "{id} got no shard_ended");
                }
                Resharding::ListingOnly(why) => {
                    assert_ne!(lease.checkpoint, Checkpoint::ShardEnd, "{id}: {why}");
                    assert!(!seen.shard_ended.contains(&id), "{id}: {why}");
                }
            }
        }
    }

    pub async fn resumes_after_a_crash(kinesis: String, dynamodb: String) {
        let env = Env::new(kinesis, dynamodb, 2).await;
        let probes_a = ProbeFactory::new(Misbehave::default());
        let worker_a = env.start(&probes_a).await;
        let mut producer = Producer::default();
        producer.put_round(&env.kinesis, &env.stream, 20, 20).await;
        probes_a.wait_distinct(producer.total(), PATIENCE).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        worker_a.abort();
        producer.put_round(&env.kinesis, &env.stream, 20, 10).await;

        let probes_b = ProbeFactory::new(Misbehave::default());
        let worker_b = env.start(&probes_b).await;
        let b = probes_b.seen.clone();
        let expected_new: u64 = 20 * 10;
        wait_until(
            "worker b to take over",
            Duration::from_secs(180),
            Duration::from_millis(200),
            || {
                b.lock()
                    .unwrap()
                    .by_key
                    .values()
                    .map(|v| v.iter().filter(|s| **s >= 20).count() as u64)
                    .sum::<u64>()
                    >= expected_new
            },
        )
        .await;
        shutdown_clean(worker_b).await;
        let a = probes_a.snapshot();
        let b = probes_b.snapshot();
        for (key, count) in &producer.produced {
            let mut all: std::collections::HashSet<u64> = a
                .by_key
                .get(key)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .collect();
            all.extend(b.by_key.get(key).cloned().unwrap_or_default());
            assert_eq!(all.len() as u64, *count, "{key}: records lost");
            // Everything before the crash was checkpointed (the writer had a second):
            // worker b starts after it, with no duplicates.
            let replayed = b
                .by_key
                .get(key)
                .map(|v| v.iter().filter(|s| **s < 20).count())
                .unwrap_or(0);
            assert_eq!(replayed, 0, "{key}: worker b replayed checkpointed records");
        }
        let table = env.table();
        for lease in table.scan().await.unwrap().leases {
            assert_eq!(lease.owner, None, "{} released", lease.key);
            assert!(
                lease.counter >= 3,
                "{}: taken by a, taken by b, released: {}",
                lease.key,
                lease.counter
            );
        }
    }
}

mod more_scenarios {
    use super::*;
    use support::probe::special_records;

    pub async fn special_records_arrive_intact(kinesis: String, dynamodb: String) {
        let env = Env::new(kinesis, dynamodb, 1).await;
        let (records, expected_other) = special_records();
        for record in &records {
            env.kinesis
                .put_records(&env.stream, std::slice::from_ref(record))
                .await
                .unwrap();
        }
        let probes = ProbeFactory::new(Misbehave::default());
        let worker = env.start(&probes).await;
        wait_until(
            "the records",
            Duration::from_secs(120),
            Duration::from_millis(200),
            || probes.snapshot().deliveries >= 13,
        )
        .await;
        shutdown_clean(worker).await;
        let seen = probes.snapshot();
        assert_eq!(seen.by_key["agg"], (0..10).collect::<Vec<u64>>());
        let mut other = seen.other.clone();
        other.sort();
        assert_eq!(other, expected_other);
    }

    pub async fn a_failing_processor_restarts_from_the_checkpoint(
        kinesis: String,
        dynamodb: String,
    ) {
        let env = Env::new(kinesis, dynamodb, 2).await;
        let probes = ProbeFactory::new(Misbehave {
            fail_on: Some(("key-1:30".to_owned(), 2)),
            panic_on: Some("key-4:40".to_owned()),
            stall_on: None,
            slow: None,
        });
        let worker = env.start(&probes).await;
        let mut producer = Producer::default();
        producer.put_round(&env.kinesis, &env.stream, 6, 60).await;
        probes.wait_distinct(producer.total(), PATIENCE).await;
        let status = worker.status().await.unwrap();
        assert!(
            status.shard_restarts >= 3,
            "restarts: {}",
            status.shard_restarts
        );
        shutdown_clean(worker).await;
        probes.assert_nothing_lost(&producer);
    }
}

mod two_phase {
    use super::*;
    use flotilla_actors::model::ExtendedSequenceNumber;
    use flotilla_actors::{
        Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, ShardInfo,
    };
    use std::sync::Mutex;

    #[derive(Debug, Default)]
    struct Log {
        infos: Vec<ShardInfo>,
        /// Where the first owner prepared; where the next one committed.
        prepared: Option<ExtendedSequenceNumber>,
        committed: Option<ExtendedSequenceNumber>,
    }

    /// The first owner prepares at its first batch's last record, with state, and
    /// commits nothing; the next owner prepares and commits at its first batch's last.
    struct Preparer {
        first: bool,
        log: Arc<Mutex<Log>>,
    }

    impl Processor for Preparer {
        async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
            self.log.lock().unwrap().infos.push(shard.clone());
            Ok(())
        }

        async fn process(
            &mut self,
            batch: &Batch,
            cp: &Checkpointer,
        ) -> Result<(), ProcessorError> {
            let Some(last) = batch.records().last() else {
                return Ok(());
            };
            let at = ExtendedSequenceNumber::new(last.sequence_number.clone(), 0);
            let done = {
                let log = self.log.lock().unwrap();
                if self.first {
                    log.prepared.is_some()
                } else {
                    log.committed.is_some()
                }
            };
            if done {
                return Ok(());
            }
            if self.first {
                cp.prepare_checkpoint(at.clone(), Some(b"state-a".to_vec()))
                    .await?;
                self.log.lock().unwrap().prepared = Some(at);
            } else {
                let prepared = cp.prepare_checkpoint(at.clone(), None).await?;
                prepared.checkpoint().await?;
                self.log.lock().unwrap().committed = Some(at);
            }
            Ok(())
        }
    }

    /// A prepared checkpoint and its state, written through the real DynamoDB adapter,
    /// reach the next owner after its first owner dies; the next owner's commit removes
    /// them.
    pub async fn a_prepared_checkpoint_reaches_the_next_owner(kinesis: String, dynamodb: String) {
        let env = Env::new(kinesis, dynamodb, 1).await;
        let mut producer = Producer::default();
        producer.put_round(&env.kinesis, &env.stream, 1, 20).await;
        let log = Arc::new(Mutex::new(Log::default()));
        let start = |first: bool| {
            let mut settings = fast_settings(&env.stream, &env.application);
            settings.checkpoint.mode = CheckpointMode::Manual;
            let log = log.clone();
            Worker::builder()
                .settings(settings)
                .backend(env.backend())
                .processor(move |_| Preparer {
                    first,
                    log: log.clone(),
                })
                .start()
        };
        let worker_a = start(true).await.unwrap();
        let l = log.clone();
        wait_until("the prepare", PATIENCE, Duration::from_millis(100), || {
            l.lock().unwrap().prepared.is_some()
        })
        .await;
        worker_a.abort();
        let prepared = log.lock().unwrap().prepared.clone();
        let table = env.table();
        let row = table.scan().await.unwrap().leases.pop().unwrap();
        assert_eq!(row.checkpoint, Checkpoint::TrimHorizon);
        assert_eq!(row.pending_checkpoint, prepared);
        assert_eq!(row.pending_checkpoint_state, Some(b"state-a".to_vec()));

        let worker_b = start(false).await.unwrap();
        let l = log.clone();
        wait_until(
            "the next owner's commit",
            PATIENCE,
            Duration::from_millis(100),
            || l.lock().unwrap().committed.is_some(),
        )
        .await;
        let (info, committed) = {
            let log = log.lock().unwrap();
            (log.infos.last().cloned().unwrap(), log.committed.clone())
        };
        assert_eq!(info.starting_at, Checkpoint::TrimHorizon);
        assert_eq!(info.pending_checkpoint, prepared);
        assert_eq!(
            info.pending_checkpoint_state.as_deref(),
            Some(&b"state-a"[..])
        );
        let row = table.scan().await.unwrap().leases.pop().unwrap();
        assert_eq!(row.checkpoint, Checkpoint::At(committed.unwrap()));
        assert_eq!(row.pending_checkpoint, None);
        assert_eq!(row.pending_checkpoint_state, None);
        shutdown_clean(worker_b).await;
    }
}

/// Why a tier cannot read in the tests' read mode, where it cannot: moto has no
/// SubscribeToShard. Its first test checks what it can instead (the shard reported
/// unread, with the reason); the others have nothing to add and end at once.
fn no_fanout(tier: &str) -> Option<&'static str> {
    (tier == "moto" && read_mode() == ReadMode::Fanout)
        .then_some("moto has no SubscribeToShard (it answers a bare 500)")
}

mod origin {
    use super::*;

    /// A worker of another stream, or of this stream deleted and created again, on an
    /// application's table: refused at start (`model::origin`), the rows untouched.
    pub async fn another_streams_rows_are_refused(kinesis: String, dynamodb: String) {
        let env = Env::new(kinesis, dynamodb, 2).await;
        let probes = ProbeFactory::new(Misbehave::default());
        let mut producer = Producer::with_prefix("origin");
        producer.put_round(&env.kinesis, &env.stream, 8, 4).await;
        let worker = env.start(&probes).await;
        probes.wait_distinct(producer.total(), PATIENCE).await;
        shutdown_clean(worker).await;
        let start = |stream: String| {
            let f = probes.clone();
            let backend = env.backend();
            let application = env.application.clone();
            async move {
                Worker::builder()
                    .settings(fast_settings(&stream, &application))
                    .backend(backend)
                    .processor(move |shard| f.make(shard))
                    .start()
                    .await
            }
        };
        // Renamed: another stream, the same application.
        let other = servers::unique_name("worker-renamed");
        env.kinesis.create_stream(&other, 2).await.unwrap();
        match start(other).await {
            Err(flotilla_actors::WorkerError::ForeignRows { rows, .. }) => {
                assert_eq!(rows.len(), 2)
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a worker of another stream started on this stream's rows"),
        }
        // Recreated: the same name, created again (a second later: creation times are
        // in seconds).
        let created = env
            .kinesis
            .describe_stream_summary(&env.stream)
            .await
            .unwrap()
            .created;
        if created.is_none() {
            eprintln!(
                "this server gives no StreamCreationTimestamp: a recreated stream cannot be told apart by it"
            );
            return;
        }
        env.kinesis.delete_stream(&env.stream).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let mut again = Err(String::new());
        for _ in 0..50 {
            again = env
                .kinesis
                .create_stream(&env.stream, 2)
                .await
                .map_err(|e| e.to_string());
            if again.is_ok() {
                break;
            }
            // Still being deleted.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        again.unwrap();
        match start(env.stream.clone()).await {
            Err(flotilla_actors::WorkerError::ForeignRows { rows, .. }) => assert!(
                rows.iter().all(|(_, why)| matches!(
                    why,
                    flotilla_actors::model::origin::Foreign::Recreated { .. }
                )),
                "{rows:?}"
            ),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a worker started on the deleted stream's rows"),
        }
    }
}

macro_rules! tier {
    ($tier:ident, $(#[$attr:meta])* start: $start:expr) => {
        tier!($tier, $(#[$attr])* start: $start, resharding: Resharding::Full);
    };
    ($tier:ident, $(#[$attr:meta])* start: $start:expr, resharding: $resharding:expr) => {
        $(#[$attr])*
        mod $tier {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn consumes_a_resharded_stream_in_order() {
                let (kinesis, dynamodb) = $start;
                if let Some(why) = no_fanout(stringify!($tier)) {
                    // Declared: the shard is reported unread, with the reason.
                    return scenarios::an_unreadable_shard_is_reported(kinesis, dynamodb, why)
                        .await;
                }
                scenarios::consumes_a_resharded_stream_in_order(kinesis, dynamodb, $resharding)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn special_records_arrive_intact() {
                if no_fanout(stringify!($tier)).is_some() {
                    return;
                }
                let (kinesis, dynamodb) = $start;
                more_scenarios::special_records_arrive_intact(kinesis, dynamodb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failing_processor_restarts_from_the_checkpoint() {
                if no_fanout(stringify!($tier)).is_some() {
                    return;
                }
                let (kinesis, dynamodb) = $start;
                more_scenarios::a_failing_processor_restarts_from_the_checkpoint(kinesis, dynamodb)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resumes_after_a_crash() {
                if no_fanout(stringify!($tier)).is_some() {
                    return;
                }
                let (kinesis, dynamodb) = $start;
                scenarios::resumes_after_a_crash(kinesis, dynamodb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn another_streams_rows_are_refused() {
                if no_fanout(stringify!($tier)).is_some() {
                    return;
                }
                let (kinesis, dynamodb) = $start;
                origin::another_streams_rows_are_refused(kinesis, dynamodb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_prepared_checkpoint_reaches_the_next_owner() {
                if no_fanout(stringify!($tier)).is_some() {
                    return;
                }
                let (kinesis, dynamodb) = $start;
                two_phase::a_prepared_checkpoint_reaches_the_next_owner(kinesis, dynamodb)
                    .await;
            }
        }
    };
}

tier!(ferrokinesis_dynoxide, start: (servers::start_ferrokinesis(300).await, servers::start_dynoxide().await));

// Both services answering only what AWS promises (`support/stripping_proxy.rs`).
tier!(stripped_ferrokinesis_dynoxide, start: (
    StrippingProxy::start(&servers::start_ferrokinesis(300).await, Options::default())
        .await
        .url()
        .to_owned(),
    StrippingProxy::start(&servers::start_dynoxide().await, Options::default())
        .await
        .url()
        .to_owned()
));

tier!(
    moto,
    #[cfg(feature = "external-servers")]
    start: (
        servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT")
    ),
    resharding: Resharding::ListingOnly(
        "moto never ends a closed shard, and routes new records to it"
    )
);

tier!(
    kinesis_mock_dynamodb_local,
    #[cfg(feature = "external-servers")]
    start: (
        servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT")
    )
);

/// GetRecords (in fan-out mode, SubscribeToShard) answered with bare HTTP 500s (no
/// error code), more of them than the SDK retries: the reader backs off and goes on
/// reading; the shard is not restarted and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_500_from_get_records_backs_off_without_a_restart() {
    let proxy =
        StrippingProxy::start(&servers::start_ferrokinesis(300).await, Options::default()).await;
    let env = Env::new(proxy.url().to_owned(), servers::start_dynoxide().await, 1).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let read = match read_mode() {
        ReadMode::Polling => "GetRecords",
        ReadMode::Fanout => "SubscribeToShard",
    };
    // A subscription lasts five minutes: its faults meet the first one.
    let fanout = read_mode() == ReadMode::Fanout;
    let mut before = proxy.calls(read);
    if fanout {
        proxy.fault_next(read, 6, Fault::Bare500);
    }
    let worker = env.start(&probes).await;
    let mut producer = Producer::default();
    producer.put_round(&env.kinesis, &env.stream, 5, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    if !fanout {
        before = proxy.calls(read);
        proxy.fault_next(read, 6, Fault::Bare500);
    }
    producer.put_round(&env.kinesis, &env.stream, 5, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    assert!(proxy.calls(read) >= before + 6, "the faults were answered");
    let status = worker.status().await.unwrap();
    assert_eq!(status.shard_restarts, 0, "a 5xx is retried, not a restart");
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
}
