//! `[aws]` call timeouts and retries reach every client an AWS backend makes, whoever
//! built the SDK configuration: each call goes to a server that accepts connections and
//! never answers, and the attempts it sees are counted (never the time taken).
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use flotilla_actors::backend::{MetricDatum, MetricValue, Unit};
use flotilla_actors::model::LeaseKey;
use flotilla_actors::{AwsSettings, Backend};
use tokio::net::TcpListener;

use support::servers;

/// A server that takes every connection and never says a word. Each attempt of a call
/// opens one connection (an abandoned attempt's connection is not reused), so the
/// connections it accepted are the attempts made.
async fn silent_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (url, accepted)
}

/// A backend whose three services are each a silent server of their own.
async fn silent_backend(tune: impl Fn(&mut AwsSettings)) -> (Backend, [Arc<AtomicUsize>; 3]) {
    let (kinesis, kinesis_attempts) = silent_server().await;
    let (dynamodb, dynamodb_attempts) = silent_server().await;
    let (cloudwatch, cloudwatch_attempts) = silent_server().await;
    let mut settings = AwsSettings {
        region: Some("us-east-1".to_owned()),
        kinesis_endpoint: Some(kinesis),
        dynamodb_endpoint: Some(dynamodb),
        cloudwatch_endpoint: Some(cloudwatch),
        ..AwsSettings::default()
    };
    tune(&mut settings);
    // The tests' SDK configuration has timeouts of its own (10 s an attempt, 30 s a
    // call): the settings must replace them.
    let backend = Backend::from_sdk(&servers::sdk_config(), &settings);
    (
        backend,
        [kinesis_attempts, dynamodb_attempts, cloudwatch_attempts],
    )
}

/// One call to each service; each must fail (nobody answers).
async fn call_each(backend: &Backend) {
    let stream = backend.streams().describe_stream_summary("orders").await;
    assert!(stream.is_err(), "{stream:?}");
    let lease = backend
        .lease_table("timeouts-app")
        .get(&LeaseKey::new("shardId-000000000000"))
        .await;
    assert!(lease.is_err(), "{lease:?}");
    let datum = MetricDatum {
        name: "RecordsProcessed".to_owned(),
        dimensions: Vec::new(),
        value: MetricValue::Value(1.0),
        unit: Unit::Count,
        timestamp: SystemTime::now(),
    };
    let put = backend.metrics_sink().put("flotilla", vec![datum]).await;
    assert!(put.is_err(), "{put:?}");
}

fn attempts(counters: &[Arc<AtomicUsize>; 3]) -> [usize; 3] {
    counters.each_ref().map(|c| c.load(Ordering::SeqCst))
}

#[tokio::test]
async fn an_attempt_that_overruns_attempt_timeout_is_retried_up_to_max_attempts() {
    let (backend, counters) = silent_backend(|aws| {
        aws.attempt_timeout = Some(Duration::from_millis(200));
        aws.max_attempts = 3;
    })
    .await;
    call_each(&backend).await;
    assert_eq!(
        attempts(&counters),
        [3, 3, 3],
        "kinesis, dynamodb, cloudwatch"
    );
}

#[tokio::test]
async fn one_attempt_when_max_attempts_is_one() {
    let (backend, counters) = silent_backend(|aws| {
        aws.attempt_timeout = Some(Duration::from_millis(200));
        aws.max_attempts = 1;
    })
    .await;
    call_each(&backend).await;
    assert_eq!(
        attempts(&counters),
        [1, 1, 1],
        "kinesis, dynamodb, cloudwatch"
    );
}

/// Each service's call timeout is its own: the one set short ends its call during the
/// first attempt (no retry, although two attempts are allowed), while the others' calls
/// make both their attempts (each ended by the attempt timeout).
#[tokio::test]
async fn each_service_call_ends_at_its_own_timeout() {
    let short = Duration::from_millis(300);
    for service in 0..3 {
        let (backend, counters) = silent_backend(|aws| {
            aws.attempt_timeout = Some(Duration::from_secs(1));
            aws.max_attempts = 2;
            match service {
                0 => aws.kinesis_timeout = short,
                1 => aws.dynamodb_timeout = short,
                _ => aws.cloudwatch_timeout = short,
            }
        })
        .await;
        call_each(&backend).await;
        let mut expected = [2, 2, 2];
        expected[service] = 1;
        assert_eq!(
            attempts(&counters),
            expected,
            "kinesis, dynamodb, cloudwatch; the short one: {service}"
        );
    }
}

/// A fan-out subscription lasts up to five minutes by design: `aws.kinesis_timeout`
/// bounds SubscribeToShard until its first answer, never the events that follow. A
/// subscription made with a 500 ms call timeout still delivers records put seconds later
/// (ferrokinesis, in this process).
#[tokio::test]
async fn a_subscription_outlives_the_kinesis_call_timeout() {
    use bytes::Bytes;
    use flotilla_actors::backend::aws::KinesisStream;
    use flotilla_actors::backend::{IteratorPosition, PutRecord, StreamAdmin};
    use flotilla_actors::model::ShardId;

    let kinesis = servers::start_ferrokinesis(300).await;
    let admin = KinesisStream::new(&servers::sdk_config(), Some(&kinesis));
    let stream = servers::unique_name("outlive");
    admin.create_stream(&stream, 1).await.unwrap();
    let settings = AwsSettings {
        region: Some("us-east-1".to_owned()),
        kinesis_endpoint: Some(kinesis.clone()),
        kinesis_timeout: Duration::from_millis(500),
        ..AwsSettings::default()
    };
    let backend = Backend::from_sdk(&servers::sdk_config(), &settings);
    let client = backend.streams();
    let arn = client.describe_stream_summary(&stream).await.unwrap().arn;
    let consumer = flotilla_actors::fanout::ensure_consumer(
        client.as_ref(),
        &stream,
        &arn,
        &servers::unique_name("consumer"),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let shard = ShardId::from_index(0);
    let mut subscription = client
        .subscribe_to_shard(&consumer.arn, &shard, &IteratorPosition::TrimHorizon)
        .await
        .unwrap();
    // Three call timeouts pass with the subscription open.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let put = PutRecord {
        data: Bytes::from_static(b"late"),
        partition_key: "k".to_owned(),
        explicit_hash_key: None,
    };
    admin.put_records(&stream, &[put]).await.unwrap();
    let received = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match subscription.next_event().await {
                Ok(Some(event)) if !event.records.is_empty() => break Ok(event.records),
                Ok(Some(_)) => {}
                Ok(None) => break Err("the subscription ended".to_owned()),
                Err(error) => break Err(error.to_string()),
            }
        }
    })
    .await
    .expect("no event within 20 s");
    let records = received.unwrap();
    assert_eq!(records[0].data, Bytes::from_static(b"late"));
}
