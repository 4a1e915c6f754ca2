//! An in-process [`MetricsSink`] that keeps what it was given.
//!
//! It checks and splits exactly like the CloudWatch adapter (the same [`validate`] and
//! [`batches`]), so a test that reads it sees the calls CloudWatch would have received,
//! not just the datums.

use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::{self, BoxFuture, FutureExt};

use crate::backend::{MetricDatum, MetricsError, MetricsSink, batches, validate};

/// One PutMetricData call as CloudWatch would have received it: namespace and datums.
type Call = (String, Vec<MetricDatum>);

/// Clones share one record, so a test can keep a handle while the worker owns another.
#[derive(Debug, Default, Clone)]
pub struct MemoryMetrics {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl MemoryMetrics {
    /// A sink that has recorded nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<(String, Vec<MetricDatum>)> {
        self.lock().clone()
    }

    /// Every datum so far, in the order they were put, whichever call carried them.
    pub fn datums(&self) -> Vec<MetricDatum> {
        self.lock()
            .iter()
            .flat_map(|(_, data)| data.iter().cloned())
            .collect()
    }

    /// Forgets every call recorded so far (for every clone).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// A test that panicked while holding the lock must not hide what was recorded from
    /// the next reader, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Vec<Call>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MetricsSink for MemoryMetrics {
    fn put<'a>(
        &'a self,
        namespace: &'a str,
        data: Vec<MetricDatum>,
    ) -> BoxFuture<'a, Result<(), MetricsError>> {
        let result = validate(&data).map(|()| {
            let split = batches(data);
            self.lock()
                .extend(split.into_iter().map(|batch| (namespace.to_owned(), batch)));
        });
        future::ready(result).boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::backend::{MetricValue, Unit};

    fn datum(name: &str, value: f64) -> MetricDatum {
        MetricDatum {
            name: name.into(),
            dimensions: vec![("Shard".into(), "shardId-000".into())],
            value: MetricValue::Value(value),
            unit: Unit::Count,
            timestamp: SystemTime::UNIX_EPOCH,
        }
    }

    #[tokio::test]
    async fn clones_share_the_record_and_clear_empties_it() {
        let sink = MemoryMetrics::new();
        let handle = sink.clone();
        sink.put("ns", vec![datum("a", 1.0), datum("b", 2.0)])
            .await
            .unwrap();
        assert_eq!(handle.calls().len(), 1);
        assert_eq!(
            handle
                .datums()
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        handle.clear();
        assert!(sink.calls().is_empty());
    }

    #[tokio::test]
    async fn an_invalid_datum_records_nothing() {
        let sink = MemoryMetrics::new();
        let err = sink
            .put("ns", vec![datum("ok", 1.0), datum("bad", f64::INFINITY)])
            .await
            .unwrap_err();
        assert!(matches!(err, MetricsError::Invalid { ref name, .. } if name == "bad"));
        assert!(sink.calls().is_empty());
    }
}
