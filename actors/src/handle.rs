//! [`WorkerHandle`]: how a processor (through its [`crate::Checkpointer`]) or the
//! embedding service asks a running worker to stop gracefully. Plain shared state, no
//! actor: the worker (`worker.rs`) watches it and runs the shutdown.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

/// Asks the worker it belongs to for a graceful shutdown: the same one as
/// [`crate::Worker::shutdown`] (drain, hand off, flush, release). Cheap to clone and
/// `Send`; reach it from a processor with [`crate::Checkpointer::worker`], or from the
/// service with [`crate::Worker::handle`].
///
/// For what a processor cannot get past on its own: a poison record, a quota reached, a
/// downstream system gone for good. [`crate::Worker::wait`] then returns the reason and
/// the shutdown's report, so the service can exit.
#[derive(Clone)]
pub struct WorkerHandle {
    /// The first request's reason; `None` while nobody has asked.
    request: Arc<watch::Sender<Option<String>>>,
}

impl fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("shutdown_requested", &self.shutdown_reason())
            .finish()
    }
}

impl WorkerHandle {
    pub(crate) fn new() -> Self {
        Self {
            request: Arc::new(watch::channel(None).0),
        }
    }

    /// Starts the graceful shutdown and returns at once, so a processor may call it from
    /// `process` and return: its shard is stopped like every other one (the batch in
    /// hand finishes, `shutdown_requested` is called, the checkpoint flushed, the lease
    /// handed off or released).
    ///
    /// Returns `false` if a shutdown was already requested: the first reason is the one
    /// [`crate::Worker::wait`] reports.
    pub fn request_shutdown(&self, reason: impl Into<String>) -> bool {
        let reason = reason.into();
        self.request.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(reason);
            true
        })
    }

    /// Why a shutdown was requested, if it was.
    pub fn shutdown_reason(&self) -> Option<String> {
        self.request.borrow().clone()
    }

    /// Resolves with the reason once a shutdown is requested.
    pub(crate) async fn requested(&self) -> String {
        let mut requests = self.request.subscribe();
        // The sender lives in `self`, so the wait cannot fail; the guard is let go of
        // before anything else is awaited.
        let reason = requests
            .wait_for(Option::is_some)
            .await
            .map(|reason| reason.clone());
        match reason {
            Ok(Some(reason)) => reason,
            Ok(None) | Err(_) => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_reason_wins_and_wakes_the_waiter() {
        let handle = WorkerHandle::new();
        assert_eq!(handle.shutdown_reason(), None);
        let waiter = tokio::spawn({
            let handle = handle.clone();
            async move { handle.requested().await }
        });
        assert!(handle.clone().request_shutdown("poison record"));
        assert!(!handle.request_shutdown("quota"));
        assert_eq!(handle.shutdown_reason().as_deref(), Some("poison record"));
        assert!(matches!(waiter.await.as_deref(), Ok("poison record")));
        // Asked before anyone waits: the waiter sees it at once.
        assert_eq!(handle.requested().await, "poison record");
    }
}
