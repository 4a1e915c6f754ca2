//! `flotilla consumer list` and `consumer deregister`: a stream's enhanced fan-out
//! consumers.

use std::io::Write as _;

use anyhow::{Context as _, bail};
use flotilla_actors::backend::{StreamClient as _, StreamError};

use crate::cli::{DeregisterArgs, StreamArgs};

/// `flotilla consumer list`: one JSON line per consumer.
pub(super) async fn list(args: StreamArgs) -> anyhow::Result<()> {
    let (client, arn) = args.open().await?;
    let mut consumers = client
        .list_stream_consumers(&arn)
        .await
        .with_context(|| format!("cannot list the consumers of stream {}", args.stream))?;
    consumers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = std::io::stdout().lock();
    for consumer in &consumers {
        let created = consumer
            .created
            .map(|at| humantime::format_rfc3339_seconds(at).to_string());
        let line = serde_json::json!({
            "name": consumer.name,
            "status": consumer.status.to_string(),
            "created": created,
            "arn": consumer.arn,
        });
        writeln!(out, "{line}")?;
    }
    eprintln!(
        "flotilla: stream {} has {} of at most {} enhanced fan-out consumers",
        args.stream,
        consumers.len(),
        flotilla_actors::fanout::MAX_CONSUMERS
    );
    Ok(())
}

/// `flotilla consumer deregister`: by its ARN, once looked up by name.
pub(super) async fn deregister(args: DeregisterArgs) -> anyhow::Result<()> {
    let (client, arn) = args.stream.open().await?;
    let stream = &args.stream.stream;
    let consumer = match client.describe_stream_consumer(&arn, &args.name).await {
        Ok(consumer) => consumer,
        Err(StreamError::NotFound { .. }) => bail!(
            "stream {stream} has no consumer named {}; `flotilla consumer list --stream \
             {stream}` shows those it has",
            args.name
        ),
        Err(error) => {
            return Err(anyhow::Error::new(error))
                .with_context(|| format!("cannot look up consumer {}", args.name));
        }
    };
    // By its ARN: by name, moto deletes the stream's other consumers instead.
    client
        .deregister_stream_consumer(&consumer.arn)
        .await
        .with_context(|| format!("cannot deregister consumer {}", args.name))?;
    println!(
        "consumer {} of stream {stream}: deregistered (was {}; Kinesis deletes it \
         within seconds, ending its subscriptions)",
        args.name, consumer.status
    );
    Ok(())
}
