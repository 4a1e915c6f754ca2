//! The CloudWatch port.

use std::time::SystemTime;

use futures::future::BoxFuture;

/// CloudWatch units flotilla publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// A number of things (records, calls, leases).
    Count,
    /// A size in bytes.
    Bytes,
    /// A duration or lag in milliseconds.
    Milliseconds,
    /// A duration in seconds.
    Seconds,
    /// A rate (`Count/Second`).
    CountPerSecond,
    /// A rate of bytes (`Bytes/Second`).
    BytesPerSecond,
    /// A share, 0 to 100.
    Percent,
    /// No unit (CloudWatch's `None`).
    None,
}

impl Unit {
    /// The name CloudWatch uses on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            Unit::Count => "Count",
            Unit::Bytes => "Bytes",
            Unit::Milliseconds => "Milliseconds",
            Unit::Seconds => "Seconds",
            Unit::CountPerSecond => "Count/Second",
            Unit::BytesPerSecond => "Bytes/Second",
            Unit::Percent => "Percent",
            Unit::None => "None",
        }
    }
}

/// One value, or a statistic set summarising many (what flotilla sends for timings, so
/// a minute of samples costs one datum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricValue {
    /// One sample.
    Value(f64),
    /// Many samples summarised (CloudWatch's `StatisticValues`).
    Statistics {
        /// How many samples (`SampleCount`).
        count: f64,
        /// Their sum (`Sum`).
        sum: f64,
        /// The smallest (`Minimum`).
        min: f64,
        /// The largest (`Maximum`).
        max: f64,
    },
}

/// One data point of PutMetricData (CloudWatch's `MetricDatum`).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricDatum {
    /// The `MetricName`, e.g. `"RecordsProcessed"`.
    pub name: String,
    /// `Dimensions` as (name, value) pairs, e.g. `("ShardId", "shardId-000000000001")`;
    /// at most [`MAX_DIMENSIONS`].
    pub dimensions: Vec<(String, String)>,
    /// The value or statistic set; must be finite (see [`validate`]).
    pub value: MetricValue,
    /// The `Unit` of the value.
    pub unit: Unit,
    /// When the data point was measured (`Timestamp`), wall-clock.
    pub timestamp: SystemTime,
}

/// PutMetricData limits: at most this many datums per call…
pub const MAX_DATUMS_PER_CALL: usize = 1000;
/// …and at most this many bytes of request payload (1 MB; we keep a margin).
pub const MAX_BYTES_PER_CALL: usize = 900 * 1024;
/// At most this many dimensions on one datum.
pub const MAX_DIMENSIONS: usize = 30;

/// A generous estimate of a datum's encoded size, so a batch never exceeds the limit
/// whichever protocol (query, JSON or CBOR) carries it.
fn estimated_bytes(datum: &MetricDatum) -> usize {
    let dims: usize = datum
        .dimensions
        .iter()
        .map(|(n, v)| n.len() + v.len() + 32)
        .sum();
    datum.name.len() + dims + 160
}

/// Splits datums into PutMetricData calls within the service limits, keeping order.
/// Pure, so the limits are tested without a server.
pub fn batches(data: Vec<MetricDatum>) -> Vec<Vec<MetricDatum>> {
    let mut out: Vec<Vec<MetricDatum>> = Vec::new();
    let mut current: Vec<MetricDatum> = Vec::new();
    let mut bytes = 0;
    for datum in data {
        let size = estimated_bytes(&datum);
        if !current.is_empty()
            && (current.len() == MAX_DATUMS_PER_CALL || bytes + size > MAX_BYTES_PER_CALL)
        {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push(datum);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Why publishing metrics failed. Only [`Self::Invalid`] loses data: the reporter drops
/// what was refused, and keeps anything else for its next interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    /// A datum CloudWatch would refuse (too many dimensions, a non-finite value); found
    /// before sending, and nothing is sent. Repeating fails the same way.
    #[error("metric {name}: {why}")]
    Invalid {
        /// The datum's metric name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// CloudWatch asked us to slow down: retry later.
    #[error("PutMetricData: throttled by CloudWatch: {message}")]
    Throttled {
        /// The server's error text, for logs.
        message: String,
    },
    /// A network failure, a timeout or a 5xx: retry later.
    #[error("PutMetricData: transient failure talking to {endpoint}: {message}")]
    Transient {
        /// The URL the call went to.
        endpoint: String,
        /// The error text, for logs.
        message: String,
    },
    /// Any other failure (access denied, a refused request, no CloudWatch in this build).
    #[error("PutMetricData: {message}")]
    Other {
        /// The error text, for logs.
        message: String,
    },
}

/// Publishing metrics.
///
/// Contract (checked by `tests/contract_metrics.rs`): `put` sends every datum, in calls
/// within the service limits ([`batches`]); a datum with more than [`MAX_DIMENSIONS`]
/// dimensions or a non-finite value is `Invalid` and nothing is sent.
pub trait MetricsSink: Send + Sync + 'static {
    /// PutMetricData: sends `data` under the CloudWatch `namespace`.
    fn put<'a>(
        &'a self,
        namespace: &'a str,
        data: Vec<MetricDatum>,
    ) -> BoxFuture<'a, Result<(), MetricsError>>;
}

/// Checks what CloudWatch would refuse, before anything is sent.
pub fn validate(data: &[MetricDatum]) -> Result<(), MetricsError> {
    for datum in data {
        let invalid = |why: String| MetricsError::Invalid {
            name: datum.name.clone(),
            why,
        };
        if datum.dimensions.len() > MAX_DIMENSIONS {
            return Err(invalid(format!(
                "{} dimensions; CloudWatch allows at most {MAX_DIMENSIONS}",
                datum.dimensions.len()
            )));
        }
        let finite = match datum.value {
            MetricValue::Value(v) => v.is_finite(),
            MetricValue::Statistics {
                count,
                sum,
                min,
                max,
            } => [count, sum, min, max].iter().all(|v| v.is_finite()),
        };
        if !finite {
            return Err(invalid("value is not a finite number".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datum(name: &str, dims: usize) -> MetricDatum {
        MetricDatum {
            name: name.into(),
            dimensions: (0..dims)
                .map(|i| (format!("d{i}"), "x".repeat(200)))
                .collect(),
            value: MetricValue::Value(1.0),
            unit: Unit::Count,
            timestamp: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn batches_respect_count_and_size_and_keep_order() {
        let many: Vec<_> = (0..2500).map(|i| datum(&format!("m{i}"), 1)).collect();
        let split = batches(many);
        assert_eq!(
            split.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![1000, 1000, 500]
        );
        assert_eq!(split[1][0].name, "m1000");

        let fat: Vec<_> = (0..1000).map(|i| datum(&format!("m{i}"), 30)).collect();
        let split = batches(fat);
        assert!(
            split.len() > 1,
            "1000 datums of 30 long dimensions exceed 1 MB"
        );
        for batch in &split {
            assert!(batch.iter().map(estimated_bytes).sum::<usize>() <= MAX_BYTES_PER_CALL);
        }
        assert_eq!(split.iter().map(Vec::len).sum::<usize>(), 1000);
        assert!(batches(Vec::new()).is_empty());
    }

    #[test]
    fn validation_names_the_metric_and_the_problem() {
        let err = validate(&[datum("Wide", 31)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "metric Wide: 31 dimensions; CloudWatch allows at most 30"
        );
        let mut nan = datum("Nan", 0);
        nan.value = MetricValue::Value(f64::NAN);
        assert_eq!(
            validate(&[nan]).unwrap_err().to_string(),
            "metric Nan: value is not a finite number"
        );
    }
}
