//! A fleet of workers on one stream, on the memory backend in paused time: workers join,
//! crash and leave, shards split and merge, on a seeded random schedule, while a producer
//! keeps writing per-key sequences. After every step: no shard is inside `process()` on
//! two workers at once, the held lease sets are disjoint, no record was jumped over, each
//! key is in order and no checkpoint went back. At the end the fleet must be balanced.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{IteratorPosition, StreamAdmin};
use flotilla_actors::model::{Checkpoint, Lease, LeaseKey, SequenceNumber, ShardId};
use flotilla_actors::{KeeperStatus, Settings, Worker};
use support::probe::{Fleet, FleetLog, Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::{APP, Rig, STREAM};
use support::sim::{SplitMix, rank};

/// Shards at the start, so as many leases; splits and merges add more.
const SHARDS: u32 = 200;
const START_WORKERS: usize = 10;
const MIN_LIVE: usize = 3;
const MAX_LIVE: usize = 12;
const STEPS: usize = 24;
/// Keys the producer writes one record of per round (spread over the shards by hash).
const KEYS: u32 = 1_000;
/// After each step: this many producer rounds, one per `ROUND_PAUSE`.
const ROUNDS_PER_STEP: u32 = 4;
const ROUND_PAUSE: Duration = Duration::from_millis(500);
/// How long the fleet is left alone, at most, to balance itself (virtual time).
const SETTLE: Duration = Duration::from_secs(60);
/// How often the balance is looked at while settling.
const BALANCE_POLL: Duration = Duration::from_secs(2);
/// How long the final drain may take (virtual time: it costs nothing).
const PATIENCE: Duration = Duration::from_secs(600);
/// How long each `process()` call takes: two overlapping callers would be seen.
const DWELL: Duration = Duration::from_millis(5);

#[tokio::test(start_paused = true)]
async fn a_churning_fleet_stays_correct_and_ends_balanced_seed_1() {
    run(1).await;
}

#[tokio::test(start_paused = true)]
async fn a_churning_fleet_stays_correct_and_ends_balanced_seed_2() {
    run(2).await;
}

#[tokio::test(start_paused = true)]
async fn a_churning_fleet_stays_correct_and_ends_balanced_seed_3() {
    run(3).await;
}

/// The same churn with every heartbeat read through an index that trails the rows by
/// a second (a third of the failover time): the checks after every step must hold as
/// they do with an index that never lags.
#[tokio::test(start_paused = true)]
async fn a_churning_fleet_stays_correct_with_a_lagging_heartbeat_index_seed_4() {
    run_lagging(4, Some(Duration::from_secs(1))).await;
}

fn fleet_settings(worker: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(worker.to_owned());
    s.lease.failover_time = Duration::from_secs(3);
    s.lease.heartbeat_interval = Duration::from_millis(500);
    s.lease.fence_margin = Duration::from_secs(1);
    // Small batches: more `process()` calls, more chances to catch an overlap.
    s.reader.max_records = 100;
    s.reader.window_records = 1_000;
    // Records are processed well before they are checkpointed: a crash replays some.
    s.checkpoint.interval = Duration::from_secs(2);
    // Caught-up shards are polled less often: the simulation's main cost.
    s.reader.poll_interval = Duration::from_millis(50);
    s.reader.idle_max = Duration::from_millis(500);
    s
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Join,
    Crash,
    Leave,
    Split,
    Merge,
}

struct Member {
    id: String,
    worker: Worker,
}

/// The balance once the fleet settled: processable leases, and per live worker how many
/// of them it holds.
#[derive(Debug)]
struct Balance {
    processable: usize,
    unheld: usize,
    held: BTreeMap<String, usize>,
}

impl Balance {
    fn bounds(&self) -> (usize, usize) {
        let n = self.held.len();
        (self.processable / n, self.processable.div_ceil(n))
    }

    fn is_fair(&self) -> bool {
        let (floor, ceil) = self.bounds();
        self.held.values().all(|&h| h == floor || h == ceil)
    }
}

struct Run {
    seed: u64,
    rng: SplitMix,
    rig: Rig,
    probes: ProbeFactory,
    fleet: Fleet,
    producer: Producer,
    live: Vec<Member>,
    joined: usize,
    /// Each worker's lease keeper as last seen (for the gained/given counts).
    last_status: BTreeMap<String, KeeperStatus>,
    checkpoints: HashMap<LeaseKey, Checkpoint>,
    progress: Progress,
    steps: BTreeMap<Step, u32>,
    /// The schedule so far, for failure messages.
    history: Vec<String>,
}

async fn run(seed: u64) {
    run_lagging(seed, None).await;
}

/// `index_lag`: how far the heartbeat index trails the rows.
async fn run_lagging(seed: u64, index_lag: Option<Duration>) {
    let wall = std::time::Instant::now();
    let started = tokio::time::Instant::now();
    let fleet = Fleet::new(DWELL);
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    if let Some(lag) = index_lag {
        rig.dynamo.lag_heartbeat_index(lag);
    }
    let mut run = Run {
        seed,
        rng: SplitMix::new(seed),
        rig,
        probes: ProbeFactory::new(Misbehave::default()),
        fleet,
        producer: Producer::default(),
        live: Vec::new(),
        joined: 0,
        last_status: BTreeMap::new(),
        checkpoints: HashMap::new(),
        progress: Progress::default(),
        steps: BTreeMap::new(),
        history: Vec::new(),
    };
    for _ in 0..START_WORKERS {
        run.join().await;
    }
    run.settle().await;
    run.check("start").await;

    for n in 0..STEPS {
        // Act while records are in flight: some processed, not all checkpointed.
        run.producer
            .put_round(&run.rig.streams, STREAM, KEYS, 1)
            .await;
        let offset = Duration::from_millis(run.rng.below(500));
        tokio::time::sleep(offset).await;
        let step = run.step().await;
        run.settle().await;
        run.check(&format!("step {n} ({step})")).await;
    }

    // Left alone (no records, no churn), the fleet should spread the leases evenly
    // within `SETTLE`.
    let settling = tokio::time::Instant::now();
    let mut balance = run.balance().await;
    while !balance.is_fair() && settling.elapsed() < SETTLE {
        tokio::time::sleep(BALANCE_POLL).await;
        balance = run.balance().await;
    }
    let settled_in = settling.elapsed();
    run.check("settled").await;
    let live_at_end = run.live.len();

    // Drain: everything produced is processed, then every worker leaves gracefully.
    run.probes
        .wait_distinct(run.producer.total(), PATIENCE)
        .await;
    while !run.live.is_empty() {
        run.leave(0).await;
    }
    run.check("drained").await;
    let verdict = run.probes.snapshot().verdict(&run.producer.produced);
    assert_eq!(
        (verdict.lost, verdict.order_violations),
        (0, 0),
        "seed {seed}: {verdict:?}"
    );
    let rows = run.rig.lease_rows().await;
    // Finished leases keep their last owner (a crashed one, too); the rest are released.
    for lease in rows.iter().filter(|l| !l.checkpoint.is_shard_end()) {
        assert_eq!(lease.owner, None, "seed {seed}: {} released", lease.key);
    }

    let (process_calls, processors) = run.fleet.with(|log| (log.process_calls, log.tenures.len()));
    let gained: u64 = run
        .last_status
        .values()
        .flat_map(|k| k.gained.values())
        .sum();
    let given: u64 = run
        .last_status
        .values()
        .flat_map(|k| k.given.values())
        .sum();
    let steps: Vec<String> = run
        .steps
        .iter()
        .map(|(step, n)| format!("{step:?} {n}").to_lowercase())
        .collect();
    let (floor, ceil) = balance.bounds();
    println!(
        "seed {seed}: {STEPS} steps ({}), {} workers at the end, {} leases, {} records, \
         {} duplicates, {} process() calls, {} processors made, lease moves gained {gained} \
         given {given}, {} of {} processable leases held by {live_at_end} workers (want {floor}..={ceil}, \
         {} unheld) after {settled_in:.0?}: {:?}, virtual {:.0?}, wall {:.1?}",
        steps.join(", "),
        live_at_end,
        rows.len(),
        verdict.produced,
        verdict.duplicates,
        process_calls,
        processors,
        balance.processable - balance.unheld,
        balance.processable,
        balance.unheld,
        balance.held.values().collect::<Vec<_>>(),
        started.elapsed(),
        wall.elapsed(),
    );
    assert!(
        balance.is_fair(),
        "seed {seed}: not balanced after {settled_in:.0?} settling: {} processable leases over {} \
         workers, each should hold {floor} or {ceil}: {:?}",
        balance.processable,
        balance.held.len(),
        balance.held
    );
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl Run {
    async fn join(&mut self) {
        let id = format!("w{:02}", self.joined);
        self.joined += 1;
        let probes = self.probes.in_fleet(&self.fleet, &id);
        let worker = self.rig.start_with(&probes, fleet_settings(&id)).await;
        self.live.push(Member { id, worker });
    }

    async fn leave(&mut self, index: usize) {
        let member = self.live.remove(index);
        let status = member.worker.status().await.unwrap();
        self.last_status
            .insert(member.id.clone(), status.leases.unwrap());
        let report = member.worker.shutdown().await.unwrap();
        assert!(
            report.clean(),
            "seed {}: {} left uncleanly: {report:#?}",
            self.seed,
            member.id
        );
    }

    /// Picks a step the bounds allow, and takes it.
    async fn step(&mut self) -> String {
        let mut allowed = vec![Step::Split, Step::Merge];
        if self.live.len() < MAX_LIVE {
            allowed.push(Step::Join);
        }
        if self.live.len() > MIN_LIVE {
            allowed.extend([Step::Crash, Step::Leave]);
        }
        let step = allowed[self.rng.index(allowed.len())];
        *self.steps.entry(step).or_default() += 1;
        let what = match step {
            Step::Join => {
                self.join().await;
                format!("{} joins", self.live.last().unwrap().id)
            }
            Step::Crash => {
                // Every other crash takes down the busiest worker, so that crashes move
                // leases even while one worker holds most of them.
                let index = if self.rng.below(2) == 0 {
                    self.busiest()
                } else {
                    self.rng.index(self.live.len())
                };
                let member = self.live.remove(index);
                let what = format!("{} crashes", member.id);
                member.worker.abort();
                what
            }
            Step::Leave => {
                let index = self.rng.index(self.live.len());
                let what = format!("{} leaves", self.live[index].id);
                self.leave(index).await;
                what
            }
            Step::Split => {
                let open: Vec<_> = self
                    .rig
                    .open_shards()
                    .await
                    .into_iter()
                    .filter(|s| s.hash_range.end > s.hash_range.start)
                    .collect();
                let shard = &open[self.rng.index(open.len())];
                let range = shard.hash_range;
                let at = range.start + (range.end - range.start).div_ceil(2);
                self.rig
                    .streams
                    .split_shard(STREAM, &shard.id, at)
                    .await
                    .unwrap();
                format!("{} splits", shard.id)
            }
            Step::Merge => {
                let open = self.rig.open_shards().await;
                let i = self.rng.index(open.len() - 1);
                self.rig
                    .streams
                    .merge_shards(STREAM, &open[i].id, &open[i + 1].id)
                    .await
                    .unwrap();
                format!("{} and {} merge", open[i].id, open[i + 1].id)
            }
        };
        self.history.push(what.clone());
        what
    }

    /// The live worker that held the most leases at the last check.
    fn busiest(&self) -> usize {
        let held = |m: &Member| self.last_status.get(&m.id).map_or(0, |k| k.held.len());
        (0..self.live.len())
            .max_by_key(|&i| (held(&self.live[i]), std::cmp::Reverse(i)))
            .unwrap_or(0)
    }

    /// Lets a few heartbeat intervals pass while the producer writes.
    async fn settle(&mut self) {
        for _ in 0..ROUNDS_PER_STEP {
            self.producer
                .put_round(&self.rig.streams, STREAM, KEYS, 1)
                .await;
            tokio::time::sleep(ROUND_PAUSE).await;
        }
    }

    fn context(&self, when: &str) -> String {
        format!(
            "seed {} at {when} (schedule: {})",
            self.seed,
            self.history.join("; ")
        )
    }

    async fn check(&mut self, when: &str) {
        let ctx = self.context(when);

        // One shard, one worker inside process() at a time.
        let overlaps = self.fleet.with(|log| log.overlaps.clone());
        assert!(
            overlaps.is_empty(),
            "{ctx}: two processors inside process() for one shard at once:\n{}",
            overlaps.join("\n")
        );

        // The live workers' held sets are disjoint.
        let mut holder: HashMap<String, String> = HashMap::new();
        for member in &self.live {
            let keeper = member.worker.status().await.unwrap().leases.unwrap();
            for key in &keeper.held {
                if let Some(other) = holder.insert(key.clone(), member.id.clone()) {
                    panic!("{ctx}: {key} held by both {other} and {}", member.id);
                }
            }
            self.last_status.insert(member.id.clone(), keeper);
        }

        // No checkpoint goes back, no lease row vanishes.
        let rows = self.rig.lease_rows().await;
        let now: HashMap<LeaseKey, Checkpoint> = rows
            .iter()
            .map(|l| (l.key.clone(), l.checkpoint.clone()))
            .collect();
        for (key, before) in &self.checkpoints {
            let Some(after) = now.get(key) else {
                panic!("{ctx}: the lease row of {key} vanished");
            };
            assert!(
                rank(after) >= rank(before),
                "{ctx}: the checkpoint of {key} went back from {before} to {after}"
            );
        }
        self.checkpoints = now;

        // Each shard's records as they are in the stream, oldest first (only the new
        // ones are read).
        for shard in self.rig.shards().await {
            let known = self.progress.records.entry(shard.id.clone()).or_default();
            let position = match known.last() {
                Some(last) => IteratorPosition::AfterSequence(last.clone()),
                None => IteratorPosition::TrimHorizon,
            };
            let new = self.rig.records_from(&shard.id, &position).await;
            assert!(new.len() < 10_000, "{ctx}: {} read whole", shard.id);
            known.extend(new.into_iter().map(|r| r.sequence_number));
        }
        let progress = &mut self.progress;
        self.fleet
            .with(|log| progress.nothing_jumped(&ctx, log, &rows));

        // Each key in order; a redelivery after a crash is a duplicate, not a violation.
        let verdict = self
            .probes
            .seen
            .lock()
            .unwrap()
            .verdict(&self.producer.produced);
        assert_eq!(verdict.order_violations, 0, "{ctx}: {verdict:?}");
    }

    /// Processable leases (not finished, parents finished or gone) and how many of them
    /// each live worker holds.
    async fn balance(&self) -> Balance {
        let rows = self.rig.lease_rows().await;
        let processable = support::sim::processable_keys(&rows);
        let mut held = BTreeMap::new();
        let mut covered = HashSet::new();
        for member in &self.live {
            let keeper = member.worker.status().await.unwrap().leases.unwrap();
            let mine: Vec<&String> = keeper
                .held
                .iter()
                .filter(|k| processable.contains(*k))
                .collect();
            covered.extend(mine.iter().map(|k| (*k).clone()));
            held.insert(member.id.clone(), mine.len());
        }
        Balance {
            processable: processable.len(),
            unheld: processable.len() - covered.len(),
            held,
        }
    }
}

/// What the no-jump check has verified so far: the log only grows, so each check looks
/// at what is new since the last one.
#[derive(Default)]
struct Progress {
    /// Per shard, its sequence numbers in stream order.
    records: HashMap<ShardId, Vec<SequenceNumber>>,
    /// Per shard, how many leading records are known to have been delivered.
    prefix: HashMap<ShardId, usize>,
    /// Per processor, how many of the records it was given were checked.
    tenures: Vec<usize>,
}

impl Progress {
    /// Per shard, what was delivered is a prefix of the shard; each processor started
    /// right after the checkpoint it was given and went on record by record; and every
    /// checkpoint names a record that was delivered.
    fn nothing_jumped(&mut self, ctx: &str, log: &FleetLog, rows: &[Lease]) {
        let empty = Default::default();
        for (shard, sequences) in &self.records {
            let delivered = log.delivered.get(shard).unwrap_or(&empty);
            assert!(
                delivered.len() <= sequences.len(),
                "{ctx}: {shard} delivered records it does not hold"
            );
            let checked = self.prefix.entry(shard.clone()).or_default();
            for (i, sequence) in sequences
                .iter()
                .enumerate()
                .take(delivered.len())
                .skip(*checked)
            {
                assert!(
                    delivered.contains(sequence),
                    "{ctx}: {shard} record #{i} {sequence} was never delivered, yet {} later \
                     ones were",
                    delivered.len() - i
                );
            }
            *checked = delivered.len();
        }
        for lease in rows {
            if let Checkpoint::At(at) = &lease.checkpoint {
                let shard = lease.key.shard_id();
                let delivered = log.delivered.get(&shard).unwrap_or(&empty);
                assert!(
                    delivered.contains(&at.sequence),
                    "{ctx}: {} checkpointed at {at}, which no processor was given",
                    lease.key
                );
            }
        }
        self.tenures.resize(log.tenures.len(), 0);
        for (n, tenure) in log.tenures.iter().enumerate() {
            let checked = self.tenures[n];
            if checked == tenure.sequences.len() {
                continue;
            }
            let sequences = &self.records[&tenure.shard];
            // Records are in sequence order: a binary search finds a record's place.
            let index = |sequence: &SequenceNumber| match sequences.binary_search(sequence) {
                Ok(i) => i,
                Err(_) => panic!(
                    "{ctx}: {} on {} (processor {n}) was given {sequence}, not a record of \
                     the shard",
                    tenure.shard, tenure.worker
                ),
            };
            if checked == 0 {
                let expected = match &tenure.starting_at {
                    Checkpoint::TrimHorizon => 0,
                    Checkpoint::At(at) => index(&at.sequence) + 1,
                    other => panic!(
                        "{ctx}: {} on {} (processor {n}) started at {other} and was given \
                         records",
                        tenure.shard, tenure.worker
                    ),
                };
                let first = index(&tenure.sequences[0]);
                assert_eq!(
                    first, expected,
                    "{ctx}: {} on {} (processor {n}) started at {} but was first given \
                     record #{first}",
                    tenure.shard, tenure.worker, tenure.starting_at
                );
            }
            for pair in tenure.sequences[checked.saturating_sub(1)..].windows(2) {
                assert_eq!(
                    index(&pair[1]),
                    index(&pair[0]) + 1,
                    "{ctx}: {} on {} (processor {n}) jumped from {} to {}",
                    tenure.shard,
                    tenure.worker,
                    pair[0],
                    pair[1]
                );
            }
            self.tenures[n] = tenure.sequences.len();
        }
    }
}
