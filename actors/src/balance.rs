//! Which leases a worker takes, asks for, hands over and has lost: a pure function of a
//! lease-table scan, what this worker has seen of the others' heartbeats, and the time.
//!
//! Liveness is judged on the observer's own monotonic clock: a worker is dead when its
//! heartbeat counter has not moved for `failover_time` since this worker first saw that
//! value. No clock synchronisation between workers is needed.
//!
//! Balance is a plan every worker computes alike from the same scan, so the fleet
//! agrees on who takes what without talking: the processable leases (not finished,
//! parents finished) are shared out as `floor` or `ceil` of leases / live workers, the
//! extra ones going to the workers that already hold the most (fewest moves). Leases
//! with no live owner are dealt out first, round-robin over the workers below their
//! share; then the leases of draining workers; then the surplus of workers above their
//! share. A move goes only from a worker above its share to one below it, which holds
//! two more than the other at least: every move lowers the sum of squared loads, so the
//! fleet settles and nothing goes back and forth.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Fence, Heartbeat, Lease, LeaseKey, WorkerId, WorkerLoad};
use crate::settings::{BalanceMode, LeaseSettings};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    counter: Option<u64>,
    since: Instant,
    load: WorkerLoad,
}

/// Heartbeat counters as this worker observed them, with when each last changed.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    seen: BTreeMap<WorkerId, Seen>,
    /// Leases with no live owner, since when this worker has seen them so.
    free_since: BTreeMap<LeaseKey, Instant>,
    /// `lease.java_compat`: the counter of each lease whose owner has no heartbeat row (a
    /// Java KCL worker), with when this worker saw it change. Empty while off.
    lease_counters: BTreeMap<LeaseKey, CounterSeen>,
    java_compat: bool,
}

/// A lease counter as this worker last saw it, and when it saw it change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CounterSeen {
    owner: WorkerId,
    counter: u64,
    since: Instant,
}

/// One worker as this worker sees it, for status pages.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Peer {
    /// The worker, as its heartbeat row or a lease's `leaseOwner` names it.
    pub worker: WorkerId,
    /// Its last sign of life is within the failover time, on this worker's clock.
    pub alive: bool,
    /// False for an owner that never wrote a heartbeat row (a crashed worker's leftover
    /// name, or a Java KCL worker).
    pub has_heartbeat: bool,
    /// What its last heartbeat reported (the default for an owner without a row).
    pub load: WorkerLoad,
    /// How long its heartbeat counter has stood still, on this worker's clock.
    pub silent_ms: u64,
}

impl Observations {
    /// Nothing observed yet, `lease.java_compat` off (see
    /// [`Observations::with_java_compat`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Observations that judge owners with no heartbeat row by their lease counters, as
    /// the Java KCL judges every owner (`lease.java_compat`).
    pub fn with_java_compat(java_compat: bool) -> Self {
        Self {
            java_compat,
            ..Self::default()
        }
    }

    /// `lease.java_compat`: records the counters a scan shows on leases whose owner has
    /// no heartbeat row (after [`Observations::observe`] of the same scan). Such an
    /// owner is alive while one of its leases' counters moves, and each such lease is
    /// live while its own counter moved within `failover_time` (see
    /// [`Observations::lease_owner_alive`]). This is the Java KCL's rule
    /// (`DynamoDBLeaseTaker.updateAllLeases`: a lease's `lastCounterIncrementNanos` is
    /// the local time a scan first saw its current `leaseCounter`; `isExpired` once that
    /// is older than `failoverTimeMillis`), timed on this worker's clock, never by
    /// comparing clocks. Off, it does nothing: such owners are dead `failover_time`
    /// after first seen, the cold-cutover behaviour.
    pub fn observe_lease_counters(&mut self, leases: &[Lease], now: Instant) {
        if !self.java_compat {
            return;
        }
        let mut present: BTreeSet<&LeaseKey> = BTreeSet::new();
        for lease in leases {
            let Some(owner) = &lease.owner else { continue };
            let Some(seen) = self.seen.get_mut(owner) else {
                continue;
            };
            if seen.counter.is_some() {
                // A flotilla worker: judged by its heartbeat row.
                continue;
            }
            present.insert(&lease.key);
            let moved = match self.lease_counters.get(&lease.key) {
                Some(c) => c.owner != *owner || c.counter != lease.counter,
                None => true,
            };
            if moved {
                self.lease_counters.insert(
                    lease.key.clone(),
                    CounterSeen {
                        owner: owner.clone(),
                        counter: lease.counter,
                        since: now,
                    },
                );
                // A sign of life of the owner itself (first seen counts, as for a
                // heartbeat first seen).
                seen.since = seen.since.max(now);
            }
        }
        self.lease_counters.retain(|key, _| present.contains(key));
    }

    /// Whether the lease's owner is alive for this lease: its owner is alive and, for
    /// an owner judged by lease counters (`lease.java_compat`), this lease's counter
    /// moved within `failover_time` (a Java worker whose renewal of one lease stalls
    /// loses that lease, as it would to a Java peer). False for a lease with no owner.
    pub fn lease_owner_alive(&self, lease: &Lease, now: Instant, failover_time: Duration) -> bool {
        let Some(owner) = &lease.owner else {
            return false;
        };
        if !self.is_alive(owner, now, failover_time) {
            return false;
        }
        match self.lease_counters.get(&lease.key) {
            Some(c) if c.owner == *owner => now.saturating_duration_since(c.since) < failover_time,
            _ => true,
        }
    }

    /// When the lease's owner will count as dead for it (see
    /// [`Observations::lease_owner_alive`]) if nothing moves again.
    pub fn lease_dead_at(&self, lease: &Lease, failover_time: Duration) -> Option<Instant> {
        let owner = lease.owner.as_ref()?;
        match self.lease_counters.get(&lease.key) {
            Some(c) if c.owner == *owner => Some(c.since + failover_time),
            _ => self.dead_at(owner, failover_time),
        }
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
        let mut present: BTreeSet<&WorkerId> = BTreeSet::new();
        for heartbeat in heartbeats {
            present.insert(&heartbeat.worker);
            let seen = self.seen.entry(heartbeat.worker.clone()).or_insert(Seen {
                counter: Some(heartbeat.counter),
                since: now,
                load: heartbeat.load.clone(),
            });
            seen.load = heartbeat.load.clone();
            if seen.counter != Some(heartbeat.counter) {
                seen.counter = Some(heartbeat.counter);
                seen.since = now;
            }
        }
        let mut owners_seen: BTreeSet<WorkerId> = BTreeSet::new();
        for owner in owners {
            owners_seen.insert(owner.clone());
            if present.contains(owner) {
                continue;
            }
            let seen = self.seen.entry(owner.clone()).or_insert(Seen {
                counter: None,
                since: now,
                load: WorkerLoad::default(),
            });
            if seen.counter.is_some() {
                // Its heartbeat row vanished: watch it afresh.
                *seen = Seen {
                    counter: None,
                    since: now,
                    load: WorkerLoad::default(),
                };
            }
        }
        self.seen
            .retain(|worker, _| present.contains(worker) || owners_seen.contains(worker));
    }

    /// Records which leases have no live owner (after [`Observations::observe`] of the
    /// same scan), so that a lease the plan deals to a worker that does not take it (its
    /// `max_leases`, its cooldown) is not left unprocessed: past `failover_time` free,
    /// anyone takes it.
    pub fn observe_leases(&mut self, leases: &[Lease], now: Instant, failover_time: Duration) {
        let mut free: BTreeSet<&LeaseKey> = BTreeSet::new();
        for lease in leases {
            let unowned = !self.lease_owner_alive(lease, now, failover_time);
            if unowned && !lease.checkpoint.is_shard_end() {
                free.insert(&lease.key);
                self.free_since.entry(lease.key.clone()).or_insert(now);
            }
        }
        self.free_since.retain(|key, _| free.contains(key));
    }

    /// Whether the lease has had no live owner for `failover_time` or longer.
    pub fn long_free(&self, key: &LeaseKey, now: Instant, failover_time: Duration) -> bool {
        self.free_since
            .get(key)
            .is_some_and(|since| now.saturating_duration_since(*since) >= failover_time)
    }

    /// The heartbeat counter last seen for `worker` (`None`: none seen, or no row).
    /// A take of its lease once it is dead is conditional on it (`take_expired`).
    pub fn heartbeat_of(&self, worker: &WorkerId) -> Option<u64> {
        self.seen.get(worker).and_then(|seen| seen.counter)
    }

    /// Whether `worker` has shown a sign of life within `failover_time` of `now`.
    /// A worker never seen counts as alive.
    pub fn is_alive(&self, worker: &WorkerId, now: Instant, failover_time: Duration) -> bool {
        match self.seen.get(worker) {
            Some(seen) => now.saturating_duration_since(seen.since) < failover_time,
            None => true,
        }
    }

    /// When `worker` will count as dead if its heartbeat does not move again.
    pub fn dead_at(&self, worker: &WorkerId, failover_time: Duration) -> Option<Instant> {
        self.seen.get(worker).map(|s| s.since + failover_time)
    }

    /// What `worker` last reported in its heartbeat.
    pub fn load_of(&self, worker: &WorkerId) -> Option<&WorkerLoad> {
        self.seen.get(worker).map(|s| &s.load)
    }

    /// Whether `worker`'s last heartbeat said it is shutting down.
    pub fn is_draining(&self, worker: &WorkerId) -> bool {
        self.seen.get(worker).is_some_and(|s| s.load.draining)
    }

    /// Workers with a live heartbeat row (draining ones included).
    pub fn alive(&self, now: Instant, failover_time: Duration) -> Vec<WorkerId> {
        // In worker order (a BTreeMap).
        self.seen
            .iter()
            .filter(|(_, s)| {
                s.counter.is_some() && now.saturating_duration_since(s.since) < failover_time
            })
            .map(|(w, _)| w.clone())
            .collect()
    }

    /// The workers that share the leases: live, not draining; `me` included unless it
    /// drains.
    pub fn members(
        &self,
        me: &WorkerId,
        me_draining: bool,
        now: Instant,
        failover_time: Duration,
    ) -> BTreeSet<WorkerId> {
        let mut members: BTreeSet<WorkerId> = self
            .alive(now, failover_time)
            .into_iter()
            .filter(|w| !self.is_draining(w))
            .collect();
        if me_draining {
            members.remove(me);
        } else {
            members.insert(me.clone());
        }
        members
    }

    /// Every worker seen, for status pages.
    pub fn peers(&self, now: Instant, failover_time: Duration) -> Vec<Peer> {
        // In worker order (a BTreeMap).
        self.seen
            .iter()
            .map(|(worker, seen)| {
                let silent = now.saturating_duration_since(seen.since);
                Peer {
                    worker: worker.clone(),
                    alive: silent < failover_time,
                    has_heartbeat: seen.counter.is_some(),
                    load: seen.load.clone(),
                    silent_ms: silent.as_millis() as u64,
                }
            })
            .collect()
    }
}

/// How a lease came to this worker; logged and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gain {
    /// Never owned before.
    New,
    /// Let go by its last owner (a shutdown, a give-up).
    Released,
    /// Its owner's heartbeat stood still for the failover time.
    Expired,
    /// Its owner handed it over at this worker's request.
    HandedOff,
    /// Already this worker's by name (a previous life of this worker id).
    Resumed,
}

impl Gain {
    /// The name in logs and in [`KeeperStatus::gained`](crate::KeeperStatus::gained).
    pub fn as_str(self) -> &'static str {
        match self {
            Gain::New => "new",
            Gain::Released => "released",
            Gain::Expired => "expired",
            Gain::HandedOff => "handed_off",
            Gain::Resumed => "resumed",
        }
    }
}

/// A lease to take, with the fence the take must match.
#[derive(Debug, Clone, PartialEq)]
pub struct Take {
    /// The lease to take.
    pub key: LeaseKey,
    /// The owner and counter the row must still show for the take to succeed.
    pub fence: Fence,
    /// How the lease comes to this worker, for the log and the counts.
    pub why: Gain,
}

/// What the lease keeper should do after a scan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Leases with no live owner (or ours by name) to take.
    pub take: Vec<Take>,
    /// Leases of live workers to ask for (a steal), each with the fence of the ask.
    pub request: Vec<(LeaseKey, Fence)>,
    /// Held leases a live worker asked for: finish, checkpoint and hand over.
    pub hand_off: Vec<(LeaseKey, Fence, WorkerId)>,
    /// Requests on held leases from workers that are dead or draining: cleared.
    pub turn_down: Vec<(LeaseKey, WorkerId)>,
    /// Held leases that now belong to someone else (or were deleted).
    pub lost: Vec<LeaseKey>,
    /// A draining worker's leases by name that it does not hold (one handed to it just
    /// as it began to drain): released, so nobody waits a failover time for them.
    pub release: Vec<(LeaseKey, Fence)>,
}

/// The inputs of [`decide`] that are settings rather than observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// How long a worker's heartbeat may stand still before it counts as dead
    /// (`lease.failover_time`).
    pub failover_time: Duration,
    /// 0 means no limit.
    pub max_leases: usize,
    /// Requests to live, non-draining workers per round (or half of this worker's
    /// shortfall, if more).
    pub max_moves_per_round: usize,
    /// What the plan evens out: lease counts, or throughput as well.
    pub policy: Policy,
}

impl Limits {
    /// The limits the lease settings ask for: what a worker's keeper decides by, and
    /// what the fault simulator's oracle judges a fleet's balance by.
    pub fn from_settings(settings: &LeaseSettings) -> Limits {
        Limits {
            failover_time: settings.failover_time,
            max_leases: settings.max_leases as usize,
            max_moves_per_round: settings.max_moves_per_round as usize,
            policy: match settings.balance {
                BalanceMode::Count => Policy::Count,
                BalanceMode::Throughput => Policy::Throughput(Spread {
                    threshold: f64::from(settings.balance_threshold_percent) / 100.0,
                    dampening: f64::from(settings.balance_dampening_percent) / 100.0,
                    count_slack: settings.balance_count_slack as usize,
                }),
            },
        }
    }
}

/// What the plan evens out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// Lease counts: everyone at the floor or ceil of leases / workers.
    Count,
    /// Throughput as well, while every member publishes its leases' rates; counts
    /// alone otherwise.
    Throughput(Spread),
}

/// How throughput balance is kept (KCL 3's variance-based assignment, see
/// `throughput_plan`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// A worker more than this fraction above the mean sheds, one more than this
    /// below takes; inside the band nothing moves.
    pub threshold: f64,
    /// The fraction of a worker's distance from the mean that may move per round.
    pub dampening: f64,
    /// How far lease counts may stray from fair shares to even out throughput.
    pub count_slack: usize,
}

impl Spread {
    /// KCL 3's `reBalanceThresholdPercentage` (10) and `dampeningPercentage` (60).
    pub const DEFAULT: Spread = Spread {
        threshold: 0.10,
        dampening: 0.60,
        count_slack: 2,
    };
}

/// One round's view, as this worker has it.
#[derive(Debug, Clone, Copy)]
pub struct Round<'a> {
    /// Every lease row of the scan.
    pub leases: &'a [Lease],
    /// The leases this worker holds, each with the fence it holds it under.
    pub held: &'a BTreeMap<LeaseKey, Fence>,
    /// What this worker has seen of every worker's heartbeat.
    pub observations: &'a Observations,
    /// The worker deciding, whose part of the plan [`decide`] returns.
    pub me: &'a WorkerId,
    /// The time the round is decided at, on this worker's clock.
    pub now: Instant,
    /// Leases this worker gave up on lately; it leaves them to others.
    pub cooling: &'a BTreeSet<LeaseKey>,
    /// Held leases already being handed over.
    pub handing_off: &'a BTreeSet<LeaseKey>,
    /// This worker is shutting down: it takes and asks for nothing.
    pub draining: bool,
}

/// A lease can be processed now: not finished, and every parent finished (or its row
/// gone, which happens only after it finished). Only these count toward fair shares;
/// a child waits unowned until its parents end, then goes to whoever is below share.
pub fn processable(lease: &Lease, by_key: &BTreeMap<&LeaseKey, &Lease>) -> bool {
    !lease.checkpoint.is_shard_end()
        && lease.parent_shard_ids.iter().all(|parent| {
            by_key
                .get(&lease.key.sibling(parent))
                .is_none_or(|p| p.checkpoint.is_shard_end())
        })
}

/// How many processable leases each member should hold: `floor` or `ceil` of the
/// total over the members, the extra ones to those holding the most (then by id).
pub fn targets(loads: &BTreeMap<WorkerId, usize>, total: usize) -> BTreeMap<WorkerId, usize> {
    let n = loads.len();
    if n == 0 {
        return BTreeMap::new();
    }
    let (q, r) = (total / n, total % n);
    let mut order: Vec<(&WorkerId, usize)> = loads.iter().map(|(w, l)| (w, *l)).collect();
    order.sort_by_key(|(w, l)| (Reverse(*l), (*w).clone()));
    order
        .into_iter()
        .enumerate()
        .map(|(i, (w, _))| (w.clone(), q + usize::from(i < r)))
        .collect()
}

/// This worker's part of the plan for one round: the leases it has lost, takes, asks for,
/// hands over, turns down and releases. Every worker computes the plan alike from the
/// same scan (see the module's docs).
pub fn decide(round: &Round<'_>, limits: &Limits) -> Decision {
    let Round {
        leases,
        held,
        observations: obs,
        me,
        now,
        cooling,
        handing_off,
        draining,
    } = *round;
    let failover = limits.failover_time;
    let mut decision = Decision::default();
    let by_key: BTreeMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
    for (key, fence) in held {
        match by_key.get(key) {
            Some(lease) if lease.fence() == *fence => {}
            _ => decision.lost.push(key.clone()),
        }
    }
    decision.lost.sort();
    let members = obs.members(me, draining, now, failover);

    // Requests on leases this worker holds.
    let mut asked: Vec<&Lease> = held
        .keys()
        .filter_map(|k| by_key.get(k).copied())
        .filter(|l| Some(&l.fence()) == held.get(&l.key))
        .filter(|l| l.handoff_to.is_some() && !handing_off.contains(&l.key))
        .collect();
    asked.sort_by(|a, b| a.key.cmp(&b.key));
    for lease in asked {
        let Some(to) = &lease.handoff_to else {
            continue;
        };
        if to != me && members.contains(to) {
            decision
                .hand_off
                .push((lease.key.clone(), lease.fence(), to.clone()));
        } else {
            decision.turn_down.push((lease.key.clone(), to.clone()));
        }
    }
    if draining {
        decision.release = leases
            .iter()
            .filter(|l| l.owner.as_ref() == Some(me) && !held.contains_key(&l.key))
            .filter(|l| !l.checkpoint.is_shard_end())
            .map(|l| (l.key.clone(), l.fence()))
            .collect();
        return decision;
    }

    // Who holds what, among the processable leases.
    let mut loads: BTreeMap<WorkerId, Vec<&Lease>> =
        members.iter().map(|w| (w.clone(), Vec::new())).collect();
    let mut free: Vec<&Lease> = Vec::new();
    let mut from_draining: Vec<&Lease> = Vec::new();
    for lease in leases.iter().filter(|l| processable(l, &by_key)) {
        match &lease.owner {
            None => free.push(lease),
            Some(owner) => {
                if let Some(held_by) = loads.get_mut(owner) {
                    held_by.push(lease);
                } else if !obs.lease_owner_alive(lease, now, failover) {
                    free.push(lease);
                } else if obs.is_draining(owner) {
                    from_draining.push(lease);
                }
                // Otherwise alive but not a member: an owner seen without a heartbeat
                // row, within its grace. Left alone until it proves dead.
            }
        }
    }
    // Parents before children, then by key, so every worker deals in the same order.
    free.sort_by(|a, b| {
        (a.parent_shard_ids.len(), &a.key).cmp(&(b.parent_shard_ids.len(), &b.key))
    });
    from_draining.sort_by(|a, b| a.key.cmp(&b.key));
    let counts: BTreeMap<WorkerId, usize> =
        loads.iter().map(|(w, l)| (w.clone(), l.len())).collect();
    let total = counts.values().sum::<usize>() + free.len() + from_draining.len();
    let target = targets(&counts, total);
    // Throughput balance needs every member's rates; one member without (an older
    // flotilla, a count-only worker) would undo its moves by counts, so all keep to
    // counts then.
    let spread = match limits.policy {
        Policy::Count => None,
        Policy::Throughput(spread) => members
            .iter()
            .all(|w| obs.load_of(w).is_some_and(|l| l.lease_rates.is_some()))
            .then_some(spread),
    };
    // Under throughput balance, counts are evened only once one strays past the slack
    // (a join, a leave, new leases): within it, a worker below its share gets free
    // leases but takes none from live workers by count.
    let band = spread.map(|s| {
        let n = counts.len().max(1);
        let (q, r) = (total / n, total % n);
        (
            q.saturating_sub(s.count_slack),
            q + usize::from(r > 0) + s.count_slack,
        )
    });
    let counts_stray = band.is_none_or(|(lo, hi)| counts.values().any(|&c| c < lo || c > hi));

    let mut need: BTreeMap<&WorkerId, usize> = BTreeMap::new();
    let mut surplus: Vec<&Lease> = Vec::new();
    for (worker, held_by) in &loads {
        let want = target.get(worker).copied().unwrap_or(0);
        if held_by.len() < want {
            need.insert(worker, want - held_by.len());
        } else if held_by.len() > want && counts_stray {
            // The ones already asked for go first, then the highest keys: the same
            // choice every round while nothing changes.
            let mut mine = held_by.clone();
            mine.sort_by(|a, b| {
                (a.handoff_to.is_none(), Reverse(&a.key))
                    .cmp(&(b.handoff_to.is_none(), Reverse(&b.key)))
            });
            surplus.extend(mine.into_iter().take(held_by.len() - want));
        }
    }

    let mut plan: Vec<(&Lease, &WorkerId)> = Vec::new();
    // A request already made is kept to, if its maker still needs leases.
    let mut rest: Vec<&Lease> = Vec::new();
    for lease in free.iter().chain(&from_draining).chain(&surplus).copied() {
        let asker = lease
            .handoff_to
            .as_ref()
            .and_then(|w| need.get_key_value(w).map(|(k, n)| (*k, *n)));
        match asker {
            Some((asker, n)) if n > 0 && lease.owner.is_some() => {
                plan.push((lease, asker));
                need.insert(asker, n - 1);
            }
            _ => rest.push(lease),
        }
    }
    // Round-robin over the workers below their share, neediest first.
    let mut order: Vec<&WorkerId> = need.keys().copied().collect();
    order.sort_by_key(|w| (Reverse(need.get(w).copied().unwrap_or(0)), *w));
    let mut turn = 0;
    for lease in rest {
        if order.is_empty() {
            break;
        }
        let start = turn;
        loop {
            let w = order[turn % order.len()];
            turn += 1;
            if let Some(n) = need.get_mut(w)
                && *n > 0
            {
                *n -= 1;
                plan.push((lease, w));
                break;
            }
            if turn - start >= order.len() {
                break;
            }
        }
    }

    // Counts settled: throughput, if every lease's rate is known.
    if let (Some(spread), Some((lo, hi))) = (spread, band)
        && plan.is_empty()
        && free.is_empty()
        && from_draining.is_empty()
    {
        let members_load = |w: &WorkerId| obs.load_of(w).and_then(|l| l.lease_rates.as_ref());
        let mut rated: BTreeMap<WorkerId, Vec<Rated<'_>>> = BTreeMap::new();
        let mut known = true;
        for (worker, held_by) in &loads {
            for &lease in held_by {
                let rate = members_load(worker).and_then(|rates| rates.get(&lease.key));
                let Some(rate) = rate else {
                    known = false;
                    break;
                };
                // A request already made counts as done (and its lease stays put), so a
                // plan does not move more than it means to while handoffs are under way.
                let (at, pending) = match &lease.handoff_to {
                    Some(to) if to != worker && loads.contains_key(to) => (to.clone(), true),
                    _ => (worker.clone(), false),
                };
                rated.entry(at).or_default().push(Rated {
                    lease,
                    rate: rate.bytes_per_second as f64,
                    pending,
                });
            }
        }
        if known {
            for worker in loads.keys() {
                rated.entry(worker.clone()).or_default();
            }
            for (lease, to) in throughput_plan(rated, &spread, lo, hi) {
                if let Some((taker, _)) = loads.get_key_value(&to) {
                    plan.push((lease, taker));
                }
            }
        }
    }

    // This worker's part of the plan.
    let asked_already = leases
        .iter()
        .filter(|l| l.handoff_to.as_ref() == Some(me) && l.owner.as_ref() != Some(me))
        .count();
    let room = match limits.max_leases {
        0 => usize::MAX,
        max => max.saturating_sub(held.len() - decision.lost.len() + asked_already),
    };
    let mut moves = 0;
    // A worker that joins a large fleet asks for its whole shortfall at once when its
    // scan agrees with what every peer last reported holding: then the plan's donors are
    // the ones above their share by what this scan says, and each gives only its surplus
    // (it stays at its share; `room` keeps `max_leases`). A scan out of step with the
    // heartbeats (rows changed since it was read) may overstate a donor's surplus: then
    // at least half the shortfall per round, so that a stale view cannot overshoot by
    // much. Either way at least the setting's `max_moves_per_round`.
    let shortfall = target
        .get(me)
        .copied()
        .unwrap_or(0)
        .saturating_sub(counts.get(me).copied().unwrap_or(0));
    let agrees = || {
        let mut owned: BTreeMap<&WorkerId, u64> = BTreeMap::new();
        for owner in leases.iter().filter_map(|l| l.owner.as_ref()) {
            *owned.entry(owner).or_default() += 1;
        }
        members.iter().filter(|w| *w != me).all(|w| {
            obs.load_of(w)
                .is_some_and(|load| load.leases == owned.get(w).copied().unwrap_or(0))
        })
    };
    let move_cap = if shortfall <= limits.max_moves_per_round {
        limits.max_moves_per_round
    } else if agrees() {
        shortfall
    } else {
        shortfall.div_ceil(2).max(limits.max_moves_per_round)
    };
    let mut mine: Vec<&Lease> = plan
        .iter()
        .filter(|(_, w)| *w == me)
        .map(|(l, _)| *l)
        .collect();
    // Dealt to a worker that has not taken it for a failover time: anyone's.
    mine.extend(
        free.iter()
            .filter(|l| obs.long_free(&l.key, now, failover))
            .filter(|l| !plan.iter().any(|(p, w)| p.key == l.key && *w == me))
            .copied(),
    );
    // Ours by name but not held: a previous life of this worker id, or a lease just
    // handed to it.
    mine.extend(
        loads
            .get(me)
            .into_iter()
            .flatten()
            .filter(|l| !held.contains_key(&l.key))
            .copied(),
    );
    for lease in mine {
        // Requests count against the room as takes do: a lease handed over is taken.
        if cooling.contains(&lease.key) || decision.take.len() + decision.request.len() >= room {
            continue;
        }
        let owner_alive = lease
            .owner
            .as_ref()
            .is_some_and(|o| o != me && obs.lease_owner_alive(lease, now, failover));
        if !owner_alive {
            let why = match &lease.owner {
                None if lease.counter == 0 => Gain::New,
                None => Gain::Released,
                Some(o) if o == me => Gain::Resumed,
                Some(_) => Gain::Expired,
            };
            decision.take.push(Take {
                key: lease.key.clone(),
                fence: lease.fence(),
                why,
            });
            continue;
        }
        let owner_draining = lease.owner.as_ref().is_some_and(|o| obs.is_draining(o));
        if !owner_draining {
            if moves >= move_cap {
                continue;
            }
            moves += 1;
        }
        if lease.handoff_to.as_ref() != Some(me) {
            decision.request.push((lease.key.clone(), lease.fence()));
        }
    }
    decision
}

/// A lease in the throughput plan, with its owner's measured bytes/s.
#[derive(Debug, Clone, Copy)]
struct Rated<'a> {
    lease: &'a Lease,
    rate: f64,
    /// Asked for already (counted at its asker): not moved again.
    pending: bool,
}

/// Moves that even out throughput, as `(lease, taker)`, for leases of live members
/// whose rates are all known, in the manner of KCL 3's variance-based assignment
/// (`VarianceBasedLeaseAssignmentDecider`):
///
/// * a worker more than `threshold` above the mean throughput sheds, one more than
///   `threshold` below it takes; inside the band nothing moves (noise does not move
///   shards);
/// * at most `dampening` of a worker's distance from the mean moves per round (but its
///   first move may take it past the mean, to where a taker may land, when its leases
///   are too coarse for the damped amount);
/// * no side of a move ends more than three quarters of the threshold past the mean:
///   a taker does not become a shedder (nothing comes back), and a hot lease bigger
///   than the gap it would fix does not move at all;
/// * a move shifts a tenth of the band at least, and a swap gains half the threshold
///   of the two rates it moves, so noise in the rates cannot make it worth undoing;
/// * counts stay within `[lo, hi]`: where a single move would leave them, the taker
///   gives back its coldest lease that keeps the move worth making (a swap: two
///   requests, one by each side, so the protocol stays "the taker asks").
///
/// Every move lowers the sum of squared throughputs (it goes from a worker above the
/// mean to one below, and less than the gap between them), so with steady rates the
/// plan empties. Pure and
/// deterministic: every worker computes the same plan from the same scan.
fn throughput_plan<'a>(
    mut at: BTreeMap<WorkerId, Vec<Rated<'a>>>,
    spread: &Spread,
    lo: usize,
    hi: usize,
) -> Vec<(&'a Lease, WorkerId)> {
    let n = at.len();
    if n < 2 {
        return Vec::new();
    }
    let mut t: BTreeMap<WorkerId, f64> = at
        .iter()
        .map(|(w, l)| (w.clone(), l.iter().map(|l| l.rate).sum::<f64>()))
        .collect();
    let mean = t.values().sum::<f64>() / n as f64;
    if mean <= 0.0 {
        // Nothing flows (an idle fleet): throughput tells the workers apart not at all.
        return even_counts(&at, &t, (0.0, 0.0));
    }
    let (high, low) = (
        mean * (1.0 + spread.threshold),
        mean * (1.0 - spread.threshold),
    );
    // Where the other side of a move may land, at most: inside the band with a quarter
    // of it to spare, so that noise does not make it a driver the other way.
    let (cap, floor) = (
        mean * (1.0 + LANDING * spread.threshold),
        mean * (1.0 - LANDING * spread.threshold),
    );
    // What each worker outside the band may still move this round.
    let mut budget: BTreeMap<WorkerId, f64> = t
        .iter()
        .filter(|(_, x)| **x > high || **x < low)
        .map(|(w, x)| (w.clone(), spread.dampening * (x - mean).abs()))
        .collect();
    let mut plan: Vec<(&'a Lease, WorkerId)> = Vec::new();
    let mut moved_yet: BTreeSet<WorkerId> = BTreeSet::new();
    let lines = Lines {
        mean,
        cap,
        floor,
        margin: spread.threshold / 2.0,
        least: spread.threshold * mean / 10.0,
    };
    while let Some(found) = next_move(&at, &t, &budget, &moved_yet, &lines, (lo, hi)) {
        let Move {
            from,
            to,
            lease,
            back,
        } = found;
        let moved = lease.rate - back.map_or(0.0, |b| b.rate);
        for (worker, delta) in [(&from, -moved), (&to, moved)] {
            if let Some(x) = t.get_mut(worker) {
                *x += delta;
            }
        }
        for worker in [&from, &to] {
            if let Some(b) = budget.get_mut(worker) {
                *b -= moved;
            }
            moved_yet.insert(worker.clone());
        }
        let mut shift = |item: Rated<'a>, src: &WorkerId, dst: &WorkerId| {
            if let Some(list) = at.get_mut(src) {
                list.retain(|l| l.lease.key != item.lease.key);
            }
            if let Some(list) = at.get_mut(dst) {
                list.push(Rated {
                    pending: true,
                    ..item
                });
            }
            plan.push((item.lease, dst.clone()));
        };
        shift(lease, &from, &to);
        if let Some(back) = back {
            shift(back, &to, &from);
        }
    }
    if plan.is_empty() {
        return even_counts(&at, &t, (floor, cap));
    }
    plan
}

/// With no throughput move to make, moves that even lease counts out: from a worker above
/// its count target ([`targets`] of the counts after the requests already made) to one
/// below it, each the lease that leaves the two throughputs nearest the mean among those
/// that either take neither side further outside `[floor, cap]` (the band, less the
/// quarter a taker keeps spare) or leave the further of the two from the mean no
/// further than it was (a coarse fleet, a hot lease more than the band, still evens
/// counts where the spread stays; no allowance for noise: one let a count move undo a
/// throughput move, back and forth, in the property tests). Where throughput
/// does not tell the workers
/// apart (an idle fleet, or every worker inside the band) counts end even, as under
/// count balance; KCL 3 falls back the same way (a worker with no throughput gives up
/// leases by count).
///
/// Why this neither undoes throughput moves nor goes back and forth: it runs only when
/// the throughput plan is empty; a move either keeps every worker inside the band (one
/// already outside only comes nearer), so it makes no throughput driver, or leaves the
/// pair's spread where it was; and every move goes from a worker
/// above its target to one below it, two or more leases apart, so Σ count² falls and
/// the moves run out.
fn even_counts<'a>(
    at: &BTreeMap<WorkerId, Vec<Rated<'a>>>,
    t: &BTreeMap<WorkerId, f64>,
    (floor, cap): (f64, f64),
) -> Vec<(&'a Lease, WorkerId)> {
    let mut counts: BTreeMap<WorkerId, usize> =
        at.iter().map(|(w, l)| (w.clone(), l.len())).collect();
    let target = targets(&counts, counts.values().sum());
    let mut t = t.clone();
    let mut moved: BTreeSet<&LeaseKey> = BTreeSet::new();
    let outside = |x: f64| (x - cap).max(floor - x).max(0.0);
    let mean = (floor + cap) / 2.0;
    let mut plan: Vec<(&'a Lease, WorkerId)> = Vec::new();
    loop {
        let off = |w: &WorkerId, c: &BTreeMap<WorkerId, usize>| {
            c.get(w).copied().unwrap_or(0) as i64 - target.get(w).copied().unwrap_or(0) as i64
        };
        let mut givers: Vec<&WorkerId> = counts.keys().filter(|w| off(w, &counts) > 0).collect();
        let mut takers: Vec<&WorkerId> = counts.keys().filter(|w| off(w, &counts) < 0).collect();
        givers.sort_by_key(|w| (Reverse(off(w, &counts)), *w));
        takers.sort_by_key(|w| (off(w, &counts), *w));
        let empty = Vec::new();
        let found = givers.iter().find_map(|&from| {
            let tf = t.get(from).copied().unwrap_or(0.0);
            takers.iter().find_map(|&to| {
                let tt = t.get(to).copied().unwrap_or(0.0);
                at.get(from)
                    .unwrap_or(&empty)
                    .iter()
                    .filter(|l| !l.pending && !moved.contains(&l.lease.key))
                    .filter(|l| {
                        let (f, t) = (tf - l.rate, tt + l.rate);
                        let worst = |a: f64, b: f64| (a - mean).abs().max((b - mean).abs());
                        (outside(f) <= outside(tf) && outside(t) <= outside(tt))
                            || worst(f, t) <= worst(tf, tt)
                    })
                    .map(|l| {
                        let left = (tf - l.rate - mean).powi(2) + (tt + l.rate - mean).powi(2);
                        (left, l)
                    })
                    .min_by(|a, b| {
                        a.0.total_cmp(&b.0)
                            .then_with(|| b.1.lease.key.cmp(&a.1.lease.key))
                    })
                    .map(|(_, l)| (from.clone(), to.clone(), *l))
            })
        });
        let Some((from, to, lease)) = found else {
            break;
        };
        for (worker, count, rate) in [(&from, -1i64, -lease.rate), (&to, 1, lease.rate)] {
            if let Some(c) = counts.get_mut(worker) {
                *c = c.saturating_add_signed(count as isize);
            }
            if let Some(x) = t.get_mut(worker) {
                *x += rate;
            }
        }
        moved.insert(&lease.lease.key);
        plan.push((lease.lease, to));
    }
    plan
}

/// One move of a throughput plan: `lease` from `from` to `to`, and with a swap `back`
/// the other way.
struct Move<'a> {
    from: WorkerId,
    to: WorkerId,
    lease: Rated<'a>,
    back: Option<Rated<'a>>,
}

/// How far the other side of a move may land beyond the mean, as a share of the
/// threshold.
const LANDING: f64 = 0.75;

/// The lines a throughput plan keeps to.
#[derive(Debug, Clone, Copy)]
struct Lines {
    mean: f64,
    /// The most a taker may end with, the least a giver may.
    cap: f64,
    floor: f64,
    /// What a swap must gain, as a share of the two rates it moves: noise on two rates
    /// must not make a swap look worth making, nor then worth undoing.
    margin: f64,
    /// The smallest move worth a request: a tenth of the band. Smaller ones hardly
    /// change the spread, and a worker stuck outside the band (its one hot lease too
    /// big to move) would trickle them out for ever as noise lets one through.
    least: f64,
}

/// The next move: the worker furthest from the mean (with budget left) first, its
/// partners from the furthest on the other side of the mean. A driver's first move
/// may exceed its damped budget, up to landing past the mean where a taker may land:
/// when its leases are coarse (one hot lease is more than the budget), dampening
/// would otherwise leave it outside the band for good.
fn next_move<'a>(
    at: &BTreeMap<WorkerId, Vec<Rated<'a>>>,
    t: &BTreeMap<WorkerId, f64>,
    budget: &BTreeMap<WorkerId, f64>,
    moved_yet: &BTreeSet<WorkerId>,
    lines: &Lines,
    (lo, hi): (usize, usize),
) -> Option<Move<'a>> {
    let Lines {
        mean,
        cap,
        floor,
        margin,
        least,
    } = *lines;
    let load = |w: &WorkerId| t.get(w).copied().unwrap_or(mean);
    let mut drivers: Vec<(&WorkerId, f64)> = budget
        .iter()
        .filter(|(_, b)| **b > 0.0)
        .map(|(w, b)| (w, *b))
        .collect();
    drivers.sort_by(|a, b| {
        (load(b.0) - mean)
            .abs()
            .total_cmp(&(load(a.0) - mean).abs())
            .then_with(|| a.0.cmp(b.0))
    });
    let empty = Vec::new();
    let list = |w: &WorkerId| at.get(w).unwrap_or(&empty);
    for (driver, left) in drivers {
        let hot = load(driver) > mean;
        let left = if moved_yet.contains(driver) {
            left
        } else if hot {
            left.max(load(driver) - floor)
        } else {
            left.max(cap - load(driver))
        };
        let mut partners: Vec<(&WorkerId, f64)> = t
            .iter()
            .filter(|(w, x)| *w != driver && if hot { **x < mean } else { **x > mean })
            .map(|(w, x)| (w, *x))
            .collect();
        // The coldest partner of a hot worker first, the hottest of a cold one.
        partners.sort_by(|a, b| {
            let order = a.1.total_cmp(&b.1);
            if hot { order } else { order.reverse() }.then_with(|| a.0.cmp(b.0))
        });
        for (partner, px) in partners {
            let (from, to) = if hot {
                (driver, partner)
            } else {
                (partner, driver)
            };
            // The driver's budget, and the partner's room before it would cross half
            // the band beyond the mean (so that it does not become a driver the other
            // way). A move spends the budgets of both sides.
            let most = left.min(if hot { cap - px } else { px - floor });
            if most <= 0.0 {
                continue;
            }
            let counts_allow = list(from).len() > lo && list(to).len() < hi;
            if let Some((lease, back)) =
                best_move(list(from), list(to), (least, most), counts_allow, margin)
            {
                return Some(Move {
                    from: from.clone(),
                    to: to.clone(),
                    lease,
                    back,
                });
            }
        }
    }
    None
}

/// The biggest move from `from` to `to` of `least` to `most` bytes/s: one lease if
/// `single` (counts allow it) and one fits, else a lease for a lease of `to` (a swap),
/// the coldest that keeps the difference within bounds and gains at least `margin` of
/// the two rates. Ties by key, so that every worker picks the same.
fn best_move<'a>(
    from: &[Rated<'a>],
    to: &[Rated<'a>],
    (least, most): (f64, f64),
    single: bool,
    margin: f64,
) -> Option<(Rated<'a>, Option<Rated<'a>>)> {
    let movable = |l: &&Rated<'a>| !l.pending && l.rate >= least && l.rate > 0.0;
    let pick = |candidates: Vec<(f64, Rated<'a>, Option<Rated<'a>>)>| {
        candidates
            .into_iter()
            .max_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then_with(|| b.1.lease.key.cmp(&a.1.lease.key))
            })
            .map(|(_, l, back)| (l, back))
    };
    if single {
        let one = pick(
            from.iter()
                .filter(movable)
                .filter(|l| l.rate <= most)
                .map(|l| (l.rate, *l, None))
                .collect(),
        );
        if one.is_some() {
            return one;
        }
    }
    pick(
        from.iter()
            .filter(movable)
            .filter_map(|l| {
                to.iter()
                    .filter(|b| {
                        let gain = l.rate - b.rate;
                        !b.pending
                            && gain > margin * (l.rate + b.rate)
                            && gain >= least
                            && gain <= most
                    })
                    .min_by(|a, b| {
                        a.rate
                            .total_cmp(&b.rate)
                            .then_with(|| a.lease.key.cmp(&b.lease.key))
                    })
                    .map(|b| (l.rate - b.rate, *l, Some(*b)))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, LeaseRate, ShardId};

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
            load: WorkerLoad::default(),
        }
    }

    const FAILOVER: Duration = Duration::from_secs(10);

    fn limits(max: usize) -> Limits {
        Limits {
            failover_time: FAILOVER,
            max_leases: max,
            max_moves_per_round: 10,
            policy: Policy::Throughput(Spread::DEFAULT),
        }
    }

    fn run(
        leases: &[Lease],
        held: &BTreeMap<LeaseKey, Fence>,
        obs: &Observations,
        me: &WorkerId,
        now: Instant,
        limits: &Limits,
    ) -> Decision {
        decide(
            &Round {
                leases,
                held,
                observations: obs,
                me,
                now,
                cooling: &BTreeSet::new(),
                handing_off: &BTreeSet::new(),
                draining: false,
            },
            limits,
        )
    }

    fn taken(d: &Decision) -> Vec<&LeaseKey> {
        d.take.iter().map(|t| &t.key).collect()
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

    /// `lease.java_compat`: owners with no heartbeat row judged by their lease counters
    /// as the Java KCL judges them; owners with one as before; off, as before.
    #[test]
    fn java_owners_are_alive_while_their_lease_counters_move() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let me = WorkerId::new("me");
        // (scans at these seconds with these counters of java's leases 0 and 1, and of
        // flotilla worker b's lease 2, whose heartbeat stands still) → at the last scan,
        // which leases a lone worker "me" takes.
        struct Case {
            name: &'static str,
            compat: bool,
            scans: &'static [(u64, u64, u64)],
            taken: &'static [u64],
        }
        let cases = [
            Case {
                name: "both renewed every 3 s: nothing taken; b dead by heartbeat",
                compat: true,
                scans: &[
                    (0, 1, 1),
                    (3, 2, 2),
                    (6, 3, 3),
                    (9, 4, 4),
                    (12, 5, 5),
                    (15, 6, 6),
                ],
                taken: &[2],
            },
            Case {
                name: "lease 1's renewal stalls: it alone is taken after failover_time",
                compat: true,
                scans: &[(0, 1, 1), (3, 2, 1), (6, 3, 1), (9, 4, 1), (10, 5, 1)],
                taken: &[1, 2],
            },
            Case {
                name: "a stall just short of failover_time: nothing of java's taken",
                compat: true,
                scans: &[(0, 1, 1), (9, 2, 2), (18, 3, 3)],
                taken: &[2],
            },
            Case {
                name: "java stops: both taken failover_time after the last move seen",
                compat: true,
                scans: &[(0, 1, 1), (5, 2, 2), (14, 2, 2), (15, 2, 2)],
                taken: &[0, 1, 2],
            },
            Case {
                name: "off: a heartbeat-less owner is dead failover_time after first seen",
                compat: false,
                scans: &[(0, 1, 1), (3, 2, 2), (6, 3, 3), (9, 4, 4), (10, 5, 5)],
                taken: &[0, 1, 2],
            },
        ];
        for case in cases {
            let mut obs = Observations::with_java_compat(case.compat);
            let mut leases = Vec::new();
            let mut now = t0;
            for &(s, c0, c1) in case.scans {
                now = at(s);
                leases = vec![
                    lease(0, Some("java"), c0),
                    lease(1, Some("java"), c1),
                    lease(2, Some("b"), 1),
                ];
                obs.observe(
                    &[hb("b", 1)],
                    leases.iter().filter_map(|l| l.owner.as_ref()),
                    now,
                );
                obs.observe_lease_counters(&leases, now);
                obs.observe_leases(&leases, now, FAILOVER);
            }
            let d = run(&leases, &BTreeMap::new(), &obs, &me, now, &limits(0));
            let want: Vec<&LeaseKey> = case
                .taken
                .iter()
                .map(|&i| &leases[i as usize].key)
                .collect();
            let mut got = taken(&d);
            got.sort();
            assert_eq!(got, want, "{}", case.name);
            for (i, l) in (0u64..).zip(&leases) {
                let dead_at = obs.lease_dead_at(l, FAILOVER).expect("owned and seen");
                assert_eq!(
                    dead_at <= now,
                    case.taken.contains(&i),
                    "{}: lease_dead_at of {} agrees with the take",
                    case.name,
                    l.key
                );
            }
        }
    }

    #[test]
    fn a_lone_worker_takes_what_has_no_live_owner_and_notices_what_it_lost() {
        let t0 = Instant::now();
        let me = WorkerId::new("me");
        let mut obs = Observations::new();
        let leases = vec![
            lease(0, None, 0),         // unowned: take
            lease(2, Some("dead"), 4), // dead owner: take
            lease(3, Some("me"), 7),   // mine by name, not held: take
            lease(4, Some("me"), 2),   // held: keep
            lease(5, Some("dead"), 9), // held by me before, now someone else's: lost
            lease(6, None, 3),         // released by someone: take
        ];
        let owners = || leases.iter().filter_map(|l| l.owner.as_ref());
        obs.observe(&[hb("dead", 1)], owners(), t0);
        let later = t0 + FAILOVER;
        obs.observe(&[hb("dead", 1)], owners(), later);
        let mut held = BTreeMap::new();
        held.insert(leases[3].key.clone(), leases[3].fence());
        held.insert(
            leases[4].key.clone(),
            Fence {
                owner: Some(me.clone()),
                counter: 8,
            },
        );
        let d = run(&leases, &held, &obs, &me, later, &limits(0));
        assert_eq!(
            taken(&d),
            // Free ones by key (the lost one's owner is dead too), then its own.
            vec![
                &leases[0].key,
                &leases[1].key,
                &leases[4].key,
                &leases[5].key,
                &leases[2].key
            ]
        );
        let why: BTreeMap<&LeaseKey, Gain> = d.take.iter().map(|t| (&t.key, t.why)).collect();
        assert_eq!(why[&leases[0].key], Gain::New);
        assert_eq!(why[&leases[1].key], Gain::Expired);
        assert_eq!(why[&leases[2].key], Gain::Resumed);
        assert_eq!(why[&leases[5].key], Gain::Released);
        assert_eq!(d.lost, vec![leases[4].key.clone()]);
        assert!(d.request.is_empty() && d.hand_off.is_empty());
    }

    #[test]
    fn finished_cooling_blocked_and_limited_leases_are_not_taken() {
        let t0 = Instant::now();
        let me = WorkerId::new("me");
        let mut done = lease(0, None, 0);
        done.checkpoint = Checkpoint::ShardEnd;
        let mut blocked = lease(9, None, 0);
        blocked.parent_shard_ids = vec![ShardId::from_index(1)];
        let leases = vec![
            done,
            lease(1, None, 0),
            lease(2, None, 0),
            lease(3, None, 0),
            blocked,
        ];
        let obs = Observations::new();
        let cooling: BTreeSet<LeaseKey> = [leases[1].key.clone()].into();
        let d = decide(
            &Round {
                leases: &leases,
                held: &BTreeMap::new(),
                observations: &obs,
                me: &me,
                now: t0,
                cooling: &cooling,
                handing_off: &BTreeSet::new(),
                draining: false,
            },
            &limits(1),
        );
        assert_eq!(taken(&d), vec![&leases[2].key]);
    }

    #[test]
    fn a_child_is_taken_once_its_parents_have_ended_or_are_gone() {
        let me = WorkerId::new("me");
        let mut parent = lease(1, None, 0);
        parent.checkpoint = Checkpoint::ShardEnd;
        let mut child = lease(5, None, 0);
        child.parent_shard_ids = vec![ShardId::from_index(1), ShardId::from_index(2)];
        let d = run(
            &[parent, child.clone()],
            &BTreeMap::new(),
            &Observations::new(),
            &me,
            Instant::now(),
            &limits(0),
        );
        assert_eq!(taken(&d), vec![&child.key]);
    }

    #[test]
    fn a_deleted_lease_row_is_lost() {
        let me = WorkerId::new("me");
        let gone = lease(9, Some("me"), 1);
        let held: BTreeMap<LeaseKey, Fence> = [(gone.key.clone(), gone.fence())].into();
        let d = run(
            &[],
            &held,
            &Observations::new(),
            &me,
            Instant::now(),
            &limits(0),
        );
        assert_eq!(d.lost, vec![gone.key]);
    }

    #[test]
    fn targets_give_the_extra_leases_to_those_holding_most() {
        let loads: BTreeMap<WorkerId, usize> = [
            (WorkerId::new("a"), 1),
            (WorkerId::new("b"), 5),
            (WorkerId::new("c"), 5),
        ]
        .into();
        let t = targets(&loads, 11);
        assert_eq!(
            t.values().copied().collect::<Vec<_>>(),
            vec![3, 4, 4],
            "{t:?}"
        );
    }

    #[test]
    fn a_joining_worker_asks_the_most_loaded_and_the_owner_hands_over() {
        let t0 = Instant::now();
        let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
        let mut leases: Vec<Lease> = (0..4).map(|i| lease(i, Some("a"), 1)).collect();
        let mut obs = Observations::new();
        obs.observe(&[hb("a", 1), hb("b", 1)], [], t0);
        let d = run(&leases, &BTreeMap::new(), &obs, &b, t0, &limits(0));
        assert!(d.take.is_empty());
        let asked: Vec<&LeaseKey> = d.request.iter().map(|(k, _)| k).collect();
        assert_eq!(asked, vec![&leases[3].key, &leases[2].key]);
        // The owner sees the requests and hands those leases over.
        leases[3].handoff_to = Some(b.clone());
        leases[2].handoff_to = Some(b.clone());
        let held: BTreeMap<LeaseKey, Fence> =
            leases.iter().map(|l| (l.key.clone(), l.fence())).collect();
        let d = run(&leases, &held, &obs, &a, t0, &limits(0));
        let handing: Vec<(&LeaseKey, &WorkerId)> =
            d.hand_off.iter().map(|(k, _, w)| (k, w)).collect();
        assert_eq!(handing, vec![(&leases[2].key, &b), (&leases[3].key, &b)]);
        assert!(d.request.is_empty() && d.take.is_empty());
        // Asked already: the requester does not ask again.
        let d = run(&leases, &BTreeMap::new(), &obs, &b, t0, &limits(0));
        assert!(d.request.is_empty(), "{d:?}");
    }

    #[test]
    fn a_joiner_asks_for_at_least_half_its_shortfall_in_one_round() {
        let t0 = Instant::now();
        let b = WorkerId::new("b");
        let leases: Vec<Lease> = (0..12).map(|i| lease(i, Some("a"), 1)).collect();
        let mut obs = Observations::new();
        obs.observe(&[hb("a", 1), hb("b", 1)], [], t0);
        let mut one_move = limits(0);
        one_move.max_moves_per_round = 1;
        let d = run(&leases, &BTreeMap::new(), &obs, &b, t0, &one_move);
        // Share 6, none held: half the shortfall, 3, beats the setting's 1.
        assert_eq!(d.request.len(), 3, "{d:?}");
    }

    fn hb_holding(worker: &str, counter: u64, leases: u64) -> Heartbeat {
        let mut h = hb(worker, counter);
        h.load.leases = leases;
        h
    }

    #[test]
    fn a_joiner_whose_scan_agrees_with_the_heartbeats_asks_for_its_whole_shortfall() {
        let t0 = Instant::now();
        let b = WorkerId::new("b");
        // a holds 8, c holds 4: shares of 4 each, b short by 4, a above by 4.
        let leases: Vec<Lease> = (0..12)
            .map(|i| lease(i, Some(if i < 8 { "a" } else { "c" }), 1))
            .collect();
        let mut one_move = limits(0);
        one_move.max_moves_per_round = 1;
        let from_a = |d: &Decision| {
            d.request.iter().all(|(k, _)| {
                leases
                    .iter()
                    .any(|l| &l.key == k && l.owner == Some(WorkerId::new("a")))
            })
        };
        // (a's reported count, c's, max_leases, requests)
        let table: [(u64, u64, usize, usize); 4] = [
            // Agrees: the whole shortfall, all of it a's surplus (c is at its share).
            (8, 4, 0, 4),
            // a's heartbeat says 7: the scan is out of step, half the shortfall.
            (7, 4, 0, 2),
            // c's says 5: likewise.
            (8, 5, 0, 2),
            // Agrees, but max_leases 3 leaves room for 3.
            (8, 4, 3, 3),
        ];
        for (i, (on_a, on_c, max, want)) in table.into_iter().enumerate() {
            let mut obs = Observations::new();
            obs.observe(
                &[
                    hb_holding("a", 1, on_a),
                    hb_holding("b", 1, 0),
                    hb_holding("c", 1, on_c),
                ],
                [],
                t0,
            );
            let mut lim = one_move.clone();
            lim.max_leases = max;
            let d = run(&leases, &BTreeMap::new(), &obs, &b, t0, &lim);
            assert_eq!(d.request.len(), want, "scenario {i}: {d:?}");
            assert!(from_a(&d), "scenario {i}: {d:?}");
        }
    }

    #[test]
    fn requests_from_dead_or_draining_workers_are_turned_down() {
        let t0 = Instant::now();
        let a = WorkerId::new("a");
        let mut x = lease(0, Some("a"), 1);
        x.handoff_to = Some(WorkerId::new("gone"));
        let mut y = lease(1, Some("a"), 1);
        y.handoff_to = Some(WorkerId::new("leaving"));
        let leases = vec![x.clone(), y.clone()];
        let mut obs = Observations::new();
        let mut leaving = hb("leaving", 1);
        leaving.load.draining = true;
        obs.observe(&[hb("gone", 1), leaving.clone()], [], t0);
        let later = t0 + FAILOVER;
        leaving.counter = 2;
        obs.observe(&[hb("gone", 1), leaving], [], later);
        let held: BTreeMap<LeaseKey, Fence> =
            leases.iter().map(|l| (l.key.clone(), l.fence())).collect();
        let d = run(&leases, &held, &obs, &a, later, &limits(0));
        assert_eq!(
            d.turn_down,
            vec![
                (x.key.clone(), WorkerId::new("gone")),
                (y.key.clone(), WorkerId::new("leaving"))
            ]
        );
        assert!(d.hand_off.is_empty());
    }

    #[test]
    fn a_lease_dealt_to_a_worker_that_does_not_take_it_is_anyones_after_the_failover_time() {
        let t0 = Instant::now();
        let a = WorkerId::new("a");
        // b is at its max_leases (1), below its share: the free lease is dealt to it.
        let mut leases: Vec<Lease> = (0..3).map(|i| lease(i, Some("a"), 1)).collect();
        leases.push(lease(3, Some("b"), 1));
        leases.push(lease(4, None, 0));
        let held: BTreeMap<LeaseKey, Fence> = leases[..3]
            .iter()
            .map(|l| (l.key.clone(), l.fence()))
            .collect();
        let mut obs = Observations::new();
        let owners: Vec<WorkerId> = leases.iter().filter_map(|l| l.owner.clone()).collect();
        obs.observe(&[hb("a", 1), hb("b", 1)], owners.iter(), t0);
        obs.observe_leases(&leases, t0, FAILOVER);
        let d = run(&leases, &held, &obs, &a, t0, &limits(0));
        assert!(d.take.is_empty(), "b's to take: {d:?}");
        let later = t0 + FAILOVER;
        obs.observe(&[hb("a", 2), hb("b", 2)], owners.iter(), later);
        obs.observe_leases(&leases, later, FAILOVER);
        let d = run(&leases, &held, &obs, &a, later, &limits(0));
        assert_eq!(taken(&d), vec![&leases[4].key]);
    }

    #[test]
    fn a_draining_worker_takes_nothing_and_its_leases_are_asked_for_without_limit() {
        let t0 = Instant::now();
        let b = WorkerId::new("b");
        let leases: Vec<Lease> = (0..6).map(|i| lease(i, Some("a"), 1)).collect();
        let mut obs = Observations::new();
        let mut a = hb("a", 1);
        a.load.draining = true;
        obs.observe(&[a, hb("b", 1)], [], t0);
        let mut one_move = limits(0);
        one_move.max_moves_per_round = 1;
        let d = run(&leases, &BTreeMap::new(), &obs, &b, t0, &one_move);
        assert_eq!(d.request.len(), 6, "{d:?}");
        // And the draining worker itself takes nothing.
        let mut free = leases.clone();
        free.push(lease(7, None, 0));
        let d = decide(
            &Round {
                leases: &free,
                held: &BTreeMap::new(),
                observations: &obs,
                me: &WorkerId::new("a"),
                now: t0,
                cooling: &BTreeSet::new(),
                handing_off: &BTreeSet::new(),
                draining: true,
            },
            &limits(0),
        );
        assert!(d.take.is_empty() && d.request.is_empty());
        // What it owns by name but does not hold (handed to it as it began to drain)
        // it lets go.
        let mut late = lease(8, Some("a"), 4);
        late.handoff_to = None;
        free.push(late.clone());
        let d = decide(
            &Round {
                leases: &free,
                held: &leases.iter().map(|l| (l.key.clone(), l.fence())).collect(),
                observations: &obs,
                me: &WorkerId::new("a"),
                now: t0,
                cooling: &BTreeSet::new(),
                handing_off: &BTreeSet::new(),
                draining: true,
            },
            &limits(0),
        );
        assert_eq!(d.release, vec![(late.key.clone(), late.fence())]);
    }

    /// A fleet run in rounds, every worker deciding from the same scan, with the table's
    /// conditional writes applied in a seeded order.
    mod fleet {
        use super::*;
        use crate::fleet_sim::Sim;
        use proptest::prelude::*;

        fn start() -> impl Strategy<Value = (usize, usize, Vec<usize>)> {
            (1usize..=50, 0usize..=1000).prop_flat_map(|(workers, leases)| {
                // Owners: a worker index, or one past the end for "unowned".
                let owner = 0..=workers;
                (
                    Just(workers),
                    Just(leases),
                    proptest::collection::vec(owner, leases),
                )
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]

            #[test]
            fn any_start_settles_to_a_spread_of_one_in_bounded_rounds(
                (workers, leases, owners) in start(),
            ) {
                let mut sim = Sim::new(leases, workers, &owners);
                // Each worker gets at most max_moves leases from live peers per round,
                // and a steal lands the round after it is asked: the bound is the
                // largest shortfall over the move limit, twice, plus a few rounds.
                let share = leases.div_ceil(workers.max(1));
                let bound = 2 * share.div_ceil(sim.limits.max_moves_per_round) + 4;
                let rounds = sim.settle(bound);
                prop_assert!(rounds.is_some(), "not settled in {} rounds: spread {}", bound, sim.spread());
            }

            #[test]
            fn a_settled_fleet_moves_nothing(
                (workers, leases, owners) in start(),
            ) {
                let mut sim = Sim::new(leases, workers, &owners);
                prop_assume!(sim.settle(500).is_some());
                for (_, d) in (0..3).flat_map(|_| sim.round()) {
                    prop_assert!(d.take.is_empty() && d.request.is_empty() && d.hand_off.is_empty(), "{:?}", d);
                }
            }

            #[test]
            fn a_join_or_a_leave_moves_each_lease_at_most_once(
                (workers, leases, owners) in start(),
                change in 0u8..3,
            ) {
                let mut sim = Sim::new(leases, workers, &owners);
                prop_assume!(sim.settle(500).is_some());
                sim.moves.iter_mut().for_each(|m| *m = 0);
                let first = sim.workers.iter().next().cloned();
                match (change, first) {
                    (0, _) => {
                        sim.workers.insert(WorkerId::new("joiner"));
                    }
                    (1, Some(w)) if sim.workers.len() > 1 => sim.crash(&w),
                    (2, Some(w)) if sim.workers.len() > 1 => {
                        sim.draining.insert(w);
                    }
                    _ => return Ok(()),
                }
                let rounds = sim.settle(500);
                prop_assert!(rounds.is_some(), "did not settle: spread {}", sim.spread());
                let worst = sim.moves.iter().copied().max().unwrap_or(0);
                prop_assert!(worst <= 1, "a lease moved {} times", worst);
            }

            #[test]
            fn no_two_workers_take_one_lease_in_a_round(
                (workers, leases, owners) in start(),
            ) {
                let mut sim = Sim::new(leases, workers, &owners);
                for _ in 0..6 {
                    let snapshot = sim.leases.clone();
                    let decisions = sim.round();
                    let mut claimed: BTreeSet<&LeaseKey> = BTreeSet::new();
                    for (_, d) in &decisions {
                        for key in d.take.iter().map(|t| &t.key).chain(d.request.iter().map(|(k, _)| k)) {
                            prop_assert!(claimed.insert(key), "{} claimed twice", key);
                        }
                    }
                    // Nobody takes a lease from a live worker other than itself.
                    for (taker, d) in &decisions {
                        for t in &d.take {
                            let l = snapshot.iter().find(|l| l.key == t.key).unwrap();
                            if let Some(o) = &l.owner {
                                prop_assert!(o == taker || !sim.workers.contains(o),
                                    "{} taken by {} from live {}", t.key, taker, o);
                            }
                        }
                    }
                }
            }
        }
    }

    fn rated(worker: &str, counter: u64, rates: &[(&Lease, u64)]) -> Heartbeat {
        let mut h = hb(worker, counter);
        h.load.lease_rates = Some(
            rates
                .iter()
                .map(|(l, r)| {
                    (
                        l.key.clone(),
                        LeaseRate {
                            records_per_second: *r,
                            bytes_per_second: *r,
                        },
                    )
                })
                .collect(),
        );
        h
    }

    /// Two workers, `a` holding `on_a` and `b` holding `on_b` (bytes/s per lease): what
    /// `b` asks of `a` and `a` asks of `b`.
    fn asks(on_a: &[u64], on_b: &[u64], b_rates: bool) -> (Vec<usize>, Vec<usize>) {
        let t0 = Instant::now();
        let n = on_a.len();
        let leases: Vec<Lease> = on_a
            .iter()
            .chain(on_b)
            .enumerate()
            .map(|(i, _)| lease(i as u64, Some(if i < n { "a" } else { "b" }), 1))
            .collect();
        let with = |range: std::ops::Range<usize>, rates: &[u64]| -> Vec<(&Lease, u64)> {
            leases[range].iter().zip(rates.iter().copied()).collect()
        };
        let mut obs = Observations::new();
        let b_beat = if b_rates {
            rated("b", 1, &with(n..leases.len(), on_b))
        } else {
            hb("b", 1)
        };
        obs.observe(&[rated("a", 1, &with(0..n, on_a)), b_beat], [], t0);
        let index = |d: Decision| -> Vec<usize> {
            d.request
                .iter()
                .filter_map(|(k, _)| leases.iter().position(|l| &l.key == k))
                .collect()
        };
        let held = |w: &str| -> BTreeMap<LeaseKey, Fence> {
            leases
                .iter()
                .filter(|l| l.owner.as_ref().is_some_and(|o| o.as_str() == w))
                .map(|l| (l.key.clone(), l.fence()))
                .collect()
        };
        let by_b = run(
            &leases,
            &held("b"),
            &obs,
            &WorkerId::new("b"),
            t0,
            &limits(0),
        );
        let by_a = run(
            &leases,
            &held("a"),
            &obs,
            &WorkerId::new("a"),
            t0,
            &limits(0),
        );
        (index(by_b), index(by_a))
    }

    #[test]
    fn throughput_scenarios() {
        // (a's leases, b's leases, b publishes rates, b asks for, a asks for)
        type Scenario = (
            &'static [u64],
            &'static [u64],
            bool,
            &'static [usize],
            &'static [usize],
        );
        let table: [Scenario; 11] = [
            // Even: nothing moves.
            (&[100, 100], &[100, 100], true, &[], &[]),
            // Idle, counts 3 and 1: throughput cannot tell them apart, so counts even
            // out, as under count balance (the highest key, as count balance picks).
            (&[0, 0, 0], &[0], true, &[2], &[]),
            // Throughput even (220 / 200, inside the band), counts 4 and 1: the cold
            // lease that leaves both nearest the mean evens the counts.
            (&[100, 100, 10, 10], &[200], true, &[3], &[]),
            // Throughput even, counts 3 and 1, but any move would take both sides out
            // of the band: counts stay as they are.
            (&[100, 100, 100], &[300], true, &[], &[]),
            // 60 / 40, both outside the band, and no throughput move helps (the 40 is
            // too big to come back, a 20 too big to land): a 20 evens counts, the
            // spread the same (40 / 60).
            (&[20, 20, 20], &[40], true, &[2], &[]),
            // Within the 10 % band: nothing moves.
            (&[105, 100], &[100, 95], true, &[], &[]),
            // a is hot (mean 300): b asks for the biggest lease that lands neither
            // side more than 7.5 % past the mean (a's first move may exceed its damped
            // budget of 60): the 80, not the 200.
            (&[200, 80, 60, 60], &[50, 50, 50, 50], true, &[1], &[]),
            // The hot lease is bigger than the gap it would fix: it stays.
            (&[300], &[10], true, &[], &[]),
            // b publishes no rates (an older flotilla): counts only, and counts are even.
            (&[200, 80, 60, 60], &[50, 50, 50, 50], false, &[], &[]),
            // a at its count floor (fair 4 - slack 2): a swap, each side asking for
            // one lease; the 60 for a 10 (a gain of 50, within a's budget of 60).
            (&[200, 60], &[10, 10, 10, 10, 10, 10], true, &[1], &[2]),
            // Both outside the band: one move (100 of a's budget of 0.6 × 180), which
            // spends b's budget too: no second one.
            (&[100, 100, 100, 100], &[10, 10, 10, 10], true, &[0], &[]),
        ];
        for (i, (a, b, b_rates, want_b, want_a)) in table.into_iter().enumerate() {
            let (by_b, by_a) = asks(a, b, b_rates);
            assert_eq!(
                (by_b.as_slice(), by_a.as_slice()),
                (want_b, want_a),
                "scenario {i}: {a:?} / {b:?}"
            );
        }
    }

    /// Fleets with skewed rates, run in rounds as in `fleet`, every worker publishing
    /// its leases' bytes/s.
    mod throughput_fleet {
        use std::collections::BTreeSet;

        use crate::fleet_sim::Sim;
        use crate::model::WorkerId;
        use proptest::prelude::*;
        use rand::{Rng, SeedableRng};

        /// Workers, then per lease its first owner (past the last: unowned) and its
        /// bytes/s: mostly cold, some hot (up to 100 times as much).
        fn start() -> impl Strategy<Value = (usize, Vec<usize>, Vec<u64>)> {
            (2usize..=12, 1usize..=150).prop_flat_map(|(workers, leases)| {
                (
                    Just(workers),
                    proptest::collection::vec(0..=workers, leases),
                    proptest::collection::vec(
                        prop_oneof![4 => 10u64..=100, 1 => 1_000u64..=10_000],
                        leases,
                    ),
                )
            })
        }

        fn sim(workers: usize, owners: &[usize], rates: &[u64]) -> Sim {
            let mut sim = Sim::new(owners.len(), workers, owners).with_rates(rates.to_vec());
            // Every request of a plan is made in its round, so each round carries out
            // one whole plan (a swap's two halves together).
            sim.limits.max_moves_per_round = 10_000;
            sim
        }

        /// Sum of squared deviations from the mean throughput.
        fn objective(sim: &Sim, rates: &[u64]) -> f64 {
            let t = sim.throughputs(rates);
            let mean = t.values().sum::<u64>() as f64 / t.len().max(1) as f64;
            t.values().map(|&x| (x as f64 - mean).powi(2)).sum()
        }

        /// What a round of moves is judged by.
        #[derive(Debug, Clone, PartialEq)]
        struct Shape {
            /// Σ (throughput − mean)², true rates.
            spread: f64,
            /// The furthest worker from the mean throughput, as a fraction of it.
            worst: f64,
            /// Σ count².
            counts: usize,
        }

        impl Shape {
            fn of(sim: &Sim, rates: &[u64]) -> Shape {
                let t = sim.throughputs(rates);
                let mean = t.values().sum::<u64>() as f64 / t.len().max(1) as f64;
                let worst = t
                    .values()
                    .map(|&x| {
                        if mean > 0.0 {
                            (x as f64 - mean).abs() / mean
                        } else {
                            0.0
                        }
                    })
                    .fold(0.0, f64::max);
                Shape {
                    spread: objective(sim, rates),
                    worst,
                    counts: counts(sim).iter().map(|c| c * c).sum(),
                }
            }

            /// A move lowers the spread of throughput, or evens counts without taking
            /// the furthest worker past the threshold (or further past it, if it was).
            fn justified(&self, before: &Shape) -> bool {
                let threshold = crate::balance::Spread::DEFAULT.threshold;
                self.spread < before.spread
                    || (self.counts < before.counts && self.worst <= before.worst.max(threshold))
            }
        }

        fn placement(sim: &Sim) -> Vec<Option<WorkerId>> {
            sim.leases.iter().map(|l| l.owner.clone()).collect()
        }

        fn counts(sim: &Sim) -> Vec<usize> {
            sim.workers.iter().map(|w| sim.held_by(w).len()).collect()
        }

        /// Rounds bounded by the moves a plan can need: each lease moves once at most
        /// per plan, a plan lands in two rounds, and dampening takes a few plans.
        const BOUND: usize = 60;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]

            #[test]
            fn any_start_goes_quiet_in_bounded_rounds_with_counts_in_the_slack(
                (workers, owners, rates) in start(),
            ) {
                let mut sim = sim(workers, &owners, &rates);
                let rounds = sim.quiet(BOUND);
                prop_assert!(rounds.is_some(), "not quiet in {} rounds: {:?}", BOUND, sim.throughputs(&rates));
                let n = owners.len();
                let (q, r) = (n / workers, n % workers);
                let (lo, hi) = (q.saturating_sub(2), q + usize::from(r > 0) + 2);
                for c in counts(&sim) {
                    prop_assert!(lo <= c && c <= hi, "count {} outside {}..={}", c, lo, hi);
                }
                // And quiet it stays.
                for (_, d) in (0..3).flat_map(|_| sim.round()) {
                    prop_assert!(d.take.is_empty() && d.request.is_empty() && d.hand_off.is_empty(), "{:?}", d);
                }
            }

            #[test]
            fn every_round_of_moves_lowers_the_spread_or_evens_counts_inside_the_band(
                (workers, owners, rates) in start(),
            ) {
                // Counts even from the start (round-robin): throughput moves, and the
                // count moves that follow them.
                let owners: Vec<usize> = (0..owners.len()).map(|i| i % workers).collect();
                let mut sim = sim(workers, &owners, &rates);
                let mut before = Shape::of(&sim, &rates);
                for round in 1..=BOUND {
                    let moves_before: u32 = sim.moves.iter().sum();
                    sim.round();
                    let after = Shape::of(&sim, &rates);
                    if sim.moves.iter().sum::<u32>() > moves_before {
                        prop_assert!(after.justified(&before), "round {}: {:?} -> {:?}", round, before, after);
                    } else {
                        prop_assert!(after == before);
                    }
                    before = after;
                }
            }

            #[test]
            fn noisy_rates_do_not_move_leases_back_and_forth(
                (workers, owners, rates) in start(),
                seed in any::<u64>(),
            ) {
                let mut sim = sim(workers, &owners, &rates);
                prop_assume!(sim.quiet(BOUND).is_some());
                // Every published rate off by up to ±JITTER each round, independently.
                // Noise may let through a move that was just short of worth making, but
                // only one that lowers the spread of the true rates, or evens counts
                // keeping the true rates inside the band: no placement of the leases
                // comes back (nothing goes back and forth).
                const JITTER: f64 = 0.01;
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let mut before = Shape::of(&sim, &rates);
                let mut seen: BTreeSet<Vec<Option<WorkerId>>> = BTreeSet::new();
                seen.insert(placement(&sim));
                for round in 1..=60 {
                    let noisy: Vec<u64> = rates
                        .iter()
                        .map(|&r| (r as f64 * (1.0 + rng.random_range(-JITTER..=JITTER))).round() as u64)
                        .collect();
                    sim.rates = Some(noisy);
                    let moved: u32 = sim.moves.iter().sum();
                    sim.round();
                    let after = Shape::of(&sim, &rates);
                    if sim.moves.iter().sum::<u32>() > moved {
                        prop_assert!(after.justified(&before), "round {}: noise moved {:?} -> {:?}", round, before, after);
                        prop_assert!(seen.insert(placement(&sim)), "round {}: a placement came back", round);
                    }
                    before = after;
                }
            }

            #[test]
            fn max_leases_is_never_exceeded(
                (workers, owners, rates) in start(),
            ) {
                let n = owners.len();
                let owners: Vec<usize> = (0..n).map(|i| i % workers).collect();
                let mut sim = sim(workers, &owners, &rates);
                // Room for the fair share and one more: less than the slack would allow.
                let max = n.div_ceil(workers) + 1;
                sim.limits.max_leases = max;
                for _ in 0..BOUND {
                    sim.round();
                    for c in counts(&sim) {
                        prop_assert!(c <= max, "{} leases held, max_leases {}", c, max);
                    }
                }
            }

            #[test]
            fn a_fleet_whose_leases_all_flow_alike_ends_with_even_counts(
                (workers, owners, _) in start(),
                rate in prop_oneof![Just(0u64), 1u64..=10_000],
            ) {
                // Idle (0) or every lease alike: throughput says nothing counts do not,
                // so the fleet ends as count balance leaves it, a spread of one.
                let rates = vec![rate; owners.len()];
                let mut sim = sim(workers, &owners, &rates);
                prop_assert!(sim.quiet(BOUND).is_some(), "not quiet: {:?}", counts(&sim));
                prop_assert!(sim.spread() <= 1, "counts {:?}", counts(&sim));
            }

            #[test]
            fn an_even_fleet_moves_nothing(
                workers in 2usize..=12,
                per in 1usize..=12,
                rate in 1u64..=10_000,
            ) {
                let n = workers * per;
                let owners: Vec<usize> = (0..n).map(|i| i % workers).collect();
                let mut sim = sim(workers, &owners, &vec![rate; n]);
                for (_, d) in (0..3).flat_map(|_| sim.round()) {
                    prop_assert!(d.take.is_empty() && d.request.is_empty() && d.hand_off.is_empty(), "{:?}", d);
                }
            }
        }
    }
}
