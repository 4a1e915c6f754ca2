//! When the lease table's legacy rows can go (`crate::backend::layout`): the keeper's
//! watch over flotilla's own rows left in the lease table by workers of an older
//! version, and the one rule that says when they are all gone.
//!
//! The rows of a worker of an older version are judged by the same rule as every
//! heartbeat ([`Observations`]: dead once its counter has stood still for the failover
//! time on this worker's clock), including rows that no roster names any more (left by
//! a retirement interrupted between its deletes), which no round reads: a scan shows
//! them, and until a scan shows them gone they count as last seen.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::layout::{LegacyRows, Retirement};
use crate::balance::Observations;
use crate::model::{Heartbeat, WorkerId, WorkerLoad};

/// What this worker knows of the lease table's legacy rows.
#[derive(Debug, Default)]
pub(crate) struct LegacyWatch {
    /// The legacy roster as last read (`None`: none), and the workers of this version
    /// writing there.
    roster: Option<Vec<WorkerId>>,
    both: BTreeSet<WorkerId>,
    /// Legacy rows of workers with no worker-table row, by their last counter.
    older: BTreeMap<WorkerId, u64>,
    /// When each of them last moved, by the liveness rule every heartbeat is judged by.
    seen: Observations,
}

impl LegacyWatch {
    /// A read's legacy rows at `now`. `complete`: a scan, which saw every row of the
    /// lease table (a round reads only the rows the legacy roster names).
    pub fn observe(&mut self, legacy: &LegacyRows, complete: bool, now: Instant) {
        self.roster.clone_from(&legacy.roster);
        if complete {
            self.older.clear();
            self.both.clear();
        }
        self.both.extend(legacy.both.iter().cloned());
        self.older
            .extend(legacy.older.iter().map(|(w, c)| (w.clone(), *c)));
        let beats: Vec<Heartbeat> = self
            .older
            .iter()
            .map(|(worker, counter)| Heartbeat {
                worker: worker.clone(),
                counter: *counter,
                load: WorkerLoad::default(),
            })
            .collect();
        self.seen.observe(&beats, [], now);
    }

    /// Whether the lease table holds legacy rows, as last seen.
    pub fn any(&self) -> bool {
        self.roster.is_some() || !self.older.is_empty() || !self.both.is_empty()
    }

    /// What to delete, once no worker of an older version is alive: every legacy row
    /// of a worker with no worker-table row has stood still for `failover_time`. Only
    /// the first live member retires (`members`, as for dead heartbeat rows), so a
    /// fleet does not race to write the same deletes; the deletes are conditional
    /// anyway (the roster on its names, an older worker's row on its counter).
    pub fn retirement(
        &self,
        me: &WorkerId,
        members: &BTreeSet<WorkerId>,
        now: Instant,
        failover_time: Duration,
    ) -> Option<Retirement> {
        if !self.any() || members.first() != Some(me) {
            return None;
        }
        let all_dead = self
            .older
            .keys()
            .all(|worker| !self.seen.is_alive(worker, now, failover_time));
        if !all_dead {
            return None;
        }
        let mut rows: Vec<(WorkerId, Option<u64>)> = self
            .older
            .iter()
            .map(|(worker, counter)| (worker.clone(), Some(*counter)))
            .collect();
        rows.extend(self.both.iter().map(|worker| (worker.clone(), None)));
        Some(Retirement {
            roster: self.roster.clone(),
            rows,
        })
    }

    /// The rows were retired: nothing is left to watch until a read finds some again.
    pub fn retired(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: &str) -> WorkerId {
        WorkerId::new(id)
    }

    #[tokio::test(start_paused = true)]
    async fn legacy_rows_go_once_every_older_worker_stood_still_for_the_failover_time() {
        let failover = Duration::from_secs(10);
        let me = w("a");
        let members = BTreeSet::from([me.clone(), w("b")]);
        let mut watch = LegacyWatch::default();
        let t0 = Instant::now();
        assert_eq!(watch.retirement(&me, &members, t0, failover), None);

        // An older worker's row, named in the legacy roster beside a worker of this
        // version writing both places.
        let rows = |older_counter: u64| LegacyRows {
            roster: Some(vec![w("old"), w("b")]),
            older: vec![(w("old"), older_counter)],
            both: vec![w("b")],
        };
        watch.observe(&rows(5), true, t0);
        assert!(watch.any());
        // Alive: its counter moves.
        watch.observe(&rows(6), false, t0 + Duration::from_secs(8));
        assert_eq!(
            watch.retirement(&me, &members, t0 + Duration::from_secs(17), failover),
            None,
            "an older worker that moved 9 s ago is alive"
        );
        watch.observe(&rows(6), false, t0 + Duration::from_secs(18));
        let plan = watch
            .retirement(&me, &members, t0 + Duration::from_secs(18), failover)
            .expect("the older worker stood still for the failover time");
        assert_eq!(plan.roster, Some(vec![w("old"), w("b")]));
        assert_eq!(plan.rows, vec![(w("old"), Some(6)), (w("b"), None)]);
        // Only the first member retires.
        assert_eq!(
            watch.retirement(&w("b"), &members, t0 + Duration::from_secs(18), failover),
            None
        );
        watch.retired();
        assert!(!watch.any());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stray_row_no_roster_names_is_judged_and_retired_too() {
        let failover = Duration::from_secs(10);
        let me = w("a");
        let members = BTreeSet::from([me.clone()]);
        let mut watch = LegacyWatch::default();
        let t0 = Instant::now();
        let stray = LegacyRows {
            roster: None,
            older: vec![(w("old"), 3)],
            both: vec![],
        };
        watch.observe(&stray, true, t0);
        // A round reads no row the roster does not name: the stray stays watched.
        watch.observe(&LegacyRows::default(), false, t0 + Duration::from_secs(5));
        assert_eq!(
            watch.retirement(&me, &members, t0 + Duration::from_secs(5), failover),
            None
        );
        let plan = watch
            .retirement(&me, &members, t0 + Duration::from_secs(10), failover)
            .expect("stood still for the failover time");
        assert_eq!(plan.roster, None);
        assert_eq!(plan.rows, vec![(w("old"), Some(3))]);
        // A scan that no longer shows it forgets it.
        watch.observe(&LegacyRows::default(), true, t0 + Duration::from_secs(11));
        assert!(!watch.any());
    }
}
