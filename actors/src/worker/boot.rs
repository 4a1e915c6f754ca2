//! The boot step: every kind of source the settings can name, resolved once into what
//! the worker reads, before any actor starts.
//!
//! * A stream set ([`StreamSet`]) gives its first answer, which becomes
//!   `worker.streams` ([`adopt_set`]).
//! * From the settings alone ([`plan`]): one source (`worker.stream`: a Kinesis stream
//!   by name, a DynamoDB table's stream by its ARN or as `dynamodb:TABLE`) or several
//!   Kinesis streams (`worker.streams`), and in fan-out mode the consumer's name.
//! * Then the calls ([`resolve`]): each stream described (a table's stream named by its
//!   ARN from then on), each multi-stream one identified as its lease keys name it, the
//!   fan-out consumer found or registered on each; then the lease table made, and a
//!   single stream's rows checked to be its own (`model::origin`).
//!
//! Every stream is resolved before the table is made: a misspelt stream must not leave
//! a billable table behind. Start-up calls ride out throttling and brief outages
//! ([`retrying`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::info;

use super::backend::Backend;
use super::error::WorkerError;
use crate::backend::{LeaseError, LeaseTable, StreamClient, StreamError, StreamSummary};
use crate::fanout::CONSUMER_WAIT;
use crate::model::origin::StreamOrigin;
use crate::model::{Checkpoint, ConsumedStream, ConsumedStreams, Source, SourceKind};
use crate::settings::{
    InitialPosition, ReadMode, Settings, SettingsError, StatusSettings, StreamSpec,
};
use crate::stream_set::StreamSet;

/// A stream set's first answer is the start's `worker.streams`: checked and resolved as
/// a list from the file is. Returns the set when it changes (the watcher asks it again
/// at every shard sync), `None` when it is fixed or there is none.
pub(crate) async fn adopt_set(
    settings: &mut Settings,
    set: Option<StreamSet>,
) -> Result<Option<StreamSet>, WorkerError> {
    let Some(set) = set else {
        return Ok(None);
    };
    let list = set.current().await.map_err(WorkerError::StreamSet)?;
    crate::model::check_list(&list.iter().map(StreamSpec::wanted).collect::<Vec<_>>())
        .map_err(WorkerError::StreamSet)?;
    settings.worker.stream.clear();
    settings.worker.streams = list.iter().map(StreamSpec::entry).collect();
    Ok(set.changes().then_some(set))
}

/// What the settings ask to read, decided before any call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Wanted {
    /// `worker.stream`: one source of either kind.
    One {
        source: Source,
        /// As the settings spell it (`dynamodb:TABLE` until resolved).
        name: String,
        initial: Checkpoint,
        initial_timestamp: Option<SystemTime>,
    },
    /// `worker.streams`: Kinesis streams only (validated), each with its own start.
    Many(Vec<StreamSpec>),
}

impl Wanted {
    /// Which service reads it.
    pub(crate) fn kind(&self) -> SourceKind {
        match self {
            Self::One { source, .. } => source.kind(),
            Self::Many(_) => SourceKind::Kinesis,
        }
    }
}

/// What to resolve: the source, and in fan-out mode the consumer's name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub wanted: Wanted,
    /// Fan-out mode: the enhanced fan-out consumer registered on each stream.
    pub consumer: Option<String>,
}

/// The plan from validated settings; an error names the key.
pub(crate) fn plan(settings: &Settings) -> Result<Plan, SettingsError> {
    let initial_timestamp = settings.worker.initial_timestamp()?;
    let specs = settings.worker.stream_specs()?;
    let wanted = if specs.is_empty() {
        Wanted::One {
            source: settings.worker.source()?,
            name: settings.worker.stream.clone(),
            initial: initial_checkpoint(settings.worker.initial_position),
            initial_timestamp,
        }
    } else {
        Wanted::Many(specs)
    };
    let consumer = match settings.reader.mode {
        ReadMode::Polling => None,
        ReadMode::Fanout => Some(
            settings
                .reader
                .consumer_name_for(&settings.worker.application)
                .to_owned(),
        ),
    };
    Ok(Plan { wanted, consumer })
}

/// Every source resolved: what the worker reads, by the names its calls take.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    /// What status, logs and metrics name: the stream (a table's stream by its ARN), or
    /// several streams' names joined by commas.
    pub stream: String,
    pub consumed: ConsumedStreams,
    /// A single stream's name and creation time, which its rows must name; `None` for
    /// several streams, whose keys name theirs.
    pub origin: Option<StreamOrigin>,
}

/// Describes the source(s), and has the fan-out consumer(s).
pub(crate) async fn resolve(
    client: &dyn StreamClient,
    plan: &Plan,
) -> Result<Resolved, WorkerError> {
    match &plan.wanted {
        Wanted::Many(specs) => {
            let consumed = identify_streams(client, specs, plan.consumer.as_deref()).await?;
            Ok(Resolved {
                stream: consumed.names(),
                consumed,
                origin: None,
            })
        }
        Wanted::One {
            source,
            name,
            initial,
            initial_timestamp,
        } => {
            let summary = retrying(
                || client.describe_stream_summary(name),
                StreamError::is_retryable,
            )
            .await
            .map_err(|source| WorkerError::Stream {
                stream: name.clone(),
                source,
            })?;
            let stream = read_name(source, name, &summary);
            let consumer = match plan.consumer.as_deref() {
                None => None,
                Some(consumer) => {
                    let found = crate::fanout::ensure_consumer(
                        client,
                        &stream,
                        &summary.arn,
                        consumer,
                        CONSUMER_WAIT,
                    )
                    .await?;
                    Some(Arc::<str>::from(found.arn))
                }
            };
            Ok(one(
                source,
                stream,
                &summary,
                initial.clone(),
                *initial_timestamp,
                consumer,
            ))
        }
    }
}

/// The name every later call takes: a table's stream by its ARN (`dynamodb:TABLE` was
/// resolved to the table's current stream by the description), a Kinesis stream as the
/// settings name it.
fn read_name(source: &Source, name: &str, summary: &StreamSummary) -> String {
    if source.is_table_stream() {
        summary.arn.clone()
    } else {
        name.to_owned()
    }
}

/// One described source as the worker reads it. Its rows are keyed by bare shard ids,
/// as any stream's would be: each must be this stream's (`model::origin`), by name and,
/// for a Kinesis stream, creation time (a table's stream has a new ARN per stream).
fn one(
    source: &Source,
    stream: String,
    summary: &StreamSummary,
    initial: Checkpoint,
    initial_timestamp: Option<SystemTime>,
    consumer: Option<Arc<str>>,
) -> Resolved {
    let origin = StreamOrigin {
        name: stream.clone(),
        created: match source.is_table_stream() {
            true => None,
            false => summary.created.and_then(epoch_seconds),
        },
    };
    let consumed = ConsumedStreams::single(ConsumedStream {
        stream: stream.clone(),
        id: None,
        initial,
        initial_timestamp,
        consumer,
        arn: Some(summary.arn.clone()),
    });
    Resolved {
        stream,
        consumed,
        origin: Some(origin),
    }
}

/// Everything the boot resolved.
pub(crate) struct Booted {
    /// The client that reads the source(s).
    pub streams: Arc<dyn StreamClient>,
    pub resolved: Resolved,
    /// The lease table, made and checked.
    pub table: Arc<dyn LeaseTable>,
    /// The status endpoint's listener, bound before any call.
    pub status_listener: Option<tokio::net::TcpListener>,
}

/// The plan, the client that reads it, the status listener (so a taken port fails the
/// start before anything is created), the sources, then the lease table.
pub(crate) async fn boot(settings: &Settings, backend: &Backend) -> Result<Booted, WorkerError> {
    let plan = plan(settings)?;
    let streams = backend.reader_of(plan.wanted.kind())?;
    let status_listener = bind_status(&settings.status).await?;
    // Every stream before the table: a misspelt stream must not leave a billable table.
    let resolved = resolve(streams.as_ref(), &plan).await?;
    let table = backend.lease_table(settings.lease_table());
    retrying(|| table.ensure_table(), LeaseError::is_retryable)
        .await
        .map_err(|source| WorkerError::LeaseTable {
            table: settings.lease_table().to_owned(),
            source,
        })?;
    if let Some(origin) = &resolved.origin {
        check_origin(table.as_ref(), origin).await?;
    }
    Ok(Booted {
        streams,
        resolved,
        table,
        status_listener,
    })
}

/// Seconds since the epoch of a creation time (`None` before the epoch, or at it: an
/// emulator's zero).
fn epoch_seconds(at: std::time::SystemTime) -> Option<u64> {
    at.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
        .filter(|s| *s > 0)
}

/// At start: refuses a lease table holding another stream's rows under this stream's
/// keys, at ERROR naming them and what to do, and stamps the rows written without (all
/// of) their source (the Java KCL's, an earlier flotilla's) as this stream's.
async fn check_origin(table: &dyn LeaseTable, origin: &StreamOrigin) -> Result<(), WorkerError> {
    let failed = |source| WorkerError::LeaseTable {
        table: table.table_name().to_owned(),
        source,
    };
    let scan = retrying(|| table.scan(), LeaseError::is_retryable)
        .await
        .map_err(failed)?;
    let foreign = crate::model::origin::foreign_rows(origin, &scan.leases);
    if !foreign.is_empty() {
        let rows: Vec<(String, crate::model::origin::Foreign)> = foreign
            .into_iter()
            .map(|(lease, why)| (lease.key.as_str().to_owned(), why))
            .collect();
        tracing::error!(
            message = "The lease table holds another stream's positions; not starting.",
            table = %table.table_name(),
            stream = %origin.name,
            rows = %rows.iter().map(|(k, why)| format!("{k} ({why})")).collect::<Vec<_>>().join(", "),
            advice = crate::model::origin::FOREIGN_ROWS_ADVICE,
        );
        return Err(WorkerError::ForeignRows {
            table: table.table_name().to_owned(),
            stream: origin.name.clone(),
            rows,
        });
    }
    let mut adopted = 0;
    for lease in scan.leases.iter().filter(|l| l.key.stream_id().is_none()) {
        if origin.of(lease) == crate::model::origin::RowOrigin::Adopt {
            let stamped = retrying(
                || table.stamp_source(&lease.key, &origin.name, origin.created, false),
                LeaseError::is_retryable,
            )
            .await
            .map_err(failed)?;
            adopted += usize::from(stamped);
        }
    }
    if adopted > 0 {
        info!(
            message = "Lease rows written without their stream (by the Java KCL, or an earlier flotilla) adopted as this stream's.",
            table = %table.table_name(),
            stream = %origin.name,
            rows = adopted,
        );
    }
    Ok(())
}

fn initial_checkpoint(position: InitialPosition) -> Checkpoint {
    match position {
        InitialPosition::TrimHorizon => Checkpoint::TrimHorizon,
        InitialPosition::Latest => Checkpoint::Latest,
        InitialPosition::AtTimestamp => Checkpoint::AtTimestamp,
    }
}

/// Describes each stream of `worker.streams` and names it as the KCL does in
/// multi-stream lease keys (account from the ARN, creation time in seconds). In fan-out
/// mode (`consumer` is the consumer's name) each stream gets its own consumer of that
/// name, as the KCL registers one per stream: found or registered on every stream at
/// once, so a start waits for the slowest activation, not for their sum.
async fn identify_streams(
    client: &dyn StreamClient,
    specs: &[crate::settings::StreamSpec],
    consumer: Option<&str>,
) -> Result<ConsumedStreams, WorkerError> {
    let mut consumed = Vec::with_capacity(specs.len());
    let mut arns = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        // An ARN is what the calls take: a stream of another account has no other name.
        let stream = spec.stream();
        // The same description (and ARN check) as a stream that joins the set later.
        let found = retrying(
            || crate::stream_set::identify(client, &stream),
            crate::stream_set::IdentifyError::is_retryable,
        )
        .await
        .map_err(|e| match e {
            crate::stream_set::IdentifyError::Stream(source) => WorkerError::Stream {
                stream: stream.clone(),
                source,
            },
            crate::stream_set::IdentifyError::Consumer(e) => WorkerError::Consumer(e),
            why @ crate::stream_set::IdentifyError::ArnMismatch { .. } => {
                WorkerError::StreamIdentity {
                    stream: stream.clone(),
                    why: format!("worker.streams[{i}]: {why}"),
                }
            }
            why @ crate::stream_set::IdentifyError::Identity(_) => WorkerError::StreamIdentity {
                stream: stream.clone(),
                why: why.to_string(),
            },
        })?;
        consumed.push(ConsumedStream {
            stream,
            id: Some(found.id),
            initial: initial_checkpoint(spec.initial_position),
            initial_timestamp: spec.initial_timestamp,
            consumer: None,
            arn: Some(found.arn.clone()),
        });
        arns.push(found.arn);
    }
    if let Some(name) = consumer {
        let registered =
            futures::future::try_join_all(consumed.iter().zip(&arns).map(|(stream, arn)| {
                crate::fanout::ensure_consumer(client, &stream.stream, arn, name, CONSUMER_WAIT)
            }))
            .await?;
        for (stream, registered) in consumed.iter_mut().zip(registered) {
            stream.consumer = Some(Arc::from(registered.arn));
        }
    }
    Ok(ConsumedStreams::multi(consumed))
}

/// Binds `status.bind` before any actor starts, so a taken port is a plain error
/// ([`WorkerError::StatusBind`]) and nothing has been created yet.
async fn bind_status(
    status: &StatusSettings,
) -> Result<Option<tokio::net::TcpListener>, WorkerError> {
    if !status.enabled {
        return Ok(None);
    }
    // `validate` has checked it; an error here still names the key.
    let addr: SocketAddr = status.bind.parse().map_err(|e| {
        WorkerError::Settings(SettingsError::Invalid {
            key: "status.bind".to_owned(),
            value: format!("{:?}", status.bind),
            why: format!("not an IP address and port: {e}"),
        })
    })?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|error| WorkerError::StatusBind { addr, error })
}

/// Start-up calls ride out throttling and brief outages (a fleet starting at once);
/// anything else, or a lasting failure, is the caller's error.
async fn retrying<T, E, F, Fut>(mut call: F, retryable: fn(&E) -> bool) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    const ATTEMPTS: u32 = 8;
    let mut backoff = crate::backoff::Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    );
    let mut attempt = 1;
    loop {
        match call().await {
            Err(error) if retryable(&error) && attempt < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(backoff.next_random()).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::settings::StreamEntry;

    const TABLE_ARN: &str =
        "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2024-01-01T00:00:00.000";

    /// (name, `worker.stream`, `worker.streams`, mode) → (kind, what is wanted, consumer)
    type PlanRow = (
        &'static str,
        &'static str,
        &'static [&'static str],
        ReadMode,
        SourceKind,
        &'static str,
        Option<&'static str>,
    );

    fn settings(stream: &str, streams: &[&str], mode: ReadMode) -> Settings {
        let mut settings = Settings::default();
        settings.worker.application = "audit".to_owned();
        settings.worker.stream = stream.to_owned();
        settings.worker.streams = streams
            .iter()
            .map(|s| StreamEntry::Name((*s).to_owned()))
            .collect();
        settings.reader.mode = mode;
        settings
    }

    fn summary(arn: &str, created: Option<SystemTime>) -> StreamSummary {
        StreamSummary {
            name: "orders".to_owned(),
            arn: arn.to_owned(),
            status: "ACTIVE".to_owned(),
            open_shard_count: 1,
            retention_hours: 24,
            created,
        }
    }

    /// Each kind of source the settings can name: what is wanted, which service reads
    /// it, and whether a consumer is had.
    #[test]
    fn the_plan_names_each_kind_of_source() {
        // (name, stream, streams, mode) → (kind, source's variant or "many", consumer)
        let table: &[PlanRow] = &[
            (
                "a Kinesis stream by name",
                "orders",
                &[],
                ReadMode::Polling,
                SourceKind::Kinesis,
                "kinesis",
                None,
            ),
            (
                "a table's stream by its ARN",
                TABLE_ARN,
                &[],
                ReadMode::Polling,
                SourceKind::DynamoDbStreams,
                "table-stream",
                None,
            ),
            (
                "a table's stream by the table",
                "dynamodb:orders",
                &[],
                ReadMode::Polling,
                SourceKind::DynamoDbStreams,
                "table",
                None,
            ),
            (
                "several streams",
                "",
                &["orders", "payments"],
                ReadMode::Polling,
                SourceKind::Kinesis,
                "many",
                None,
            ),
            (
                "one stream in fan-out mode",
                "orders",
                &[],
                ReadMode::Fanout,
                SourceKind::Kinesis,
                "kinesis",
                Some("audit"),
            ),
            (
                "several streams in fan-out mode",
                "",
                &["orders", "payments"],
                ReadMode::Fanout,
                SourceKind::Kinesis,
                "many",
                Some("audit"),
            ),
        ];
        for (name, stream, streams, mode, kind, variant, consumer) in table {
            let plan = plan(&settings(stream, streams, *mode)).expect(name);
            assert_eq!(plan.wanted.kind(), *kind, "{name}");
            assert_eq!(plan.consumer.as_deref(), *consumer, "{name}");
            let got = match &plan.wanted {
                Wanted::One {
                    source: Source::Kinesis { .. },
                    ..
                } => "kinesis",
                Wanted::One {
                    source: Source::TableStream { .. },
                    ..
                } => "table-stream",
                Wanted::One {
                    source: Source::Table { .. },
                    ..
                } => "table",
                Wanted::Many(specs) => {
                    assert_eq!(specs.len(), streams.len(), "{name}");
                    "many"
                }
            };
            assert_eq!(got, *variant, "{name}");
        }
    }

    #[test]
    fn a_single_source_starts_where_the_settings_say() {
        let mut at = settings("orders", &[], ReadMode::Polling);
        at.worker.initial_position = InitialPosition::Latest;
        let Wanted::One { name, initial, .. } = plan(&at).expect("plan").wanted else {
            panic!("one stream");
        };
        assert_eq!((name.as_str(), initial), ("orders", Checkpoint::Latest));
    }

    #[test]
    fn a_source_the_settings_cannot_name_is_a_settings_error() {
        let bad = settings("no spaces allowed", &[], ReadMode::Polling);
        assert!(plan(&bad).is_err());
    }

    /// A resolved single source: the name later calls take, and the origin its rows
    /// must name.
    #[test]
    fn a_single_source_is_read_by_the_name_its_calls_take() {
        let created = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let kinesis_arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders";
        let kinesis = Source::parse("orders").expect("kinesis");
        let by_table = Source::parse("dynamodb:orders").expect("table");
        let by_arn = Source::parse(TABLE_ARN).expect("table stream");
        // (source, settings' name, summary) → (read name, origin's creation time)
        let table: &[(&Source, &str, StreamSummary, &str, Option<u64>)] = &[
            (
                &kinesis,
                "orders",
                summary(kinesis_arn, Some(created)),
                "orders",
                Some(1_700_000_000),
            ),
            (
                &kinesis,
                "orders",
                summary(kinesis_arn, Some(UNIX_EPOCH)),
                "orders",
                None,
            ),
            (
                &kinesis,
                "orders",
                summary(kinesis_arn, None),
                "orders",
                None,
            ),
            (
                &by_table,
                "dynamodb:orders",
                summary(TABLE_ARN, Some(created)),
                TABLE_ARN,
                None,
            ),
            (
                &by_arn,
                TABLE_ARN,
                summary(TABLE_ARN, None),
                TABLE_ARN,
                None,
            ),
        ];
        for (source, name, summary, read, created) in table {
            let stream = read_name(source, name, summary);
            assert_eq!(stream, *read, "{source:?}");
            let consumer: Option<Arc<str>> = Some(Arc::from("consumer-arn"));
            let resolved = one(
                source,
                stream,
                summary,
                Checkpoint::TrimHorizon,
                None,
                consumer.clone(),
            );
            assert_eq!(resolved.stream, *read, "{source:?}");
            let origin = resolved.origin.expect("a single source has an origin");
            assert_eq!((origin.name.as_str(), origin.created), (*read, *created));
            assert!(!resolved.consumed.is_multi(), "{source:?}");
            let only: Vec<&ConsumedStream> = resolved.consumed.iter().collect();
            assert_eq!(only.len(), 1);
            assert_eq!(only[0].stream, *read);
            assert_eq!(only[0].arn.as_deref(), Some(summary.arn.as_str()));
            assert_eq!(only[0].consumer, consumer);
        }
    }

    #[test]
    fn initial_positions_are_checkpoints() {
        let table = [
            (InitialPosition::TrimHorizon, Checkpoint::TrimHorizon),
            (InitialPosition::Latest, Checkpoint::Latest),
            (InitialPosition::AtTimestamp, Checkpoint::AtTimestamp),
        ];
        for (position, checkpoint) in table {
            assert_eq!(initial_checkpoint(position), checkpoint);
        }
    }
}
