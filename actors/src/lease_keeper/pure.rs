//! The lease keeper's pure core: from a scan to the actions the keeper performs.
//!
//! A round goes scan → observations (`balance::Observations`, fed by the actor) →
//! decision (`balance::decide`) → actions (here): which rows the round may deal, what
//! each lease in the decision becomes as an action with its reason, and the rules the
//! keeper applies around the round (deadline scans, when a drain is over, when an
//! unconfirmed heartbeat is reported). Nothing here awaits, reads a clock or writes
//! the table: the actor gathers the inputs, calls these, and does the writes in the
//! order given.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::balance::{Decision, Gain, Policy};
use crate::model::{Fence, Lease, LeaseKey, WorkerId};
use crate::protocol::LeaseMove;

/// The rows a round deals with: not orphans, and not rows the last listing does not
/// show yet (unless held: a held lease is always accounted for). Only a shard the
/// stream is known to have is dealt, taken or counted in anyone's share.
pub(crate) fn dealt<'a>(
    leases: &'a [Lease],
    orphans: &BTreeMap<LeaseKey, String>,
    unlisted: &BTreeSet<LeaseKey>,
    held: &BTreeMap<LeaseKey, Fence>,
) -> Vec<&'a Lease> {
    leases
        .iter()
        .filter(|l| !orphans.contains_key(&l.key))
        .filter(|l| !unlisted.contains(&l.key) || held.contains_key(&l.key))
        .collect()
}

/// One thing the keeper does after a round, in the order it does them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// A lease this worker owns by name but does not run: release it.
    Release { key: LeaseKey, fence: Fence },
    /// A held lease is not this worker's any more: revoke it on the fencing board
    /// first, then tell the supervisor.
    Revoke {
        key: LeaseKey,
        /// For the fencing board and the log.
        why: String,
        reason: LeaseMove,
        /// Who has it now, when the row names someone.
        to: Option<WorkerId>,
        /// The row's parse error, when it is unreadable.
        unreadable: Option<String>,
    },
    /// A request from a dead or leaving worker: clear it.
    TurnDown { key: LeaseKey, asker: WorkerId },
    /// A live worker asked: stop the shard gracefully and pass the lease on.
    HandOff {
        key: LeaseKey,
        fence: Fence,
        to: WorkerId,
    },
    /// Take a lease. `expired_from`: the dead owner whose heartbeat must still stand
    /// where it was seen standing (`take_expired`); `None` for a plain conditional take.
    Take {
        key: LeaseKey,
        fence: Fence,
        why: Gain,
        expired_from: Option<WorkerId>,
    },
    /// Ask a live owner for a lease.
    Request { key: LeaseKey, fence: Fence },
}

/// The round's decision as actions: releases, losses, turn-downs, handoffs, takes,
/// requests (losses before anything is taken, so the board never holds both).
pub(crate) fn actions(
    decision: Decision,
    rows: &BTreeMap<&LeaseKey, &Lease>,
    unreadable: &BTreeMap<LeaseKey, String>,
    requested: &BTreeSet<LeaseKey>,
    me: &WorkerId,
) -> Vec<Action> {
    let mut out = Vec::new();
    for (key, fence) in decision.release {
        out.push(Action::Release { key, fence });
    }
    for key in decision.lost {
        let row = rows.get(&key).copied();
        let bad = unreadable.get(&key).cloned();
        let (why, reason) = lost_reason(row, bad.as_deref());
        out.push(Action::Revoke {
            to: row.and_then(|l| l.owner.clone()),
            key,
            why,
            reason,
            unreadable: bad,
        });
    }
    for (key, asker) in decision.turn_down {
        out.push(Action::TurnDown { key, asker });
    }
    for (key, fence, to) in decision.hand_off {
        out.push(Action::HandOff { key, fence, to });
    }
    for take in decision.take {
        let why = take_reason(take.why, requested.contains(&take.key));
        let expired_from = expired_from(why, &take.fence, me);
        out.push(Action::Take {
            key: take.key,
            fence: take.fence,
            why,
            expired_from,
        });
    }
    for (key, fence) in decision.request {
        out.push(Action::Request { key, fence });
    }
    out
}

/// Why a held lease is lost, for the board and the log, and how it counts.
pub(crate) fn lost_reason(row: Option<&Lease>, unreadable: Option<&str>) -> (String, LeaseMove) {
    match (row, unreadable) {
        (_, Some(bad)) => (
            format!("its row is unreadable: {bad}"),
            LeaseMove::Unreadable,
        ),
        (Some(l), None) => (
            format!(
                "the row names owner {} with counter {}",
                l.owner.as_ref().map(|o| o.as_str()).unwrap_or("nobody"),
                l.counter
            ),
            LeaseMove::Lost,
        ),
        (None, None) => ("its row was deleted".to_owned(), LeaseMove::Lost),
    }
}

/// A lease already this worker's by name that it had asked for came by handoff.
pub(crate) fn take_reason(why: Gain, requested: bool) -> Gain {
    if why == Gain::Resumed && requested {
        Gain::HandedOff
    } else {
        why
    }
}

/// The owner a take must check the heartbeat of: only a lease taken because its owner
/// (another worker) stood still. A take sent just before the owner resumed must not
/// land after the owner re-read its rows (`lease_keeper/model.rs`).
pub(crate) fn expired_from(why: Gain, fence: &Fence, me: &WorkerId) -> Option<WorkerId> {
    match (why, &fence.owner) {
        (Gain::Expired, Some(owner)) if owner != me => Some(owner.clone()),
        _ => None,
    }
}

/// Who a taken lease came from: the owner asked, when the row already named this
/// worker (a handoff); otherwise the owner the row named.
pub(crate) fn gained_from(
    fence: &Fence,
    asked: Option<WorkerId>,
    me: &WorkerId,
) -> Option<WorkerId> {
    match (&fence.owner, asked) {
        (Some(owner), Some(asked)) if owner == me => Some(asked),
        (owner, _) => owner.clone(),
    }
}

/// Whether a request this worker made is still worth waiting for: the row still names
/// this worker as asker or owner.
pub(crate) fn request_open(row: Option<&Lease>, me: &WorkerId) -> bool {
    row.is_some_and(|l| l.handoff_to.as_ref() == Some(me) || l.owner.as_ref() == Some(me))
}

/// When to scan off the regular schedule: the moment the first owner of unfinished
/// leases would turn dead, if that comes before the next regular scan and before any
/// deadline scan already pending. A failover then happens at the failover time, not
/// up to a heartbeat interval after it.
pub(crate) fn deadline_scan(
    dead_at: impl IntoIterator<Item = Instant>,
    now: Instant,
    pending: Option<Instant>,
    heartbeat_interval: Duration,
) -> Option<Instant> {
    let next = dead_at.into_iter().filter(|at| *at > now).min()?;
    if pending.is_some_and(|p| p > now && p <= next) {
        return None;
    }
    (next < now + heartbeat_interval).then_some(next)
}

/// What a peer's heartbeat shows that bears on the lease rows: while no mark changes,
/// no lease row has changed owner or request (every such write is followed by its
/// writer's heartbeat with a higher `changes`), nobody joined, left, started draining
/// or died, so the rows read last are still the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerMark {
    /// On this worker's clock (`balance::Observations`).
    pub alive: bool,
    pub draining: bool,
    /// `WorkerLoad::changes`; `None` for an owner with no heartbeat row.
    pub changes: Option<u64>,
}

/// Why a round reads every row of the table rather than the heartbeat rows only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScanWhy {
    /// No scan yet.
    First,
    /// The watcher made rows or has a new listing, or a deadline or drain asked.
    Asked,
    /// This worker changed an ownership since its last scan.
    OwnChange,
    /// A peer's mark changed: its change counter, draining, alive or dead, joined, gone.
    FleetChanged,
    /// A held lease waits for a read sent after a heartbeat gap (self-fencing (2)).
    Reread,
    /// A lease's cooldown ended: it may be taken again.
    Cooled,
    /// A lease of the last scan has now had no live owner for the failover time
    /// (dealt to a worker that did not take it): anyone may take it.
    LongFree,
    /// The last scan's rows, with the heartbeats just read, would move a lease
    /// (throughput balance: published rates changed while no ownership did). At most
    /// once per `rebalance_every`, so a spread no move can fix does not scan each round.
    Rebalance,
    /// `full_scan_interval` passed since the last scan: the safety net.
    Backstop,
    /// The heartbeat rows could not be read (the roster read failed): scan as before.
    Unread,
}

impl ScanWhy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ScanWhy::First => "first",
            ScanWhy::Asked => "asked",
            ScanWhy::OwnChange => "own_change",
            ScanWhy::FleetChanged => "fleet_changed",
            ScanWhy::Reread => "reread",
            ScanWhy::Cooled => "cooled",
            ScanWhy::LongFree => "long_free",
            ScanWhy::Rebalance => "rebalance",
            ScanWhy::Backstop => "backstop",
            ScanWhy::Unread => "heartbeats_unread",
        }
    }
}

/// What the keeper knows at the start of a round, after reading the heartbeat rows.
#[derive(Debug, Clone)]
pub(crate) struct ReadState<'a> {
    /// When the last scan was sent; `None`: never.
    pub since_scan: Option<Duration>,
    pub asked: bool,
    /// This worker's change counter now, and as of its last scan.
    pub own_changes: (u64, u64),
    /// Each peer's mark now, and as of the last scan (this worker left out of both).
    pub marks: &'a BTreeMap<WorkerId, PeerMark>,
    pub marks_at_scan: &'a BTreeMap<WorkerId, PeerMark>,
    pub long_free: &'a BTreeSet<LeaseKey>,
    pub long_free_at_scan: &'a BTreeSet<LeaseKey>,
    pub awaiting_reread: bool,
    pub cooled: bool,
    /// `balance::decide` on the last scan's rows and the heartbeats just read would take
    /// or request a lease.
    pub would_move: bool,
    pub rebalance_every: Duration,
    pub full_scan_interval: Duration,
}

/// Whether this round reads every row, and why (the first reason that holds, in the
/// order of `ScanWhy`); `None`: the heartbeat rows just read are all it needs.
pub(crate) fn scan_due(state: &ReadState<'_>) -> Option<ScanWhy> {
    let Some(since) = state.since_scan else {
        return Some(ScanWhy::First);
    };
    let (now, at_scan) = state.own_changes;
    let why = [
        (state.asked, ScanWhy::Asked),
        (now != at_scan, ScanWhy::OwnChange),
        (state.marks != state.marks_at_scan, ScanWhy::FleetChanged),
        (state.awaiting_reread, ScanWhy::Reread),
        (state.cooled, ScanWhy::Cooled),
        (
            !state.long_free.is_subset(state.long_free_at_scan),
            ScanWhy::LongFree,
        ),
        (
            state.would_move && since >= state.rebalance_every,
            ScanWhy::Rebalance,
        ),
        (since >= state.full_scan_interval, ScanWhy::Backstop),
    ];
    why.into_iter().find(|(due, _)| *due).map(|(_, why)| why)
}

/// The heartbeat rows to delete: of workers whose counter has stood still for
/// `retention` (on this worker's clock), each with the counter it must still show. Only
/// the first live member by id deletes, so a fleet does not race to write the same
/// deletes; a row whose worker comes back is kept by the counter condition.
pub(crate) fn dead_rows<'a>(
    peers: impl IntoIterator<Item = (&'a WorkerId, Option<u64>, Duration)>,
    me: &WorkerId,
    members: &BTreeSet<WorkerId>,
    retention: Duration,
) -> Vec<(WorkerId, u64)> {
    if members.first() != Some(me) {
        return Vec::new();
    }
    peers
        .into_iter()
        .filter(|(worker, _, _)| *worker != me)
        .filter_map(|(worker, counter, silent)| {
            (silent >= retention).then_some((worker.clone(), counter?))
        })
        .collect()
}

/// Where a drain stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainVerdict {
    /// Keep handing over what is asked for.
    Wait,
    /// Over: nothing more will be asked (or the deadline passed).
    Done,
    /// Over because the table fails: nobody's request can be read.
    TableFailed,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct DrainState {
    pub table_failed: bool,
    pub handoffs_in_flight: bool,
    pub holds_nothing: bool,
    /// Every peer is draining too (a whole fleet stopping): nobody will ask.
    pub nobody_left: bool,
    pub past_deadline: bool,
}

pub(crate) fn drain_verdict(state: DrainState) -> DrainVerdict {
    if state.table_failed {
        return DrainVerdict::TableFailed;
    }
    if state.handoffs_in_flight {
        return DrainVerdict::Wait;
    }
    if state.holds_nothing || state.nobody_left || state.past_deadline {
        DrainVerdict::Done
    } else {
        DrainVerdict::Wait
    }
}

/// Whether a failed heartbeat is reported at ERROR: the heartbeat has gone unconfirmed
/// for the fence time (so every shard has stopped delivering), and the last such report
/// is older than `every`. Otherwise a WARN.
pub(crate) fn heartbeat_stall_due(
    unconfirmed_for: Option<Duration>,
    fence_time: Duration,
    since_reported: Option<Duration>,
    every: Duration,
) -> bool {
    unconfirmed_for.is_none_or(|d| d >= fence_time) && since_reported.is_none_or(|d| d >= every)
}

/// Records per second between two heartbeats, rounded.
pub(crate) fn rate(delivered: u64, before: u64, elapsed: Duration) -> u64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        (delivered.saturating_sub(before) as f64 / secs).round() as u64
    } else {
        0
    }
}

/// How much of the heartbeat rows a round reads. Liveness, changes, draining and
/// counts need only the index's summary; throughput balance also needs the peers'
/// per-lease rates, which only the whole rows hold (they are too big to project). It
/// reacts to them at most once per `rebalance_every` (`ScanWhy::Rebalance`), and only
/// when they could make it act: so whole rows are read when the last whole read (a
/// scan or a full read, `since_whole`) is that old *and* the workers' totals, which
/// the index does hold (`WorkerLoad::records_per_second`), say the rates read then may
/// be out of date for the plan ([`totals_moved`]). A balanced, steady fleet reads no
/// whole rows between scans; under count balance, none.
///
/// Whatever the policy, a round after somebody asked for the fleet view (`watched`:
/// `GET /fleet`, the fleet page, `flotilla status --fleet`) reads them whole: the
/// peers' per-shard lags and subscriptions live only there, and a watched view must not
/// show them as old as the last scan (up to `full_scan_interval`). Nobody watching
/// costs nothing.
pub(crate) fn heartbeat_detail(
    policy: &Policy,
    since_whole: Option<Duration>,
    rebalance_every: Duration,
    totals: &Totals<'_>,
    watched: bool,
) -> crate::backend::HeartbeatDetail {
    use crate::backend::HeartbeatDetail::{Full, Summary};
    if watched {
        return Full;
    }
    let threshold = match policy {
        Policy::Count => return Summary,
        Policy::Throughput(spread) => spread.threshold,
    };
    match since_whole {
        None => Full,
        Some(since) if since < rebalance_every => Summary,
        Some(_) if totals_moved(totals, threshold) => Full,
        Some(_) => Summary,
    }
}

/// Each worker's total records/s (`WorkerLoad::records_per_second`, which the index
/// holds) as of the last read, and as of the last whole read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Totals<'a> {
    pub now: &'a BTreeMap<WorkerId, u64>,
    pub at_whole: &'a BTreeMap<WorkerId, u64>,
    /// Each worker's lease count as of the last read (the index holds it too).
    pub leases: &'a BTreeMap<WorkerId, u64>,
}

/// Whether the per-lease rates last read whole may no longer be what the throughput
/// plan would act on: the workers are not those of the whole read; or their lease
/// counts are more than one apart (`balance::even_counts` may act); or a worker's total
/// moved by more than half the band (`threshold` × the mean) since (so a worker inside
/// the band then may be outside now: a shard turned hot); or a worker's total is outside
/// the band now (the plan may have a move; a fleet no move can even out reads whole
/// rows once per rebalance period, as every throughput fleet did before). Totals are
/// records/s where the plan weighs bytes/s: records alone change the totals, not record
/// sizes, which the full scan's backstop (`full_scan_interval`) covers.
pub(crate) fn totals_moved(totals: &Totals<'_>, threshold: f64) -> bool {
    let Totals {
        now,
        at_whole,
        leases,
    } = *totals;
    if !now.keys().eq(at_whole.keys()) {
        return true;
    }
    // Counts off even: `even_counts` may act, on rates as the whole rows hold them (a
    // joiner facing an idle fleet: every total 0, so nothing else would say so).
    let (fewest, most) = (leases.values().min(), leases.values().max());
    if fewest.zip(most).is_some_and(|(f, m)| m - f > 1) {
        return true;
    }
    let mean = |m: &BTreeMap<WorkerId, u64>| {
        m.values().map(|&x| x as f64).sum::<f64>() / m.len().max(1) as f64
    };
    let (mean_now, mean_then) = (mean(now), mean(at_whole));
    let half_band = threshold / 2.0 * mean_now.max(mean_then);
    let moved = now
        .iter()
        .zip(at_whole.values())
        .any(|((_, &x), &then)| (x as f64 - then as f64).abs() > half_band);
    let outside = now
        .values()
        .any(|&x| (x as f64 - mean_now).abs() > threshold * mean_now);
    moved || outside
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::balance::Take;
    use crate::model::{Checkpoint, ShardId};

    #[test]
    fn whole_heartbeat_rows_are_read_under_throughput_balance_once_a_rebalance_period_when_totals_moved()
     {
        use crate::backend::HeartbeatDetail::{Full, Summary};
        use crate::balance::Spread;
        let every = Duration::from_secs(10);
        let s = Duration::from_secs;
        let throughput = Policy::Throughput(Spread::DEFAULT);
        let totals = |xs: &[(&str, u64)]| -> BTreeMap<WorkerId, u64> {
            xs.iter().map(|(n, x)| (w(n), *x)).collect()
        };
        let even = totals(&[("a", 100), ("b", 100), ("c", 100)]);
        let idle = totals(&[("a", 0), ("b", 0), ("c", 0)]);
        let noise = totals(&[("a", 104), ("b", 97), ("c", 100)]);
        // a's shards turned hot: a moved by more than half the band.
        let hot = totals(&[("a", 140), ("b", 100), ("c", 100)]);
        // Each moved under half the band, but b is now past the band.
        let drifted = totals(&[("a", 96), ("b", 114), ("c", 96)]);
        let at_drift = totals(&[("a", 100), ("b", 109), ("c", 100)]);
        // Outside the band then and now: a spread no move evens out.
        let coarse = totals(&[("a", 300), ("b", 100), ("c", 100)]);
        let joined = totals(&[("a", 100), ("b", 100), ("c", 100), ("d", 0)]);
        let woke = totals(&[("a", 5), ("b", 0), ("c", 0)]);
        let even_counts = totals(&[("a", 2), ("b", 2), ("c", 1)]);
        // A joiner facing an idle fleet: every total 0, the counts 4 / 0.
        let uneven_counts = totals(&[("a", 4), ("b", 0)]);
        let idle2 = totals(&[("a", 0), ("b", 0)]);
        for (since, want) in [(s(9), Summary), (s(10), Full)] {
            let totals = Totals {
                now: &idle2,
                at_whole: &idle2,
                leases: &uneven_counts,
            };
            assert_eq!(
                heartbeat_detail(&throughput, Some(since), every, &totals, false),
                want,
                "uneven counts, {since:?}"
            );
        }
        for (policy, since, now, at_whole, want) in [
            (Policy::Count, None, &hot, &even, Summary),
            (Policy::Count, Some(s(3600)), &hot, &even, Summary),
            (throughput, None, &even, &even, Full),
            (throughput, Some(s(2)), &hot, &even, Summary),
            (throughput, Some(s(9)), &joined, &even, Summary),
            (throughput, Some(s(10)), &even, &even, Summary),
            (throughput, Some(s(60)), &idle, &idle, Summary),
            (throughput, Some(s(60)), &noise, &even, Summary),
            (throughput, Some(s(10)), &hot, &even, Full),
            (throughput, Some(s(10)), &drifted, &at_drift, Full),
            (throughput, Some(s(10)), &coarse, &coarse, Full),
            (throughput, Some(s(10)), &joined, &even, Full),
            (throughput, Some(s(10)), &woke, &idle, Full),
        ] {
            let totals = Totals {
                now,
                at_whole,
                leases: &even_counts,
            };
            let detail = heartbeat_detail(&policy, since, every, &totals, false);
            // Watched, every case reads whole rows: a watched fleet view is a round old.
            assert_eq!(
                heartbeat_detail(&policy, since, every, &totals, true),
                Full,
                "{policy:?} {since:?} watched"
            );
            assert_eq!(detail, want, "{policy:?} {since:?} {now:?} {at_whole:?}");
        }
    }

    fn w(name: &str) -> WorkerId {
        WorkerId::new(name)
    }

    fn key(i: u64) -> LeaseKey {
        LeaseKey::from(&ShardId::from_index(i))
    }

    fn fence(owner: Option<&str>, counter: u64) -> Fence {
        Fence {
            owner: owner.map(w),
            counter,
        }
    }

    fn lease(i: u64, owner: Option<&str>, counter: u64) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(i),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.owner = owner.map(w);
        lease.counter = counter;
        lease
    }

    #[test]
    fn rows_a_round_deals_with() {
        let leases = vec![
            lease(0, Some("a"), 1),
            lease(1, None, 0),
            lease(2, None, 0),
            lease(3, Some("me"), 4),
        ];
        let orphans = BTreeMap::from([(key(1), "orphan".to_owned())]);
        let unlisted = BTreeSet::from([key(2), key(3)]);
        let held = BTreeMap::from([(key(3), fence(Some("me"), 4))]);
        let got: Vec<LeaseKey> = dealt(&leases, &orphans, &unlisted, &held)
            .into_iter()
            .map(|l| l.key.clone())
            .collect();
        // 1 is an orphan; 2 is not listed yet; 3 is not listed but held.
        assert_eq!(got, [key(0), key(3)]);
    }

    #[test]
    fn why_a_lease_is_lost() {
        let row = lease(0, Some("thief"), 9);
        let nobody = lease(0, None, 9);
        let table: [(Option<&Lease>, Option<&str>, &str, LeaseMove); 4] = [
            (
                Some(&row),
                None,
                "the row names owner thief with counter 9",
                LeaseMove::Lost,
            ),
            (
                Some(&nobody),
                None,
                "the row names owner nobody with counter 9",
                LeaseMove::Lost,
            ),
            (None, None, "its row was deleted", LeaseMove::Lost),
            (
                Some(&row),
                Some("bad counter"),
                "its row is unreadable: bad counter",
                LeaseMove::Unreadable,
            ),
        ];
        for (row, bad, why, reason) in table {
            assert_eq!(lost_reason(row, bad), (why.to_owned(), reason), "{why}");
        }
    }

    #[test]
    fn how_a_take_is_made_and_counted() {
        let me = w("me");
        // (gain, requested, fence owner) → (gain counted, heartbeat checked of)
        let table = [
            (
                Gain::Expired,
                false,
                Some("dead"),
                Gain::Expired,
                Some("dead"),
            ),
            // This worker's own earlier life: no heartbeat to check but its own.
            (Gain::Expired, false, Some("me"), Gain::Expired, None),
            (Gain::New, false, None, Gain::New, None),
            (Gain::Released, true, None, Gain::Released, None),
            (Gain::Resumed, false, Some("me"), Gain::Resumed, None),
            (Gain::Resumed, true, Some("me"), Gain::HandedOff, None),
            (Gain::HandedOff, true, Some("me"), Gain::HandedOff, None),
        ];
        for (gain, requested, owner, counted, checked) in table {
            let f = fence(owner, 3);
            let why = take_reason(gain, requested);
            assert_eq!(why, counted, "{gain:?} requested={requested}");
            assert_eq!(
                expired_from(why, &f, &me),
                checked.map(w),
                "{gain:?} {owner:?}"
            );
        }
        // Who it came from.
        assert_eq!(
            gained_from(&fence(Some("me"), 3), Some(w("asked")), &me),
            Some(w("asked"))
        );
        assert_eq!(gained_from(&fence(Some("me"), 3), None, &me), Some(w("me")));
        assert_eq!(
            gained_from(&fence(Some("b"), 3), Some(w("asked")), &me),
            Some(w("b"))
        );
        assert_eq!(gained_from(&fence(None, 3), None, &me), None);
    }

    #[test]
    fn a_decision_becomes_actions_in_order() {
        let me = w("me");
        let thief_row = lease(1, Some("thief"), 8);
        let rows: BTreeMap<&LeaseKey, &Lease> = BTreeMap::from([(&thief_row.key, &thief_row)]);
        let unreadable = BTreeMap::from([(key(2), "bad".to_owned())]);
        let requested = BTreeSet::from([key(5)]);
        let decision = Decision {
            take: vec![
                Take {
                    key: key(4),
                    fence: fence(Some("dead"), 2),
                    why: Gain::Expired,
                },
                Take {
                    key: key(5),
                    fence: fence(Some("me"), 6),
                    why: Gain::Resumed,
                },
            ],
            request: vec![(key(6), fence(Some("busy"), 1))],
            hand_off: vec![(key(7), fence(Some("me"), 3), w("asker"))],
            turn_down: vec![(key(8), w("gone"))],
            lost: vec![key(1), key(2), key(3)],
            release: vec![(key(9), fence(Some("me"), 1))],
        };
        let got = actions(decision, &rows, &unreadable, &requested, &me);
        let want = vec![
            Action::Release {
                key: key(9),
                fence: fence(Some("me"), 1),
            },
            Action::Revoke {
                key: key(1),
                why: "the row names owner thief with counter 8".to_owned(),
                reason: LeaseMove::Lost,
                to: Some(w("thief")),
                unreadable: None,
            },
            Action::Revoke {
                key: key(2),
                why: "its row is unreadable: bad".to_owned(),
                reason: LeaseMove::Unreadable,
                to: None,
                unreadable: Some("bad".to_owned()),
            },
            Action::Revoke {
                key: key(3),
                why: "its row was deleted".to_owned(),
                reason: LeaseMove::Lost,
                to: None,
                unreadable: None,
            },
            Action::TurnDown {
                key: key(8),
                asker: w("gone"),
            },
            Action::HandOff {
                key: key(7),
                fence: fence(Some("me"), 3),
                to: w("asker"),
            },
            Action::Take {
                key: key(4),
                fence: fence(Some("dead"), 2),
                why: Gain::Expired,
                expired_from: Some(w("dead")),
            },
            Action::Take {
                key: key(5),
                fence: fence(Some("me"), 6),
                why: Gain::HandedOff,
                expired_from: None,
            },
            Action::Request {
                key: key(6),
                fence: fence(Some("busy"), 1),
            },
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn which_requests_stay_open() {
        let me = w("me");
        let mut asked = lease(0, Some("owner"), 1);
        asked.handoff_to = Some(me.clone());
        let mine = lease(0, Some("me"), 2);
        let mut elsewhere = lease(0, Some("owner"), 1);
        elsewhere.handoff_to = Some(w("other"));
        let turned_down = lease(0, Some("owner"), 1);
        let table = [
            (Some(&asked), true),
            (Some(&mine), true),
            (Some(&elsewhere), false),
            (Some(&turned_down), false),
            (None, false),
        ];
        for (row, open) in table {
            assert_eq!(request_open(row, &me), open, "{row:?}");
        }
    }

    #[test]
    fn deadline_scans() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let hb = s(10);
        // (dead at, pending) → scheduled
        let table: [(&[u64], Option<u64>, Option<u64>); 7] = [
            (&[], None, None),
            (&[3, 7], None, Some(3)),
            // Past or now: not a deadline to wait for.
            (&[0], None, None),
            // Not before the next regular scan: that one will do.
            (&[10], None, None),
            (&[12, 4], None, Some(4)),
            // One already pending at or before it.
            (&[5], Some(5), None),
            (&[5], Some(7), Some(5)),
        ];
        for (dead, pending, want) in table {
            let got = deadline_scan(
                dead.iter().map(|d| now + s(*d)),
                now,
                pending.map(|p| now + s(p)),
                hb,
            );
            assert_eq!(
                got,
                want.map(|w| now + s(w)),
                "dead={dead:?} pending={pending:?}"
            );
        }
    }

    #[test]
    fn when_a_round_scans() {
        let s = Duration::from_secs;
        let mark = |changes: u64| PeerMark {
            alive: true,
            draining: false,
            changes: Some(changes),
        };
        let at_scan = BTreeMap::from([(w("a"), mark(3)), (w("b"), mark(0))]);
        let same = at_scan.clone();
        let moved = BTreeMap::from([(w("a"), mark(4)), (w("b"), mark(0))]);
        let joined = BTreeMap::from([(w("a"), mark(3)), (w("b"), mark(0)), (w("c"), mark(0))]);
        let gone = BTreeMap::from([(w("a"), mark(3))]);
        let died = BTreeMap::from([
            (w("a"), mark(3)),
            (
                w("b"),
                PeerMark {
                    alive: false,
                    ..mark(0)
                },
            ),
        ]);
        let draining = BTreeMap::from([
            (w("a"), mark(3)),
            (
                w("b"),
                PeerMark {
                    draining: true,
                    ..mark(0)
                },
            ),
        ]);
        let no_keys = BTreeSet::new();
        let one_free = BTreeSet::from([key(1)]);
        let quiet = ReadState {
            since_scan: Some(s(30)),
            asked: false,
            own_changes: (5, 5),
            marks: &same,
            marks_at_scan: &at_scan,
            long_free: &no_keys,
            long_free_at_scan: &no_keys,
            awaiting_reread: false,
            cooled: false,
            would_move: false,
            rebalance_every: s(10),
            full_scan_interval: s(600),
        };
        use ScanWhy::*;
        let table: Vec<(&str, ReadState<'_>, Option<ScanWhy>)> = vec![
            ("nothing changed: heartbeat rows only", quiet.clone(), None),
            (
                "rates moved: the cached rows would move a lease",
                ReadState {
                    would_move: true,
                    ..quiet.clone()
                },
                Some(Rebalance),
            ),
            (
                "rates would move a lease, but the last scan is recent",
                ReadState {
                    would_move: true,
                    since_scan: Some(s(4)),
                    ..quiet.clone()
                },
                None,
            ),
            (
                "never scanned",
                ReadState {
                    since_scan: None,
                    ..quiet.clone()
                },
                Some(First),
            ),
            (
                "the watcher asked",
                ReadState {
                    asked: true,
                    ..quiet.clone()
                },
                Some(Asked),
            ),
            (
                "this worker took, asked, answered or released",
                ReadState {
                    own_changes: (6, 5),
                    ..quiet.clone()
                },
                Some(OwnChange),
            ),
            (
                "a peer's change counter moved (a request for one of ours)",
                ReadState {
                    marks: &moved,
                    ..quiet.clone()
                },
                Some(FleetChanged),
            ),
            (
                "a worker joined",
                ReadState {
                    marks: &joined,
                    ..quiet.clone()
                },
                Some(FleetChanged),
            ),
            (
                "a worker left",
                ReadState {
                    marks: &gone,
                    ..quiet.clone()
                },
                Some(FleetChanged),
            ),
            (
                "a worker died (its leases are free)",
                ReadState {
                    marks: &died,
                    ..quiet.clone()
                },
                Some(FleetChanged),
            ),
            (
                "a worker started draining",
                ReadState {
                    marks: &draining,
                    ..quiet.clone()
                },
                Some(FleetChanged),
            ),
            (
                "a held lease waits for a read after a gap",
                ReadState {
                    awaiting_reread: true,
                    ..quiet.clone()
                },
                Some(Reread),
            ),
            (
                "a cooldown ended",
                ReadState {
                    cooled: true,
                    ..quiet.clone()
                },
                Some(Cooled),
            ),
            (
                "a lease dealt but not taken has been free for the failover time",
                ReadState {
                    long_free: &one_free,
                    ..quiet.clone()
                },
                Some(LongFree),
            ),
            (
                "a long-free lease already seen so at the scan",
                ReadState {
                    long_free: &one_free,
                    long_free_at_scan: &one_free,
                    ..quiet.clone()
                },
                None,
            ),
            (
                "the safety net",
                ReadState {
                    since_scan: Some(s(600)),
                    ..quiet.clone()
                },
                Some(Backstop),
            ),
            (
                "just before the safety net",
                ReadState {
                    since_scan: Some(s(599)),
                    ..quiet.clone()
                },
                None,
            ),
        ];
        for (what, state, want) in table {
            assert_eq!(scan_due(&state), want, "{what}");
        }
    }

    #[test]
    fn which_dead_rows_are_deleted() {
        let s = Duration::from_secs;
        let (me, a, b, z) = (w("a-me"), w("b"), w("c"), w("z"));
        let members = BTreeSet::from([me.clone(), z.clone()]);
        let retention = s(3600);
        let peers = [
            (&a, Some(7), s(3600)),
            (&b, Some(9), s(3599)),
            // An owner with no row: nothing to delete.
            (&z, None, s(7200)),
            (&me, Some(1), s(9999)),
        ];
        assert_eq!(
            dead_rows(peers, &me, &members, retention),
            vec![(a.clone(), 7)]
        );
        // Not the first member: another worker deletes.
        assert_eq!(dead_rows(peers, &z, &members, retention), vec![]);
    }

    #[test]
    fn when_a_drain_is_over() {
        use DrainVerdict::*;
        let base = DrainState {
            table_failed: false,
            handoffs_in_flight: false,
            holds_nothing: false,
            nobody_left: false,
            past_deadline: false,
        };
        let table = [
            (base, Wait),
            (
                DrainState {
                    holds_nothing: true,
                    ..base
                },
                Done,
            ),
            (
                DrainState {
                    nobody_left: true,
                    ..base
                },
                Done,
            ),
            (
                DrainState {
                    past_deadline: true,
                    ..base
                },
                Done,
            ),
            // A handoff in flight is waited for, even past the deadline.
            (
                DrainState {
                    past_deadline: true,
                    handoffs_in_flight: true,
                    ..base
                },
                Wait,
            ),
            (
                DrainState {
                    table_failed: true,
                    handoffs_in_flight: true,
                    ..base
                },
                TableFailed,
            ),
        ];
        for (state, want) in table {
            assert_eq!(drain_verdict(state), want, "{state:?}");
        }
    }

    #[test]
    fn heartbeat_stalls_are_reported_once_per_period() {
        let s = Duration::from_secs;
        let (fence_time, every) = (s(7), s(30));
        let table = [
            ((Some(s(3)), None), false),
            ((Some(s(7)), None), true),
            ((None, None), true),
            ((Some(s(60)), Some(s(10))), false),
            ((Some(s(60)), Some(s(30))), true),
        ];
        for ((unconfirmed, reported), want) in table {
            assert_eq!(
                heartbeat_stall_due(unconfirmed, fence_time, reported, every),
                want,
                "{unconfirmed:?} {reported:?}"
            );
        }
    }

    #[test]
    fn delivery_rate() {
        let s = Duration::from_secs;
        assert_eq!(rate(1_500, 500, s(2)), 500);
        assert_eq!(rate(500, 500, s(2)), 0);
        assert_eq!(
            rate(500, 900, s(2)),
            0,
            "a counter reset is not a negative rate"
        );
        assert_eq!(rate(100, 0, Duration::ZERO), 0);
    }
}
