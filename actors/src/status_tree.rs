//! A worker's supervision tree as a person reads it: the supervisor, its core actors,
//! and one reader per shard with its processor, each with its state, restarts and last
//! error, and why a shard is not processed when it is not.
//!
//! One definition for every view of it: [`tree`] is a pure function of the status
//! snapshot (no I/O, no clock), `/status.html` draws its nodes as HTML
//! (`status_page`), and `flotilla status` prints the same nodes, in the same order, as
//! text ([`render_text`], from `GET /status/tree`). A view never decides what a node
//! says; it only lays the nodes out.

use serde::{Deserialize, Serialize};

use crate::status::{ShardState, ShardStatus, WorkerStatus};

/// What a node stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// The worker's supervisor, the root of the tree.
    Supervisor,
    /// One of the worker's long-lived actors (lease keeper, stream watcher, …).
    Core,
    /// A shard's reader.
    Reader,
    /// The processor a reader delivers to.
    Processor,
}

/// One actor of the tree, as every view shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeNode {
    /// What the node stands for.
    pub kind: NodeKind,
    /// `supervisor`, `lease_keeper`, `reader shardId-000000000001`, `processor`.
    pub name: String,
    /// `running`, or a shard's state (`processing`, `fenced`, …).
    pub state: String,
    /// Restarts of the actor; `None` where none are counted (the supervisor, and a
    /// processor, which restarts with its reader: the count is the reader's).
    pub restarts: Option<u32>,
    /// Why this node's shard is not processed now, when it is not: the views make it
    /// stand out (as `/fleet` does its stalled leases).
    pub stall: Option<String>,
    /// The last failure the actor reports, with how long ago when that is known.
    pub last_error: Option<String>,
    /// How long ago `last_error` happened, in milliseconds; `None` when not known.
    pub error_age_ms: Option<u64>,
    /// A reader's shard (as [`shard_label`] names it): the key of its charts.
    pub shard: Option<String>,
    /// Further facts in the order shown: (label, value).
    pub facts: Vec<(String, String)>,
    /// The nodes below this one, in the order shown.
    pub children: Vec<TreeNode>,
}

impl TreeNode {
    fn new(kind: NodeKind, name: impl Into<String>, state: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            state: state.into(),
            restarts: None,
            stall: None,
            last_error: None,
            error_age_ms: None,
            shard: None,
            facts: Vec::new(),
            children: Vec::new(),
        }
    }

    fn fact(mut self, label: &str, value: impl Into<String>) -> Self {
        self.facts.push((label.to_owned(), value.into()));
        self
    }

    /// This node and every node below it, depth first (the order every view uses).
    pub fn walk(&self) -> Vec<(usize, &TreeNode)> {
        let mut out = Vec::new();
        let mut stack = vec![(0, self)];
        while let Some((depth, node)) = stack.pop() {
            out.push((depth, node));
            stack.extend(node.children.iter().rev().map(|c| (depth + 1, c)));
        }
        out
    }
}

/// Why a shard this worker holds is not processed now, or `None` while it is (or is
/// only waiting its turn: a parent to end, its budget share, a throttle's backoff).
pub fn stall(shard: &ShardStatus) -> Option<String> {
    match shard.state {
        ShardState::Fenced => Some(match &shard.fenced {
            Some(why) => format!("fenced: {why}"),
            None => "fenced".to_owned(),
        }),
        ShardState::Restarting => Some(match &shard.last_error {
            Some(error) => format!("restarting after a failure: {error}"),
            None => "restarting after a failure".to_owned(),
        }),
        ShardState::LeaseLost => Some("lease lost: another worker owns it now".to_owned()),
        ShardState::Stalled => Some(match &shard.stall {
            Some(why) => format!("stalled: {why}"),
            None => "stalled".to_owned(),
        }),
        ShardState::Initializing
        | ShardState::BlockedOnParent
        | ShardState::Processing
        | ShardState::CaughtUp
        | ShardState::Throttled
        | ShardState::WaitingOnBudget
        | ShardState::ShardEnding
        | ShardState::ShuttingDown
        | ShardState::HandingOff => None,
    }
}

/// The shard's name on the page: its id, after its stream's name when the worker reads
/// several streams (a shard id alone repeats across streams).
pub fn shard_label(shard: &ShardStatus) -> String {
    match &shard.stream {
        Some(stream) => format!("{stream}/{}", shard.shard_id),
        None => shard.shard_id.to_string(),
    }
}

/// The worker's supervision tree: the supervisor; its core actors in the order the
/// snapshot lists them; then one reader per shard, ordered by stream and shard id, each
/// with its processor below it.
pub fn tree(status: &WorkerStatus) -> TreeNode {
    let mut root = TreeNode::new(NodeKind::Supervisor, "supervisor", status.state)
        .fact("worker", status.worker_id.as_str())
        .fact("up", duration(status.uptime_ms))
        .fact("shards", status.shards.len().to_string())
        .fact("shard restarts", status.shard_restarts.to_string());
    for core in &status.core {
        let mut node = TreeNode::new(NodeKind::Core, core.name, core.state.as_str());
        node.restarts = Some(core.restarts);
        match core.name {
            "lease_keeper" => {
                if let Some(keeper) = &status.leases {
                    node = node.fact("held", keeper.held.len().to_string()).fact(
                        "heartbeat",
                        match keeper.heartbeat_age_ms {
                            Some(ms) => format!("confirmed {} ago", duration(ms)),
                            None => "not confirmed yet".to_owned(),
                        },
                    );
                    if let Some(error) = &keeper.heartbeat_error {
                        node.last_error = Some(format!(
                            "heartbeat: {} failed in a row: {error}",
                            keeper.heartbeat_failures
                        ));
                    }
                }
            }
            "stream_watcher" => {
                if let Some(watcher) = &status.stream_watcher {
                    node = node
                        .fact("shards", watcher.shards.to_string())
                        .fact("open", watcher.open_shards.to_string());
                    node.last_error = watcher
                        .last_error
                        .clone()
                        .or_else(|| watcher.stream_set_error.clone());
                }
            }
            _ => {}
        }
        root.children.push(node);
    }
    let mut shards: Vec<&ShardStatus> = status.shards.iter().collect();
    shards.sort_by(|a, b| (&a.stream, &a.shard_id).cmp(&(&b.stream, &b.shard_id)));
    for shard in shards {
        let mut reader = TreeNode::new(
            NodeKind::Reader,
            format!("reader {}", shard_label(shard)),
            state_name(shard.state),
        )
        .fact(
            "lag",
            match shard.millis_behind_latest {
                Some(ms) => format!("{ms} ms"),
                None => "-".to_owned(),
            },
        )
        .fact("records/s", rate(shard.records_per_second))
        .fact("bytes/s", rate(shard.bytes_per_second))
        .fact("records", shard.records_delivered.to_string());
        reader.restarts = Some(shard.restarts);
        reader.shard = Some(shard_label(shard));
        reader.stall = stall(shard);
        reader.last_error = shard.last_error.clone();
        reader.error_age_ms = shard.last_error_ms_ago;
        if let Some(sub) = &shard.subscription {
            reader = reader.fact("subscription", sub.state);
        }
        // The reader and its processor restart together: one count, on the reader.
        let processor = TreeNode::new(
            NodeKind::Processor,
            "processor",
            match shard.state {
                ShardState::Restarting => "restarting",
                ShardState::ShuttingDown | ShardState::ShardEnding | ShardState::HandingOff => {
                    "finishing"
                }
                ShardState::Initializing => "starting",
                ShardState::BlockedOnParent
                | ShardState::Processing
                | ShardState::CaughtUp
                | ShardState::Throttled
                | ShardState::WaitingOnBudget
                | ShardState::Fenced
                | ShardState::Stalled
                | ShardState::LeaseLost => "running",
            },
        )
        .fact("in flight", format!("{} records", shard.in_flight_records))
        .fact("memory", format!("{} B", shard.memory_bytes))
        .fact(
            "checkpoint",
            shard.checkpoint.clone().unwrap_or_else(|| "-".to_owned()),
        );
        reader.children.push(processor);
        root.children.push(reader);
    }
    root
}

/// A shard state as the JSON names it (`caught_up`).
fn state_name(state: ShardState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{state:?}"))
}

/// A rate as the page and `flotilla status` show one: whole units from 100 up, one
/// decimal below.
pub fn rate(per_second: f64) -> String {
    if per_second >= 100.0 {
        format!("{per_second:.0}")
    } else {
        format!("{per_second:.1}")
    }
}

/// A duration given in milliseconds, as the page and `flotilla status` show one: whole
/// seconds past a minute (milliseconds there are noise).
pub fn duration(ms: u64) -> String {
    let d = if ms >= 60_000 {
        std::time::Duration::from_secs(ms / 1000)
    } else {
        std::time::Duration::from_millis(ms)
    };
    humantime::format_duration(d).to_string()
}

/// One line per node, drawn with tree guides; a stalled node's line starts its note
/// with `STALLED:`, an error's with `error:`.
pub fn render_text(root: &TreeNode) -> String {
    let mut out = String::new();
    line(&mut out, root, "", "");
    out
}

fn line(out: &mut String, node: &TreeNode, lead: &str, child_lead: &str) {
    out.push_str(lead);
    out.push_str(&node.name);
    out.push_str("  ");
    out.push_str(&node.state);
    if let Some(restarts) = node.restarts {
        out.push_str(&format!("  restarts {restarts}"));
    }
    for (label, value) in &node.facts {
        out.push_str(&format!("  {label} {value}"));
    }
    if let Some(why) = &node.stall {
        out.push_str(&format!("  STALLED: {}", one_line(why)));
    }
    if let Some(error) = &node.last_error {
        out.push_str(&format!("  error: {}", one_line(error)));
        if let Some(ms) = node.error_age_ms {
            out.push_str(&format!(" ({} ago)", duration(ms)));
        }
    }
    out.push('\n');
    let last = node.children.len().saturating_sub(1);
    for (i, child) in node.children.iter().enumerate() {
        let (branch, rest) = if i == last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        line(
            out,
            child,
            &format!("{child_lead}{branch}"),
            &format!("{child_lead}{rest}"),
        );
    }
}

/// Control characters (an error's newline) as spaces: one node, one line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fencing::FenceReason;
    use crate::model::ShardId;
    use crate::status::{BudgetView, CoreActorStatus, KeeperStatus};

    pub(crate) fn shard(id: &str, state: ShardState) -> ShardStatus {
        ShardStatus {
            shard_id: ShardId::new(id),
            stream: None,
            state,
            lease_counter: 1,
            checkpoint: Some("TRIM_HORIZON".to_owned()),
            last_delivered: None,
            millis_behind_latest: Some(250),
            records_delivered: 10,
            bytes_delivered: 1000,
            records_per_second: 2.5,
            bytes_per_second: 250.0,
            last_error: None,
            last_error_ms_ago: None,
            in_flight_records: 3,
            in_flight_bytes: 300,
            memory_bytes: 900,
            restarts: 0,
            fenced: None,
            stall: None,
            subscription: None,
            records_discarded: 0,
            last_failure: None,
            lanes: Vec::new(),
        }
    }

    pub(crate) fn worker(shards: Vec<ShardStatus>) -> WorkerStatus {
        WorkerStatus {
            worker_id: "w-1".to_owned(),
            application: "app".to_owned(),
            stream: "orders".to_owned(),
            source: "kinesis",
            read_mode: "polling",
            state: "running",
            uptime_ms: 61_500,
            shutting_down: false,
            shards,
            shard_restarts: 0,
            core: ["stream_watcher", "lease_keeper", "checkpoint_writer"]
                .into_iter()
                .map(|name| CoreActorStatus {
                    name,
                    state: "running".to_owned(),
                    restarts: 0,
                })
                .collect(),
            leases: None,
            stream_watcher: None,
            checkpoints: Default::default(),
            metrics: None,
            budget: BudgetView {
                total_bytes: 0,
                in_use_bytes: 0,
                share_bytes: 0,
                shards: 0,
                shards_waiting: 0,
                peak_bytes: 0,
            },
        }
    }

    /// Which shard states are a stall, and what the stall says.
    #[test]
    fn stalls_name_why_the_shard_is_not_processed() {
        let fenced = |reason: Option<FenceReason>| {
            let mut s = shard("s", ShardState::Fenced);
            s.fenced = reason;
            s
        };
        let failed = {
            let mut s = shard("s", ShardState::Restarting);
            s.last_error = Some("processor panicked".to_owned());
            s
        };
        let cases: Vec<(&str, ShardStatus, Option<&str>)> = vec![
            ("processing", shard("s", ShardState::Processing), None),
            ("caught up", shard("s", ShardState::CaughtUp), None),
            (
                "throttled: backing off",
                shard("s", ShardState::Throttled),
                None,
            ),
            (
                "waiting on budget",
                shard("s", ShardState::WaitingOnBudget),
                None,
            ),
            (
                "blocked on a parent",
                shard("s", ShardState::BlockedOnParent),
                None,
            ),
            ("handing off", shard("s", ShardState::HandingOff), None),
            (
                "fenced, revoked",
                fenced(Some(FenceReason::Revoked {
                    why: "owner is w-2".to_owned(),
                })),
                Some("fenced: lease revoked: owner is w-2"),
            ),
            ("fenced, no reason", fenced(None), Some("fenced")),
            (
                "restarting",
                failed,
                Some("restarting after a failure: processor panicked"),
            ),
            (
                "lease lost",
                shard("s", ShardState::LeaseLost),
                Some("lease lost: another worker owns it now"),
            ),
            (
                "stalled",
                ShardStatus {
                    stall: Some(
                        "the MultiLang child has not answered processRecords for 31 s".to_owned(),
                    ),
                    ..shard("s", ShardState::Stalled)
                },
                Some("stalled: the MultiLang child has not answered processRecords for 31 s"),
            ),
            (
                "stalled, no reason",
                shard("s", ShardState::Stalled),
                Some("stalled"),
            ),
        ];
        for (name, shard, want) in cases {
            assert_eq!(stall(&shard).as_deref(), want, "{name}");
        }
    }

    /// The tree's shape: supervisor, core actors in the snapshot's order, then readers
    /// by stream and shard id, each with its processor.
    #[test]
    fn the_tree_has_the_core_actors_then_a_reader_and_processor_per_shard() {
        let mut other_stream = shard("shardId-000000000000", ShardState::Processing);
        other_stream.stream = Some("audit".to_owned());
        type Case = (&'static str, WorkerStatus, Vec<(usize, &'static str)>);
        let cases: Vec<Case> = vec![
            (
                "no shards",
                worker(vec![]),
                vec![
                    (0, "supervisor"),
                    (1, "stream_watcher"),
                    (1, "lease_keeper"),
                    (1, "checkpoint_writer"),
                ],
            ),
            (
                "shards sorted, each with a processor",
                worker(vec![
                    shard("shardId-000000000002", ShardState::Processing),
                    shard("shardId-000000000001", ShardState::Fenced),
                ]),
                vec![
                    (0, "supervisor"),
                    (1, "stream_watcher"),
                    (1, "lease_keeper"),
                    (1, "checkpoint_writer"),
                    (1, "reader shardId-000000000001"),
                    (2, "processor"),
                    (1, "reader shardId-000000000002"),
                    (2, "processor"),
                ],
            ),
            (
                "a single stream's shards before a named stream's",
                worker(vec![
                    other_stream,
                    shard("shardId-000000000001", ShardState::Processing),
                ]),
                vec![
                    (0, "supervisor"),
                    (1, "stream_watcher"),
                    (1, "lease_keeper"),
                    (1, "checkpoint_writer"),
                    (1, "reader shardId-000000000001"),
                    (2, "processor"),
                    (1, "reader audit/shardId-000000000000"),
                    (2, "processor"),
                ],
            ),
        ];
        for (name, status, want) in cases {
            let root = tree(&status);
            let got: Vec<(usize, &str)> = root
                .walk()
                .into_iter()
                .map(|(d, n)| (d, n.name.as_str()))
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    /// What each node carries: a reader its lag, rates, restarts, error and stall; the
    /// keeper its heartbeat failure.
    #[test]
    fn nodes_carry_state_restarts_errors_and_rates() {
        let mut failing = shard("shardId-000000000001", ShardState::Restarting);
        failing.restarts = 3;
        failing.last_error = Some("boom".to_owned());
        failing.last_error_ms_ago = Some(90_500);
        let mut status = worker(vec![failing]);
        status.leases = Some(KeeperStatus {
            held: vec!["shardId-000000000001".to_owned()],
            live_workers: vec![],
            peers: vec![],
            heartbeat_counter: 4,
            heartbeat_age_ms: Some(7_000),
            heartbeat_failures: 2,
            heartbeat_error: Some("throttled".to_owned()),
            malformed_rows: vec![],
            cooling: vec![],
            requested: vec![],
            handing_off: vec![],
            draining: false,
            gained: Default::default(),
            given: Default::default(),
        });
        let root = tree(&status);
        let keeper = &root.children[1];
        assert_eq!(keeper.name, "lease_keeper");
        assert_eq!(
            keeper.last_error.as_deref(),
            Some("heartbeat: 2 failed in a row: throttled")
        );
        assert!(
            keeper
                .facts
                .contains(&("heartbeat".into(), "confirmed 7s ago".into()))
        );
        let reader = &root.children[3];
        assert_eq!(reader.state, "restarting");
        assert_eq!(reader.restarts, Some(3));
        assert_eq!(reader.last_error.as_deref(), Some("boom"));
        assert_eq!(reader.error_age_ms, Some(90_500));
        assert!(
            render_text(&root).contains("  error: boom (1m 30s ago)\n"),
            "{}",
            render_text(&root)
        );
        assert_eq!(
            reader.stall.as_deref(),
            Some("restarting after a failure: boom")
        );
        assert!(reader.facts.contains(&("lag".into(), "250 ms".into())));
        assert!(reader.facts.contains(&("records/s".into(), "2.5".into())));
        assert_eq!(reader.children[0].state, "restarting");
    }

    /// The text is the tree's nodes, one a line, in the tree's order, with guides.
    #[test]
    fn the_text_draws_every_node_in_order() {
        let mut fenced = shard("shardId-000000000002", ShardState::Fenced);
        fenced.fenced = Some(FenceReason::NotHeld);
        let root = tree(&worker(vec![
            shard("shardId-000000000001", ShardState::Processing),
            fenced,
        ]));
        let text = render_text(&root);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), root.walk().len(), "{text}");
        assert!(lines[0].starts_with("supervisor  running"), "{text}");
        assert!(
            lines[1].starts_with("├─ stream_watcher  running  restarts 0"),
            "{text}"
        );
        assert!(
            lines[4]
                .starts_with("├─ reader shardId-000000000001  processing  restarts 0  lag 250 ms"),
            "{text}"
        );
        assert!(lines[5].starts_with("│  └─ processor  running"), "{text}");
        assert!(
            lines[6].starts_with("└─ reader shardId-000000000002  fenced"),
            "{text}"
        );
        assert!(
            lines[6].ends_with("STALLED: fenced: the lease is not held under this counter"),
            "{text}"
        );
        assert!(lines[7].starts_with("   └─ processor"), "{text}");
    }
}
