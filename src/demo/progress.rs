//! The progress line printed once a second: produced, processed, the rate since the
//! last line, the greatest lag, checkpoint writes, and each worker's lease count.

use flotilla_actors::WorkerStatus;
use tokio::time::Instant;

use super::check::SharedCheck;
use super::fleet::Fleet;

/// The one-line-a-second progress report.
pub(super) struct Progress {
    last_at: Instant,
    last_deliveries: u64,
    started: Instant,
}

impl Progress {
    pub(super) fn new(started: Instant) -> Self {
        Self {
            last_at: started,
            last_deliveries: 0,
            started,
        }
    }

    pub(super) fn line(
        &mut self,
        fleet: &Fleet,
        statuses: &[WorkerStatus],
        produced: u64,
        check: &SharedCheck,
    ) -> String {
        let now = Instant::now();
        let (deliveries, processed) = {
            let check = check.lock();
            (check.deliveries(), check.processed())
        };
        let seconds = now.duration_since(self.last_at).as_secs_f64();
        let rate = if seconds > 0.0 {
            (deliveries - self.last_deliveries) as f64 / seconds
        } else {
            0.0
        };
        self.last_at = now;
        self.last_deliveries = deliveries;

        let lag = statuses
            .iter()
            .flat_map(|s| &s.shards)
            .filter_map(|s| s.millis_behind_latest)
            .max()
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms"));
        let checkpoints: u64 = statuses.iter().map(checkpoint_writes).sum();
        let workers: Vec<String> = fleet
            .members
            .iter()
            .map(|m| match (&m.worker, &m.leases) {
                (None, _) => format!("{}=(crashed)", m.id),
                (Some(_), Some(leases)) => format!("{}={}", m.id, leases.held.len()),
                (Some(_), None) => format!("{}=-", m.id),
            })
            .collect();
        format!(
            "demo: {:>3}s produced={produced} processed={processed} records/s={rate:.0} \
             lag={lag} checkpoints={checkpoints} workers: {}",
            now.duration_since(self.started).as_secs(),
            workers.join(" ")
        )
    }
}

fn checkpoint_writes(status: &WorkerStatus) -> u64 {
    match status
        .metrics
        .as_ref()
        .and_then(|m| m.totals.get("CheckpointWrites"))
    {
        Some(&writes) => writes as u64,
        None => status.checkpoints.values().map(|c| c.writes).sum(),
    }
}
