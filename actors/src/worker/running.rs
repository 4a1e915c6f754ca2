//! [`Worker`]: the handle on a running worker (its status, its graceful shutdown, its
//! end), and [`StatusProbe`], the status without the handle.

use std::fmt;
use std::sync::{Arc, Mutex};

use ractor::ActorRef;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

use super::error::WorkerError;
use crate::handle::WorkerHandle;
use crate::model::WorkerId;
use crate::protocol::SupervisorMsg;
use crate::status::{ShutdownReport, WorkerStatus};

/// The one graceful shutdown's result, whoever started it: `Worker::shutdown` or a
/// [`WorkerHandle`] request. An error is the call's, as text.
pub(super) type Outcome = Arc<OnceCell<Result<ShutdownReport, String>>>;

pub(super) async fn run_shutdown(
    supervisor: ActorRef<SupervisorMsg>,
    timeout_ms: u64,
) -> Result<ShutdownReport, String> {
    ractor::call_t!(supervisor, SupervisorMsg::Shutdown, timeout_ms).map_err(|e| e.to_string())
}

/// A running worker. Dropping it without [`Worker::shutdown`] stops it abruptly, like a
/// crash: leases stay owned until they expire, and the next owner resumes from the
/// last checkpoint.
pub struct Worker {
    pub(super) id: WorkerId,
    pub(super) supervisor: ActorRef<SupervisorMsg>,
    pub(super) join: Option<JoinHandle<()>>,
    pub(super) fatal: Arc<Mutex<Option<String>>>,
    /// How long the supervisor may take over a graceful shutdown.
    pub(super) shutdown_call_ms: u64,
    pub(super) status_addr: Option<std::net::SocketAddr>,
    pub(super) handle: WorkerHandle,
    pub(super) outcome: Outcome,
    /// Waits for a [`WorkerHandle`] request and runs the shutdown it asks for.
    pub(super) stopper: Option<JoinHandle<()>>,
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

impl Worker {
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
