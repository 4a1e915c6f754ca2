//! The fault injector on the [`MetricsSink`] (op `PutMetricData`).

use futures::future::BoxFuture;

use super::{ENDPOINT, Faulty, Injected};
use crate::backend::{MetricDatum, MetricsError, MetricsSink};

impl Injected for MetricsError {
    fn throttled(_op: &'static str) -> Self {
        MetricsError::Throttled {
            message: "injected throttle".into(),
        }
    }
    fn transient(_op: &'static str, why: &str) -> Self {
        MetricsError::Transient {
            endpoint: ENDPOINT.into(),
            message: why.into(),
        }
    }
}

impl<B: MetricsSink> MetricsSink for Faulty<B> {
    fn put<'a>(
        &'a self,
        namespace: &'a str,
        data: Vec<MetricDatum>,
    ) -> BoxFuture<'a, Result<(), MetricsError>> {
        Box::pin(self.run("PutMetricData", self.inner.put(namespace, data)))
    }
}
