//! [`WorkerBuilder`]: a worker's settings, backend, processor and stream set, and its
//! start: the boot step (`boot.rs`), then the actors.

use std::fmt;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use ractor::{Actor, ActorRef};
use tracing::info;

use super::backend::{Backend, check_aws_settings};
use super::boot::{self, Booted};
use super::error::WorkerError;
use super::running::{Outcome, Worker, run_shutdown};
use crate::backend::LeaseTable;
use crate::handle::WorkerHandle;
use crate::model::WorkerId;
use crate::processor::{
    BoxedProcessor, Processor, ProcessorActorFactory, ProcessorFactory, ProcessorSource,
};
use crate::protocol::{ProcessorMsg, ShardInfo};
use crate::settings::Settings;
use crate::spans::Spanned;
use crate::stream_set::StreamSet;
use crate::supervisor::{Supervisor, WorkerContext};

impl Worker {
    /// A builder with the default settings; a backend and a processor are required.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::default()
    }
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
    /// through the checkpointer and answer the reply ports of [`ProcessorMsg`]. A batch
    /// it cannot process it reports with `Checkpointer::fail_batch`. Under `[failure]`
    /// it runs behind a processor host instead, which hands it one part of a batch at a
    /// time and waits for its ack or failure (or for it to stop: a new actor from
    /// `factory` then takes the retry), so the policy is a `Processor`'s.
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
        let set_source = boot::adopt_set(&mut settings, self.stream_set).await?;
        settings.validate()?;
        let backend = self.backend.ok_or(WorkerError::Missing("backend"))?;
        if let Some(built_for) = &backend.aws {
            check_aws_settings(built_for, &settings.aws)?;
        }
        let processor = self.processor.ok_or(WorkerError::Missing("processor"))?;
        // Opened before anything is created, so a destination this backend cannot write
        // fails the start with why.
        let dead_letters = settings
            .failure
            .destination
            .as_ref()
            .map(|destination| backend.dead_letters(destination))
            .transpose()?;
        let me = WorkerId::new(
            settings
                .worker
                .worker_id
                .clone()
                .unwrap_or_else(generated_worker_id),
        );
        let Booted {
            streams,
            resolved,
            table,
            status_listener,
        } = boot::boot(&settings, &backend).await?;
        let application = settings.worker.application.clone();
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
        let span = crate::spans::worker(&me, &application, &resolved.stream);
        let ctx = Arc::new(WorkerContext {
            me: me.clone(),
            application,
            stream: resolved.stream,
            streams,
            set: Arc::new(
                tokio::sync::watch::channel(Arc::new(crate::model::StreamSetView::fixed(
                    resolved.consumed,
                )))
                .0,
            ),
            set_source,
            origin: resolved.origin,
            table,
            renewing,
            metrics_sink: backend.metrics.clone(),
            settings: Arc::new(settings),
            processor,
            dead_letters,
            clock: backend.clock,
            fatal: fatal.clone(),
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
