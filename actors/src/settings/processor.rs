//! `[processor]`: how each shard's records reach the processor (issue 33). Lambda's event
//! source mapping offers the same for Lambda functions only: `parallelism` is its
//! `ParallelizationFactor`, `filter` its `FilterCriteria`.
//!
//! Every setting at its default (one lane, no filter) is the behaviour before them: one
//! processor per shard, handed every record.

use serde::{Deserialize, Serialize};

use super::{SettingsError, invalid, quoted};
use crate::model::RecordFilter;

/// The most lanes a shard may have. Lambda's `ParallelizationFactor` stops at 10; a lane
/// here costs one processor (or one MultiLang child), so more are allowed, but not so
/// many that a worker's shards become thousands of children by a typo.
pub const MAX_PARALLELISM: u16 = 100;

/// `[processor]`: lanes within a shard, and which records are handed over at all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessorSettings {
    /// Lanes per shard: records are dealt to lanes by a hash of their partition key,
    /// each lane has its own processor and gets its batches in order, and up to this
    /// many batches of one shard are processed at once. Records of one key are always
    /// processed in order. 1 (the default): one batch at a time, as the Java KCL does.
    pub parallelism: u16,
    /// Lambda filter-criteria patterns (JSON, as in a Lambda event source mapping's
    /// `FilterCriteria.Filters[].Pattern`) over a record's `data` (parsed as JSON) and
    /// `partitionKey`. A record matching none of them is checkpointed past without a
    /// call. Empty (the default): every record is handed over.
    pub filter: Vec<String>,
}

impl Default for ProcessorSettings {
    fn default() -> Self {
        Self {
            parallelism: 1,
            filter: Vec::new(),
        }
    }
}

impl ProcessorSettings {
    /// Whether a shard's records are dealt to more than one lane.
    pub fn has_lanes(&self) -> bool {
        self.parallelism > 1
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if !(1..=MAX_PARALLELISM).contains(&self.parallelism) {
            return Err(invalid(
                "processor.parallelism",
                self.parallelism,
                format!(
                    "must be 1 to {MAX_PARALLELISM}: the lanes (processors) per shard that \
                     process batches at once, records of one partition key always in one lane"
                ),
            ));
        }
        // Checked here, at start, as Lambda checks a mapping's filters when it is made:
        // a pattern that cannot mean anything must not drop records once running.
        if let Err(error) = RecordFilter::parse(&self.filter) {
            return Err(invalid(
                "processor.filter",
                quoted(&error.pattern),
                error.to_string(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parallelism_is_one_to_a_hundred() {
        for (parallelism, ok) in [(0, false), (1, true), (16, true), (100, true), (101, false)] {
            let settings = ProcessorSettings {
                parallelism,
                ..ProcessorSettings::default()
            };
            assert_eq!(settings.validate().is_ok(), ok, "{parallelism}");
        }
        let error = ProcessorSettings {
            parallelism: 0,
            ..ProcessorSettings::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(error.contains("processor.parallelism"), "{error}");
    }

    #[test]
    fn filter_patterns_are_checked() {
        let with = |filter: &[&str]| ProcessorSettings {
            filter: filter.iter().map(|p| (*p).to_owned()).collect(),
            ..ProcessorSettings::default()
        };
        assert!(with(&[]).validate().is_ok());
        assert!(
            with(&[
                r#"{"data": {"kind": ["order"]}}"#,
                r#"{"partitionKey": [{"prefix": "eu-"}]}"#
            ])
            .validate()
            .is_ok()
        );
        let error = with(&[
            r#"{"partitionKey": ["a"]}"#,
            r#"{"data": {"n": [{"numeric": [">"]}]}}"#,
        ])
        .validate()
        .unwrap_err();
        assert_eq!(error.key(), "processor.filter");
        let error = error.to_string();
        assert!(
            error.starts_with(
                r#"settings: processor.filter = "{\"data\": {\"n\": [{\"numeric\": [\">\"]}]}}": "#
            ),
            "{error}"
        );
        assert!(
            error.contains(r#"processor.filter[1]: data.n: "numeric" wants pairs"#),
            "{error}"
        );
    }
}
