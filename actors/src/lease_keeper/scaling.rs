//! The fleet's recommended worker count, each round (`crate::scale`): judged from the
//! heartbeat rows this round read and the lease rows of the last scan, published as
//! gauges with its inputs (`ScaleRecommended`). The keeper keeps only what the pure
//! rule cannot: the lag's last readings, the last rounds' loads, and the figure last
//! published.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::balance::{Observations, processable};
use crate::model::{Lease, LeaseKey};
use crate::scale::{Fleet, LagTrend, LoadWindow, Recommendation, Targets, recommend};
use crate::telemetry::ScaleRecommended;

use super::ports::Ports;

#[derive(Default)]
pub(super) struct Scaling {
    trend: LagTrend,
    window: LoadWindow,
    last: Option<u32>,
}

impl Scaling {
    /// Judges and publishes this round's recommendation. `dealt`: the rows of the last
    /// scan (`None` before the first, when there is nothing to judge yet).
    pub fn round(
        &mut self,
        ports: &Ports<'_>,
        observations: &Observations,
        dealt: Option<&[Lease]>,
        draining: bool,
        now: Instant,
    ) -> Option<Recommendation> {
        let dealt = dealt?;
        let settings = ports.settings;
        let failover = settings.lease.failover_time;
        let by_key: BTreeMap<&LeaseKey, &Lease> = dealt.iter().map(|l| (&l.key, l)).collect();
        let leases = dealt.iter().filter(|l| processable(l, &by_key)).count();
        let members = observations
            .members(ports.me, draining, now, failover)
            .len();
        let alive = observations.alive(now, failover);
        let mut fleet = Fleet::from_loads(
            alive.iter().filter_map(|w| observations.load_of(w)),
            u32::try_from(members).unwrap_or(u32::MAX),
            u32::try_from(leases).unwrap_or(u32::MAX),
            settings.lease.max_leases,
        );
        fleet.lag_trend = self.trend.observe(fleet.largest_lag_ms);
        // A failover time of rounds: a lease move is done within one.
        let rounds = failover.as_millis() / settings.lease.heartbeat_interval.as_millis().max(1);
        (self.window).peak(&mut fleet, usize::try_from(rounds).unwrap_or(usize::MAX));
        let recommendation = recommend(&fleet, &Targets::from_settings(&settings.scaling));
        ports.out.emit(&ScaleRecommended {
            recommendation,
            before: self.last,
        });
        self.last = Some(recommendation.workers);
        Some(recommendation)
    }
}
