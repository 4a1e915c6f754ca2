//! Enhanced fan-out on the memory backend, paused time: what only fan-out has. The
//! worker and fleet suites run in fan-out mode as a whole too (scripts/test.sh sets
//! `FLOTILLA_TEST_READ_MODE=fanout` for a second pass); these set the mode themselves.
//!
//! The seam between two subscriptions loses and repeats nothing; a stalled processor
//! holds the subscription back, not memory; losing the lease cancels the subscription
//! at once; the previous owner's subscription still open (`ResourceInUse`) is waited
//! out without losing the lease.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use flotilla_actors::Settings;
use flotilla_actors::backend::faults::FaultPlan;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{
    Consumer, IteratorPosition, LeaseTable, StreamClient, StreamError, WorkerRows,
};
use flotilla_actors::model::{ShardId, WorkerId};
use flotilla_actors::settings::ReadMode;

use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, heartbeat_outage, shutdown_clean, wait_held};

/// The application's consumer, registered and ACTIVE, as a worker would have it.
async fn consumer(rig: &Rig) -> Consumer {
    let arn = rig
        .streams
        .describe_stream_summary(STREAM)
        .await
        .unwrap()
        .arn;
    flotilla_actors::fanout::ensure_consumer(
        &rig.streams,
        STREAM,
        &arn,
        APP,
        Duration::from_secs(30),
    )
    .await
    .unwrap()
}

fn fanout() -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.reader.mode = ReadMode::Fanout;
    s
}

/// Subscriptions that Kinesis ends every 2 s (instead of 5 minutes) while records keep
/// coming: each next one starts at the last event's continuation, so across the seams
/// nothing is lost and, with no crash, nothing is delivered twice.
#[tokio::test(start_paused = true)]
async fn the_seam_between_subscriptions_loses_and_repeats_nothing() {
    // One shard: the continuation is then the last record sent, which comes again.
    let rig = Rig::new(
        1,
        MemoryStreamsConfig {
            subscription_ttl: Duration::from_secs(2),
            ..MemoryStreamsConfig::default()
        },
    )
    .await;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, fanout()).await;
    let feed = Feed::start(rig.streams.clone());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let status = worker.status().await.unwrap();
    assert_eq!(status.read_mode, "fanout");
    for shard in &status.shards {
        let subscription = shard.subscription.as_ref().unwrap();
        assert!(
            subscription.subscriptions >= 10,
            "a subscription every 2 s for 30 s: {shard:#?}"
        );
    }
    shutdown_clean(worker).await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(verdict.duplicates, 0, "{verdict:?}");
}

/// A processor that stops acking: no next event is pulled once the window is full, so
/// what is in flight stays within the window (plus one batch) and the subscription's
/// event count stands still; the backlog waits in the stream.
#[tokio::test(start_paused = true)]
async fn a_stalled_processor_holds_the_subscription_back_not_memory() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave {
        stall_on: Some("key-2:5".to_owned()),
        ..Misbehave::default()
    });
    let mut settings = fanout();
    settings.reader.max_records = 50;
    settings.reader.window_records = 100;
    let worker = rig.start_with(&probes, settings).await;
    let mut producer = Producer::default();
    for _ in 0..20 {
        producer.put_round(&rig.streams, STREAM, 50, 10).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let shard = |status: &flotilla_actors::WorkerStatus| status.shards[0].clone();
    let before = shard(&worker.status().await.unwrap());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = shard(&worker.status().await.unwrap());
    assert!(
        after.in_flight_records <= 100 + 50,
        "in flight beyond the window: {after:#?}"
    );
    assert!(
        after.records_delivered < producer.total() / 2,
        "the reader ran ahead of the processor: {after:#?}"
    );
    assert_eq!(
        before.subscription.as_ref().unwrap().events,
        after.subscription.as_ref().unwrap().events,
        "events were pulled while the window was full"
    );
    assert_eq!(after.records_delivered, before.records_delivered);
    drop(worker);
}

/// The lease is taken by another worker (a thief writing the table directly) while the
/// processor is busy with a batch: the keeper finds the lease gone at its next scan and
/// the reader cancels the subscription at once, not when the processor is done; nothing
/// put after the loss reaches this worker's processor.
#[tokio::test(start_paused = true)]
async fn losing_the_lease_cancels_the_subscription_at_once() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave {
        slow: Some(Duration::from_secs(3)),
        ..Misbehave::default()
    });
    let worker = rig.start_with(&probes, fanout()).await;
    let shard = ShardId::from_index(0);
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    // A batch the processor will be busy with for 3 s.
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    let before_loss = producer.total();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rig.streams.open_subscriptions(STREAM, &shard), 1);

    let lease = rig.lease_of(&shard).await;
    let thief = WorkerId::new("thief");
    rig.table()
        .take(&lease.key, &lease.fence(), &thief)
        .await
        .unwrap();
    // As a worker does after a take: one heartbeat carrying the change, in the roster,
    // so the keeper scans at its next round (every heartbeat_interval, 500 ms here).
    rig.table()
        .join_roster(std::slice::from_ref(&thief))
        .await
        .unwrap();
    let took = flotilla_actors::model::WorkerLoad {
        changes: 1,
        ..Default::default()
    };
    rig.table().heartbeat(&thief, &took).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rig.streams.open_subscriptions(STREAM, &shard),
        0,
        "the subscription outlived the lease"
    );
    // Within the failover time (6 s): later, the thief (one heartbeat, then none) counts as dead
    // and the worker takes the lease back, rightly.
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = probes.snapshot().verdict(&producer.produced);
    assert!(
        seen.processed <= before_loss,
        "delivered after the lease was lost: {seen:?}"
    );
    drop(worker);
}

/// A worker whose heartbeats stop being confirmed fences itself before its leases can
/// expire: its subscriptions are cancelled then (not only at a lease loss), and made
/// again once the heartbeats are back; nothing is lost.
#[tokio::test(start_paused = true)]
async fn a_fenced_worker_cancels_its_subscriptions_and_resubscribes_after() {
    // Idle subscriptions send an event every 30 s only: the cancel comes of the fence,
    // not of dropping the next event.
    let rig = Rig::new(
        2,
        MemoryStreamsConfig {
            subscription_heartbeat: Duration::from_secs(30),
            ..MemoryStreamsConfig::default()
        },
    )
    .await;
    let probes = ProbeFactory::new(Misbehave::default());
    let settings = fanout();
    let fenced_after = settings.lease.failover_time - settings.lease.fence_margin;
    let (worker, table) = rig.start_faulty(&probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let open = |rig: &Rig| {
        (0..2)
            .map(|i| {
                rig.streams
                    .open_subscriptions(STREAM, &ShardId::from_index(i))
            })
            .sum::<usize>()
    };
    assert_eq!(open(&rig), 2);

    table.set_plan(heartbeat_outage());
    tokio::time::sleep(fenced_after + Duration::from_secs(1)).await;
    let status = worker.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| s.fenced.is_some()),
        "{status:#?}"
    );
    assert_eq!(open(&rig), 0, "subscriptions open while fenced");

    table.set_plan(FaultPlan::seeded(3));
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    assert_eq!(open(&rig), 2);
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
}

/// The shard's previous owner still holds a subscription of the same consumer (a
/// handoff or failover in progress): the new owner's SubscribeToShard is refused with
/// ResourceInUse, which it shows and retries with backoff, keeping the lease; once the
/// old subscription is gone it reads everything.
#[tokio::test(start_paused = true)]
async fn a_previous_owners_open_subscription_is_waited_out_keeping_the_lease() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let shard = ShardId::from_index(0);
    let consumer = consumer(&rig).await;
    let mut mine = Producer::default();
    mine.put_round(&rig.streams, STREAM, 10, 10).await;
    // The old owner's subscription, kept open by reading from it every second.
    let mut old = rig
        .streams
        .subscribe_to_shard(&consumer.arn, &shard, &IteratorPosition::TrimHorizon)
        .await
        .unwrap();
    let keep_open = tokio::spawn(async move {
        for _ in 0..3 {
            let _ = old.next_event().await;
        }
        drop(old);
    });

    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, fanout()).await;
    wait_held(&[&worker], &[1], Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = worker.status().await.unwrap();
    let refused = &status.shards[0];
    assert_eq!(
        refused.subscription.as_ref().unwrap().state,
        "none",
        "{refused:#?}"
    );
    assert!(
        refused
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("resource in use")),
        "{refused:#?}"
    );
    keep_open.await.unwrap();
    probes
        .wait_distinct(mine.total(), Duration::from_secs(30))
        .await;
    let status = worker.status().await.unwrap();
    assert_eq!(status.shard_restarts, 0, "{status:#?}");
    let keeper = status.leases.unwrap();
    assert_eq!(keeper.held.len(), 1, "the lease was kept: {keeper:#?}");
    shutdown_clean(worker).await;
    let verdict = probes.assert_nothing_lost(&mine);
    assert_eq!(verdict.duplicates, 0, "{verdict:?}");
}

/// The memory backend refuses as Kinesis does: a second subscription of a consumer to
/// a shard within 5 s of the first is in use, then replaces it; one per second at most.
#[tokio::test(start_paused = true)]
async fn a_second_subscription_is_in_use_then_replaces_the_first() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let shard = ShardId::from_index(0);
    let consumer = consumer(&rig).await;
    let subscribe = || {
        rig.streams
            .subscribe_to_shard(&consumer.arn, &shard, &IteratorPosition::Latest)
    };
    let mut first = subscribe().await.unwrap();
    assert!(matches!(
        subscribe().await.map(|_| ()),
        Err(StreamError::InUse { .. })
    ));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let _second = subscribe().await.unwrap();
    assert!(matches!(
        first.next_event().await,
        Err(StreamError::InUse { .. })
    ));
    drop(_second);
    assert!(matches!(
        subscribe().await.map(|_| ()),
        Err(StreamError::Throttled { .. })
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(subscribe().await.is_ok());
}
