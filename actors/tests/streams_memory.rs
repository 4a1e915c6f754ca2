//! Many streams per application (`worker.streams`) on the memory backend, in paused
//! time: one fleet and one lease table for all streams, keys in the KCL's multi-stream
//! form, each lease read from its own stream with its own initial position.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::{MemoryStreams, MemoryStreamsConfig};
use flotilla_actors::backend::{IteratorPosition, LeaseTable, StreamAdmin, StreamClient};
use flotilla_actors::model::{Checkpoint, Lease, ShardId, StreamArn, StreamIdentifier};
use flotilla_actors::settings::{InitialPosition, ReadMode, StreamEntry, StreamSpec, StreamTable};
use flotilla_actors::{Settings, StreamSet, Worker};
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::{APP, Rig, STREAM, shutdown_clean, wait_held};

const PATIENCE: Duration = Duration::from_secs(600);

/// Streams `orders` (the rig's, 2 shards), `audit` (3 shards) and `clicks` (1 shard,
/// read from LATEST).
async fn three_streams() -> Rig {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 3).await.unwrap();
    rig.streams.create_stream("clicks", 1).await.unwrap();
    rig
}

fn settings_for(streams: Vec<StreamEntry>) -> Settings {
    let mut settings = fast_settings(STREAM, APP);
    settings.worker.stream.clear();
    settings.worker.streams = streams;
    settings.reader.mode = ReadMode::Polling;
    settings.reader.shard_sync_interval = Duration::from_millis(200);
    settings
}

fn three_settings() -> Settings {
    settings_for(vec![
        StreamEntry::Name(STREAM.into()),
        StreamEntry::Name("audit".into()),
        StreamEntry::Table(StreamTable {
            name: "clicks".into(),
            initial_position: Some(InitialPosition::Latest),
            initial_timestamp: None,
        }),
    ])
}

/// The table's rows, after asserting that `stream` has `count` of them, each read by
/// `arn` (the row's source is what the calls take).
async fn rows_read_by_arn(
    rig: &Rig,
    stream: &StreamIdentifier,
    arn: &str,
    count: usize,
) -> Vec<Lease> {
    let rows = rig.lease_rows().await;
    let of_stream: Vec<_> = rows
        .iter()
        .filter(|l| l.key.stream_id() == Some(stream.to_string().as_str()))
        .collect();
    assert_eq!(of_stream.len(), count, "{rows:#?}");
    assert!(
        of_stream.iter().all(|l| l.source.as_deref() == Some(arn)),
        "{of_stream:#?}"
    );
    rows
}

async fn id_of(streams: &MemoryStreams, name: &str) -> StreamIdentifier {
    let summary = streams.describe_stream_summary(name).await.unwrap();
    StreamIdentifier::of_stream(name, &summary.arn, summary.created.unwrap()).unwrap()
}

fn producer(prefix: &str) -> Producer {
    Producer::with_prefix(prefix)
}

/// Records of three streams, each from its own stream and in per-key order, across a
/// split in one of them; the third starts at LATEST, as its own setting says, while the
/// others start at TRIM_HORIZON. A row of a stream not read is never taken.
#[tokio::test(start_paused = true)]
async fn each_stream_is_read_from_its_own_shards_and_start() {
    let rig = three_streams().await;
    let (orders, audit, clicks) = (
        id_of(&rig.streams, STREAM).await,
        id_of(&rig.streams, "audit").await,
        id_of(&rig.streams, "clicks").await,
    );
    // Before the start: read from orders and audit (TRIM_HORIZON), not from clicks.
    let (mut p_orders, mut p_audit, mut p_clicks) =
        (producer("o-"), producer("a-"), producer("c-"));
    p_orders.put_round(&rig.streams, STREAM, 20, 30).await;
    p_audit.put_round(&rig.streams, "audit", 20, 30).await;
    let mut before_clicks = producer("early-c-");
    before_clicks.put_round(&rig.streams, "clicks", 5, 10).await;
    // A row of a stream this application does not read (a former stream's lease).
    let gone = StreamIdentifier::parse("000000000000:gone:1700000000").unwrap();
    let mut stray = Lease::new(
        &ShardId::from_index(0),
        Checkpoint::TrimHorizon,
        vec![],
        None,
    );
    stray.key = gone.lease_key(&ShardId::from_index(0));
    rig.table().ensure_table().await.unwrap();
    rig.table().create_if_absent(&stray).await.unwrap();

    let probes = ProbeFactory::new(Misbehave::default());
    // Small reads: audit's parent still has a backlog when its children are listed, so
    // only waiting for the parent (found by its key in audit) keeps keys in order.
    let mut settings = three_settings();
    settings.reader.max_records = 50;
    settings.reader.window_records = 50;
    let worker = rig.start_with(&probes, settings).await;
    // Every stream's shards are leased before clicks gets records, so LATEST is now.
    wait_held(&[&worker], &[6], PATIENCE).await;
    p_clicks.put_round(&rig.streams, "clicks", 10, 20).await;
    p_audit.put_round(&rig.streams, "audit", 200, 20).await;
    let first = rig.streams.list_shards("audit").await.unwrap()[0].clone();
    let mid = first.hash_range.start + (first.hash_range.end - first.hash_range.start) / 2;
    rig.streams
        .split_shard("audit", &first.id, mid)
        .await
        .unwrap();
    p_audit.put_round(&rig.streams, "audit", 20, 30).await;
    p_orders.put_round(&rig.streams, STREAM, 20, 30).await;

    let total = p_orders.total() + p_audit.total() + p_clicks.total();
    probes.wait_distinct(total, PATIENCE).await;
    let status = worker.status().await.unwrap();
    shutdown_clean(worker).await;

    let seen = probes.snapshot();
    for producer in [&p_orders, &p_audit, &p_clicks] {
        let verdict = seen.verdict(&producer.produced);
        assert_eq!(
            (verdict.lost, verdict.order_violations, verdict.duplicates),
            (0, 0, 0),
            "{verdict:?}"
        );
    }
    assert!(
        !seen.by_key.keys().any(|k| k.starts_with("early-c-")),
        "clicks starts at LATEST: its earlier records are not read"
    );
    assert_eq!(seen.distinct(), total, "nothing but what was produced");

    // Rows keyed and attributed as the KCL's multi-stream mode does.
    let rows = rig.lease_rows().await;
    let of = |id: &StreamIdentifier| {
        rows.iter()
            .filter(|l| l.key.stream_id() == Some(id.to_string().as_str()))
            .count()
    };
    assert_eq!(
        (of(&orders), of(&audit), of(&clicks)),
        (2, 5, 1),
        "{rows:#?}"
    );
    let parent = rows
        .iter()
        .find(|l| l.key == audit.lease_key(&first.id))
        .unwrap();
    assert_eq!(parent.checkpoint, Checkpoint::ShardEnd);
    assert_eq!(parent.child_shard_ids.len(), 2);
    // The former stream's row: shown as an orphan, never taken.
    // Untouched: a take (or a give-up's release) would have moved its counter.
    let stray_row = rows.iter().find(|l| l.key == stray.key).unwrap();
    assert_eq!((&stray_row.owner, stray_row.counter), (&None, 0));
    // Status names each shard's stream: the same shard id is held in each stream.
    let mut held: Vec<(Option<&str>, String)> = status
        .shards
        .iter()
        .map(|s| (s.stream.as_deref(), s.shard_id.to_string()))
        .collect();
    held.sort();
    assert!(
        held.contains(&(Some("orders"), "shardId-000000000000".into()))
            && held.contains(&(Some("clicks"), "shardId-000000000000".into()))
            && held.contains(&(Some("orders"), "shardId-000000000001".into()))
            && held.contains(&(Some("audit"), "shardId-000000000001".into())),
        "{held:?}"
    );
    assert!(held.iter().all(|(stream, _)| stream.is_some()), "{held:?}");
    let keeper = status.leases.unwrap();
    assert!(
        keeper.held.iter().all(|k| k.as_str() != stray.key.as_str()),
        "{:?}",
        keeper.held
    );
}

/// Two workers share the leases of all streams, whichever stream each is of.
#[tokio::test(start_paused = true)]
async fn leases_of_all_streams_are_balanced_across_the_fleet() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 3).await.unwrap();
    let settings = || {
        let mut s = settings_for(vec![
            StreamEntry::Name(STREAM.into()),
            StreamEntry::Name("audit".into()),
        ]);
        s.worker.worker_id = None;
        s
    };
    let probes = ProbeFactory::new(Misbehave::default());
    let a = rig.start_with(&probes, settings()).await;
    wait_held(&[&a], &[4], PATIENCE).await;
    let b = rig.start_with(&probes, settings()).await;
    wait_held(&[&a, &b], &[2, 2], PATIENCE).await;
    let mut p_orders = producer("o-");
    let mut p_audit = producer("a-");
    p_orders.put_round(&rig.streams, STREAM, 10, 20).await;
    p_audit.put_round(&rig.streams, "audit", 10, 20).await;
    probes
        .wait_distinct(p_orders.total() + p_audit.total(), PATIENCE)
        .await;
    shutdown_clean(b).await;
    shutdown_clean(a).await;
    for producer in [&p_orders, &p_audit] {
        probes.assert_nothing_lost(producer);
    }
}

/// A table a KCL multi-stream application left (its keys, `streamName`, checkpoints)
/// is resumed where it stopped: nothing at or before a checkpoint is read again.
#[tokio::test(start_paused = true)]
async fn a_kcl_multi_stream_table_is_resumed_from_its_checkpoints() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 1).await.unwrap();
    producer("old-o-")
        .put_round(&rig.streams, STREAM, 4, 5)
        .await;
    producer("old-a-")
        .put_round(&rig.streams, "audit", 4, 5)
        .await;
    // The KCL's rows: checkpointed at the last record of each stream so far.
    rig.table().ensure_table().await.unwrap();
    for name in [STREAM, "audit"] {
        let id = id_of(&rig.streams, name).await;
        let shard = ShardId::from_index(0);
        let it = rig
            .streams
            .get_shard_iterator(name, &shard, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        let records = rig.streams.get_records(&it, 10_000).await.unwrap().records;
        let last = records.last().unwrap();
        let mut row = Lease::new(
            &shard,
            Checkpoint::At(flotilla_actors::model::ExtendedSequenceNumber::new(
                last.sequence_number.clone(),
                0,
            )),
            vec![],
            None,
        );
        row.key = id.lease_key(&shard);
        row.owner = Some(flotilla_actors::model::WorkerId::new("kcl-worker"));
        row.counter = 7;
        rig.table().create_if_absent(&row).await.unwrap();
    }
    let mut settings = settings_for(vec![
        StreamEntry::Name(STREAM.into()),
        StreamEntry::Name("audit".into()),
    ]);
    settings.lease.failover_time = Duration::from_secs(6);
    let probes = ProbeFactory::new(Misbehave::default());
    let worker: Worker = rig.start_with(&probes, settings).await;
    let (mut new_orders, mut new_audit) = (producer("new-o-"), producer("new-a-"));
    new_orders.put_round(&rig.streams, STREAM, 4, 5).await;
    new_audit.put_round(&rig.streams, "audit", 4, 5).await;
    let total = new_orders.total() + new_audit.total();
    probes.wait_distinct(total, PATIENCE).await;
    wait_held(&[&worker], &[2], PATIENCE).await;
    shutdown_clean(worker).await;
    let seen = probes.snapshot();
    assert!(
        !seen.by_key.keys().any(|k| k.starts_with("old-")),
        "records at or before the KCL's checkpoints were read again: {:?}",
        seen.by_key.keys().collect::<Vec<_>>()
    );
    assert_eq!(seen.distinct(), total);
    for producer in [&new_orders, &new_audit] {
        probes.assert_nothing_lost(producer);
    }
}

/// A child is processable once its parent in its own stream has ended: a parent of the
/// same shard id in another stream says nothing about it.
#[test]
fn a_child_waits_for_its_parent_in_its_own_stream() {
    let (a, b) = (
        StreamIdentifier::parse("1:a:10").unwrap(),
        StreamIdentifier::parse("1:b:10").unwrap(),
    );
    let row = |id: &StreamIdentifier, shard: u64, checkpoint: Checkpoint, parents: &[u64]| {
        let mut lease = Lease::new(
            &ShardId::from_index(shard),
            checkpoint,
            parents.iter().map(|p| ShardId::from_index(*p)).collect(),
            None,
        );
        lease.key = id.lease_key(&ShardId::from_index(shard));
        lease
    };
    let parent_a = row(&a, 0, Checkpoint::TrimHorizon, &[]);
    let parent_b = row(&b, 0, Checkpoint::ShardEnd, &[]);
    let child_a = row(&a, 1, Checkpoint::TrimHorizon, &[0]);
    let rows = [parent_a, parent_b, child_a.clone()];
    let by_key = rows.iter().map(|l| (&l.key, l)).collect();
    assert!(!flotilla_actors::balance::processable(&child_a, &by_key));
    let mut ended = rows.clone();
    ended[0].checkpoint = Checkpoint::ShardEnd;
    let by_key = ended.iter().map(|l| (&l.key, l)).collect();
    assert!(flotilla_actors::balance::processable(&child_a, &by_key));
}

/// A stream set the test changes while the workers run, as a service's source would.
#[derive(Clone)]
struct Set(std::sync::Arc<std::sync::Mutex<Result<Vec<StreamSpec>, String>>>);

impl Set {
    fn of(names: &[&str]) -> Self {
        let set = Self(std::sync::Arc::new(std::sync::Mutex::new(Ok(vec![]))));
        set.put(names);
        set
    }

    fn put(&self, names: &[&str]) {
        *self.0.lock().unwrap() = Ok(names
            .iter()
            .map(|n| {
                let mut spec = StreamSpec::named(*n, InitialPosition::TrimHorizon);
                // An ARN, as a service's source may give it (and `worker.streams` takes it).
                if StreamArn::is_kinesis_arn(n) {
                    let arn = StreamArn::parse(n).unwrap();
                    spec.name = arn.name.clone();
                    spec.arn = Some(arn);
                }
                spec
            })
            .collect());
    }

    fn fail(&self, why: &str) {
        *self.0.lock().unwrap() = Err(why.to_owned());
    }

    fn source(&self) -> StreamSet {
        let set = self.clone();
        StreamSet::polled(move || {
            let answer = set.0.lock().unwrap().clone();
            async move { answer }
        })
    }
}

const GRACE: Duration = Duration::from_secs(30);

fn set_settings() -> Settings {
    let mut settings = settings_for(vec![]);
    settings.worker.former_stream_grace = GRACE;
    settings.worker.worker_id = None;
    settings
}

async fn start_set(rig: &Rig, probes: &ProbeFactory, set: &Set) -> Worker {
    start_set_with(rig, probes, set, set_settings()).await
}

async fn start_set_with(rig: &Rig, probes: &ProbeFactory, set: &Set, settings: Settings) -> Worker {
    let f = probes.clone();
    Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .stream_set(set.source())
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap()
}

/// Each stream of the worker's status with its state.
async fn stream_states(worker: &Worker) -> Vec<(String, &'static str)> {
    let status = worker.status().await.unwrap();
    status
        .stream_watcher
        .unwrap()
        .streams
        .iter()
        .map(|s| (s.stream.clone(), s.state))
        .collect()
}

/// Keys held by `worker` of the stream `id`.
async fn held_of(worker: &Worker, id: &StreamIdentifier) -> usize {
    let keeper = worker.status().await.unwrap().leases.unwrap();
    let prefix = format!("{id}:");
    keeper
        .held
        .iter()
        .filter(|k| k.starts_with(&prefix))
        .count()
}

/// A stream that joins the set is read within one shard sync (plus the keeper round
/// that takes its rows); one listed before it exists is unresolved (status, ERROR) and
/// read once it is created.
#[tokio::test(start_paused = true)]
async fn a_stream_added_at_runtime_is_read_within_one_sync() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 3).await.unwrap();
    let set = Set::of(&[STREAM]);
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = start_set(&rig, &probes, &set).await;
    wait_held(&[&worker], &[2], PATIENCE).await;
    let mut p_audit = producer("a-");
    p_audit.put_round(&rig.streams, "audit", 10, 20).await;

    set.put(&[STREAM, "audit", "later"]);
    let settings = set_settings();
    // One sync (jittered up to +10%), then the keeper's round after the rows appear.
    let within =
        settings.reader.shard_sync_interval.mul_f64(1.1) + settings.lease.heartbeat_interval;
    wait_held(&[&worker], &[5], within).await;
    probes.wait_distinct(p_audit.total(), PATIENCE).await;
    let status = worker.status().await.unwrap();
    let watcher = status.stream_watcher.as_ref().unwrap();
    let later = watcher
        .streams
        .iter()
        .find(|s| s.stream == "later")
        .unwrap();
    assert_eq!(later.state, "unresolved", "{watcher:?}");
    assert!(
        later.error.as_deref().unwrap().contains("later"),
        "{later:?}"
    );

    // Created: read at the next sync, from TRIM_HORIZON.
    rig.streams.create_stream("later", 1).await.unwrap();
    let mut p_later = producer("l-");
    p_later.put_round(&rig.streams, "later", 5, 10).await;
    wait_held(&[&worker], &[6], within).await;
    probes
        .wait_distinct(p_audit.total() + p_later.total(), PATIENCE)
        .await;
    assert_eq!(
        stream_states(&worker).await,
        vec![
            (STREAM.to_owned(), "active"),
            ("audit".to_owned(), "active"),
            ("later".to_owned(), "active")
        ]
    );
    shutdown_clean(worker).await;
    for producer in [&p_audit, &p_later] {
        probes.assert_nothing_lost(producer);
    }
}

/// A stream that leaves the set: its leases are stopped, flushed and released (not
/// deleted), none is taken again; listed again within the grace it resumes from its
/// checkpoints (nothing lost, nothing read twice); left out past the grace its rows
/// are deleted.
#[tokio::test(start_paused = true)]
async fn a_removed_stream_is_released_resumed_within_the_grace_and_deleted_after() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 2).await.unwrap();
    let audit = id_of(&rig.streams, "audit").await;
    let set = Set::of(&[STREAM, "audit"]);
    let probes = ProbeFactory::new(Misbehave::default());
    // Paced checkpoints a minute apart: what was read after the first one is
    // checkpointed only by the flush on the way out.
    let mut settings = set_settings();
    settings.checkpoint.interval = Duration::from_secs(60);
    let worker = start_set_with(&rig, &probes, &set, settings).await;
    wait_held(&[&worker], &[3], PATIENCE).await;
    let mut p_audit = producer("a-");
    p_audit.put_round(&rig.streams, "audit", 10, 20).await;
    probes.wait_distinct(p_audit.total(), PATIENCE).await;
    p_audit.put_round(&rig.streams, "audit", 10, 20).await;
    probes.wait_distinct(p_audit.total(), PATIENCE).await;

    set.put(&[STREAM]);
    wait_held(&[&worker], &[1], PATIENCE).await;
    let rows = rig.lease_rows().await;
    let audit_rows: Vec<&Lease> = rows
        .iter()
        .filter(|l| l.key.stream_id() == Some(audit.to_string().as_str()))
        .collect();
    assert_eq!(audit_rows.len(), 2, "released, not deleted: {rows:#?}");
    assert!(
        audit_rows.iter().all(|l| l.owner.is_none()),
        "{audit_rows:#?}"
    );
    assert!(
        audit_rows
            .iter()
            .all(|l| matches!(l.checkpoint, Checkpoint::At(_))),
        "checkpoints flushed on the way out: {audit_rows:#?}"
    );
    let states = stream_states(&worker).await;
    assert!(
        states.contains(&("audit".to_owned(), "former")),
        "{states:?}"
    );
    // Records written meanwhile wait; nothing of audit is taken again.
    p_audit.put_round(&rig.streams, "audit", 10, 20).await;
    tokio::time::sleep(GRACE / 2).await;
    assert_eq!(held_of(&worker, &audit).await, 0);
    assert!(probes.snapshot().distinct() < p_audit.total());

    // Back within the grace: resumed from the checkpoints.
    set.put(&[STREAM, "audit"]);
    wait_held(&[&worker], &[3], PATIENCE).await;
    probes.wait_distinct(p_audit.total(), PATIENCE).await;
    let verdict = probes.snapshot().verdict(&p_audit.produced);
    assert_eq!(
        (verdict.lost, verdict.duplicates, verdict.order_violations),
        (0, 0, 0),
        "{verdict:?}"
    );

    // Out past the grace: its rows are deleted, and the stream forgotten.
    set.put(&[STREAM]);
    wait_held(&[&worker], &[1], PATIENCE).await;
    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let start = tokio::time::Instant::now();
    loop {
        let rows = rig.lease_rows().await;
        let left = rows
            .iter()
            .filter(|l| l.key.stream_id() == Some(audit.to_string().as_str()))
            .count();
        let states = stream_states(&worker).await;
        if left == 0 && !states.iter().any(|(s, _)| s == "audit") {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "{left} rows left, {states:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown_clean(worker).await;
}

/// A source that fails, or answers with an empty or bad list, keeps the last good set:
/// nothing is released, and the status and the `StreamSetErrors` metric say so.
#[tokio::test(start_paused = true)]
async fn a_failing_source_keeps_the_last_good_set() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let set = Set::of(&[STREAM]);
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = start_set(&rig, &probes, &set).await;
    wait_held(&[&worker], &[2], PATIENCE).await;
    let sync = set_settings().reader.shard_sync_interval;
    for (bad, says) in [
        (Err("config service down".to_owned()), "config service down"),
        (Ok(vec![]), "empty"),
        (
            Ok(vec![
                StreamSpec::named(STREAM, InitialPosition::TrimHorizon),
                StreamSpec::named(STREAM, InitialPosition::Latest),
            ]),
            "listed twice",
        ),
    ] {
        *set.0.lock().unwrap() = bad;
        tokio::time::sleep(sync * 3).await;
        let status = worker.status().await.unwrap();
        let watcher = status.stream_watcher.unwrap();
        assert!(
            watcher.stream_set_error.as_deref().unwrap().contains(says),
            "{watcher:?}"
        );
        assert_eq!(status.leases.unwrap().held.len(), 2);
    }
    set.fail("again");
    tokio::time::sleep(sync * 3).await;
    let status = worker.status().await.unwrap();
    let errors = status.stream_watcher.as_ref().unwrap().stream_set_errors;
    assert!(errors >= 4, "{errors}");
    let counted = status.metrics.unwrap().totals["StreamSetErrors"];
    assert_eq!(counted, errors as f64);
    // Good again: the error clears.
    set.put(&[STREAM]);
    tokio::time::sleep(sync * 3).await;
    let status = worker.status().await.unwrap();
    assert_eq!(status.stream_watcher.unwrap().stream_set_error, None);
    shutdown_clean(worker).await;
}

/// Two workers whose sets differ for a while: the one that dropped a stream releases
/// its leases and never takes one again; the other, whose set still has it, reads it
/// alone (nothing produced meanwhile is lost) without a lease moving back and forth;
/// once both dropped it, its rows are deleted after the grace.
#[tokio::test(start_paused = true)]
async fn two_workers_whose_sets_differ_do_not_fight() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 4).await.unwrap();
    let audit = id_of(&rig.streams, "audit").await;
    let (set_a, set_b) = (Set::of(&[STREAM, "audit"]), Set::of(&[STREAM, "audit"]));
    let probes = ProbeFactory::new(Misbehave::default());
    let a = start_set(&rig, &probes, &set_a).await;
    wait_held(&[&a], &[6], PATIENCE).await;
    let b = start_set(&rig, &probes, &set_b).await;
    wait_held(&[&a, &b], &[3, 3], PATIENCE).await;

    set_a.put(&[STREAM]);
    let start = tokio::time::Instant::now();
    while held_of(&b, &audit).await < 4 {
        assert!(start.elapsed() < PATIENCE, "b never took audit's leases");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let counters = |rows: &[Lease]| -> Vec<u64> {
        rows.iter()
            .filter(|l| l.key.stream_id() == Some(audit.to_string().as_str()))
            .map(|l| l.counter)
            .collect()
    };
    let settled = counters(&rig.lease_rows().await);
    let mut p_audit = producer("a-");
    for _ in 0..20 {
        p_audit.put_round(&rig.streams, "audit", 4, 5).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            held_of(&a, &audit).await,
            0,
            "a took a former stream's lease"
        );
    }
    probes.wait_distinct(p_audit.total(), PATIENCE).await;
    assert_eq!(
        counters(&rig.lease_rows().await),
        settled,
        "audit's leases moved while b held them"
    );
    probes.assert_nothing_lost(&p_audit);

    // b drops it too: released, and deleted after the grace.
    set_b.put(&[STREAM]);
    wait_held(&[&a, &b], &[1, 1], PATIENCE).await;
    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let start = tokio::time::Instant::now();
    while !counters(&rig.lease_rows().await).is_empty() {
        assert!(
            start.elapsed() < PATIENCE,
            "audit's rows were never deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown_clean(b).await;
    shutdown_clean(a).await;
}

/// A stream of a fixed `worker.streams` deleted in Kinesis: its leases are released and
/// never taken again, the status says it is former (with why) and unresolved, its rows
/// are deleted after the grace, and the other stream is read throughout.
#[tokio::test(start_paused = true)]
async fn a_stream_deleted_in_kinesis_is_former_and_its_rows_deleted_after_the_grace() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 2).await.unwrap();
    let audit = id_of(&rig.streams, "audit").await;
    let mut settings = settings_for(vec![
        StreamEntry::Name(STREAM.into()),
        StreamEntry::Name("audit".into()),
    ]);
    settings.worker.former_stream_grace = GRACE;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, settings).await;
    wait_held(&[&worker], &[3], PATIENCE).await;

    rig.streams.delete_stream("audit").await.unwrap();
    wait_held(&[&worker], &[1], PATIENCE).await;
    let status = worker.status().await.unwrap();
    let streams = status.stream_watcher.unwrap().streams;
    let states: Vec<(&str, &str)> = streams
        .iter()
        .map(|s| (s.stream.as_str(), s.state))
        .collect();
    assert_eq!(
        states,
        [
            (STREAM, "active"),
            ("audit", "former"),
            ("audit", "unresolved")
        ],
        "{streams:?}"
    );
    assert!(streams[1].error.is_some(), "{streams:?}");
    let mut p_orders = producer("o-");
    p_orders.put_round(&rig.streams, STREAM, 5, 10).await;
    probes.wait_distinct(p_orders.total(), PATIENCE).await;
    assert_eq!(held_of(&worker, &audit).await, 0);

    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let start = tokio::time::Instant::now();
    loop {
        let left = rig
            .lease_rows()
            .await
            .iter()
            .filter(|l| l.key.stream_id() == Some(audit.to_string().as_str()))
            .count();
        if left == 0 {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "{left} rows of audit left");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Created again under its name: described again, read again under new keys.
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.streams.create_stream("audit", 1).await.unwrap();
    let mut p_audit = producer("a-");
    p_audit.put_round(&rig.streams, "audit", 5, 10).await;
    wait_held(&[&worker], &[2], PATIENCE).await;
    probes
        .wait_distinct(p_orders.total() + p_audit.total(), PATIENCE)
        .await;
    let again = id_of(&rig.streams, "audit").await;
    assert_ne!(again, audit);
    shutdown_clean(worker).await;
}

/// Metrics per stream: each shard's datums name its own stream (and the KCL's StreamId),
/// so the two streams' `shardId-000000000000` stay apart; each stream has its own
/// summary; the worker's datums name the application only.
#[tokio::test(start_paused = true)]
async fn metrics_name_each_shards_own_stream() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 1).await.unwrap();
    let (orders, audit) = (
        id_of(&rig.streams, STREAM).await,
        id_of(&rig.streams, "audit").await,
    );
    let mut settings = settings_for(vec![
        StreamEntry::Name(STREAM.into()),
        StreamEntry::Name("audit".into()),
    ]);
    settings.metrics.level = flotilla_actors::settings::MetricsLevel::Detailed;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, settings).await;
    let (mut p_orders, mut p_audit) = (producer("o-"), producer("a-"));
    p_orders.put_round(&rig.streams, STREAM, 7, 10).await;
    p_audit.put_round(&rig.streams, "audit", 3, 10).await;
    probes
        .wait_distinct(p_orders.total() + p_audit.total(), PATIENCE)
        .await;
    shutdown_clean(worker).await;

    let datums = rig.metrics.datums();
    let dims = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // RecordsProcessed summed over every datum with exactly these dimensions.
    let processed = |want: &[(String, String)]| -> f64 {
        datums
            .iter()
            .filter(|d| d.name == "RecordsProcessed" && d.dimensions == want)
            .map(|d| match d.value {
                flotilla_actors::backend::MetricValue::Statistics { sum, .. } => sum,
                flotilla_actors::backend::MetricValue::Value(v) => v,
            })
            .sum()
    };
    let (orders_id, audit_id) = (orders.to_string(), audit.to_string());
    let of_stream = |name: &str, id: &str| {
        dims(&[("Application", APP), ("StreamName", name), ("StreamId", id)])
    };
    let of_shard = |name: &str, id: &str| {
        dims(&[
            ("Application", APP),
            ("StreamName", name),
            ("StreamId", id),
            ("ShardId", "shardId-000000000000"),
        ])
    };
    let total = (p_orders.total() + p_audit.total()) as f64;
    assert_eq!(processed(&dims(&[("Application", APP)])), total);
    assert_eq!(
        processed(&of_stream(STREAM, &orders_id)),
        p_orders.total() as f64
    );
    assert_eq!(
        processed(&of_stream("audit", &audit_id)),
        p_audit.total() as f64
    );
    assert_eq!(
        processed(&of_shard(STREAM, &orders_id)),
        p_orders.total() as f64
    );
    assert_eq!(
        processed(&of_shard("audit", &audit_id)),
        p_audit.total() as f64
    );
    // Worker-wide figures belong to no stream; no datum joins the streams' names.
    assert!(
        datums
            .iter()
            .filter(|d| d.name == "LeasesHeld")
            .all(|d| d.dimensions == dims(&[("Application", APP)])),
        "{datums:#?}"
    );
    assert!(
        datums
            .iter()
            .all(|d| d.dimensions.iter().all(|(_, v)| !v.contains(','))),
        "{datums:#?}"
    );
}

/// An entry may name its stream by ARN (as a stream of another account must be): the
/// calls take the ARN, and the keys' account is the ARN's, checked against the
/// stream's own. An ARN that is not the stream's (another account) stops the start with
/// an error naming it, before any table is made.
#[tokio::test(start_paused = true)]
async fn a_stream_named_by_its_arn_is_read_and_a_wrong_arn_is_refused() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 2).await.unwrap();
    let audit = id_of(&rig.streams, "audit").await;
    let arn = rig
        .streams
        .describe_stream_summary("audit")
        .await
        .unwrap()
        .arn;

    // Another account's ARN for the same name: the memory server answers with its own.
    let wrong = arn.replacen(":000000000000:", ":111111111111:", 1);
    assert_ne!(wrong, arn);
    let start = |entry: String| {
        let settings = settings_for(vec![
            StreamEntry::Name(STREAM.into()),
            StreamEntry::Table(StreamTable {
                name: entry,
                initial_position: Some(InitialPosition::TrimHorizon),
                initial_timestamp: None,
            }),
        ]);
        let probes = ProbeFactory::new(Misbehave::default());
        let backend = rig.backend();
        async move {
            let f = probes.clone();
            let worker = Worker::builder()
                .settings(settings)
                .backend(backend)
                .processor(move |shard| f.make(shard))
                .start()
                .await;
            (worker, probes)
        }
    };
    let (refused, _) = start(wrong.clone()).await;
    let error = refused.err().unwrap().to_string();
    assert!(
        error.contains(&wrong)
            && error.contains("worker.streams[1]")
            && error.contains("not the stream's"),
        "{error}"
    );
    assert!(
        rig.table()
            .get(&audit.lease_key(&ShardId::from_index(0)))
            .await
            .is_err(),
        "no table is made when a stream is refused"
    );

    let (worker, probes) = start(arn.clone()).await;
    let worker = worker.unwrap();
    let (mut p_orders, mut p_audit) = (producer("o-"), producer("a-"));
    p_orders.put_round(&rig.streams, STREAM, 5, 10).await;
    p_audit.put_round(&rig.streams, "audit", 5, 10).await;
    let total = p_orders.total() + p_audit.total();
    probes.wait_distinct(total, PATIENCE).await;
    wait_held(&[&worker], &[3], PATIENCE).await;
    let status = worker.status().await.unwrap();
    shutdown_clean(worker).await;
    let seen = probes.snapshot();
    assert_eq!(seen.distinct(), total);
    for producer in [&p_orders, &p_audit] {
        probes.assert_nothing_lost(producer);
    }
    // Keyed by the ARN's account and the stream's name, as a name entry would be; the
    // row's source is what the calls take, the ARN.
    rows_read_by_arn(&rig, &audit, &arn, 2).await;
    assert!(
        status
            .shards
            .iter()
            .any(|s| s.stream.as_deref() == Some("audit")),
        "{:?}",
        status.shards
    );
}

/// Enhanced fan-out over several streams: one consumer per stream, named for the
/// application as the KCL names them, and each shard subscribed with its own stream's
/// consumer (a consumer of another stream would be refused).
#[tokio::test(start_paused = true)]
async fn fan_out_reads_each_stream_with_its_own_consumer() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 1).await.unwrap();
    let mut settings = settings_for(vec![
        StreamEntry::Name(STREAM.into()),
        StreamEntry::Name("audit".into()),
    ]);
    settings.reader.mode = ReadMode::Fanout;
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, settings).await;
    let (mut p_orders, mut p_audit) = (producer("o-"), producer("a-"));
    p_orders.put_round(&rig.streams, STREAM, 10, 20).await;
    p_audit.put_round(&rig.streams, "audit", 10, 20).await;
    let total = p_orders.total() + p_audit.total();
    probes.wait_distinct(total, PATIENCE).await;
    let status = worker.status().await.unwrap();
    shutdown_clean(worker).await;
    let seen = probes.snapshot();
    assert_eq!(seen.distinct(), total);
    for producer in [&p_orders, &p_audit] {
        probes.assert_nothing_lost(producer);
    }
    for name in [STREAM, "audit"] {
        let arn = rig.streams.describe_stream_summary(name).await.unwrap().arn;
        let consumers = rig.streams.list_stream_consumers(&arn).await.unwrap();
        let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [APP], "{name}");
    }
    // Every shard of both streams was read by subscription, none by polling.
    assert_eq!(status.shards.len(), 3, "{:?}", status.shards);
    assert!(
        status
            .shards
            .iter()
            .all(|s| s.subscription.is_some() && s.stream.is_some()),
        "{:?}",
        status.shards
    );
}

/// A stream named by its ARN joins the set while running: described by the ARN, its
/// account checked against the stream's own, keyed by the stream's identifier and read
/// (the rows' source is the ARN, what the calls take). An ARN of another account stays
/// unresolved, saying why, and its stream is not read.
#[tokio::test(start_paused = true)]
async fn an_arn_added_at_runtime_is_read_and_a_wrong_one_stays_unresolved() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 2).await.unwrap();
    rig.streams.create_stream("clicks", 1).await.unwrap();
    let audit = id_of(&rig.streams, "audit").await;
    let arn_of = |name: &'static str| {
        let streams = rig.streams.clone();
        async move { streams.describe_stream_summary(name).await.unwrap().arn }
    };
    let audit_arn = arn_of("audit").await;
    let wrong = arn_of("clicks")
        .await
        .replacen(":000000000000:", ":111111111111:", 1);
    let set = Set::of(&[STREAM]);
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = start_set(&rig, &probes, &set).await;
    wait_held(&[&worker], &[1], PATIENCE).await;

    set.put(&[STREAM, &audit_arn, &wrong]);
    let mut p_audit = producer("a-");
    p_audit.put_round(&rig.streams, "audit", 5, 10).await;
    wait_held(&[&worker], &[3], PATIENCE).await;
    probes.wait_distinct(p_audit.total(), PATIENCE).await;
    assert_eq!(held_of(&worker, &audit).await, 2);
    let status = worker.status().await.unwrap();
    let watcher = status.stream_watcher.as_ref().unwrap();
    let states: Vec<(&str, &str)> = watcher
        .streams
        .iter()
        .map(|s| (s.stream.as_str(), s.state))
        .collect();
    assert_eq!(
        states,
        vec![
            (STREAM, "active"),
            (audit_arn.as_str(), "active"),
            (wrong.as_str(), "unresolved")
        ],
        "{watcher:?}"
    );
    let refused = watcher.streams.iter().find(|s| s.stream == wrong).unwrap();
    assert!(
        refused
            .error
            .as_deref()
            .is_some_and(|e| e.contains("not the stream's")),
        "{refused:?}"
    );
    shutdown_clean(worker).await;
    probes.assert_nothing_lost(&p_audit);
    let rows = rows_read_by_arn(&rig, &audit, &audit_arn, 2).await;
    assert!(
        rows.iter().all(|l| !l.key.to_string().contains("clicks")),
        "the stream of the wrong ARN is never read: {rows:#?}"
    );
}

/// Fan-out mode, a stream that joins the set while running: its consumer is found or
/// registered before its readers start, and they subscribe with it (never a silent
/// poll). A stream whose consumer cannot be registered (20 consumers already) stays
/// unresolved with the error and is not read; once a consumer is deregistered, the
/// next sync registers its own and reads it by subscription.
#[tokio::test(start_paused = true)]
async fn fan_out_registers_the_consumer_of_a_stream_added_at_runtime() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    rig.streams.create_stream("audit", 2).await.unwrap();
    rig.streams.create_stream("full", 1).await.unwrap();
    let full_arn = rig
        .streams
        .describe_stream_summary("full")
        .await
        .unwrap()
        .arn;
    let mut others = Vec::new();
    for i in 0..20 {
        let other = rig
            .streams
            .register_stream_consumer(&full_arn, &format!("other-{i}"))
            .await
            .unwrap();
        others.push(other);
    }
    let mut settings = set_settings();
    settings.reader.mode = ReadMode::Fanout;
    let set = Set::of(&[STREAM]);
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = start_set_with(&rig, &probes, &set, settings).await;
    wait_held(&[&worker], &[1], PATIENCE).await;

    set.put(&[STREAM, "audit", "full"]);
    let (mut p_audit, mut p_full) = (producer("a-"), producer("f-"));
    p_audit.put_round(&rig.streams, "audit", 5, 10).await;
    p_full.put_round(&rig.streams, "full", 5, 10).await;
    wait_held(&[&worker], &[3], PATIENCE).await;
    probes.wait_distinct(p_audit.total(), PATIENCE).await;
    let status = worker.status().await.unwrap();
    let watcher = status.stream_watcher.as_ref().unwrap();
    let full = watcher.streams.iter().find(|s| s.stream == "full").unwrap();
    assert_eq!(full.state, "unresolved", "{watcher:?}");
    assert!(
        full.error
            .as_deref()
            .is_some_and(|e| e.contains("already has 20 registered consumers")),
        "{full:?}"
    );
    let audit_arn = rig
        .streams
        .describe_stream_summary("audit")
        .await
        .unwrap()
        .arn;
    let consumers = rig.streams.list_stream_consumers(&audit_arn).await.unwrap();
    let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [APP]);
    assert_eq!(status.shards.len(), 3, "{:?}", status.shards);
    assert!(
        status.shards.iter().all(|s| s.subscription.is_some()),
        "every shard, the added stream's too, is read by subscription: {:?}",
        status.shards
    );

    // Room for one more: the next sync registers the stream's consumer and reads it.
    rig.streams
        .deregister_stream_consumer(&others[0].arn)
        .await
        .unwrap();
    wait_held(&[&worker], &[4], PATIENCE).await;
    probes
        .wait_distinct(p_audit.total() + p_full.total(), PATIENCE)
        .await;
    let status = worker.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| s.subscription.is_some()),
        "{:?}",
        status.shards
    );
    assert!(
        rig.streams
            .list_stream_consumers(&full_arn)
            .await
            .unwrap()
            .iter()
            .any(|c| c.name == APP)
    );
    shutdown_clean(worker).await;
    for producer in [&p_audit, &p_full] {
        probes.assert_nothing_lost(producer);
    }
}
