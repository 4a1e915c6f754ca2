#![allow(clippy::unwrap_used)] // test support: a poisoned lock is a failed test
//! A processor that records what it was given, a producer of per-key sequences, and
//! the check that nothing was lost or reordered. Shared by the worker tests of every
//! backend tier.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::kpl::{UserRecord, aggregate};
use flotilla_actors::model::{Checkpoint, SequenceNumber, ShardId};
use flotilla_actors::oracle::{KeyedProducer, OrderCheck, parse_record};
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError, Settings, ShardInfo};

/// Settings for tests: short intervals, so paused-time runs take little virtual time and
/// real-time runs little wall time.
pub fn fast_settings(stream: &str, application: &str) -> Settings {
    let mut s = Settings::default();
    s.worker.stream = stream.to_owned();
    s.worker.application = application.to_owned();
    s.lease.failover_time = Duration::from_secs(6);
    s.lease.heartbeat_interval = Duration::from_millis(500);
    s.lease.fence_margin = Duration::from_secs(2);
    s.reader.poll_interval = Duration::from_millis(20);
    s.reader.idle_max = Duration::from_millis(200);
    s.reader.parent_poll_interval = Duration::from_millis(200);
    s.reader.shard_sync_interval = Duration::from_secs(2);
    s.reader.backoff_min = Duration::from_millis(20);
    s.reader.backoff_max = Duration::from_millis(500);
    s.checkpoint.interval = Duration::from_millis(500);
    s.supervision.restart_backoff_min = Duration::from_millis(20);
    s.supervision.restart_backoff_max = Duration::from_millis(500);
    s.supervision.shutdown_timeout = Duration::from_secs(10);
    // Many workers per test process: each gets a free port.
    s.status.bind = "127.0.0.1:0".to_owned();
    s.reader.mode = read_mode();
    s
}

/// The call that reads records in the tests' read mode, as the fault injector names
/// it: GetRecords, or a subscription's next event.
pub fn read_call() -> &'static str {
    match read_mode() {
        ReadMode::Polling => "GetRecords",
        ReadMode::Fanout => "SubscribeToShardEvent",
    }
}

/// The read mode the worker tests run in: polling, or fan-out when
/// `FLOTILLA_TEST_READ_MODE=fanout` (scripts/test.sh runs the worker and fleet suites
/// once in each mode).
pub fn read_mode() -> ReadMode {
    match std::env::var("FLOTILLA_TEST_READ_MODE").as_deref() {
        Ok("fanout") => ReadMode::Fanout,
        Ok("polling") | Err(_) => ReadMode::Polling,
        Ok(other) => panic!("FLOTILLA_TEST_READ_MODE={other}: expected polling or fanout"),
    }
}

/// What every processor of a test saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Per partition key, the sequence numbers in the order they were processed.
    pub by_key: HashMap<String, Vec<u64>>,
    pub deliveries: u64,
    pub initialized: Vec<ShardId>,
    pub shard_ended: Vec<ShardId>,
    pub shutdown_requested: Vec<ShardId>,
    pub lease_lost: Vec<ShardId>,
    /// Records that were not "key:seq" text (binary, large, aggregated payloads).
    pub other: Vec<(String, usize)>,
}

/// The verdict on what was seen against what was produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub produced: u64,
    pub processed: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub order_violations: u64,
}

impl Seen {
    /// Every record through the library's per-key order oracle
    /// (`flotilla_actors::oracle`), key by key in the order processed.
    pub fn verdict(&self, produced: &BTreeMap<String, u64>) -> Verdict {
        let mut check = OrderCheck::default();
        for (key, numbers) in &self.by_key {
            for &number in numbers {
                check.observe_number(key, number);
            }
        }
        Verdict {
            produced: produced.values().sum(),
            processed: check.processed(),
            lost: check.lost(produced.iter().map(|(k, &n)| (k, n))),
            duplicates: check.duplicates(),
            order_violations: check.violations(),
        }
    }

    pub fn distinct(&self) -> u64 {
        self.by_key
            .values()
            .map(|v| v.iter().collect::<std::collections::HashSet<_>>().len() as u64)
            .sum()
    }
}

/// How a probe misbehaves, to exercise restarts.
#[derive(Debug, Clone, Default)]
pub struct Misbehave {
    /// Fail `process` this many times when it meets this record ("key:seq").
    pub fail_on: Option<(String, u32)>,
    /// Panic once when it meets this record.
    pub panic_on: Option<String>,
    /// Hang (an hour) once when it meets this record.
    pub stall_on: Option<String>,
    /// Take this long over every batch.
    pub slow: Option<Duration>,
}

#[derive(Debug, Default)]
struct Tripwires {
    failures_left: u32,
    panicked: bool,
    stalled: bool,
}

/// Records everything into a shared [`Seen`].
pub struct Probe {
    seen: Arc<Mutex<Seen>>,
    shard: ShardId,
    misbehave: Misbehave,
    trips: Arc<Mutex<Tripwires>>,
    /// Set when the probe works for one worker of a [`Fleet`].
    seat: Option<Seat>,
}

/// Makes probes for a worker; clones share what they see.
#[derive(Clone)]
pub struct ProbeFactory {
    pub seen: Arc<Mutex<Seen>>,
    misbehave: Misbehave,
    trips: Arc<Mutex<Tripwires>>,
    /// The fleet and the worker id this factory's probes report to, if any.
    fleet: Option<(Fleet, String)>,
}

impl ProbeFactory {
    pub fn new(misbehave: Misbehave) -> Self {
        let failures_left = misbehave.fail_on.as_ref().map(|(_, n)| *n).unwrap_or(0);
        Self {
            seen: Arc::default(),
            misbehave,
            trips: Arc::new(Mutex::new(Tripwires {
                failures_left,
                panicked: false,
                stalled: false,
            })),
            fleet: None,
        }
    }

    /// A factory for worker `worker` of `fleet`: it shares what this one has seen, and
    /// its probes also tell the fleet when they are inside `process()` and what they were
    /// given.
    pub fn in_fleet(&self, fleet: &Fleet, worker: &str) -> Self {
        Self {
            fleet: Some((fleet.clone(), worker.to_owned())),
            ..self.clone()
        }
    }

    /// A copy of what was seen so far (no lock held across the test's awaits).
    pub fn snapshot(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until `count` distinct records of the producer's keys have been processed.
    pub async fn wait_distinct(&self, count: u64, limit: Duration) {
        wait_until("every record", limit, Duration::from_millis(100), || {
            self.seen.lock().unwrap().distinct() >= count
        })
        .await;
    }

    /// Asserts that every produced record was processed, each key in order.
    pub fn assert_nothing_lost(&self, producer: &Producer) -> Verdict {
        let verdict = self.snapshot().verdict(&producer.produced);
        assert_eq!(
            (verdict.lost, verdict.order_violations),
            (0, 0),
            "{verdict:?}"
        );
        verdict
    }

    pub fn make(&self, shard: &ShardInfo) -> Probe {
        Probe {
            seen: self.seen.clone(),
            shard: shard.shard_id.clone(),
            misbehave: self.misbehave.clone(),
            trips: self.trips.clone(),
            seat: self
                .fleet
                .as_ref()
                .map(|(fleet, worker)| fleet.seat(shard, worker)),
        }
    }
}

impl Processor for Probe {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.seen
            .lock()
            .unwrap()
            .initialized
            .push(shard.shard_id.clone());
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        // Inside `process()` from here until this returns or is dropped (a crash).
        let _inside = self.seat.as_ref().map(Seat::enter);
        if let Some(seat) = &self.seat
            && !seat.fleet.dwell.is_zero()
        {
            tokio::time::sleep(seat.fleet.dwell).await;
        }
        if let Some(pause) = self.misbehave.slow {
            tokio::time::sleep(pause).await;
        }
        // Check the tripwires first: a failed batch must count as not processed.
        for record in batch.records() {
            let text = std::str::from_utf8(&record.data).unwrap_or("");
            if let Some((key, _)) = &self.misbehave.fail_on
                && text == key
            {
                let mut trips = self.trips.lock().unwrap();
                if trips.failures_left > 0 {
                    trips.failures_left -= 1;
                    return Err(ProcessorError::msg(format!("probe refuses {text}")));
                }
            }
            if let Some(key) = &self.misbehave.stall_on
                && text == key
            {
                let first = {
                    let mut trips = self.trips.lock().unwrap();
                    !std::mem::replace(&mut trips.stalled, true)
                };
                if first {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
            }
            if let Some(key) = &self.misbehave.panic_on
                && text == key
            {
                let mut trips = self.trips.lock().unwrap();
                if !trips.panicked {
                    trips.panicked = true;
                    drop(trips);
                    panic!("probe panics on {text}");
                }
            }
        }
        let mut seen = self.seen.lock().unwrap();
        for record in batch.records() {
            seen.deliveries += 1;
            match parse_record(&record.data) {
                Some((key, seq)) if key == record.partition_key => {
                    seen.by_key.entry(key.to_owned()).or_default().push(seq)
                }
                _ => seen
                    .other
                    .push((record.partition_key.clone(), record.data.len())),
            }
        }
        drop(seen);
        if let Some(seat) = &self.seat {
            seat.delivered(batch.records());
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.seen
            .lock()
            .unwrap()
            .lease_lost
            .push(self.shard.clone());
    }

    async fn shard_ended(&mut self, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.seen
            .lock()
            .unwrap()
            .shard_ended
            .push(self.shard.clone());
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.seen
            .lock()
            .unwrap()
            .shutdown_requested
            .push(self.shard.clone());
        Ok(())
    }
}

/// Puts per-key sequences with the library's producer (`oracle::KeyedProducer`): each
/// call puts the next `per_key` records of each of `keys` keys (`key-0`, …),
/// interleaved, and remembers how many each key has.
#[derive(Debug)]
pub struct Producer {
    pub produced: BTreeMap<String, u64>,
    keys: KeyedProducer,
}

impl Default for Producer {
    fn default() -> Self {
        Self {
            produced: BTreeMap::new(),
            keys: KeyedProducer::new("key-", 0),
        }
    }
}

impl Producer {
    /// A producer whose keys are `{prefix}key-0`, …: several producers, one per stream,
    /// keep their keys apart.
    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            produced: BTreeMap::new(),
            keys: KeyedProducer::new(&format!("{prefix}key-"), 0),
        }
    }

    pub async fn put_round(
        &mut self,
        admin: &dyn StreamAdmin,
        stream: &str,
        keys: u32,
        per_key: u32,
    ) {
        let records = self.keys.rounds(keys, u64::from(per_key));
        for chunk in records.chunks(500) {
            admin.put_records(stream, chunk).await.unwrap();
            self.keys.confirm(chunk);
        }
        self.produced = self.keys.produced();
    }

    pub fn total(&self) -> u64 {
        self.produced.values().sum()
    }
}

/// Waits (in the test's time, paused or not) until `done` holds, checking every
/// `step`; panics with `what` after `limit`.
pub async fn wait_until(
    what: &str,
    limit: Duration,
    step: Duration,
    mut done: impl FnMut() -> bool,
) {
    let start = tokio::time::Instant::now();
    while !done() {
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(step).await;
    }
}

/// Records that are not plain text: a 1 MB one, invalid UTF-8, a KPL aggregate of
/// "agg:0".."agg:9" and a corrupt copy of it (delivered whole, as a plain record). With
/// the (partition key, length) each of the three non-text ones must arrive with, sorted.
pub fn special_records() -> (Vec<PutRecord>, Vec<(String, usize)>) {
    let good = aggregate_of_ten();
    let mut bad = good.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let expected_other = vec![
        ("agg-bad".to_owned(), bad.len()),
        ("big".to_owned(), 1_000_000),
        ("bin".to_owned(), 2),
    ];
    let record = |key: &str, data: Bytes| PutRecord {
        partition_key: key.into(),
        explicit_hash_key: None,
        data,
    };
    let records = vec![
        record("big", Bytes::from(vec![0xffu8; 1_000_000])),
        record("bin", Bytes::from_static(&[0xc3, 0x28])),
        record("agg", good),
        record("agg-bad", Bytes::from(bad)),
    ];
    (records, expected_other)
}

/// A KPL aggregate of ten user records "agg:0".."agg:9", partition key "agg".
pub fn aggregate_of_ten() -> Bytes {
    let users: Vec<UserRecord> = (0..10)
        .map(|i| UserRecord {
            partition_key: "agg".to_owned(),
            explicit_hash_key: None,
            data: Bytes::from(format!("agg:{i}")),
        })
        .collect();
    aggregate(&users)
}

/// What the processors of a fleet of workers did: who was inside `process()` for which
/// shard, and which records each processor (one per lease tenure) was given. Clones
/// share the log.
#[derive(Clone)]
pub struct Fleet {
    log: Arc<Mutex<FleetLog>>,
    /// How long each `process()` call takes, so that two callers for one shard at once
    /// would overlap for long enough to be seen.
    pub dwell: Duration,
}

/// The fleet's log. `overlaps` is the one that must stay empty.
#[derive(Debug, Clone, Default)]
pub struct FleetLog {
    /// Per shard, the (worker, tenure) pairs inside `process()` right now.
    inside: HashMap<ShardId, Vec<(String, usize)>>,
    /// A line per time a processor entered `process()` for a shard another processor was
    /// inside of.
    pub overlaps: Vec<String>,
    /// Per shard, every sequence number delivered by any worker.
    pub delivered: HashMap<ShardId, BTreeSet<SequenceNumber>>,
    /// One per processor made, indexed by the `usize` of `inside`.
    pub tenures: Vec<Tenure>,
    pub process_calls: u64,
}

/// One processor's life on one worker: where it was told reading starts, and the
/// sequence numbers it was given, in order.
#[derive(Debug, Clone)]
pub struct Tenure {
    pub shard: ShardId,
    pub worker: String,
    pub starting_at: Checkpoint,
    pub sequences: Vec<SequenceNumber>,
}

impl Fleet {
    pub fn new(dwell: Duration) -> Self {
        Self {
            log: Arc::default(),
            dwell,
        }
    }

    /// A copy of the log (no lock held across the test's awaits).
    pub fn snapshot(&self) -> FleetLog {
        self.log.lock().unwrap().clone()
    }

    /// Runs `look` on the log under its lock: no copy of a large log (`look` must not
    /// wait on the workers).
    pub fn with<R>(&self, look: impl FnOnce(&FleetLog) -> R) -> R {
        look(&self.log.lock().unwrap())
    }

    fn seat(&self, shard: &ShardInfo, worker: &str) -> Seat {
        let mut log = self.log.lock().unwrap();
        log.tenures.push(Tenure {
            shard: shard.shard_id.clone(),
            worker: worker.to_owned(),
            starting_at: shard.starting_at.clone(),
            sequences: Vec::new(),
        });
        Seat {
            fleet: self.clone(),
            shard: shard.shard_id.clone(),
            worker: worker.to_owned(),
            tenure: log.tenures.len() - 1,
        }
    }
}

/// A probe's place in the fleet.
struct Seat {
    fleet: Fleet,
    shard: ShardId,
    worker: String,
    tenure: usize,
}

impl Seat {
    fn enter(&self) -> Inside {
        let mut log = self.fleet.log.lock().unwrap();
        log.process_calls += 1;
        let now = tokio::time::Instant::now();
        let inside = log.inside.entry(self.shard.clone()).or_default();
        let others: Vec<String> = inside
            .iter()
            .map(|(w, t)| format!("{w} (tenure {t})"))
            .collect();
        inside.push((self.worker.clone(), self.tenure));
        if !others.is_empty() {
            let line = format!(
                "{}: {} (tenure {}) entered process() at {now:?} while {} inside",
                self.shard,
                self.worker,
                self.tenure,
                others.join(", ")
            );
            log.overlaps.push(line);
        }
        Inside {
            log: self.fleet.log.clone(),
            shard: self.shard.clone(),
            tenure: self.tenure,
        }
    }

    fn delivered(&self, records: &[flotilla_actors::Record]) {
        let mut log = self.fleet.log.lock().unwrap();
        let seqs: Vec<SequenceNumber> = records.iter().map(|r| r.sequence_number.clone()).collect();
        log.delivered
            .entry(self.shard.clone())
            .or_default()
            .extend(seqs.iter().cloned());
        log.tenures[self.tenure].sequences.extend(seqs);
    }
}

/// Leaves `process()` when dropped: on return, and when the call is cancelled (a crash).
struct Inside {
    log: Arc<Mutex<FleetLog>>,
    shard: ShardId,
    tenure: usize,
}

impl Drop for Inside {
    fn drop(&mut self) {
        // A poisoned lock means a test already failed; don't panic again in a drop.
        if let Ok(mut log) = self.log.lock()
            && let Some(inside) = log.inside.get_mut(&self.shard)
        {
            inside.retain(|(_, t)| *t != self.tenure);
        }
    }
}
