//! `[failure]` end to end on servers that speak the AWS wire protocols: a worker built
//! with `Backend::from_sdk` from its own settings, as `flotilla run` builds one, reads a
//! stream with poison records, and `failure.destination` is opened from the setting and
//! written over the real adapters: `kinesis:` on in-process ferrokinesis (always), on
//! kinesis-mock and on moto; `sqs:` on moto (both with the `external-servers` feature,
//! servers started by scripts/test.sh). Real time and real sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::backend::aws::KinesisStream;
use flotilla_actors::backend::{IteratorPosition, PutRecord, StreamAdmin, StreamClient};
use flotilla_actors::failure::Envelope;
use flotilla_actors::settings::Destination;
use flotilla_actors::{Backend, Batch, Checkpointer, Processor, ProcessorError, Worker};
use support::probe::fast_settings;
use support::servers;

/// Processes every part of a batch holding no poison record; refuses the others whole.
struct Refusing(Arc<Mutex<Vec<String>>>);

impl Processor for Refusing {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let records = batch.records();
        if records.iter().any(|r| r.data.starts_with(b"poison")) {
            return Err(ProcessorError::msg("cannot parse the record"));
        }
        let mut processed = self.0.lock().unwrap();
        processed.extend(
            records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.data).into_owned()),
        );
        Ok(())
    }
}

/// What receives discarded records in a test, and how to read them back.
enum DeadLetters {
    Stream(String),
    Queue(aws_sdk_sqs::Client, String),
}

impl DeadLetters {
    fn destination(&self) -> Destination {
        match self {
            DeadLetters::Stream(name) => Destination::Kinesis(name.clone()),
            DeadLetters::Queue(_, url) => Destination::Sqs(url.clone()),
        }
    }

    /// Every envelope written so far.
    async fn read(&self, kinesis: &KinesisStream) -> Vec<Envelope> {
        match self {
            DeadLetters::Stream(stream) => {
                let shards = kinesis.list_shards(stream).await.unwrap();
                let iterator = kinesis
                    .get_shard_iterator(stream, &shards[0].id, &IteratorPosition::TrimHorizon)
                    .await
                    .unwrap();
                let batch = kinesis.get_records(&iterator, 1000).await.unwrap();
                batch
                    .records
                    .iter()
                    .map(|r| serde_json::from_slice(&r.data).unwrap())
                    .collect()
            }
            DeadLetters::Queue(client, url) => {
                let answer = client
                    .receive_message()
                    .queue_url(url)
                    .max_number_of_messages(10)
                    .visibility_timeout(600)
                    .send()
                    .await
                    .unwrap();
                answer
                    .messages()
                    .iter()
                    .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
                    .collect()
            }
        }
    }
}

/// 40 records over 4 keys in one shard, two of them poison: both end in the
/// destination, with their keys, and nothing else does; every other record is processed
/// once, in order.
async fn poison_records_reach_the_destination(
    kinesis_endpoint: String,
    dynamodb_endpoint: String,
    sqs_endpoint: Option<String>,
) {
    let sdk = servers::sdk_config();
    let kinesis = KinesisStream::new(&sdk, Some(&kinesis_endpoint));
    let stream = servers::unique_name("failure");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let dead = match &sqs_endpoint {
        None => {
            let name = servers::unique_name("failure-dead");
            kinesis.create_stream(&name, 1).await.unwrap();
            DeadLetters::Stream(name)
        }
        Some(endpoint) => {
            let config = aws_sdk_sqs::config::Builder::from(&sdk)
                .endpoint_url(endpoint)
                .build();
            let client = aws_sdk_sqs::Client::from_conf(config);
            let created = client
                .create_queue()
                .queue_name(servers::unique_name("failure-dead"))
                .send()
                .await
                .unwrap();
            let url = created.queue_url().expect("CreateQueue names the URL");
            DeadLetters::Queue(client, url.to_owned())
        }
    };
    let records: Vec<PutRecord> = (0..40)
        .map(|i| PutRecord {
            partition_key: format!("k{}", i % 4),
            explicit_hash_key: None,
            data: if i == 11 || i == 30 {
                format!("poison-{i}").into()
            } else {
                format!("good-{i}").into()
            },
        })
        .collect();
    kinesis.put_records(&stream, &records).await.unwrap();

    let mut settings = fast_settings(&stream, &servers::unique_name("failure-app"));
    settings.aws.kinesis_endpoint = Some(kinesis_endpoint.clone());
    settings.aws.dynamodb_endpoint = Some(dynamodb_endpoint);
    settings.aws.sqs_endpoint = sqs_endpoint;
    settings.metrics.level = flotilla_actors::settings::MetricsLevel::None;
    settings.failure.max_retries = Some(1);
    settings.failure.bisect = true;
    settings.failure.destination = Some(dead.destination());
    settings.supervision.restart_backoff_min = Duration::from_millis(5);
    settings.supervision.restart_backoff_max = Duration::from_millis(50);
    let processed = Arc::new(Mutex::new(Vec::new()));
    let p = processed.clone();
    let worker = Worker::builder()
        .backend(Backend::from_sdk(&sdk, &settings.aws))
        .settings(settings)
        .processor(move |_| Refusing(p.clone()))
        .start()
        .await
        .unwrap();

    let mut written = Vec::new();
    for _ in 0..600 {
        written.extend(dead.read(&kinesis).await);
        if processed.lock().unwrap().len() == 38 && written.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let DeadLetters::Stream(_) = dead {
            // A stream is read from its start each time.
            written.clear();
        }
    }
    let report = worker.shutdown().await.unwrap();
    assert!(report.clean(), "{report:#?}");
    let expected: Vec<String> = (0..40)
        .filter(|i| *i != 11 && *i != 30)
        .map(|i| format!("good-{i}"))
        .collect();
    assert_eq!(*processed.lock().unwrap(), expected, "once each, in order");
    let mut keys: Vec<(String, String)> = written
        .iter()
        .map(|e| (e.partition_key.clone(), e.reason.clone()))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            ("k2".to_owned(), "retries".to_owned()),
            ("k3".to_owned(), "retries".to_owned())
        ],
        "{written:?}"
    );
    assert!(written.iter().all(|e| e.stream == stream));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrokinesis_dynoxide_kinesis_destination() {
    let kinesis = servers::start_ferrokinesis(300).await;
    let dynamodb = servers::start_dynoxide().await;
    poison_records_reach_the_destination(kinesis, dynamodb, None).await;
}

#[cfg(feature = "external-servers")]
mod external {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kinesis_mock_dynamodb_local_kinesis_destination() {
        poison_records_reach_the_destination(
            servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
            servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
            None,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn moto_kinesis_destination() {
        let moto = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
        poison_records_reach_the_destination(moto.clone(), moto, None).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn moto_sqs_destination() {
        let moto = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
        poison_records_reach_the_destination(moto.clone(), moto.clone(), Some(moto)).await;
    }
}
