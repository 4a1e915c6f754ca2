//! The round's cadence and what the last scan saw. Each round reads the heartbeat rows
//! (the roster's, by key or through the index), and scans the table only when
//! `pure::scan_due` finds something changed since its last scan, so reads grow with
//! workers, not with shards, while nothing moves. Rows read by a scan serve the rounds
//! after it until the next. This part keeps what those rounds compare against (peers'
//! marks, long-free leases, this worker's changes, each worker's totals as of the scan
//! and of the last whole read) and the timers that bring a round early: the handoff
//! poll and the scan at the moment an owner of leases would turn dead.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{HeartbeatDetail, HeartbeatsOutput};
use crate::balance::{Observations, Policy};
use crate::model::{Heartbeat, Lease, LeaseKey, WorkerId};
use crate::settings::LeaseSettings;

use super::pure::{self, PeerMark, ReadState, ScanWhy};

/// What the last scan found, kept for the rounds that read only the heartbeat rows.
pub(super) struct LastScan {
    pub sent: Instant,
    /// Every lease row, for the fleet view (and the watcher).
    pub leases: Arc<Vec<Lease>>,
    /// The rows the round dealt with (`pure::dealt`).
    pub dealt: Vec<Lease>,
    pub unreadable: BTreeMap<LeaseKey, String>,
    pub orphans: BTreeMap<LeaseKey, String>,
}

/// What a round compares against, and its timers.
#[derive(Default)]
pub(super) struct Rounds {
    /// A `PollHandoffs` is on its way.
    polling: bool,
    /// A scan is due at this instant: the moment an owner of leases would turn dead.
    deadline_scan: Option<Instant>,
    /// The watcher (or a finished drain of legacy rows, a former stream's rows turning
    /// due) asked for a scan.
    pub asked: bool,
    /// This worker's change counter as of its last scan.
    changes_at_scan: u64,
    /// Peers' marks as of the last scan (see `pure::scan_due`).
    marks_at_scan: BTreeMap<WorkerId, PeerMark>,
    /// Leases long free as of the last scan: one turning so since asks for a scan.
    long_free_at_scan: BTreeSet<LeaseKey>,
    /// The last scan, which rounds without one act and report on.
    last_scan: Option<LastScan>,
    /// When the heartbeat rows were last read whole (lags and rates included: a scan
    /// or a `HeartbeatDetail::Full` read), as opposed to through the index.
    whole_read: Option<Instant>,
    /// Each worker's total records/s as of the last heartbeat read, and as of the last
    /// whole read: whether a round reads whole rows (`pure::heartbeat_detail`).
    totals: BTreeMap<WorkerId, u64>,
    totals_at_whole: BTreeMap<WorkerId, u64>,
    /// Each worker's lease count as of the last heartbeat read.
    lease_counts: BTreeMap<WorkerId, u64>,
}

/// What this worker observes now, as the round's decisions need it.
pub(super) struct Seen<'a> {
    pub observations: &'a Observations,
    pub me: &'a WorkerId,
    pub now: Instant,
    pub failover: Duration,
}

impl Seen<'_> {
    /// Each peer's mark as this worker sees it now (`pure::PeerMark`).
    pub fn marks(&self) -> BTreeMap<WorkerId, PeerMark> {
        self.observations
            .peers(self.now, self.failover)
            .into_iter()
            .filter(|p| p.worker != *self.me)
            .map(|p| {
                let mark = PeerMark {
                    alive: p.alive,
                    draining: p.load.draining,
                    changes: p.has_heartbeat.then_some(p.load.changes),
                };
                (p.worker, mark)
            })
            .collect()
    }

    /// Those of `leases` that have had no live owner for the failover time.
    pub fn long_free(&self, leases: &[Lease]) -> BTreeSet<LeaseKey> {
        leases
            .iter()
            .filter(|l| self.observations.long_free(&l.key, self.now, self.failover))
            .map(|l| l.key.clone())
            .collect()
    }
}

/// Each worker's total records/s, as its heartbeat row says.
fn totals(heartbeats: &[Heartbeat]) -> BTreeMap<WorkerId, u64> {
    heartbeats
        .iter()
        .map(|h| (h.worker.clone(), h.load.records_per_second))
        .collect()
}

impl Rounds {
    /// How much of each heartbeat row this round reads (`pure::heartbeat_detail`).
    pub fn detail(
        &self,
        policy: &Policy,
        sent: Instant,
        rebalance_every: Duration,
        watched: bool,
    ) -> HeartbeatDetail {
        pure::heartbeat_detail(
            policy,
            self.whole_read.map(|at| sent.saturating_duration_since(at)),
            rebalance_every,
            &pure::Totals {
                now: &self.totals,
                at_whole: &self.totals_at_whole,
                leases: &self.lease_counts,
            },
            watched,
        )
    }

    /// The heartbeat rows a round read (sent at `sent`): totals noted, and a read
    /// through the index filled with lags and rates as last read whole.
    pub fn heard(
        &mut self,
        out: &mut HeartbeatsOutput,
        sent: Instant,
        observations: &Observations,
    ) {
        self.totals = totals(&out.heartbeats);
        self.lease_counts = out
            .heartbeats
            .iter()
            .map(|h| (h.worker.clone(), h.load.leases))
            .collect();
        if out.summary {
            for heartbeat in &mut out.heartbeats {
                if let Some(whole) = observations.load_of(&heartbeat.worker) {
                    heartbeat.load.fill_unread(whole);
                }
            }
        } else {
            self.whole_read = Some(sent);
            self.totals_at_whole.clone_from(&self.totals);
        }
    }

    /// Feeds a round's heartbeats to the observations, with the owners and rows of the
    /// last scan (which still stand).
    pub fn observe(
        &self,
        observations: &mut Observations,
        heartbeats: &[Heartbeat],
        now: Instant,
        failover: Duration,
    ) {
        let owners: Vec<WorkerId> = self
            .last_scan
            .iter()
            .flat_map(|l| l.dealt.iter().filter_map(|l| l.owner.clone()))
            .collect();
        observations.observe(heartbeats, &owners, now);
        if let Some(last) = &self.last_scan {
            observations.observe_leases(&last.dealt, now, failover);
        }
    }

    /// The rows the last scan dealt with, if there was one.
    pub fn last_dealt(&self) -> Option<&[Lease]> {
        self.last_scan.as_ref().map(|l| &l.dealt[..])
    }

    /// Whether this round scans, and why (`pure::scan_due`). `changes`: this worker's
    /// change counter now; `cooled`, `would_move`, `awaiting_reread`: as the other parts
    /// and the fencing board say.
    pub fn scan_why(
        &self,
        seen: &Seen<'_>,
        changes: u64,
        awaiting_reread: bool,
        cooled: bool,
        would_move: bool,
        settings: &LeaseSettings,
    ) -> Option<ScanWhy> {
        let dealt = self.last_dealt().unwrap_or(&[]);
        pure::scan_due(&ReadState {
            since_scan: self
                .last_scan
                .as_ref()
                .map(|l| seen.now.saturating_duration_since(l.sent)),
            asked: self.asked,
            own_changes: (changes, self.changes_at_scan),
            marks: &seen.marks(),
            marks_at_scan: &self.marks_at_scan,
            long_free: &seen.long_free(dealt),
            long_free_at_scan: &self.long_free_at_scan,
            awaiting_reread,
            cooled,
            would_move,
            rebalance_every: settings.failover_time,
            full_scan_interval: settings.full_scan_interval,
        })
    }

    /// A scan sent at `sent` came back: it covers the changes made before it
    /// (`changes_before`) and the watcher's request, and read every heartbeat row whole.
    pub fn scanned(&mut self, sent: Instant, changes_before: u64, heartbeats: &[Heartbeat]) {
        self.asked = false;
        self.changes_at_scan = changes_before;
        self.whole_read = Some(sent);
        self.totals = totals(heartbeats);
        self.totals_at_whole.clone_from(&self.totals);
    }

    /// Keeps the scan for the rounds until the next, with what they compare against.
    pub fn settle(&mut self, seen: &Seen<'_>, last: LastScan) {
        self.marks_at_scan = seen.marks();
        self.long_free_at_scan = seen.long_free(&last.dealt);
        self.last_scan = Some(last);
    }

    /// Lends the last scan out (a quiet round republishes it); `restore` puts it back.
    pub fn take_last(&mut self) -> Option<LastScan> {
        self.last_scan.take()
    }

    pub fn restore(&mut self, last: LastScan) {
        self.last_scan = Some(last);
    }

    /// Whether to send a `PollHandoffs` now: only one is on its way at a time, and only
    /// while something waits on one (`waiting`: a request made, a drain on).
    pub fn arm_poll(&mut self, waiting: bool, stopped: bool) -> bool {
        if self.polling || stopped || !waiting {
            return false;
        }
        self.polling = true;
        true
    }

    /// The `PollHandoffs` arrived.
    pub fn polled(&mut self) {
        self.polling = false;
    }

    /// When to send a `Deadline` for the moment the first owner of `leases` (another
    /// worker, of an unfinished lease) would turn dead, so its leases move at the
    /// failover time rather than at the next heartbeat tick after it (which could add a
    /// whole interval to every failover); `None` when one is on its way already or none
    /// is near.
    pub fn arm_deadline(
        &mut self,
        leases: &[Lease],
        seen: &Seen<'_>,
        interval: Duration,
    ) -> Option<Duration> {
        let dead_at = leases
            .iter()
            .filter(|l| !l.checkpoint.is_shard_end())
            .filter(|l| l.owner.as_ref().is_some_and(|o| o != seen.me))
            .filter_map(|l| seen.observations.lease_dead_at(l, seen.failover));
        let now = seen.now;
        let pending = self.deadline_scan.filter(|at| *at > now);
        self.deadline_scan = pending;
        let next = pure::deadline_scan(dead_at, now, pending, interval)?;
        self.deadline_scan = Some(next);
        Some(next - now + Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    /// One `PollHandoffs` on its way at a time, and only while something waits on one.
    #[test]
    fn one_poll_at_a_time() {
        let mut rounds = Rounds::default();
        assert!(!rounds.arm_poll(false, false), "nothing waits");
        assert!(!rounds.arm_poll(true, true), "stopped");
        assert!(rounds.arm_poll(true, false));
        assert!(!rounds.arm_poll(true, false), "one is on its way");
        rounds.polled();
        assert!(rounds.arm_poll(true, false));
    }

    /// A scan covers the changes made before it: a round after it scans again only
    /// for a change made since, or when asked.
    #[tokio::test(start_paused = true)]
    async fn a_scan_covers_the_changes_made_before_it() {
        let settings = Settings::default();
        let observations = Observations::with_java_compat(false);
        let me = WorkerId::new("me");
        let now = Instant::now();
        let seen = Seen {
            observations: &observations,
            me: &me,
            now,
            failover: settings.lease.failover_time,
        };
        let mut rounds = Rounds::default();
        let why =
            |r: &Rounds, changes| r.scan_why(&seen, changes, false, false, false, &settings.lease);
        assert_eq!(why(&rounds, 0), Some(ScanWhy::First));
        rounds.asked = true;
        rounds.scanned(now, 3, &[]);
        rounds.settle(
            &seen,
            LastScan {
                sent: now,
                leases: Arc::new(Vec::new()),
                dealt: Vec::new(),
                unreadable: BTreeMap::new(),
                orphans: BTreeMap::new(),
            },
        );
        assert_eq!(why(&rounds, 3), None, "nothing changed since the scan");
        assert_eq!(why(&rounds, 4), Some(ScanWhy::OwnChange));
        rounds.asked = true;
        assert_eq!(why(&rounds, 3), Some(ScanWhy::Asked));
    }
}
