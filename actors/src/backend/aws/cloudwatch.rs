//! [`MetricsSink`] on CloudWatch `PutMetricData`.
//!
//! The SDK speaks Smithy RPC-v2 CBOR to CloudWatch (a POST to
//! `/service/GraniteServiceVersion20100801/operation/PutMetricData`); the contract suite
//! in `tests/contract_metrics.rs` checks this adapter on that wire format through a
//! loopback capture server, since no local emulator speaks it.

use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_cloudwatch::operation::put_metric_data::PutMetricDataError;
use aws_sdk_cloudwatch::types::{Dimension, MetricDatum as SdkDatum, StandardUnit, StatisticSet};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::DateTime;
use futures::future::BoxFuture;

use super::Failure;

use crate::backend::{MetricDatum, MetricValue, MetricsError, MetricsSink, batches, validate};

/// The IAM actions this adapter calls, one per SDK operation in this file; a test
/// (`tests/deploy.rs`) reads the file and keeps the two equal. PutMetricData has no
/// resource-level permissions: a policy fences it with the `cloudwatch:namespace`
/// condition key instead.
pub const IAM_ACTIONS: &[&str] = &["cloudwatch:PutMetricData"];

/// Publishes to CloudWatch. Retries are the SDK's (its retry config in the
/// `SdkConfig`); this adapter adds none.
///
/// A `put` that needs several calls stops at the first failed call: the calls before it
/// were published, so a caller that re-sends the whole set may publish those twice.
#[derive(Debug, Clone)]
pub struct CloudWatchMetrics {
    client: aws_sdk_cloudwatch::Client,
    /// Named in transient errors so an operator can tell which endpoint is unreachable.
    endpoint: String,
}

impl CloudWatchMetrics {
    /// `endpoint` replaces the AWS endpoint (a local server or a capture in tests).
    pub fn new(sdk: &aws_config::SdkConfig, endpoint: Option<&str>) -> Self {
        let mut config = aws_sdk_cloudwatch::config::Builder::from(sdk);
        if let Some(url) = endpoint {
            config = config.endpoint_url(url);
        }
        Self {
            client: aws_sdk_cloudwatch::Client::from_conf(config.build()),
            endpoint: super::endpoint_name(sdk, "monitoring", endpoint),
        }
    }

    async fn put_all(&self, namespace: &str, data: Vec<MetricDatum>) -> Result<(), MetricsError> {
        validate(&data)?;
        for batch in batches(data) {
            self.client
                .put_metric_data()
                .namespace(namespace)
                .set_metric_data(Some(batch.iter().map(to_sdk).collect()))
                .send()
                .await
                .map_err(|err| self.classify(err))?;
        }
        Ok(())
    }

    fn classify(&self, err: SdkError<PutMetricDataError, HttpResponse>) -> MetricsError {
        let message = super::error_text(&err);
        match super::classify(&err) {
            Failure::Throttled => MetricsError::Throttled {
                message: err.message().map_or(message, str::to_owned),
            },
            Failure::Transient => MetricsError::Transient {
                endpoint: self.endpoint.clone(),
                message,
            },
            Failure::Denied | Failure::Other => MetricsError::Other { message },
        }
    }
}

impl MetricsSink for CloudWatchMetrics {
    fn put<'a>(
        &'a self,
        namespace: &'a str,
        data: Vec<MetricDatum>,
    ) -> BoxFuture<'a, Result<(), MetricsError>> {
        Box::pin(self.put_all(namespace, data))
    }
}

fn to_sdk(datum: &MetricDatum) -> SdkDatum {
    let builder = SdkDatum::builder()
        .metric_name(&datum.name)
        .set_dimensions(Some(
            datum
                .dimensions
                .iter()
                .map(|(name, value)| Dimension::builder().name(name).value(value).build())
                .collect(),
        ))
        .unit(StandardUnit::from(datum.unit.as_str()))
        .timestamp(DateTime::from(datum.timestamp));
    match datum.value {
        MetricValue::Value(value) => builder.value(value),
        MetricValue::Statistics {
            count,
            sum,
            min,
            max,
        } => builder.statistic_values(
            StatisticSet::builder()
                .sample_count(count)
                .sum(sum)
                .minimum(min)
                .maximum(max)
                .build(),
        ),
    }
    .build()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::backend::Unit;

    #[test]
    fn statistics_become_a_statistic_set_and_units_keep_their_cloudwatch_names() {
        let datum = MetricDatum {
            name: "ProcessingTime".into(),
            dimensions: vec![("ShardId".into(), "shardId-000000000001".into())],
            value: MetricValue::Statistics {
                count: 3.0,
                sum: 12.0,
                min: 1.0,
                max: 7.0,
            },
            unit: Unit::CountPerSecond,
            timestamp: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
        };
        let sdk = to_sdk(&datum);
        assert_eq!(sdk.metric_name(), Some("ProcessingTime"));
        assert_eq!(sdk.value(), None);
        let stats = sdk.statistic_values().unwrap();
        assert_eq!(
            (
                stats.sample_count(),
                stats.sum(),
                stats.minimum(),
                stats.maximum()
            ),
            (Some(3.0), Some(12.0), Some(1.0), Some(7.0))
        );
        assert_eq!(sdk.unit(), Some(&StandardUnit::CountSecond));
        assert_eq!(
            sdk.timestamp().unwrap().to_millis().unwrap(),
            1_700_000_000_250
        );
        let dims = sdk.dimensions();
        assert_eq!(
            (dims[0].name(), dims[0].value()),
            (Some("ShardId"), Some("shardId-000000000001"))
        );
    }

    #[test]
    fn every_unit_is_one_cloudwatch_knows() {
        for unit in [
            Unit::Count,
            Unit::Bytes,
            Unit::Milliseconds,
            Unit::Seconds,
            Unit::CountPerSecond,
            Unit::BytesPerSecond,
            Unit::Percent,
            Unit::None,
        ] {
            assert!(
                StandardUnit::values().contains(&unit.as_str()),
                "{unit:?} is no StandardUnit"
            );
        }
    }
}
