//! Where flotilla keeps its own rows, and how a table moves from the old place to the new.
//!
//! The lease table holds lease rows only, so that the Java KCL, which reads every row of
//! it as a lease (`DynamoDBLeaseRefresher.listLeases` → `DynamoDBLeaseSerializer
//! .fromDynamoRecord`, which throws on a row without `leaseCounter`), can share it with
//! flotilla and take it back. flotilla's own rows, one heartbeat row per worker and the
//! roster naming them, live in a table of their own, the *worker table*
//! ([`worker_table_name`]), as the KCL 3.x keeps its worker metrics and coordinator
//! state in tables of its own for the same reason.
//!
//! Versions of flotilla before the worker table kept those rows in the lease table
//! itself (the *legacy rows*: `flotilla-roster` and `flotilla-worker#ID`). A worker of
//! this version beside one of those neither breaks it nor is broken by it:
//!
//! * it reads the legacy roster with every round's heartbeat read (one more key in the
//!   same BatchGetItem), and the legacy heartbeat rows of the workers it names that have
//!   no row in the worker table (workers of the older version), merged with its own
//!   table's ([`merge`]): it sees them alive and takes a lease from one only while its
//!   legacy row still stands ([`beat_checks`]);
//! * while a legacy roster exists, it writes its heartbeat in both places, the legacy
//!   row with the counter its worker-table row just got, and names itself in the legacy
//!   roster ([`Dual`]): the older worker sees it as it sees any peer, and its take from
//!   a dead one stays conditional on the row it reads. A heartbeat is confirmed (and
//!   lifts the fence) only once both writes are;
//! * once every worker of the older version is gone (no legacy-only heartbeat row that
//!   is still moving), the first live member deletes the legacy roster, conditional on
//!   it naming exactly the workers it read, then the legacy heartbeat rows
//!   (`lease_keeper::legacy::LegacyWatch::retirement`): the table is in the new layout, and
//!   the KCL can read it again. The others stop writing there when they find the roster
//!   gone, and delete their own legacy row. A worker of the older version that starts
//!   later writes the roster again, and the workers of this version go back to writing
//!   both.

use crate::model::WorkerId;

/// The suffix of the worker table's name: the lease table `orders` keeps flotilla's
/// heartbeats in `orders-FlotillaWorkers` (the KCL 3.x names its own tables
/// `APP-WorkerMetricStats` and `APP-CoordinatorState`).
pub const WORKER_TABLE_SUFFIX: &str = "-FlotillaWorkers";

/// The worker table that goes with the lease table `lease_table`.
pub fn worker_table_name(lease_table: &str) -> String {
    format!("{lease_table}{WORKER_TABLE_SUFFIX}")
}

/// flotilla's own rows found in the lease table, left there by workers of a version
/// before the worker table (or by this version writing beside them): what a read saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LegacyRows {
    /// The legacy roster row's names; `None` when the lease table has no roster row.
    pub roster: Option<Vec<WorkerId>>,
    /// Legacy heartbeat rows of workers with no row in the worker table (workers of the
    /// older version, alive or dead), with their counters. They are merged into the
    /// read's heartbeats and judged like any other.
    pub older: Vec<(WorkerId, u64)>,
    /// Workers with a legacy heartbeat row (or named in the legacy roster) that also
    /// have a row in the worker table: this version, writing both places.
    pub both: Vec<WorkerId>,
}

impl LegacyRows {
    /// Whether the lease table holds none of flotilla's own rows.
    pub fn is_empty(&self) -> bool {
        self.roster.is_none() && self.older.is_empty() && self.both.is_empty()
    }
}

/// What [`crate::backend::WorkerRows::retire_legacy`] removes from the lease table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retirement {
    /// The legacy roster as read (`None`: there was none): deleted only while it names
    /// exactly these workers, so an older worker that joined meanwhile keeps it.
    pub roster: Option<Vec<WorkerId>>,
    /// Legacy heartbeat rows to delete: `Some(counter)` only while the row's counter is
    /// still that (a dead worker of the older version); `None` whatever it holds (a
    /// worker of this version, which also writes the worker table).
    pub rows: Vec<(WorkerId, Option<u64>)>,
}

/// Which table a heartbeat condition is checked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The worker table.
    Workers,
    /// The lease table (a legacy heartbeat row).
    Legacy,
}

/// A condition on one heartbeat row, checked in the same transaction as a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatCheck {
    /// The row does not exist.
    Absent,
    /// The row's counter is exactly this.
    Equals(u64),
    /// The row does not exist, or its counter is exactly this.
    AbsentOrEquals(u64),
    /// The row does not exist, or its counter is at most this.
    AbsentOrAtMost(u64),
}

impl BeatCheck {
    /// Whether a row with `counter` (`None`: no row) passes.
    pub fn holds(self, counter: Option<u64>) -> bool {
        match (self, counter) {
            (BeatCheck::Absent, c) => c.is_none(),
            (BeatCheck::Equals(want), c) => c == Some(want),
            (BeatCheck::AbsentOrEquals(_), None) | (BeatCheck::AbsentOrAtMost(_), None) => true,
            (BeatCheck::AbsentOrEquals(want), Some(c)) => c == want,
            (BeatCheck::AbsentOrAtMost(want), Some(c)) => c <= want,
        }
    }
}

/// The heartbeat conditions of a take from an owner judged dead, whose heartbeat
/// counter the taker saw standing at `seen` (`None`: it had no row), given whether the
/// lease table may hold legacy rows.
///
/// Without legacy rows: the worker-table row is still at `seen` (or still absent), as
/// before. With them, the owner's counter came from one of two rows: its worker-table
/// row (this version; its legacy row, when it has one, carries the same counter or an
/// older one, since it is written after it) or its legacy row (the older version; no
/// worker-table row). So: the worker-table row is absent or at `seen`, and the legacy
/// row is absent or at most `seen`. A live owner of either version moved the row it
/// writes past `seen`, and the take fails.
pub fn beat_checks(seen: Option<u64>, legacy: bool) -> Vec<(Place, BeatCheck)> {
    match (seen, legacy) {
        (None, false) => vec![(Place::Workers, BeatCheck::Absent)],
        (None, true) => vec![
            (Place::Workers, BeatCheck::Absent),
            (Place::Legacy, BeatCheck::Absent),
        ],
        (Some(c), false) => vec![(Place::Workers, BeatCheck::Equals(c))],
        (Some(c), true) => vec![
            (Place::Workers, BeatCheck::AbsentOrEquals(c)),
            (Place::Legacy, BeatCheck::AbsentOrAtMost(c)),
        ],
    }
}

/// The heartbeats a read returns: every worker-table row, and the legacy row of each
/// worker the legacy roster names that has none there. The legacy rows of workers
/// the legacy roster does not name (left by an interrupted retirement) are reported in
/// `older` but not merged: no older worker writes a row without naming itself.
pub fn merge(
    mut own: Vec<crate::model::Heartbeat>,
    legacy_roster: Option<Vec<WorkerId>>,
    legacy: Vec<crate::model::Heartbeat>,
) -> (Vec<crate::model::Heartbeat>, LegacyRows) {
    let mut rows = LegacyRows {
        roster: legacy_roster,
        ..LegacyRows::default()
    };
    let has_own =
        |w: &WorkerId, own: &[crate::model::Heartbeat]| own.iter().any(|h| &h.worker == w);
    for beat in legacy {
        if has_own(&beat.worker, &own) {
            if !rows.both.contains(&beat.worker) {
                rows.both.push(beat.worker);
            }
            continue;
        }
        rows.older.push((beat.worker.clone(), beat.counter));
        let named = rows
            .roster
            .as_ref()
            .is_some_and(|names| names.contains(&beat.worker));
        if named {
            own.push(beat);
        }
    }
    if let Some(names) = &rows.roster {
        for name in names {
            if has_own(name, &own)
                && !rows.both.contains(name)
                && !rows.older.iter().any(|(w, _)| w == name)
            {
                rows.both.push(name.clone());
            }
        }
    }
    (own, rows)
}

/// What a worker's heartbeat writes in the lease table besides its worker-table row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyWrite {
    /// Nothing: there is no legacy roster (the usual case).
    Nothing,
    /// Its legacy row, created or overwritten with the new counter, and its name in the
    /// legacy roster: the first write after a legacy roster was found.
    Join,
    /// Its legacy row, with the new counter, only while the row exists (it is gone if
    /// the legacy rows were retired meanwhile).
    Update,
    /// Its own legacy row deleted: the legacy roster is gone, the row it wrote is not.
    Leave,
}

/// A worker's state towards the legacy rows: whether it writes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dual {
    /// A legacy roster was there at the last read.
    roster_seen: bool,
    /// This worker's legacy row may exist (it wrote one and has not deleted it).
    written: bool,
}

impl Dual {
    /// A read of the lease table found the legacy roster (`true`) or found none.
    pub fn saw_roster(&mut self, present: bool) {
        self.roster_seen = present;
    }

    /// Whether legacy rows may be there: takes then check them too ([`beat_checks`]).
    pub fn legacy(&self) -> bool {
        self.roster_seen || self.written
    }

    /// What the next heartbeat writes in the lease table.
    pub fn next(&self) -> LegacyWrite {
        match (self.roster_seen, self.written) {
            (false, false) => LegacyWrite::Nothing,
            (true, false) => LegacyWrite::Join,
            (true, true) => LegacyWrite::Update,
            (false, true) => LegacyWrite::Leave,
        }
    }

    /// `write` was done. `existed`: for an `Update`, whether the row was still there
    /// (if not, the legacy rows were retired: nothing more is written until a read finds
    /// a roster again).
    pub fn done(&mut self, write: LegacyWrite, existed: bool) {
        match write {
            LegacyWrite::Nothing => {}
            LegacyWrite::Join => self.written = true,
            LegacyWrite::Update if !existed => {
                self.written = false;
                self.roster_seen = false;
            }
            LegacyWrite::Update => {}
            LegacyWrite::Leave => self.written = false,
        }
    }

    /// This worker's own legacy row was removed (a clean exit, or a retirement it made).
    pub fn removed(&mut self) {
        self.written = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Heartbeat, WorkerLoad};

    fn w(id: &str) -> WorkerId {
        WorkerId::new(id)
    }

    fn beat(id: &str, counter: u64) -> Heartbeat {
        Heartbeat {
            worker: w(id),
            counter,
            load: WorkerLoad::default(),
        }
    }

    #[test]
    fn beat_checks_stop_a_take_whenever_the_owners_row_moved() {
        // (seen, legacy place in use, owner's worker-table row, owner's legacy row, take allowed)
        type Case = (Option<u64>, bool, Option<u64>, Option<u64>, bool);
        let table: [Case; 14] = [
            // No legacy rows: the worker-table row alone, exactly as seen.
            (Some(5), false, Some(5), None, true),
            (Some(5), false, Some(6), None, false),
            (Some(5), false, None, None, false),
            (None, false, None, None, true),
            (None, false, Some(1), None, false),
            // A worker of this version writing both: its legacy row trails or equals.
            (Some(5), true, Some(5), Some(5), true),
            (Some(5), true, Some(5), Some(4), true),
            (Some(5), true, Some(6), Some(6), false),
            (Some(5), true, Some(6), Some(5), false),
            // A worker of the older version: a legacy row only.
            (Some(5), true, None, Some(5), true),
            (Some(5), true, None, Some(6), false),
            // No row seen: none may have appeared in either place.
            (None, true, None, None, true),
            (None, true, None, Some(1), false),
            (None, true, Some(1), None, false),
        ];
        for (seen, legacy, own, old, allowed) in table {
            let holds = beat_checks(seen, legacy).iter().all(|(place, check)| {
                check.holds(match place {
                    Place::Workers => own,
                    Place::Legacy => old,
                })
            });
            assert_eq!(
                holds, allowed,
                "seen {seen:?}, legacy {legacy}, rows {own:?} / {old:?}"
            );
        }
    }

    #[test]
    fn merge_prefers_the_worker_table_and_adds_named_older_workers() {
        let (beats, rows) = merge(
            vec![beat("new", 9)],
            Some(vec![w("new"), w("old"), w("gone")]),
            vec![beat("new", 8), beat("old", 3), beat("stray", 7)],
        );
        let merged: Vec<(String, u64)> = beats
            .iter()
            .map(|b| (b.worker.as_str().to_owned(), b.counter))
            .collect();
        assert_eq!(merged, [("new".into(), 9), ("old".into(), 3)]);
        assert_eq!(rows.older, [(w("old"), 3), (w("stray"), 7)]);
        assert_eq!(rows.both, [w("new")]);
        assert!(!rows.is_empty());
        let (_, none) = merge(vec![beat("new", 1)], None, vec![]);
        assert!(none.is_empty());
    }

    #[test]
    fn a_worker_writes_the_legacy_rows_only_while_a_legacy_roster_is_there() {
        let mut dual = Dual::default();
        assert_eq!(dual.next(), LegacyWrite::Nothing);
        assert!(!dual.legacy());
        dual.saw_roster(true);
        assert!(dual.legacy());
        assert_eq!(dual.next(), LegacyWrite::Join);
        dual.done(LegacyWrite::Join, true);
        assert_eq!(dual.next(), LegacyWrite::Update);
        dual.done(LegacyWrite::Update, true);
        assert_eq!(dual.next(), LegacyWrite::Update);
        // Retired under it: the conditional update finds no row and stops writing.
        dual.done(LegacyWrite::Update, false);
        assert_eq!(dual.next(), LegacyWrite::Nothing);
        // An older worker came back: the roster is read again, and it joins again.
        dual.saw_roster(true);
        assert_eq!(dual.next(), LegacyWrite::Join);
        dual.done(LegacyWrite::Join, true);
        // The roster went away (another worker retired it): its own row is deleted once.
        dual.saw_roster(false);
        assert!(dual.legacy());
        assert_eq!(dual.next(), LegacyWrite::Leave);
        dual.done(LegacyWrite::Leave, true);
        assert_eq!(dual.next(), LegacyWrite::Nothing);
        assert!(!dual.legacy());
    }
}
