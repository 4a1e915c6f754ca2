//! The embedding API: [`Worker::builder`] → [`Worker`], a handle on a running worker.

use std::fmt;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;
use tracing::info;

use crate::backend::aws::{self, CloudWatchMetrics, DynamoLeaseTable, Endpoints, KinesisStream};
use crate::backend::clock::Clock;
use crate::backend::memory::{MemoryDynamo, MemoryMetrics, MemoryStreams};
use crate::backend::{LeaseError, LeaseTable, MetricsSink, StreamClient, StreamError};
use crate::model::{Checkpoint, WorkerId};
use crate::processor::{BoxedProcessor, Processor, ProcessorFactory, ProcessorMsg, ShardInfo};
use crate::settings::{InitialPosition, Settings, SettingsError};
use crate::status::{ShutdownReport, WorkerStatus};
use crate::supervisor::{Supervisor, SupervisorMsg, WorkerContext};

/// Creates a user's own processor actor for a shard (the advanced route).
pub type ProcessorActorFactory = Arc<
    dyn Fn(ShardInfo) -> BoxFuture<'static, Result<ActorRef<ProcessorMsg>, String>> + Send + Sync,
>;

/// Where a shard's batches go.
#[derive(Clone)]
pub(crate) enum ProcessorSource {
    Factory(ProcessorFactory),
    Actor(ProcessorActorFactory),
}

/// Opens the lease table of an application by name.
type OpenTable = Arc<dyn Fn(&str) -> Arc<dyn LeaseTable> + Send + Sync>;

/// The three outside systems a worker talks to. Cheap to clone.
#[derive(Clone)]
pub struct Backend {
    streams: Arc<dyn StreamClient>,
    tables: OpenTable,
    metrics: Arc<dyn MetricsSink>,
    clock: Clock,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Backend")
    }
}

impl Backend {
    /// Any implementation of the ports, e.g. wrapped in [`crate::backend::faults::Faulty`].
    /// `tables` opens the lease table of an application by name.
    pub fn new(
        streams: Arc<dyn StreamClient>,
        tables: impl Fn(&str) -> Arc<dyn LeaseTable> + Send + Sync + 'static,
        metrics: Arc<dyn MetricsSink>,
    ) -> Self {
        Self {
            streams,
            tables: Arc::new(tables),
            metrics,
            clock: Clock::new(),
        }
    }

    /// The in-memory services: the embedded default and the fast test double.
    pub fn memory(streams: MemoryStreams, dynamo: MemoryDynamo, metrics: MemoryMetrics) -> Self {
        let clock = streams.clock();
        Self {
            streams: Arc::new(streams),
            tables: Arc::new(move |name: &str| -> Arc<dyn LeaseTable> {
                Arc::new(dynamo.lease_table(name))
            }),
            metrics: Arc::new(metrics),
            clock,
        }
    }

    /// AWS (or local servers at `endpoints`), with the default credential chain.
    pub async fn aws(region: Option<String>, endpoints: &Endpoints) -> Self {
        Self::from_sdk(&aws::load_sdk_config(region).await, endpoints)
    }

    /// AWS adapters from an SDK configuration the caller built (credentials, retries,
    /// timeouts of its choosing).
    pub fn from_sdk(sdk: &aws_config::SdkConfig, endpoints: &Endpoints) -> Self {
        let sdk = sdk.clone();
        let dynamodb_endpoint = endpoints.dynamodb.clone();
        let table_sdk = sdk.clone();
        Self {
            streams: Arc::new(KinesisStream::new(&sdk, endpoints.kinesis.as_deref())),
            tables: Arc::new(move |name: &str| -> Arc<dyn LeaseTable> {
                Arc::new(DynamoLeaseTable::new(
                    &table_sdk,
                    dynamodb_endpoint.as_deref(),
                    name,
                ))
            }),
            metrics: Arc::new(CloudWatchMetrics::new(
                &sdk,
                endpoints.cloudwatch.as_deref(),
            )),
            clock: Clock::new(),
        }
    }

    pub fn streams(&self) -> &Arc<dyn StreamClient> {
        &self.streams
    }

    pub fn lease_table(&self, application: &str) -> Arc<dyn LeaseTable> {
        (self.tables)(application)
    }
}

/// Why a worker could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("worker: {0} is required (call WorkerBuilder::{0})")]
    Missing(&'static str),
    #[error("stream {stream}")]
    Stream {
        stream: String,
        #[source]
        source: StreamError,
    },
    #[error("lease table {table}")]
    LeaseTable {
        table: String,
        #[source]
        source: LeaseError,
    },
    #[error("worker could not start its actors: {0}")]
    Spawn(String),
    #[error("worker stopped: {0}")]
    Stopped(String),
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

    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.settings.worker.stream = stream.into();
        self
    }

    /// The application name, which is also the lease table's name.
    pub fn application(mut self, application: impl Into<String>) -> Self {
        self.settings.worker.application = application.into();
        self
    }

    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.settings.worker.worker_id = Some(id.into());
        self
    }

    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
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

    /// Checks the settings, makes sure the lease table exists and the stream is there,
    /// and starts the actors. Returns once they run; leases are taken in the background.
    pub async fn start(self) -> Result<Worker, WorkerError> {
        let settings = self.settings;
        settings.validate()?;
        let backend = self.backend.ok_or(WorkerError::Missing("backend"))?;
        let processor = self.processor.ok_or(WorkerError::Missing("processor"))?;
        let initial_timestamp = settings.worker.initial_timestamp()?;
        let stream = settings.worker.stream.clone();
        let application = settings.worker.application.clone();
        let me = WorkerId::new(
            settings
                .worker
                .worker_id
                .clone()
                .unwrap_or_else(generated_worker_id),
        );
        let table = backend.lease_table(&application);
        retrying(|| table.ensure_table(), LeaseError::is_retryable)
            .await
            .map_err(|source| WorkerError::LeaseTable {
                table: application.clone(),
                source,
            })?;
        retrying(
            || backend.streams.describe_stream_summary(&stream),
            StreamError::is_retryable,
        )
        .await
        .map_err(|source| WorkerError::Stream {
            stream: stream.clone(),
            source,
        })?;
        let initial = match settings.worker.initial_position {
            InitialPosition::TrimHorizon => Checkpoint::TrimHorizon,
            InitialPosition::Latest => Checkpoint::Latest,
            InitialPosition::AtTimestamp => Checkpoint::AtTimestamp,
        };
        let fatal = Arc::new(Mutex::new(None));
        let shutdown_timeout = settings.supervision.shutdown_timeout;
        let drain_limit = settings.drain_limit();
        let status_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>> = Arc::default();
        let ctx = Arc::new(WorkerContext {
            me: me.clone(),
            application,
            stream,
            streams: backend.streams.clone(),
            table,
            metrics_sink: backend.metrics.clone(),
            settings: Arc::new(settings),
            processor,
            initial,
            initial_timestamp,
            clock: backend.clock,
            fatal: fatal.clone(),
            delivered: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            lags: Default::default(),
            fleet: Arc::new(tokio::sync::watch::channel(None).0),
            listing: Arc::new(tokio::sync::watch::channel(None).0),
            status_addr: status_addr.clone(),
        });
        let (supervisor, join) = Actor::spawn(None, Supervisor, ctx)
            .await
            .map_err(|e| WorkerError::Spawn(e.to_string()))?;
        info!(message = "Worker started.", worker_id = %me);
        Ok(Worker {
            id: me,
            supervisor,
            join: Some(join),
            fatal,
            shutdown_timeout,
            drain_limit,
            status_addr: status_addr.get().copied(),
        })
    }
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

fn generated_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned());
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
    shutdown_timeout: std::time::Duration,
    drain_limit: std::time::Duration,
    status_addr: Option<std::net::SocketAddr>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish()
    }
}

/// How long `status()` waits for the whole tree to answer.
const STATUS_TIMEOUT_MS: u64 = 30_000;

impl Worker {
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::default()
    }

    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// Where the status endpoint listens (`status.bind`, with the port the system
    /// picked when it was 0); `None` when `status.enabled` is false.
    pub fn status_addr(&self) -> Option<std::net::SocketAddr> {
        self.status_addr
    }

    pub async fn status(&self) -> Result<WorkerStatus, WorkerError> {
        ractor::call_t!(self.supervisor, SupervisorMsg::Status, STATUS_TIMEOUT_MS)
            .map_err(|e| self.stopped_or(e.to_string()))
    }

    /// Stops gracefully. First the worker drains: it tells the fleet (its heartbeat says
    /// `draining`), and each lease a live peer asks for is handed over — the processor
    /// finishes the batch in hand, gets `shutdown_requested`, the checkpoint is flushed,
    /// and the peer starts exactly there. It waits at most two heartbeat intervals for
    /// askers (not at all when no peer is alive); the leases nobody asked for are then
    /// stopped the same way and released. Returns when all of that is done; the report
    /// says honestly what did not succeed (see [`ShutdownReport::clean`]).
    pub async fn shutdown(mut self) -> Result<ShutdownReport, WorkerError> {
        // The drain (handing leases to peers that ask), then readers, the final flush,
        // the release and the metrics each get the shutdown timeout; the supervisor's
        // own bookkeeping gets a little more.
        let timeout = (self.drain_limit + 4 * self.shutdown_timeout).as_millis() as u64 + 10_000;
        let result = ractor::call_t!(self.supervisor, SupervisorMsg::Shutdown, timeout)
            .map_err(|e| self.stopped_or(e.to_string()));
        if let Some(join) = self.join.take() {
            let _ = join.await;
        }
        result
    }

    /// Waits until the worker stops on its own (a core actor failing past its restart
    /// intensity). Useful in `select!` beside a signal handler.
    pub async fn wait(&mut self) -> Result<(), WorkerError> {
        if let Some(join) = self.join.as_mut() {
            let _ = join.await;
            self.join = None;
        }
        match self.fatal() {
            Some(reason) => Err(WorkerError::Stopped(reason)),
            None => Ok(()),
        }
    }

    /// Stops at once without releasing anything: what a crash looks like to the fleet.
    pub fn abort(mut self) {
        self.supervisor.kill();
        self.join = None;
    }

    fn fatal(&self) -> Option<String> {
        self.fatal.lock().ok().and_then(|f| f.clone())
    }

    fn stopped_or(&self, error: String) -> WorkerError {
        match self.fatal() {
            Some(reason) => WorkerError::Stopped(reason),
            None => WorkerError::Unresponsive(error),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.join.is_some() {
            self.supervisor.kill();
        }
    }
}
