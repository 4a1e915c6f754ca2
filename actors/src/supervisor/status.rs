//! The worker's status snapshot ([`WorkerStatus`]): what the supervisor knows itself
//! (its phase, its shards' leases and failures, the restarts), and what its children
//! answer when asked (each reader its shard, the core actors their views).
//!
//! The asking is here too, as two steps that take only the children's references: the
//! readers concurrently (one slow reader costs one timeout, not one each), then the
//! core actors, each with a short timeout. A child that does not answer in time shows
//! as not answering (`None`, an empty map, or a `restarting` shard); the snapshot never
//! waits on the slowest child for longer than that. [`assemble`] and the views are pure.

use std::collections::BTreeMap;
use std::time::Duration;

use ractor::ActorRef;

use super::core::{Core, StatusMsg, actor_state};
use super::pure::Phase;
use crate::metrics_reporter::MetricsMsg;
use crate::model::{BudgetUse, LeaseKey};
use crate::protocol::{CheckpointMsg, KeeperMsg, ReaderMsg, WatcherMsg};
use crate::status::{
    BudgetView, CheckpointView, CoreActorStatus, KeeperStatus, MetricsSnapshot, ShardState,
    ShardStatus, WatcherStatus, WorkerStatus,
};

/// How long a status request waits on each actor.
pub(crate) const STATUS_TIMEOUT_MS: u64 = 2_000;

/// One held shard, as the supervisor asks after it.
pub(crate) struct ShardAsk {
    /// What it shows when its reader is restarting or does not answer.
    pub fallback: ShardStatus,
    /// Its reader; `None` between two restarts.
    pub reader: Option<ActorRef<ReaderMsg>>,
    /// It is being passed on (to a peer, or back to nobody).
    pub handing_off: bool,
}

/// A held shard's status without its reader's answer: its lease, its restarts and its
/// last failure (`last_failure`: the error and how long ago), every counter 0.
pub(crate) fn fallback(
    key: &LeaseKey,
    lease_counter: u64,
    restarts: u32,
    last_failure: Option<(&str, Duration)>,
) -> ShardStatus {
    ShardStatus {
        shard_id: key.shard_id(),
        stream: key.stream_name().map(str::to_owned),
        state: ShardState::Restarting,
        lease_counter,
        checkpoint: None,
        last_delivered: None,
        millis_behind_latest: None,
        records_delivered: 0,
        bytes_delivered: 0,
        records_per_second: 0.0,
        bytes_per_second: 0.0,
        last_error: last_failure.map(|(error, _)| error.to_owned()),
        last_error_ms_ago: last_failure.map(|(_, ago)| ago.as_millis() as u64),
        in_flight_records: 0,
        in_flight_bytes: 0,
        memory_bytes: 0,
        restarts,
        fenced: None,
        stall: None,
        subscription: None,
        records_discarded: 0,
        last_failure: None,
        lanes: Vec::new(),
    }
}

/// The shard as shown: its reader's answer, else the fallback; a shard being handed off
/// shows so, whatever its reader says.
pub(crate) fn shard_view(
    answer: Option<ShardStatus>,
    fallback: ShardStatus,
    handing_off: bool,
) -> ShardStatus {
    let mut status = answer.unwrap_or(fallback);
    if handing_off {
        status.state = ShardState::HandingOff;
    }
    status
}

/// Asks every reader at once.
pub(crate) async fn ask_shards(asks: Vec<ShardAsk>) -> Vec<ShardStatus> {
    let asks = asks.into_iter().map(|ask| async move {
        let answer = match ask.reader {
            Some(reader) => ractor::call_t!(reader, ReaderMsg::Status, STATUS_TIMEOUT_MS).ok(),
            None => None,
        };
        shard_view(answer, ask.fallback, ask.handing_off)
    });
    futures::future::join_all(asks).await
}

/// What the core actors answered; `None` (or empty) where one did not in time.
#[derive(Debug, Default)]
pub(crate) struct CoreAnswers {
    /// The checkpoint writer's view of each shard, by lease key.
    pub checkpoints: BTreeMap<String, CheckpointView>,
    /// Each core actor's name and lifecycle state, as [`Core::cells`] lists them.
    pub states: Vec<(&'static str, String)>,
    /// The status server's lifecycle state, when there is one.
    pub status_server: Option<String>,
    pub leases: Option<KeeperStatus>,
    pub stream_watcher: Option<WatcherStatus>,
    pub metrics: Option<MetricsSnapshot>,
}

/// Asks the core actors, one after the other.
pub(crate) async fn ask_core(
    core: &Core,
    status_server: Option<&ActorRef<StatusMsg>>,
) -> CoreAnswers {
    let checkpoints = ractor::call_t!(core.writer, CheckpointMsg::Status, STATUS_TIMEOUT_MS)
        .map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        .unwrap_or_default();
    let states = core
        .cells()
        .iter()
        .map(|(name, cell)| (*name, actor_state(cell)))
        .collect();
    let status_server = status_server.map(|server| actor_state(&server.get_cell()));
    CoreAnswers {
        checkpoints,
        states,
        status_server,
        leases: ractor::call_t!(core.keeper, KeeperMsg::Status, STATUS_TIMEOUT_MS).ok(),
        stream_watcher: ractor::call_t!(core.watcher, WatcherMsg::Status, STATUS_TIMEOUT_MS).ok(),
        metrics: ractor::call_t!(core.metrics, MetricsMsg::Snapshot, STATUS_TIMEOUT_MS).ok(),
    }
}

/// What the supervisor knows itself.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    pub worker_id: String,
    pub application: String,
    pub stream: String,
    pub read_mode: &'static str,
    pub phase: Phase,
    /// Since the supervisor started.
    pub uptime: Duration,
    /// Shard reader restarts since the worker started.
    pub shard_restarts: u64,
    /// Core restarts: every core actor shows this count (they restart together).
    pub core_restarts: u32,
    /// The memory budget, read after the readers answered.
    pub budget: BudgetUse,
}

/// The budget as shown: its figures, and how many of the shards wait on it.
pub(crate) fn budget_view(usage: &BudgetUse, shards: &[ShardStatus]) -> BudgetView {
    BudgetView {
        total_bytes: usage.total,
        in_use_bytes: usage.in_use,
        share_bytes: usage.share,
        shards: usage.shards,
        peak_bytes: usage.peak,
        shards_waiting: shards
            .iter()
            .filter(|s| s.state == ShardState::WaitingOnBudget)
            .count(),
    }
}

/// The core actors as shown: each with the core's restarts, then the status server,
/// which restarts alone (its count is always 0).
pub(crate) fn core_view(
    states: Vec<(&'static str, String)>,
    core_restarts: u32,
    status_server: Option<String>,
) -> Vec<CoreActorStatus> {
    states
        .into_iter()
        .map(|(name, state)| CoreActorStatus {
            name,
            state,
            restarts: core_restarts,
        })
        .chain(status_server.map(|state| CoreActorStatus {
            name: "status_server",
            state,
            restarts: 0,
        }))
        .collect()
}

/// The snapshot, from the supervisor's facts, its readers' answers and its core's.
pub(crate) fn assemble(
    facts: Facts,
    shards: Vec<ShardStatus>,
    answers: CoreAnswers,
) -> WorkerStatus {
    let budget = budget_view(&facts.budget, &shards);
    WorkerStatus {
        source: crate::model::SourceKind::of_stream(&facts.stream).as_str(),
        worker_id: facts.worker_id,
        application: facts.application,
        stream: facts.stream,
        read_mode: facts.read_mode,
        state: facts.phase.label(),
        uptime_ms: facts.uptime.as_millis() as u64,
        shutting_down: facts.phase == Phase::Stopping,
        shards,
        shard_restarts: facts.shard_restarts,
        core: core_view(answers.states, facts.core_restarts, answers.status_server),
        leases: answers.leases,
        stream_watcher: answers.stream_watcher,
        checkpoints: answers.checkpoints,
        metrics: answers.metrics,
        budget,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(phase: Phase) -> Facts {
        Facts {
            worker_id: "w1".to_owned(),
            application: "app".to_owned(),
            stream: "orders".to_owned(),
            read_mode: "polling",
            phase,
            uptime: Duration::from_millis(1_500),
            shard_restarts: 3,
            core_restarts: 1,
            budget: BudgetUse {
                total: 1_000,
                in_use: 300,
                share: 500,
                shards: 2,
                peak: 400,
            },
        }
    }

    fn shard(id: &str, state: ShardState) -> ShardStatus {
        ShardStatus {
            state,
            ..fallback(&LeaseKey::new(id), 1, 0, None)
        }
    }

    #[test]
    fn a_shard_without_its_readers_answer_shows_its_lease_restarts_and_last_failure() {
        let key = LeaseKey::new("acct:orders:1700000000:shardId-000000000007");
        let status = fallback(
            &key,
            9,
            2,
            Some(("expired iterator", Duration::from_secs(3))),
        );
        assert_eq!(status.shard_id.as_str(), "shardId-000000000007");
        assert_eq!(status.stream.as_deref(), Some("orders"));
        assert_eq!(status.state, ShardState::Restarting);
        assert_eq!(status.lease_counter, 9);
        assert_eq!(status.restarts, 2);
        assert_eq!(status.last_error.as_deref(), Some("expired iterator"));
        assert_eq!(status.last_error_ms_ago, Some(3_000));
        assert_eq!(status.records_delivered, 0);
        let single = fallback(&LeaseKey::new("shardId-000000000001"), 1, 0, None);
        assert_eq!(single.stream, None);
        assert_eq!((single.last_error, single.last_error_ms_ago), (None, None));
    }

    #[test]
    fn a_readers_answer_wins_over_the_fallback_but_a_handoff_shows_as_one() {
        let answer = shard("shardId-1", ShardState::Processing);
        let back = fallback(&LeaseKey::new("shardId-1"), 1, 0, None);
        // (answer, handing off) → state shown
        let table: &[(Option<ShardStatus>, bool, ShardState)] = &[
            (Some(answer.clone()), false, ShardState::Processing),
            (Some(answer.clone()), true, ShardState::HandingOff),
            (None, false, ShardState::Restarting),
            (None, true, ShardState::HandingOff),
        ];
        for (answer, handing_off, expected) in table {
            let got = shard_view(answer.clone(), back.clone(), *handing_off);
            assert_eq!(got.state, *expected, "{answer:?} {handing_off}");
        }
    }

    #[test]
    fn the_snapshot_puts_the_facts_and_the_answers_together() {
        let shards = vec![
            shard("shardId-1", ShardState::Processing),
            shard("shardId-2", ShardState::WaitingOnBudget),
            shard("shardId-3", ShardState::WaitingOnBudget),
        ];
        let answers = CoreAnswers {
            states: vec![
                ("stream_watcher", "running".to_owned()),
                ("lease_keeper", "running".to_owned()),
            ],
            status_server: Some("running".to_owned()),
            stream_watcher: Some(WatcherStatus::default()),
            ..CoreAnswers::default()
        };
        let status = assemble(facts(Phase::Running), shards, answers);
        assert_eq!(status.worker_id, "w1");
        assert_eq!(status.source, "kinesis");
        assert_eq!(status.state, "running");
        assert!(!status.shutting_down);
        assert_eq!(status.uptime_ms, 1_500);
        assert_eq!(status.shard_restarts, 3);
        assert_eq!(status.shards.len(), 3);
        assert_eq!(status.budget.shards_waiting, 2);
        assert_eq!(
            (status.budget.total_bytes, status.budget.in_use_bytes),
            (1_000, 300)
        );
        assert_eq!(
            (status.budget.share_bytes, status.budget.peak_bytes),
            (500, 400)
        );
        assert_eq!(status.budget.shards, 2);
        let core: Vec<(&str, u32)> = status.core.iter().map(|c| (c.name, c.restarts)).collect();
        assert_eq!(
            core,
            [
                ("stream_watcher", 1),
                ("lease_keeper", 1),
                ("status_server", 0)
            ]
        );
        assert!(status.leases.is_none() && status.metrics.is_none());
        assert!(status.stream_watcher.is_some());
        assert!(status.checkpoints.is_empty());
    }

    #[test]
    fn the_state_follows_the_phase() {
        let table = [
            (Phase::Running, "running", false),
            (Phase::Draining, "draining", false),
            (Phase::Stopping, "stopping", true),
        ];
        for (phase, state, shutting_down) in table {
            let status = assemble(facts(phase), Vec::new(), CoreAnswers::default());
            assert_eq!(status.state, state, "{phase:?}");
            assert_eq!(status.shutting_down, shutting_down, "{phase:?}");
            assert!(status.core.is_empty(), "no status server, no core answers");
        }
    }
}
