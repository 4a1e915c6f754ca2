//! This worker's heartbeat: one row per worker, bumped every `heartbeat_interval`,
//! instead of renewing every lease, so lease-table writes grow with workers, not with
//! shards. The row carries the worker's load (lease count, records/s, per-shard lags,
//! per-lease rates under throughput balance) and its change counter, which tells peers
//! to read the lease rows. Each confirmed or failed heartbeat feeds [`Fencing`]
//! (self-fencing): confirmed as of when it was sent, so a slow answer or a freeze in
//! between never stretches the fencing window.
//!
//! [`Fencing`]: crate::fencing::Fencing

use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::backend::LeaseError;
use crate::boards::LagBoard;
use crate::model::{LeaseKey, RateMeter, WorkerLoad};
use crate::settings::BalanceMode;
use crate::telemetry::{Call, CallFailed, Metric, Sample};

use super::held::Holdings;
use super::ports::Ports;
use super::pure;

/// How often a heartbeat that stays unconfirmed past the fence time is reported again.
const STALL_REPORT_EVERY: Duration = Duration::from_secs(30);

pub(super) struct Beat {
    /// The row's counter as last confirmed.
    pub counter: u64,
    /// The change counter as written in the last confirmed heartbeat.
    published: u64,
    /// The delivered-records count and time at the last heartbeat.
    last_rate: (u64, Instant),
    /// Each held lease's smoothed rates, published with the heartbeat.
    rates: RateMeter,
    /// When the unconfirmed heartbeat was last reported at ERROR (repeated every
    /// [`STALL_REPORT_EVERY`], not at every beat).
    stall_reported: Option<Instant>,
}

/// What a heartbeat reports on, besides the leases held.
pub(super) struct Load<'a> {
    pub lags: &'a LagBoard,
    pub draining: bool,
}

impl Beat {
    /// `delivered`: the records delivered so far, the base of the first rate.
    pub fn new(delivered: u64, now: Instant) -> Self {
        Self {
            counter: 0,
            published: 0,
            last_rate: (delivered, now),
            rates: RateMeter::new(),
            stall_reported: None,
        }
    }

    /// Whether an urgent change is not in a confirmed heartbeat yet, so one must be
    /// written now (peers read the lease rows at their next round, not the one after).
    /// Only then: an extra heartbeat also moves this worker's last sign of life, which a
    /// crash right after would turn into a later failover. Clears `urgent` either way.
    pub fn publish_due(&self, held: &mut Holdings, stopped: bool) -> bool {
        let due = held.urgent && held.changes != self.published && !stopped;
        held.urgent = false;
        due
    }

    fn load(&mut self, ports: &Ports<'_>, held: &Holdings, from: &Load<'_>) -> WorkerLoad {
        let now = Instant::now();
        let delivered = from.lags.delivered_total();
        let (before, at) = self.last_rate;
        let rate = pure::rate(delivered, before, now.saturating_duration_since(at));
        self.last_rate = (delivered, now);
        let held_now = |shard: &String| held.held.contains_key(&LeaseKey::new(shard.as_str()));
        let mut lag_ms = from.lags.snapshot();
        lag_ms.retain(|shard, _| held_now(shard));
        let mut subscribed_ms = from.lags.subscription_ages();
        subscribed_ms.retain(|shard, _| held_now(shard));
        let totals = from
            .lags
            .delivered_totals(|key| held.held.contains_key(key));
        let lease_rates = self.rates.sample(&totals, &lag_ms, held.held.keys(), now);
        let settings = ports.lease();
        WorkerLoad {
            leases: held.held.len() as u64,
            records_per_second: rate,
            draining: from.draining,
            changes: held.changes,
            lag_ms,
            subscribed_ms,
            // Measured whatever the mode (cheap); published only by a worker that
            // balances on throughput, since publishing is what tells peers it does.
            lease_rates: match settings.balance {
                BalanceMode::Throughput => Some(lease_rates),
                BalanceMode::Count => None,
            },
            heartbeat_interval_ms: Some(settings.heartbeat_interval.as_millis() as u64),
            failover_time_ms: Some(settings.failover_time.as_millis() as u64),
        }
    }

    /// Writes the heartbeat and feeds the fencing board. An error is returned for the
    /// caller's part: `NotFound` (the table is gone) before anything is counted; any
    /// other after it is logged, counted and on the board.
    pub async fn write(
        &mut self,
        ports: &Ports<'_>,
        held: &Holdings,
        from: &Load<'_>,
    ) -> Result<(), LeaseError> {
        let sent = Instant::now();
        let load = self.load(ports, held, from);
        let result = ports.table.heartbeat(ports.me, &load).await;
        if result.is_ok() {
            self.published = self.published.max(load.changes);
        }
        let fence_time = ports.lease().fence_time();
        let mut fencing = ports.fencing.lock();
        let unconfirmed_for = fencing
            .last_confirmed()
            .map(|at| Instant::now().saturating_duration_since(at));
        let (failures, failed) = match result {
            Ok(counter) => {
                self.counter = counter;
                // Confirmed as of when the write was sent, not when it was answered: a
                // slow answer (or a freeze in between) must not stretch the fencing
                // window. After a gap, the fence stays on until the scan rereads.
                fencing.heartbeat_confirmed(sent, Instant::now());
                if self.stall_reported.take().is_some() {
                    info!(
                        message = "Heartbeat confirmed again; each held lease delivers once its row is read again.",
                        worker_id = %ports.me,
                        unconfirmed_ms = unconfirmed_for.map(|d| d.as_millis() as u64),
                    );
                }
                (0, None)
            }
            Err(error) => {
                if matches!(error, LeaseError::NotFound { .. }) {
                    return Err(error);
                }
                let failures = fencing.heartbeat_failed(error.to_string());
                if pure::heartbeat_stall_due(
                    unconfirmed_for,
                    fence_time,
                    self.stall_reported.map(|at| at.elapsed()),
                    STALL_REPORT_EVERY,
                ) {
                    self.stall_reported = Some(Instant::now());
                    error!(
                        message = "Heartbeat not confirmed for longer than the fence time: every held shard has stopped delivering, and peers will take its leases after the failover time.",
                        worker_id = %ports.me,
                        unconfirmed_ms = unconfirmed_for.map(|d| d.as_millis() as u64),
                        failures,
                        held = held.held.len(),
                        %error,
                    );
                } else {
                    warn!(message = "Heartbeat not written.", worker_id = %ports.me, failures, %error);
                }
                ports.out.emit(&CallFailed {
                    call: Call::Heartbeat,
                    shard: None,
                    error: &error,
                });
                (failures, Some(error))
            }
        };
        let fenced = fencing.fenced_count(Instant::now());
        drop(fencing);
        ports.out.record(vec![
            Sample::new(Metric::HeartbeatFailures, f64::from(failures)),
            Sample::new(Metric::ShardsFenced, fenced as f64),
        ]);
        failed.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease_keeper::ports::testing::Rig;

    fn load(lags: &LagBoard) -> Load<'_> {
        Load {
            lags,
            draining: false,
        }
    }

    /// An urgent change is written at once, once: not again when the confirmed
    /// heartbeat already carries it, and never once stopped.
    #[tokio::test(start_paused = true)]
    async fn an_urgent_change_is_published_once() {
        let rig = Rig::new("me").await;
        let lags = LagBoard::default();
        let mut beat = Beat::new(0, Instant::now());
        let mut held = Holdings::default();
        held.changed();
        held.urgent = true;
        assert!(beat.publish_due(&mut held, false));
        assert!(!held.urgent, "the flag is cleared either way");
        beat.write(&rig.ports(), &held, &load(&lags)).await.unwrap();
        held.urgent = true;
        assert!(
            !beat.publish_due(&mut held, false),
            "the confirmed heartbeat already carries the change"
        );
        held.changed();
        held.urgent = true;
        assert!(!beat.publish_due(&mut held, true), "stopped: nothing more");
    }

    /// A confirmed heartbeat is what the fencing board counts from, and its counter is
    /// what the status shows; the table gone is returned before anything is counted.
    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_feeds_the_fencing_board() {
        let rig = Rig::new("me").await;
        let lags = LagBoard::default();
        let mut beat = Beat::new(0, Instant::now());
        let held = Holdings::default();
        assert!(rig.fencing.lock().last_confirmed().is_none());
        beat.write(&rig.ports(), &held, &load(&lags)).await.unwrap();
        assert_eq!(beat.counter, 1);
        assert!(rig.fencing.lock().last_confirmed().is_some());
        let db_less = Rig::on(
            std::sync::Arc::new(crate::backend::memory::MemoryDynamo::new().lease_table("gone")),
            "me",
        );
        let error = beat
            .write(&db_less.ports(), &held, &load(&lags))
            .await
            .unwrap_err();
        assert!(matches!(error, LeaseError::NotFound { .. }), "{error}");
        assert!(db_less.out.samples.lock().unwrap().is_empty());
        assert_eq!(db_less.fencing.lock().failures().0, 0);
    }
}
