//! Fleets of `flotilla run` processes on one stream and one lease table, against the
//! external servers started by scripts/test.sh (kinesis-mock, DynamoDB Local), with a
//! producer writing per-key sequences the whole time.
//!
//! * `kill_9_moves_shards_to_survivors_across_a_split_and_a_merge`: 3 workers on 12
//!   shards; a shard is split; one worker is killed with SIGKILL and its shards must
//!   resume on the survivors; the split's children are merged back. Nothing lost,
//!   per-key order kept (re-deliveries after the crash are duplicates, not violations).
//! * `a_joining_worker_gets_its_share_and_sigterm_hands_off`: 3 workers on 12 shards, a
//!   4th joins and every worker must end up with 3 leases, each lease changing owner at
//!   most once; then one worker gets SIGTERM: it exits 0 and its shards move to the
//!   others with no record delivered twice and none lost.
//!
//! * `a_worker_paused_past_the_failover_time_delivers_nothing_it_lost`: 2 workers on
//!   6 shards; one is stopped with SIGSTOP for 2.5 x the failover time while the other
//!   takes all its leases, then continued with SIGCONT: no record it delivers from then
//!   on is one that another worker delivered too (it hands over nothing of the shards it
//!   lost), and it gets its share back by handoff. Nothing lost.
//!
//! * `a_table_stream_sigterm_hands_the_one_shard_over`: 2 workers on a DynamoDB Local
//!   table's change stream (`FLOTILLA__WORKER__STREAM=dynamodb:TABLE`,
//!   `FLOTILLA__AWS__DYNAMODB_ENDPOINT`), whose one shard the first holds while the
//!   second holds and delivers nothing; the first gets SIGTERM while items are being
//!   written and hands the shard over: no change delivered twice, none lost, each item's
//!   changes in order, from the stdout lines' `change` objects. In the fan-out pass, a
//!   worker with `reader.mode = "fanout"` on a table's stream must refuse to start.
//!
//! Measurements (gaps, duplicates, balance times) are printed as `fleet[TAG]: ...`
//! lines in every run; scripts/test.sh repeats them in its summary. The tests run one
//! after the other (a lock), so their processes do not compete for the servers.
//!
//! Built only with the `flotilla-actors/external-servers` feature (scripts/test.sh
//! sets it); with it and without the servers they fail, naming the missing variable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod fleet;

use std::time::{Duration, Instant};

use fleet::{
    Checks, Env, FAILOVER_SECS, Fleet, Leases, Producer, SHUTDOWN_TIMEOUT, TableEnv, TableWriter,
    changes, keys_crossing, ms, order_of, read_mode, record_duplicates_since, report, resume_gaps,
    wait_for,
};
use flotilla_actors::backend::StreamAdmin as _;
use flotilla_actors::model::ShardId;

/// Shards of each test's stream, and workers started first.
const SHARDS: usize = 12;
const WORKERS: usize = 3;

/// Until the first workers deliver records of every shard and own every lease.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Until both children of a split, or the child of a merge, deliver records.
const RESHARD_LIMIT: Duration = Duration::from_secs(20);
/// (a) SIGKILL to the first record of each of the victim's shards on a survivor.
const KILL_GAP_LIMIT: Duration = Duration::from_secs(3 * FAILOVER_SECS);
/// (b) A new worker's join to every worker holding exactly LEASES_PER_WORKER leases.
const BALANCE_LIMIT: Duration = Duration::from_secs(5 * FAILOVER_SECS);
/// (b) How long the balanced state must then hold.
const BALANCE_STABLE_FOR: Duration = Duration::from_secs(3);
/// (b) How long no lease may change owner before the join, to start from a still fleet.
const SETTLED_FOR: Duration = Duration::from_secs(3);
/// (b) 12 shards over 4 workers.
const LEASES_PER_WORKER: usize = 3;
/// (b) Owner changes per lease while the fleet rebalances.
const MAX_OWNER_CHANGES_PER_LEASE: usize = 1;
/// (c) SIGTERM to exit: the worker's own shutdown timeout, plus room.
const SHUTDOWN_EXIT_LIMIT: Duration = SHUTDOWN_TIMEOUT.saturating_add(Duration::from_secs(10));
/// (c) SIGTERM to the first record of each of the leaver's shards on another worker.
const HANDOFF_GAP_LIMIT: Duration = Duration::from_secs(3 * FAILOVER_SECS);
/// (c) Records delivered twice from the SIGTERM on.
const HANDOFF_DUPLICATES_ALLOWED: u64 = 0;
/// Once the producer stops, until every record produced has been delivered.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);
/// Extra waiting past a limit, so a missed bound is reported with its real value.
const GRACE: Duration = Duration::from_secs(8);

/// How often deliveries are looked at, and the lease table scanned.
const STEP: Duration = Duration::from_millis(100);
const TABLE_POLL: Duration = Duration::from_millis(200);

/// One fleet test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until records of every open shard have been delivered and every lease is owned.
async fn wait_steady(env: &Env, fleet: &Fleet, tag: &str) {
    let start = Instant::now();
    loop {
        let open: Vec<String> = env
            .open_shards()
            .await
            .iter()
            .map(|s| s.id.as_str().to_owned())
            .collect();
        let delivered = fleet.shards_delivered();
        let leases = env.leases().await;
        if open.iter().all(|s| delivered.contains(s)) && leases.all_owned() {
            report(
                tag,
                &format!(
                    "all {} open shards delivering after {}; leases per worker {:?}",
                    open.len(),
                    ms(start.elapsed()),
                    leases.counts()
                ),
            );
            return;
        }
        assert!(
            start.elapsed() < START_LIMIT,
            "not every shard delivering within {START_LIMIT:?}: open {open:?}, delivered \
             {delivered:?}, leases {leases:?}\n{}",
            fleet.diagnostics()
        );
        tokio::time::sleep(TABLE_POLL).await;
    }
}

/// The live worker holding the most open leases.
fn busiest(leases: &Leases, alive: &[String]) -> String {
    let counts = leases.counts();
    alive
        .iter()
        .max_by_key(|w| counts.get(*w).copied().unwrap_or(0))
        .cloned()
        .unwrap()
}

fn gaps_text(gaps: &std::collections::BTreeMap<String, Option<Duration>>) -> String {
    gaps.iter()
        .map(|(shard, gap)| format!("{shard}: {}", gap.map_or("none".to_owned(), ms)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stops the producer, waits for the fleet to deliver everything, and checks the whole
/// run: nothing lost, per-key order, nothing unexpected on stdout.
async fn finish(
    tag: &'static str,
    producer: Producer,
    fleet: &Fleet,
    checks: &mut Checks,
) -> Vec<fleet::Delivery> {
    let produced = producer.stop().await;
    let caught_up = wait_for(CATCH_UP_LIMIT, Duration::from_millis(250), || {
        order_of(&fleet.deliveries()).lost(produced.counts()) == 0
    })
    .await;
    let deliveries = fleet.deliveries();
    let order = order_of(&deliveries);
    let lost = order.lost(produced.counts());
    report(
        tag,
        &format!(
            "produced {} records ({} put retries); delivered {}, distinct {}, duplicates {}, \
             lost {lost}, order violations {}, malformed {}; caught up {}",
            produced.total(),
            produced.retries,
            order.deliveries(),
            order.processed(),
            order.duplicates(),
            order.violations(),
            order.malformed(),
            caught_up.map_or("never".to_owned(), ms),
        ),
    );
    checks.check(
        produced.error.is_none(),
        format!("the producer wrote throughout: {:?}", produced.error),
    );
    checks.check(
        lost == 0,
        format!(
            "0 records lost (every one of {} produced delivered at least once within \
             {CATCH_UP_LIMIT:?} of the producer's stop): {lost} lost",
            produced.total()
        ),
    );
    checks.check(
        order.violations() == 0,
        format!(
            "per-key order: {} violations {:?}",
            order.violations(),
            order.examples()
        ),
    );
    let bad = fleet.bad_lines();
    checks.check(
        order.malformed() == 0 && order.unproduced(produced.counts()) == 0 && bad.is_empty(),
        format!(
            "only produced records on stdout: {} malformed, {} unproduced, other lines {:?}",
            order.malformed(),
            order.unproduced(produced.counts()),
            &bad[..bad.len().min(5)]
        ),
    );
    deliveries
}

/// (a) kill -9 and (d) a split and a merge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_moves_shards_to_survivors_across_a_split_and_a_merge() {
    const TAG: &str = "kill";
    let _serial = SERIAL.lock().await;
    let env = Env::new("fleet-kill", SHARDS as u32).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    for i in 1..=WORKERS {
        fleet.spawn(&env, &format!("kill-w{i}"));
    }
    let mut checks = Checks::new(TAG);
    wait_steady(&env, &fleet, TAG).await;

    // (d) Split the first shard in the middle of its hash range.
    let parent = env.open_shards().await.remove(0);
    let range = parent.hash_range;
    let split_at = range.start + (range.end - range.start) / 2 + 1;
    env.kinesis
        .split_shard(&env.stream, &parent.id, split_at)
        .await
        .unwrap();
    let split = Instant::now();
    let children: Vec<String> = env
        .open_shards()
        .await
        .iter()
        .filter(|s| s.parents().any(|p| p == &parent.id))
        .map(|s| s.id.as_str().to_owned())
        .collect();
    assert_eq!(children.len(), 2, "children of {}: {children:?}", parent.id);
    let took = wait_for(RESHARD_LIMIT, STEP, || {
        let delivered = fleet.shards_delivered();
        children.iter().all(|c| delivered.contains(c))
    })
    .await;
    checks.check(
        took.is_some(),
        format!(
            "split {} into {children:?}: both children delivering within {RESHARD_LIMIT:?} \
             (after {})",
            parent.id,
            took.map_or("never".to_owned(), ms)
        ),
    );

    // (a) SIGKILL the worker holding the most leases.
    let leases = env.leases().await;
    let victim = busiest(&leases, &fleet.alive());
    let moved = leases.held_by(&victim);
    let killed = fleet.kill(&victim);
    report(
        TAG,
        &format!(
            "kill -9 {victim}, holding {} leases {moved:?}; leases per worker before: {:?}",
            moved.len(),
            leases.counts()
        ),
    );
    wait_for(KILL_GAP_LIMIT + GRACE, STEP, || {
        resume_gaps(&fleet, &moved, killed, &victim)
            .values()
            .all(Option::is_some)
    })
    .await;
    let gaps = resume_gaps(&fleet, &moved, killed, &victim);
    report(
        TAG,
        &format!(
            "gap kill -> first record on a survivor: {}",
            gaps_text(&gaps)
        ),
    );
    checks.check(
        gaps.values()
            .all(|gap| gap.is_some_and(|g| g <= KILL_GAP_LIMIT)),
        format!(
            "every shard of {victim} resumed on a survivor within {KILL_GAP_LIMIT:?} \
             (3 x failover_time)"
        ),
    );
    report(
        TAG,
        &format!(
            "leases per worker after the kill: {:?}",
            env.leases().await.counts()
        ),
    );

    // (d) Merge the two children back into one.
    env.kinesis
        .merge_shards(
            &env.stream,
            &ShardId::new(children[0].as_str()),
            &ShardId::new(children[1].as_str()),
        )
        .await
        .unwrap();
    let open = env.open_shards().await;
    let merged: Vec<String> = open
        .iter()
        .filter(|s| s.parents().any(|p| p.as_str() == children[0]))
        .map(|s| s.id.as_str().to_owned())
        .collect();
    assert_eq!(merged.len(), 1, "child of {children:?}: {merged:?}");
    assert_eq!(open.len(), SHARDS, "open shards after the merge");
    let took = wait_for(RESHARD_LIMIT, STEP, || {
        fleet.shards_delivered().contains(&merged[0])
    })
    .await;
    checks.check(
        took.is_some(),
        format!(
            "merge {children:?} into {}: it delivers within {RESHARD_LIMIT:?} (after {})",
            merged[0],
            took.map_or("never".to_owned(), ms)
        ),
    );
    report(
        TAG,
        &format!(
            "split at +0 s, kill at +{}, merge at +{}",
            ms(killed - split),
            ms(split.elapsed())
        ),
    );

    let deliveries = finish(TAG, producer, &fleet, &mut checks).await;
    let (after_kill, examples) = record_duplicates_since(&deliveries, killed);
    report(
        TAG,
        &format!(
            "records delivered again after the kill (shard, sequence, subsequence): \
             {after_kill}, e.g. {examples:?}"
        ),
    );
    let parent = [parent.id.as_str().to_owned()];
    let across_split: Vec<usize> = children
        .iter()
        .map(|child| keys_crossing(&deliveries, &parent, child))
        .collect();
    let across_merge = keys_crossing(&deliveries, &children, &merged[0]);
    checks.check(
        across_split.iter().all(|&n| n > 0) && across_merge > 0,
        format!(
            "keys with records on both sides: split {} -> {children:?}: {across_split:?}, \
             merge -> {}: {across_merge} (their order is in the per-key check)",
            parent[0], merged[0]
        ),
    );
    let alive = fleet.alive();
    checks.check(
        alive.len() == WORKERS - 1,
        format!("the survivors still run: {alive:?}"),
    );
    checks.finish(&fleet);
}

/// (b) A worker joins: every worker ends up with its share. (c) SIGTERM: a clean exit
/// and a handoff without duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_worker_gets_its_share_and_sigterm_hands_off() {
    const TAG: &str = "join";
    let _serial = SERIAL.lock().await;
    let env = Env::new("fleet-join", SHARDS as u32).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    for i in 1..=WORKERS {
        fleet.spawn(&env, &format!("join-w{i}"));
    }
    let mut checks = Checks::new(TAG);
    wait_steady(&env, &fleet, TAG).await;

    // The first workers' own moves (a balancing fleet evens out 3 ways first) must not
    // count against the join: wait until no lease has changed owner for a while.
    let mut before = env.leases().await;
    let mut unchanged_since = Instant::now();
    let settle_start = Instant::now();
    while unchanged_since.elapsed() < SETTLED_FOR && settle_start.elapsed() < BALANCE_LIMIT {
        tokio::time::sleep(TABLE_POLL).await;
        let now = env.leases().await;
        if now.open != before.open {
            unchanged_since = Instant::now();
        }
        before = now;
    }
    report(
        TAG,
        &format!(
            "owners unchanged for {} before the join (waited {}); leases per worker {:?}",
            ms(unchanged_since.elapsed()),
            ms(settle_start.elapsed()),
            before.counts()
        ),
    );

    // (b) A fourth worker joins.
    let mut owners: std::collections::BTreeMap<String, String> = before
        .open
        .iter()
        .filter_map(|(key, owner)| Some((key.clone(), owner.clone()?)))
        .collect();
    let mut changes: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    fleet.spawn(&env, &format!("join-w{}", WORKERS + 1));
    let joined = Instant::now();
    let live = fleet.alive();
    let mut balanced_since: Option<Instant> = None;
    let mut last;
    let balanced_after = loop {
        let leases = env.leases().await;
        // An owner change: a lease's owner differs from its last owner seen; a lease
        // released and then taken by another worker changes owner once.
        for (key, owner) in &leases.open {
            let Some(owner) = owner else { continue };
            if let Some(previous) = owners.insert(key.clone(), owner.clone())
                && &previous != owner
            {
                *changes.entry(key.clone()).or_insert(0) += 1;
            }
        }
        let counts = leases.counts();
        let balanced = leases.all_owned()
            && leases.open.len() == SHARDS
            && counts.len() == live.len()
            && live
                .iter()
                .all(|w| counts.get(w) == Some(&LEASES_PER_WORKER));
        if !balanced {
            balanced_since = None;
        } else if balanced_since.is_none() {
            balanced_since = Some(Instant::now());
        }
        last = leases;
        if let Some(since) = balanced_since
            && since.elapsed() >= BALANCE_STABLE_FOR
        {
            break Some(since - joined);
        }
        if joined.elapsed() > BALANCE_LIMIT + BALANCE_STABLE_FOR {
            break None;
        }
        tokio::time::sleep(TABLE_POLL).await;
    };
    let most_changes = changes.values().copied().max().unwrap_or(0);
    report(
        TAG,
        &format!(
            "join {}: balanced after {}; leases per worker now {:?}; owner changes per \
             lease (max {most_changes}): {changes:?}",
            live.last().unwrap(),
            balanced_after.map_or("never".to_owned(), ms),
            last.counts()
        ),
    );
    checks.check(
        balanced_after.is_some_and(|t| t <= BALANCE_LIMIT),
        format!(
            "within {BALANCE_LIMIT:?} of the join every one of {} live workers holds exactly \
             {LEASES_PER_WORKER} of {SHARDS} leases (held {BALANCE_STABLE_FOR:?}): leases per \
             worker {:?}",
            live.len(),
            last.counts()
        ),
    );
    checks.check(
        most_changes <= MAX_OWNER_CHANGES_PER_LEASE,
        format!(
            "each lease changed owner at most {MAX_OWNER_CHANGES_PER_LEASE} time(s) during \
             the join: max {most_changes}"
        ),
    );

    // (c) SIGTERM the worker holding the most leases.
    let leases = env.leases().await;
    let victim = busiest(&leases, &fleet.alive());
    let moved = leases.held_by(&victim);
    let terminated = fleet.terminate(&victim);
    report(
        TAG,
        &format!(
            "SIGTERM {victim}, holding {} leases {moved:?}; leases per worker before: {:?}",
            moved.len(),
            leases.counts()
        ),
    );
    let status = fleet.wait_exit(&victim, SHUTDOWN_EXIT_LIMIT).await;
    report(
        TAG,
        &format!(
            "{victim} exited after {}: {status:?}; its last log line: {}",
            ms(terminated.elapsed()),
            fleet.log_tail(&victim, 1)
        ),
    );
    checks.check(
        status.is_some_and(|s| s.success()),
        format!(
            "{victim} exits 0 within {SHUTDOWN_EXIT_LIMIT:?} of SIGTERM: {status:?}\n{}",
            fleet.log_tail(&victim, 5)
        ),
    );
    wait_for(HANDOFF_GAP_LIMIT + GRACE, STEP, || {
        resume_gaps(&fleet, &moved, terminated, &victim)
            .values()
            .all(Option::is_some)
    })
    .await;
    let gaps = resume_gaps(&fleet, &moved, terminated, &victim);
    report(
        TAG,
        &format!(
            "gap SIGTERM -> first record on another worker: {}",
            gaps_text(&gaps)
        ),
    );
    checks.check(
        !moved.is_empty()
            && gaps
                .values()
                .all(|gap| gap.is_some_and(|g| g <= HANDOFF_GAP_LIMIT)),
        format!("every shard of {victim} resumed on another worker within {HANDOFF_GAP_LIMIT:?}"),
    );
    let after = env.leases().await;
    let alive = fleet.alive();
    checks.check(
        after.all_owned()
            && after
                .open
                .values()
                .all(|owner| owner.as_ref().is_some_and(|o| alive.contains(o))),
        format!(
            "every lease is held by a live worker ({alive:?}): {:?}",
            after.counts()
        ),
    );

    let deliveries = finish(TAG, producer, &fleet, &mut checks).await;
    let (duplicates, examples) = record_duplicates_since(&deliveries, terminated);
    report(
        TAG,
        &format!(
            "records delivered again after the SIGTERM (shard, sequence, subsequence): \
             {duplicates}, e.g. {examples:?}"
        ),
    );
    #[allow(clippy::absurd_extreme_comparisons)] // the named bound happens to be 0
    checks.check(
        duplicates <= HANDOFF_DUPLICATES_ALLOWED,
        format!(
            "at most {HANDOFF_DUPLICATES_ALLOWED} records delivered twice from the SIGTERM \
             on: {duplicates}"
        ),
    );
    checks.finish(&fleet);
}

/// (e) SIGSTOP for 2.5 x the failover time, then SIGCONT: self-fencing holds after the
/// gap, so the resumed worker hands no batch of a shard it lost to its processor, and
/// two workers never deliver one record concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_paused_past_the_failover_time_delivers_nothing_it_lost() {
    const TAG: &str = "pause";
    const PAUSE_SHARDS: u32 = 6;
    let _serial = SERIAL.lock().await;
    let env = Env::new("fleet-pause", PAUSE_SHARDS).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    for id in ["pause-w1", "pause-w2"] {
        fleet.spawn(&env, id);
    }
    let mut checks = Checks::new(TAG);
    wait_steady(&env, &fleet, TAG).await;
    let start = Instant::now();
    loop {
        let counts = env.leases().await.counts();
        if counts.get("pause-w1") == Some(&3) && counts.get("pause-w2") == Some(&3) {
            break;
        }
        assert!(start.elapsed() < BALANCE_LIMIT, "never 3/3: {counts:?}");
        tokio::time::sleep(TABLE_POLL).await;
    }

    let victim = "pause-w1";
    let lost = env.leases().await.held_by(victim);
    let paused = fleet.pause(victim);
    let pause_for = Duration::from_millis(2500 * FAILOVER_SECS);
    // Meanwhile the other worker takes every lease of the paused one.
    let mut taken_after = None;
    while paused.elapsed() < pause_for {
        if taken_after.is_none() && env.leases().await.held_by(victim).is_empty() {
            taken_after = Some(paused.elapsed());
        }
        tokio::time::sleep(TABLE_POLL).await;
    }
    checks.check(
        taken_after.is_some(),
        format!(
            "the other worker took all of {lost:?} while {victim} was stopped (after {})",
            taken_after.map_or("never".to_owned(), ms)
        ),
    );
    let resumed = fleet.resume(victim);

    // Back in the fleet: it gets its share again by handoff, and delivers.
    let rejoined = wait_for(BALANCE_LIMIT, TABLE_POLL, || {
        fleet.with_deliveries(|all| all.iter().any(|d| &*d.worker == victim && d.at > resumed))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deliveries = finish(TAG, producer, &fleet, &mut checks).await;

    // A record the resumed worker delivered after SIGCONT that another worker delivered
    // too: both had it, one of them unfenced without the lease.
    let others: std::collections::HashSet<(&str, &str, u64)> = deliveries
        .iter()
        .filter(|d| &*d.worker != victim)
        .map(|d| (d.shard.as_str(), d.sequence.as_str(), d.sub_sequence))
        .collect();
    let after: Vec<&fleet::Delivery> = deliveries
        .iter()
        .filter(|d| &*d.worker == victim && d.at > resumed)
        .collect();
    let stale: Vec<String> = after
        .iter()
        .filter(|d| others.contains(&(d.shard.as_str(), d.sequence.as_str(), d.sub_sequence)))
        .map(|d| format!("{} {} +{}", d.shard, d.key, ms(d.at - resumed)))
        .collect();
    report(
        TAG,
        &format!(
            "SIGSTOP {victim} for {} holding {lost:?}; taken over after {}; after SIGCONT it delivered {} records, {} of them also delivered by the other worker {:?}; delivering again after {}",
            ms(pause_for),
            taken_after.map_or("never".to_owned(), ms),
            after.len(),
            stale.len(),
            &stale[..stale.len().min(5)],
            rejoined.map_or("never".to_owned(), ms),
        ),
    );
    checks.check(
        stale.is_empty(),
        format!(
            "{victim} delivered no record of a shard it lost after SIGCONT: {} did, e.g. {:?}",
            stale.len(),
            &stale[..stale.len().min(5)]
        ),
    );
    checks.check(
        rejoined.is_some(),
        format!("{victim} delivers again after SIGCONT (its share handed back)"),
    );
    checks.finish(&fleet);
}

/// (f) Items written to a table: 32 of them, one round of writes every 200 ms.
const TABLE_ITEMS: u64 = 32;
/// (f) How long the second worker is watched while the first holds the one shard.
const TABLE_IDLE_FOR: Duration = Duration::from_secs(2 * FAILOVER_SECS);

/// (f) The table-stream lines of a run, item by item, against what was written.
#[derive(Debug, Default)]
struct TableVerdict {
    /// Lines with a `change` object.
    changes: usize,
    /// Lines of a change (shard, sequence) already delivered.
    duplicates: u64,
    /// Changes written and never delivered.
    lost: usize,
    /// Items whose changes came in another order than written (after duplicates).
    misordered: Vec<String>,
    /// Lines that are not a change of a written item, or whose `partition_key` is not
    /// the change's key.
    malformed: Vec<String>,
}

/// Reads every delivery's `change` (deliveries sorted by when read), as
/// [`changes::Change`]s per item, and compares them with `model`'s.
fn table_verdict(deliveries: &[fleet::Delivery], model: &changes::Model) -> TableVerdict {
    use flotilla_actors::model::change::{DynamoChange, item_key_text};
    let mut verdict = TableVerdict::default();
    let mut seen = std::collections::HashSet::new();
    let mut got: std::collections::BTreeMap<String, Vec<changes::Change>> = Default::default();
    for d in deliveries {
        let Some(change) = d
            .change
            .clone()
            .and_then(|c| serde_json::from_value::<DynamoChange>(c).ok())
        else {
            verdict.malformed.push(format!("{}: {}", d.worker, d.data));
            continue;
        };
        verdict.changes += 1;
        if !seen.insert(d.identity()) {
            verdict.duplicates += 1;
            continue;
        }
        if d.key != item_key_text(&change.dynamodb.keys)
            || d.sequence != change.dynamodb.sequence_number
        {
            verdict
                .malformed
                .push(format!("{} {}: {change:?}", d.worker, d.key));
            continue;
        }
        got.entry(changes::item_of(&change))
            .or_default()
            .push(changes::change_of(&change));
    }
    for (item, owed) in &model.expected {
        let delivered = got.remove(item).unwrap_or_default();
        let kept: Vec<&changes::Change> = owed.iter().filter(|c| delivered.contains(c)).collect();
        verdict.lost += owed.len() - kept.len();
        let known: Vec<&changes::Change> = delivered.iter().filter(|c| owed.contains(c)).collect();
        if known != kept {
            verdict
                .misordered
                .push(format!("{item}: written {owed:?}, delivered {delivered:?}"));
        }
        if known.len() != delivered.len() {
            verdict
                .malformed
                .push(format!("{item}: delivered {delivered:?}, written {owed:?}"));
        }
    }
    for (item, delivered) in got {
        verdict
            .malformed
            .push(format!("{item}: never written, delivered {delivered:?}"));
    }
    verdict
}

/// (f) A table's change stream: two `flotilla run` processes, SIGTERM to the one
/// holding its only shard while items are written, a handoff without loss or
/// duplicates. In the fan-out pass: `reader.mode = "fanout"` is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_stream_sigterm_hands_the_one_shard_over() {
    const TAG: &str = "table";
    let _serial = SERIAL.lock().await;
    let env = TableEnv::new("fleet-table").await;
    let stream = format!("dynamodb:{}", env.table);
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);
    if read_mode() == "fanout" {
        // DynamoDB Streams have no enhanced fan-out: a worker told to use it must stop
        // at start, saying so, and hold nothing.
        fleet.spawn_on_table(&env, "table-fanout", &stream, "fanout");
        let status = fleet.wait_exit("table-fanout", START_LIMIT).await;
        let log = fleet.log_tail("table-fanout", 20);
        report(
            TAG,
            &format!("reader.mode = fanout on {stream}: {status:?}"),
        );
        checks.check(
            status.is_some_and(|s| !s.success())
                && log.contains("reader.mode = \"polling\"")
                && env.leases().await.open.is_empty(),
            format!(
                "a fan-out worker on a table's stream refuses to start and takes no lease: \
                 {status:?}\n{log}"
            ),
        );
        checks.finish(&fleet);
        return;
    }

    let writer = TableWriter::start(&env, TABLE_ITEMS);
    fleet.spawn_on_table(&env, "table-w1", &stream, "polling");
    let start = Instant::now();
    loop {
        let leases = env.leases().await;
        if leases.held_by("table-w1").len() == 1 && fleet.with_deliveries(|all| !all.is_empty()) {
            report(
                TAG,
                &format!(
                    "table-w1 holds the one shard of {} and delivers after {}",
                    env.arn,
                    ms(start.elapsed())
                ),
            );
            break;
        }
        assert!(
            start.elapsed() < START_LIMIT,
            "table-w1 not delivering within {START_LIMIT:?}: {leases:?}\n{}",
            fleet.diagnostics()
        );
        tokio::time::sleep(TABLE_POLL).await;
    }

    fleet.spawn_on_table(&env, "table-w2", &stream, "polling");
    let joined = Instant::now();
    let mut held_by_w2 = false;
    let mut w2_alive = false;
    while joined.elapsed() < TABLE_IDLE_FOR {
        let leases = env.leases().await;
        held_by_w2 |= !leases.held_by("table-w2").is_empty();
        w2_alive |= leases.heartbeats.contains("table-w2");
        tokio::time::sleep(TABLE_POLL).await;
    }
    let w2_early =
        fleet.with_deliveries(|all| all.iter().filter(|d| &*d.worker == "table-w2").count());
    checks.check(
        w2_alive && !held_by_w2 && w2_early == 0,
        format!(
            "for {TABLE_IDLE_FOR:?} beside table-w1, table-w2 runs (heartbeat: {w2_alive}) \
             and holds nothing (held: {held_by_w2}) and delivers nothing ({w2_early} lines)"
        ),
    );

    let shard = env.leases().await.held_by("table-w1");
    let terminated = fleet.terminate("table-w1");
    let status = fleet.wait_exit("table-w1", SHUTDOWN_EXIT_LIMIT).await;
    report(
        TAG,
        &format!(
            "SIGTERM table-w1 holding {shard:?}: exited after {}: {status:?}",
            ms(terminated.elapsed())
        ),
    );
    checks.check(
        status.is_some_and(|s| s.success()),
        format!(
            "table-w1 exits 0 within {SHUTDOWN_EXIT_LIMIT:?} of SIGTERM: {status:?}\n{}",
            fleet.log_tail("table-w1", 5)
        ),
    );
    wait_for(HANDOFF_GAP_LIMIT + GRACE, STEP, || {
        resume_gaps(&fleet, &shard, terminated, "table-w1")
            .values()
            .all(Option::is_some)
    })
    .await;
    let gaps = resume_gaps(&fleet, &shard, terminated, "table-w1");
    report(
        TAG,
        &format!(
            "gap SIGTERM -> first change on table-w2: {}",
            gaps_text(&gaps)
        ),
    );
    checks.check(
        !shard.is_empty()
            && gaps
                .values()
                .all(|gap| gap.is_some_and(|g| g <= HANDOFF_GAP_LIMIT)),
        format!("the shard resumed on table-w2 within {HANDOFF_GAP_LIMIT:?}"),
    );
    let owners = env.leases().await;
    checks.check(
        owners.held_by("table-w2") == shard,
        format!("table-w2 holds the shard: {owners:?}"),
    );

    // More changes on table-w2 alone, then everything must have arrived.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (model, error) = writer.stop().await;
    let caught_up = wait_for(CATCH_UP_LIMIT, Duration::from_millis(250), || {
        table_verdict(&fleet.deliveries(), &model).lost == 0
    })
    .await;
    let deliveries = fleet.deliveries();
    let verdict = table_verdict(&deliveries, &model);
    let (after_sigterm, examples) = record_duplicates_since(&deliveries, terminated);
    let on = |w: &str| deliveries.iter().filter(|d| &*d.worker == w).count();
    report(
        TAG,
        &format!(
            "written {} changes of {TABLE_ITEMS} items; delivered {} (table-w1 {}, table-w2 {}), \
             duplicates {} ({after_sigterm} after the SIGTERM {examples:?}), lost {}, \
             misordered items {}, malformed {}; caught up {}",
            model.total(),
            verdict.changes,
            on("table-w1"),
            on("table-w2"),
            verdict.duplicates,
            verdict.lost,
            verdict.misordered.len(),
            verdict.malformed.len(),
            caught_up.map_or("never".to_owned(), ms),
        ),
    );
    checks.check(
        error.is_none(),
        format!("the writer wrote throughout: {error:?}"),
    );
    checks.check(
        verdict.lost == 0,
        format!("0 changes lost of {}: {} lost", model.total(), verdict.lost),
    );
    checks.check(
        verdict.duplicates == 0,
        format!(
            "0 changes delivered twice (a handoff, no crash): {}",
            verdict.duplicates
        ),
    );
    checks.check(
        verdict.misordered.is_empty(),
        format!(
            "each item's changes in order: {:?}",
            &verdict.misordered[..verdict.misordered.len().min(3)]
        ),
    );
    let bad = fleet.bad_lines();
    checks.check(
        verdict.malformed.is_empty() && bad.is_empty(),
        format!(
            "only written changes on stdout, each a `change` object keyed by its item: \
             {:?}, other lines {:?}",
            &verdict.malformed[..verdict.malformed.len().min(3)],
            &bad[..bad.len().min(3)]
        ),
    );

    // The last worker: SIGTERM with no one to hand to, a clean exit.
    fleet.terminate("table-w2");
    let status = fleet.wait_exit("table-w2", SHUTDOWN_EXIT_LIMIT).await;
    let released = env.leases().await;
    checks.check(
        status.is_some_and(|s| s.success()) && released.held_by("table-w2").is_empty(),
        format!(
            "table-w2, alone, exits 0 on SIGTERM and releases the shard: {status:?} {released:?}"
        ),
    );
    checks.finish(&fleet);
}

/// The lease table deleted under a running `flotilla run` (`flotilla destroy --force`, a
/// hand): the worker stops at once with an ERROR that names the table and what happened,
/// and exits non-zero, instead of going on fenced or making the table again and starting
/// every shard over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_lease_table_is_deleted_stops_and_says_so() {
    const TAG: &str = "deleted";
    let _serial = SERIAL.lock().await;
    let env = Env::new("fleet-deleted", 2).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);
    fleet.spawn(&env, "deleted-w1");
    wait_steady(&env, &fleet, TAG).await;
    let deleted = Instant::now();
    env.delete_lease_table().await;
    let status = fleet
        .wait_exit("deleted-w1", Duration::from_secs(3 * FAILOVER_SECS))
        .await;
    report(
        TAG,
        &format!(
            "table deleted -> exit {status:?} after {}",
            ms(deleted.elapsed())
        ),
    );
    checks.check(
        status.is_some_and(|s| !s.success()),
        format!("the worker exits non-zero: {status:?}"),
    );
    let log = fleet.log_tail("deleted-w1", 40);
    checks.check(
        log.contains("ERROR") && log.contains("was deleted under this worker"),
        format!("an ERROR says the table was deleted:\n{log}"),
    );
    producer.stop().await;
    checks.finish(&fleet);
}
