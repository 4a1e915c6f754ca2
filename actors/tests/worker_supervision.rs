//! Restart intensities on the memory backend, in paused time: a shard that keeps
//! failing is given up and cooled down; a core actor that keeps failing stops the worker.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use flotilla_actors::WorkerError;
use flotilla_actors::backend::faults::{Fault, FaultPlan};
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{LeaseTable, WorkerRows};
use flotilla_actors::model::{LeaseKey, WorkerId};
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::{APP, Rig, STREAM, shutdown_clean};

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
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
    let lease = table.get(&(&shard).into()).await.unwrap().unwrap();
    assert!(
        lease.counter >= 4,
        "taken, released, taken again, released: {}",
        lease.counter
    );
}

#[tokio::test(start_paused = true)]
async fn a_core_actor_that_keeps_failing_stops_the_worker_with_an_error() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let table = rig.faulty_table();
    let probes = ProbeFactory::new(Misbehave::default());
    let mut settings = fast_settings(STREAM, APP);
    settings.supervision.core_max_restarts = 1;
    let mut worker = rig
        .start_on(rig.backend_with_table(table.clone()), &probes, settings)
        .await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 5, 5).await;
    probes.wait_distinct(25, Duration::from_secs(60)).await;

    // Every read of the lease table (the heartbeat rows each round, a scan after a
    // restart) panics from now on: a bug on the core actors' path.
    let mut broken = FaultPlan::seeded(2);
    broken.panic = 1.0;
    broken.only_ops = vec!["scan", "heartbeats"];
    table.set_plan(broken);
    let ended = tokio::time::timeout(Duration::from_secs(60), worker.wait())
        .await
        .unwrap();
    match ended {
        Err(WorkerError::Stopped(reason)) => {
            assert!(
                reason.contains("injected panic in scan")
                    || reason.contains("injected panic in heartbeats"),
                "{reason}"
            )
        }
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
    let table = rig.faulty_table();
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig
        .start_on(
            rig.backend_with_table(table.clone()),
            &probes,
            fast_settings(STREAM, APP),
        )
        .await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 5, 5).await;
    probes.wait_distinct(25, Duration::from_secs(60)).await;
    // The keeper's next read of the heartbeat rows panics, once (a settled worker
    // reads those each round and scans only when something changed).
    let next = table.calls("heartbeats");
    table.set_plan(FaultPlan::seeded(2).then(Some("heartbeats"), next, Fault::Panic));
    tokio::time::sleep(Duration::from_secs(2)).await;
    producer.put_round(&rig.streams, STREAM, 5, 5).await;
    probes.wait_distinct(50, Duration::from_secs(60)).await;
    let status = worker.status().await.unwrap();
    // The core restarted as one; the status server is outside it and went on.
    assert!(
        status
            .core
            .iter()
            .all(|c| c.restarts == u32::from(c.name != "status_server")),
        "{:?}",
        status.core
    );
    assert_eq!(
        status.shards.len(),
        2,
        "leases taken again: {:#?}",
        status.shards
    );
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
}

#[tokio::test(start_paused = true)]
async fn a_stolen_lease_stops_its_reader_and_comes_back_when_the_thief_dies() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start(&probes).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 3, 10).await;
    probes.wait_distinct(30, Duration::from_secs(60)).await;

    // Another worker takes the lease (fenced on what it read) and keeps heartbeating.
    let table = rig.table();
    let shard = rig.shards().await[0].id.clone();
    let key: LeaseKey = (&shard).into();
    let lease = table.get(&key).await.unwrap().unwrap();
    let thief = WorkerId::new("thief");
    let stolen = table.take(&key, &lease.fence(), &thief).await.unwrap();
    // As a worker does after a take: its heartbeat carries one more change, and it is in
    // the roster, so peers read the lease rows at their next round.
    table
        .join_roster(std::slice::from_ref(&thief))
        .await
        .unwrap();
    let took = flotilla_actors::model::WorkerLoad {
        changes: 1,
        ..Default::default()
    };
    for _ in 0..10 {
        table.heartbeat(&thief, &took).await.unwrap();
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
    probes.wait_distinct(60, Duration::from_secs(120)).await;
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
}
