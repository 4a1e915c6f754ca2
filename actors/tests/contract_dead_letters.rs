//! The dead-letter destinations of `failure.destination` (issue 32), each against the
//! servers that can hold it, through the same adapters a worker writes with:
//!
//! * `kinesis:` ([`StreamDeadLetters`]) on every stream tier: `memory` (in-process, paused
//!   time), `ferrokinesis` (a Kinesis server started in this process) and, with the
//!   `external-servers` feature, `kinesis_mock` and `moto` (started by scripts/test.sh).
//!   Envelopes put to a fresh stream come back from it in order, each under its record's
//!   own partition key, its data the envelope's JSON; a stream that is not there is an
//!   error naming the destination.
//! * `sqs:` ([`SqsDeadLetters`]) on `moto`, which serves SQS on the port it serves
//!   Kinesis and DynamoDB on (behind scripts/moto-serial.py): more envelopes than one
//!   SendMessageBatch takes all come back, so do envelopes that must be sent in smaller
//!   batches to keep a batch within 256 KiB, an envelope too large for a message sends
//!   nothing, and a queue that is not there is an error naming the destination.
//! * `file:` needs no server: its unit tests (`actors/src/failure/file.rs`) cover it.
//!
//! Without the servers the external tiers fail loudly, never skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use flotilla_actors::backend::aws::KinesisStream;
use flotilla_actors::backend::memory::{MemoryStreams, MemoryStreamsConfig};
use flotilla_actors::backend::{IteratorPosition, Record, StreamAdmin};
use flotilla_actors::failure::{DeadLetters, Envelope, StreamDeadLetters};
use support::servers;

/// The stream service of a tier, and the tier's name for messages.
struct Streams {
    admin: Arc<dyn StreamAdmin>,
    tier: &'static str,
}

impl Streams {
    async fn memory() -> Streams {
        Streams {
            admin: Arc::new(MemoryStreams::new(MemoryStreamsConfig::default())),
            tier: "memory",
        }
    }

    async fn ferrokinesis() -> Streams {
        let endpoint = servers::start_ferrokinesis(300).await;
        Streams::server(&endpoint, "ferrokinesis")
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn kinesis_mock() -> Streams {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT");
        Streams::server(&endpoint, "kinesis_mock")
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn moto() -> Streams {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
        Streams::server(&endpoint, "moto")
    }

    /// The real Kinesis adapter at `endpoint`.
    fn server(endpoint: &str, tier: &'static str) -> Streams {
        Streams {
            admin: Arc::new(KinesisStream::new(&servers::sdk_config(), Some(endpoint))),
            tier,
        }
    }

    /// A fresh stream of one shard, so that the order of everything put is the order
    /// read.
    async fn fresh(&self) -> String {
        let name = servers::unique_name("dead-letters");
        self.admin.create_stream(&name, 1).await.unwrap();
        name
    }

    /// Every record of `stream`'s one shard, read until there are `want` of them (a
    /// server may answer a read or two with nothing first).
    async fn read(&self, stream: &str, want: usize) -> Vec<Record> {
        let shards = self.admin.list_shards(stream).await.unwrap();
        assert_eq!(shards.len(), 1, "{}: {shards:?}", self.tier);
        let mut iterator = self
            .admin
            .get_shard_iterator(stream, &shards[0].id, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        let mut records = Vec::new();
        for _ in 0..100 {
            let batch = self.admin.get_records(&iterator, 1000).await.unwrap();
            records.extend(batch.records);
            if records.len() >= want {
                break;
            }
            iterator = batch
                .next_iterator
                .expect("an open shard has a next iterator");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        records
    }
}

/// The base64 of `bytes` bytes, as an envelope carries a record's data.
fn base64_of(bytes: usize) -> String {
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A discarded record's envelope; `data` is already base64.
fn envelope(n: u64, key: &str, data: String) -> Envelope {
    let even = n.is_multiple_of(2);
    Envelope {
        stream: "orders".into(),
        shard: "shardId-000000000003".into(),
        sequence_number: format!("{:056}", 49_000_000 + n),
        sub_sequence_number: n % 2,
        partition_key: key.into(),
        arrival_ms: (!n.is_multiple_of(3)).then_some(1_700_000_000_000 + n),
        discarded_ms: 1_700_000_500_000 + n,
        reason: if even { "retries" } else { "age" }.into(),
        attempts: 4,
        error: even.then(|| format!("record {n} failed: \"bad\"\n")),
        worker: "worker-a".into(),
        data,
    }
}

mod cases {
    use super::*;

    pub async fn envelopes_come_back_from_the_stream_in_order_under_their_own_keys(
        streams: Streams,
    ) {
        let stream = streams.fresh().await;
        let dead = StreamDeadLetters::new(streams.admin.clone(), &stream);
        assert_eq!(dead.name(), format!("kinesis:{stream}"));
        let envelopes = vec![
            envelope(1, "customer-7", base64_of(16)),
            envelope(2, "customer-3", base64_of(1024)),
            envelope(3, "customer-7", String::new()),
        ];
        dead.write(&envelopes).await.unwrap();

        let records = streams.read(&stream, envelopes.len()).await;
        let tier = streams.tier;
        assert_eq!(records.len(), envelopes.len(), "{tier}: {records:?}");
        for (record, sent) in records.iter().zip(&envelopes) {
            assert_eq!(record.partition_key, sent.partition_key, "{tier}");
            let back: Envelope = serde_json::from_slice(&record.data)
                .unwrap_or_else(|e| panic!("{tier}: the record's data is not an envelope: {e}"));
            assert_eq!(&back, sent, "{tier}");
        }
        // A second write appends after the first.
        let more = vec![envelope(4, "customer-9", base64_of(3))];
        dead.write(&more).await.unwrap();
        let records = streams.read(&stream, envelopes.len() + 1).await;
        let last: Envelope = serde_json::from_slice(&records[envelopes.len()].data).unwrap();
        assert_eq!(last, more[0], "{tier}");
    }

    pub async fn a_stream_that_is_not_there_is_an_error_naming_the_destination(streams: Streams) {
        let stream = servers::unique_name("no-such-stream");
        let dead = StreamDeadLetters::new(streams.admin.clone(), &stream);
        let error = dead
            .write(&[envelope(1, "k", base64_of(4))])
            .await
            .expect_err("a write to a missing stream");
        assert_eq!(error.destination, format!("kinesis:{stream}"), "{error}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("kinesis:{stream}: ")),
            "{}: {error}",
            streams.tier
        );
    }
}

macro_rules! stream_cases {
    ($env:expr, $test:meta) => {
        stream_cases!(@cases [$test] $env;
            envelopes_come_back_from_the_stream_in_order_under_their_own_keys,
            a_stream_that_is_not_there_is_an_error_naming_the_destination,
        );
    };
    (@cases [$test:meta] $env:expr; $($case:ident),* $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                cases::$case($env).await
            }
        )*
    };
}

mod memory {
    use super::*;
    stream_cases!(Streams::memory().await, tokio::test(start_paused = true));
}

mod ferrokinesis {
    use super::*;
    stream_cases!(
        Streams::ferrokinesis().await,
        tokio::test(flavor = "multi_thread", worker_threads = 2)
    );
}

#[cfg(feature = "external-servers")]
mod kinesis_mock {
    use super::*;
    stream_cases!(
        Streams::kinesis_mock().await,
        tokio::test(flavor = "multi_thread", worker_threads = 2)
    );
}

/// Kinesis and SQS both, on the one port moto serves every service on.
#[cfg(feature = "external-servers")]
mod moto {
    use super::*;
    use flotilla_actors::failure::SqsDeadLetters;
    use flotilla_actors::failure::sqs::MAX_MESSAGE_BYTES;

    stream_cases!(
        Streams::moto().await,
        tokio::test(flavor = "multi_thread", worker_threads = 2)
    );

    /// An SQS client of moto's, as `Backend::aws` builds one: requests go to the
    /// endpoint, the queue's URL is a parameter.
    fn sqs() -> aws_sdk_sqs::Client {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
        let config = aws_sdk_sqs::config::Builder::from(&servers::sdk_config())
            .endpoint_url(endpoint)
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    async fn fresh_queue(client: &aws_sdk_sqs::Client) -> String {
        let created = client
            .create_queue()
            .queue_name(servers::unique_name("dead-letters"))
            .send()
            .await
            .unwrap();
        created
            .queue_url()
            .expect("CreateQueue names the URL")
            .to_owned()
    }

    /// Every message of `queue`, received until `want` have come (then once more, to
    /// see that nothing else is there), as envelopes sorted by sequence number. Messages
    /// stay invisible for ten minutes once received: none comes twice. No long polling:
    /// moto serves one request at a time, and a waiting receive would hold up the rest.
    async fn receive(client: &aws_sdk_sqs::Client, queue: &str, want: usize) -> Vec<Envelope> {
        let mut received = Vec::new();
        let mut empty_after_all = false;
        for _ in 0..100 {
            let answer = client
                .receive_message()
                .queue_url(queue)
                .max_number_of_messages(10)
                .visibility_timeout(600)
                .send()
                .await
                .unwrap();
            let messages = answer.messages();
            if messages.is_empty() && received.len() >= want {
                empty_after_all = true;
                break;
            }
            for message in messages {
                let body = message.body().expect("a message has a body");
                let envelope: Envelope = serde_json::from_str(body)
                    .unwrap_or_else(|e| panic!("a message is not an envelope: {e}: {body:.200}"));
                received.push(envelope);
            }
            if messages.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        assert!(empty_after_all, "received {} of {want}", received.len());
        received.sort_by(|a, b| a.sequence_number.cmp(&b.sequence_number));
        received
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_gets_every_envelope_of_a_write_longer_than_one_batch() {
        let client = sqs();
        let queue = fresh_queue(&client).await;
        let dead = SqsDeadLetters::new(client.clone(), &queue);
        assert_eq!(dead.name(), format!("sqs:{queue}"));
        let envelopes: Vec<Envelope> = (0..12)
            .map(|n| {
                envelope(
                    n,
                    &format!("customer-{}", n % 5),
                    base64_of(n as usize * 100),
                )
            })
            .collect();
        dead.write(&envelopes).await.unwrap();
        assert_eq!(receive(&client, &queue, envelopes.len()).await, envelopes);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_are_cut_to_fit_256_kib_and_a_larger_envelope_sends_nothing() {
        let client = sqs();
        let queue = fresh_queue(&client).await;
        let dead = SqsDeadLetters::new(client.clone(), &queue);
        // About 100 KB each: two fit in a batch, three do not.
        let envelopes: Vec<Envelope> = (0..5)
            .map(|n| envelope(n, "customer-1", base64_of(75_000)))
            .collect();
        dead.write(&envelopes).await.unwrap();
        assert_eq!(receive(&client, &queue, envelopes.len()).await, envelopes);

        // An envelope over 256 KiB is refused before anything of the write is sent.
        let too_large = envelope(9, "customer-2", base64_of(MAX_MESSAGE_BYTES));
        let error = dead
            .write(&[envelope(8, "customer-2", base64_of(10)), too_large])
            .await
            .expect_err("an envelope larger than a message");
        assert_eq!(error.destination, format!("sqs:{queue}"));
        assert!(
            error.why.contains("more than an SQS message holds"),
            "{error}"
        );
        assert_eq!(receive(&client, &queue, 0).await, Vec::<Envelope>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_that_is_not_there_is_an_error_naming_the_destination() {
        let client = sqs();
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
        let queue = format!(
            "{endpoint}/123456789012/{}",
            servers::unique_name("no-such-queue")
        );
        let dead = SqsDeadLetters::new(client, &queue);
        let error = dead
            .write(&[envelope(1, "k", base64_of(4))])
            .await
            .expect_err("a write to a missing queue");
        eprintln!("moto: a missing queue: {error}");
        assert_eq!(error.destination, format!("sqs:{queue}"));
        assert!(
            error.to_string().starts_with(&format!("sqs:{queue}: ")),
            "{error}"
        );
    }
}
