//! The whole fleet as one worker sees it (`GET /fleet`): built from one lease-table
//! scan and what the observer made of it ([`fleet_view`]), with what the observer's own
//! readers know of its held shards laid over it ([`overlay_own_shards`]): their stalls,
//! and what the failure policy discarded.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::{ShardState, WorkerStatus};
use crate::balance::{Observations, Peer};
use crate::model::{Lease, LeaseKey, WorkerId};

/// The whole fleet as one worker sees it from its last lease-table scan: every worker
/// that has a heartbeat row or owns a lease, and every lease. Served as `GET /fleet`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FleetView {
    /// The application (the lease table's name).
    pub application: String,
    /// The observer's stream, as [`WorkerStatus::stream`] names it.
    pub stream: String,
    /// What `stream` is: `kinesis` or `dynamodb-streams`.
    pub source: &'static str,
    /// How the observer reads (`polling` or `fanout`; a fleet runs one settings file).
    pub read_mode: &'static str,
    /// The worker whose view this is.
    pub observer: String,
    /// Milliseconds since that worker's last scan.
    pub scanned_ms_ago: u64,
    /// How many workers the stream needs, as that worker's last lease-keeper round
    /// judged it (the `RecommendedWorkers` it published), with why and on what; `None`
    /// before its first round, and `scaling_unknown` says so.
    pub scaling: Option<super::FleetScaling>,
    /// Why `scaling` is `None`.
    pub scaling_unknown: Option<String>,
    /// Every worker seen: with a heartbeat row, or named as a lease's owner.
    pub workers: Vec<FleetWorker>,
    /// Every lease row (unreadable ones too), by lease key.
    pub leases: Vec<FleetLease>,
    /// Processable leases with no live owner.
    pub unassigned: Vec<String>,
    /// Leases waiting for a parent to finish.
    pub blocked: Vec<String>,
    /// Leases nobody processes and nobody will until something outside changes, each
    /// as `lease key: reason` (an unreadable row, a shard the stream does not have; on
    /// its owner's view, a held shard that is stalled: a processor that does not answer,
    /// a shard that cannot be read).
    pub stalled: Vec<String>,
    /// Every row that could not be read (lease rows among them, also in `stalled`).
    pub malformed_rows: Vec<String>,
}

/// What the fleet view is built from: one scan, and what the observer made of it.
pub(crate) struct FleetScan<'a> {
    pub application: &'a str,
    pub stream: &'a str,
    pub read_mode: &'static str,
    pub observer: &'a WorkerId,
    pub malformed: &'a [String],
    /// Every lease row the scan read.
    pub leases: &'a [Lease],
    /// The rows the round dealt with, by key (what `processable` looks parents up in).
    pub by_key: &'a BTreeMap<&'a LeaseKey, &'a Lease>,
    /// Unreadable lease rows, with why.
    pub unreadable: &'a BTreeMap<LeaseKey, String>,
    /// Rows for shards the stream does not have, with why.
    pub orphans: &'a BTreeMap<LeaseKey, String>,
    pub observations: &'a Observations,
    pub now: Instant,
    pub failover: Duration,
}

/// The fleet as one scan shows it: workers with their liveness on this worker's
/// clock, every lease with its state and its owner's last reported lag.
///
/// What a heartbeat reports (a worker's records/s and bytes/s, a lease's lag, rate and
/// subscription) is shown only while that heartbeat is live, by the rule that judges
/// the worker alive ([`Observations::peers`], [`Observations::lease_owner_alive`]): a
/// dead worker's last figures are not its load now, which is unknown, and
/// [`FleetWorker::load_unknown`] says why. A lease shows a handoff target only while it
/// is being handed off ([`FleetLeaseState::HandingOff`]): a finished lease, or one whose
/// owner is dead, hands off nothing, whatever request its row still holds.
pub(crate) fn fleet_view(scan: &FleetScan<'_>) -> FleetView {
    let FleetScan {
        leases,
        by_key,
        unreadable,
        orphans,
        observations: obs,
        now,
        failover,
        ..
    } = *scan;
    let mut view = FleetView {
        application: scan.application.to_owned(),
        stream: scan.stream.to_owned(),
        source: crate::model::SourceKind::of_stream(scan.stream).as_str(),
        read_mode: scan.read_mode,
        observer: scan.observer.to_string(),
        malformed_rows: scan.malformed.to_vec(),
        ..FleetView::default()
    };
    let mut owned: BTreeMap<&WorkerId, u64> = BTreeMap::new();
    let mut sorted: Vec<&Lease> = leases.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    for lease in sorted {
        let shard = lease.key.shard_id();
        // A lease a live Java worker renews (`lease.java_compat`) is held, not a stall.
        let owner_alive = obs.lease_owner_alive(lease, now, failover);
        let reason = orphans.get(&lease.key).cloned();
        let state = if lease.checkpoint.is_shard_end() {
            FleetLeaseState::Finished
        } else if reason.is_some() {
            FleetLeaseState::Stalled
        } else if !crate::balance::processable(lease, by_key) {
            FleetLeaseState::Blocked
        } else if !owner_alive {
            FleetLeaseState::Unassigned
        } else if lease.handoff_to.is_some() {
            FleetLeaseState::HandingOff
        } else {
            FleetLeaseState::Held
        };
        match (state, &reason) {
            (FleetLeaseState::Unassigned, _) => view.unassigned.push(lease.key.to_string()),
            (FleetLeaseState::Blocked, _) => view.blocked.push(lease.key.to_string()),
            (FleetLeaseState::Stalled, Some(why)) => {
                view.stalled.push(format!("{}: {why}", lease.key))
            }
            _ => {}
        }
        if let Some(owner) = &lease.owner
            && !lease.checkpoint.is_shard_end()
        {
            *owned.entry(owner).or_default() += 1;
        }
        // The owner's figures for it, from a live heartbeat only; none once finished.
        let load = lease
            .owner
            .as_ref()
            .filter(|_| owner_alive && state != FleetLeaseState::Finished)
            .and_then(|o| obs.load_of(o));
        let lag = load.and_then(|load| load.lag_ms.get(lease.key.as_str()).copied());
        let subscribed_ms =
            load.and_then(|load| load.subscribed_ms.get(lease.key.as_str()).copied());
        let rate = load
            .and_then(|load| load.lease_rates.as_ref())
            .and_then(|rates| rates.get(&lease.key).copied());
        view.leases.push(FleetLease {
            rate,
            lease_key: lease.key.to_string(),
            shard_id: shard.to_string(),
            stream: lease.key.stream_name().map(str::to_owned),
            owner: lease.owner.as_ref().map(|o| o.to_string()),
            state,
            reason,
            checkpoint: Some(lease.checkpoint.to_string()),
            counter: Some(lease.counter),
            handoff_to: lease
                .handoff_to
                .as_ref()
                .filter(|_| state == FleetLeaseState::HandingOff)
                .map(|w| w.to_string()),
            parents: lease
                .parent_shard_ids
                .iter()
                .map(|s| s.to_string())
                .collect(),
            children: lease
                .child_shard_ids
                .iter()
                .map(|s| s.to_string())
                .collect(),
            millis_behind_latest: lag,
            subscribed_ms,
            records_discarded: None,
            last_failure: None,
        });
    }
    // Unreadable lease rows: in the listing of leases too, so every shard of the
    // table shows in exactly one state.
    for (key, why) in unreadable {
        let reason = format!("unreadable row: {why}");
        view.stalled.push(format!("{key}: {reason}"));
        view.leases.push(FleetLease {
            lease_key: key.to_string(),
            shard_id: key.shard_id().to_string(),
            stream: key.stream_name().map(str::to_owned),
            owner: None,
            state: FleetLeaseState::Stalled,
            reason: Some(reason),
            checkpoint: None,
            counter: None,
            handoff_to: None,
            parents: Vec::new(),
            children: Vec::new(),
            millis_behind_latest: None,
            subscribed_ms: None,
            rate: None,
            records_discarded: None,
            last_failure: None,
        });
    }
    view.leases.sort_by(|a, b| a.lease_key.cmp(&b.lease_key));
    view.workers = obs
        .peers(now, failover)
        .into_iter()
        .map(|peer| {
            let load_unknown = load_unknown(&peer);
            let known = load_unknown.is_none();
            FleetWorker {
                leases: owned.get(&peer.worker).copied().unwrap_or(0),
                worker_id: peer.worker.to_string(),
                alive: peer.alive,
                draining: peer.load.draining,
                has_heartbeat: peer.has_heartbeat,
                records_per_second: known.then_some(peer.load.records_per_second),
                bytes_per_second: peer
                    .load
                    .lease_rates
                    .as_ref()
                    .filter(|_| known)
                    .map(|rates| rates.values().map(|r| r.bytes_per_second).sum()),
                load_unknown,
                silent_ms: peer.silent_ms,
            }
        })
        .collect();
    view
}

/// Why a worker's load is not known (`None`: its live heartbeat says it): it never wrote
/// a heartbeat row, or its heartbeat stood still past the failover time (dead, by
/// [`Observations::peers`]' rule), so what it last reported is not what it does now.
fn load_unknown(peer: &Peer) -> Option<String> {
    if !peer.has_heartbeat {
        Some("no heartbeat row".to_owned())
    } else if !peer.alive {
        Some(format!("no heartbeat for {} s", peer.silent_ms / 1000))
    } else {
        None
    }
}

/// What the observer's own readers know of its held shards (its `status`), which the
/// table does not say, laid over its fleet view: each of its leases gets the records its
/// reader discarded under `[failure]` and the processor's last failure; a stalled shard
/// shows stalled, with its reason.
#[cfg_attr(not(feature = "status-server"), allow(dead_code))]
pub(crate) fn overlay_own_shards(view: &mut FleetView, status: &WorkerStatus) {
    for shard in &status.shards {
        let Some(lease) = view.leases.iter_mut().find(|l| {
            l.shard_id == shard.shard_id.as_str()
                && l.stream == shard.stream
                && l.owner.as_deref() == Some(status.worker_id.as_str())
        }) else {
            continue;
        };
        lease.records_discarded = Some(shard.records_discarded);
        lease.last_failure = shard.last_failure.clone();
        if shard.state != ShardState::Stalled || lease.state == FleetLeaseState::Finished {
            continue;
        }
        let reason = shard.stall.clone().unwrap_or_else(|| "stalled".to_owned());
        lease.state = FleetLeaseState::Stalled;
        view.stalled.push(format!("{}: {reason}", lease.lease_key));
        lease.reason = Some(reason);
    }
}

/// One worker of [`FleetView::workers`], as the observer sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetWorker {
    /// The worker's id, as its heartbeat row and its leases' `leaseOwner` name it.
    pub worker_id: String,
    /// Its heartbeat moved within the failover time, on the observer's clock.
    pub alive: bool,
    /// Its heartbeat says it is shutting down and handing its leases over
    /// (`flotillaDraining`).
    pub draining: bool,
    /// False for an owner that never wrote a heartbeat row.
    pub has_heartbeat: bool,
    /// Leases it owns in the table (not finished).
    pub leases: u64,
    /// Records per second it delivered, from its live heartbeat; `None` when its load
    /// is unknown (`load_unknown` says why), never its last figure.
    pub records_per_second: Option<u64>,
    /// The sum of its leases' smoothed bytes/s (what throughput balance evens out);
    /// `None` from a worker that publishes no per-lease rates, or whose load is unknown.
    pub bytes_per_second: Option<u64>,
    /// Why its load is unknown: `no heartbeat for 12 s` (dead: its heartbeat stood
    /// still past the failover time), `no heartbeat row`; `None` while its live
    /// heartbeat reports it.
    pub load_unknown: Option<String>,
    /// How long its heartbeat has stood still.
    pub silent_ms: u64,
}

/// A lease's place in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetLeaseState {
    /// Owned by a live worker.
    Held,
    /// A live worker asked for it; the owner is handing it over.
    HandingOff,
    /// Processable, no live owner: the next scan deals it to someone.
    Unassigned,
    /// Waiting for a parent shard to finish.
    Blocked,
    /// SHARD_END.
    Finished,
    /// Nobody processes it, and nobody will until something outside changes: its row is
    /// unreadable, or its shard is not in the stream; or, on its owner's view, the shard
    /// it holds is stalled (`ShardState::Stalled`). `reason` says which.
    Stalled,
}

/// One lease row of [`FleetView::leases`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetLease {
    /// The row's `leaseKey`: the shard id, or `account:stream:epoch:shard` for several
    /// streams.
    pub lease_key: String,
    /// The shard the lease is for.
    pub shard_id: String,
    /// The stream's name for a multi-stream key (`account:stream:epoch:shard`); `None`
    /// for a single stream's (the view's `stream`).
    pub stream: Option<String>,
    /// The row's `leaseOwner`; `None` when nobody owns it, or the row is unreadable.
    pub owner: Option<String>,
    /// Where the lease is in the fleet.
    pub state: FleetLeaseState,
    /// Why it is stalled (state `stalled`).
    pub reason: Option<String>,
    /// `None` when the row is unreadable.
    pub checkpoint: Option<String>,
    /// The row's `leaseCounter` (the lease epoch); `None` when the row is unreadable.
    pub counter: Option<u64>,
    /// The worker that asked for the lease (`flotillaHandoffTo`), while its owner hands
    /// it over (state `handing_off`); `None` in every other state, whatever request the
    /// row still holds (a finished lease, or one whose owner is dead, hands off nothing).
    pub handoff_to: Option<String>,
    /// The row's `parentShardId`: the shards that must finish before this one is read.
    pub parents: Vec<String>,
    /// The row's `childShardIds`, written with the SHARD_END checkpoint.
    pub children: Vec<String>,
    /// The owner's last reported MillisBehindLatest for it (from its heartbeat); `None`
    /// once finished, or while its owner is dead (its last figure is not the lag now).
    pub millis_behind_latest: Option<u64>,
    /// In a fan-out fleet, for a lease being read: how long the owner's subscription to
    /// the shard had lasted at its last heartbeat, or `None` if it had none.
    pub subscribed_ms: Option<u64>,
    /// Its owner's smoothed records/s and bytes/s for it (from its heartbeat); `None`
    /// until measured, from an owner that publishes no rates, or while its owner is dead.
    pub rate: Option<crate::model::LeaseRate>,
    /// Only on its owner's own view, from the owner's reader (`None` for a lease the
    /// observer does not hold): the records the reader wrote to `failure.destination`
    /// and skipped (counted afresh after a restart; the metrics keep the total).
    pub records_discarded: Option<u64>,
    /// Likewise: the processor's last failure under `[failure]` (the record and the
    /// error), if it had one.
    pub last_failure: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, Heartbeat, LeaseRate, ShardId, WorkerLoad};
    use crate::status::ShardStatus;
    use crate::status_tree::tests::{shard, worker};

    const FAILOVER: Duration = Duration::from_secs(10);

    /// A scenario for [`fleet_view`]: workers `live` and `dead` each report 700
    /// records/s, 4000 bytes/s and a lag of 1500 ms on every lease in their heartbeat;
    /// `live`'s counter moves, `dead`'s stands still from the first scan (at `t0`) to
    /// the second, 12 s later, past the failover time; `java` owns a lease and never
    /// wrote a heartbeat row. The view is built at the second scan.
    fn view_at_second_scan(leases: &[Lease]) -> FleetView {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(12);
        let load = WorkerLoad {
            records_per_second: 700,
            lag_ms: leases
                .iter()
                .map(|l| (l.key.as_str().to_owned(), 1500))
                .collect(),
            lease_rates: Some(
                leases
                    .iter()
                    .map(|l| {
                        let rate = LeaseRate {
                            records_per_second: 700,
                            bytes_per_second: 4000,
                        };
                        (l.key.clone(), rate)
                    })
                    .collect(),
            ),
            ..WorkerLoad::default()
        };
        let hb = |worker: &str, counter: u64| Heartbeat {
            worker: WorkerId::new(worker),
            counter,
            load: load.clone(),
        };
        let owners: Vec<&WorkerId> = leases.iter().filter_map(|l| l.owner.as_ref()).collect();
        let mut obs = Observations::new();
        obs.observe(&[hb("live", 1), hb("dead", 1)], [], t0);
        obs.observe(&[hb("live", 2), hb("dead", 1)], owners, now);
        let by_key: BTreeMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        fleet_view(&FleetScan {
            application: "app",
            stream: "orders",
            read_mode: "polling",
            observer: &WorkerId::new("live"),
            malformed: &[],
            leases,
            by_key: &by_key,
            unreadable: &BTreeMap::new(),
            orphans: &BTreeMap::new(),
            observations: &obs,
            now,
            failover: FAILOVER,
        })
    }

    fn table_lease(
        shard: &str,
        owner: &str,
        checkpoint: Checkpoint,
        handoff_to: Option<&str>,
    ) -> Lease {
        Lease {
            owner: Some(WorkerId::new(owner)),
            counter: 3,
            handoff_to: handoff_to.map(WorkerId::new),
            ..Lease::new(&ShardId::new(shard), checkpoint, Vec::new(), None)
        }
    }

    /// A worker's load is what its live heartbeat says; a dead worker's is unknown (not
    /// its last figures), with why, and so is that of an owner without a heartbeat row.
    /// Its lease count is the table's, dead or alive.
    #[test]
    fn a_dead_workers_load_is_unknown_not_its_last_figures() {
        let leases = [
            table_lease(
                "shardId-000000000000",
                "live",
                Checkpoint::TrimHorizon,
                None,
            ),
            table_lease(
                "shardId-000000000001",
                "java",
                Checkpoint::TrimHorizon,
                None,
            ),
        ];
        let view = view_at_second_scan(&leases);
        // worker → (alive, leases, records/s, bytes/s, why unknown)
        type Want = (bool, u64, Option<u64>, Option<u64>, Option<&'static str>);
        let cases: [(&str, Want); 3] = [
            (
                "dead",
                (false, 0, None, None, Some("no heartbeat for 12 s")),
            ),
            ("java", (true, 1, None, None, Some("no heartbeat row"))),
            // 4000 bytes/s on each of the two leases its heartbeat reports on.
            ("live", (true, 1, Some(700), Some(8000), None)),
        ];
        let got: Vec<&str> = view.workers.iter().map(|w| w.worker_id.as_str()).collect();
        assert_eq!(got, cases.map(|(w, _)| w));
        for ((worker, want), got) in cases.iter().zip(&view.workers) {
            assert_eq!(
                (
                    got.alive,
                    got.leases,
                    got.records_per_second,
                    got.bytes_per_second,
                    got.load_unknown.as_deref()
                ),
                *want,
                "{worker}"
            );
        }
        // In the JSON: null, never the last figure.
        let json = serde_json::to_value(&view.workers[0]).unwrap_or_default();
        assert_eq!(
            json["records_per_second"],
            serde_json::Value::Null,
            "{json}"
        );
        assert_eq!(json["load_unknown"], "no heartbeat for 12 s", "{json}");
    }

    /// A lease shows a handoff target only while its owner hands it over: a finished
    /// lease (SHARD_END) or one whose owner is dead hands off nothing, whatever request
    /// its row holds; and it shows its owner's lag and rate only from a live heartbeat.
    #[test]
    fn only_a_lease_being_handed_off_shows_whom_to() {
        use FleetLeaseState::{Finished, HandingOff, Held, Unassigned};
        let to = Some("asker");
        // (owner, checkpoint, the row's request) → (state, handing off to, lag, rate)
        type Want = (FleetLeaseState, Option<&'static str>, Option<u64>, bool);
        let cases: [(&str, Checkpoint, Option<&str>, Want); 5] = [
            (
                "live",
                Checkpoint::TrimHorizon,
                to,
                (HandingOff, to, Some(1500), true),
            ),
            (
                "live",
                Checkpoint::TrimHorizon,
                None,
                (Held, None, Some(1500), true),
            ),
            (
                "live",
                Checkpoint::ShardEnd,
                to,
                (Finished, None, None, false),
            ),
            (
                "dead",
                Checkpoint::TrimHorizon,
                to,
                (Unassigned, None, None, false),
            ),
            (
                "dead",
                Checkpoint::TrimHorizon,
                None,
                (Unassigned, None, None, false),
            ),
        ];
        let leases: Vec<Lease> = cases
            .iter()
            .enumerate()
            .map(|(i, (owner, checkpoint, asked, _))| {
                let shard = format!("shardId-{i:012}");
                table_lease(&shard, owner, checkpoint.clone(), *asked)
            })
            .collect();
        let view = view_at_second_scan(&leases);
        assert_eq!(view.leases.len(), cases.len());
        for ((owner, checkpoint, asked, want), got) in cases.iter().zip(&view.leases) {
            assert_eq!(
                (
                    got.state,
                    got.handoff_to.as_deref(),
                    got.millis_behind_latest,
                    got.rate.is_some()
                ),
                *want,
                "{} owned by {owner} at {checkpoint:?}, asked for by {asked:?}",
                got.lease_key
            );
        }
    }

    fn lease(shard: &str, stream: &str, owner: &str, state: FleetLeaseState) -> FleetLease {
        FleetLease {
            lease_key: format!("1:{stream}:5:{shard}"),
            shard_id: shard.to_owned(),
            stream: Some(stream.to_owned()),
            owner: Some(owner.to_owned()),
            state,
            reason: None,
            checkpoint: Some("TRIM_HORIZON".to_owned()),
            counter: Some(1),
            handoff_to: None,
            parents: Vec::new(),
            children: Vec::new(),
            millis_behind_latest: None,
            subscribed_ms: None,
            rate: None,
            records_discarded: None,
            last_failure: None,
        }
    }

    /// A held shard stalled on its owner shows stalled in the owner's fleet view, with
    /// its reason; a shard of the same id of another stream, or one another worker
    /// owns, does not.
    #[test]
    fn the_owners_stalled_shards_show_stalled_in_its_fleet_view() {
        let mut view = FleetView {
            leases: vec![
                lease(
                    "shardId-000000000000",
                    "orders",
                    "w-1",
                    FleetLeaseState::Held,
                ),
                lease(
                    "shardId-000000000000",
                    "audit",
                    "w-1",
                    FleetLeaseState::Held,
                ),
                lease(
                    "shardId-000000000001",
                    "orders",
                    "w-2",
                    FleetLeaseState::Held,
                ),
            ],
            ..FleetView::default()
        };
        let why = "the MultiLang child has not answered processRecords for 31 s";
        let stalled = |id: &str| ShardStatus {
            stream: Some("orders".to_owned()),
            stall: Some(why.to_owned()),
            ..shard(id, ShardState::Stalled)
        };
        let status = worker(vec![
            stalled("shardId-000000000000"),
            // Not this worker's lease in the table (it moved): left as the table says.
            stalled("shardId-000000000001"),
        ]);
        overlay_own_shards(&mut view, &status);
        let states: Vec<FleetLeaseState> = view.leases.iter().map(|l| l.state).collect();
        assert_eq!(
            states,
            [
                FleetLeaseState::Stalled,
                FleetLeaseState::Held,
                FleetLeaseState::Held
            ]
        );
        assert_eq!(view.leases[0].reason.as_deref(), Some(why));
        assert_eq!(
            view.stalled,
            [format!("1:orders:5:shardId-000000000000: {why}")]
        );
    }

    /// Each of the observer's leases its readers report on gets their discards and last
    /// failure (0 and none included: the owner knows); a lease the table gives another
    /// worker, or one with no reader here, keeps `None`; a stall is laid over a held
    /// lease, not a finished one.
    #[test]
    fn the_owners_view_shows_its_shards_discards_and_last_failure() {
        use FleetLeaseState::{Finished, Held, Stalled};
        let failure = "record 4959/0: cannot parse";
        let stall = "record 4960/0 failed 3 times and failure.destination is not set";
        // (lease, this worker's reader of it: discarded, last failure, stall)
        // → (state, records_discarded, last_failure)
        type Reader = Option<(u64, Option<&'static str>, Option<&'static str>)>;
        type Want = (FleetLeaseState, Option<u64>, Option<&'static str>);
        let cases: [(FleetLease, Reader, Want); 6] = [
            (
                lease("shardId-000000000000", "orders", "w-1", Held),
                Some((2, Some(failure), None)),
                (Held, Some(2), Some(failure)),
            ),
            // The same shard id of another stream: its own reader's figures.
            (
                lease("shardId-000000000000", "audit", "w-1", Held),
                Some((0, None, None)),
                (Held, Some(0), None),
            ),
            // The table says another worker holds it now: left as the table says.
            (
                lease("shardId-000000000001", "orders", "w-2", Held),
                Some((5, Some(failure), None)),
                (Held, None, None),
            ),
            (
                lease("shardId-000000000002", "orders", "w-1", Finished),
                Some((1, Some(failure), Some(stall))),
                (Finished, Some(1), Some(failure)),
            ),
            (
                lease("shardId-000000000003", "orders", "w-1", Held),
                None,
                (Held, None, None),
            ),
            (
                lease("shardId-000000000004", "orders", "w-1", Held),
                Some((3, Some(failure), Some(stall))),
                (Stalled, Some(3), Some(failure)),
            ),
        ];
        let mut view = FleetView {
            leases: cases.iter().map(|(lease, _, _)| lease.clone()).collect(),
            ..FleetView::default()
        };
        let status = worker(
            cases
                .iter()
                .filter_map(|(lease, reader, _)| {
                    let (discarded, last, stall) = (*reader)?;
                    Some(ShardStatus {
                        stream: lease.stream.clone(),
                        stall: stall.map(str::to_owned),
                        records_discarded: discarded,
                        last_failure: last.map(str::to_owned),
                        ..shard(
                            &lease.shard_id,
                            if stall.is_some() {
                                ShardState::Stalled
                            } else {
                                ShardState::Processing
                            },
                        )
                    })
                })
                .collect(),
        );
        overlay_own_shards(&mut view, &status);
        for ((lease, _, want), got) in cases.iter().zip(&view.leases) {
            assert_eq!(
                (
                    got.state,
                    got.records_discarded,
                    got.last_failure.as_deref()
                ),
                *want,
                "{}",
                lease.lease_key
            );
        }
        assert_eq!(
            view.stalled,
            [format!("1:orders:5:shardId-000000000004: {stall}")]
        );
        assert_eq!(view.leases[5].reason.as_deref(), Some(stall));
    }
}
