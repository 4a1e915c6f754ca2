//! A fleet of workers deciding with [`crate::balance::decide`], simulated in rounds:
//! every live worker decides on the same scan, then the writes land as the table's
//! conditional writes would, in worker order. Pure and deterministic: the property
//! tests of `balance` and the P5 benchmark (`benches/fleet.rs`) run fleets on it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::balance::{Decision, Limits, Observations, Policy, Round, Spread, decide};
use crate::model::{
    Checkpoint, Fence, Heartbeat, Lease, LeaseKey, LeaseRate, ShardId, WorkerId, WorkerLoad,
};

/// The failover time of a simulated fleet; a crash takes effect after it.
pub const FAILOVER: Duration = Duration::from_secs(10);

fn heartbeat(
    worker: &WorkerId,
    counter: u64,
    draining: bool,
    leases: u64,
    lease_rates: Option<BTreeMap<LeaseKey, LeaseRate>>,
) -> Heartbeat {
    Heartbeat {
        worker: worker.clone(),
        counter,
        load: WorkerLoad {
            leases,
            draining,
            lease_rates,
            ..WorkerLoad::default()
        },
    }
}

/// The lease table and the fleet, one round at a time.
#[derive(Debug)]
pub struct Sim {
    /// The lease table's rows, in lease order (`moves` and `rates` follow the same order).
    pub leases: Vec<Lease>,
    /// Live workers (draining ones included).
    pub workers: BTreeSet<WorkerId>,
    /// Draining workers (still alive, shutting down).
    pub draining: BTreeSet<WorkerId>,
    /// Crashed workers: their heartbeat rows stay, frozen.
    pub crashed: BTreeSet<WorkerId>,
    /// The heartbeats as every worker observes them: one shared view, as all decide on one scan.
    pub obs: Observations,
    /// The simulated time; each round moves it on by one second.
    pub now: Instant,
    /// The settings every worker decides with.
    pub limits: Limits,
    /// Owner changes per lease.
    pub moves: Vec<u32>,
    /// Each lease's bytes/s, as its owner publishes it; `None`: workers publish no
    /// rates (an older flotilla), and balance keeps to counts.
    pub rates: Option<Vec<u64>>,
    counters: BTreeMap<WorkerId, u64>,
}

impl Sim {
    /// `workers` workers `w00`, `w01`, … and `n_leases` leases; `start[i]` names the
    /// index of lease i's first owner (past the last worker, or absent: unowned).
    pub fn new(n_leases: usize, workers: usize, start: &[usize]) -> Self {
        let workers: BTreeSet<WorkerId> = (0..workers)
            .map(|i| WorkerId::new(format!("w{i:02}")))
            .collect();
        let list: Vec<&WorkerId> = workers.iter().collect();
        let leases = (0..n_leases)
            .map(|i| {
                let owner = start
                    .get(i)
                    .and_then(|&w| (w < list.len()).then(|| list[w].as_str()));
                let mut lease = Lease::new(
                    &ShardId::from_index(i as u64),
                    Checkpoint::TrimHorizon,
                    vec![],
                    None,
                );
                lease.owner = owner.map(WorkerId::new);
                lease.counter = 1;
                lease
            })
            .collect();
        let mut sim = Sim {
            leases,
            workers,
            draining: BTreeSet::new(),
            crashed: BTreeSet::new(),
            obs: Observations::new(),
            now: Instant::now(),
            limits: Limits {
                failover_time: FAILOVER,
                max_leases: 0,
                max_moves_per_round: 10,
                policy: Policy::Throughput(Spread::DEFAULT),
            },
            moves: vec![0; n_leases],
            rates: None,
            counters: BTreeMap::new(),
        };
        sim.beat();
        sim
    }

    /// The same fleet, its workers publishing `rates[i]` bytes/s for lease i.
    pub fn with_rates(mut self, rates: Vec<u64>) -> Self {
        self.rates = Some(rates);
        self.beat();
        self
    }

    /// What `w` publishes: the rates of the leases it owns.
    fn rates_of(&self, w: &WorkerId) -> Option<BTreeMap<LeaseKey, LeaseRate>> {
        let rates = self.rates.as_ref()?;
        Some(
            self.leases
                .iter()
                .zip(rates)
                .filter(|(l, _)| l.owner.as_ref() == Some(w))
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
        )
    }

    fn beat(&mut self) {
        let mut hbs = Vec::new();
        for w in &self.workers {
            let c = self.counters.entry(w.clone()).or_insert(0);
            *c += 1;
            let c = *c;
            hbs.push(heartbeat(
                w,
                c,
                self.draining.contains(w),
                self.held_by(w).len() as u64,
                self.rates_of(w),
            ));
        }
        for w in &self.crashed {
            hbs.push(heartbeat(
                w,
                self.counters.get(w).copied().unwrap_or(0),
                false,
                self.held_by(w).len() as u64,
                self.rates_of(w),
            ));
        }
        let owners: Vec<WorkerId> = self.leases.iter().filter_map(|l| l.owner.clone()).collect();
        self.obs.observe(&hbs, owners.iter(), self.now);
    }

    /// The leases `w` owns, with the fence of each.
    pub fn held_by(&self, w: &WorkerId) -> BTreeMap<LeaseKey, Fence> {
        self.leases
            .iter()
            .filter(|l| l.owner.as_ref() == Some(w))
            .map(|l| (l.key.clone(), l.fence()))
            .collect()
    }

    /// One round: every live worker decides on the same scan; then the writes
    /// land, first come first served by the fences.
    pub fn round(&mut self) -> Vec<(WorkerId, Decision)> {
        self.now += Duration::from_secs(1);
        self.beat();
        let snapshot = self.leases.clone();
        let mut decisions = Vec::new();
        for w in &self.workers {
            decisions.push((w.clone(), self.decide_on(w, &snapshot)));
        }
        self.land(&decisions);
        // Owners answer the requests before the askers' next round: real workers' rounds
        // are spread over the heartbeat interval, not in step, and an owner sees a
        // request at its own next round (the asker's heartbeat carries a change). Only
        // their answers land; the rest of this second look is theirs to redo next round.
        let asked = self.leases.clone();
        let owners: BTreeSet<&WorkerId> = asked
            .iter()
            .filter(|l| l.handoff_to.is_some())
            .filter_map(|l| l.owner.as_ref())
            .collect();
        let answers: Vec<(WorkerId, Decision)> = self
            .workers
            .iter()
            .filter(|w| owners.contains(w))
            .map(|w| {
                let d = self.decide_on(w, &asked);
                let answer = Decision {
                    hand_off: d.hand_off,
                    turn_down: d.turn_down,
                    ..Decision::default()
                };
                (w.clone(), answer)
            })
            .collect();
        self.land(&answers);
        decisions
    }

    /// What `w` decides on the scan `leases`, as its keeper would.
    fn decide_on(&self, w: &WorkerId, leases: &[Lease]) -> Decision {
        let held = self.held_by(w);
        decide(
            &Round {
                leases,
                held: &held,
                observations: &self.obs,
                me: w,
                now: self.now,
                cooling: &BTreeSet::new(),
                handing_off: &BTreeSet::new(),
                draining: self.draining.contains(w),
            },
            &self.limits,
        )
    }

    /// The writes of `decisions`, in order, each landing if its condition holds.
    fn land(&mut self, decisions: &[(WorkerId, Decision)]) {
        let index: BTreeMap<LeaseKey, usize> = self
            .leases
            .iter()
            .enumerate()
            .map(|(i, l)| (l.key.clone(), i))
            .collect();
        for (w, d) in decisions {
            for (key, fence, to) in &d.hand_off {
                let Some(&i) = index.get(key) else { continue };
                let l = &mut self.leases[i];
                if l.fence() == *fence && l.handoff_to.as_ref() == Some(to) {
                    l.owner = Some(to.clone());
                    l.counter += 1;
                    l.handoff_to = None;
                    self.moves[i] += 1;
                }
            }
            for (key, asker) in &d.turn_down {
                let Some(&i) = index.get(key) else { continue };
                if self.leases[i].handoff_to.as_ref() == Some(asker) {
                    self.leases[i].handoff_to = None;
                }
            }
            for t in &d.take {
                let Some(&i) = index.get(&t.key) else {
                    continue;
                };
                let l = &mut self.leases[i];
                if l.fence() == t.fence {
                    if l.owner.as_ref() != Some(w) && l.owner.is_some() {
                        self.moves[i] += 1;
                    }
                    l.owner = Some(w.clone());
                    l.counter += 1;
                    l.handoff_to = None;
                }
            }
            for (key, fence) in &d.request {
                let Some(&i) = index.get(key) else { continue };
                let l = &mut self.leases[i];
                if l.fence() == *fence && l.handoff_to.as_ref().is_none_or(|h| h == w) {
                    l.handoff_to = Some(w.clone());
                }
            }
        }
    }

    /// Max minus min leases over the live, non-draining workers; unowned
    /// leases count as a spread that is not settled.
    pub fn spread(&self) -> usize {
        let members: Vec<&WorkerId> = self
            .workers
            .iter()
            .filter(|w| !self.draining.contains(*w))
            .collect();
        let counts: Vec<usize> = members
            .iter()
            .map(|w| {
                self.leases
                    .iter()
                    .filter(|l| l.owner.as_ref() == Some(*w))
                    .count()
            })
            .collect();
        let unowned = self
            .leases
            .iter()
            .filter(|l| {
                l.owner
                    .as_ref()
                    .is_none_or(|o| !members.contains(&o) || self.draining.contains(o))
            })
            .count();
        let (max, min) = (
            counts.iter().copied().max().unwrap_or(0),
            counts.iter().copied().min().unwrap_or(0),
        );
        max - min + unowned * 1000
    }

    /// Runs rounds until the fleet is settled (spread at most 1, no handoff in flight): the
    /// rounds it took, or `None` when `max_rounds` were not enough.
    pub fn settle(&mut self, max_rounds: usize) -> Option<usize> {
        for r in 0..max_rounds {
            if self.spread() <= 1 && self.leases.iter().all(|l| l.handoff_to.is_none()) {
                return Some(r);
            }
            self.round();
        }
        None
    }

    /// Each live, non-draining worker's throughput under `rates` (bytes/s per lease).
    pub fn throughputs(&self, rates: &[u64]) -> BTreeMap<WorkerId, u64> {
        let mut out: BTreeMap<WorkerId, u64> = self
            .workers
            .iter()
            .filter(|w| !self.draining.contains(*w))
            .map(|w| (w.clone(), 0))
            .collect();
        for (lease, rate) in self.leases.iter().zip(rates) {
            if let Some(t) = lease.owner.as_ref().and_then(|o| out.get_mut(o)) {
                *t += rate;
            }
        }
        out
    }

    /// Rounds until one in which nobody takes, asks or hands over anything and no
    /// request is open; `None` if that takes more than `max_rounds`.
    pub fn quiet(&mut self, max_rounds: usize) -> Option<usize> {
        for r in 0..max_rounds {
            let decisions = self.round();
            let idle = decisions
                .iter()
                .all(|(_, d)| d.take.is_empty() && d.request.is_empty() && d.hand_off.is_empty());
            if idle && self.leases.iter().all(|l| l.handoff_to.is_none()) {
                return Some(r);
            }
        }
        None
    }

    /// A crash: the worker stops beating; after the failover time it is dead.
    pub fn crash(&mut self, w: &WorkerId) {
        self.workers.remove(w);
        self.draining.remove(w);
        self.crashed.insert(w.clone());
        self.now += FAILOVER;
        self.beat();
    }
}
