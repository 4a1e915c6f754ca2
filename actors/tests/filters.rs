//! `processor.filter`: Lambda's filter-criteria patterns over a record's data and
//! partition key, on the memory backend in paused time. Records that match no pattern
//! never reach the processor, the checkpoint moves past them all the same (nothing is
//! read again after a restart), and they are counted.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{MetricValue, PutRecord, StreamAdmin as _};
use flotilla_actors::model::Checkpoint;
use flotilla_actors::settings::MetricsLevel;
use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError, Settings, Worker};
use support::probe::{fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM, shutdown_clean};

/// Keeps the data of every record it is handed.
struct Keep(Arc<Mutex<Vec<String>>>);

impl Processor for Keep {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.0.lock().unwrap().extend(
            batch
                .records()
                .iter()
                .map(|r| String::from_utf8_lossy(&r.data).into_owned()),
        );
        Ok(())
    }
}

fn put(key: &str, data: &str) -> PutRecord {
    PutRecord {
        partition_key: key.to_owned(),
        explicit_hash_key: None,
        data: Bytes::from(data.to_owned()),
    }
}

async fn start(rig: &Rig, seen: &Arc<Mutex<Vec<String>>>, settings: Settings) -> Worker {
    let seen = seen.clone();
    Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |_| Keep(seen.clone()))
        .start()
        .await
        .unwrap()
}

/// Orders of any region, and anything keyed `eu-…`, pass; the rest (other kinds,
/// data that is not JSON) is checkpointed past unseen and counted in
/// `RecordsFiltered`. With 1 and 4 lanes alike. Breaks if the filter is not applied
/// (the processor sees everything), or if the filtered records are not acked (the
/// checkpoint would stop before them).
#[tokio::test(start_paused = true)]
async fn records_matching_no_pattern_are_checkpointed_past_unseen() {
    for lanes in [1u16, 4] {
        let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
        let mut records = Vec::new();
        let mut want = Vec::new();
        for i in 0..60 {
            let (key, data, pass) = match i % 4 {
                0 => (
                    format!("us-{i}"),
                    format!(r#"{{"kind":"order","n":{i}}}"#),
                    true,
                ),
                1 => (
                    format!("us-{i}"),
                    format!(r#"{{"kind":"refund","n":{i}}}"#),
                    false,
                ),
                2 => (format!("eu-{i}"), format!("not json {i}"), true),
                _ => (format!("us-{i}"), format!("not json {i}"), false),
            };
            if pass {
                want.push(data.clone());
            }
            records.push(put(&key, &data));
        }
        // The last record is filtered out: the checkpoint must still reach it.
        records.push(put("us-last", r#"{"kind":"refund"}"#));
        rig.streams.put_records(STREAM, &records).await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut settings = fast_settings(STREAM, APP);
        settings.processor.parallelism = lanes;
        settings.processor.filter = vec![
            r#"{"data": {"kind": ["order"]}}"#.to_owned(),
            r#"{"partitionKey": [{"prefix": "eu-"}]}"#.to_owned(),
        ];
        settings.metrics.level = MetricsLevel::Detailed;
        settings.metrics.interval = Duration::from_secs(1);
        let worker = start(&rig, &seen, settings).await;
        let s = seen.clone();
        let count = want.len();
        wait_until(
            "the matching records",
            Duration::from_secs(60),
            Duration::from_millis(50),
            move || s.lock().unwrap().len() >= count,
        )
        .await;
        let shard = rig.shards().await.remove(0).id;
        let last = rig
            .records(&shard)
            .await
            .last()
            .unwrap()
            .sequence_number
            .clone();
        let mut reached = false;
        for _ in 0..100 {
            if matches!(rig.lease_of(&shard).await.checkpoint, Checkpoint::At(at) if at.sequence == last)
            {
                reached = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            reached,
            "{lanes} lanes: the checkpoint passed the filtered tail"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        shutdown_clean(worker).await;
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{lanes} lanes: only what a pattern matches");
        let filtered: f64 = rig
            .metrics
            .datums()
            .iter()
            .filter(|d| {
                d.name == "RecordsFiltered" && d.dimensions.iter().any(|(k, _)| k == "ShardId")
            })
            .map(|d| match d.value {
                MetricValue::Statistics { sum, .. } => sum,
                MetricValue::Value(v) => v,
            })
            .sum();
        assert_eq!(
            filtered,
            (records.len() - want.len()) as f64,
            "{lanes} lanes"
        );
    }
}

/// A pattern that cannot mean anything stops the worker at start with the setting's
/// name, as Lambda refuses such a mapping: no record is dropped by it.
#[tokio::test(start_paused = true)]
async fn a_bad_pattern_is_refused_at_start() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut settings = fast_settings(STREAM, APP);
    settings.processor.filter = vec![r#"{"data": {"kind": "order"}}"#.to_owned()];
    let error = Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(|_| Keep(Arc::default()))
        .start()
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("processor.filter"), "{error}");
}
