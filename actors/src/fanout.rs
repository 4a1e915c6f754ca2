//! The enhanced fan-out consumer of an application: registered once per stream by
//! whichever worker starts first, found by the others, and waited for until ACTIVE.
//!
//! As the Java KCL does it: DescribeStreamConsumer by name first (a fleet restarting
//! finds its consumer without a write), RegisterStreamConsumer when there is none, and
//! `ResourceInUse` from the register taken as "another worker just did", never as a
//! failure. A stream has at most 20 consumers; Kinesis says so with the same
//! `LimitExceededException` it uses for its call rate, so a refused registration is
//! told apart by counting the stream's consumers.

use std::time::Duration;

use tracing::{info, warn};

use crate::backend::{Consumer, ConsumerStatus, StreamClient, StreamError};
use crate::backoff::Backoff;

/// The most enhanced fan-out consumers Kinesis allows per stream.
pub const MAX_CONSUMERS: usize = 20;

/// How often a consumer is described while it is CREATING: from 50 ms (an emulator
/// activates it at once) doubling to 1 s (Kinesis takes seconds; DescribeStreamConsumer
/// allows 20 calls a second per stream, shared by the fleet), with jitter.
const ACTIVE_POLL_MIN: Duration = Duration::from_millis(50);
const ACTIVE_POLL_MAX: Duration = Duration::from_secs(1);

/// How long a worker waits for a fan-out consumer to be ACTIVE: at start, and for a
/// stream that joins the set while running.
pub(crate) const CONSUMER_WAIT: Duration = Duration::from_secs(120);

/// Why the application's consumer could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The stream already has [`MAX_CONSUMERS`] consumers and this one is not among them: an
    /// operator must deregister one, or the application must poll. Retrying does not help.
    #[error(
        "enhanced fan-out: stream {stream} already has {count} registered consumers, the most \
         Kinesis allows ({MAX_CONSUMERS}); deregister one (`flotilla consumer list`, \
         `flotilla consumer deregister --name NAME`) or read with reader.mode = \"polling\". \
         Consumers: {names}"
    )]
    Limit {
        /// The stream's name.
        stream: String,
        /// Consumers the stream has.
        count: usize,
        /// Their names, comma-separated, to choose one to deregister.
        names: String,
    },
    /// The consumer was not ACTIVE within the wait (or retryable errors lasted as long); a later
    /// start may find it ACTIVE.
    #[error(
        "enhanced fan-out: consumer {name} of stream {stream} is still {status} after {} \
         (Kinesis usually activates a consumer within seconds)",
        humantime::format_duration(*.waited)
    )]
    NotActive {
        /// The stream's name.
        stream: String,
        /// The consumer's name.
        name: String,
        /// The last status seen (`CREATING` when none was).
        status: ConsumerStatus,
        /// How long it was waited for.
        waited: Duration,
    },
    /// A Kinesis call failed with an error not retried here (e.g. no such stream, access denied).
    #[error("enhanced fan-out: consumer {name} of stream {stream}")]
    Stream {
        /// The stream's name.
        stream: String,
        /// The consumer's name.
        name: String,
        /// The call's error.
        #[source]
        source: StreamError,
    },
}

/// Finds or registers consumer `name` of `stream` (`stream_arn`) and waits, at most
/// `wait`, until it is ACTIVE; retryable errors are retried with backoff until then.
pub async fn ensure_consumer(
    streams: &dyn StreamClient,
    stream: &str,
    stream_arn: &str,
    name: &str,
    wait: Duration,
) -> Result<Consumer, ConsumerError> {
    let started = tokio::time::Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut active_poll = Backoff::new(ACTIVE_POLL_MIN, ACTIVE_POLL_MAX);
    let failed = |source: StreamError| ConsumerError::Stream {
        stream: stream.to_owned(),
        name: name.to_owned(),
        source,
    };
    let mut last_status = ConsumerStatus::Creating;
    let mut announced = false;
    loop {
        let pause = match streams.describe_stream_consumer(stream_arn, name).await {
            Ok(consumer) if consumer.status == ConsumerStatus::Active => {
                info!(
                    message = "Enhanced fan-out consumer ready.",
                    stream,
                    consumer = name,
                    consumer_arn = %consumer.arn,
                );
                return Ok(consumer);
            }
            Ok(consumer) => {
                if !announced {
                    info!(message = "Waiting for the fan-out consumer to be ACTIVE.", stream, consumer = name, status = %consumer.status);
                    announced = true;
                }
                last_status = consumer.status;
                active_poll.next_random()
            }
            Err(StreamError::NotFound { .. }) => {
                match streams.register_stream_consumer(stream_arn, name).await {
                    Ok(consumer) => {
                        info!(message = "Registered the enhanced fan-out consumer.", stream, consumer = name, consumer_arn = %consumer.arn);
                        last_status = consumer.status;
                        Duration::ZERO
                    }
                    // Another worker of the fleet registered it first.
                    Err(StreamError::InUse { .. }) => Duration::ZERO,
                    Err(error @ StreamError::Throttled { .. }) => {
                        let consumers = streams
                            .list_stream_consumers(stream_arn)
                            .await
                            .map_err(failed)?;
                        if consumers.len() >= MAX_CONSUMERS {
                            return Err(ConsumerError::Limit {
                                stream: stream.to_owned(),
                                count: consumers.len(),
                                names: consumers
                                    .iter()
                                    .map(|c| c.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", "),
                            });
                        }
                        warn!(message = "Registering the fan-out consumer was throttled; retrying.", stream, consumer = name, %error);
                        backoff.next_random()
                    }
                    Err(error) if error.is_retryable() => backoff.next_random(),
                    Err(error) => return Err(failed(error)),
                }
            }
            Err(error) if error.is_retryable() => backoff.next_random(),
            Err(error) => return Err(failed(error)),
        };
        if started.elapsed() >= wait {
            return Err(ConsumerError::NotActive {
                stream: stream.to_owned(),
                name: name.to_owned(),
                status: last_status,
                waited: started.elapsed(),
            });
        }
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::backend::StreamAdmin;
    use crate::backend::memory::{MemoryStreams, MemoryStreamsConfig};

    async fn stream() -> (MemoryStreams, String) {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream("orders", 1).await.unwrap();
        let arn = streams.describe_stream_summary("orders").await.unwrap().arn;
        (streams, arn)
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_starting_at_once_registers_one_consumer_and_all_wait_for_it() {
        let (streams, arn) = stream().await;
        let all =
            futures::future::join_all((0..5).map(|_| {
                ensure_consumer(&streams, "orders", &arn, "app", Duration::from_secs(30))
            }))
            .await;
        let arns: Vec<String> = all.into_iter().map(|c| c.unwrap().arn).collect();
        assert!(arns.iter().all(|a| a == &arns[0]), "{arns:?}");
        let listed = streams.list_stream_consumers(&arn).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].status, ConsumerStatus::Active);
    }

    #[tokio::test(start_paused = true)]
    async fn the_consumer_limit_is_an_error_naming_the_stream_and_the_limit() {
        let (streams, arn) = stream().await;
        for n in 0..MAX_CONSUMERS {
            streams
                .register_stream_consumer(&arn, &format!("other-{n}"))
                .await
                .unwrap();
        }
        let error = ensure_consumer(&streams, "orders", &arn, "app", Duration::from_secs(30))
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, ConsumerError::Limit { count: 20, .. }),
            "{text}"
        );
        assert!(
            text.contains("stream orders") && text.contains("(20)"),
            "{text}"
        );
        assert!(text.contains("other-0"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_consumer_that_never_activates_is_an_error_after_the_wait() {
        let streams = MemoryStreams::new(MemoryStreamsConfig {
            consumer_activation: Duration::from_secs(3600),
            ..MemoryStreamsConfig::default()
        });
        streams.create_stream("orders", 1).await.unwrap();
        let arn = streams.describe_stream_summary("orders").await.unwrap().arn;
        let error = ensure_consumer(&streams, "orders", &arn, "app", Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &error,
                ConsumerError::NotActive {
                    status: ConsumerStatus::Creating,
                    ..
                }
            ),
            "{error}"
        );
    }
}
