//! A memory-backend stream, lease table and metrics sink, and workers started on them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flotilla_actors::KeeperStatus;
use tokio::sync::Mutex;

use flotilla_actors::backend::faults::{FaultPlan, Faulty};
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryLeaseTable, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{IteratorPosition, LeaseTable, Record, StreamAdmin, StreamClient};
use flotilla_actors::model::{Lease, LeaseKey, Shard, ShardId};
use flotilla_actors::{Backend, Settings, ShutdownReport, Worker};

use super::probe::{ProbeFactory, Producer, fast_settings};

pub const STREAM: &str = "orders";
pub const APP: &str = "orders-app";

pub struct Rig {
    pub streams: MemoryStreams,
    pub dynamo: MemoryDynamo,
    pub metrics: MemoryMetrics,
}

impl Rig {
    pub async fn new(shards: u32, config: MemoryStreamsConfig) -> Self {
        let streams = MemoryStreams::new(config);
        streams.create_stream(STREAM, shards).await.unwrap();
        Self {
            streams,
            dynamo: MemoryDynamo::new(),
            metrics: MemoryMetrics::new(),
        }
    }

    pub fn backend(&self) -> Backend {
        Backend::memory(
            self.streams.clone(),
            self.dynamo.clone(),
            self.metrics.clone(),
        )
    }

    pub async fn start(&self, probes: &ProbeFactory) -> Worker {
        self.start_with(probes, fast_settings(STREAM, APP)).await
    }

    pub async fn start_with(&self, probes: &ProbeFactory, settings: Settings) -> Worker {
        self.start_on(self.backend(), probes, settings).await
    }

    pub async fn start_on(
        &self,
        backend: Backend,
        probes: &ProbeFactory,
        settings: Settings,
    ) -> Worker {
        let f = probes.clone();
        Worker::builder()
            .settings(settings)
            .backend(backend)
            .processor(move |shard| f.make(shard))
            .start()
            .await
            .unwrap()
    }

    /// The application's lease table behind a fault injector, injecting nothing until
    /// a plan is set.
    pub fn faulty_table(&self) -> Faulty<MemoryLeaseTable> {
        Faulty::new(self.dynamo.lease_table(APP), FaultPlan::seeded(1))
    }

    /// A worker whose lease table is behind a fault injector (injecting nothing until a
    /// plan is set), and that injector.
    pub async fn start_faulty(
        &self,
        probes: &ProbeFactory,
        settings: Settings,
    ) -> (Worker, Faulty<MemoryLeaseTable>) {
        let table = self.faulty_table();
        let worker = self
            .start_on(self.backend_with_table(table.clone()), probes, settings)
            .await;
        (worker, table)
    }

    /// The memory services, with `streams` as the Kinesis (a fault injector around
    /// `self.streams`, say).
    pub fn backend_with_streams<S: StreamClient + Clone>(&self, streams: S) -> Backend {
        let table = self.dynamo.lease_table(APP);
        Backend::new(
            Arc::new(streams),
            move |_| Arc::new(table.clone()),
            Arc::new(self.metrics.clone()),
        )
    }

    /// The memory services, with `table` as the lease table.
    pub fn backend_with_table<T: LeaseTable + Clone>(&self, table: T) -> Backend {
        Backend::new(
            Arc::new(self.streams.clone()),
            move |_| Arc::new(table.clone()),
            Arc::new(self.metrics.clone()),
        )
    }

    /// Every record of a shard, oldest first.
    pub async fn records(&self, shard: &ShardId) -> Vec<Record> {
        self.records_from(shard, &IteratorPosition::TrimHorizon)
            .await
    }

    pub async fn records_from(&self, shard: &ShardId, position: &IteratorPosition) -> Vec<Record> {
        let it = self
            .streams
            .get_shard_iterator(STREAM, shard, position)
            .await
            .unwrap();
        self.streams.get_records(&it, 10_000).await.unwrap().records
    }

    pub fn table(&self) -> impl LeaseTable {
        self.dynamo.lease_table(APP)
    }

    pub async fn shards(&self) -> Vec<Shard> {
        self.streams.list_shards(STREAM).await.unwrap()
    }

    /// The open shards, in hash key order: neighbours in the list can be merged.
    pub async fn open_shards(&self) -> Vec<Shard> {
        let mut open: Vec<Shard> = self
            .shards()
            .await
            .into_iter()
            .filter(Shard::is_open)
            .collect();
        open.sort_by_key(|s| s.hash_range.start);
        open
    }

    /// Splits `shard` at the middle of its hash key range.
    pub async fn split_in_half(&self, shard: &Shard) {
        let range = shard.hash_range;
        let mid = range.start + (range.end - range.start) / 2;
        self.streams
            .split_shard(STREAM, &shard.id, mid)
            .await
            .unwrap();
    }

    /// The lease row of `shard`, which must exist.
    pub async fn lease_of(&self, shard: &ShardId) -> Lease {
        self.table()
            .get(&LeaseKey::from(shard))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no lease row for {shard}"))
    }

    /// Every lease row of the application's table (heartbeat rows left out).
    pub async fn lease_rows(&self) -> Vec<Lease> {
        let scan = self.table().scan().await.unwrap();
        assert!(scan.malformed.is_empty(), "{:?}", scan.malformed);
        scan.leases
    }
}

/// Every heartbeat refused as throttled; the other calls go through.
pub fn heartbeat_outage() -> FaultPlan {
    let mut outage = FaultPlan::seeded(2);
    outage.throttle = 1.0;
    outage.only_ops = vec!["heartbeat"];
    outage
}

/// Puts a round of records every 100 ms until stopped.
pub struct Feed {
    producer: Arc<Mutex<Producer>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Feed {
    pub fn start(streams: MemoryStreams) -> Feed {
        let producer = Arc::new(Mutex::new(Producer::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (producer, stop) = (producer.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    producer
                        .lock()
                        .await
                        .put_round(&streams, STREAM, 16, 2)
                        .await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Feed {
            producer,
            stop,
            task,
        }
    }

    pub async fn stop(self) -> Producer {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        Arc::try_unwrap(self.producer).unwrap().into_inner()
    }
}

pub async fn keeper(worker: &Worker) -> KeeperStatus {
    worker.status().await.unwrap().leases.unwrap()
}

/// Waits until each worker holds the given number of leases.
pub async fn wait_held(workers: &[&Worker], want: &[usize], limit: Duration) {
    let start = tokio::time::Instant::now();
    loop {
        let mut held = Vec::new();
        for w in workers {
            // A keeper busy with a slow call does not answer in time: not yet.
            let status = w.status().await.ok().and_then(|s| s.leases);
            held.push(status.map_or(usize::MAX, |k| k.held.len()));
        }
        if held == want {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?} the workers hold {held:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Shuts `worker` down and asserts the report is clean, printing it when it is not.
pub async fn shutdown_clean(worker: Worker) -> ShutdownReport {
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    report
}
