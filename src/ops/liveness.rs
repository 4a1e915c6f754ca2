//! Whether the owners of the leases are alive, before a command changes what they use.
//!
//! `rewind` and `position import` rewrite checkpoints, which only works while no worker
//! processes the shards: a live owner keeps its position in memory and writes it over
//! the new one at its next checkpoint (checkpoints do not change the lease counter, so
//! the fence does not stop it); `destroy` deletes the table under them. Before that,
//! the owners of unfinished leases are watched for as long as the workers themselves
//! give a peer ([`watch_window`]: the `lease.failover_time` each declares in its
//! heartbeat row, never less for a smaller `--failover-time`), and judged by the
//! workers' own rule, asked of [`flotilla_actors::balance::Observations`] rather than written again here:
//! each scan is recorded as a lease keeper records its own (with `lease.java_compat`
//! on, since a Java KCL owner may be among them), and an owner is alive if balance,
//! judging at the end of the watch with the window as the failover time, calls it
//! alive. That is: its heartbeat row's counter moved (or the row appeared, or vanished
//! while it still held leases: watched afresh), or, for an owner with no heartbeat row
//! (a Java KCL worker, which renews leases instead), a lease it owns had its counter
//! raised or was taken by it. A worker first seen during the watch is alive. Owners
//! that show no sign of life are dead (crashed workers' names left on their leases).
//! `--force` skips the check.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use anyhow::{Context as _, bail};
use flotilla_actors::backend::{LeaseError, LeaseTable, ScanOutput};
use flotilla_actors::balance::Observations;
use flotilla_actors::model::{LeaseKey, WorkerId};
use tokio::time::Instant;

use super::explain;

/// What a liveness check found against one owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveOwner {
    pub worker: WorkerId,
    /// What showed it alive.
    pub sign: String,
    /// The unfinished leases it holds, as last scanned.
    pub leases: Vec<LeaseKey>,
}

impl fmt::Display for LiveOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&str> = self.leases.iter().map(LeaseKey::as_str).collect();
        write!(f, "{} ({}", self.worker, self.sign)?;
        if !keys.is_empty() {
            write!(f, "; holds {}", keys.join(", "))?;
        }
        f.write_str(")")
    }
}

/// The owners of unfinished leases in `first` that show a sign of life within
/// `failover_time` (see the module docs), and the last scan made. Returns at once when
/// no lease is owned, and as soon as every owner has shown itself alive.
pub async fn live_owners(
    table: &dyn LeaseTable,
    first: ScanOutput,
    failover_time: Duration,
) -> Result<(Vec<LiveOwner>, ScanOutput), LeaseError> {
    let mut pending: BTreeSet<WorkerId> = holdings(&first).into_keys().collect();
    if pending.is_empty() {
        return Ok((Vec::new(), first));
    }
    let given = failover_time;
    let failover_time = watch_window(given, &pending, &first.heartbeats);
    eprintln!(
        "flotilla: checking whether the owners of the leases are alive: {} (up to {}{}; \
         --force skips this)",
        pending
            .iter()
            .map(WorkerId::as_str)
            .collect::<Vec<_>>()
            .join(", "),
        humantime::format_duration(failover_time),
        if failover_time > given {
            format!(
                ", the lease.failover_time the workers declare, not the {} given",
                humantime::format_duration(given)
            )
        } else {
            ", lease.failover_time".to_owned()
        }
    );

    let poll = (failover_time / 5).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let started = tokio::time::Instant::now();
    let mut watch = Watch::new(&first, started, failover_time);
    let deadline = started + failover_time;
    let mut last = first;
    while !pending.is_empty() {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(poll.min(deadline - now)).await;
        last = table.scan().await?;
        watch.see(&last, tokio::time::Instant::now());
        pending.retain(|w| !watch.alive(w));
    }
    Ok((watch.live(&last), last))
}

/// The unfinished leases each worker owns in `scan`, by worker.
fn holdings(scan: &ScanOutput) -> BTreeMap<WorkerId, Vec<LeaseKey>> {
    let mut held: BTreeMap<WorkerId, Vec<LeaseKey>> = BTreeMap::new();
    for lease in &scan.leases {
        if let (Some(owner), false) = (&lease.owner, lease.checkpoint.is_shard_end()) {
            held.entry(owner.clone())
                .or_default()
                .push(lease.key.clone());
        }
    }
    held
}

/// The watch over the owners: the scans recorded in `balance`'s [`Observations`], which
/// alone decides who is alive; what this keeps of the first scan only words the sign
/// of life a live owner gave. Pure: each scan's time is a parameter.
#[derive(Debug)]
struct Watch {
    observations: Observations,
    /// The end of the watch: the instant balance is asked at.
    deadline: Instant,
    /// The failover time balance judges with: the whole watch, so that an owner is
    /// alive at its end only if it showed a sign of life after the first scan.
    window: Duration,
    first_beats: HashMap<WorkerId, u64>,
    first_leases: HashMap<LeaseKey, (Option<WorkerId>, u64)>,
}

impl Watch {
    /// A watch of `window` from the scan `first`, made at `started`.
    fn new(first: &ScanOutput, started: Instant, window: Duration) -> Self {
        let mut watch = Watch {
            // Owners with no heartbeat row are judged by their lease counters, as a
            // Java KCL peer (and a flotilla worker with lease.java_compat) judges them.
            observations: Observations::with_java_compat(true),
            deadline: started + window,
            window,
            first_beats: first
                .heartbeats
                .iter()
                .map(|h| (h.worker.clone(), h.counter))
                .collect(),
            first_leases: first
                .leases
                .iter()
                .map(|l| (l.key.clone(), (l.owner.clone(), l.counter)))
                .collect(),
        };
        watch.see(first, started);
        watch
    }

    /// Records a scan made at `now`, as a worker's lease keeper records its own: the
    /// heartbeats and the leases' owners, then the leases' counters.
    fn see(&mut self, scan: &ScanOutput, now: Instant) {
        self.observations.observe(
            &scan.heartbeats,
            scan.leases.iter().filter_map(|l| l.owner.as_ref()),
            now,
        );
        self.observations.observe_lease_counters(&scan.leases, now);
    }

    /// Whether balance calls `worker` alive at the end of the watch on what has been seen
    /// so far. Once true it stays true: a sign of life is never undone by a later scan.
    fn alive(&self, worker: &WorkerId) -> bool {
        self.observations
            .is_alive(worker, self.deadline, self.window)
    }

    /// The workers holding unfinished leases in `last` that are alive, with what they
    /// hold there.
    fn live(&self, last: &ScanOutput) -> Vec<LiveOwner> {
        holdings(last)
            .into_iter()
            .filter(|(worker, _)| self.alive(worker))
            .map(|(worker, leases)| LiveOwner {
                sign: self.sign(&worker, last),
                worker,
                leases,
            })
            .collect()
    }

    /// What showed `worker` alive, in words, from how `last` differs from the first
    /// scan. Only words: whether it is alive is balance's answer ([`Watch::alive`]).
    fn sign(&self, worker: &WorkerId, last: &ScanOutput) -> String {
        let beat = last.heartbeats.iter().find(|h| &h.worker == worker);
        let first_beat = self.first_beats.get(worker);
        if let Some(beat) = beat
            && first_beat != Some(&beat.counter)
        {
            return format!("heartbeat moved to {}", beat.counter);
        }
        for lease in &last.leases {
            if lease.owner.as_ref() != Some(worker) {
                continue;
            }
            match self.first_leases.get(&lease.key) {
                Some((Some(was), counter)) if was == worker => {
                    if lease.counter != *counter {
                        return format!("renewed lease {}", lease.key);
                    }
                }
                _ => return format!("took lease {}", lease.key),
            }
        }
        if beat.is_none() && first_beat.is_some() {
            return "heartbeat row removed, watched afresh".to_owned();
        }
        "first seen during the check".to_owned()
    }
}

/// How long a command watches for a sign of life an owner that declares no failover
/// time in its heartbeat row (a Java KCL worker, a flotilla before the declarations):
/// the KCL's default `failoverTimeMillis`, and flotilla's `lease.failover_time` before it
/// became 4 s (a flotilla that old declares none).
pub const UNDECLARED_FAILOVER: Duration = Duration::from_secs(10);

/// How long the owners of leases are watched for a sign of life before they count as
/// dead: the longest failover time any of them declares in its heartbeat row (the time
/// its own peers give it before they take its leases), [`UNDECLARED_FAILOVER`] for one
/// that declares none, and `given` (`--failover-time`) only where it is longer. A
/// smaller number on the command line never calls a live worker dead: with `0s` the
/// check used to pass at once, and with `1s` against workers beating every 2 s, two
/// times in three.
pub fn watch_window(
    given: Duration,
    owners: &BTreeSet<WorkerId>,
    heartbeats: &[flotilla_actors::model::Heartbeat],
) -> Duration {
    owners
        .iter()
        .map(|owner| {
            heartbeats
                .iter()
                .find(|h| &h.worker == owner)
                .and_then(|h| h.load.failover_time_ms)
                .map_or(UNDECLARED_FAILOVER, Duration::from_millis)
        })
        .fold(given, Duration::max)
}

/// What `--force` overrides, said before it does: the leases whose owners are not
/// checked for a sign of life.
pub fn forced(scan: &ScanOutput, doing: &str) {
    let owners: BTreeSet<&str> = scan
        .leases
        .iter()
        .filter(|l| !l.checkpoint.is_shard_end())
        .filter_map(|l| l.owner.as_ref().map(WorkerId::as_str))
        .collect();
    if !owners.is_empty() {
        eprintln!(
            "flotilla: --force: {doing} without checking whether the owners of the leases are \
             alive ({}): a live one writes its own checkpoint over this, or fails",
            owners.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}

/// What a refused checkpoint write says to do (`refuse_while_alive`'s `advice`).
pub(super) const WRITE_ADVICE: &str = "Stop them first (a clean stop releases their leases) and run this \
                            again. --force writes anyway: only for workers you know are dead, \
                            as a live one writes its own checkpoint over the new one";

/// The liveness check the commands skip with --force: an error naming the live workers
/// ("refusing to `doing` ..."), then `advice` (how to go on), and the last scan made
/// when there are none.
pub async fn refuse_while_alive(
    table: &dyn LeaseTable,
    scan: ScanOutput,
    failover_time: Duration,
    doing: &str,
    advice: &str,
) -> anyhow::Result<ScanOutput> {
    let (live, scan) = live_owners(table, scan, failover_time)
        .await
        .map_err(|e| explain(e, table.table_name()))
        .with_context(|| format!("cannot read lease table {}", table.table_name()))?;
    if !live.is_empty() {
        let names: Vec<String> = live.iter().map(ToString::to_string).collect();
        bail!(
            "refusing to {doing} while live workers hold leases: {}.\n{advice}",
            names.join(", ")
        );
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_watched_as_long_as_they_declare_never_less() {
        use flotilla_actors::model::{Heartbeat, WorkerLoad};
        let s = Duration::from_secs;
        let beat = |id: &str, failover: Option<u64>| Heartbeat {
            worker: WorkerId::new(id),
            counter: 1,
            load: WorkerLoad {
                failover_time_ms: failover,
                ..WorkerLoad::default()
            },
        };
        let owners = |ids: &[&str]| ids.iter().map(|i| WorkerId::new(*i)).collect();
        let beats = [
            beat("a", Some(4_000)),
            beat("b", Some(30_000)),
            beat("old", None),
        ];
        // (given, owners, window)
        let table: [(Duration, &[&str], Duration); 6] = [
            (s(0), &["a"], s(4)),
            (s(1), &["a"], s(4)),
            (s(60), &["a"], s(60)),
            (s(0), &["a", "b"], s(30)),
            // No declaration (an older flotilla): the default.
            (s(0), &["old"], UNDECLARED_FAILOVER),
            // No heartbeat row at all (a Java KCL worker): the default.
            (Duration::from_millis(600), &["java"], UNDECLARED_FAILOVER),
        ];
        for (given, ids, want) in table {
            assert_eq!(
                watch_window(given, &owners(ids), &beats),
                want,
                "{given:?} {ids:?}"
            );
        }
    }

    /// A scan: `(worker, heartbeat counter)` rows, and `(shard index, owner, lease
    /// counter)` leases (all unfinished).
    fn scan(beats: &[(&str, u64)], leases: &[(u64, Option<&str>, u64)]) -> ScanOutput {
        use flotilla_actors::model::{Checkpoint, Heartbeat, Lease, ShardId};
        ScanOutput {
            heartbeats: beats
                .iter()
                .map(|(w, c)| Heartbeat {
                    worker: WorkerId::new(*w),
                    counter: *c,
                    load: Default::default(),
                })
                .collect(),
            leases: leases
                .iter()
                .map(|(i, owner, counter)| {
                    let mut lease = Lease::new(
                        &ShardId::from_index(*i),
                        Checkpoint::TrimHorizon,
                        vec![],
                        None,
                    );
                    lease.owner = owner.map(WorkerId::new);
                    lease.counter = *counter;
                    lease
                })
                .collect(),
            ..ScanOutput::default()
        }
    }

    /// Who the watch calls alive after the scans (the first at 0 s, one a second after),
    /// and why, against a table of what each owner did. The verdict is balance's
    /// (`Observations::is_alive` at the end of the watch), so ops and the workers cannot
    /// disagree; this pins how ops asks it. The last row is where the rule ops had of
    /// its own said otherwise: a flotilla worker (it has a heartbeat row) whose
    /// heartbeat stands still is dead to its peers whatever its leases' counters do.
    #[test]
    fn the_owners_alive_are_those_balance_calls_alive_at_the_end_of_the_watch() {
        type Scan = (
            &'static [(&'static str, u64)],
            &'static [(u64, Option<&'static str>, u64)],
        );
        /// What happened, the scans, and the live owners with their sign.
        type Case = (
            &'static str,
            &'static [Scan],
            &'static [(&'static str, &'static str)],
        );
        let table: &[Case] = &[
            (
                "heartbeat moves",
                &[
                    (&[("a", 1)], &[(0, Some("a"), 1)]),
                    (&[("a", 2)], &[(0, Some("a"), 1)]),
                ],
                &[("a", "heartbeat moved to 2")],
            ),
            (
                "heartbeat stands still: dead",
                &[
                    (&[("a", 1)], &[(0, Some("a"), 1)]),
                    (&[("a", 1)], &[(0, Some("a"), 1)]),
                ],
                &[],
            ),
            (
                "a Java KCL owner (no heartbeat row) renews its lease",
                &[(&[], &[(0, Some("j"), 4)]), (&[], &[(0, Some("j"), 5)])],
                &[("j", "renewed lease shardId-000000000000")],
            ),
            (
                "a Java KCL owner renews nothing: dead",
                &[(&[], &[(0, Some("j"), 4)]), (&[], &[(0, Some("j"), 4)])],
                &[],
            ),
            (
                "a worker first seen takes a dead owner's lease",
                &[
                    (&[("a", 1)], &[(0, Some("a"), 1)]),
                    (&[("a", 1)], &[(0, Some("n"), 2)]),
                ],
                &[("n", "took lease shardId-000000000000")],
            ),
            (
                "a worker that stopped cleanly holds nothing",
                &[(&[("a", 1)], &[(0, Some("a"), 1)]), (&[], &[(0, None, 1)])],
                &[],
            ),
            (
                "a heartbeat row removed under leases still held: watched afresh",
                &[
                    (&[("a", 1)], &[(0, Some("a"), 1)]),
                    (&[], &[(0, Some("a"), 1)]),
                ],
                &[("a", "heartbeat row removed, watched afresh")],
            ),
            (
                "a flotilla worker's lease counter moves, its heartbeat does not: dead",
                &[
                    (&[("a", 1)], &[(0, Some("a"), 1)]),
                    (&[("a", 1)], &[(0, Some("a"), 2)]),
                ],
                &[],
            ),
        ];
        let window = Duration::from_secs(10);
        let t0 = Instant::now();
        for (case, scans, want) in table {
            let scans: Vec<ScanOutput> = scans.iter().map(|(b, l)| scan(b, l)).collect();
            let mut watch = Watch::new(&scans[0], t0, window);
            // The workers' own rule, fed as a lease keeper feeds it, asked at the end.
            let mut keeper = Observations::with_java_compat(true);
            for (i, scan) in scans.iter().enumerate() {
                let at = t0 + Duration::from_secs(i as u64);
                if i > 0 {
                    watch.see(scan, at);
                }
                keeper.observe(
                    &scan.heartbeats,
                    scan.leases.iter().filter_map(|l| l.owner.as_ref()),
                    at,
                );
                keeper.observe_lease_counters(&scan.leases, at);
            }
            let last = scans.last().unwrap();
            let live = watch.live(last);
            let got: Vec<(&str, &str)> = live
                .iter()
                .map(|l| (l.worker.as_str(), l.sign.as_str()))
                .collect();
            assert_eq!(got, *want, "{case}");
            for worker in holdings(last).keys() {
                assert_eq!(
                    watch.alive(worker),
                    keeper.is_alive(worker, t0 + window, window),
                    "{case}: {worker}"
                );
            }
        }
    }
}
