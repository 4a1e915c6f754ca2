//! What a service embedding a worker relies on: the AWS backend is built from the same
//! settings as the worker (and a backend built from others is refused), a missing
//! stream leaves nothing behind, and a processor can stop its worker gracefully.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::aws::KinesisStream;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{PutRecord, StreamAdmin, StreamError};
use flotilla_actors::model::{Checkpoint, ExtendedSequenceNumber};
use flotilla_actors::{
    AwsSettings, Backend, Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, Settings,
    Worker, WorkerError,
};

use support::probe::{Misbehave, ProbeFactory, fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM, shutdown_clean};
use support::servers;

/// Settings whose `aws` section names the in-process servers.
fn on_servers(stream: &str, kinesis: &str, dynamodb: &str) -> Settings {
    let mut settings = fast_settings(stream, &servers::unique_name("embed-app"));
    settings.metrics.level = flotilla_actors::MetricsLevel::None;
    settings.aws.region = Some("us-east-1".to_owned());
    settings.aws.kinesis_endpoint = Some(kinesis.to_owned());
    settings.aws.dynamodb_endpoint = Some(dynamodb.to_owned());
    settings
}

/// The lease tables a DynamoDB server has.
async fn tables(dynamodb: &str) -> Vec<String> {
    let config = aws_sdk_dynamodb::config::Builder::from(&servers::sdk_config())
        .endpoint_url(dynamodb)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
        .list_tables()
        .send()
        .await
        .unwrap()
        .table_names
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_built_from_the_settings_reads_where_they_say() {
    let kinesis = servers::start_ferrokinesis(300).await;
    let dynamodb = servers::start_dynoxide().await;
    let stream = servers::unique_name("embed");
    let admin = KinesisStream::new(&servers::sdk_config(), Some(&kinesis));
    admin.create_stream(&stream, 1).await.unwrap();
    let records: Vec<PutRecord> = (0..10)
        .map(|i| PutRecord {
            partition_key: "key-0".to_owned(),
            explicit_hash_key: None,
            data: Bytes::from(format!("key-0:{i}")),
        })
        .collect();
    admin.put_records(&stream, &records).await.unwrap();

    // Nothing but the settings says where the servers are: the SDK configuration the
    // caller brings has credentials and a region, no endpoint.
    let settings = on_servers(&stream, &kinesis, &dynamodb);
    let backend = Backend::from_sdk(&servers::sdk_config(), &settings.aws);
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let worker = Worker::builder()
        .settings(settings.clone())
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap();
    probes.wait_distinct(10, Duration::from_secs(30)).await;
    shutdown_clean(worker).await;
    assert_eq!(
        tables(&dynamodb).await,
        vec![
            settings.worker.application.clone(),
            format!("{}-FlotillaWorkers", settings.worker.application)
        ],
        "the lease table and its worker table, where the settings say"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_built_from_other_aws_settings_is_refused() {
    // The settings name local servers; the backend was built for AWS itself. Refused
    // before any call, so this needs no server (a call would go to AWS).
    let mut settings = fast_settings("orders", "orders-app");
    settings.aws.kinesis_endpoint = Some("http://127.0.0.1:4567".to_owned());
    settings.aws.region = Some("eu-west-1".to_owned());
    let backend = Backend::from_sdk(&servers::sdk_config(), &AwsSettings::default());
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let err = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(err, WorkerError::BackendMismatch { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "backend: built for other AWS settings than the worker's: aws.region is unset in the \
         backend but \"eu-west-1\" in the settings, aws.kinesis_endpoint is unset in the \
         backend but \"http://127.0.0.1:4567\" in the settings; build it from the worker's \
         own settings: Backend::aws(&settings.aws)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_leaves_no_lease_table() {
    let kinesis = servers::start_ferrokinesis(300).await;
    let dynamodb = servers::start_dynoxide().await;
    let settings = on_servers("no-such-stream", &kinesis, &dynamodb);
    let backend = Backend::from_sdk(&servers::sdk_config(), &settings.aws);
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let err = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            WorkerError::Stream { stream, source: StreamError::NotFound { .. } }
                if stream == "no-such-stream"
        ),
        "{err:?}"
    );
    assert_eq!(tables(&dynamodb).await, Vec::<String>::new());
}

/// Stops its worker at the first "poison" record: checkpoints the records before it
/// (manual mode), asks for the shutdown, and processes nothing after it.
struct PoisonAware {
    processed: Arc<Mutex<Vec<String>>>,
    stopped: bool,
}

impl Processor for PoisonAware {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let mut last_good = None;
        for record in batch.records() {
            if self.stopped {
                break;
            }
            if record.data == "poison" {
                cp.worker().request_shutdown(format!(
                    "poison record {} in {}",
                    record.sequence_number,
                    batch.shard_id()
                ));
                self.stopped = true;
                break;
            }
            self.processed
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&record.data).into_owned());
            last_good = Some(record);
        }
        if let Some(record) = last_good {
            cp.checkpoint_record(record).await?;
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_processor_stops_its_worker_gracefully_and_wait_returns_why() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let mut records: Vec<PutRecord> = Vec::new();
    for i in 0..5 {
        for key in ["a", "b"] {
            records.push(PutRecord {
                partition_key: key.to_owned(),
                explicit_hash_key: None,
                data: Bytes::from(format!("{key}:{i}")),
            });
        }
    }
    let poison = |data: &'static str| PutRecord {
        partition_key: "a".to_owned(),
        explicit_hash_key: None,
        data: Bytes::from_static(data.as_bytes()),
    };
    records.push(poison("poison"));
    records.push(poison("after-the-poison"));
    rig.streams.put_records(STREAM, &records).await.unwrap();

    let mut settings = fast_settings(STREAM, APP);
    settings.checkpoint.mode = CheckpointMode::Manual;
    let processed = Arc::new(Mutex::new(Vec::new()));
    let p = processed.clone();
    let mut worker = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| PoisonAware {
            processed: p.clone(),
            stopped: false,
        })
        .start()
        .await
        .unwrap();

    let stopped = tokio::time::timeout(Duration::from_secs(600), worker.wait())
        .await
        .expect("a requested shutdown makes wait() return")
        .unwrap();

    // Where the poison is, and the record just before it in its shard.
    let mut poisoned = None;
    for shard in rig.shards().await {
        let records = rig.records(&shard.id).await;
        if let Some(at) = records.iter().position(|r| r.data == "poison") {
            poisoned = Some((
                shard.id.clone(),
                records[at].clone(),
                records[at - 1].clone(),
            ));
        }
    }
    let (shard, poison, before) = poisoned.unwrap();
    assert_eq!(
        stopped.reason,
        format!("poison record {} in {shard}", poison.sequence_number)
    );
    // The same graceful shutdown as Worker::shutdown: every shard stopped, checkpoints
    // flushed, leases released.
    assert!(stopped.report.clean(), "{:#?}", stopped.report);
    assert_eq!(stopped.report.shards.len(), 2, "{:#?}", stopped.report);
    assert_eq!(stopped.report.leases.released.len(), 2);
    for lease in rig.lease_rows().await {
        assert_eq!(lease.owner, None, "{lease:?}");
        if lease.key.shard_id() == shard {
            // The next worker starts at the poison record, to deal with it.
            assert_eq!(
                lease.checkpoint,
                Checkpoint::At(ExtendedSequenceNumber::new(
                    before.sequence_number.clone(),
                    0
                ))
            );
        }
    }
    let processed = processed.lock().unwrap().clone();
    assert!(
        !processed.contains(&"after-the-poison".to_owned()),
        "{processed:?}"
    );
    // The report stays available: shutdown() after the fact returns the same one.
    assert_eq!(worker.shutdown().await.unwrap(), stopped.report);
}

#[tokio::test(start_paused = true)]
async fn the_service_can_request_a_shutdown_through_the_handle() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let mut worker = rig.start(&probes).await;
    let handle = worker.handle();
    wait_until(
        "the lease taken",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || !probes.snapshot().initialized.is_empty(),
    )
    .await;
    assert!(handle.request_shutdown("maintenance window"));
    assert!(!handle.request_shutdown("again"));
    let stopped = tokio::time::timeout(Duration::from_secs(600), worker.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped.reason, "maintenance window");
    assert!(stopped.report.clean(), "{:#?}", stopped.report);
    assert_eq!(probes.snapshot().shutdown_requested.len(), 1);
    // Asked afterwards, the worker says why it is gone.
    match worker.status().await {
        Err(WorkerError::Stopped(why)) => {
            assert_eq!(why, "shut down on request: maintenance window")
        }
        other => panic!("expected Stopped, got {other:?}"),
    }
}
