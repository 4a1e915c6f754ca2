//! The fleet's recommended worker count on `GET /fleet` ([`FleetScaling`]): the figure
//! the lease keeper judged in its last round (`crate::scale`, the one rule, not judged
//! again here), laid over the fleet view when it is served ([`overlay_scaling`]), with
//! its reason, inputs, targets and age; or, before the keeper's first round, why there is
//! none.

use serde::Serialize;
use tokio::time::Instant;

use super::FleetView;
use crate::scale::{Fleet, Reason, Recommendation, Targets};

/// Why [`FleetView::scaling`] is `None`: the keeper has judged no round yet.
const NOT_JUDGED: &str = "the lease keeper has not judged a round yet (it judges one at the \
                          end of each round, once the lease table has been scanned)";

/// The recommendation of the observer's last lease-keeper round, as `/fleet` shows it
/// (the figure published as `RecommendedWorkers`, with its inputs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetScaling {
    /// How many workers the stream needs: at least 1, at most the processable leases.
    pub recommended_workers: u32,
    /// The rule that set it: `load`, `hold`, `lag_not_falling`, `behind`, `max_leases`
    /// or `leases`.
    pub reason: Reason,
    /// The reason in words, with the figures it rests on
    /// ([`Recommendation::why`]).
    pub why: String,
    /// What it was judged on: the live workers now (`inputs.workers`), the processable
    /// leases, the fleet's load (the highest of the last failover time's rounds) and its
    /// largest lag with its trend.
    pub inputs: Fleet,
    /// What it was judged against (`[scaling]`; a load target of 0 is not judged).
    pub targets: Targets,
    /// How long ago the round judged it, on the observer's clock.
    pub judged_ms_ago: u64,
}

impl FleetScaling {
    /// `recommendation`, judged `judged_ms_ago` ms ago.
    pub fn new(recommendation: &Recommendation, judged_ms_ago: u64) -> FleetScaling {
        FleetScaling {
            recommended_workers: recommendation.workers,
            reason: recommendation.reason,
            why: recommendation.why(),
            inputs: recommendation.inputs,
            targets: recommendation.targets,
            judged_ms_ago,
        }
    }
}

/// Lays the keeper's last recommendation (`last`: it and when its round judged it) over
/// the view; without one, `scaling` is `None` and `scaling_unknown` says why.
#[cfg_attr(not(feature = "status-server"), allow(dead_code))]
pub(crate) fn overlay_scaling(
    view: &mut FleetView,
    last: Option<(Recommendation, Instant)>,
    now: Instant,
) {
    view.scaling = last.map(|(recommendation, at)| {
        let ago = now.saturating_duration_since(at).as_millis();
        FleetScaling::new(&recommendation, u64::try_from(ago).unwrap_or(u64::MAX))
    });
    view.scaling_unknown = view.scaling.is_none().then(|| NOT_JUDGED.to_owned());
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scale::{Trend, recommend};

    /// `/fleet`'s `scaling`: the keeper's last figure with its reason, inputs, targets
    /// and age, as JSON; before the first round, `null` and why.
    #[test]
    fn fleet_json_carries_the_last_rounds_recommendation_or_why_not() {
        let judged = Instant::now();
        let mut view = FleetView::default();
        overlay_scaling(&mut view, None, judged);
        let json = serde_json::to_value(&view).unwrap_or_default();
        assert_eq!(json["scaling"], serde_json::Value::Null, "{json}");
        assert_eq!(json["scaling_unknown"], NOT_JUDGED, "{json}");

        // 2 workers carrying 4000 records/s at 1000 each: 4.
        let fleet = Fleet {
            workers: 2,
            leases: 8,
            records_per_second: 4_000,
            bytes_per_second: Some(3_000),
            largest_lag_ms: 1_500,
            lag_trend: Trend::Rising,
            ..Fleet::default()
        };
        let targets = Targets {
            records_per_second: 1_000,
            bytes_per_second: 0,
            lag_ms: 60_000,
            scale_down_margin_percent: 20,
        };
        let last = recommend(&fleet, &targets);
        overlay_scaling(
            &mut view,
            Some((last, judged)),
            judged + Duration::from_millis(1_200),
        );
        let json = serde_json::to_value(&view).unwrap_or_default();
        assert_eq!(json["scaling_unknown"], serde_json::Value::Null, "{json}");
        assert_eq!(
            json["scaling"],
            serde_json::json!({
                "recommended_workers": 4,
                "reason": "load",
                "why": "load above the target for 2 workers: 4000 records/s (target 1000 per worker)",
                "inputs": {
                    "workers": 2,
                    "leases": 8,
                    "max_leases": 0,
                    "records_per_second": 4000,
                    "bytes_per_second": 3000,
                    "largest_lag_ms": 1500,
                    "lag_trend": "rising",
                },
                "targets": {
                    "records_per_second": 1000,
                    "bytes_per_second": 0,
                    "lag_ms": 60000,
                    "scale_down_margin_percent": 20,
                },
                "judged_ms_ago": 1200,
            })
        );
    }
}
