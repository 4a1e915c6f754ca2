//! The fault simulator: whole fleets of real [`Worker`]s on the memory backend in paused
//! time, driven by a seeded schedule of joins, leaves, crashes, freezes, partitions
//! that heal, lost and late answers, throttling and 5xx bursts, expired iterators,
//! splits and merges, and misbehaving processors, while a producer writes per-key
//! sequences throughout.
//!
//! Oracles, checked as things happen (the processor) and after every step (the
//! driver):
//! * at the moment a batch is handed to a processor, the shard's lease row names that
//!   worker, and no other worker is inside `process()` for the shard unless that
//!   worker's last confirmed heartbeat is older than the fence time (it is fenced, or
//!   frozen, and its call began before it lost the lease), or it was thawed this very
//!   instant and its call began before (it has not run since; fan-out delivers on the
//!   thaw instant, polling at its next tick);
//! * every checkpoint in the table names a record some processor finished, and no
//!   checkpoint goes back;
//! * per key, records are first finished in order;
//! * after the faults heal and the fleet settles, each lease is held by at most one
//!   worker, and a row that names a live worker is in that worker's held set;
//! * at the end the fleet is balanced, every record produced was finished (or, under
//!   the failure policy, written to the destination), and every worker leaves cleanly.
//!
//! Half the seeds ([`PoisonPlan`], drawn from the seed) run the failure policy
//! (`[failure]`, issue 32): the producer puts a few *poison* records among the others,
//! which the processors refuse (naming the record or not, as the seed says), and the
//! workers have `failure.max_retries`, `failure.bisect` and a destination
//! ([`SimDeadLetters`], one for the fleet) that the schedule takes down for a while
//! (`destination_down`). The oracles then also hold at every step: no poison record is
//! ever processed; a record is written to the destination only by a worker whose last
//! delivery of it failed on it (never one it processed: "never both", but for a replay
//! by another consumer, and a record after the one a failure named is not discarded),
//! only while the lease row names the writer, with an envelope that says what happened;
//! a discarded record takes its place in its key's order (a record of the key after it
//! first finished before it is a gap); checkpoints may stand at a discarded record;
//! and at the end every poison record is in the destination.
//!
//! With [`SimOptions::java`] (`simulate --java`, `FLOTILLA_SIM_JAVA=1`) the fleet runs
//! beside Java KCL 2.x workers ([`java_worker`]): the flotilla workers run with
//! `lease.java_compat` and the Java workers' failover time, the Java workers own the
//! leases at the start, and the schedule also joins, stops, crashes, freezes, cuts off
//! and troubles Java workers. The oracles then also hold between the two kinds (see
//! [`JavaOracle`]): a flotilla worker hands a batch over only while the row names it,
//! except within its renewal interval after a Java worker *stole* the lease from it
//! (the documented overlap, counted and reported); nobody enters `process()` for a
//! shard while a worker of the other kind that is not fenced (a Java worker: its
//! lease not held by the KCL's own rule) is inside, but for that same steal; and a
//! flotilla take of a Java worker's lease lands at least the failover time after the
//! lease's counter last moved (flotilla never takes a lease a live Java worker
//! renews). Without it, nothing of this runs and every seed replays as before.
//!
//! A run is one seed: the schedule, every fault plan, every processor misbehaviour and
//! every jitter draw of the workers come from it ([`flotilla_actors::backoff::seed_jitter`]),
//! and the fleet runs on one current-thread runtime in paused time, so the same seed
//! gives the same trace (`trace_hash`). A failure names the seed, the step, the last
//! lines of the trace and the command that replays it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;

use flotilla_actors::backend::faults::{Fault, FaultPlan, Faulty, Freezer};
use flotilla_actors::backend::memory::{MemoryLeaseTable, MemoryStreams, MemoryStreamsConfig};
use flotilla_actors::backend::{LeaseTable, StreamAdmin};
use flotilla_actors::balance;
use flotilla_actors::failure::{DeadLetters, DestinationError, Envelope};
use flotilla_actors::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, SequenceNumber, ShardId, WorkerId,
};
use flotilla_actors::oracle::{KeyedProducer, OrderCheck, Seen, parse_record};
use flotilla_actors::settings::Destination;
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, Record, Settings, ShardInfo, Worker,
};

use super::probe::fast_settings;
use super::rig::{APP, Rig, STREAM};

#[path = "java_worker.rs"]
pub mod java_worker;

use java_worker::{JavaHandle, JavaTiming, JavaWorker, TakeKind, Watched, is_java};

/// Shards at the start.
const SHARDS: u32 = 4;
const START_WORKERS: usize = 3;
const MIN_LIVE: usize = 2;
const MAX_LIVE: usize = 5;
/// Keys the producer writes one record of per round.
const KEYS: u32 = 12;
/// How long each `process()` call takes at least: overlapping callers would be seen.
const DWELL: Duration = Duration::from_millis(5);
/// How long the fleet may take to balance and drain at the end (virtual time).
const SETTLE: Duration = Duration::from_secs(120);
const PATIENCE: Duration = Duration::from_secs(900);
/// How much of the trace a failure shows.
const TAIL: usize = 60;

/// What one run is asked to do.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub seed: u64,
    /// Fault steps before the final heal, settle and drain.
    pub steps: usize,
    /// Virtual time of each quiet stretch between steps, at most: the fleet runs on,
    /// idle but for a trickle of records.
    pub quiet: Duration,
    /// Print every trace line as it happens.
    pub verbose: bool,
    /// The mutant switched on (for the replay command only: the caller switches it).
    pub mutant: Option<&'static str>,
    /// Run beside Java KCL workers (see the module doc); `None`: flotilla only.
    pub java: Option<JavaMode>,
}

/// How a run beside Java KCL workers sets flotilla up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JavaMode {
    /// `lease.java_compat = true`, as docs/from-the-java-kcl.md says.
    Compat,
    /// The mode left off (a deliberate misconfiguration: the oracles must catch it).
    WithoutCompat,
}

impl JavaMode {
    /// The mode `FLOTILLA_SIM_JAVA` asks for: `1`/`compat`, or `without-compat`.
    pub fn from_env() -> Option<Self> {
        match std::env::var("FLOTILLA_SIM_JAVA").ok()?.as_str() {
            "" | "0" => None,
            "without-compat" => Some(Self::WithoutCompat),
            _ => Some(Self::Compat),
        }
    }

    /// The `simulate` argument that asks for it.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Compat => "--java",
            Self::WithoutCompat => "--java-without-compat",
        }
    }
}

impl SimOptions {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            steps: 16,
            quiet: Duration::from_secs(1800),
            verbose: false,
            mutant: None,
            java: None,
        }
    }

    /// The command that replays this run.
    pub fn replay(&self) -> String {
        let features = if self.mutant.is_some() {
            " --features mutants"
        } else {
            ""
        };
        let mutant = self
            .mutant
            .map(|m| format!(" --mutant {m}"))
            .unwrap_or_default();
        let java = self
            .java
            .map(|j| format!(" {}", j.flag()))
            .unwrap_or_default();
        format!(
            "cargo run --release -p flotilla-actors --example simulate{features} -- --seed {} \
             --steps {} --quiet-secs {}{mutant}{java} --verbose",
            self.seed,
            self.steps,
            self.quiet.as_secs()
        )
    }
}

/// What a run that passed did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SimReport {
    pub seed: u64,
    /// Virtual time the fleet ran.
    pub virtual_time: Duration,
    /// Virtual time summed over the workers alive during it.
    pub worker_time: Duration,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Invariant checks made (each oracle evaluation counts one).
    pub checks: u64,
    pub produced: u64,
    pub process_calls: u64,
    pub duplicates: u64,
    /// Lease-table calls by operation, over every worker of the run, and the items the
    /// reads among them read (`Faulty::counts`).
    pub table_calls: BTreeMap<String, u64>,
    pub table_items: BTreeMap<String, u64>,
    /// The read units the reads were billed, by operation, as DynamoDB bills them
    /// (`Faulty::read_units`).
    pub table_units: BTreeMap<String, f64>,
    /// A hash of the whole event trace: equal for equal runs.
    pub trace_hash: u64,
    pub trace_lines: u64,
    /// Runs beside Java workers: virtual time summed over the Java workers alive.
    #[serde(default)]
    pub java_worker_time: Duration,
    /// Runs beside Java workers: what happened between the two kinds, by kind (see
    /// `JavaOracle::stats`).
    #[serde(default)]
    pub java: BTreeMap<String, u64>,
    /// The longest a flotilla worker went on handing batches of a lease a Java worker
    /// stole from it, after the steal landed.
    #[serde(default)]
    pub java_steal_overlap: Duration,
    /// The failure policy of the seed ([`PoisonPlan`]), described; empty when off.
    #[serde(default)]
    pub policy: String,
    /// The lanes per shard of the seed (`processor.parallelism`, [`draw_lanes`]).
    #[serde(default)]
    pub lanes: u16,
    /// Poison records put.
    #[serde(default)]
    pub poison_put: u64,
    /// Distinct records written to the destination, and how many of them were poison
    /// (the others: good records the processor failed, by injected faults, or beside a
    /// poison record in a batch refused whole without bisection).
    #[serde(default)]
    pub discarded: u64,
    #[serde(default)]
    pub poison_discarded: u64,
    /// Runs beside Java workers: poison records a Java worker processed (the Java
    /// application has no failure policy: it takes them, and they need no discard).
    #[serde(default)]
    pub poison_java: u64,
    /// Envelopes the destination stored (a record written again after a failed write or
    /// a replay counts again).
    #[serde(default)]
    pub envelopes: u64,
    /// Writes the destination refused while down.
    #[serde(default)]
    pub destination_refused: u64,
    /// Batches the processors refused for a poison record.
    #[serde(default)]
    pub poison_refusals: u64,
}

impl SimReport {
    pub fn fleet_hours(&self) -> f64 {
        self.virtual_time.as_secs_f64() / 3600.0
    }

    pub fn worker_hours(&self) -> f64 {
        self.worker_time.as_secs_f64() / 3600.0
    }
}

/// A violated invariant, with what it takes to look into it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SimFailure {
    pub seed: u64,
    pub step: String,
    pub what: String,
    pub tail: Vec<String>,
    pub replay: String,
    /// Virtual time into the run.
    pub at: Duration,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {} failed at {} ({:.3} s virtual): {}",
            self.seed,
            self.step,
            self.at.as_secs_f64(),
            self.what
        )?;
        writeln!(f, "last {} trace lines:", self.tail.len())?;
        for line in &self.tail {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay: {}", self.replay)
    }
}

/// Runs one seed on a fresh current-thread runtime in paused time.
pub fn run_seed(options: &SimOptions) -> Result<SimReport, SimFailure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| SimFailure {
            seed: options.seed,
            step: "start".into(),
            what: format!("no runtime: {e}"),
            tail: Vec::new(),
            replay: options.replay(),
            at: Duration::ZERO,
        })?;
    flotilla_actors::backoff::seed_jitter(Some(options.seed));
    let result = runtime.block_on(Sim::run(options.clone()));
    flotilla_actors::backoff::seed_jitter(None);
    // Whatever the workers left running (a crashed worker's tasks) ends with the runtime.
    runtime.shutdown_background();
    result
}

/// Installs (once) a panic hook that keeps the processors' injected panics out of the
/// output; every other panic is printed as before.
pub fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !message.starts_with(INJECTED_PANIC) {
                previous(info);
            }
        }));
    });
}

const INJECTED_PANIC: &str = "sim: injected processor panic";

/// SplitMix64: a small generator whose sequence depends on the seed alone.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// An index into a collection of `len` elements (0 when it is empty).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(self.below(span + 1))
    }
}

/// How a worker's processors misbehave now.
#[derive(Debug, Clone, Default)]
struct Chaos {
    /// Extra time every batch takes.
    slow: Option<Duration>,
    /// Per mille of batches that fail (returned as an error: retried from the checkpoint).
    fail: u64,
    /// Per mille of batches that panic.
    panic: u64,
}

/// What marks a poison record: its data is this, then the producer's `key:number`.
const POISON: &str = "poison/";
/// Mixed into the seed for the draws of the failure policy, so that the schedule's own
/// generator draws as it did before the policy (a seed without poison replays as
/// before).
const POISON_SALT: u64 = 0x0D15_CA2D_ED00_0032;

/// Mixed into the seed for the draw of the lanes per shard (`processor.parallelism`),
/// so that the schedule and the poison plan draw as they did before lanes.
const LANES_SALT: u64 = 0x1A4E_5000_0000_0033;

/// The lanes per shard of a seed (issue 33): half the seeds run 2, 4 or 8 lanes, so the
/// oracles (per-key order; no worker inside `process()` for a shard while another
/// unfenced worker is, in any lane) hold with batches of one shard in flight at once.
pub fn draw_lanes(seed: u64) -> u16 {
    let mut rng = SplitMix::new(seed ^ LANES_SALT);
    if !rng.chance(500) {
        return 1;
    }
    [2, 4, 8][rng.index(3)]
}

/// The failure policy of a seed with poison records (half the seeds, by the seed).
#[derive(Debug, Clone, Copy)]
struct PoisonPlan {
    /// `failure.max_retries`.
    max_retries: u32,
    /// `failure.bisect`.
    bisect: bool,
    /// Whether a processor refusing a poison record names it (`at_record`).
    naming: Naming,
    /// Per mille of the producer's rounds that carry one poison record.
    per_mille: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    Always,
    Never,
    /// A coin per refusal.
    Sometimes,
}

impl PoisonPlan {
    fn draw(seed: u64) -> Option<Self> {
        let mut rng = SplitMix::new(seed ^ POISON_SALT);
        if !rng.chance(500) {
            return None;
        }
        Some(Self {
            max_retries: rng.below(3) as u32,
            bisect: rng.chance(500),
            naming: [Naming::Always, Naming::Never, Naming::Sometimes][rng.index(3)],
            per_mille: 5 + rng.below(16),
        })
    }

    fn describe(&self) -> String {
        format!(
            "max_retries {}, bisect {}, naming {:?}, poison in {}‰ of rounds",
            self.max_retries, self.bisect, self.naming, self.per_mille
        )
    }
}

/// How a worker's last delivery of a record went (seeds with the failure policy): what
/// decides whether it may write the record to the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Processed.
    Done,
    /// The processor's failure named it.
    Named,
    /// The failure named a record before it: it was not tried.
    After,
    /// Failed with the call (a failure naming no record, a panic, a hang cut off by the
    /// processor timeout, a crash); `alone`: the call held only this record.
    Refused { alone: bool },
}

/// The producer: per-key sequences (the library's [`KeyedProducer`], as
/// `probe::Producer`), with a poison record now and then in seeds that have them.
struct SimProducer {
    keys: KeyedProducer,
    produced: BTreeMap<String, u64>,
    rng: SplitMix,
    per_mille: u64,
    /// The poison records put, as (key, number).
    poison: Vec<(String, u64)>,
}

impl SimProducer {
    fn new(seed: u64, plan: Option<PoisonPlan>) -> Self {
        Self {
            keys: KeyedProducer::new("key-", 0),
            produced: BTreeMap::new(),
            rng: SplitMix::new(seed ^ POISON_SALT ^ 1),
            per_mille: plan.map_or(0, |p| p.per_mille),
            poison: Vec::new(),
        }
    }

    async fn put_round(&mut self, admin: &dyn StreamAdmin, stream: &str, keys: u32, per_key: u32) {
        let mut records = self.keys.rounds(keys, u64::from(per_key));
        if self.per_mille > 0 && !records.is_empty() && self.rng.chance(self.per_mille) {
            let i = self.rng.index(records.len());
            let record = &mut records[i];
            let text = String::from_utf8_lossy(&record.data).into_owned();
            if let Some((key, number)) = parse_record(text.as_bytes()) {
                self.poison.push((key.to_owned(), number));
            }
            record.data = format!("{POISON}{text}").into();
        }
        for chunk in records.chunks(500) {
            admin.put_records(stream, chunk).await.unwrap();
            self.keys.confirm(chunk);
        }
        self.produced = self.keys.produced();
    }

    fn total(&self) -> u64 {
        self.produced.values().sum()
    }
}

/// A record's key, number, and whether it is poison.
fn sim_record(data: &[u8]) -> Option<(String, u64, bool)> {
    let (data, poison) = match data.strip_prefix(POISON.as_bytes()) {
        Some(rest) => (rest, true),
        None => (data, false),
    };
    let (key, number) = parse_record(data)?;
    Some((key.to_owned(), number, poison))
}

/// The failure destination as one worker writes it: one store for the fleet (the
/// `Log`), down while the schedule says so (a write then fails, sometimes after storing
/// a prefix of its envelopes: the destination sees a record at least once). A frozen
/// worker writes nothing until it thaws; the moment it starts a write, the lease row
/// must name it, as at a delivery.
struct SimDeadLetters {
    me: String,
    table: MemoryLeaseTable,
    freezer: Freezer,
    shared: Shared,
}

impl DeadLetters for SimDeadLetters {
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>> {
        Box::pin(async move {
            if let Some(first) = envelopes.first() {
                let shard = ShardId::new(first.shard.clone());
                let owner = self
                    .table
                    .get(&LeaseKey::from(&shard))
                    .now_or_never()
                    .and_then(Result::ok)
                    .flatten()
                    .and_then(|l| l.owner);
                let mut log = self.shared.lock();
                log.checks += 1;
                log.owner_names(
                    &self.me,
                    &shard,
                    owner,
                    ("wrote a discard of", " to the destination"),
                );
            }
            self.freezer.wait_thawed().await;
            self.shared
                .lock()
                .dead_letters(&self.me, envelopes)
                .map_err(|why| DestinationError {
                    destination: self.name(),
                    why,
                })
        })
    }

    fn name(&self) -> String {
        "sim:dead-letters".into()
    }
}

/// One simulated worker and the handles its faults are injected through.
struct Member {
    id: String,
    worker: Worker,
    table: Faulty<Watched>,
    stream: Faulty<MemoryStreams>,
    freezer: Freezer,
    /// Closed while the worker's processors hang (never return, so never ack).
    hang: Freezer,
    /// The fault now on this worker, and when it heals.
    fault: Option<(String, Instant)>,
}

/// What the oracles know, shared by the driver and every processor.
#[derive(Default)]
struct Log {
    start: Option<Instant>,
    verbose: bool,
    hasher: std::hash::DefaultHasher,
    lines: u64,
    tail: VecDeque<String>,
    violations: Vec<String>,
    checks: u64,
    /// Per shard, the workers inside `process()` now (worker, call id, when it entered).
    inside: HashMap<ShardId, Vec<(String, u64, Instant)>>,
    /// When each worker was last thawed after a freeze.
    thawed: HashMap<String, Instant>,
    next_call: u64,
    process_calls: u64,
    /// Records finished (process returned Ok), per shard.
    finished: HashMap<ShardId, HashSet<SequenceNumber>>,
    /// Per key, the sequence numbers in the order they were finished.
    by_key: BTreeMap<String, Vec<u64>>,
    /// Per key, the order of first finishes: the library's oracle.
    order: OrderCheck,
    /// Per worker id, what tells whether it is fenced: its lease table's injector (send
    /// time of the last confirmed heartbeat) and its freezer.
    members: HashMap<String, (Faulty<Watched>, Freezer)>,
    /// Per worker id, its processors' misbehaviour and its generator.
    chaos: HashMap<String, Chaos>,
    rng: Option<SplitMix>,
    faults: BTreeMap<String, u64>,
    /// The oracles between flotilla and Java workers (`SimOptions::java`).
    java: Option<JavaOracle>,
    /// The seed's failure policy; `None`: off, no poison.
    poison: Option<PoisonPlan>,
    /// Per (worker, shard, record), how the worker's last delivery of it went (seeds
    /// with the policy).
    verdicts: HashMap<(String, ShardId, SequenceNumber), Verdict>,
    /// Records written to the destination, per shard.
    discarded: HashMap<ShardId, HashSet<SequenceNumber>>,
    /// Records written to the destination, as (key, number), and the poison records a
    /// Java worker processed (the Java application has no failure policy: it takes
    /// them).
    discarded_records: BTreeSet<(String, u64)>,
    java_poison: BTreeSet<(String, u64)>,
    poison_discarded: u64,
    /// Whether the destination is down now.
    destination_down: bool,
    envelopes: u64,
    destination_refused: u64,
    poison_refusals: u64,
}

/// What the oracles between flotilla and Java KCL workers know.
struct JavaOracle {
    /// The failover time of both kinds.
    failover: Duration,
    /// flotilla's renewal interval (`failover_time / 3`).
    renew_every: Duration,
    /// flotilla's fence time (`failover_time - fence_margin`).
    fresh_for: Duration,
    /// The lease table, unwrapped: what the rows say at a delivery.
    table: MemoryLeaseTable,
    /// Every Java worker ever started, by id.
    workers: HashMap<String, JavaHandle>,
    /// Per lease, the last write that moved its counter: the owner and counter it
    /// wrote, and when it landed.
    history: HashMap<LeaseKey, (Option<String>, u64, Instant)>,
    /// Per shard, the last Java take from a flotilla worker.
    taken: HashMap<ShardId, JavaTake>,
    /// flotilla workers with a fault on now, and when each one's last fault healed.
    troubled: HashSet<String>,
    healed: HashMap<String, Instant>,
    /// What happened between the two kinds, by kind (`SimReport::java`).
    stats: BTreeMap<String, u64>,
    /// The longest a flotilla worker handed batches of a stolen lease after the steal.
    steal_overlap: Duration,
}

/// A Java take of a flotilla worker's lease.
#[derive(Debug, Clone)]
struct JavaTake {
    by: String,
    from: String,
    kind: TakeKind,
    at: Instant,
}

impl JavaOracle {
    fn count(&mut self, what: &str) {
        *self.stats.entry(what.to_owned()).or_default() += 1;
    }

    /// How long after a Java worker stole a lease from `worker` (at `at`) it may still
    /// hand a batch of it over: its next renewal (within `renew_every`) is refused and
    /// revokes the lease at once; if a fault was on it since (the refusal may not come
    /// back), its rule that a lease unrenewed for the fence time delivers nothing.
    fn steal_bound(&self, worker: &str, at: Instant) -> Duration {
        let troubled = self.troubled.contains(worker)
            || self.healed.get(worker).is_some_and(|healed| *healed >= at);
        if troubled {
            self.fresh_for
        } else {
            self.renew_every + Duration::from_millis(50)
        }
    }

    /// Whether the Java worker `worker`, inside `process()` for `shard` since `entered`,
    /// would deliver no more: frozen (or thawed this instant, its call begun before), or
    /// not holding the lease by the KCL's own rule (lost, or unrenewed for the failover
    /// time on its clock).
    fn java_fenced(
        &self,
        worker: &str,
        shard: &ShardId,
        entered: Instant,
        now: Instant,
        thawed: &HashMap<String, Instant>,
    ) -> bool {
        let Some(java) = self.workers.get(worker) else {
            return true;
        };
        let resuming = thawed
            .get(worker)
            .is_some_and(|at| *at == now && entered < *at);
        resuming
            || java.freezer.is_frozen()
            || java
                .lock()
                .holds(&LeaseKey::from(shard), now, self.failover)
                .is_none()
    }
}

impl Log {
    fn at(&self) -> Duration {
        self.start.map(|s| s.elapsed()).unwrap_or_default()
    }

    fn trace(&mut self, line: String) {
        let line = format!("{:>10.3} {line}", self.at().as_secs_f64());
        line.hash(&mut self.hasher);
        self.lines += 1;
        if self.verbose {
            println!("{line}");
        }
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    fn violation(&mut self, what: String) {
        self.trace(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    fn fault(&mut self, kind: &str) {
        *self.faults.entry(kind.to_owned()).or_default() += 1;
    }

    /// Records what `me` finished of `shard`: the checkpoint oracle's set and the
    /// per-key order.
    fn finish(&mut self, me: &str, shard: &ShardId, records: &[Record]) {
        let finished = self.finished.entry(shard.clone()).or_default();
        for record in records {
            finished.insert(record.sequence_number.clone());
        }
        if self.poison.is_some() && !is_java(me) {
            for record in records {
                let at = (me.to_owned(), shard.clone(), record.sequence_number.clone());
                self.verdicts.insert(at, Verdict::Done);
            }
        }
        for record in records {
            let Some((key, seq, poison)) = sim_record(&record.data) else {
                continue;
            };
            if poison {
                self.checks += 1;
                if is_java(me) {
                    self.java_poison.insert((key.clone(), seq));
                } else {
                    let what = format!(
                        "{me} on {shard} processed the poison record {key}:{seq}, which its processor refuses"
                    );
                    self.violation(what);
                }
            }
            self.observe(me, shard, key, seq, "finished");
        }
    }

    /// The per-key order oracle: `key:seq` was finished or discarded (`how`) by `me`.
    fn observe(&mut self, me: &str, shard: &ShardId, key: String, seq: u64, how: &str) {
        self.checks += 1;
        match self.order.observe_number(&key, seq) {
            Seen::Duplicate => return,
            Seen::OutOfOrder => {
                let example = self.order.examples().last().cloned().unwrap_or_default();
                let what = format!("{me} on {shard} {how} out of its key's order: {example}");
                self.violation(what);
            }
            Seen::InOrder | Seen::Malformed => {}
        }
        self.by_key.entry(key).or_default().push(seq);
    }

    /// The delivery oracle of the lease row: `me` did `what` (of) `shard` while the row
    /// names `owner`; it must name `me`, but for a Java steal's overlap.
    fn owner_names(
        &mut self,
        me: &str,
        shard: &ShardId,
        owner: Option<WorkerId>,
        (what, to): (&str, &str),
    ) {
        if owner.as_ref().map(WorkerId::as_str) != Some(me)
            && !self.steal_excuses(me, shard, owner.as_ref())
        {
            let what = format!(
                "{me} {what} {shard}{to} while the lease row names {}",
                owner.map_or("nobody".to_owned(), |o| o.to_string())
            );
            self.violation(what);
        }
    }

    /// What `me`'s processor was just handed: each record failed unless it says
    /// otherwise before it returns.
    fn handed(&mut self, me: &str, shard: &ShardId, records: &[Record]) {
        if self.poison.is_none() {
            return;
        }
        let alone = records.len() == 1;
        for record in records {
            let at = (me.to_owned(), shard.clone(), record.sequence_number.clone());
            self.verdicts.insert(at, Verdict::Refused { alone });
        }
    }

    /// A write of `me` to the destination: refused while it is down (after storing a
    /// prefix, sometimes), else every envelope stored and checked.
    fn dead_letters(&mut self, me: &str, envelopes: &[Envelope]) -> Result<(), String> {
        let named: Vec<String> = envelopes
            .iter()
            .map(|e| {
                let data = base64::engine::general_purpose::STANDARD
                    .decode(&e.data)
                    .unwrap_or_default();
                String::from_utf8_lossy(&data).into_owned()
            })
            .collect();
        if self.destination_down {
            self.destination_refused += 1;
            let rng = self.rng.get_or_insert_with(|| SplitMix::new(0));
            let stored = if envelopes.len() > 1 && rng.chance(500) {
                1 + rng.index(envelopes.len() - 1)
            } else {
                0
            };
            self.trace(format!(
                "{me}: the destination refuses {} ({stored} stored before it failed)",
                named.join(" ")
            ));
            for envelope in &envelopes[..stored] {
                self.store(me, envelope);
            }
            return Err("sim: the destination is down".into());
        }
        self.trace(format!("{me} discards {}", named.join(" ")));
        for envelope in envelopes {
            self.store(me, envelope);
        }
        Ok(())
    }

    /// One envelope stored: what it says is checked against what happened.
    fn store(&mut self, me: &str, envelope: &Envelope) {
        let Some(plan) = self.poison else {
            self.violation(format!("{me} discarded a record with no failure policy on"));
            return;
        };
        let shard = ShardId::new(envelope.shard.clone());
        let data = base64::engine::general_purpose::STANDARD
            .decode(&envelope.data)
            .unwrap_or_default();
        let (Ok(seq), Some((key, number, poison))) = (
            SequenceNumber::parse(&envelope.sequence_number),
            sim_record(&data),
        ) else {
            self.violation(format!("{me} wrote an unreadable envelope: {envelope:?}"));
            return;
        };
        self.checks += 2;
        self.envelopes += 1;
        if envelope.partition_key != key
            || envelope.reason != "retries"
            || envelope.attempts <= plan.max_retries
            || envelope.error.is_none()
        {
            let what = format!(
                "{me} wrote an envelope of {key}:{number} that does not say what happened \
                 (failure.max_retries {}): {envelope:?}",
                plan.max_retries
            );
            self.violation(what);
        }
        let verdict = self
            .verdicts
            .get(&(me.to_owned(), shard.clone(), seq.clone()))
            .copied();
        let why = match verdict {
            Some(Verdict::Named | Verdict::Refused { alone: true }) => None,
            Some(Verdict::Refused { alone: false }) if !plan.bisect => None,
            Some(Verdict::Refused { alone: false }) => {
                Some("failed in a call of several records, and failure.bisect is on")
            }
            Some(Verdict::Done) => Some("was processed: it is both processed and discarded"),
            Some(Verdict::After) => Some("was not tried: the failure named an earlier record"),
            None => Some("never happened"),
        };
        if let Some(why) = why {
            let what = format!(
                "{me} wrote {key}:{number} of {shard} to the destination, but its last delivery of it {why}"
            );
            self.violation(what);
        }
        self.discarded.entry(shard.clone()).or_default().insert(seq);
        if self.discarded_records.insert((key.clone(), number)) && poison {
            self.poison_discarded += 1;
        }
        self.observe(me, &shard, key, number, "discarded");
    }

    /// A write that moved a lease's counter (or deleted its row) landed, by `by`
    /// (`Watched`'s hook, Java runs only). A flotilla take of a Java worker's lease must
    /// land the failover time or more after the counter it expects was written: the
    /// Java owner's renewals stood still that long, so it was not a live, renewing
    /// worker (its rule keeps a lease only while renewed within the failover time).
    fn landed(
        &mut self,
        by: &str,
        op: &'static str,
        key: &LeaseKey,
        expected: &Fence,
        after: Option<(Option<&WorkerId>, u64)>,
    ) {
        let now = Instant::now();
        let mut broken = None;
        let Some(java) = self.java.as_mut() else {
            return;
        };
        if !is_java(by)
            && matches!(op, "take" | "take_expired")
            && let Some(from) = expected.owner.as_ref().filter(|o| is_java(o.as_str()))
        {
            self.checks += 1;
            java.count("flotilla_takes_from_java");
            if let Some((_, counter, at)) = java.history.get(key)
                && *counter == expected.counter
            {
                let still = now.saturating_duration_since(*at);
                if still < java.failover {
                    broken = Some(format!(
                        "{by} took {key} from {from}, whose counter moved {still:?} before, under the failover time"
                    ));
                }
            }
        }
        match after {
            Some((owner, counter)) => {
                java.history
                    .insert(key.clone(), (owner.map(|o| o.to_string()), counter, now));
            }
            None => {
                java.history.remove(key);
            }
        }
        if let Some(what) = broken {
            self.violation(what);
        }
    }

    /// A Java worker's take landed: a take from a flotilla worker is remembered for the
    /// delivery oracles.
    fn java_took(
        &mut self,
        by: &str,
        key: &LeaseKey,
        from: Option<&str>,
        kind: TakeKind,
        counter: u64,
    ) {
        let Some(java) = self.java.as_mut() else {
            return;
        };
        let now = Instant::now();
        let at = java
            .history
            .get(key)
            .filter(|(o, c, _)| o.as_deref() == Some(by) && *c == counter)
            .map_or(now, |(_, _, at)| *at);
        match (kind, from) {
            (TakeKind::Unowned, _) => java.count("java_takes_unowned"),
            (_, Some(from)) if !is_java(from) => {
                java.count(match kind {
                    TakeKind::Steal => "java_steals_from_flotilla",
                    _ => "java_expired_takes_from_flotilla",
                });
                java.taken.insert(
                    key.shard_id(),
                    JavaTake {
                        by: by.to_owned(),
                        from: from.to_owned(),
                        kind,
                        at,
                    },
                );
            }
            (TakeKind::Steal, _) => java.count("java_steals_from_java"),
            _ => java.count("java_expired_takes_from_java"),
        }
    }

    /// Whether the flotilla worker `me` handing a batch of `shard` over while the row
    /// names `owner` is the documented overlap: `owner`, a Java worker, stole it from
    /// `me` within [`JavaOracle::steal_bound`]. Counted and timed when it is.
    fn steal_excuses(&mut self, me: &str, shard: &ShardId, owner: Option<&WorkerId>) -> bool {
        let now = Instant::now();
        let Some(java) = self.java.as_mut() else {
            return false;
        };
        let Some(owner) = owner.filter(|o| is_java(o.as_str())) else {
            return false;
        };
        let Some(take) = java.taken.get(shard).cloned() else {
            return false;
        };
        let after = now.saturating_duration_since(take.at);
        let excused = take.kind == TakeKind::Steal
            && take.by == owner.as_str()
            && take.from == me
            && after < java.steal_bound(me, take.at);
        if excused {
            java.count("flotilla_batches_after_a_steal");
            java.steal_overlap = java.steal_overlap.max(after);
        }
        excused
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Log>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The oracles of the moment a Java worker hands a batch to its processor: the row
    /// names it (or another Java worker that stole it: the KCL's own overlap between
    /// its workers, counted), and no flotilla worker that is not fenced is inside
    /// `process()` for the shard, unless this worker stole the lease from it and its
    /// call began within [`JavaOracle::steal_bound`] of the steal (the documented
    /// overlap, counted).
    fn java_enter(&self, me: &str, shard: &ShardId, records: &[Record]) -> Inside {
        let row = {
            let log = self.lock();
            log.java.as_ref().and_then(|j| {
                j.table
                    .get(&LeaseKey::from(shard))
                    .now_or_never()
                    .and_then(Result::ok)
                    .flatten()
            })
        };
        let owner = row.as_ref().and_then(|l| l.owner.clone());
        let mut log = self.lock();
        let log = &mut *log;
        log.process_calls += 1;
        log.checks += 2;
        let call = log.next_call;
        log.next_call += 1;
        let (first, last) = (
            records.first().map(|r| r.sequence_number.to_string()),
            records.last().map(|r| r.sequence_number.to_string()),
        );
        log.trace(format!(
            "{me} process {shard} [{}..{}] ({} records)",
            short(first.as_deref()),
            short(last.as_deref()),
            records.len()
        ));
        let now = Instant::now();
        let mut broken = Vec::new();
        let mut counted = Vec::new();
        match owner.as_ref().map(WorkerId::as_str) {
            Some(o) if o == me => {}
            Some(o) if is_java(o) => counted.push("java_batches_after_a_java_steal"),
            other => broken.push(format!(
                "{me} (Java) handed a batch of {shard} to its processor while the lease row names {}",
                other.unwrap_or("nobody")
            )),
        }
        let others: Vec<(String, u64, Instant)> =
            log.inside.get(shard).cloned().unwrap_or_default();
        if let Some(java) = &log.java {
            for (other, _, entered) in others.iter().filter(|(w, _, _)| w != me) {
                if is_java(other) {
                    counted.push("java_java_overlaps");
                    continue;
                }
                let resuming = log
                    .thawed
                    .get(other)
                    .is_some_and(|at| *at == now && entered < at);
                let fenced = resuming
                    || log.members.get(other).is_none_or(|(table, freezer)| {
                        freezer.is_frozen()
                            || table.last_confirmed("heartbeat").is_none_or(|sent| {
                                now.saturating_duration_since(sent) >= java.fresh_for
                            })
                    });
                if fenced {
                    continue;
                }
                let stolen = java.taken.get(shard).is_some_and(|t| {
                    t.kind == TakeKind::Steal
                        && t.by == me
                        && t.from == *other
                        && *entered < t.at + java.steal_bound(other, t.at)
                });
                if stolen {
                    counted.push("java_batches_beside_a_robbed_flotilla_call");
                } else {
                    broken.push(format!(
                        "{me} (Java) entered process() for {shard} while {other}, not fenced, was inside"
                    ));
                }
            }
        }
        if let Some(java) = log.java.as_mut() {
            for what in counted {
                java.count(what);
            }
        }
        for what in broken {
            log.violation(what);
        }
        log.inside
            .entry(shard.clone())
            .or_default()
            .push((me.to_owned(), call, now));
        Inside {
            shared: self.clone(),
            shard: shard.clone(),
            call,
        }
    }
}

fn settings(id: &str, java: Option<JavaMode>, poison: Option<PoisonPlan>, lanes: u16) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.processor.parallelism = lanes;
    if let Some(plan) = poison {
        // The destination the workers write is the simulator's own (given with
        // `Backend::with_dead_letters`, which the setting's value does not override);
        // the setting says one is set.
        s.failure.max_retries = Some(plan.max_retries);
        s.failure.bisect = plan.bisect;
        s.failure.destination = Some(Destination::File("sim-dead-letters".into()));
    }
    s.worker.worker_id = Some(id.to_owned());
    // Beside Java workers, docs/from-the-java-kcl.md: the mode on, and the
    // failover time (below) the Java workers' `failoverTimeMillis`.
    s.lease.java_compat = java == Some(JavaMode::Compat);
    // The defaults users run, but for what makes a long simulation cheap or a stall
    // visible sooner.
    s.lease.failover_time = Duration::from_secs(10);
    s.lease.heartbeat_interval = Duration::from_secs(2);
    s.lease.fence_margin = Duration::from_secs(3);
    s.reader.poll_interval = Duration::from_millis(200);
    s.reader.idle_max = Duration::from_secs(2);
    s.reader.parent_poll_interval = Duration::from_secs(1);
    s.reader.shard_sync_interval = Duration::from_secs(60);
    s.reader.backoff_min = Duration::from_millis(100);
    s.reader.backoff_max = Duration::from_secs(5);
    s.reader.max_records = 50;
    s.reader.processor_timeout = Duration::from_secs(60);
    s.checkpoint.interval = Duration::from_secs(2);
    s.supervision.restart_backoff_min = Duration::from_millis(100);
    s.supervision.restart_backoff_max = Duration::from_secs(5);
    s.supervision.shutdown_timeout = Duration::from_secs(30);
    s.status.enabled = false;
    s
}

/// The processor of every simulated worker: checks the delivery oracles at the moment
/// it is handed a batch, stops while its worker is frozen, misbehaves as told, and
/// records what it finished.
struct SimProcessor {
    me: String,
    shard: ShardId,
    table: MemoryLeaseTable,
    freezer: Freezer,
    hang: Freezer,
    shared: Shared,
    fresh_for: Duration,
}

/// Leaves `process()` when dropped: on return, and when the call is cancelled (a crash).
struct Inside {
    shared: Shared,
    shard: ShardId,
    call: u64,
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut log = self.shared.lock();
        if let Some(inside) = log.inside.get_mut(&self.shard) {
            inside.retain(|(_, c, _)| *c != self.call);
        }
    }
}

impl SimProcessor {
    /// The oracles of the moment of delivery.
    fn enter(&self, batch: &Batch) -> Inside {
        let row = self
            .table
            .get(&LeaseKey::from(&self.shard))
            .now_or_never()
            .and_then(Result::ok)
            .flatten();
        let owner = row.as_ref().and_then(|l| l.owner.clone());
        let mut log = self.shared.lock();
        let log = &mut *log;
        log.process_calls += 1;
        log.checks += 2;
        let call = log.next_call;
        log.next_call += 1;
        let first = batch
            .records()
            .first()
            .map(|r| r.sequence_number.to_string());
        let last = batch
            .records()
            .last()
            .map(|r| r.sequence_number.to_string());
        log.trace(format!(
            "{} process {} [{}..{}] ({} records)",
            self.me,
            self.shard,
            short(first.as_deref()),
            short(last.as_deref()),
            batch.records().len()
        ));
        log.owner_names(
            &self.me,
            &self.shard,
            owner,
            ("handed a batch of", " to its processor"),
        );
        log.handed(&self.me, &self.shard, batch.records());
        let now = Instant::now();
        let others: Vec<(String, u64, Instant)> =
            log.inside.get(&self.shard).cloned().unwrap_or_default();
        for (other, _, entered) in others.iter().filter(|(w, _, _)| *w != self.me) {
            // A Java worker inside: fenced by the KCL's own rule, or it is an overlap
            // flotilla must not make.
            if let Some(java) = &mut log.java
                && is_java(other)
            {
                // The overlap of a steal: the thief's batch beside the robbed worker's
                // (its own delivery excused above, within the same bound).
                let stolen = java.taken.get(&self.shard).is_some_and(|t| {
                    t.kind == TakeKind::Steal
                        && t.by == *other
                        && t.from == self.me
                        && now < t.at + java.steal_bound(&self.me, t.at)
                });
                if stolen {
                    java.count("flotilla_batches_beside_a_stealing_java_call");
                } else if !java.java_fenced(other, &self.shard, *entered, now, &log.thawed) {
                    let what = format!(
                        "{} entered process() for {} while {other} (Java), holding the lease by the KCL's rule, was inside",
                        self.me, self.shard
                    );
                    log.violation(what);
                }
                continue;
            }
            // Thawed this very instant, with a call begun before: the call is frozen
            // still in every sense but the flag (its task has not run since the thaw),
            // though a heartbeat sent on the thaw may already be confirmed.
            let resuming = log
                .thawed
                .get(other)
                .is_some_and(|at| *at == now && entered < at);
            let fenced = resuming
                || log.members.get(other).is_none_or(|(table, freezer)| {
                    freezer.is_frozen()
                        || table.last_confirmed("heartbeat").is_none_or(|sent| {
                            now.saturating_duration_since(sent) >= self.fresh_for
                        })
                });
            if !fenced {
                let what = format!(
                    "{} entered process() for {} while {other}, not fenced, was inside",
                    self.me, self.shard
                );
                log.violation(what);
            }
        }
        log.inside
            .entry(self.shard.clone())
            .or_default()
            .push((self.me.clone(), call, now));
        Inside {
            shared: self.shared.clone(),
            shard: self.shard.clone(),
            call,
        }
    }

    fn finish(&self, batch: &Batch) {
        self.shared
            .lock()
            .finish(&self.me, &self.shard, batch.records());
    }
}

fn short(sequence: Option<&str>) -> String {
    match sequence {
        // The memory backend's numbers are long and mostly zeros: the tail tells them apart.
        Some(s) if s.len() > 8 => format!("…{}", &s[s.len() - 8..]),
        Some(s) => s.to_owned(),
        None => "-".to_owned(),
    }
}

impl Processor for SimProcessor {
    async fn initialize(&mut self, _: &ShardInfo) -> Result<(), ProcessorError> {
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let _inside = self.enter(batch);
        // A frozen worker's processor stops where it is.
        self.freezer.wait_thawed().await;
        let (slow, fail, panic, name) = {
            let mut log = self.shared.lock();
            let chaos = log.chaos.get(&self.me).cloned().unwrap_or_default();
            let naming = log.poison.map(|p| p.naming);
            let rng = log.rng.get_or_insert_with(|| SplitMix::new(0));
            let fail = rng.chance(chaos.fail);
            let panic = !fail && rng.chance(chaos.panic);
            let name = match naming {
                Some(Naming::Always) => true,
                Some(Naming::Sometimes) => rng.chance(500),
                Some(Naming::Never) | None => false,
            };
            (chaos.slow, fail, panic, name)
        };
        tokio::time::sleep(DWELL + slow.unwrap_or_default()).await;
        // A hanging processor never returns (so never acks) until the hang is healed.
        self.hang.wait_thawed().await;
        self.freezer.wait_thawed().await;
        if fail {
            self.shared.lock().fault("processor_error");
            return Err(ProcessorError::msg("sim: injected processor failure"));
        }
        if panic {
            self.shared.lock().fault("processor_panic");
            panic!("{INJECTED_PANIC} on {}", self.shard);
        }
        // A poison record is refused: naming it, the records before it are processed
        // (a partial batch failure); otherwise nothing of the batch is.
        let records = batch.records();
        if let Some(at) = records
            .iter()
            .position(|r| r.data.starts_with(POISON.as_bytes()))
        {
            let mut log = self.shared.lock();
            log.poison_refusals += 1;
            let error = ProcessorError::msg("sim: a poison record");
            if !name {
                return Err(error);
            }
            log.finish(&self.me, &self.shard, &records[..at]);
            for (i, record) in records.iter().enumerate().skip(at) {
                let verdict = if i == at {
                    Verdict::Named
                } else {
                    Verdict::After
                };
                let key = (
                    self.me.clone(),
                    self.shard.clone(),
                    record.sequence_number.clone(),
                );
                log.verdicts.insert(key, verdict);
            }
            return Err(error.at_record(&records[at]));
        }
        self.finish(batch);
        Ok(())
    }

    async fn lease_lost(&mut self) {}

    async fn shard_ended(&mut self, _: &Checkpointer) -> Result<(), ProcessorError> {
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &Checkpointer) -> Result<(), ProcessorError> {
        Ok(())
    }
}

/// A fault step of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Join,
    Leave,
    Crash,
    Freeze,
    FreezeMidCall,
    Partition,
    LostAnswers,
    LateAnswers,
    Throttle,
    ServerErrors,
    Split,
    Merge,
    SlowProcessor,
    FailingProcessor,
    PanickingProcessor,
    HangingProcessor,
    /// The failure destination refuses writes for a while (seeds with the policy).
    DestinationDown,
    // Java workers (`SimOptions::java` only).
    JavaJoin,
    JavaStop,
    JavaCrash,
    JavaFreeze,
    JavaPartition,
    JavaLostAnswers,
    JavaThrottle,
}

const STEPS: [Step; 16] = [
    Step::Join,
    Step::Leave,
    Step::Crash,
    Step::Freeze,
    Step::FreezeMidCall,
    Step::Partition,
    Step::LostAnswers,
    Step::LateAnswers,
    Step::Throttle,
    Step::ServerErrors,
    Step::Split,
    Step::Merge,
    Step::SlowProcessor,
    Step::FailingProcessor,
    Step::PanickingProcessor,
    Step::HangingProcessor,
];

/// The steps of Java workers, drawn beside [`STEPS`] in Java runs. No late answers and
/// no freeze right after a call lands: the KCL times its own lease from a renewal's
/// *answer*, its takers from when they saw the counter move, so an answer that comes
/// a failover time late lets a Java holder keep a lease a taker rightly judged expired,
/// between Java workers as much as with flotilla (the KCL's race, not one flotilla can
/// fence).
const JAVA_STEPS: [Step; 7] = [
    Step::JavaJoin,
    Step::JavaStop,
    Step::JavaCrash,
    Step::JavaFreeze,
    Step::JavaPartition,
    Step::JavaLostAnswers,
    Step::JavaThrottle,
];
/// Java workers at the start of a Java run, and at most.
const START_JAVA: usize = 2;
const MAX_JAVA: usize = 3;

struct Sim {
    options: SimOptions,
    rng: SplitMix,
    rig: Rig,
    shared: Shared,
    producer: SimProducer,
    live: Vec<Member>,
    joined: usize,
    /// The table's checkpoints at the last check.
    checkpoints: HashMap<LeaseKey, Checkpoint>,
    step: String,
    worker_time: Duration,
    last_tick: Instant,
    fresh_for: Duration,
    /// Every worker's lease table handle, for the per-operation counts.
    tables: Vec<Faulty<Watched>>,
    /// Java runs: the Java workers alive, and how many ever joined.
    java: Vec<JavaWorker>,
    java_joined: usize,
    java_time: Duration,
    /// The seed's failure policy (`None`: off, no poison), and when the destination,
    /// if down, comes back.
    poison: Option<PoisonPlan>,
    destination_down: Option<Instant>,
}

/// The keys of the leases that can be processed now, by the balancer's own rule
/// (`balance::processable`): the set a balanced fleet spreads evenly.
pub fn processable_keys(rows: &[Lease]) -> HashSet<String> {
    let by_key: BTreeMap<&LeaseKey, &Lease> = rows.iter().map(|l| (&l.key, l)).collect();
    rows.iter()
        .filter(|l| balance::processable(l, &by_key))
        .map(|l| l.key.to_string())
        .collect()
}

/// A checkpoint's place in a shard: before any record, at a record, past the last.
pub fn rank(checkpoint: &Checkpoint) -> (u8, Option<&ExtendedSequenceNumber>) {
    match checkpoint {
        Checkpoint::TrimHorizon | Checkpoint::Latest | Checkpoint::AtTimestamp => (0, None),
        Checkpoint::At(at) => (1, Some(at)),
        Checkpoint::ShardEnd => (2, None),
    }
}

impl Sim {
    async fn run(options: SimOptions) -> Result<SimReport, SimFailure> {
        quiet_injected_panics();
        let start = Instant::now();
        let config = MemoryStreamsConfig {
            // Iterators expire after a freeze, a hang or a partition longer than this.
            iterator_ttl: Duration::from_secs(60),
            ..MemoryStreamsConfig::default()
        };
        let shared = Shared::default();
        let poison = PoisonPlan::draw(options.seed);
        {
            let mut log = shared.lock();
            log.poison = poison;
            log.start = Some(start);
            log.verbose = options.verbose;
            log.rng = Some(SplitMix::new(options.seed ^ 0x005E_ED0F_C4A0_5000));
        }
        let mut sim = Sim {
            rng: SplitMix::new(options.seed),
            rig: Rig::new(SHARDS, config).await,
            shared,
            producer: SimProducer::new(options.seed, poison),
            live: Vec::new(),
            joined: 0,
            checkpoints: HashMap::new(),
            step: "start".into(),
            worker_time: Duration::ZERO,
            last_tick: start,
            tables: Vec::new(),
            fresh_for: settings("w", None, None, 1).lease.fence_time(),
            java: Vec::new(),
            java_joined: 0,
            java_time: Duration::ZERO,
            poison,
            destination_down: None,
            options,
        };
        if sim.options.java.is_some() {
            let lease = settings("w", sim.options.java, None, 1).lease;
            sim.shared.lock().java = Some(JavaOracle {
                failover: lease.failover_time,
                renew_every: lease.failover_time / 3,
                fresh_for: lease.fence_time(),
                table: sim.rig.dynamo.lease_table(APP),
                workers: HashMap::new(),
                history: HashMap::new(),
                taken: HashMap::new(),
                troubled: HashSet::new(),
                healed: HashMap::new(),
                stats: BTreeMap::new(),
                steal_overlap: Duration::ZERO,
            });
        }
        let result = sim.drive().await;
        let virtual_time = start.elapsed();
        let log = sim.shared.lock();
        let (mut table_calls, mut table_items) = (BTreeMap::new(), BTreeMap::new());
        let mut table_units: BTreeMap<String, f64> = BTreeMap::new();
        for table in &sim.tables {
            for (op, (calls, items)) in table.counts() {
                *table_calls.entry(op.to_owned()).or_default() += calls;
                if items > 0 {
                    *table_items.entry(op.to_owned()).or_default() += items;
                }
                let units = table.read_units(op).as_units();
                if units > 0.0 {
                    *table_units.entry(op.to_owned()).or_default() += units;
                }
            }
        }
        match result {
            Ok(()) => Ok(SimReport {
                seed: sim.options.seed,
                virtual_time,
                worker_time: sim.worker_time,
                faults: log.faults.clone(),
                checks: log.checks,
                produced: sim.producer.total(),
                process_calls: log.process_calls,
                table_calls,
                table_items,
                table_units,
                duplicates: log.order.duplicates(),
                trace_hash: log.hasher.finish(),
                trace_lines: log.lines,
                java_worker_time: sim.java_time,
                java: log
                    .java
                    .as_ref()
                    .map(|j| j.stats.clone())
                    .unwrap_or_default(),
                java_steal_overlap: log
                    .java
                    .as_ref()
                    .map_or(Duration::ZERO, |j| j.steal_overlap),
                policy: sim.poison.map(|p| p.describe()).unwrap_or_default(),
                lanes: draw_lanes(sim.options.seed),
                poison_put: sim.producer.poison.len() as u64,
                discarded: log.discarded_records.len() as u64,
                poison_discarded: log.poison_discarded,
                poison_java: log
                    .java_poison
                    .iter()
                    .filter(|r| !log.discarded_records.contains(*r))
                    .count() as u64,
                envelopes: log.envelopes,
                destination_refused: log.destination_refused,
                poison_refusals: log.poison_refusals,
            }),
            Err(what) => Err(SimFailure {
                seed: sim.options.seed,
                step: sim.step.clone(),
                what,
                tail: log.tail.iter().cloned().collect(),
                replay: sim.options.replay(),
                at: virtual_time,
            }),
        }
    }

    async fn drive(&mut self) -> Result<(), String> {
        if self.options.java.is_some() {
            // A Java fleet owns every lease before flotilla starts beside it.
            for _ in 0..START_JAVA {
                self.java_join().await;
            }
            self.run_for(Duration::from_secs(30), true).await?;
            self.check().await?;
        }
        for _ in 0..START_WORKERS {
            self.join().await;
        }
        self.run_for(Duration::from_secs(20), true).await?;
        self.check().await?;
        for n in 0..self.options.steps {
            let step = self.pick();
            self.step = format!("step {n} ({step:?})");
            let what = self.take(step).await;
            self.trace(format!("step {n}: {what}"));
            self.note_troubled();
            // The fault's stretch: records flow, the fleet reacts.
            let busy = self
                .rng
                .between(Duration::from_secs(15), Duration::from_secs(60));
            self.run_for(busy, true).await?;
            self.check().await?;
            // A quiet stretch: faults heal on their own time, the fleet idles.
            let quiet = self.rng.between(Duration::ZERO, self.options.quiet);
            self.run_for(quiet, false).await?;
            self.check().await?;
        }
        self.step = "the end".into();
        self.heal_all();
        // The last step of a migration: the Java workers stop; their leases expire and
        // flotilla takes them.
        while let Some(java) = self.java.pop() {
            let id = java.id.clone();
            let cut = java.stop().await;
            self.trace(format!("{id} stops ({cut} consumers cut off)"));
        }
        self.run_for(Duration::from_secs(30), true).await?;
        self.settled().await?;
        self.drain().await?;
        Ok(())
    }

    fn trace(&self, line: String) {
        self.shared.lock().trace(line);
    }

    fn fault(&self, kind: &str) {
        self.shared.lock().fault(kind);
    }

    /// Picks a step the bounds allow.
    fn pick(&mut self) -> Step {
        let healthy = self.live.iter().filter(|m| m.fault.is_none()).count();
        let mut allowed: Vec<Step> = STEPS
            .into_iter()
            .filter(|s| match s {
                Step::Join => self.live.len() < MAX_LIVE,
                Step::Leave | Step::Crash => self.live.len() > MIN_LIVE && healthy > 0,
                Step::Split | Step::Merge => true,
                _ => healthy > 0,
            })
            .collect();
        if self.options.java.is_some() {
            let java_healthy = self.java.iter().filter(|j| j.fault.is_none()).count();
            allowed.extend(JAVA_STEPS.into_iter().filter(|s| match s {
                Step::JavaJoin => self.java.len() < MAX_JAVA,
                _ => java_healthy > 0,
            }));
        }
        if self.poison.is_some() && self.destination_down.is_none() {
            allowed.push(Step::DestinationDown);
        }
        allowed[self.rng.below(allowed.len() as u64) as usize]
    }

    /// A Java worker with no fault on it now.
    fn java_healthy(&mut self) -> Option<usize> {
        let healthy: Vec<usize> = (0..self.java.len())
            .filter(|&i| self.java[i].fault.is_none())
            .collect();
        (!healthy.is_empty()).then(|| healthy[self.rng.index(healthy.len())])
    }

    /// Java runs: tells the oracles which flotilla workers have a fault on now (a steal
    /// from one of them may go unnoticed until its fence time).
    fn note_troubled(&mut self) {
        let troubled: Vec<String> = self
            .live
            .iter()
            .filter(|m| m.fault.is_some())
            .map(|m| m.id.clone())
            .collect();
        if let Some(java) = self.shared.lock().java.as_mut() {
            java.troubled.extend(troubled);
        }
    }

    /// A Java worker joins, behind its own fault injectors and freezer.
    async fn java_join(&mut self) {
        let id = format!("j{:02}", self.java_joined);
        self.java_joined += 1;
        let seed = self.rng.next_u64();
        let freezer = Freezer::new();
        let table = Faulty::new(
            Watched::new(self.rig.dynamo.lease_table(APP), Some(self.hook(&id))),
            FaultPlan::seeded(seed),
        )
        .frozen_by(&freezer);
        let stream =
            Faulty::new(self.rig.streams.clone(), FaultPlan::seeded(seed ^ 1)).frozen_by(&freezer);
        let failover = settings("w", self.options.java, None, 1)
            .lease
            .failover_time;
        let java = JavaWorker::start(
            id.clone(),
            table,
            stream,
            freezer,
            self.shared.clone(),
            JavaTiming {
                failover,
                max_steal: 1,
            },
            seed ^ 2,
        )
        .await;
        if let Some(oracle) = self.shared.lock().java.as_mut() {
            oracle.workers.insert(id, java.handle.clone());
        }
        self.java.push(java);
    }

    /// The landing hook of `id`'s lease table (Java runs).
    fn hook(&self, id: &str) -> java_worker::Hook {
        let (shared, id) = (self.shared.clone(), id.to_owned());
        Arc::new(move |op, key, expected, after| {
            shared.lock().landed(&id, op, key, expected, after);
        })
    }

    /// A live worker with no fault on it now.
    /// How long a freeze lasts: as often shorter as longer than the failover time (a
    /// worker that must not be judged dead, and one that must fence itself).
    fn freeze_length(&mut self, failover: Duration) -> Duration {
        if self.rng.chance(500) {
            self.rng.between(failover / 4, failover * 9 / 10)
        } else {
            self.rng.between(failover * 11 / 10, failover * 4)
        }
    }

    fn healthy(&mut self) -> Option<usize> {
        let healthy: Vec<usize> = (0..self.live.len())
            .filter(|&i| self.live[i].fault.is_none())
            .collect();
        (!healthy.is_empty()).then(|| healthy[self.rng.below(healthy.len() as u64) as usize])
    }

    async fn join(&mut self) {
        let id = format!("w{:02}", self.joined);
        self.joined += 1;
        let seed = self.rng.next_u64();
        let freezer = Freezer::new();
        let hang = Freezer::new();
        let hook = self.options.java.is_some().then(|| self.hook(&id));
        let table = Faulty::new(
            Watched::new(self.rig.dynamo.lease_table(APP), hook),
            FaultPlan::seeded(seed),
        )
        .frozen_by(&freezer);
        self.tables.push(table.clone());
        let stream =
            Faulty::new(self.rig.streams.clone(), FaultPlan::seeded(seed ^ 1)).frozen_by(&freezer);
        let mut backend = Backend::new(
            Arc::new(stream.clone()),
            {
                let table = table.clone();
                move |_| Arc::new(table.clone())
            },
            Arc::new(self.rig.metrics.clone()),
        );
        if self.poison.is_some() {
            backend = backend.with_dead_letters(Arc::new(SimDeadLetters {
                me: id.clone(),
                table: self.rig.dynamo.lease_table(APP),
                freezer: freezer.clone(),
                shared: self.shared.clone(),
            }));
        }
        let factory = {
            let (me, direct, freezer, hang, shared, fresh_for) = (
                id.clone(),
                self.rig.dynamo.lease_table(APP),
                freezer.clone(),
                hang.clone(),
                self.shared.clone(),
                self.fresh_for,
            );
            move |shard: &ShardInfo| SimProcessor {
                me: me.clone(),
                shard: shard.shard_id.clone(),
                table: direct.clone(),
                freezer: freezer.clone(),
                hang: hang.clone(),
                shared: shared.clone(),
                fresh_for,
            }
        };
        let worker = match Worker::builder()
            .settings(settings(
                &id,
                self.options.java,
                self.poison,
                draw_lanes(self.options.seed),
            ))
            .backend(backend)
            .processor(factory)
            .start()
            .await
        {
            Ok(worker) => worker,
            Err(error) => {
                let what = format!("{id} did not start: {error}");
                self.shared.lock().violation(what);
                return;
            }
        };
        self.shared
            .lock()
            .members
            .insert(id.clone(), (table.clone(), freezer.clone()));
        self.live.push(Member {
            id,
            worker,
            table,
            stream,
            freezer,
            hang,
            fault: None,
        });
    }

    /// Takes one step of the schedule; returns what it did, for the trace.
    async fn take(&mut self, step: Step) -> String {
        let failover = Duration::from_secs(10);
        match step {
            Step::Join => {
                self.join().await;
                self.fault("join");
                format!("w{:02} joins", self.joined - 1)
            }
            Step::Leave => {
                let Some(i) = self.healthy() else {
                    return "nobody to leave".into();
                };
                let member = self.live.remove(i);
                self.fault("leave");
                let id = member.id.clone();
                match member.worker.shutdown().await {
                    Ok(report) if report.clean() => format!("{id} leaves"),
                    Ok(report) => format!("{id} leaves uncleanly: {report:?}"),
                    Err(error) => format!("{id} leaves with an error: {error}"),
                }
            }
            Step::Crash => {
                let Some(i) = self.healthy() else {
                    return "nobody to crash".into();
                };
                let member = self.live.remove(i);
                self.fault("crash");
                let id = member.id.clone();
                member.worker.abort();
                format!("{id} crashes")
            }
            Step::Freeze => {
                let Some(i) = self.healthy() else {
                    return "nobody to freeze".into();
                };
                let length = self.freeze_length(failover);
                let member = &mut self.live[i];
                member.freezer.freeze();
                member.fault = Some(("freeze".into(), Instant::now() + length));
                let id = member.id.clone();
                self.fault("freeze");
                format!("{id} freezes for {length:?}")
            }
            Step::FreezeMidCall => {
                let Some(i) = self.healthy() else {
                    return "nobody to freeze".into();
                };
                let length = self.rng.between(failover / 2, failover * 3);
                let op =
                    ["scan", "heartbeat", "GetRecords", "UpdateItem"][self.rng.below(4) as usize];
                let seed = self.rng.next_u64();
                let member = &mut self.live[i];
                if op == "GetRecords" {
                    let nth = member.stream.calls(op);
                    member.stream.set_plan(FaultPlan::seeded(seed).then(
                        Some(op),
                        nth,
                        Fault::Freeze,
                    ));
                } else {
                    let nth = member.table.calls(op);
                    member.table.set_plan(FaultPlan::seeded(seed).then(
                        Some(op),
                        nth,
                        Fault::Freeze,
                    ));
                }
                member.fault = Some(("freeze_mid_call".into(), Instant::now() + length));
                let id = member.id.clone();
                self.fault("freeze_mid_call");
                format!(
                    "{id} freezes right after its next {op} call takes effect, for {length:?} from now"
                )
            }
            Step::Partition => {
                let Some(i) = self.healthy() else {
                    return "nobody to cut off".into();
                };
                let length = self.rng.between(failover / 2, failover * 4);
                let which = self.rng.below(3); // table, stream, both
                let hang = self.rng.chance(500);
                let mut plan = FaultPlan::seeded(self.rng.next_u64());
                if hang {
                    plan.timeout = 1.0;
                    plan.timeout_after = self.rng.between(Duration::from_secs(1), failover);
                } else {
                    plan.transient = 1.0;
                }
                let member = &mut self.live[i];
                if which != 1 {
                    member.table.set_plan(plan.clone());
                }
                if which != 0 {
                    member.stream.set_plan(plan);
                }
                member.fault = Some(("partition".into(), Instant::now() + length));
                let id = member.id.clone();
                self.fault("partition");
                format!(
                    "{id} is cut off from {} ({}) for {length:?}",
                    ["the lease table", "the stream", "both services"][which as usize],
                    if hang { "calls hang" } else { "calls fail" }
                )
            }
            Step::LostAnswers | Step::LateAnswers | Step::Throttle | Step::ServerErrors => {
                let Some(i) = self.healthy() else {
                    return "nobody to trouble".into();
                };
                let length = self.rng.between(failover / 2, failover * 6);
                let rate = 0.1 + self.rng.below(600) as f64 / 1000.0;
                let mut plan = FaultPlan::seeded(self.rng.next_u64());
                let kind = match step {
                    Step::LostAnswers => {
                        plan.lost_response = rate;
                        "lost_answers"
                    }
                    Step::LateAnswers => {
                        plan.late_answer = rate;
                        plan.latency = Some((Duration::from_millis(100), failover));
                        "late_answers"
                    }
                    Step::Throttle => {
                        plan.throttle = rate;
                        "throttling"
                    }
                    _ => {
                        plan.transient = rate;
                        "server_errors"
                    }
                };
                let which = self.rng.below(3);
                let member = &mut self.live[i];
                if which != 1 {
                    member.table.set_plan(plan.clone());
                }
                if which != 0 {
                    member.stream.set_plan(plan);
                }
                member.fault = Some((kind.into(), Instant::now() + length));
                let id = member.id.clone();
                self.fault(kind);
                format!(
                    "{id}: {kind} at {:.0}% on {} for {length:?}",
                    rate * 100.0,
                    ["the lease table", "the stream", "both services"][which as usize]
                )
            }
            Step::Split => {
                let open: Vec<_> = self
                    .rig
                    .open_shards()
                    .await
                    .into_iter()
                    .filter(|s| s.hash_range.end > s.hash_range.start)
                    .collect();
                if open.len() >= 8 {
                    return "no split: 8 open shards".into();
                }
                let shard = &open[self.rng.below(open.len() as u64) as usize];
                let range = shard.hash_range;
                let at = range.start + (range.end - range.start).div_ceil(2);
                self.fault("split");
                match flotilla_actors::backend::StreamAdmin::split_shard(
                    &self.rig.streams,
                    STREAM,
                    &shard.id,
                    at,
                )
                .await
                {
                    Ok(()) => format!("{} splits", shard.id),
                    Err(error) => format!("{} does not split: {error}", shard.id),
                }
            }
            Step::Merge => {
                let open = self.rig.open_shards().await;
                if open.len() < 2 {
                    return "no merge: one open shard".into();
                }
                // Mostly a pair whose second shard lags (its owner is in trouble): a
                // merge is where a child could overtake a parent's backlog.
                let rows = self.rows().await.unwrap_or_default();
                let troubled: HashSet<String> = self
                    .live
                    .iter()
                    .filter(|m| m.fault.is_some())
                    .map(|m| m.id.clone())
                    .collect();
                let lagging: Vec<usize> = (0..open.len() - 1)
                    .filter(|&i| {
                        rows.iter().any(|l| {
                            l.key == LeaseKey::from(&open[i + 1].id)
                                && l.owner
                                    .as_ref()
                                    .is_some_and(|o| troubled.contains(o.as_str()))
                        })
                    })
                    .collect();
                let i = if !lagging.is_empty() && self.rng.chance(800) {
                    lagging[self.rng.below(lagging.len() as u64) as usize]
                } else {
                    self.rng.below(open.len() as u64 - 1) as usize
                };
                // Half the time, reshard under a backlog (as people do): the second
                // shard's owner stops finishing batches first, and records pile up.
                let mut backlog = String::new();
                let owner = rows
                    .iter()
                    .find(|l| l.key == LeaseKey::from(&open[i + 1].id))
                    .and_then(|l| l.owner.clone());
                if self.rng.chance(500)
                    && let Some(m) = self
                        .live
                        .iter()
                        .position(|m| Some(m.id.as_str()) == owner.as_ref().map(|o| o.as_str()))
                    && self.live[m].fault.is_none()
                {
                    let length = self
                        .rng
                        .between(Duration::from_secs(60), Duration::from_secs(180));
                    let member = &mut self.live[m];
                    member.hang.freeze();
                    member.fault = Some(("hanging_processor".into(), Instant::now() + length));
                    backlog = format!(
                        " while {}'s processors hang for {length:?} (since 5 s before)",
                        member.id
                    );
                    self.fault("hanging_processor");
                    for _ in 0..5 {
                        self.producer
                            .put_round(&self.rig.streams, STREAM, KEYS, 1)
                            .await;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                self.fault("merge");
                match flotilla_actors::backend::StreamAdmin::merge_shards(
                    &self.rig.streams,
                    STREAM,
                    &open[i].id,
                    &open[i + 1].id,
                )
                .await
                {
                    Ok(()) => format!("{} and {} merge{backlog}", open[i].id, open[i + 1].id),
                    Err(error) => format!(
                        "{} and {} do not merge: {error}",
                        open[i].id,
                        open[i + 1].id
                    ),
                }
            }
            Step::SlowProcessor | Step::FailingProcessor | Step::PanickingProcessor => {
                let Some(i) = self.healthy() else {
                    return "nobody to trouble".into();
                };
                let length = self.rng.between(failover, failover * 6);
                let mut chaos = Chaos::default();
                let kind = match step {
                    Step::SlowProcessor => {
                        // Sometimes slower than the failover time.
                        chaos.slow =
                            Some(self.rng.between(Duration::from_millis(200), failover * 2));
                        "slow_processor"
                    }
                    Step::FailingProcessor => {
                        chaos.fail = 100 + self.rng.below(500);
                        "failing_processor"
                    }
                    _ => {
                        chaos.panic = 50 + self.rng.below(300);
                        "panicking_processor"
                    }
                };
                let member = &mut self.live[i];
                member.fault = Some((kind.into(), Instant::now() + length));
                let id = member.id.clone();
                self.shared.lock().chaos.insert(id.clone(), chaos.clone());
                self.fault(kind);
                format!("{id}: {kind} {chaos:?} for {length:?}")
            }
            Step::HangingProcessor => {
                let Some(i) = self.healthy() else {
                    return "nobody to trouble".into();
                };
                let length = self.rng.between(failover, Duration::from_secs(150));
                let member = &mut self.live[i];
                member.hang.freeze();
                member.fault = Some(("hanging_processor".into(), Instant::now() + length));
                let id = member.id.clone();
                self.fault("hanging_processor");
                format!("{id}: processors never return (never ack) for {length:?}")
            }
            Step::DestinationDown => {
                let length = self.rng.between(failover / 2, failover * 9);
                self.destination_down = Some(Instant::now() + length);
                self.shared.lock().destination_down = true;
                self.fault("destination_down");
                format!("the failure destination is down for {length:?}")
            }
            Step::JavaJoin => {
                self.java_join().await;
                self.fault("java_join");
                format!("j{:02} (Java) joins", self.java_joined - 1)
            }
            Step::JavaStop | Step::JavaCrash => {
                let Some(i) = self.java_healthy() else {
                    return "no Java worker to stop".into();
                };
                let java = self.java.remove(i);
                let id = java.id.clone();
                if step == Step::JavaStop {
                    self.fault("java_stop");
                    let cut = java.stop().await;
                    format!("{id} (Java) stops gracefully ({cut} consumers cut off)")
                } else {
                    self.fault("java_crash");
                    java.crash();
                    format!("{id} (Java) crashes")
                }
            }
            Step::JavaFreeze => {
                let Some(i) = self.java_healthy() else {
                    return "no Java worker to freeze".into();
                };
                let length = self.freeze_length(failover);
                let java = &mut self.java[i];
                java.freezer.freeze();
                java.fault = Some(("java_freeze".into(), Instant::now() + length));
                let id = java.id.clone();
                self.fault("java_freeze");
                format!("{id} (Java) freezes for {length:?}")
            }
            Step::JavaPartition => {
                let Some(i) = self.java_healthy() else {
                    return "no Java worker to cut off".into();
                };
                let length = self.rng.between(failover / 2, failover * 4);
                let which = self.rng.below(3);
                let hang = self.rng.chance(500);
                let mut plan = FaultPlan::seeded(self.rng.next_u64());
                if hang {
                    plan.timeout = 1.0;
                    plan.timeout_after = self.rng.between(Duration::from_secs(1), failover);
                } else {
                    plan.transient = 1.0;
                }
                let java = &mut self.java[i];
                if which != 1 {
                    java.table.set_plan(plan.clone());
                }
                if which != 0 {
                    java.stream.set_plan(plan);
                }
                java.fault = Some(("java_partition".into(), Instant::now() + length));
                let id = java.id.clone();
                self.fault("java_partition");
                format!(
                    "{id} (Java) is cut off from {} ({}) for {length:?}",
                    ["the lease table", "the stream", "both services"][which as usize],
                    if hang { "calls hang" } else { "calls fail" }
                )
            }
            Step::JavaLostAnswers | Step::JavaThrottle => {
                let Some(i) = self.java_healthy() else {
                    return "no Java worker to trouble".into();
                };
                let length = self.rng.between(failover / 2, failover * 6);
                let rate = 0.1 + self.rng.below(600) as f64 / 1000.0;
                let mut plan = FaultPlan::seeded(self.rng.next_u64());
                let kind = if step == Step::JavaLostAnswers {
                    plan.lost_response = rate;
                    "java_lost_answers"
                } else if self.rng.chance(500) {
                    plan.throttle = rate;
                    "java_throttling"
                } else {
                    plan.transient = rate;
                    "java_server_errors"
                };
                let which = self.rng.below(3);
                let java = &mut self.java[i];
                if which != 1 {
                    java.table.set_plan(plan.clone());
                }
                if which != 0 {
                    java.stream.set_plan(plan);
                }
                java.fault = Some((kind.into(), Instant::now() + length));
                let id = java.id.clone();
                self.fault(kind);
                format!(
                    "{id} (Java): {kind} at {:.0}% on {} for {length:?}",
                    rate * 100.0,
                    ["the lease table", "the stream", "both services"][which as usize]
                )
            }
        }
    }

    /// Ends the faults due by now.
    fn heal_due(&mut self) {
        let now = Instant::now();
        let mut healed = Vec::new();
        for member in &mut self.live {
            if member
                .fault
                .as_ref()
                .is_some_and(|(_, until)| *until <= now)
            {
                Self::heal(member, &self.shared);
                healed.push(member.id.clone());
            }
        }
        for java in &mut self.java {
            if java.fault.as_ref().is_some_and(|(_, until)| *until <= now) {
                Self::heal_java(java, &self.shared);
                healed.push(java.id.clone());
            }
        }
        for id in healed {
            self.trace(format!("{id} healed"));
        }
        if self.destination_down.is_some_and(|until| until <= now) {
            self.destination_up();
        }
    }

    fn destination_up(&mut self) {
        if self.destination_down.take().is_some() {
            self.shared.lock().destination_down = false;
            self.trace("the failure destination is up again".into());
        }
    }

    fn heal_java(java: &mut JavaWorker, shared: &Shared) {
        java.fault = None;
        java.table.set_plan(FaultPlan::seeded(0));
        java.stream.set_plan(FaultPlan::seeded(0));
        if java.freezer.is_frozen() {
            shared.lock().thawed.insert(java.id.clone(), Instant::now());
        }
        java.freezer.thaw();
    }

    fn heal(member: &mut Member, shared: &Shared) {
        member.fault = None;
        member.table.set_plan(FaultPlan::seeded(0));
        member.stream.set_plan(FaultPlan::seeded(0));
        if member.freezer.is_frozen() {
            shared
                .lock()
                .thawed
                .insert(member.id.clone(), Instant::now());
        }
        member.freezer.thaw();
        member.hang.thaw();
        let mut log = shared.lock();
        log.chaos.remove(&member.id);
        if let Some(java) = log.java.as_mut()
            && java.troubled.remove(&member.id)
        {
            java.healed.insert(member.id.clone(), Instant::now());
        }
    }

    fn heal_all(&mut self) {
        for member in &mut self.live {
            Self::heal(member, &self.shared);
        }
        for java in &mut self.java {
            Self::heal_java(java, &self.shared);
        }
        self.destination_up();
        self.trace("every fault healed".into());
    }

    /// Lets `length` of virtual time pass in one-second slices, with a round of records
    /// each slice when `busy` (one every 30 s when not), healing faults as they come due
    /// and failing at the first violation.
    async fn run_for(&mut self, length: Duration, busy: bool) -> Result<(), String> {
        let slice = if busy {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(30)
        };
        let end = Instant::now() + length;
        while Instant::now() < end {
            self.producer
                .put_round(&self.rig.streams, STREAM, KEYS, 1)
                .await;
            self.heal_due();
            let next = (Instant::now() + slice).min(end);
            // Wake up for a heal that comes due first.
            let heal = self
                .live
                .iter()
                .filter_map(|m| m.fault.as_ref().map(|(_, until)| *until))
                .chain(
                    self.java
                        .iter()
                        .filter_map(|j| j.fault.as_ref().map(|(_, until)| *until)),
                )
                .chain(self.destination_down)
                .min();
            let until = heal.map_or(next, |h| h.min(next)).max(Instant::now());
            tokio::time::sleep_until(until).await;
            self.account();
            self.violations()?;
        }
        self.heal_due();
        Ok(())
    }

    fn account(&mut self) {
        let now = Instant::now();
        self.worker_time += (now - self.last_tick) * self.live.len() as u32;
        self.java_time += (now - self.last_tick) * self.java.len() as u32;
        self.last_tick = now;
    }

    fn violations(&self) -> Result<(), String> {
        let log = self.shared.lock();
        match log.violations.first() {
            Some(first) => Err(first.clone()),
            None => Ok(()),
        }
    }

    /// The checks after a step: the table's checkpoints against what was finished.
    async fn check(&mut self) -> Result<(), String> {
        self.violations()?;
        let rows = self.rows().await?;
        let mut log = self.shared.lock();
        let now: HashMap<LeaseKey, Checkpoint> = rows
            .iter()
            .map(|l| (l.key.clone(), l.checkpoint.clone()))
            .collect();
        for (key, before) in &self.checkpoints {
            log.checks += 1;
            match now.get(key) {
                None if before.is_shard_end() => {}
                None => return Err(format!("the lease row of {key} vanished")),
                Some(after) if rank(after) < rank(before) => {
                    return Err(format!(
                        "the checkpoint of {key} went back from {before} to {after}"
                    ));
                }
                Some(_) => {}
            }
        }
        for lease in &rows {
            if let Checkpoint::At(at) = &lease.checkpoint {
                log.checks += 1;
                let shard = lease.key.shard_id();
                // A checkpoint may stand at a record written to the destination.
                let done = log
                    .finished
                    .get(&shard)
                    .is_some_and(|f| f.contains(&at.sequence))
                    || log
                        .discarded
                        .get(&shard)
                        .is_some_and(|d| d.contains(&at.sequence));
                if !done {
                    return Err(format!(
                        "{} is checkpointed at {at}, which no processor finished",
                        lease.key
                    ));
                }
            }
        }
        self.checkpoints = now;
        let owners: Vec<String> = rows
            .iter()
            .map(|l| {
                format!(
                    "{}={}",
                    l.key
                        .shard_id()
                        .as_str()
                        .trim_start_matches("shardId-0000000"),
                    l.owner.as_ref().map_or("-", |o| o.as_str())
                )
            })
            .collect();
        log.trace(format!("check: {}", owners.join(" ")));
        Ok(())
    }

    async fn rows(&self) -> Result<Vec<Lease>, String> {
        let scan = self
            .rig
            .dynamo
            .lease_table(APP)
            .scan()
            .await
            .map_err(|e| format!("the lease table cannot be read: {e}"))?;
        if !scan.malformed.is_empty() {
            return Err(format!("malformed lease rows: {:?}", scan.malformed));
        }
        Ok(scan.leases)
    }

    /// After the heal: the fleet view agrees with the table and the fleet balances.
    async fn settled(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let (agree, fair, view) = self.fleet_view().await?;
            if agree.is_ok() && fair {
                self.trace(format!("settled: {view}"));
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                agree?;
                return Err(format!(
                    "not balanced {SETTLE:?} after the faults healed: {view}"
                ));
            }
            self.run_for(Duration::from_secs(5), true).await?;
        }
    }

    /// Whether each worker's held set agrees with the table, whether the processable
    /// leases are spread evenly, and a line saying who holds what.
    async fn fleet_view(&mut self) -> Result<(Result<(), String>, bool, String), String> {
        let rows = self.rows().await?;
        let processable = processable_keys(&rows);
        let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut counts = BTreeMap::new();
        for member in &self.live {
            let status = member
                .worker
                .status()
                .await
                .map_err(|e| format!("{} does not answer: {e}", member.id))?;
            let keeper = status
                .leases
                .ok_or_else(|| format!("{} has no lease keeper", member.id))?;
            let mine = keeper
                .held
                .iter()
                .filter(|k| processable.contains(*k))
                .count();
            counts.insert(member.id.clone(), mine);
            for key in keeper.held {
                holders.entry(key).or_default().push(member.id.clone());
            }
        }
        let mut agree = Ok(());
        let live: HashSet<&str> = self.live.iter().map(|m| m.id.as_str()).collect();
        for lease in &rows {
            self.shared.lock().checks += 1;
            let key = lease.key.to_string();
            let held_by = holders.get(&key).cloned().unwrap_or_default();
            let owner = lease.owner.as_ref().map(|o| o.to_string());
            let fine = match &owner {
                _ if held_by.len() > 1 => false,
                Some(o) if live.contains(o.as_str()) && processable.contains(&key) => {
                    held_by == [o.clone()]
                }
                _ => held_by.is_empty() || owner.as_ref() == held_by.first(),
            };
            if !fine && agree.is_ok() {
                agree = Err(format!(
                    "{key}: the table names {owner:?}, the workers that hold it are {held_by:?}"
                ));
            }
        }
        let n = counts.len().max(1);
        let (floor, ceil) = (processable.len() / n, processable.len().div_ceil(n));
        let covered: usize = counts.values().sum();
        let fair = covered == processable.len()
            && (counts.values().all(|&h| h == floor || h == ceil)
                || self
                    .uneven_by_throughput(&rows, &counts, floor, ceil)
                    .await?);
        let mut view = String::new();
        let _ = write!(
            view,
            "{} processable leases, held {counts:?}",
            processable.len()
        );
        Ok((agree, fair, view))
    }

    /// Whether counts off even are what throughput balance keeps: within its count slack
    /// of fair shares, no request open, and no member's own `balance::decide`, on the
    /// table and the heartbeats (with the lease rates the workers measured) as they are,
    /// taking or asking for anything. Under count balance, never.
    async fn uneven_by_throughput(
        &self,
        rows: &[Lease],
        counts: &BTreeMap<String, usize>,
        floor: usize,
        ceil: usize,
    ) -> Result<bool, String> {
        let lease = settings("w", self.options.java, None, 1).lease;
        let limits = balance::Limits::from_settings(&lease);
        let slack = match limits.policy {
            balance::Policy::Count => return Ok(false),
            balance::Policy::Throughput(spread) => spread.count_slack,
        };
        if counts
            .values()
            .any(|&h| h + slack < floor || h > ceil + slack)
            || rows.iter().any(|l| l.handoff_to.is_some())
        {
            return Ok(false);
        }
        let scan = self
            .rig
            .dynamo
            .lease_table(APP)
            .scan()
            .await
            .map_err(|e| format!("the lease table cannot be read: {e}"))?;
        let live: HashSet<&str> = self.live.iter().map(|m| m.id.as_str()).collect();
        let beats: Vec<_> = scan
            .heartbeats
            .into_iter()
            .filter(|h| live.contains(h.worker.as_str()))
            .collect();
        let now = Instant::now();
        let mut obs = balance::Observations::new();
        obs.observe(&beats, rows.iter().filter_map(|l| l.owner.as_ref()), now);
        for member in &self.live {
            let me = WorkerId::new(member.id.as_str());
            let held: BTreeMap<LeaseKey, Fence> = rows
                .iter()
                .filter(|l| l.owner.as_ref() == Some(&me))
                .map(|l| (l.key.clone(), l.fence()))
                .collect();
            let d = balance::decide(
                &balance::Round {
                    leases: rows,
                    held: &held,
                    observations: &obs,
                    me: &me,
                    now,
                    cooling: &Default::default(),
                    handing_off: &Default::default(),
                    draining: false,
                },
                &limits,
            );
            if !d.take.is_empty() || !d.request.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Every record produced is finished; then every worker leaves cleanly.
    async fn drain(&mut self) -> Result<(), String> {
        let total = self.producer.total();
        let started = Instant::now();
        loop {
            let distinct: u64 = {
                let log = self.shared.lock();
                log.order.processed()
            };
            if distinct >= total {
                break;
            }
            if started.elapsed() > PATIENCE {
                let log = self.shared.lock();
                let missing: Vec<String> = self
                    .producer
                    .produced
                    .iter()
                    .filter_map(|(key, count)| {
                        let seen = count - log.order.lost([(key, *count)]);
                        (seen < *count).then(|| format!("{key}: {seen} of {count}"))
                    })
                    .take(8)
                    .collect();
                return Err(format!(
                    "{} of {total} records never finished after {PATIENCE:?}: {}",
                    total - distinct,
                    missing.join(", ")
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.account();
            self.violations()?;
        }
        {
            // Every poison record is in the destination (or, beside Java workers, was
            // taken by a Java worker's application, which has no failure policy).
            let log = self.shared.lock();
            let missing: Vec<String> = self
                .producer
                .poison
                .iter()
                .filter(|r| !log.discarded_records.contains(*r) && !log.java_poison.contains(*r))
                .map(|(key, n)| format!("{key}:{n}"))
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "poison records never written to the destination: {}",
                    missing.join(", ")
                ));
            }
        }
        self.check().await?;
        while let Some(member) = self.live.pop() {
            let id = member.id.clone();
            let report = member
                .worker
                .shutdown()
                .await
                .map_err(|e| format!("{id} could not leave: {e}"))?;
            if !report.clean() {
                return Err(format!(
                    "{id} left uncleanly after the faults healed: {report:?}"
                ));
            }
            self.trace(format!("{id} leaves"));
        }
        self.account();
        self.violations()
    }
}
