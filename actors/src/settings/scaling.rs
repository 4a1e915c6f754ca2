//! `[scaling]`: what the fleet's recommended worker count (`crate::scale`) is judged
//! against, for an autoscaler (KEDA, a Kubernetes HPA, ECS service autoscaling) to follow.
//! Every worker publishes the same figure each round; nothing here changes what a
//! worker does, only what it recommends.
//!
//! A worker's capacity is stated, not measured: how many records (or bytes) per second
//! one worker should carry, which the operator knows from a load test or from the
//! processor's cost. A measured capacity would follow the load it measures: a fleet
//! that falls behind would learn that it can carry less, and never ask for more.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{SettingsError, duration_text, invalid};

/// `[scaling]`: a worker's target load, the lag the fleet tolerates, and the margin
/// that keeps the recommendation from going back and forth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingSettings {
    /// Records per second one worker should carry at most (the fleet's records/s, as
    /// the heartbeats report it, over this is the worker count the load needs). 0: the
    /// load in records is not judged.
    pub target_records_per_second: u64,
    /// Bytes per second one worker should carry at most. 0: not judged. Needs
    /// `lease.balance = "throughput"`: only then do heartbeats carry bytes.
    pub target_bytes_per_second: u64,
    /// While the fleet's largest lag (MillisBehindLatest) is above this, the
    /// recommendation is never below the workers there are, and one more while the lag
    /// is not falling.
    #[serde(with = "duration_text")]
    pub lag_target: Duration,
    /// Scale-down hysteresis, in percent: fewer workers are recommended only when the
    /// load fits them at this much below the target (20: at 80% of it), so the figure
    /// does not go back and forth around a boundary.
    pub scale_down_margin_percent: u32,
}

impl Default for ScalingSettings {
    fn default() -> Self {
        Self {
            target_records_per_second: 0,
            target_bytes_per_second: 0,
            lag_target: Duration::from_secs(60),
            scale_down_margin_percent: 20,
        }
    }
}

impl ScalingSettings {
    /// `throughput`: whether `lease.balance` is `"throughput"` (heartbeats carry bytes).
    pub(super) fn validate(&self, throughput: bool) -> Result<(), SettingsError> {
        if self.scale_down_margin_percent >= 100 {
            return Err(invalid(
                "scaling.scale_down_margin_percent",
                self.scale_down_margin_percent,
                "must be below 100 (a margin of 100% would never scale down)",
            ));
        }
        if self.lag_target.is_zero() {
            return Err(invalid(
                "scaling.lag_target",
                "0s",
                "must be above 0: any lag at all would ask for one more worker",
            ));
        }
        if self.target_bytes_per_second > 0 && !throughput {
            return Err(invalid(
                "scaling.target_bytes_per_second",
                self.target_bytes_per_second,
                "needs lease.balance = \"throughput\": only then do heartbeats carry each \
                 worker's bytes per second (or use scaling.target_records_per_second)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_bad_value_names_its_key() {
        assert_eq!(ScalingSettings::default().validate(false), Ok(()));
        let cases: [(ScalingSettings, bool, &str); 3] = [
            (
                ScalingSettings {
                    scale_down_margin_percent: 100,
                    ..ScalingSettings::default()
                },
                true,
                "scaling.scale_down_margin_percent",
            ),
            (
                ScalingSettings {
                    lag_target: Duration::ZERO,
                    ..ScalingSettings::default()
                },
                true,
                "scaling.lag_target",
            ),
            (
                ScalingSettings {
                    target_bytes_per_second: 1_000_000,
                    ..ScalingSettings::default()
                },
                false,
                "scaling.target_bytes_per_second",
            ),
        ];
        for (settings, throughput, key) in cases {
            match settings.validate(throughput) {
                Err(SettingsError::Invalid { key: got, .. }) => assert_eq!(got, key),
                other => panic!("{key}: {other:?}"),
            }
        }
        let bytes = ScalingSettings {
            target_bytes_per_second: 1_000_000,
            ..ScalingSettings::default()
        };
        assert_eq!(bytes.validate(true), Ok(()));
    }
}
