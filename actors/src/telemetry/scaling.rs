//! The fleet's recommended worker count (`crate::scale`), each lease-keeper round: its
//! gauges every round, and a log line when the figure changes (the rounds between say
//! nothing new).

use tracing::info;

use super::{Event, Metric, Sample};
use crate::scale::Recommendation;

/// This round's recommendation, and the figure of the round before (`None` at the
/// first): an INFO when they differ, and the figure with its inputs as gauges.
pub(crate) struct ScaleRecommended {
    pub recommendation: Recommendation,
    pub before: Option<u32>,
}

impl Event for ScaleRecommended {
    fn log(&self) {
        let Recommendation {
            workers,
            reason,
            inputs,
            ..
        } = self.recommendation;
        if self.before == Some(workers) {
            return;
        }
        info!(
            message = "Recommended worker count changed.",
            recommended_workers = workers,
            before = self.before,
            reason = reason.as_str(),
            workers = inputs.workers,
            leases = inputs.leases,
            records_per_second = inputs.records_per_second,
            bytes_per_second = inputs.bytes_per_second,
            largest_lag_ms = inputs.largest_lag_ms,
        );
    }

    fn samples(&self) -> Vec<Sample> {
        let Recommendation {
            workers, inputs, ..
        } = self.recommendation;
        let mut out = vec![
            Sample::new(Metric::RecommendedWorkers, f64::from(workers)),
            Sample::new(Metric::FleetWorkers, f64::from(inputs.workers)),
            Sample::new(Metric::FleetLeases, f64::from(inputs.leases)),
            Sample::new(
                Metric::FleetRecordsPerSecond,
                inputs.records_per_second as f64,
            ),
            Sample::new(Metric::FleetLargestLag, inputs.largest_lag_ms as f64),
        ];
        if let Some(bytes) = inputs.bytes_per_second {
            out.push(Sample::new(Metric::FleetBytesPerSecond, bytes as f64));
        }
        out
    }
}
