//! The worker end to end on the memory backend, in paused time: a whole stream through
//! the actor tree to probe processors and back to fenced checkpoints.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::HashMap;
use std::time::Duration;

use flotilla_actors::backend::faults::{Fault, FaultPlan, Faulty};
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{IteratorPosition, LeaseTable, StreamAdmin};
use flotilla_actors::model::{Checkpoint, Shard, ShardId};
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{Backend, Worker};
use support::probe::{
    Misbehave, ProbeFactory, Producer, aggregate_of_ten, fast_settings, read_call, read_mode,
    special_records, wait_until,
};
use support::rig::{APP, Rig, STREAM, heartbeat_outage, shutdown_clean};

fn open(shards: &[Shard]) -> Vec<Shard> {
    let mut open: Vec<Shard> = shards.iter().filter(|s| s.is_open()).cloned().collect();
    open.sort_by_key(|s| s.hash_range.start);
    open
}

/// How long a paused-time test waits for records (virtual time: it costs nothing).
const PATIENCE: Duration = Duration::from_secs(600);

#[tokio::test(start_paused = true)]
async fn every_record_in_order_across_a_split_and_a_merge() {
    let rig = Rig::new(8, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    // Small reads and frequent listings: children are leased and readable while their
    // parents still have a backlog, so only waiting for the parents keeps keys in order.
    let mut settings = fast_settings(STREAM, APP);
    settings.reader.max_records = 100;
    settings.reader.window_records = 100;
    settings.reader.shard_sync_interval = Duration::from_millis(100);
    let worker = rig.start_with(&probes, settings).await;
    let mut producer = Producer::default();

    producer.put_round(&rig.streams, STREAM, 500, 40).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first = open(&rig.shards().await)[0].clone();
    let mid = first.hash_range.start + (first.hash_range.end - first.hash_range.start) / 2;
    rig.streams
        .split_shard(STREAM, &first.id, mid)
        .await
        .unwrap();
    producer.put_round(&rig.streams, STREAM, 500, 40).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let now_open = open(&rig.shards().await);
    let (a, b) = (now_open[4].clone(), now_open[5].clone());
    assert_eq!(a.hash_range.end + 1, b.hash_range.start);
    rig.streams
        .merge_shards(STREAM, &a.id, &b.id)
        .await
        .unwrap();
    producer.put_round(&rig.streams, STREAM, 500, 20).await;
    assert_eq!(producer.total(), 50_000);

    probes.wait_distinct(producer.total(), PATIENCE).await;
    shutdown_clean(worker).await;

    let seen = probes.snapshot();
    let verdict = seen.verdict(&producer.produced);
    assert_eq!(
        (verdict.lost, verdict.order_violations, verdict.duplicates),
        (0, 0, 0),
        "{verdict:?}"
    );
    let closed: Vec<ShardId> = rig
        .shards()
        .await
        .into_iter()
        .filter(|s| !s.is_open())
        .map(|s| s.id)
        .collect();
    assert_eq!(closed.len(), 3);
    let table = rig.table();
    for shard in &closed {
        let lease = table.get(&shard.into()).await.unwrap().unwrap();
        assert_eq!(lease.checkpoint, Checkpoint::ShardEnd, "{shard}");
        assert!(
            seen.shard_ended.contains(shard),
            "{shard} got no shard_ended"
        );
    }
    let parent = table.get(&(&first.id).into()).await.unwrap().unwrap();
    assert_eq!(
        parent.child_shard_ids.len(),
        2,
        "children recorded on the split parent"
    );
}

#[tokio::test(start_paused = true)]
async fn failing_and_panicking_processors_restart_from_the_checkpoint() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave {
        fail_on: Some(("key-3:50".to_owned(), 2)),
        panic_on: Some("key-6:70".to_owned()),
        stall_on: None,
        slow: None,
    });
    let worker = rig.start(&probes).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 10, 100).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    let status = worker.status().await.unwrap();
    assert!(
        status.shard_restarts >= 3,
        "restarts: {}",
        status.shard_restarts
    );
    let restarts: u32 = status.shards.iter().map(|s| s.restarts).sum();
    assert!(restarts >= 3, "{:#?}", status.shards);
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
    let seqs = &probes.seen.lock().unwrap().by_key["key-3"];
    assert!(
        seqs.contains(&50),
        "the refused record was processed after the restarts"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_worker_is_replaced_from_its_checkpoints() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes_a = ProbeFactory::new(Misbehave::default());
    let worker_a = rig.start(&probes_a).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 50, 100).await;
    probes_a.wait_distinct(producer.total(), PATIENCE).await;
    // More records, then crash before the next checkpoint write can cover them all.
    producer.put_round(&rig.streams, STREAM, 50, 20).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker_a.abort();

    // What the checkpoints cover at the crash: at most the rest can come twice.
    let table = rig.table();
    let mut after_checkpoints = 0u64;
    for shard in rig.shards().await {
        let lease = table.get(&(&shard.id).into()).await.unwrap().unwrap();
        let position = match lease.checkpoint {
            Checkpoint::At(at) => IteratorPosition::AfterSequence(at.sequence),
            _ => IteratorPosition::TrimHorizon,
        };
        after_checkpoints += rig.records_from(&shard.id, &position).await.len() as u64;
    }

    let probes_b = ProbeFactory::new(Misbehave::default());
    let worker_b = rig.start(&probes_b).await;
    producer.put_round(&rig.streams, STREAM, 50, 10).await;
    let all = probes_a.seen.clone();
    let b_seen = probes_b.seen.clone();
    let total = producer.total();
    wait_until(
        "worker b to finish",
        Duration::from_secs(600),
        Duration::from_millis(100),
        || {
            let a = all.lock().unwrap();
            let b = b_seen.lock().unwrap();
            let mut keys: HashMap<&String, std::collections::HashSet<u64>> = HashMap::new();
            for (k, v) in a.by_key.iter().chain(b.by_key.iter()) {
                keys.entry(k).or_default().extend(v.iter().copied());
            }
            keys.values().map(|s| s.len() as u64).sum::<u64>() >= total
        },
    )
    .await;
    shutdown_clean(worker_b).await;

    let a = probes_a.snapshot();
    let b = probes_b.snapshot();
    let mut duplicates = 0u64;
    for (key, seqs) in &b.by_key {
        let before: std::collections::HashSet<&u64> = a
            .by_key
            .get(key)
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        duplicates += seqs.iter().filter(|s| before.contains(s)).count() as u64;
        // Worker b alone keeps each key in order from where it started.
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{key}: {seqs:?}");
    }
    assert!(
        duplicates <= after_checkpoints,
        "duplicates {duplicates} > records after the checkpoints {after_checkpoints}"
    );
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
    }
}

/// The outside tester's failover: a worker killed a second after its first batches must
/// not leave them all to be delivered again. A shard's first position is written at once,
/// not at the first tick of `checkpoint.interval`.
#[tokio::test(start_paused = true)]
async fn a_crash_a_second_after_the_first_batches_delivers_none_of_them_again() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 50, 20).await;
    let first_round = producer.total();
    let mut settings = fast_settings(STREAM, APP);
    // The default interval: the crash comes well inside it.
    settings.checkpoint.interval = Duration::from_secs(5);
    let before = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&before, settings.clone()).await;
    before.wait_distinct(first_round, PATIENCE).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.abort();

    let after = ProbeFactory::new(Misbehave::default());
    let next = rig.start_with(&after, settings).await;
    producer.put_round(&rig.streams, STREAM, 50, 1).await;
    let seen = after.seen.clone();
    wait_until(
        "the next worker to read the new records",
        PATIENCE,
        Duration::from_millis(100),
        || {
            let seen = seen.lock().unwrap();
            (0..50).all(|k| {
                seen.by_key
                    .get(&format!("key-{k}"))
                    .is_some_and(|seqs| seqs.contains(&20))
            })
        },
    )
    .await;
    shutdown_clean(next).await;
    let again = after.snapshot().deliveries - 50;
    assert_eq!(again, 0, "records of the first batches delivered again");
    let verdict = after.snapshot().verdict(&producer.produced);
    assert_eq!(verdict.lost, first_round, "the first worker had the rest");
}

/// The other half of the pace: while a shard stays busy its positions are coalesced, so
/// it costs one checkpoint write per interval however often it acks.
#[tokio::test(start_paused = true)]
async fn a_busy_shard_costs_at_most_one_checkpoint_write_per_interval() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let table = rig.faulty_table();
    let backend = rig.backend_with_table(table.clone());
    let settings = fast_settings(STREAM, APP);
    let interval = settings.checkpoint.interval;
    let probes = ProbeFactory::new(Misbehave::default());
    let started = tokio::time::Instant::now();
    let worker = rig.start_on(backend, &probes, settings).await;
    let mut producer = Producer::default();
    // A record every 50 ms for a minute: a batch, an ack and a position every poll.
    // Busy from the first delivery (in fan-out mode the consumer is registered first) to
    // the last put; the wait for the last delivery after it is not busy either (an idle
    // subscription's next event may be a second away).
    producer.put_round(&rig.streams, STREAM, 1, 1).await;
    probes.wait_distinct(1, PATIENCE).await;
    let busy_from = tokio::time::Instant::now();
    for _ in 0..1_200 {
        producer.put_round(&rig.streams, STREAM, 1, 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let busy = busy_from.elapsed();
    probes.wait_distinct(producer.total(), PATIENCE).await;
    let elapsed = started.elapsed();
    let writes = table.calls("checkpoint");
    let processed = probes.snapshot().deliveries;

    let intervals = elapsed.as_secs_f64() / interval.as_secs_f64();
    assert!(
        writes as f64 <= intervals.ceil() + 1.0,
        "{writes} writes in {elapsed:?} ({intervals:.1} intervals) for {processed} records"
    );
    // And it keeps writing while busy: a trailing write an interval after each one.
    let busy_intervals = busy.as_secs_f64() / interval.as_secs_f64();
    assert!(
        writes as f64 >= busy_intervals - 2.0,
        "{writes} writes in {busy:?} busy ({busy_intervals:.1} intervals)"
    );
    shutdown_clean(worker).await;
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_flushes_checkpoints_and_releases_leases() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start(&probes).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 40, 50).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    let report = shutdown_clean(worker).await;
    assert_eq!(report.leases.released.len(), 4);

    let seen = probes.snapshot();
    let mut asked = seen.shutdown_requested.clone();
    asked.sort();
    let mut shard_ids: Vec<ShardId> = rig.shards().await.into_iter().map(|s| s.id).collect();
    shard_ids.sort();
    assert_eq!(asked, shard_ids, "every processor got shutdown_requested");
    let table = rig.table();
    for shard in rig.shards().await {
        let lease = table.get(&(&shard.id).into()).await.unwrap().unwrap();
        assert_eq!(lease.owner, None, "{} released", shard.id);
        let records = rig.records(&shard.id).await;
        let last = records.last().unwrap().sequence_number.clone();
        match lease.checkpoint {
            Checkpoint::At(at) => {
                assert_eq!(at.sequence, last, "{} flushed to its last record", shard.id)
            }
            other => panic!("{}: checkpoint {other:?}", shard.id),
        }
    }
    let names: Vec<String> = rig.metrics.datums().into_iter().map(|d| d.name).collect();
    assert!(
        names.iter().any(|n| n == "RecordsProcessed"),
        "metrics published at shutdown: {names:?}"
    );
}

/// `lease.table` names the table the leases (and, after it, the worker table) are in;
/// the application's name then names no table.
#[tokio::test(start_paused = true)]
async fn lease_table_names_the_table_the_leases_are_in() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let mut settings = fast_settings(STREAM, APP);
    settings.lease.table = Some("orders-leases".to_owned());
    let worker = rig.start_with(&probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 20, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    shutdown_clean(worker).await;

    let named = rig
        .dynamo
        .lease_table("orders-leases")
        .scan()
        .await
        .unwrap();
    assert_eq!(named.leases.len(), 2, "{named:?}");
    let workers = flotilla_actors::backend::layout::worker_table_name("orders-leases");
    assert!(
        !rig.dynamo.scan_raw(&workers).is_empty(),
        "the roster, in {workers}"
    );
    assert!(
        rig.dynamo.scan_raw(APP).is_empty(),
        "nothing in table {APP}"
    );
}

#[tokio::test(start_paused = true)]
async fn throttling_transient_errors_and_expired_iterators_lose_nothing() {
    use std::sync::Arc;

    // Iterators expire faster than the idle pause between polls of a caught-up shard.
    let rig = Rig::new(
        4,
        MemoryStreamsConfig {
            iterator_ttl: Duration::from_millis(100),
            ..MemoryStreamsConfig::default()
        },
    )
    .await;
    let mut stream_plan = FaultPlan::seeded(7);
    stream_plan.throttle = 0.2;
    stream_plan.transient = 0.1;
    let faulty_streams = Faulty::new(rig.streams.clone(), stream_plan);
    let mut table_plan = FaultPlan::seeded(8);
    table_plan.throttle = 0.05;
    table_plan.transient = 0.05;
    table_plan.lost_response = 0.02;
    let faulty_table = rig.faulty_table();
    faulty_table.set_plan(table_plan);
    let table_for_backend = faulty_table.clone();
    let backend = Backend::new(
        Arc::new(faulty_streams.clone()),
        move |_| Arc::new(table_for_backend.clone()),
        Arc::new(rig.metrics.clone()),
    );
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig
        .start_on(backend, &probes, fast_settings(STREAM, APP))
        .await;
    let mut producer = Producer::default();
    for _ in 0..4 {
        producer.put_round(&rig.streams, STREAM, 50, 20).await;
        probes.wait_distinct(producer.total(), PATIENCE).await;
        // Idle long enough for every iterator to expire.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let report = worker.shutdown().await.unwrap();
    probes.assert_nothing_lost(&producer);
    let injected = faulty_streams.injected();
    assert!(
        injected.iter().any(|(op, _)| *op == read_call()),
        "faults were injected: {injected:?}"
    );
    assert!(!faulty_table.injected().is_empty());
    // Released or not, every lease is accounted for in the report (beside it, the
    // heartbeat row's removal may have failed too).
    let failed_leases = report
        .leases
        .failed
        .iter()
        .filter(|f| !f.starts_with("heartbeat row"))
        .count();
    assert_eq!(
        report.leases.released.len() + failed_leases,
        4,
        "{report:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn large_binary_and_aggregated_records_arrive_intact() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let (records, expected_other) = special_records();
    rig.streams.put_records(STREAM, &records).await.unwrap();
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start(&probes).await;
    let seen = probes.seen.clone();
    wait_until(
        "the records",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || seen.lock().unwrap().deliveries >= 13,
    )
    .await;
    worker.shutdown().await.unwrap();
    let seen = probes.snapshot();
    assert_eq!(seen.by_key["agg"], (0..10).collect::<Vec<u64>>());
    let mut other = seen.other.clone();
    other.sort();
    assert_eq!(other, expected_other);
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_inside_an_aggregate_resumes_at_the_next_user_record() {
    use flotilla_actors::backend::PutRecord;
    use flotilla_actors::model::{ExtendedSequenceNumber, Lease};

    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let put = rig
        .streams
        .put_records(
            STREAM,
            &[PutRecord {
                partition_key: "agg".into(),
                explicit_hash_key: None,
                data: aggregate_of_ten(),
            }],
        )
        .await
        .unwrap();
    // A previous worker processed user records 0..=4 of the aggregate.
    let table = rig.table();
    table.ensure_table().await.unwrap();
    let shard = rig.shards().await[0].clone();
    let lease = Lease::new(
        &shard.id,
        Checkpoint::At(ExtendedSequenceNumber::new(
            put[0].sequence_number.clone(),
            4,
        )),
        vec![],
        Some(shard.hash_range),
    );
    assert!(table.create_if_absent(&lease).await.unwrap());
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start(&probes).await;
    let seen = probes.seen.clone();
    wait_until(
        "the rest of the aggregate",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || seen.lock().unwrap().deliveries >= 5,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.shutdown().await.unwrap();
    assert_eq!(
        probes.seen.lock().unwrap().by_key["agg"],
        vec![5, 6, 7, 8, 9]
    );
}

mod watermark {
    use std::sync::{Arc, Mutex};

    use flotilla_actors::model::SequenceNumber;
    use flotilla_actors::{
        AckToken, Batch, CheckpointMode, Checkpointer, Processor, ProcessorError,
    };

    use super::*;

    /// Acks each batch in reverse order, except its first record, whose ack it holds
    /// until the next batch (or the shutdown).
    pub struct ReverseAcker {
        pub seen: Arc<Mutex<Vec<String>>>,
        pub held: Option<(AckToken, SequenceNumber)>,
        pub holding: Arc<Mutex<HashMap<ShardId, SequenceNumber>>>,
        pub shard: ShardId,
    }

    impl Processor for ReverseAcker {
        async fn process(
            &mut self,
            batch: &Batch,
            cp: &Checkpointer,
        ) -> Result<(), ProcessorError> {
            if let Some((token, _)) = self.held.take() {
                cp.ack(token);
            }
            let mut tokens: Vec<(AckToken, &flotilla_actors::Record)> =
                batch.iter_with_tokens().collect();
            let (first_token, first) = tokens.remove(0);
            for (token, record) in tokens.into_iter().rev() {
                self.seen
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&record.data).into_owned());
                cp.ack(token);
            }
            self.seen
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&first.data).into_owned());
            self.held = Some((first_token, first.sequence_number.clone()));
            self.holding
                .lock()
                .unwrap()
                .insert(self.shard.clone(), first.sequence_number.clone());
            Ok(())
        }

        async fn shutdown_requested(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
            if let Some((token, _)) = self.held.take() {
                cp.ack(token);
            }
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn out_of_order_acks_advance_the_checkpoint_over_the_acked_prefix_only() {
        let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let holding = Arc::new(Mutex::new(HashMap::new()));
        let mut settings = fast_settings(STREAM, APP);
        settings.checkpoint.mode = CheckpointMode::Watermark;
        settings.reader.max_records = 25;
        let (s, h) = (seen.clone(), holding.clone());
        let worker = Worker::builder()
            .settings(settings)
            .backend(rig.backend())
            .processor(move |shard| ReverseAcker {
                seen: s.clone(),
                held: None,
                holding: h.clone(),
                shard: shard.shard_id.clone(),
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
        // Let the writer write what it has: the held record bounds every checkpoint.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let table = rig.table();
        let holding = holding.lock().unwrap().clone();
        for (shard, held) in holding.iter() {
            let lease = table.get(&shard.into()).await.unwrap().unwrap();
            match lease.checkpoint {
                Checkpoint::At(at) => assert!(
                    at.sequence < *held,
                    "{shard}: checkpoint {at} passed the un-acked {held}"
                ),
                Checkpoint::TrimHorizon => {}
                other => panic!("{shard}: {other:?}"),
            }
        }
        shutdown_clean(worker).await;
        // After the held acks arrive at shutdown, each shard's checkpoint is its last record.
        for shard in rig.shards().await {
            let records = rig.records(&shard.id).await;
            let last = records.last().unwrap().sequence_number.clone();
            let lease = table.get(&(&shard.id).into()).await.unwrap().unwrap();
            assert_eq!(
                lease.checkpoint,
                Checkpoint::At(flotilla_actors::model::ExtendedSequenceNumber::new(last, 0))
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_heartbeat_stops_delivering_until_it_can() {
    use flotilla_actors::ShardState;

    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let table = rig.faulty_table();
    let backend = rig.backend_with_table(table.clone());
    let probes = ProbeFactory::new(Misbehave::default());
    let settings = fast_settings(STREAM, APP);
    let fenced_after = settings.lease.failover_time - settings.lease.fence_margin;
    let worker = rig.start_on(backend, &probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;

    // DynamoDB refuses every heartbeat from now on.
    table.set_plan(heartbeat_outage());
    tokio::time::sleep(fenced_after + Duration::from_secs(1)).await;
    let before = probes.snapshot().deliveries;
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = worker.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| s.state == ShardState::Fenced),
        "{:#?}",
        status.shards
    );
    assert_eq!(
        probes.snapshot().deliveries,
        before,
        "nothing delivered while fenced"
    );

    // Heartbeats succeed again: delivery resumes, nothing lost.
    table.set_plan(FaultPlan::seeded(3));
    probes.wait_distinct(producer.total(), PATIENCE).await;
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_processor_is_restarted() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave {
        stall_on: Some("key-2:5".to_owned()),
        ..Misbehave::default()
    });
    let mut settings = fast_settings(STREAM, APP);
    settings.reader.processor_timeout = Duration::from_secs(5);
    let worker = rig.start_with(&probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 5, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    let status = worker.status().await.unwrap();
    assert_eq!(status.shard_restarts, 1, "{:#?}", status.shards);
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&producer);
}

#[tokio::test(start_paused = true)]
async fn batches_already_queued_wait_while_the_worker_is_fenced() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let table = rig.faulty_table();
    let backend = rig.backend_with_table(table.clone());
    // A slow processor with a deep window: many batches wait in its mailbox.
    let probes = ProbeFactory::new(Misbehave {
        slow: Some(Duration::from_secs(1)),
        ..Misbehave::default()
    });
    let mut settings = fast_settings(STREAM, APP);
    settings.reader.max_records = 10;
    let fenced_after = settings.lease.failover_time - settings.lease.fence_margin;
    let worker = rig.start_on(backend, &probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 1, 200).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = worker.status().await.unwrap();
    assert!(
        status.shards[0].in_flight_records >= 100,
        "{:#?}",
        status.shards
    );

    table.set_plan(heartbeat_outage());
    tokio::time::sleep(fenced_after + Duration::from_secs(2)).await;
    let fenced_at = probes.snapshot().deliveries;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        probes.snapshot().deliveries,
        fenced_at,
        "queued batches waited"
    );
    assert!(fenced_at < 200);

    table.set_plan(FaultPlan::seeded(3));
    probes.wait_distinct(producer.total(), PATIENCE).await;
    shutdown_clean(worker).await;
}

/// GetRecords keeps failing on one iterator (kinesis-mock and moto answer a bad one
/// with a bare 500, forever): after three transient failures in a row the reader gets a
/// fresh iterator from its last record instead of retrying the same one for ever. In
/// fan-out mode each failed event (a dropped connection) is a new subscription from the
/// continuation. The shard is not restarted, and nothing is lost or repeated.
#[tokio::test(start_paused = true)]
async fn an_iterator_that_keeps_failing_is_replaced_not_retried_forever() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let streams = Faulty::new(rig.streams.clone(), FaultPlan::seeded(3));
    let backend = rig.backend_with_streams(streams.clone());
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig
        .start_on(backend, &probes, fast_settings(STREAM, APP))
        .await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    // The iterator in hand is "bad" from now on: its next calls fail until replaced.
    let (read, renew, renewals) = match read_mode() {
        ReadMode::Polling => ("GetRecords", "GetShardIterator", 1),
        ReadMode::Fanout => ("SubscribeToShardEvent", "SubscribeToShard", 3),
    };
    let iterators = streams.calls(renew);
    let next = streams.calls(read);
    let mut plan = FaultPlan::seeded(4);
    for nth in next..next + 3 {
        plan = plan.then(Some(read), nth, Fault::Transient);
    }
    streams.set_plan(plan);
    // The idle shard's reads (polls, or a subscription's empty events) meet the faults.
    tokio::time::sleep(Duration::from_secs(5)).await;
    producer.put_round(&rig.streams, STREAM, 10, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    assert_eq!(streams.calls(renew), iterators + renewals);
    let status = worker.status().await.unwrap();
    assert_eq!(status.shard_restarts, 0, "{status:?}");
    shutdown_clean(worker).await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(verdict.duplicates, 0, "{verdict:?}");
}

/// A shutdown that reaches a shard reader while it is still reading its lease (the
/// read is slow) is answered once the read is done: the reader does not go on to start
/// the processor and read the shard as if nobody had asked, leaving the worker's
/// shutdown to wait out its timeout and report the shard unfinished.
#[tokio::test(start_paused = true)]
async fn a_shutdown_while_a_reader_reads_its_lease_is_answered_at_once() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let table = rig.faulty_table();
    let mut plan = FaultPlan::seeded(1);
    plan.only_ops = vec!["get"];
    plan.latency = Some((Duration::from_secs(5), Duration::from_secs(5)));
    table.set_plan(plan);
    let settings = fast_settings(STREAM, APP);
    let timeout = settings.supervision.shutdown_timeout;
    let worker = rig
        .start_on(rig.backend_with_table(table.clone()), &probes, settings)
        .await;
    wait_until(
        "the reader reads its lease",
        PATIENCE,
        Duration::from_millis(1),
        || table.calls("get") >= 1,
    )
    .await;
    let asked = tokio::time::Instant::now();
    shutdown_clean(worker).await;
    assert!(asked.elapsed() < timeout, "{:?}", asked.elapsed());
    let seen = probes.snapshot();
    assert!(seen.initialized.is_empty(), "{seen:?}");
}
