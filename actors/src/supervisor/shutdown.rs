//! The graceful stops, as sequences over the children's references: one shard's (a
//! handoff: its reader stopped as a shutdown stops it, its checkpoint flushed, its
//! lease passed on by the keeper) and the whole worker's. Each step waits at most the
//! shutdown timeout; what does not succeed in time is reported, never waited on longer.

use std::time::Duration;

use ractor::ActorRef;
use tracing::warn;

use super::core::{Core, StatusMsg};
use crate::metrics_reporter::MetricsMsg;
use crate::model::{Fence, LeaseKey, WorkerId};
use crate::protocol::{CheckpointMsg, KeeperMsg, ReaderMsg};
use crate::status::{ReleaseReport, ShardShutdown, ShutdownReport};

/// Where a gracefully stopped lease goes.
pub(crate) enum Passing {
    /// To the worker that asked for it.
    To(WorkerId),
    /// Back to nobody: its stream left the set.
    Release,
}

/// A shard whose reader did not answer the shutdown: nothing is known to be finished
/// or flushed.
fn no_answer(key: &LeaseKey, error: impl std::fmt::Display) -> ShardShutdown {
    ShardShutdown {
        shard_id: key.shard_id(),
        processor_ok: false,
        checkpoint_flushed: false,
        error: Some(format!("no answer from the shard reader: {error}")),
    }
}

/// Asks a reader to stop the way a shutdown does (its processor finishes the batch in
/// hand and may checkpoint).
async fn ask_to_stop(
    key: &LeaseKey,
    reader: &ActorRef<ReaderMsg>,
    timeout_ms: u64,
) -> ShardShutdown {
    match ractor::call_t!(reader, ReaderMsg::Shutdown, timeout_ms) {
        Ok(outcome) => outcome,
        Err(error) => no_answer(key, error),
    }
}

/// Waits for a reader to stop; one that does not in time is killed.
async fn wait_or_kill(reader: &ActorRef<ReaderMsg>, timeout: Duration) {
    if reader.wait(Some(timeout)).await.is_err() {
        reader.kill();
    }
}

/// Stops the shard's reader (if it has one), flushes, and asks the keeper to pass the
/// lease on (or release it, for a former stream's lease). The waiting happens in a
/// task, so the supervisor goes on serving meanwhile.
pub(crate) fn pass_on(
    core: &Core,
    key: LeaseKey,
    fence: Fence,
    passing: Passing,
    reader: Option<ActorRef<ReaderMsg>>,
    timeout: Duration,
) {
    let timeout_ms = timeout.as_millis() as u64;
    let writer = core.writer.clone();
    let keeper = core.keeper.clone();
    tokio::spawn(async move {
        let mut outcome = ShardShutdown {
            shard_id: key.shard_id(),
            processor_ok: true,
            checkpoint_flushed: true,
            error: None,
        };
        if let Some(reader) = reader {
            outcome = ask_to_stop(&key, &reader, timeout_ms).await;
            wait_or_kill(&reader, timeout).await;
        }
        let flushed = ractor::call_t!(
            writer,
            |reply| CheckpointMsg::Flush {
                key: key.clone(),
                reply
            },
            timeout_ms
        );
        if !matches!(flushed, Ok(Ok(()))) {
            outcome.checkpoint_flushed = false;
        }
        let _ = writer.cast(CheckpointMsg::Forget(key.clone()));
        let _ = keeper.cast(match passing {
            Passing::To(to) => KeeperMsg::Transfer {
                key,
                fence,
                to,
                outcome,
            },
            Passing::Release => KeeperMsg::Retired {
                key,
                fence,
                outcome,
            },
        });
    });
}

/// Processors finish and checkpoint, checkpoints are flushed, leases released,
/// metrics published; then every child is stopped explicitly.
pub(crate) async fn stop_all(
    core: &Core,
    readers: Vec<(LeaseKey, ActorRef<ReaderMsg>)>,
    status_server: Option<ActorRef<StatusMsg>>,
    timeout: Duration,
) -> ShutdownReport {
    let timeout_ms = timeout.as_millis() as u64;
    let mut errors = Vec::new();
    let asks = readers
        .iter()
        .map(|(key, reader)| ask_to_stop(key, reader, timeout_ms));
    let mut shards: Vec<ShardShutdown> = futures::future::join_all(asks).await;
    shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
    for (_, reader) in &readers {
        wait_or_kill(reader, timeout).await;
    }
    let checkpoint_failures =
        match ractor::call_t!(core.writer, CheckpointMsg::FlushAll, timeout_ms) {
            Ok(failures) => failures.into_iter().map(|e| e.to_string()).collect(),
            Err(error) => vec![format!("checkpoint writer: {error}")],
        };
    let mut leases = match ractor::call_t!(core.keeper, KeeperMsg::ReleaseAll, timeout_ms) {
        Ok(report) => report,
        Err(error) => {
            errors.push(format!("lease keeper: {error}"));
            ReleaseReport::default()
        }
    };
    shards.append(&mut leases.handed_off_shards);
    shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
    match ractor::call_t!(core.metrics, MetricsMsg::Flush, timeout_ms) {
        Ok(Ok(_)) => {}
        // Metrics are not worth failing a shutdown over; they are reported.
        Ok(Err(error)) => warn!(message = "Final metrics not published.", %error),
        Err(error) => warn!(message = "Final metrics not published.", %error),
    }
    for (name, cell) in core.cells() {
        if cell.stop_and_wait(None, Some(timeout)).await.is_err() {
            errors.push(format!("{name} did not stop in time"));
            cell.kill();
        }
    }
    if let Some(server) = status_server
        && server.stop_and_wait(None, Some(timeout)).await.is_err()
    {
        server.kill();
    }
    ShutdownReport {
        shards,
        checkpoint_failures,
        leases,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_that_does_not_answer_finished_and_flushed_nothing() {
        let key = LeaseKey::new("acct:orders:1700000000:shardId-000000000003");
        let outcome = no_answer(&key, "timed out");
        assert_eq!(outcome.shard_id.as_str(), "shardId-000000000003");
        assert!(!outcome.processor_ok);
        assert!(!outcome.checkpoint_flushed);
        assert_eq!(
            outcome.error.as_deref(),
            Some("no answer from the shard reader: timed out")
        );
        let report = ShutdownReport {
            shards: vec![outcome],
            checkpoint_failures: Vec::new(),
            leases: ReleaseReport::default(),
            errors: Vec::new(),
        };
        assert!(
            !report.clean(),
            "a reader that did not answer is not a clean stop"
        );
    }
}
