//! Live migration beside a Java KCL fleet (`lease.java_compat`), on the memory backend
//! with paused time. A "Java fleet" shares the lease table: it renews its own rows as
//! the KCL's `DynamoDBLeaseRenewer` does (counter + 1 each `failover / 3`, conditional
//! on owner and counter; a stalled renewal stops bumping), and observes flotilla's rows
//! with the KCL's expiry rule (`DynamoDBLeaseTaker`: a lease is expired once its counter
//! has not changed for the failover time, as its own scans saw it), taking what it
//! finds expired when told to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_actors::Settings;
use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::faults::{FaultPlan, Faulty, Freezer};
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, WorkerId,
};
use tokio::time::Instant;

use support::http::json_until;
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings, wait_until};
use support::rig::{APP, Rig, STREAM, keeper, shutdown_clean, wait_held};

const SHARDS: u32 = 4;

type Table = Arc<dyn LeaseTable>;
/// `fast_settings`' failover time, which the Java fleet shares (as its
/// `failoverTimeMillis`).
const FAILOVER: Duration = Duration::from_secs(6);

fn settings(id: &str, java_compat: bool) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(id.to_owned());
    s.lease.java_compat = java_compat;
    assert_eq!(s.lease.failover_time, FAILOVER);
    s
}

fn memory_table(rig: &Rig) -> Table {
    Arc::new(rig.dynamo.lease_table(APP))
}

/// What the Java fleet did and saw.
#[derive(Debug, Default)]
struct JavaState {
    /// Leases the Java fleet holds, with the fence it renews under.
    held: BTreeMap<LeaseKey, Fence>,
    /// Leases whose renewal stalls (the Java worker stopped renewing them).
    stalled: BTreeSet<LeaseKey>,
    /// The KCL taker's view: per lease, the counter and when a scan first saw it.
    seen: BTreeMap<LeaseKey, (Option<WorkerId>, u64, Instant)>,
    /// flotilla leases the KCL rule judged expired: (key, owner, how long unchanged).
    expired: Vec<(LeaseKey, WorkerId, Duration)>,
    /// Take what the KCL rule judges expired (as java-2).
    take_expired: bool,
}

struct JavaFleet {
    state: Arc<Mutex<JavaState>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl JavaFleet {
    /// Renews every `FAILOVER / 3` (the KCL renewer's interval) and scans every second
    /// (more often than the KCL taker's `2 × failover`, so a stricter observer).
    fn start(table: Table, held: BTreeMap<LeaseKey, Fence>, failover: Duration) -> Self {
        let state = Arc::new(Mutex::new(JavaState {
            held,
            ..JavaState::default()
        }));
        let renewer = tokio::spawn({
            let (state, table) = (state.clone(), table.clone());
            async move {
                loop {
                    tokio::time::sleep(failover / 3).await;
                    let due: Vec<(LeaseKey, Fence)> = {
                        let s = state.lock().unwrap();
                        s.held
                            .iter()
                            .filter(|(k, _)| !s.stalled.contains(*k))
                            .map(|(k, f)| (k.clone(), f.clone()))
                            .collect()
                    };
                    for (key, fence) in due {
                        let renewed = table.renew(&key, &fence).await;
                        let mut s = state.lock().unwrap();
                        match renewed {
                            Ok(counter) => {
                                s.held.insert(
                                    key,
                                    Fence {
                                        owner: fence.owner,
                                        counter,
                                    },
                                );
                            }
                            // Taken from it: the KCL renewer drops the lease.
                            Err(_) => {
                                s.held.remove(&key);
                            }
                        }
                    }
                }
            }
        });
        let taker = tokio::spawn({
            let (state, table) = (state.clone(), table);
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let scan = table.scan().await.unwrap();
                    let now = Instant::now();
                    let mut take = Vec::new();
                    {
                        let mut s = state.lock().unwrap();
                        for lease in &scan.leases {
                            let entry = s.seen.entry(lease.key.clone()).or_insert((
                                lease.owner.clone(),
                                lease.counter,
                                now,
                            ));
                            if entry.1 != lease.counter {
                                *entry = (lease.owner.clone(), lease.counter, now);
                            }
                            let unchanged = now - entry.2;
                            let Some(owner) = &lease.owner else { continue };
                            if owner.as_str().starts_with("java") || lease.checkpoint.is_shard_end()
                            {
                                continue;
                            }
                            if unchanged > failover {
                                s.expired
                                    .push((lease.key.clone(), owner.clone(), unchanged));
                                if s.take_expired {
                                    take.push(lease.clone());
                                }
                            }
                        }
                    }
                    for lease in take {
                        // `DynamoDBLeaseRefresher.takeLease`: conditional on the counter.
                        let java = WorkerId::new("java-2");
                        if let Ok(taken) = table.take(&lease.key, &lease.fence(), &java).await {
                            let mut s = state.lock().unwrap();
                            // A new owner renews it.
                            s.stalled.remove(&taken.key);
                            s.held.insert(taken.key.clone(), taken.fence());
                        }
                    }
                }
            }
        });
        Self {
            state,
            tasks: vec![renewer, taker],
        }
    }

    fn stall(&self, keys: &[LeaseKey]) {
        self.state
            .lock()
            .unwrap()
            .stalled
            .extend(keys.iter().cloned());
    }

    fn expired(&self) -> Vec<(LeaseKey, WorkerId, Duration)> {
        self.state.lock().unwrap().expired.clone()
    }
}

impl Drop for JavaFleet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The stream with one round of records (numbers 0..5 per key) that the Java fleet has
/// processed and checkpointed: every shard's row owned by `java-1` with its checkpoint
/// at the shard's last record, written as the KCL writes rows. Returns the keys of each
/// shard.
async fn java_owned(
    rig: &Rig,
    table: &Table,
    producer: &mut Producer,
) -> BTreeMap<LeaseKey, Fence> {
    producer.put_round(&rig.streams, STREAM, 40, 5).await;
    table.ensure_table().await.unwrap();
    let mut held = BTreeMap::new();
    for shard in rig.shards().await {
        let records = rig.records(&shard.id).await;
        let last = records.last().expect("every shard has records");
        let mut lease = Lease::new(
            &shard.id,
            Checkpoint::At(ExtendedSequenceNumber::new(last.sequence_number.clone(), 0)),
            vec![],
            None,
        );
        lease.owner = Some(WorkerId::new("java-1"));
        lease.counter = 7;
        assert!(table.create_if_absent(&lease).await.unwrap());
        held.insert(lease.key.clone(), lease.fence());
    }
    held
}

/// The partition keys of the records on the shards of `leases`.
async fn keys_of(rig: &Rig, leases: &[LeaseKey]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for lease in leases {
        let records = rig.records(&lease.shard_id()).await;
        keys.extend(records.into_iter().map(|r| r.partition_key));
    }
    keys
}

async fn owners(table: &Table) -> BTreeMap<String, Option<String>> {
    table
        .scan()
        .await
        .unwrap()
        .leases
        .into_iter()
        .map(|l| (l.key.to_string(), l.owner.map(|o| o.to_string())))
        .collect()
}

/// With the mode on: the live Java leases are never taken; the two whose renewal
/// stalls are taken after the failover time, no sooner, and read from the
/// KCL-written checkpoints (nothing at or before them again); over a long
/// checkpoint-heavy run the KCL's expiry rule never finds a flotilla lease expired.
/// `table` is the lease table flotilla and the Java fleet share (memory, or a
/// real-protocol server), `failover` the failover time of both, `long` the length of the
/// checkpoint-heavy run in rounds of a second.
async fn only_stalled_leases_are_taken(rig: &Rig, table: Table, settings: Settings, long: u64) {
    let failover = settings.lease.failover_time;
    let mut producer = Producer::default();
    let held = java_owned(rig, &table, &mut producer).await;
    let java = JavaFleet::start(table.clone(), held.clone(), failover);
    let probes = ProbeFactory::new(Misbehave::default());
    let backend = flotilla_actors::Backend::new(
        Arc::new(rig.streams.clone()),
        {
            let table = table.clone();
            move |_| table.clone()
        },
        Arc::new(rig.metrics.clone()),
    );
    let worker = rig.start_on(backend, &probes, settings).await;

    tokio::time::sleep(failover * 5).await;
    let all_java = owners(&table).await;
    assert!(
        all_java.values().all(|o| o.as_deref() == Some("java-1")),
        "a live Java lease was taken: {all_java:?}"
    );
    assert_eq!(keeper(&worker).await.held.len(), 0);
    // The fleet view shows the Java worker alive, without a heartbeat row, holding its
    // leases: nothing looks stalled or unassigned.
    let fleet = json_until(
        &worker,
        "/fleet",
        "shows the Java fleet's leases held",
        |f| {
            f["leases"].as_array().is_some_and(|l| {
                l.len() == SHARDS as usize && l.iter().all(|l| l["state"] == "held")
            })
        },
    )
    .await;
    assert_eq!(fleet["stalled"], serde_json::json!([]), "{fleet}");
    assert_eq!(fleet["unassigned"], serde_json::json!([]), "{fleet}");
    let shown = fleet["workers"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["worker_id"] == "java-1"))
        .unwrap_or_else(|| panic!("the Java worker is not shown: {fleet}"));
    assert_eq!(
        (&shown["alive"], &shown["has_heartbeat"], &shown["leases"]),
        (
            &serde_json::json!(true),
            &serde_json::json!(false),
            &serde_json::json!(SHARDS)
        ),
        "{fleet}"
    );

    // The Java worker stops renewing two leases: flotilla takes them after the
    // failover time as it saw the counters stand still, not before.
    let stalled: Vec<LeaseKey> = held.keys().take(2).cloned().collect();
    producer.put_round(&rig.streams, STREAM, 40, 5).await;
    java.stall(&stalled);
    let stall = Instant::now();
    wait_held(&[&worker], &[2], failover * 4).await;
    assert!(
        stall.elapsed() >= failover - failover / 3,
        "taken {:?} after the last renewal could have landed",
        stall.elapsed()
    );
    let rows = owners(&table).await;
    for key in &stalled {
        assert_eq!(
            rows[key.as_str()].as_deref(),
            Some("flotilla-1"),
            "{rows:?}"
        );
    }
    for key in held.keys().skip(2) {
        assert_eq!(rows[key.as_str()].as_deref(), Some("java-1"), "{rows:?}");
    }
    let at_take = table.get(&stalled[0]).await.unwrap().unwrap().counter;

    // Every record of the second round on the taken shards, none of the first.
    let taken_keys = keys_of(rig, &stalled).await;
    let want: u64 = taken_keys.len() as u64 * 5;
    let seen = probes.seen.clone();
    let mut last = 0;
    wait_until(
        "the taken shards' new records",
        failover * 4,
        Duration::from_millis(100),
        || {
            if let Ok(s) = seen.try_lock() {
                last = s.distinct();
            }
            last >= want
        },
    )
    .await;

    // A long, checkpoint-heavy run: records keep coming, checkpoints every interval.
    for _ in 0..long {
        producer.put_round(&rig.streams, STREAM, 40, 1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(failover / 2).await;

    assert_eq!(
        java.expired(),
        vec![],
        "the KCL's expiry rule found a live flotilla lease expired"
    );
    let seen = probes.seen.lock().unwrap().clone();
    for (key, numbers) in &seen.by_key {
        assert!(
            taken_keys.contains(key),
            "{key}: of a shard the Java fleet holds"
        );
        assert!(
            numbers.iter().all(|&n| n >= 5),
            "{key}: a record at or before the KCL checkpoint processed again: {numbers:?}"
        );
        let distinct: BTreeSet<u64> = numbers.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            numbers.len(),
            "{key}: duplicates {numbers:?}"
        );
        assert_eq!(
            distinct,
            (5..10 + long).collect(),
            "{key}: every later record"
        );
    }
    // Renewed every failover / 3: at least twice per failover time, counted from the
    // row (the only place a renewal shows).
    let renewed = table.get(&stalled[0]).await.unwrap().unwrap().counter;
    let held_for = stall.elapsed().as_secs() / failover.as_secs().max(1);
    // BENCHMARKS.md quotes this line.
    println!(
        "renewals: {} in the {:?} since the stall (taken a failover time or so after it), failover {failover:?}",
        renewed - at_take,
        stall.elapsed()
    );
    assert!(
        renewed - at_take >= 2 * held_for.saturating_sub(2),
        "renewed {} times in {held_for} failover times",
        renewed - at_take
    );
    assert!(shutdown_clean(worker).await.clean());
    drop(java);
}

#[tokio::test(start_paused = true)]
async fn beside_a_java_fleet_only_stalled_leases_are_taken_and_resume_at_its_checkpoints() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let table = memory_table(&rig);
    only_stalled_leases_are_taken(&rig, table, settings("flotilla-1", true), 60).await;
}

/// The same through the real DynamoDB adapter, in real time: the lease table on a
/// real-protocol server (dynoxide in process; DynamoDB Local and moto from
/// `scripts/test.sh`), the stream in memory.
mod servers_tier {
    use super::*;
    use flotilla_actors::backend::aws::DynamoLeaseTable;
    use support::servers;

    async fn run(endpoint: String) {
        let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
        let application = servers::unique_name("java-migration");
        let table: Table = Arc::new(DynamoLeaseTable::new(
            &servers::sdk_config(),
            Some(&endpoint),
            &application,
        ));
        let mut s = settings("flotilla-1", true);
        s.worker.application = application;
        s.lease.failover_time = Duration::from_secs(3);
        s.lease.fence_margin = Duration::from_secs(1);
        only_stalled_leases_are_taken(&rig, table, s, 12).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynoxide() {
        run(servers::start_dynoxide().await).await;
    }

    #[cfg(feature = "external-servers")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dynamodb_local() {
        run(servers::external_endpoint(
            "FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT",
        ))
        .await;
    }

    #[cfg(feature = "external-servers")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn moto() {
        run(servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT")).await;
    }
}

/// With the mode off (the default, a cold cutover), the same live Java leases are taken
/// after the failover time: why the mode exists.
#[tokio::test(start_paused = true)]
async fn without_the_mode_live_java_leases_are_taken() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    let table = memory_table(&rig);
    let held = java_owned(&rig, &table, &mut producer).await;
    let java = JavaFleet::start(table, held, FAILOVER);
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig.start_with(&probes, settings("flotilla-1", false)).await;
    wait_held(&[&worker], &[SHARDS as usize], Duration::from_secs(20)).await;
    // And the KCL's rule then finds flotilla's leases expired: nothing renews them.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!java.expired().is_empty());
    let _ = shutdown_clean(worker).await;
}

/// A flotilla worker frozen past the failover time: the Java fleet takes its leases
/// (the KCL rule: their counters stood still), and on thaw flotilla delivers nothing
/// more of them (its renewal is refused, and its heartbeat gap fences it until a scan).
#[tokio::test(start_paused = true)]
async fn a_frozen_flotilla_worker_is_fenced_when_the_java_fleet_takes_its_leases() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let mut producer = Producer::default();
    let table = memory_table(&rig);
    let held = java_owned(&rig, &table, &mut producer).await;
    let java = JavaFleet::start(table.clone(), held.clone(), FAILOVER);
    let stalled: Vec<LeaseKey> = held.keys().take(2).cloned().collect();
    java.stall(&stalled);
    let freezer = Freezer::new();
    let frozen = Faulty::new(rig.dynamo.lease_table(APP), FaultPlan::seeded(1)).frozen_by(&freezer);
    let streams = Faulty::new(rig.streams.clone(), FaultPlan::seeded(2)).frozen_by(&freezer);
    let backend = flotilla_actors::Backend::new(
        Arc::new(streams),
        move |_| Arc::new(frozen.clone()),
        Arc::new(rig.metrics.clone()),
    );
    let probes = ProbeFactory::new(Misbehave::default());
    let worker = rig
        .start_on(backend, &probes, settings("flotilla-1", true))
        .await;
    wait_held(&[&worker], &[2], Duration::from_secs(20)).await;
    let taken_keys = keys_of(&rig, &stalled).await;
    producer.put_round(&rig.streams, STREAM, 40, 5).await;
    let want = taken_keys.len() as u64 * 5;
    let seen = probes.seen.clone();
    wait_until(
        "the taken shards' records",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || seen.try_lock().is_ok_and(|s| s.distinct() >= want),
    )
    .await;
    java.state.lock().unwrap().take_expired = true;

    freezer.freeze();
    tokio::time::sleep(FAILOVER * 2).await;
    let rows = owners(&table).await;
    for key in &stalled {
        assert_eq!(rows[key.as_str()].as_deref(), Some("java-2"), "{rows:?}");
    }
    freezer.thaw();
    producer.put_round(&rig.streams, STREAM, 40, 5).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = probes.seen.lock().unwrap().clone();
    for (key, numbers) in &after.by_key {
        assert!(
            numbers.iter().all(|&n| n < 10),
            "{key}: flotilla delivered records produced after the Java fleet took the lease: {numbers:?}"
        );
    }
    assert_eq!(keeper(&worker).await.held.len(), 0);
    let _ = shutdown_clean(worker).await;
}
