//! Many streams per application (`worker.streams`) on the memory backend, in paused
//! time: one fleet and one lease table for all streams, keys in the KCL's multi-stream
//! form, each lease read from its own stream with its own initial position.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::{MemoryStreams, MemoryStreamsConfig};
use flotilla_actors::backend::{IteratorPosition, LeaseTable, StreamAdmin, StreamClient};
use flotilla_actors::model::{Checkpoint, Lease, ShardId, StreamIdentifier};
use flotilla_actors::settings::{InitialPosition, ReadMode, StreamEntry, StreamTable};
use flotilla_actors::{Settings, Worker};
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
    let seen = probes.snapshot();
    for producer in [&p_orders, &p_audit] {
        let verdict = seen.verdict(&producer.produced);
        assert_eq!(
            (verdict.lost, verdict.order_violations),
            (0, 0),
            "{verdict:?}"
        );
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
        let verdict = seen.verdict(&producer.produced);
        assert_eq!(
            (verdict.lost, verdict.order_violations),
            (0, 0),
            "{verdict:?}"
        );
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
        let verdict = seen.verdict(&producer.produced);
        assert_eq!(
            (verdict.lost, verdict.order_violations),
            (0, 0),
            "{verdict:?}"
        );
    }
    // Keyed by the ARN's account and the stream's name, as a name entry would be; the
    // row's source is what the calls take, the ARN.
    let rows = rig.lease_rows().await;
    let of_audit: Vec<_> = rows
        .iter()
        .filter(|l| l.key.stream_id() == Some(audit.to_string().as_str()))
        .collect();
    assert_eq!(of_audit.len(), 2, "{rows:#?}");
    assert!(
        of_audit
            .iter()
            .all(|l| l.source.as_deref() == Some(arn.as_str())),
        "{of_audit:#?}"
    );
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
        let verdict = seen.verdict(&producer.produced);
        assert_eq!(
            (verdict.lost, verdict.order_violations),
            (0, 0),
            "{verdict:?}"
        );
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
