//! `failure.destination = "sqs:QUEUE_URL"`: discarded records sent to an SQS queue, each
//! [`Envelope`] as one message whose body is its JSON, ten to a SendMessageBatch.
//!
//! A standard queue keeps no order and may deliver a message twice; the envelope names
//! its record (stream, shard, sequence and sub-sequence numbers), which is what a reader
//! of the queue sorts and de-duplicates by.

use std::ops::Range;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use futures::future::BoxFuture;

use super::destination::{DeadLetters, DestinationError, Envelope};
use crate::backend::aws::error_text;
use crate::settings::Destination;

/// The IAM actions a worker writing to a dead-letter queue makes, on that queue: IAM
/// authorizes SendMessageBatch as `sqs:SendMessage`. `tests/deploy.rs` keeps this equal
/// to the SDK calls in this file and the policies in `deploy/` to it.
pub const IAM_ACTIONS: &[&str] = &["sqs:SendMessage"];

/// The most SQS takes in one message, and in one SendMessageBatch (its messages
/// together): 256 KiB, what every queue has taken by default. A larger envelope is
/// refused here, saying so; it is never cut short, since a truncated dead letter would
/// lose the record the checkpoint then moves past.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The most entries one SendMessageBatch takes.
const MAX_BATCH_ENTRIES: usize = 10;

/// Sends envelopes to an SQS queue with SendMessageBatch.
#[derive(Debug, Clone)]
pub struct SqsDeadLetters {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

/// The SQS client of an AWS backend: `sdk` (with the call limits of
/// [`crate::backend::aws::Service::DeadLetters`]) and `aws.sqs_endpoint`.
pub(crate) fn client(sdk: &aws_config::SdkConfig, endpoint: Option<&str>) -> aws_sdk_sqs::Client {
    let mut config = aws_sdk_sqs::config::Builder::from(sdk);
    if let Some(url) = endpoint {
        config = config.endpoint_url(url);
    }
    aws_sdk_sqs::Client::from_conf(config.build())
}

impl SqsDeadLetters {
    /// A destination sending to the queue at `queue_url` with `client`. The requests go
    /// to the client's endpoint, whatever host the URL names (a local server's URL, or
    /// AWS's through a VPC endpoint), so the client decides where.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }

    fn error(&self, why: String) -> DestinationError {
        DestinationError {
            destination: self.name(),
            why,
        }
    }

    /// The message an envelope is sent as, refused when SQS would refuse it.
    fn body(&self, envelope: &Envelope) -> Result<String, DestinationError> {
        let what = || {
            format!(
                "the envelope of {} {} record {}",
                envelope.stream, envelope.shard, envelope.sequence_number
            )
        };
        let json = serde_json::to_string(envelope)
            .map_err(|e| self.error(format!("cannot encode {}: {e}", what())))?;
        let body = allowed_in_sqs(json);
        if body.len() > MAX_MESSAGE_BYTES {
            return Err(self.error(format!(
                "{} is {} bytes, more than an SQS message holds ({MAX_MESSAGE_BYTES}); it \
                 cannot be discarded to a queue: use a kinesis: or file: destination for \
                 records this large",
                what(),
                body.len()
            )));
        }
        Ok(body)
    }

    /// One SendMessageBatch; `batch` is these envelopes' indices in the caller's slice.
    async fn send(
        &self,
        envelopes: &[Envelope],
        bodies: &[String],
        batch: Range<usize>,
    ) -> Result<(), DestinationError> {
        let entries = bodies[batch.clone()]
            .iter()
            .enumerate()
            .map(|(id, body)| {
                SendMessageBatchRequestEntry::builder()
                    .id(id.to_string())
                    .message_body(body)
                    .build()
                    .map_err(|e| self.error(format!("cannot build the batch: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let answer = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| self.error(format!("SendMessageBatch: {}", error_text(&e))))?;
        if answer.failed().is_empty() {
            return Ok(());
        }
        let refused: Vec<String> = answer
            .failed()
            .iter()
            .map(|failed| {
                let record = failed
                    .id()
                    .parse::<usize>()
                    .ok()
                    .and_then(|id| envelopes.get(batch.start + id))
                    .map(|e| format!("record {} {}", e.shard, e.sequence_number))
                    .unwrap_or_else(|| format!("entry {:?}", failed.id()));
                format!(
                    "{record}: {} {}",
                    failed.code(),
                    failed.message().unwrap_or_default()
                )
                .trim_end()
                .to_owned()
            })
            .collect();
        Err(self.error(format!(
            "SendMessageBatch refused {} of {} messages: {}",
            refused.len(),
            batch.len(),
            refused.join("; ")
        )))
    }
}

/// `json` with the two characters SQS refuses that JSON lets through unescaped (U+FFFE
/// and U+FFFF, which a partition key or an error text may hold) written as escapes: the
/// text parses back to the same envelope, and SQS takes it. serde_json already escapes
/// the control characters SQS refuses.
fn allowed_in_sqs(json: String) -> String {
    if !json.contains(['\u{fffe}', '\u{ffff}']) {
        return json;
    }
    json.replace('\u{fffe}', "\\ufffe")
        .replace('\u{ffff}', "\\uffff")
}

/// `sizes` (each at most [`MAX_MESSAGE_BYTES`]) cut into SendMessageBatch calls, in
/// order: at most ten messages a call, and at most [`MAX_MESSAGE_BYTES`] together.
fn batches(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut batches = Vec::new();
    let mut start = 0;
    while start < sizes.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < sizes.len()
            && end - start < MAX_BATCH_ENTRIES
            && (end == start || bytes + sizes[end] <= MAX_MESSAGE_BYTES)
        {
            bytes += sizes[end];
            end += 1;
        }
        batches.push(start..end);
        start = end;
    }
    batches
}

impl DeadLetters for SqsDeadLetters {
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>> {
        Box::pin(async move {
            let bodies = envelopes
                .iter()
                .map(|envelope| self.body(envelope))
                .collect::<Result<Vec<_>, _>>()?;
            let sizes: Vec<usize> = bodies.iter().map(String::len).collect();
            for batch in batches(&sizes) {
                self.send(envelopes, &bodies, batch).await?;
            }
            Ok(())
        })
    }

    fn name(&self) -> String {
        Destination::Sqs(self.queue_url.clone()).to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::failure::file::tests::envelope;

    #[test]
    fn batches_hold_ten_messages_and_256_kib_at_most_in_order() {
        assert_eq!(batches(&[]), Vec::<Range<usize>>::new());
        assert_eq!(batches(&[100; 12]), [0..10, 10..12]);
        assert_eq!(batches(&[100; 20]), [0..10, 10..20]);
        let third = MAX_MESSAGE_BYTES / 3;
        assert_eq!(batches(&[third; 7]), [0..3, 3..6, 6..7]);
        assert_eq!(
            batches(&[MAX_MESSAGE_BYTES, 1, MAX_MESSAGE_BYTES - 1, 1, 1]),
            [0..1, 1..3, 3..5]
        );
        for sizes in [vec![1; 31], vec![90_000, 90_000, 90_000, 10, 90_000]] {
            let cut = batches(&sizes);
            let covered: Vec<usize> = cut.iter().flat_map(Clone::clone).collect();
            assert_eq!(covered, (0..sizes.len()).collect::<Vec<_>>());
            for batch in cut {
                assert!(batch.len() <= MAX_BATCH_ENTRIES);
                assert!(sizes[batch].iter().sum::<usize>() <= MAX_MESSAGE_BYTES);
            }
        }
    }

    #[test]
    fn characters_sqs_refuses_are_escaped_and_parse_back() {
        let mut sample = envelope(1, "");
        sample.partition_key = "a\u{fffe}b\u{ffff}c\u{7f}".into();
        let body = allowed_in_sqs(serde_json::to_string(&sample).unwrap());
        assert!(!body.contains(['\u{fffe}', '\u{ffff}']), "{body}");
        assert!(!body.chars().any(|c| c < ' '), "{body}");
        let back: Envelope = serde_json::from_str(&body).unwrap();
        assert_eq!(back, sample);
    }

    /// A client that reaches nothing: what is refused before any call is refused
    /// without one.
    fn unreachable() -> aws_sdk_sqs::Client {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "test", "test", None, None, "tests",
            ))
            .endpoint_url("http://127.0.0.1:1")
            .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    /// An SQS endpoint on loopback that answers every call with `body`.
    async fn answering(body: &'static str) -> aws_sdk_sqs::Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(move || async move {
            ([("content-type", "application/x-amz-json-1.0")], body)
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = unreachable()
            .config()
            .to_builder()
            .endpoint_url(url)
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    #[tokio::test]
    async fn a_refused_entry_fails_the_write_naming_its_record_and_only_failures_are_read() {
        let refused = answering(
            r#"{"Successful":[{"Id":"0","MessageId":"m","MD5OfMessageBody":"x"}],
                "Failed":[{"Id":"1","SenderFault":true,"Code":"InvalidMessageContents",
                           "Message":"bad characters"}]}"#,
        )
        .await;
        let dead = SqsDeadLetters::new(refused, "http://127.0.0.1:1/123456789012/dead");
        let envelopes: Vec<Envelope> = (0..12).map(|n| envelope(n, "")).collect();
        let error = dead.write(&envelopes).await.unwrap_err();
        assert_eq!(
            error.why,
            format!(
                "SendMessageBatch refused 1 of 10 messages: record shardId-000000000001 {}: \
                 InvalidMessageContents bad characters",
                envelopes[1].sequence_number
            )
        );
        // Nothing but the failures is needed of an answer.
        let terse = SqsDeadLetters::new(answering("{}").await, "http://127.0.0.1:1/1/dead");
        terse.write(&envelopes).await.unwrap();
    }

    #[tokio::test]
    async fn an_envelope_larger_than_a_message_is_refused_saying_so() {
        let url = "http://127.0.0.1:1/123456789012/dead";
        let dead = SqsDeadLetters::new(unreachable(), url);
        assert_eq!(dead.name(), format!("sqs:{url}"));
        let big = "A".repeat(MAX_MESSAGE_BYTES);
        let error = dead
            .write(&[envelope(1, ""), envelope(2, &big)])
            .await
            .unwrap_err();
        assert_eq!(error.destination, format!("sqs:{url}"));
        assert!(
            error.why.contains("more than an SQS message holds"),
            "{error}"
        );
        assert!(
            error.why.contains(&envelope(2, "").sequence_number),
            "{error}"
        );
        // One that fits goes to the server (here: none, which is a different error).
        let error = dead.write(&[envelope(1, "")]).await.unwrap_err();
        assert!(error.why.starts_with("SendMessageBatch: "), "{error}");
        assert!(dead.write(&[]).await.is_ok());
    }
}
