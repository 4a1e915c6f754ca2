//! Restart intensities on the memory backend, in paused time: a shard that keeps
//! failing is given up and cooled down; a core actor that keeps failing stops the worker.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use flotilla_actors::backend::memory::{MemoryLeaseTable, MemoryStreamsConfig};
use flotilla_actors::backend::{LeaseError, LeaseTable, ScanOutput, TableState};
use flotilla_actors::model::{Checkpoint, Fence, Lease, LeaseKey, ShardId, WorkerId};
use flotilla_actors::{Backend, Worker, WorkerError};
use futures::future::BoxFuture;
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM};

#[tokio::test(start_paused = true)]
async fn a_shard_that_keeps_failing_is_released_cooled_down_and_taken_again() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave {
        fail_on: Some(("key-0:3".to_owned(), 3)),
        ..Misbehave::default()
    });
    let mut settings = fast_settings(STREAM, APP);
    settings.supervision.shard_max_restarts = 2;
    settings.supervision.shard_cooldown = Duration::from_secs(5);
    let worker = rig.start_with(&probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 10).await;

    let mut saw_cooling = false;
    let mut saw_released = false;
    let shard = rig.shards().await[0].id.clone();
    let table = rig.table();
    for _ in 0..600 {
        let status = worker.status().await.unwrap();
        saw_cooling |= status
            .leases
            .as_ref()
            .is_some_and(|l| l.cooling.contains(&shard.to_string()));
        if let Some(lease) = table.get(&(&shard).into()).await.unwrap() {
            saw_released |= lease.owner.is_none() && lease.counter > 0;
        }
        if probes.snapshot().distinct() >= producer.total() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(saw_cooling, "the shard was cooled down");
    assert!(saw_released, "the lease was released");
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let verdict = probes.snapshot().verdict(&producer.produced);
    assert_eq!(
        (verdict.lost, verdict.order_violations),
        (0, 0),
        "{verdict:?}"
    );
    let lease = table.get(&(&shard).into()).await.unwrap().unwrap();
    assert!(
        lease.counter >= 4,
        "taken, released, taken again, released: {}",
        lease.counter
    );
}

/// A lease table whose scans panic once armed (`panics_left` times, or for good when
/// it is `u32::MAX`): a bug in a core actor's path.
#[derive(Clone)]
struct PanickyScan {
    inner: MemoryLeaseTable,
    armed: Arc<AtomicBool>,
    panics_left: Arc<AtomicU32>,
}

impl LeaseTable for PanickyScan {
    fn table_name(&self) -> &str {
        self.inner.table_name()
    }
    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        self.inner.ensure_table()
    }
    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        if self.armed.load(Ordering::SeqCst) {
            let left = self.panics_left.load(Ordering::SeqCst);
            if left > 0 {
                if left != u32::MAX {
                    self.panics_left.store(left - 1, Ordering::SeqCst);
                }
                panic!("scan exploded");
            }
        }
        self.inner.scan()
    }
    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        self.inner.get(key)
    }
    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.create_if_absent(lease)
    }
    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        self.inner.take(key, expected, new_owner)
    }
    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.inner.release(key, expected)
    }
    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.checkpoint(key, expected, checkpoint, children)
    }
    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.delete(key, expected)
    }
    fn heartbeat<'a>(&'a self, worker: &'a WorkerId) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.inner.heartbeat(worker)
    }
    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.remove_heartbeat(worker)
    }
}

#[tokio::test(start_paused = true)]
async fn a_core_actor_that_keeps_failing_stops_the_worker_with_an_error() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let table = PanickyScan {
        inner: rig.dynamo.lease_table(APP),
        armed: Arc::new(AtomicBool::new(false)),
        panics_left: Arc::new(AtomicU32::new(u32::MAX)),
    };
    let for_backend = table.clone();
    let backend = Backend::new(
        Arc::new(rig.streams.clone()),
        move |_| Arc::new(for_backend.clone()),
        Arc::new(rig.metrics.clone()),
    );
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let mut settings = fast_settings(STREAM, APP);
    settings.supervision.core_max_restarts = 1;
    let mut worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap();
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 5, 5).await;
    let seen = probes.seen.clone();
    wait_until(
        "records",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || seen.lock().unwrap().distinct() >= 25,
    )
    .await;

    table.armed.store(true, Ordering::SeqCst);
    let ended = tokio::time::timeout(Duration::from_secs(60), worker.wait())
        .await
        .unwrap();
    match ended {
        Err(WorkerError::Stopped(reason)) => assert!(reason.contains("scan exploded"), "{reason}"),
        other => panic!("expected the worker to stop with an error, got {other:?}"),
    }
    assert!(matches!(
        worker.status().await,
        Err(WorkerError::Stopped(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_core_actor_failure_restarts_the_core_and_consumption_goes_on() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let table = PanickyScan {
        inner: rig.dynamo.lease_table(APP),
        armed: Arc::new(AtomicBool::new(false)),
        panics_left: Arc::new(AtomicU32::new(1)),
    };
    let for_backend = table.clone();
    let backend = Backend::new(
        Arc::new(rig.streams.clone()),
        move |_| Arc::new(for_backend.clone()),
        Arc::new(rig.metrics.clone()),
    );
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let worker = Worker::builder()
        .settings(fast_settings(STREAM, APP))
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap();
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 5, 5).await;
    let seen = probes.seen.clone();
    wait_until(
        "records",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || seen.lock().unwrap().distinct() >= 25,
    )
    .await;
    table.armed.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    producer.put_round(&rig.streams, STREAM, 5, 5).await;
    wait_until(
        "records after the restart",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || seen.lock().unwrap().distinct() >= 50,
    )
    .await;
    let status = worker.status().await.unwrap();
    assert!(
        status.core.iter().all(|c| c.restarts == 1),
        "{:?}",
        status.core
    );
    assert_eq!(
        status.shards.len(),
        2,
        "leases taken again: {:#?}",
        status.shards
    );
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let verdict = probes.snapshot().verdict(&producer.produced);
    assert_eq!(
        (verdict.lost, verdict.order_violations),
        (0, 0),
        "{verdict:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stolen_lease_stops_its_reader_and_comes_back_when_the_thief_dies() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start(&probes).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 3, 10).await;
    wait_until(
        "records",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || probes.snapshot().distinct() >= 30,
    )
    .await;

    // Another worker takes the lease (fenced on what it read) and keeps heartbeating.
    let table = rig.table();
    let shard = rig.shards().await[0].id.clone();
    let key: LeaseKey = (&shard).into();
    let lease = table.get(&key).await.unwrap().unwrap();
    let thief = WorkerId::new("thief");
    let stolen = table.take(&key, &lease.fence(), &thief).await.unwrap();
    for _ in 0..10 {
        table.heartbeat(&thief).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        probes.snapshot().lease_lost,
        vec![shard.clone()],
        "the processor was told"
    );
    let status = worker.status().await.unwrap();
    assert!(status.shards.is_empty(), "{:#?}", status.shards);
    // Records put now are not read by this worker while the thief lives.
    producer.put_round(&rig.streams, STREAM, 3, 10).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(probes.snapshot().distinct(), 30);
    let row = table.get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.owner.as_ref(), row.counter),
        (Some(&thief), stolen.counter),
        "nothing overwrote the thief's lease"
    );

    // The thief stops heartbeating: after the failover time the lease comes back.
    wait_until(
        "the lease back",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || probes.snapshot().distinct() >= 60,
    )
    .await;
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let verdict = probes.snapshot().verdict(&producer.produced);
    assert_eq!(
        (verdict.lost, verdict.order_violations),
        (0, 0),
        "{verdict:?}"
    );
}
