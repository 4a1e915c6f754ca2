//! The demo's workers: each started with its own id and the demo's settings, asked for
//! its status, crashed (the one holding the most leases), or shut down with the rest.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use flotilla_actors::settings::{FailureSettings, MetricsLevel, ReadMode};
use flotilla_actors::{Backend, KeeperStatus, Settings, Worker, WorkerStatus};
use tokio::task::JoinSet;

use super::check::{CheckingProcessor, SharedCheck};
use super::producer::Feed;
use super::summary::{FleetFigures, Shutdown};

const APPLICATION: &str = "flotilla-demo";

/// The `gained` reasons of [`KeeperStatus`] that mean a lease changed owner, as opposed
/// to a worker taking a brand-new lease or resuming one already in its name.
const MOVED: [&str; 3] = ["expired", "handed_off", "released"];

/// Tuned for a run of seconds rather than days: frequent checkpoints and shard
/// listings, short polls, and lease timings short enough that a crashed worker's leases
/// fail over within the run. Metrics stay in the worker (they feed the progress line).
/// `failure` is the run's `[failure]` (the default, all off, without `--poison`).
fn demo_settings(
    worker_id: String,
    status_bind: std::net::SocketAddr,
    read_mode: ReadMode,
    stream: &str,
    failure: &FailureSettings,
) -> Settings {
    let mut settings = Settings {
        failure: failure.clone(),
        ..Settings::default()
    };
    settings.reader.mode = read_mode;
    settings.status.bind = status_bind.to_string();
    settings.worker.stream = stream.to_owned();
    settings.worker.application = APPLICATION.to_owned();
    settings.worker.worker_id = Some(worker_id);
    settings.lease.failover_time = Duration::from_secs(3);
    settings.lease.heartbeat_interval = Duration::from_millis(500);
    settings.lease.fence_margin = Duration::from_secs(1);
    settings.checkpoint.interval = Duration::from_secs(1);
    settings.reader.poll_interval = Duration::from_millis(50);
    settings.reader.idle_max = Duration::from_millis(200);
    settings.reader.parent_poll_interval = Duration::from_millis(200);
    settings.reader.shard_sync_interval = Duration::from_secs(2);
    settings.metrics.level = MetricsLevel::None;
    settings
}

/// One worker of the fleet and what was last seen of its leases.
pub(super) struct Member {
    pub(super) id: String,
    /// `None` once crashed or handed to the shutdown.
    pub(super) worker: Option<Worker>,
    /// From the last status it answered; a crashed worker's stays as it was just before.
    pub(super) leases: Option<KeeperStatus>,
}

/// The demo's workers, by id.
pub(super) struct Fleet {
    pub(super) members: Vec<Member>,
    crashes: u32,
}

impl Fleet {
    /// Starts the workers one after another, each with its own id, the run's `failure`
    /// policy and processors that all feed `check`.
    pub(super) async fn start(
        workers: u32,
        backend: &Backend,
        check: &SharedCheck,
        status_bind: std::net::SocketAddr,
        read_mode: ReadMode,
        feed: &Feed,
        failure: &FailureSettings,
    ) -> anyhow::Result<Self> {
        let mut members = Vec::new();
        let stream = feed.worker_stream();
        let changes = matches!(feed, Feed::Table { .. });
        for n in 1..=workers {
            let id = format!("demo-{n}");
            let for_processors = check.clone();
            let mut bind = status_bind;
            if bind.port() != 0 {
                let port = u16::try_from(u32::from(bind.port()) + n - 1).with_context(|| {
                    format!("--status-bind {status_bind}: no port left for worker {id}")
                })?;
                bind.set_port(port);
            }
            let worker = Worker::builder()
                .settings(demo_settings(id.clone(), bind, read_mode, &stream, failure))
                .backend(backend.clone())
                .processor(move |_shard| CheckingProcessor {
                    check: for_processors.clone(),
                    changes,
                })
                .start()
                .await
                .with_context(|| format!("cannot start worker {id}"))?;
            #[cfg(feature = "otel")]
            crate::otel::watch(&worker);
            if let Some(addr) = worker.status_addr() {
                if n == 1 {
                    eprintln!("fleet page: http://{addr}/fleet.html");
                }
                eprintln!("status: {id} http://{addr}/status");
            }
            members.push(Member {
                id,
                worker: Some(worker),
                leases: None,
            });
        }
        Ok(Self {
            members,
            crashes: 0,
        })
    }

    /// The ids of the workers not crashed.
    pub(super) fn alive(&self) -> Vec<&str> {
        self.members
            .iter()
            .filter(|m| m.worker.is_some())
            .map(|m| m.id.as_str())
            .collect()
    }

    /// Asks every live worker for its status and remembers its leases. A worker that
    /// does not answer has stopped on its own, which ends the demo.
    pub(super) async fn statuses(&mut self) -> anyhow::Result<Vec<WorkerStatus>> {
        let mut statuses = Vec::new();
        for member in &mut self.members {
            let Some(worker) = &member.worker else {
                continue;
            };
            let status = worker
                .status()
                .await
                .with_context(|| format!("worker {} stopped", member.id))?;
            member.leases = status.leases.clone();
            statuses.push(status);
        }
        Ok(statuses)
    }

    /// Kills the live worker holding the most leases (the first such by id), so the
    /// crash strands as many shards as it can. Never demo-1: its endpoint serves the
    /// fleet page URL printed at the start, and it is always left alive.
    pub(super) async fn crash_one(&mut self) -> anyhow::Result<()> {
        if self.alive().len() <= 1 {
            return Ok(());
        }
        // Fresh counts: the last progress line may be a second old.
        self.statuses().await?;
        let held = |m: &Member| m.leases.as_ref().map_or(0, |l| l.held.len());
        let mut victim: Option<&mut Member> = None;
        for member in self
            .members
            .iter_mut()
            .skip(1)
            .filter(|m| m.worker.is_some())
        {
            if victim.as_ref().is_none_or(|v| held(member) > held(v)) {
                victim = Some(member);
            }
        }
        if let Some(member) = victim
            && let Some(worker) = member.worker.take()
        {
            worker.abort();
            self.crashes += 1;
            eprintln!(
                "demo: crashed {} holding {} leases",
                member.id,
                member.leases.as_ref().map_or(0, |l| l.held.len())
            );
        }
        Ok(())
    }

    pub(super) fn figures(&self) -> FleetFigures {
        let lease_moves = self
            .members
            .iter()
            .filter_map(|m| m.leases.as_ref())
            .flat_map(|l| MOVED.iter().filter_map(|reason| l.gained.get(*reason)))
            .sum();
        FleetFigures {
            workers: self.members.len() as u32,
            crashes: self.crashes,
            lease_moves,
        }
    }

    /// Shuts every live worker down at once, as a fleet being stopped would; Ctrl-C
    /// stops the ones not done yet abruptly. Returns each worker's outcome by id.
    pub(super) async fn shutdown(&mut self) -> Vec<(String, Shutdown)> {
        let mut outcomes: Vec<(String, Shutdown)> = Vec::new();
        let mut running = JoinSet::new();
        let mut index_of = HashMap::new();
        for member in &mut self.members {
            if let Some(worker) = member.worker.take() {
                let task = running.spawn(worker.shutdown());
                index_of.insert(task.id(), outcomes.len());
                outcomes.push((member.id.clone(), Shutdown::Interrupted));
            }
        }
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                joined = running.join_next_with_id() => {
                    let (id, outcome) = match joined {
                        None => break,
                        Some(Ok((id, Ok(report)))) => (id, Shutdown::Report(report)),
                        Some(Ok((id, Err(e)))) => (id, Shutdown::Failed(e.to_string())),
                        Some(Err(e)) => (e.id(), Shutdown::Failed(format!("the shutdown task failed: {e}"))),
                    };
                    if let Some(&index) = index_of.get(&id) {
                        outcomes[index].1 = outcome;
                    }
                }
                _ = &mut ctrl_c => {
                    eprintln!("demo: interrupted; stopping the remaining workers at once");
                    // Dropping a shutdown midway drops its worker, which kills it.
                    running.abort_all();
                    break;
                }
            }
        }
        outcomes
    }
}
