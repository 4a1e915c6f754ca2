//! Log lines carry the worker's and each shard's spans, as an embedder's subscriber
//! sees them (memory backend, paused time).
//!
//! Alone in its own test binary: `tracing` caches each call site's interest
//! process-wide, and a call site first reached by another test's worker on another
//! thread while this test's thread-local subscriber was being registered could be left
//! disabled for it (a line missing in 1 fan-out run of many, when this test shared
//! `worker_memory`'s binary).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::{APP, Rig, STREAM, shutdown_clean};

const PATIENCE: Duration = Duration::from_secs(600);

/// A `tracing` writer into a shared buffer: what the worker logged, as JSON lines.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<serde_json::Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The span named `name` among a JSON log line's spans.
fn span<'a>(line: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    line["spans"].as_array()?.iter().find(|s| s["name"] == name)
}

/// A shard's reader logs in the shard's span (shard id, lease counter, worker id,
/// stream) under the worker's, the checkpoint writer's writes in a span naming the shard
/// and lease counter, the keeper in the worker's span: an embedder's subscriber sees
/// whose every line is without the call sites naming it. (The subscriber is this
/// thread's: the paused-time runtime runs every actor on it.)
#[tokio::test(start_paused = true)]
async fn log_lines_carry_the_worker_and_shard_spans() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let mut settings = fast_settings(STREAM, APP);
    settings.worker.worker_id = Some("spans-w".to_owned());
    settings.reader.shard_sync_interval = Duration::from_millis(100);
    let worker = rig.start_with(&probes, settings).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 20, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    // The parent's reader reads to its end and says so (in its span).
    let parent = rig.open_shards().await[0].clone();
    rig.split_in_half(&parent).await;
    producer.put_round(&rig.streams, STREAM, 20, 10).await;
    probes.wait_distinct(producer.total(), PATIENCE).await;
    shutdown_clean(worker).await;

    let lines = captured.lines();
    let message = |l: &serde_json::Value| l["fields"]["message"].as_str().unwrap_or("").to_owned();
    let read_to_end = lines
        .iter()
        .find(|l| message(l) == "Shard read to its end.")
        .unwrap_or_else(|| panic!("no reader line: {lines:#?}"));
    let shard = span(read_to_end, "shard").unwrap_or_else(|| panic!("{read_to_end}"));
    assert_eq!(shard["shard_id"], parent.id.as_str(), "{read_to_end}");
    assert_eq!(shard["worker_id"], "spans-w", "{read_to_end}");
    assert_eq!(shard["stream"], STREAM, "{read_to_end}");
    assert!(shard["lease_counter"].as_u64() >= Some(1), "{read_to_end}");
    let worker = span(read_to_end, "worker").unwrap_or_else(|| panic!("{read_to_end}"));
    assert_eq!(worker["worker_id"], "spans-w", "{read_to_end}");
    assert_eq!(worker["application"], APP, "{read_to_end}");

    let written = lines
        .iter()
        .find(|l| message(l) == "Checkpoint written.")
        .unwrap_or_else(|| panic!("no checkpoint line: {lines:#?}"));
    let checkpoint = span(written, "checkpoint").unwrap_or_else(|| panic!("{written}"));
    assert!(checkpoint["shard_id"].is_string(), "{written}");
    assert!(checkpoint["lease_counter"].as_u64() >= Some(1), "{written}");
    assert!(span(written, "worker").is_some(), "{written}");

    let moved = lines
        .iter()
        .find(|l| message(l) == "Lease moved.")
        .unwrap_or_else(|| panic!("no keeper line: {lines:#?}"));
    assert_eq!(
        span(moved, "worker").unwrap()["worker_id"],
        "spans-w",
        "{moved}"
    );
    assert!(span(moved, "shard").is_none(), "{moved}");
}
