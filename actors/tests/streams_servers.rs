//! Many streams per application (`worker.streams`) through the real adapters: in-process
//! ferrokinesis + dynoxide always; kinesis-mock + DynamoDB Local, and moto, with the
//! `external-servers` feature (started by scripts/test.sh). What only a real server
//! shows: the stream identifier comes from DescribeStreamSummary's ARN and creation
//! time, and the rows written through the DynamoDB adapter carry the KCL's multi-stream
//! attributes; in fan-out mode, one consumer per stream. One stream is named by its ARN, as a stream of another account must be:
//! every reading call then takes `StreamARN`, which each server must accept.
//! Real time and real sockets: small streams, short intervals.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flotilla_actors::backend::aws::{DynamoLeaseTable, KinesisStream};
use flotilla_actors::backend::{LeaseTable, StreamAdmin, StreamClient};
use flotilla_actors::model::{Checkpoint, StreamArn, StreamIdentifier};
use flotilla_actors::settings::{InitialPosition, ReadMode, StreamEntry, StreamSpec};
use flotilla_actors::{StreamSet, Worker};
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::shutdown_clean;
use support::servers;

const PATIENCE: Duration = Duration::from_secs(180);

async fn two_streams_in_one_table(
    kinesis_endpoint: String,
    dynamodb_endpoint: String,
    mode: ReadMode,
) {
    let sdk = servers::sdk_config();
    let kinesis = KinesisStream::new(&sdk, Some(&kinesis_endpoint));
    let (a, b) = (
        servers::unique_name("many-a"),
        servers::unique_name("many-b"),
    );
    kinesis.create_stream(&a, 2).await.unwrap();
    kinesis.create_stream(&b, 1).await.unwrap();
    let b_arn = kinesis.describe_stream_summary(&b).await.unwrap().arn;
    let application = servers::unique_name("many-app");

    let mut settings = fast_settings("", &application);
    settings.worker.stream.clear();
    settings.worker.streams = vec![
        StreamEntry::Name(a.clone()),
        StreamEntry::Name(b_arn.clone()),
    ];
    settings.reader.mode = mode;
    let backend = servers::dynamo_backend(&kinesis, &dynamodb_endpoint);
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let worker: Worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap();
    let (mut p_a, mut p_b) = (Producer::with_prefix("a-"), Producer::with_prefix("b-"));
    p_a.put_round(&kinesis, &a, 20, 10).await;
    p_b.put_round(&kinesis, &b, 20, 10).await;
    probes
        .wait_distinct(p_a.total() + p_b.total(), PATIENCE)
        .await;
    let status = worker.status().await.unwrap();
    shutdown_clean(worker).await;
    for producer in [&p_a, &p_b] {
        probes.assert_nothing_lost(producer);
    }

    // Fan-out: one consumer per stream, named for the application, and every shard
    // read by subscription.
    if mode == ReadMode::Fanout {
        for stream in [&a, &b] {
            let arn = kinesis.describe_stream_summary(stream).await.unwrap().arn;
            let consumers = kinesis.list_stream_consumers(&arn).await.unwrap();
            let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, [application.as_str()], "{stream}");
        }
        assert!(
            status.shards.iter().all(|s| s.subscription.is_some()),
            "{:?}",
            status.shards
        );
    }

    let table = DynamoLeaseTable::new(&sdk, Some(&dynamodb_endpoint), &application);
    let rows = table.scan().await.unwrap().leases;
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for row in &rows {
        let id = StreamIdentifier::parse(row.key.stream_id().unwrap()).unwrap();
        assert!([&a, &b].contains(&&id.name), "{id}");
        assert!(!id.account.is_empty(), "{id}");
        // Created by this test, within the last hour (a server's clock is this one).
        assert!(
            id.creation_epoch <= now + 60 && id.creation_epoch + 3600 >= now,
            "{id}: creation epoch {} is not about now ({now})",
            id.creation_epoch
        );
        assert_eq!(id.lease_key(&row.key.shard_id()), row.key);
        // The account is the ARN's (and the stream's: the worker checked).
        if id.name == b {
            assert_eq!(Some(id.account.as_str()), b_arn.split(':').nth(4), "{id}");
            assert_eq!(row.source.as_deref(), Some(b_arn.as_str()));
        }
    }
}

/// A stream set changed while the worker runs, through the real adapters: a stream
/// added (by its ARN, checked against the server's) is described and read, in fan-out
/// mode by subscription with its own consumer registered when it joined; removed, its
/// lease is released at its checkpoint and, after the grace, its row deleted by the
/// DynamoDB adapter's conditional delete.
async fn a_stream_set_that_changes(
    kinesis_endpoint: String,
    dynamodb_endpoint: String,
    mode: ReadMode,
) {
    let sdk = servers::sdk_config();
    let kinesis = KinesisStream::new(&sdk, Some(&kinesis_endpoint));
    let (a, b) = (servers::unique_name("set-a"), servers::unique_name("set-b"));
    kinesis.create_stream(&a, 1).await.unwrap();
    kinesis.create_stream(&b, 1).await.unwrap();
    let application = servers::unique_name("set-app");
    let mut settings = fast_settings("", &application);
    settings.worker.stream.clear();
    settings.reader.mode = mode;
    settings.reader.shard_sync_interval = Duration::from_millis(500);
    settings.worker.former_stream_grace = Duration::from_secs(3);
    let b_arn = kinesis.describe_stream_summary(&b).await.unwrap().arn;
    let list = Arc::new(std::sync::Mutex::new(vec![StreamSpec::named(
        &a,
        InitialPosition::TrimHorizon,
    )]));
    let set = StreamSet::polled({
        let list = list.clone();
        move || {
            let answer = Ok(list.lock().unwrap().clone());
            async move { answer }
        }
    });
    let backend = servers::dynamo_backend(&kinesis, &dynamodb_endpoint);
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let worker: Worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .stream_set(set)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap();
    let (mut p_a, mut p_b) = (Producer::with_prefix("a-"), Producer::with_prefix("b-"));
    p_a.put_round(&kinesis, &a, 10, 10).await;
    p_b.put_round(&kinesis, &b, 10, 10).await;
    probes.wait_distinct(p_a.total(), PATIENCE).await;
    list.lock().unwrap().push(StreamSpec {
        arn: Some(StreamArn::parse(&b_arn).unwrap()),
        ..StreamSpec::named(&b, InitialPosition::TrimHorizon)
    });
    probes
        .wait_distinct(p_a.total() + p_b.total(), PATIENCE)
        .await;
    if mode == ReadMode::Fanout {
        let consumers = kinesis.list_stream_consumers(&b_arn).await.unwrap();
        let names: Vec<&str> = consumers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [application.as_str()]);
        let status = worker.status().await.unwrap();
        assert_eq!(status.shards.len(), 2, "{:?}", status.shards);
        assert!(
            status.shards.iter().all(|s| s.subscription.is_some()),
            "the added stream is read by subscription too: {:?}",
            status.shards
        );
    }

    let table = DynamoLeaseTable::new(&sdk, Some(&dynamodb_endpoint), &application);
    let of_b = |rows: &[flotilla_actors::model::Lease]| -> Vec<flotilla_actors::model::Lease> {
        rows.iter()
            .filter(|l| l.key.stream_name() == Some(b.as_str()))
            .cloned()
            .collect()
    };
    // The rows of the stream named by its ARN carry the ARN, what its calls take.
    let rows = of_b(&table.scan().await.unwrap().leases);
    assert!(
        !rows.is_empty()
            && rows
                .iter()
                .all(|l| l.source.as_deref() == Some(b_arn.as_str())),
        "{rows:#?}"
    );
    list.lock().unwrap().retain(|s| s.name == a);
    let start = tokio::time::Instant::now();
    loop {
        let rows = of_b(&table.scan().await.unwrap().leases);
        if rows.len() == 1 && rows[0].owner.is_none() {
            assert!(
                matches!(rows[0].checkpoint, Checkpoint::At(_)),
                "released at its checkpoint: {rows:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "b's lease not released: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        let rows = of_b(&table.scan().await.unwrap().leases);
        if rows.is_empty() {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "b's row not deleted: {rows:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown_clean(worker).await;
    for producer in [&p_a, &p_b] {
        probes.assert_nothing_lost(producer);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrokinesis_dynoxide_set_changes() {
    a_stream_set_that_changes(
        servers::start_ferrokinesis(300).await,
        servers::start_dynoxide().await,
        ReadMode::Polling,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrokinesis_dynoxide_set_changes_fanout() {
    a_stream_set_that_changes(
        servers::start_ferrokinesis(300).await,
        servers::start_dynoxide().await,
        ReadMode::Fanout,
    )
    .await;
}

#[cfg(feature = "external-servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_mock_dynamodb_local_set_changes() {
    a_stream_set_that_changes(
        servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
        ReadMode::Polling,
    )
    .await;
}

#[cfg(feature = "external-servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_mock_dynamodb_local_set_changes_fanout() {
    a_stream_set_that_changes(
        servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
        ReadMode::Fanout,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrokinesis_dynoxide() {
    two_streams_in_one_table(
        servers::start_ferrokinesis(300).await,
        servers::start_dynoxide().await,
        ReadMode::Polling,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrokinesis_dynoxide_fanout() {
    two_streams_in_one_table(
        servers::start_ferrokinesis(300).await,
        servers::start_dynoxide().await,
        ReadMode::Fanout,
    )
    .await;
}

#[cfg(feature = "external-servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_mock_dynamodb_local() {
    two_streams_in_one_table(
        servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
        ReadMode::Polling,
    )
    .await;
}

#[cfg(feature = "external-servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_mock_dynamodb_local_fanout() {
    two_streams_in_one_table(
        servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
        ReadMode::Fanout,
    )
    .await;
}

/// Polling only: moto has no SubscribeToShard.
#[cfg(feature = "external-servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto() {
    let url = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
    two_streams_in_one_table(url.clone(), url, ReadMode::Polling).await;
}
