//! Self-fencing after a gap, on the memory backend in paused time: a worker that is
//! frozen (or cut off from the lease table and the stream) for longer than the failover
//! time, while a peer takes its leases, hands no batch of those shards to its processor
//! after it resumes, even when the lease table answers its first heartbeat at once and
//! its first scan only later.
//!
//! A frozen worker is modelled with a [`Freezer`] shared by its lease table, its stream
//! and its processor: while frozen, every call waits before it starts, a call already
//! under way returns its answer only on thaw (its effect happened), and `process()`
//! stops where it is. Timers keep running, so on thaw everything overdue fires at once,
//! as after SIGCONT. A partition is the same worker with every call failing instead.
//!
//! The oracle is exact on the memory backend: at the moment a batch is handed to the
//! resumed worker's processor, the shard's lease row must name that worker.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::faults::{Fault, FaultPlan, Faulty, Freezer};
use flotilla_actors::backend::memory::{MemoryLeaseTable, MemoryStreamsConfig};
use flotilla_actors::model::{LeaseKey, ShardId, WorkerId};
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, ProcessorMsg, Settings, ShardInfo,
    Worker,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};

use support::probe::{Misbehave, Probe, ProbeFactory, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, keeper, wait_held};

const SHARDS: u32 = 4;

fn settings(id: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(id.to_owned());
    // The gaps are staged on an even split (two leases each). Under throughput balance
    // the feed's keys load the four shards unevenly, and a split of 3 and 1 can be as
    // even in bytes/s as 2 and 2, so that balance may keep it: these tests are about
    // fencing, not balance, and pin the split count balance gives.
    s.lease.balance = flotilla_actors::settings::BalanceMode::Count;
    s
}

/// What the watched worker's processors saw.
#[derive(Debug, Default)]
struct Log {
    /// Set when the gap ends.
    resumed: bool,
    deliveries_after_resume: u64,
    /// Batches handed over while the shard's row named someone else: (shard, owner).
    foreign: Vec<(ShardId, Option<WorkerId>)>,
}

impl Log {
    /// The fence held: nothing was handed over while the row named another worker, and
    /// the worker did deliver after the gap (the check was not vacuous).
    fn assert_fenced(&self) {
        assert_eq!(self.foreign, vec![], "{self:?}");
        assert!(self.deliveries_after_resume > 0, "{self:?}");
    }
}

/// The watched worker's processor: checks ownership at the moment of each delivery,
/// stops while the worker is frozen, then records like any probe.
struct Guarded {
    me: WorkerId,
    key: LeaseKey,
    table: MemoryLeaseTable,
    freezer: Freezer,
    log: Arc<Mutex<Log>>,
    inner: Probe,
}

impl Processor for Guarded {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.inner.initialize(shard).await
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let owner = self
            .table
            .get(&self.key)
            .await
            .unwrap()
            .and_then(|l| l.owner);
        {
            let mut log = self.log.lock().unwrap();
            if log.resumed {
                log.deliveries_after_resume += 1;
            }
            if owner.as_ref() != Some(&self.me) {
                log.foreign.push((batch.shard_id().clone(), owner));
            }
        }
        self.freezer.wait_thawed().await;
        self.inner.process(batch, cp).await
    }

    async fn lease_lost(&mut self) {
        self.inner.lease_lost().await
    }

    async fn shard_ended(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.shard_ended(cp).await
    }

    async fn shutdown_requested(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.shutdown_requested(cp).await
    }
}

/// Where the watched worker's batches go.
#[derive(Debug, Clone, Copy)]
enum Host {
    /// A [`Processor`], hosted by flotilla (which holds queued batches while fenced).
    Processor,
    /// The user's own actor (`processor_actor`): batches go straight to its mailbox.
    OwnActor,
}

/// A user's own processor actor around [`Guarded`]: acks each batch once processed.
struct OwnActor;

impl Actor for OwnActor {
    type Msg = ProcessorMsg;
    type State = Guarded;
    type Arguments = Guarded;

    async fn pre_start(
        &self,
        _: ActorRef<ProcessorMsg>,
        guarded: Guarded,
    ) -> Result<Guarded, ActorProcessingErr> {
        Ok(guarded)
    }

    async fn handle(
        &self,
        myself: ActorRef<ProcessorMsg>,
        message: ProcessorMsg,
        state: &mut Guarded,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProcessorMsg::Initialize(shard) => {
                state.initialize(&shard).await.map_err(|e| e.to_string())?
            }
            ProcessorMsg::Process(batch, cp) => {
                state
                    .process(&batch, &cp)
                    .await
                    .map_err(|e| e.to_string())?;
                cp.ack_batch(&batch);
            }
            ProcessorMsg::LeaseLost => myself.stop(None),
            ProcessorMsg::ShardEnded(cp, reply) => {
                let _ = reply.send(state.shard_ended(&cp).await.map_err(|e| e.to_string()));
            }
            ProcessorMsg::ShutdownRequested(cp, reply) => {
                let done = state.shutdown_requested(&cp).await;
                let _ = reply.send(done.map_err(|e| e.to_string()));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Gap {
    /// Nothing of the worker runs (SIGSTOP, a VM freeze).
    Freeze,
    /// The same, stopped just after sending a lease-table scan: on resume, that scan's
    /// answer (which still shows every lease as the worker's) comes first.
    FreezeMidScan,
    /// Every call of the worker fails (a partition).
    Partition,
}

/// Runs `a` and `b` balanced 2/2, opens the gap on `a` for `length`, lets `b` take what
/// it may, closes the gap (with scans of `a` answered `slow_scans` late, if given), runs
/// on until the fleet is balanced again, and checks that nothing was lost.
async fn gap(kind: Gap, length: Duration, slow_scans: Option<Duration>, processor: Host) -> Log {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());

    let freezer = Freezer::new();
    let table = Faulty::new(rig.dynamo.lease_table(APP), FaultPlan::seeded(1)).frozen_by(&freezer);
    let streams = Faulty::new(rig.streams.clone(), FaultPlan::seeded(2)).frozen_by(&freezer);
    let backend = Backend::new(
        Arc::new(streams.clone()),
        {
            let table = table.clone();
            move |_| Arc::new(table.clone())
        },
        Arc::new(rig.metrics.clone()),
    );
    let log = Arc::new(Mutex::new(Log::default()));
    let guarded = {
        let (log, freezer, probes) = (log.clone(), freezer.clone(), probes.clone());
        let direct = rig.dynamo.lease_table(APP);
        move |shard: &ShardInfo| Guarded {
            me: WorkerId::new("a"),
            key: LeaseKey::from(&shard.shard_id),
            table: direct.clone(),
            freezer: freezer.clone(),
            log: log.clone(),
            inner: probes.make(shard),
        }
    };
    let builder = Worker::builder().settings(settings("a")).backend(backend);
    let builder = match processor {
        Host::Processor => builder.processor(guarded),
        // A user's own actor: the reader is its only gate.
        Host::OwnActor => builder.processor_actor(move |shard: ShardInfo| {
            let guarded = guarded(&shard);
            async move {
                Actor::spawn(None, OwnActor, guarded)
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| e.to_string())
            }
        }),
    };
    let a = builder.start().await.unwrap();
    wait_held(&[&a], &[4], Duration::from_secs(10)).await;
    let b = rig.start_with(&probes, settings("b")).await;
    wait_held(&[&a, &b], &[2, 2], Duration::from_secs(10)).await;
    probes.wait_distinct(300, Duration::from_secs(30)).await;

    let cut_off = {
        let mut plan = FaultPlan::seeded(3);
        plan.transient = 1.0;
        plan
    };
    match kind {
        Gap::Freeze => freezer.freeze(),
        Gap::FreezeMidScan => {
            table.set_plan(FaultPlan::seeded(3).then(
                Some("scan"),
                table.calls("scan"),
                Fault::Freeze,
            ));
            let frozen = freezer.clone();
            support::probe::wait_until(
                "a scan",
                Duration::from_secs(5),
                Duration::from_millis(10),
                || frozen.is_frozen(),
            )
            .await;
        }
        Gap::Partition => {
            table.set_plan(cut_off.clone());
            streams.set_plan(cut_off);
        }
    }
    tokio::time::sleep(length).await;
    let failover = fast_settings(STREAM, APP).lease.failover_time;
    if length > failover * 2 {
        // `a` is frozen: ask only `b`.
        wait_held(&[&b], &[4], Duration::from_secs(5)).await;
    }
    // Only the first scan after the gap is slow: the heartbeat goes through at once.
    let after = match slow_scans {
        Some(delay) => {
            FaultPlan::seeded(4).then(Some("scan"), table.calls("scan"), Fault::Latency(delay))
        }
        None => FaultPlan::seeded(4),
    };
    table.set_plan(after);
    streams.set_plan(FaultPlan::seeded(5));
    log.lock().unwrap().resumed = true;
    freezer.thaw();

    // Back in the fleet: balanced again by handoff, and delivering.
    wait_held(&[&a, &b], &[2, 2], Duration::from_secs(30)).await;
    let delivered = probes.snapshot().distinct();
    probes
        .wait_distinct(delivered + 200, Duration::from_secs(30))
        .await;
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let (ra, rb) = (a.shutdown().await.unwrap(), b.shutdown().await.unwrap());
    assert!(ra.clean() && rb.clean(), "{ra:?}\n{rb:?}");
    probes.assert_nothing_lost(&producer);
    Arc::try_unwrap(log).unwrap().into_inner().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_worker_frozen_past_the_failover_time_delivers_nothing_it_lost_after_resuming() {
    // The first scan after the freeze is answered 2 s late: the first heartbeat does
    // not lift the fence meanwhile.
    gap(
        Gap::Freeze,
        Duration::from_secs(18),
        Some(Duration::from_secs(2)),
        Host::Processor,
    )
    .await
    .assert_fenced();
}

#[tokio::test(start_paused = true)]
async fn a_worker_frozen_mid_scan_delivers_nothing_it_lost_while_its_next_scan_is_slow() {
    // On resume the scan sent before the freeze answers first (every lease still ours),
    // then the first heartbeat after the gap is confirmed, and the next scan takes 2 s.
    gap(
        Gap::FreezeMidScan,
        Duration::from_secs(18),
        Some(Duration::from_secs(2)),
        Host::Processor,
    )
    .await
    .assert_fenced();
}

#[tokio::test(start_paused = true)]
async fn a_frozen_worker_hands_its_own_processor_actor_nothing_it_lost() {
    // No host holds batches here: the reader must not send what it fetched across
    // the gap (its GetRecords call was answered on resume).
    gap(Gap::Freeze, Duration::from_secs(18), None, Host::OwnActor)
        .await
        .assert_fenced();
}

#[tokio::test(start_paused = true)]
async fn a_frozen_worker_whose_table_answers_at_once_delivers_nothing_it_lost() {
    gap(Gap::Freeze, Duration::from_secs(18), None, Host::Processor)
        .await
        .assert_fenced();
}

#[tokio::test(start_paused = true)]
async fn a_partition_that_heals_delivers_nothing_the_worker_lost() {
    gap(
        Gap::Partition,
        Duration::from_secs(18),
        Some(Duration::from_secs(2)),
        Host::Processor,
    )
    .await
    .assert_fenced();
}

#[tokio::test(start_paused = true)]
async fn a_short_freeze_keeps_the_leases_and_resumes_after_rereading_them() {
    // 5 s: past the fence time (4 s), short of the failover time (6 s). Nobody takes
    // anything; the worker fences, then delivers again once its rows are read.
    gap(
        Gap::Freeze,
        Duration::from_secs(5),
        Some(Duration::from_secs(1)),
        Host::Processor,
    )
    .await
    .assert_fenced();
}

/// While fenced after a gap, `/status` (here `Worker::status`) names the reason.
#[tokio::test(start_paused = true)]
async fn a_fenced_shard_shows_why_in_status() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let (a, table) = rig.start_faulty(&probes, settings("a")).await;
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    // Heartbeats and scans fail: the worker fences, and says so.
    let mut outage = FaultPlan::seeded(9);
    outage.transient = 1.0;
    outage.only_ops = vec!["heartbeat", "scan"];
    table.set_plan(outage);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = a.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| matches!(
            s.fenced,
            Some(flotilla_actors::FenceReason::HeartbeatUnconfirmed { .. })
        )),
        "{:?}",
        status.shards
    );
    let k = keeper(&a).await;
    assert!(k.heartbeat_failures > 3, "{k:?}");
    assert!(k.heartbeat_error.is_some(), "{k:?}");
    // Heartbeats come back, scans do not: still fenced, now awaiting a fresh read.
    let mut scans_down = FaultPlan::seeded(10);
    scans_down.transient = 1.0;
    scans_down.only_ops = vec!["scan"];
    table.set_plan(scans_down);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = a.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| matches!(
            s.fenced,
            Some(flotilla_actors::FenceReason::AwaitingReconfirmation { .. })
        )),
        "{:?}",
        status.shards
    );
    table.set_plan(FaultPlan::seeded(11));
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let status = a.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| s.fenced.is_none()),
        "{:?}",
        status.shards
    );
    a.shutdown().await.unwrap();
    probes.assert_nothing_lost(&producer);
}

/// A heartbeat that stays unconfirmed is an ERROR line with its cause as soon as it
/// passes the fence time, then every 30 s: not one per beat (140 in these 70 s).
#[tokio::test(start_paused = true)]
async fn an_unconfirmed_heartbeat_is_an_error_at_once_then_every_30_s() {
    let (events, _guard) = support::events::Events::capture();
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let (a, table) = rig.start_faulty(&probes, settings("a")).await;
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    table.set_plan(support::rig::heartbeat_outage());
    tokio::time::sleep(Duration::from_secs(70)).await;
    let errors: Vec<_> = events
        .with("level", "ERROR")
        .into_iter()
        .filter(|e| {
            e.get("message")
                .is_some_and(|m| m.starts_with("Heartbeat not confirmed"))
        })
        .collect();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0]["error"].contains("throttled"), "{errors:#?}");
    a.abort();
}

/// A shutdown while fenced does not wait out the fence: the batches queued behind it
/// are skipped (left for the next owner), the processor gets `shutdown_requested` at
/// once, and the report is clean.
#[tokio::test(start_paused = true)]
async fn a_shutdown_while_fenced_skips_the_queued_batches_at_once() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave {
        slow: Some(Duration::from_millis(300)),
        ..Misbehave::default()
    });
    // Small batches, so that many wait in the processor's mailbox.
    let mut small = settings("a");
    small.reader.max_records = 10;
    let (a, table) = rig.start_faulty(&probes, small).await;
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    let mut producer = support::probe::Producer::default();
    producer.put_round(&rig.streams, STREAM, 20, 50).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    table.set_plan(support::rig::heartbeat_outage());
    // Fenced (4 s), with batches still queued behind the slow processor.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = a.status().await.unwrap();
    assert!(
        status.shards.iter().all(|s| s.fenced.is_some()),
        "{status:?}"
    );
    let started = tokio::time::Instant::now();
    let report = a.shutdown().await.unwrap();
    let took = started.elapsed();
    assert!(report.clean(), "{report:#?}");
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}
