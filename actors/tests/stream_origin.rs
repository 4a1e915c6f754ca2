//! A stream never inherits another stream's checkpoints (`model::origin`): a single
//! stream's rows are keyed by bare shard ids, as any stream's would be, so each row
//! names its stream (`flotillaSource`) and when that stream was created
//! (`flotillaSourceCreated`). On the memory backend, paused time:
//!
//! * a renamed stream (`worker.stream` changed, `worker.application` kept): the worker
//!   refuses to start, naming the rows, their stream and what to do, and writes nothing;
//! * a recreated stream (deleted and created again under its name): refused at start,
//!   and, under a running worker, found at the next listing: the worker stops with the
//!   reason instead of reading the new stream from the old positions;
//! * a table the Java KCL wrote (no source): adopted, stamped once, and read from its
//!   checkpoints.
//!
//! The same on real servers: `worker_servers.rs`, `a_renamed_stream_is_refused_*`.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{LeaseTable, StreamAdmin};
use flotilla_actors::model::origin::Foreign;
use flotilla_actors::model::{Checkpoint, Lease, ShardId};
use flotilla_actors::{Settings, Worker, WorkerError};

use support::probe::{Misbehave, ProbeFactory, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, shutdown_clean, wait_held};

fn settings(stream: &str) -> Settings {
    let mut s = fast_settings(stream, APP);
    s.worker.worker_id = Some("w".to_owned());
    s
}

/// A worker on `STREAM` until every shard has a stamped row; then it stops cleanly.
async fn run_once(rig: &Rig, probes: &ProbeFactory) {
    let worker = rig.start_with(probes, settings(STREAM)).await;
    wait_held(&[&worker], &[4], Duration::from_secs(10)).await;
    shutdown_clean(worker).await;
    for lease in rig.lease_rows().await {
        assert_eq!(lease.source.as_deref(), Some(STREAM), "{lease:?}");
        assert!(lease.source_created.is_some(), "{lease:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_renamed_stream_does_not_start_on_the_old_streams_rows() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    run_once(&rig, &probes).await;
    rig.streams.create_stream("payments", 4).await.unwrap();
    let before = rig.lease_rows().await;
    let refused = match start(&rig, &probes, "payments").await {
        Err(error) => error,
        Ok(_) => panic!("a worker of payments started on orders' rows"),
    };
    match &refused {
        WorkerError::ForeignRows { stream, rows, .. } => {
            assert_eq!(stream, "payments");
            assert_eq!(rows.len(), 4);
            assert!(rows.iter().all(|(_, why)| matches!(
                why,
                Foreign::OtherStream { source } if source == STREAM
            )));
        }
        other => panic!("{other}"),
    }
    let text = refused.to_string();
    for hint in [
        "flotilla destroy",
        "worker.application",
        "position import --force",
    ] {
        assert!(text.contains(hint), "{text}");
    }
    assert_eq!(rig.lease_rows().await, before, "nothing written");
}

#[tokio::test(start_paused = true)]
async fn a_recreated_stream_does_not_start_on_the_deleted_streams_rows() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    run_once(&rig, &probes).await;
    rig.streams.delete_stream(STREAM).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    rig.streams.create_stream(STREAM, 4).await.unwrap();
    let refused = start(&rig, &probes, STREAM).await;
    match refused {
        Err(WorkerError::ForeignRows { rows, .. }) => {
            assert_eq!(rows.len(), 4);
            assert!(
                rows.iter()
                    .all(|(_, why)| matches!(why, Foreign::Recreated { .. })),
                "{rows:?}"
            );
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a worker started on the deleted stream's rows"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_recreated_under_a_running_worker_stops_it_with_the_reason() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let mut s = settings(STREAM);
    s.reader.shard_sync_interval = Duration::from_secs(2);
    let mut worker = rig.start_with(&probes, s).await;
    wait_held(&[&worker], &[4], Duration::from_secs(10)).await;
    rig.streams.delete_stream(STREAM).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.streams.create_stream(STREAM, 4).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker stops at its next listing");
    let reason = stopped.unwrap_err().to_string();
    assert!(
        reason.contains("deleted and created again"),
        "the reason says what happened: {reason}"
    );
}

#[tokio::test(start_paused = true)]
async fn rows_the_java_kcl_wrote_are_adopted_and_read_from_their_checkpoints() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let table = rig.dynamo.lease_table(APP);
    table.ensure_table().await.unwrap();
    // The KCL's rows: no source, the first shard checkpointed half way.
    let feed = Feed::start(rig.streams.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = ShardId::from_index(0);
    let records = rig.records(&first).await;
    let middle = records[records.len() / 2].sequence_number.clone();
    for i in 0..2 {
        let shard = ShardId::from_index(i);
        let checkpoint = match i {
            0 => Checkpoint::At(flotilla_actors::model::ExtendedSequenceNumber {
                sequence: middle.clone(),
                sub_sequence: 0,
            }),
            _ => Checkpoint::TrimHorizon,
        };
        let lease = Lease::new(&shard, checkpoint, vec![], None);
        assert!(lease.source.is_none());
        table.create_if_absent(&lease).await.unwrap();
    }
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, settings(STREAM)).await;
    wait_held(&[&worker], &[2], Duration::from_secs(10)).await;
    for lease in rig.lease_rows().await {
        assert_eq!(lease.source.as_deref(), Some(STREAM), "adopted: {lease:?}");
        assert!(lease.source_created.is_some(), "stamped: {lease:?}");
    }
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total() / 2, Duration::from_secs(30))
        .await;
    shutdown_clean(worker).await;
    let seen = probes.snapshot();
    let before: Vec<String> = records[..=records.len() / 2]
        .iter()
        .map(|r| String::from_utf8_lossy(&r.data).into_owned())
        .collect();
    let again = before
        .iter()
        .filter(|data| {
            let Some((key, n)) = data.split_once(':') else {
                return false;
            };
            let n: u64 = n.parse().unwrap_or(u64::MAX);
            seen.by_key.get(key).is_some_and(|got| got.contains(&n))
        })
        .count();
    assert_eq!(
        again, 0,
        "records at or before the KCL's checkpoint delivered again"
    );
}

/// The lease table deleted under a running worker (`flotilla destroy --force`, a hand):
/// it stops with an ERROR that says so and `Worker::wait` fails with the reason, instead
/// of going on fenced, or making the table again and starting every shard over.
#[tokio::test(start_paused = true)]
async fn a_lease_table_deleted_under_a_worker_stops_it_with_the_reason() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let mut worker = rig.start_with(&probes, settings(STREAM)).await;
    wait_held(&[&worker], &[2], Duration::from_secs(10)).await;
    assert!(rig.dynamo.delete_table(APP));
    let stopped = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker stops at its next heartbeat");
    let reason = stopped.unwrap_err().to_string();
    assert!(
        reason.contains(&format!("the lease table {APP}")) && reason.contains("was deleted"),
        "{reason}"
    );
    assert!(
        !rig.dynamo.scan_raw(APP).iter().any(|_| true),
        "the table is not made again"
    );
}

/// A worker of `stream` (the application's), or why it did not start.
async fn start(rig: &Rig, probes: &ProbeFactory, stream: &str) -> Result<Worker, WorkerError> {
    let f = probes.clone();
    Worker::builder()
        .settings(settings(stream))
        .backend(rig.backend())
        .processor(move |shard| f.make(shard))
        .start()
        .await
}
