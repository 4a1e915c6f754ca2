//! Which leases to take, and which held leases are lost: a pure function of a lease-table
//! scan, what this worker has seen of other workers' heartbeats, and the time.
//!
//! Liveness is judged on the observer's own monotonic clock: a worker is dead when its
//! heartbeat counter has not moved for `failover_time` since this worker first saw that
//! value. No clock synchronisation between workers is needed.
//!
//! This is the single-worker rule set (take what is unowned or whose owner is dead, up to
//! `max_leases`); fair shares and stealing build on the same inputs.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Fence, Heartbeat, Lease, LeaseKey, WorkerId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    counter: Option<u64>,
    since: Instant,
}

/// Heartbeat counters as this worker observed them, with when each last changed.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    seen: HashMap<WorkerId, Seen>,
}

impl Observations {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a scan: each heartbeat, and each lease owner (an owner with no heartbeat
    /// row — a crashed worker that never wrote one, or a Java KCL worker — is watched from
    /// the first time it is seen).
    pub fn observe<'a>(
        &mut self,
        heartbeats: &[Heartbeat],
        owners: impl IntoIterator<Item = &'a WorkerId>,
        now: Instant,
    ) {
        let mut present: HashSet<&WorkerId> = HashSet::new();
        for heartbeat in heartbeats {
            present.insert(&heartbeat.worker);
            let seen = self.seen.entry(heartbeat.worker.clone()).or_insert(Seen {
                counter: Some(heartbeat.counter),
                since: now,
            });
            if seen.counter != Some(heartbeat.counter) {
                *seen = Seen {
                    counter: Some(heartbeat.counter),
                    since: now,
                };
            }
        }
        let mut owners_seen: HashSet<WorkerId> = HashSet::new();
        for owner in owners {
            owners_seen.insert(owner.clone());
            if present.contains(owner) {
                continue;
            }
            let seen = self.seen.entry(owner.clone()).or_insert(Seen {
                counter: None,
                since: now,
            });
            if seen.counter.is_some() {
                // Its heartbeat row vanished: watch it afresh.
                *seen = Seen {
                    counter: None,
                    since: now,
                };
            }
        }
        self.seen
            .retain(|worker, _| present.contains(worker) || owners_seen.contains(worker));
    }

    /// Whether `worker` has shown a sign of life within `failover_time` of `now`.
    pub fn is_alive(&self, worker: &WorkerId, now: Instant, failover_time: Duration) -> bool {
        match self.seen.get(worker) {
            Some(seen) => now.saturating_duration_since(seen.since) < failover_time,
            None => true,
        }
    }

    /// Workers currently judged alive (for status and for fair shares).
    pub fn alive(&self, now: Instant, failover_time: Duration) -> Vec<WorkerId> {
        let mut alive: Vec<WorkerId> = self
            .seen
            .iter()
            .filter(|(_, s)| {
                s.counter.is_some() && now.saturating_duration_since(s.since) < failover_time
            })
            .map(|(w, _)| w.clone())
            .collect();
        alive.sort();
        alive
    }
}

/// What the lease keeper should do after a scan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Leases to take, each with the fence the take must match.
    pub take: Vec<(LeaseKey, Fence)>,
    /// Held leases that now belong to someone else (or were deleted).
    pub lost: Vec<LeaseKey>,
}

/// The inputs of [`decide`] that are settings rather than observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub failover_time: Duration,
    /// 0 means no limit.
    pub max_leases: usize,
}

pub fn decide(
    leases: &[Lease],
    held: &HashMap<LeaseKey, Fence>,
    observations: &Observations,
    me: &WorkerId,
    now: Instant,
    limits: &Limits,
    cooling: &HashSet<LeaseKey>,
) -> Decision {
    let mut decision = Decision::default();
    let by_key: HashMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
    for (key, fence) in held {
        match by_key.get(key) {
            Some(lease) if lease.fence() == *fence => {}
            _ => decision.lost.push(key.clone()),
        }
    }
    decision.lost.sort();
    let still_held = held.len() - decision.lost.len();
    let mut candidates: Vec<&Lease> = leases
        .iter()
        .filter(|l| !l.checkpoint.is_shard_end())
        .filter(|l| !held.contains_key(&l.key) && !cooling.contains(&l.key))
        .filter(|l| match &l.owner {
            None => true,
            // Ours by name but not held: a previous life of this worker id.
            Some(owner) if owner == me => true,
            Some(owner) => !observations.is_alive(owner, now, limits.failover_time),
        })
        .collect();
    // Parents before children (fewer parents first, then by key) so a child is never
    // taken while its parent is left for later.
    candidates.sort_by(|a, b| {
        a.parent_shard_ids
            .len()
            .cmp(&b.parent_shard_ids.len())
            .then_with(|| a.key.cmp(&b.key))
    });
    let room = match limits.max_leases {
        0 => usize::MAX,
        max => max.saturating_sub(still_held),
    };
    decision.take = candidates
        .into_iter()
        .take(room)
        .map(|lease| (lease.key.clone(), lease.fence()))
        .collect();
    decision
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, ShardId};

    fn lease(shard: u64, owner: Option<&str>, counter: u64) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(shard),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.owner = owner.map(WorkerId::new);
        lease.counter = counter;
        lease
    }

    fn hb(worker: &str, counter: u64) -> Heartbeat {
        Heartbeat {
            worker: WorkerId::new(worker),
            counter,
        }
    }

    const FAILOVER: Duration = Duration::from_secs(10);

    fn limits(max: usize) -> Limits {
        Limits {
            failover_time: FAILOVER,
            max_leases: max,
        }
    }

    #[test]
    fn a_worker_is_dead_only_after_its_counter_stands_still_for_the_failover_time() {
        let t0 = Instant::now();
        let b = WorkerId::new("b");
        let mut obs = Observations::new();
        obs.observe(&[hb("b", 1)], [], t0);
        assert!(obs.is_alive(&b, t0 + Duration::from_secs(9), FAILOVER));
        obs.observe(&[hb("b", 1)], [], t0 + Duration::from_secs(9));
        assert!(!obs.is_alive(&b, t0 + Duration::from_secs(10), FAILOVER));
        // It moved: alive again, from the time the move was seen.
        obs.observe(&[hb("b", 2)], [], t0 + Duration::from_secs(11));
        assert!(obs.is_alive(&b, t0 + Duration::from_secs(20), FAILOVER));
        assert!(!obs.is_alive(&b, t0 + Duration::from_secs(21), FAILOVER));
    }

    #[test]
    fn an_owner_without_a_heartbeat_row_is_watched_from_first_sight() {
        let t0 = Instant::now();
        let java = WorkerId::new("java-worker");
        let mut obs = Observations::new();
        obs.observe(&[], [&java], t0);
        assert!(obs.is_alive(&java, t0 + Duration::from_secs(5), FAILOVER));
        assert!(!obs.is_alive(&java, t0 + FAILOVER, FAILOVER));
    }

    #[test]
    fn table_of_decisions() {
        let t0 = Instant::now();
        let me = WorkerId::new("me");
        let mut obs = Observations::new();
        let leases = vec![
            lease(0, None, 0),          // unowned: take
            lease(1, Some("live"), 3),  // live owner: leave
            lease(2, Some("dead"), 4),  // dead owner: take
            lease(3, Some("me"), 7),    // mine by name, not held: take
            lease(4, Some("me"), 2),    // held: keep
            lease(5, Some("other"), 9), // held by me before, now someone else's: lost
        ];
        obs.observe(
            &[hb("live", 1), hb("dead", 1)],
            leases.iter().filter_map(|l| l.owner.as_ref()),
            t0,
        );
        let later = t0 + FAILOVER;
        obs.observe(
            &[hb("live", 2), hb("dead", 1)],
            leases.iter().filter_map(|l| l.owner.as_ref()),
            later,
        );
        let mut held = HashMap::new();
        held.insert(leases[4].key.clone(), leases[4].fence());
        held.insert(
            leases[5].key.clone(),
            Fence {
                owner: Some(me.clone()),
                counter: 8,
            },
        );
        let d = decide(
            &leases,
            &held,
            &obs,
            &me,
            later,
            &limits(0),
            &HashSet::new(),
        );
        let taken: Vec<&LeaseKey> = d.take.iter().map(|(k, _)| k).collect();
        assert_eq!(taken, vec![&leases[0].key, &leases[2].key, &leases[3].key]);
        assert_eq!(d.take[1].1, leases[2].fence());
        assert_eq!(d.lost, vec![leases[5].key.clone()]);
    }

    #[test]
    fn finished_cooling_and_limited_leases_are_not_taken() {
        let t0 = Instant::now();
        let me = WorkerId::new("me");
        let mut done = lease(0, None, 0);
        done.checkpoint = Checkpoint::ShardEnd;
        let leases = vec![
            done,
            lease(1, None, 0),
            lease(2, None, 0),
            lease(3, None, 0),
        ];
        let obs = Observations::new();
        let cooling: HashSet<LeaseKey> = [leases[1].key.clone()].into();
        let d = decide(
            &leases,
            &HashMap::new(),
            &obs,
            &me,
            t0,
            &limits(1),
            &cooling,
        );
        assert_eq!(d.take.len(), 1);
        assert_eq!(d.take[0].0, leases[2].key);
    }

    #[test]
    fn a_deleted_lease_row_is_lost() {
        let me = WorkerId::new("me");
        let gone = lease(9, Some("me"), 1);
        let held: HashMap<LeaseKey, Fence> = [(gone.key.clone(), gone.fence())].into();
        let d = decide(
            &[],
            &held,
            &Observations::new(),
            &me,
            Instant::now(),
            &limits(0),
            &HashSet::new(),
        );
        assert_eq!(d.lost, vec![gone.key]);
    }

    #[test]
    fn parents_are_taken_before_children() {
        let me = WorkerId::new("me");
        let mut child = lease(5, None, 0);
        child.parent_shard_ids = vec![ShardId::from_index(1)];
        let parent = lease(1, None, 0);
        let d = decide(
            &[child.clone(), parent.clone()],
            &HashMap::new(),
            &Observations::new(),
            &me,
            Instant::now(),
            &limits(1),
            &HashSet::new(),
        );
        assert_eq!(d.take, vec![(parent.key.clone(), parent.fence())]);
    }
}
