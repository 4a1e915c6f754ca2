//! The embedding API: [`Worker::builder`] → [`Worker`], a handle on a running worker.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use ractor::{Actor, ActorRef};
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tracing::info;

#[cfg(feature = "cloudwatch")]
use crate::backend::aws::CloudWatchMetrics;
use crate::backend::aws::{self, DynamoLeaseTable, DynamoStreams, KinesisStream};
use crate::backend::clock::Clock;
use crate::backend::memory::{MemoryDynamo, MemoryMetrics, MemoryStreams};
use crate::backend::time_scan::TimeScan;
use crate::backend::{LeaseError, LeaseTable, MetricsSink, StreamClient, StreamError};
use crate::handle::WorkerHandle;
use crate::model::origin::StreamOrigin;
use crate::model::{Checkpoint, ConsumedStream, ConsumedStreams, Source, SourceKind, WorkerId};
pub use crate::processor::ProcessorActorFactory;
use crate::processor::{BoxedProcessor, Processor, ProcessorFactory, ProcessorSource};
use crate::protocol::{ProcessorMsg, ShardInfo, SupervisorMsg};
use crate::settings::StreamSpec;
use crate::settings::{
    AwsSettings, InitialPosition, ReadMode, Settings, SettingsError, StatusSettings,
};
use crate::spans::Spanned;
use crate::status::{ShutdownReport, WorkerStatus};
use crate::stream_set::StreamSet;
use crate::supervisor::{Supervisor, WorkerContext};

/// Opens a lease table by name (`Settings::lease_table`).
type OpenTable = Arc<dyn Fn(&str) -> Arc<dyn LeaseTable> + Send + Sync>;

/// The three outside systems a worker talks to. Cheap to clone.
#[derive(Clone)]
pub struct Backend {
    streams: Arc<dyn StreamClient>,
    /// DynamoDB Streams, for a `worker.stream` that names a table's stream; `None` where
    /// the backend has none (a memory backend built without one).
    table_streams: Option<Arc<dyn StreamClient>>,
    tables: OpenTable,
    metrics: Arc<dyn MetricsSink>,
    clock: Clock,
    /// The settings an AWS backend was built from; the worker refuses to start on other
    /// ones (see [`WorkerError::BackendMismatch`]).
    aws: Option<AwsSettings>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Backend")
    }
}

impl Backend {
    /// Any implementation of the ports, e.g. wrapped in [`crate::backend::faults::Faulty`].
    /// `tables` opens a lease table by its name (`Settings::lease_table`).
    pub fn new(
        streams: Arc<dyn StreamClient>,
        tables: impl Fn(&str) -> Arc<dyn LeaseTable> + Send + Sync + 'static,
        metrics: Arc<dyn MetricsSink>,
    ) -> Self {
        Self {
            streams,
            table_streams: None,
            tables: Arc::new(tables),
            metrics,
            clock: Clock::new(),
            aws: None,
        }
    }

    /// The in-memory services: the embedded default and the fast test double.
    pub fn memory(streams: MemoryStreams, dynamo: MemoryDynamo, metrics: MemoryMetrics) -> Self {
        let clock = streams.clock();
        Self {
            streams: Arc::new(streams),
            table_streams: None,
            tables: Arc::new(move |name: &str| -> Arc<dyn LeaseTable> {
                Arc::new(dynamo.lease_table(name))
            }),
            metrics: Arc::new(metrics),
            clock,
            aws: None,
        }
    }

    /// AWS as the worker's settings say: `aws.region` (else the SDK's default chain:
    /// `AWS_REGION`, the profile) and the `aws.*_endpoint` URLs (local servers; AWS's own
    /// where unset), with the default credential chain. Pass the same settings the worker
    /// gets, as `flotilla run` does:
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let settings = flotilla_actors::Settings::load(None)?;
    /// let backend = flotilla_actors::Backend::aws(&settings.aws).await;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A worker refuses to start on a backend built from other AWS settings than its own
    /// ([`WorkerError::BackendMismatch`]): it would read one place and be configured for
    /// another.
    pub async fn aws(settings: &AwsSettings) -> Self {
        let sdk = aws::load_sdk_config(settings.region.clone()).await;
        Self::from_sdk(&sdk, settings)
    }

    /// AWS adapters from an SDK configuration the caller built (credentials, HTTP client
    /// of its choosing). The endpoints are the settings' `aws.*_endpoint`, as in
    /// [`Backend::aws`], and `aws.region`, when set, replaces the SDK configuration's
    /// region; leave it unset to keep the one `sdk` carries. Call timeouts and retries
    /// are the settings' (`aws.*_timeout`, `aws.attempt_timeout`, `aws.max_attempts`), so
    /// they are set in one place whoever builds the SDK configuration.
    pub fn from_sdk(sdk: &aws_config::SdkConfig, settings: &AwsSettings) -> Self {
        let sdk = match &settings.region {
            Some(region) => sdk
                .to_builder()
                .region(aws_config::Region::new(region.clone()))
                .build(),
            None => sdk.clone(),
        };
        let endpoints = settings.endpoints();
        let dynamodb_endpoint = endpoints.dynamodb.clone();
        let stream_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::Stream));
        let table_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::LeaseTable));
        #[cfg(feature = "cloudwatch")]
        let metrics_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::Metrics));
        Self {
            streams: Arc::new(KinesisStream::new(
                &stream_sdk,
                endpoints.kinesis.as_deref(),
            )),
            // A local server serves DynamoDB Streams where it serves DynamoDB.
            table_streams: Some(Arc::new(DynamoStreams::new(
                &stream_sdk,
                endpoints.dynamodb.as_deref(),
            ))),
            tables: Arc::new(move |name: &str| -> Arc<dyn LeaseTable> {
                Arc::new(DynamoLeaseTable::new(
                    &table_sdk,
                    dynamodb_endpoint.as_deref(),
                    name,
                ))
            }),
            #[cfg(feature = "cloudwatch")]
            metrics: Arc::new(CloudWatchMetrics::new(
                &metrics_sdk,
                endpoints.cloudwatch.as_deref(),
            )),
            #[cfg(not(feature = "cloudwatch"))]
            metrics: Arc::new(aws::NoCloudWatch),
            clock: Clock::new(),
            aws: Some(settings.clone()),
        }
    }

    /// The DynamoDB Streams a worker reads when `worker.stream` names a table's stream
    /// (e.g. a [`crate::backend::memory::MemoryTableStreams`], or any implementation
    /// of the port wrapped in [`crate::backend::faults::Faulty`]). [`Backend::aws`]
    /// has them already.
    pub fn with_table_streams(mut self, streams: Arc<dyn StreamClient>) -> Self {
        self.table_streams = Some(streams);
        self
    }

    /// The Kinesis client: what the worker lists and reads Kinesis streams with.
    pub fn streams(&self) -> &Arc<dyn StreamClient> {
        &self.streams
    }

    /// The client that reads `source`: Kinesis, or DynamoDB Streams (which gets
    /// AT_TIMESTAMP by a scan, see [`TimeScan`]).
    fn reader_of(&self, kind: SourceKind) -> Result<Arc<dyn StreamClient>, WorkerError> {
        match kind {
            SourceKind::Kinesis => Ok(self.streams.clone()),
            SourceKind::DynamoDbStreams => {
                let streams = self
                    .table_streams
                    .clone()
                    .ok_or(WorkerError::NoTableStreams)?;
                Ok(Arc::new(TimeScan::new(streams)))
            }
        }
    }

    /// The lease table named `name` (a worker's is `Settings::lease_table`: the
    /// application's unless `lease.table` names another).
    pub fn lease_table(&self, name: &str) -> Arc<dyn LeaseTable> {
        (self.tables)(name)
    }

    /// Where the worker's metrics go (CloudWatch, on an AWS backend).
    pub fn metrics_sink(&self) -> &Arc<dyn MetricsSink> {
        &self.metrics
    }
}

/// Why a worker could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The settings are not valid; the error names the key. Fix them and start again.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The builder was not given a required part: `backend` or `processor`.
    #[error("worker: {0} is required (call WorkerBuilder::{0})")]
    Missing(&'static str),
    /// The stream could not be described at start (not found, no access, or still
    /// failing after a few retries).
    #[error("stream {stream}")]
    Stream {
        /// The stream, as the settings name it.
        stream: String,
        /// The stream service's error.
        #[source]
        source: StreamError,
    },
    /// The stream-set source's first answer failed or was refused.
    #[error("stream set: {0}")]
    StreamSet(String),
    /// A stream of `worker.streams` could not be named as multi-stream lease keys need
    /// (the server gave no creation time, or an ARN without an account), or its entry's
    /// ARN is not the stream's.
    #[error("stream {stream}: cannot name it in multi-stream lease keys: {why}")]
    StreamIdentity {
        /// The stream, as `worker.streams` names it.
        stream: String,
        /// What is missing or does not match.
        why: String,
    },
    /// Fan-out mode: the application's enhanced fan-out consumer could not be had.
    #[error(transparent)]
    Consumer(#[from] crate::fanout::ConsumerError),
    /// `worker.stream` names a DynamoDB table's stream and the backend reads none.
    #[error(
        "worker.stream names a DynamoDB table's stream, and this backend has no DynamoDB \
         Streams client: build it with Backend::aws, or add one with \
         Backend::with_table_streams"
    )]
    NoTableStreams,
    /// The lease table could not be found or created (`ensure_table`), still failing
    /// after a few retries.
    #[error("lease table {table}")]
    LeaseTable {
        /// The table's name (`Settings::lease_table`).
        table: String,
        /// The lease table's error.
        #[source]
        source: LeaseError,
    },
    /// The backend was built from other AWS settings than the worker's (say, with
    /// `Backend::aws(&AwsSettings::default())` beside settings that name local endpoints).
    #[error(
        "backend: built for other AWS settings than the worker's: {differences}; build it \
         from the worker's own settings: Backend::aws(&settings.aws)"
    )]
    BackendMismatch {
        /// Each setting that differs, with both values.
        differences: String,
    },
    /// The status endpoint cannot listen where `status.bind` says.
    #[error(
        "status endpoint: cannot listen on {addr} ({}); set status.bind to a free address \
         or port 0, or status.enabled = false",
        bind_failure(.error)
    )]
    StatusBind {
        /// The address `status.bind` names.
        addr: SocketAddr,
        /// Why it could not be bound.
        error: std::io::Error,
    },
    /// The lease table holds another stream's positions under this stream's keys
    /// (`model::origin`): rows written for another `worker.stream`, or for a stream of
    /// this name that was deleted and created again. Taken, they would skip this
    /// stream's records; the worker does not start.
    #[error(
        "lease table {table}: {} of its rows are not stream {stream}'s: {}; {}",
        rows.len(),
        rows.iter().take(5).map(|(key, why)| format!("{key} ({why})")).collect::<Vec<_>>().join(", "),
        crate::model::origin::FOREIGN_ROWS_ADVICE
    )]
    ForeignRows {
        /// The lease table (the application).
        table: String,
        /// The stream this worker reads.
        stream: String,
        /// Each row of another stream, with why.
        rows: Vec<(String, crate::model::origin::Foreign)>,
    },
    /// The supervisor or its core actors could not be started (the error, as text).
    #[error("worker could not start its actors: {0}")]
    Spawn(String),
    /// The worker has stopped: a core actor failed past its restart intensity (the
    /// reason), or a requested shutdown stopped it.
    #[error("worker stopped: {0}")]
    Stopped(String),
    /// The worker did not answer in time, or stopped before answering (the call's
    /// error, as text).
    #[error("worker did not answer: {0}")]
    Unresponsive(String),
}

/// Builds a [`Worker`].
///
/// ```no_run
/// use flotilla_actors::backend::memory::{MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig};
/// use flotilla_actors::{Backend, Batch, Checkpointer, Processor, ProcessorError, Worker};
///
/// struct Print;
///
/// impl Processor for Print {
///     async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
///         for record in batch.records() {
///             println!("{} {}", record.partition_key, String::from_utf8_lossy(&record.data));
///         }
///         Ok(())
///     }
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = Backend::memory(
///     MemoryStreams::new(MemoryStreamsConfig::default()),
///     MemoryDynamo::new(),
///     MemoryMetrics::new(),
/// );
/// let worker = Worker::builder()
///     .stream("orders")
///     .application("orders-audit")
///     .backend(backend)
///     .processor(|_shard| Print)
///     .start()
///     .await?;
/// // ... later:
/// let report = worker.shutdown().await?;
/// assert!(report.clean());
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct WorkerBuilder {
    settings: Settings,
    backend: Option<Backend>,
    processor: Option<ProcessorSource>,
    stream_set: Option<StreamSet>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// All settings at once; `stream`, `application` and `worker_id` called after this
    /// override the corresponding fields.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The source to read (`worker.stream`): a Kinesis stream's name, a table's stream by
    /// its ARN, or `dynamodb:TABLE`.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.settings.worker.stream = stream.into();
        self
    }

    /// The application name, which is also the lease table's name.
    pub fn application(mut self, application: impl Into<String>) -> Self {
        self.settings.worker.application = application.into();
        self
    }

    /// This worker's id (`worker.worker_id`), unique in the fleet; kept across restarts,
    /// the worker takes its own leases back at once. Unset, one is generated.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.settings.worker.worker_id = Some(id.into());
        self
    }

    /// The services the worker talks to (required).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Many streams from a source that may change while the worker runs (instead of
    /// `worker.streams`, which it replaces): asked at start, then at every shard sync.
    /// A stream that joins is read within one sync; one that leaves has its leases
    /// released at once and its rows deleted after `worker.former_stream_grace`.
    pub fn stream_set(mut self, set: StreamSet) -> Self {
        self.stream_set = Some(set);
        self
    }

    /// One processor per shard, made by `factory` (again after each restart).
    pub fn processor<P, F>(mut self, factory: F) -> Self
    where
        P: Processor,
        F: Fn(&ShardInfo) -> P + Send + Sync + 'static,
    {
        let factory: ProcessorFactory =
            Arc::new(move |shard: &ShardInfo| BoxedProcessor::new(factory(shard)));
        self.processor = Some(ProcessorSource::Factory(factory));
        self
    }

    /// Routes each shard's batches to an actor of the user's own instead of a
    /// [`Processor`]. The actor is linked to the shard's reader; it must ack every batch
    /// through the checkpointer and answer the reply ports of [`ProcessorMsg`].
    pub fn processor_actor<F, Fut>(mut self, factory: F) -> Self
    where
        F: Fn(ShardInfo) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<ActorRef<ProcessorMsg>, String>> + Send + 'static,
    {
        let factory: ProcessorActorFactory =
            Arc::new(move |shard: ShardInfo| -> BoxFuture<'static, _> { Box::pin(factory(shard)) });
        self.processor = Some(ProcessorSource::Actor(factory));
        self
    }

    /// Checks the settings, binds the status endpoint, makes sure the stream is there
    /// and the lease table exists, and starts the actors. Returns once they run; leases
    /// are taken in the background. Nothing is created when a check fails: the stream is
    /// looked up before the table is made, so a misspelt stream leaves no table behind.
    pub async fn start(self) -> Result<Worker, WorkerError> {
        let mut settings = self.settings;
        // A source's first answer is the start's `worker.streams`: checked and resolved
        // as a list from the file is.
        let set_source = match self.stream_set {
            Some(set) => {
                let list = set.current().await.map_err(WorkerError::StreamSet)?;
                crate::model::check_list(&list.iter().map(StreamSpec::wanted).collect::<Vec<_>>())
                    .map_err(WorkerError::StreamSet)?;
                settings.worker.stream.clear();
                settings.worker.streams = list.iter().map(StreamSpec::entry).collect();
                set.changes().then_some(set)
            }
            None => None,
        };
        settings.validate()?;
        let backend = self.backend.ok_or(WorkerError::Missing("backend"))?;
        if let Some(built_for) = &backend.aws {
            check_aws_settings(built_for, &settings.aws)?;
        }
        let processor = self.processor.ok_or(WorkerError::Missing("processor"))?;
        let initial_timestamp = settings.worker.initial_timestamp()?;
        let specs = settings.worker.stream_specs()?;
        // `worker.stream` names one source of either kind; `worker.streams` are Kinesis
        // streams only (validated).
        let source = if specs.is_empty() {
            Some(settings.worker.source()?)
        } else {
            None
        };
        let streams =
            backend.reader_of(source.as_ref().map_or(SourceKind::Kinesis, Source::kind))?;
        let stream = settings.worker.stream.clone();
        let application = settings.worker.application.clone();
        let me = WorkerId::new(
            settings
                .worker
                .worker_id
                .clone()
                .unwrap_or_else(generated_worker_id),
        );
        let status_listener = bind_status(&settings.status).await?;
        let initial = initial_checkpoint(settings.worker.initial_position);
        // Every stream before the table: a misspelt stream must not leave a billable table.
        let consumed = if specs.is_empty() {
            None
        } else {
            let consumer = match settings.reader.mode {
                ReadMode::Polling => None,
                ReadMode::Fanout => Some(settings.reader.consumer_name_for(&application)),
            };
            Some(identify_streams(streams.as_ref(), &specs, consumer).await?)
        };
        let summary = match &consumed {
            // Many streams: each was described (and its consumer had) just now.
            Some(_) => None,
            None => Some(
                retrying(
                    || streams.describe_stream_summary(&stream),
                    StreamError::is_retryable,
                )
                .await
                .map_err(|source| WorkerError::Stream {
                    stream: stream.clone(),
                    source,
                })?,
            ),
        };
        // A table's stream is named by its ARN in every later call (`dynamodb:TABLE`
        // was resolved to the table's current stream just now).
        let stream = match &summary {
            Some(summary) if source.as_ref().is_some_and(Source::is_table_stream) => {
                summary.arn.clone()
            }
            _ => stream,
        };
        let consumer = match (settings.reader.mode, &summary) {
            (ReadMode::Polling, _) | (ReadMode::Fanout, None) => None,
            (ReadMode::Fanout, Some(summary)) => {
                let name = settings.reader.consumer_name_for(&application);
                let consumer = crate::fanout::ensure_consumer(
                    streams.as_ref(),
                    &stream,
                    &summary.arn,
                    name,
                    CONSUMER_WAIT,
                )
                .await?;
                Some(Arc::<str>::from(consumer.arn))
            }
        };
        let table = backend.lease_table(settings.lease_table());
        retrying(|| table.ensure_table(), LeaseError::is_retryable)
            .await
            .map_err(|source| WorkerError::LeaseTable {
                table: settings.lease_table().to_owned(),
                source,
            })?;
        // A single stream's rows are keyed by bare shard ids, as any stream's would be:
        // each must be this stream's (`model::origin`).
        let origin = match (&consumed, &summary) {
            (None, Some(summary)) => Some(StreamOrigin {
                name: stream.clone(),
                created: match source.as_ref().is_some_and(Source::is_table_stream) {
                    true => None,
                    false => summary.created.and_then(epoch_seconds),
                },
            }),
            _ => None,
        };
        if let Some(origin) = &origin {
            check_origin(table.as_ref(), origin).await?;
        }
        let consumed = Arc::new(consumed.unwrap_or_else(|| {
            ConsumedStreams::single(ConsumedStream {
                stream: stream.clone(),
                id: None,
                initial,
                initial_timestamp,
                consumer,
                arn: summary.as_ref().map(|s| s.arn.clone()),
            })
        }));
        // Status, logs and metrics name the application's streams.
        let stream = if consumed.is_multi() {
            consumed.names()
        } else {
            stream
        };
        // `lease.java_compat`: renew held leases as the Java KCL does, every
        // failover_time / 3 (its renewer's interval), behind the table port.
        let renewing = settings.lease.java_compat.then(|| {
            crate::renewal::Renewing::start(
                table.clone(),
                me.clone(),
                settings.lease.failover_time / 3,
            )
        });
        let table: Arc<dyn LeaseTable> = match &renewing {
            Some(renewing) => renewing.clone(),
            None => table,
        };
        let fatal = Arc::new(Mutex::new(None));
        let shutdown_timeout = settings.supervision.shutdown_timeout;
        let drain_limit = settings.drain_limit();
        let status_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>> = Arc::default();
        let handle = WorkerHandle::new();
        let budget = crate::model::WorkerBudget::new(settings.reader.worker_budget_bytes);
        let span = crate::spans::worker(&me, &application, &stream);
        let ctx = Arc::new(WorkerContext {
            me: me.clone(),
            application,
            stream,
            streams,
            set: Arc::new(
                tokio::sync::watch::channel(Arc::new(crate::model::StreamSetView::fixed(
                    (*consumed).clone(),
                )))
                .0,
            ),
            set_source,
            origin,
            table,
            renewing,
            metrics_sink: backend.metrics.clone(),
            settings: Arc::new(settings),
            processor,
            clock: backend.clock,
            fatal: fatal.clone(),
            delivered: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            lags: Default::default(),
            budget,
            fleet: Arc::default(),
            listing: Arc::new(tokio::sync::watch::channel(None).0),
            status_addr: status_addr.clone(),
            status_listener: Mutex::new(status_listener),
            handle: handle.clone(),
            span: span.clone(),
        });
        let (supervisor, join) = Actor::spawn(None, Spanned(Supervisor, span), ctx)
            .await
            .map_err(|e| WorkerError::Spawn(e.to_string()))?;
        info!(message = "Worker started.", worker_id = %me);
        // The drain, then readers, the final flush, the release and the metrics each get
        // the shutdown timeout; the supervisor's own bookkeeping gets a little more.
        let shutdown_call_ms = (drain_limit + 4 * shutdown_timeout).as_millis() as u64 + 10_000;
        let outcome: Outcome = Arc::default();
        // Runs a requested shutdown, so that it needs nothing of the embedding service.
        let stopper = tokio::spawn({
            let (handle, outcome, supervisor, me) = (
                handle.clone(),
                outcome.clone(),
                supervisor.clone(),
                me.clone(),
            );
            async move {
                let reason = handle.requested().await;
                info!(message = "Worker shutdown requested.", worker_id = %me, %reason);
                outcome
                    .get_or_init(|| run_shutdown(supervisor, shutdown_call_ms))
                    .await;
            }
        });
        Ok(Worker {
            id: me,
            supervisor,
            join: Some(join),
            fatal,
            shutdown_call_ms,
            status_addr: status_addr.get().copied(),
            handle,
            outcome,
            stopper: Some(stopper),
        })
    }
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

/// The one graceful shutdown's result, whoever started it: `Worker::shutdown` or a
/// [`WorkerHandle`] request. An error is the call's, as text.
type Outcome = Arc<OnceCell<Result<ShutdownReport, String>>>;

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

async fn run_shutdown(
    supervisor: ActorRef<SupervisorMsg>,
    timeout_ms: u64,
) -> Result<ShutdownReport, String> {
    ractor::call_t!(supervisor, SupervisorMsg::Shutdown, timeout_ms).map_err(|e| e.to_string())
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

/// A few words on why a port could not be bound, for [`WorkerError::StatusBind`].
fn bind_failure(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => "address in use".to_owned(),
        std::io::ErrorKind::AddrNotAvailable => "no such address on this machine".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => error.to_string(),
    }
}

/// The backend's AWS settings must be the worker's: region and every endpoint.
fn check_aws_settings(backend: &AwsSettings, worker: &AwsSettings) -> Result<(), WorkerError> {
    let shown = |value: &Option<String>| match value {
        Some(text) => format!("{text:?}"),
        None => "unset".to_owned(),
    };
    let differences: Vec<String> = [
        ("aws.region", &backend.region, &worker.region),
        (
            "aws.kinesis_endpoint",
            &backend.kinesis_endpoint,
            &worker.kinesis_endpoint,
        ),
        (
            "aws.dynamodb_endpoint",
            &backend.dynamodb_endpoint,
            &worker.dynamodb_endpoint,
        ),
        (
            "aws.cloudwatch_endpoint",
            &backend.cloudwatch_endpoint,
            &worker.cloudwatch_endpoint,
        ),
    ]
    .into_iter()
    .filter(|(_, b, w)| b != w)
    .map(|(key, b, w)| {
        format!(
            "{key} is {} in the backend but {} in the settings",
            shown(b),
            shown(w)
        )
    })
    .collect();
    if differences.is_empty() {
        return Ok(());
    }
    Err(WorkerError::BackendMismatch {
        differences: differences.join(", "),
    })
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

/// `host-1a2b3c4d`: the host name (as `gethostname` gives it: `$HOSTNAME` is often unset
/// outside interactive shells and Kubernetes) and a random part, so two workers on one
/// host differ. A host name that is not text, or none, gives `worker`.
fn generated_worker_id() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{:08x}", rand::random::<u32>())
}

/// A running worker. Dropping it without [`Worker::shutdown`] stops it abruptly, like a
/// crash: leases stay owned until they expire, and the next owner resumes from the
/// last checkpoint.
pub struct Worker {
    id: WorkerId,
    supervisor: ActorRef<SupervisorMsg>,
    join: Option<JoinHandle<()>>,
    fatal: Arc<Mutex<Option<String>>>,
    /// How long the supervisor may take over a graceful shutdown.
    shutdown_call_ms: u64,
    status_addr: Option<std::net::SocketAddr>,
    handle: WorkerHandle,
    outcome: Outcome,
    /// Waits for a [`WorkerHandle`] request and runs the shutdown it asks for.
    stopper: Option<JoinHandle<()>>,
}

/// [`Worker::status`] for a task that does not own the [`Worker`]: cheap to clone, and
/// it keeps nothing alive. Once the worker has stopped, its calls fail
/// ([`WorkerError::Unresponsive`]), which a periodic reader takes as "nothing to read".
#[derive(Debug, Clone)]
pub struct StatusProbe {
    supervisor: ActorRef<SupervisorMsg>,
}

impl StatusProbe {
    /// As [`Worker::status`]: the worker's snapshot, or an error once it has stopped.
    pub async fn status(&self) -> Result<WorkerStatus, WorkerError> {
        ractor::call_t!(self.supervisor, SupervisorMsg::Status, STATUS_TIMEOUT_MS)
            .map_err(|e| WorkerError::Unresponsive(e.to_string()))
    }
}

/// A worker that stopped because a [`WorkerHandle`] asked it to: what
/// [`Worker::wait`] returns then.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedShutdown {
    /// The reason given to [`WorkerHandle::request_shutdown`] (the first, if several).
    pub reason: String,
    /// What the graceful shutdown achieved, as [`Worker::shutdown`] returns it.
    pub report: ShutdownReport,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish()
    }
}

/// How long `status()` waits for the whole tree to answer.
const STATUS_TIMEOUT_MS: u64 = 30_000;

use crate::fanout::CONSUMER_WAIT;

impl Worker {
    /// A builder with the default settings; a backend and a processor are required.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::default()
    }

    /// This worker's id, as its heartbeat row and its leases name it.
    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// Where the status endpoint listens (`status.bind`, with the port the system
    /// picked when it was 0); `None` when `status.enabled` is false.
    pub fn status_addr(&self) -> Option<std::net::SocketAddr> {
        self.status_addr
    }

    /// A handle that asks this worker to stop gracefully, for the service's own tasks
    /// (processors reach the same handle through [`crate::Checkpointer::worker`]).
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// A snapshot of the whole worker, collected from its actors now. Fails once the
    /// worker has stopped, or if it does not answer within 30 s.
    pub async fn status(&self) -> Result<WorkerStatus, WorkerError> {
        ractor::call_t!(self.supervisor, SupervisorMsg::Status, STATUS_TIMEOUT_MS)
            .map_err(|e| self.stopped_or(e.to_string()))
    }

    /// Asks for this worker's status from a task that does not own the worker (the
    /// binary's OTLP metrics push, on its own timer): see [`StatusProbe`].
    pub fn status_probe(&self) -> StatusProbe {
        StatusProbe {
            supervisor: self.supervisor.clone(),
        }
    }

    /// Stops gracefully. First the worker drains: it tells the fleet (its heartbeat says
    /// `draining`), and each lease a live peer asks for is handed over — the processor
    /// finishes the batch in hand, gets `shutdown_requested`, the checkpoint is flushed,
    /// and the peer starts exactly there. It waits at most two heartbeat intervals for
    /// askers (not at all when no peer is alive); the leases nobody asked for are then
    /// stopped the same way and released. Returns when all of that is done; the report
    /// says honestly what did not succeed (see [`ShutdownReport::clean`]).
    ///
    /// After a shutdown a [`WorkerHandle`] requested, this waits for that one and
    /// returns its report: there is only ever one.
    pub async fn shutdown(mut self) -> Result<ShutdownReport, WorkerError> {
        let supervisor = self.supervisor.clone();
        let result = self
            .outcome
            .get_or_init(|| run_shutdown(supervisor, self.shutdown_call_ms))
            .await
            .clone();
        if let Some(join) = self.join.take() {
            let _ = join.await;
        }
        if let Some(stopper) = self.stopper.take() {
            stopper.abort();
        }
        result.map_err(|e| self.stopped_or(e))
    }

    /// Waits until the worker stops without [`Worker::shutdown`]: because a
    /// [`WorkerHandle`] asked it to (`Ok`, with the reason and the shutdown's report),
    /// or because it failed (`Err(WorkerError::Stopped)`: a core actor failing past its
    /// restart intensity). Cancel-safe: use it in `select!` beside a signal handler.
    pub async fn wait(&mut self) -> Result<RequestedShutdown, WorkerError> {
        if let Some(join) = self.join.as_mut() {
            let _ = join.await;
            self.join = None;
        }
        if let Some(reason) = self.fatal() {
            return Err(WorkerError::Stopped(reason));
        }
        let Some(reason) = self.handle.shutdown_reason() else {
            return Err(WorkerError::Stopped(
                "the supervisor stopped without a reason".to_owned(),
            ));
        };
        // The supervisor stops once it has answered the shutdown; the answer may still
        // be on its way into `outcome`, so wait for the one running it.
        let outcome = self
            .outcome
            .get_or_init(|| async {
                Err("the worker stopped before the requested shutdown ran".to_owned())
            })
            .await
            .clone();
        match outcome {
            Ok(report) => Ok(RequestedShutdown { reason, report }),
            Err(error) => Err(WorkerError::Unresponsive(error)),
        }
    }

    /// Stops at once without releasing anything: what a crash looks like to the fleet.
    pub fn abort(mut self) {
        self.supervisor.kill();
        self.join = None;
        if let Some(stopper) = self.stopper.take() {
            stopper.abort();
        }
    }

    fn fatal(&self) -> Option<String> {
        self.fatal.lock().ok().and_then(|f| f.clone())
    }

    fn stopped_or(&self, error: String) -> WorkerError {
        if let Some(reason) = self.fatal() {
            return WorkerError::Stopped(reason);
        }
        match (self.outcome.get(), self.handle.shutdown_reason()) {
            (Some(Ok(_)), Some(reason)) => {
                WorkerError::Stopped(format!("shut down on request: {reason}"))
            }
            _ => WorkerError::Unresponsive(error),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.join.is_some() {
            self.supervisor.kill();
        }
        if let Some(stopper) = self.stopper.take() {
            stopper.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host part is the kernel's host name, read here from another source than the
    /// one the id is made from, whatever `$HOSTNAME` says (unset under CI and systemd).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_generated_worker_id_is_the_host_name_and_a_random_part() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .unwrap_or_default();
        let id = generated_worker_id();
        let (prefix, random) = id.rsplit_once('-').unwrap_or_default();
        let expected = if host.is_empty() { "worker" } else { &host };
        assert_eq!(prefix, expected, "{id}");
        assert_eq!(random.len(), 8, "{id}");
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        assert_ne!(generated_worker_id(), id, "two ids on one host must differ");
    }
}
