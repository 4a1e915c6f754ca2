//! The keeper's wiring: its arguments ([`KeeperArgs`]), and what the keeper's parts
//! reach outside themselves through them: the lease table, this worker's name and
//! settings, the fencing board, and an [`Outbox`] for the supervisor's mailbox and the
//! metrics reporter. The actor builds a [`Ports`] from its arguments for each call; a
//! part's tests build one over the memory lease table and a recording outbox, so no
//! part needs an actor to run.

use std::sync::Arc;

use ractor::ActorRef;

use crate::backend::LeaseTable;
use crate::fencing::Fencing;
use crate::model::WorkerId;
use crate::protocol::SupervisorMsg;
use crate::settings::{LeaseSettings, Settings};
use crate::telemetry::{Event, Sample, Telemetry};

/// Where a part sends what it does not handle itself. The shell's implementation casts
/// to the supervisor and records through `Telemetry`; a test's records what it got.
pub(super) trait Outbox: Send + Sync {
    /// A message to the supervisor (cast: the keeper never waits on it).
    fn tell(&self, msg: SupervisorMsg);
    /// An event: its log line and its samples, as `Telemetry::emit` does.
    fn emit(&self, event: &dyn Event);
    /// Gauges and counts that are not events.
    fn record(&self, samples: Vec<Sample>);
}

/// The wiring one call of a part works with, borrowed from the shell's arguments.
pub(super) struct Ports<'a> {
    pub table: &'a dyn LeaseTable,
    pub me: &'a WorkerId,
    pub settings: &'a Settings,
    pub fencing: &'a Fencing,
    pub out: &'a dyn Outbox,
}

impl Ports<'_> {
    pub fn lease(&self) -> &LeaseSettings {
        &self.settings.lease
    }
}

/// What the keeper is started with: the lease table, this worker, its settings, and
/// the boards and mailboxes it shares with the rest of the worker.
pub(crate) struct KeeperArgs {
    pub table: Arc<dyn LeaseTable>,
    pub me: WorkerId,
    pub settings: Arc<Settings>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub telemetry: Telemetry,
    /// Self-fencing: fed by every heartbeat, take, scan and loss.
    pub fencing: Fencing,
    pub lags: crate::boards::LagBoard,
    /// Where each scan's view of the fleet is published, for the status endpoint.
    pub fleet: crate::boards::FleetBoard,
    /// The stream watcher's last listing, to tell orphan rows.
    pub listing: crate::boards::ListingBoard,
    /// Where each scan's lease rows are published, for the stream watcher.
    pub rows: crate::boards::RowsBoard,
    /// The stream set: a former stream's leases are finished, never taken, and its rows
    /// deleted after the grace.
    pub set: crate::boards::StreamSetBoard,
    pub application: String,
    pub stream: String,
}

/// The parts' outbox is the supervisor's mailbox and the metrics reporter.
impl Outbox for KeeperArgs {
    fn tell(&self, msg: SupervisorMsg) {
        let _ = self.supervisor.cast(msg);
    }

    fn emit(&self, event: &dyn Event) {
        self.telemetry.emit_dyn(event);
    }

    fn record(&self, samples: Vec<Sample>) {
        self.telemetry.record(samples);
    }
}

impl KeeperArgs {
    /// The wiring a part's call works with.
    pub(super) fn ports(&self) -> Ports<'_> {
        Ports {
            table: &*self.table,
            me: &self.me,
            settings: &self.settings,
            fencing: &self.fencing,
            out: self,
        }
    }
}

#[cfg(test)]
pub(super) mod testing {
    //! A recording outbox and ports over the memory lease table, for the parts' tests.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::backend::memory::{MemoryDynamo, MemoryLeaseTable};

    /// Records what a part sent.
    #[derive(Default)]
    pub struct Recorder {
        pub told: Mutex<Vec<SupervisorMsg>>,
        pub samples: Mutex<Vec<Sample>>,
    }

    impl Outbox for Recorder {
        fn tell(&self, msg: SupervisorMsg) {
            self.told.lock().unwrap().push(msg);
        }
        fn emit(&self, event: &dyn Event) {
            self.record(event.samples());
        }
        fn record(&self, samples: Vec<Sample>) {
            self.samples.lock().unwrap().extend(samples);
        }
    }

    impl Recorder {
        /// What was told, by variant name (`SupervisorMsg` is not `Debug`).
        pub fn told(&self) -> Vec<&'static str> {
            self.told
                .lock()
                .unwrap()
                .iter()
                .map(|m| match m {
                    SupervisorMsg::LeaseGained(_) => "LeaseGained",
                    SupervisorMsg::LeaseLost(..) => "LeaseLost",
                    SupervisorMsg::HandOff { .. } => "HandOff",
                    SupervisorMsg::Retire { .. } => "Retire",
                    SupervisorMsg::DrainDone => "DrainDone",
                    SupervisorMsg::ListShardsNow => "ListShardsNow",
                    SupervisorMsg::Fatal(_) => "Fatal",
                    _ => "other",
                })
                .collect()
        }
    }

    /// One worker's wiring over a fresh memory lease table.
    pub struct Rig {
        pub table: Arc<MemoryLeaseTable>,
        pub me: WorkerId,
        pub settings: Settings,
        pub fencing: Fencing,
        pub out: Recorder,
    }

    impl Rig {
        pub async fn new(me: &str) -> Self {
            let table = Arc::new(MemoryDynamo::new().lease_table("t"));
            table.ensure_table().await.unwrap();
            Self::on(table, me)
        }

        /// Another worker on the same table.
        pub fn on(table: Arc<MemoryLeaseTable>, me: &str) -> Self {
            let settings = Settings::default();
            Self {
                fencing: Fencing::new(settings.lease.fence_time()),
                table,
                me: WorkerId::new(me),
                settings,
                out: Recorder::default(),
            }
        }

        pub fn ports(&self) -> Ports<'_> {
            Ports {
                table: &*self.table,
                me: &self.me,
                settings: &self.settings,
                fencing: &self.fencing,
                out: &self.out,
            }
        }

        /// A row for shard `n`, unowned, created in the table.
        pub async fn row(&self, n: u64) -> crate::model::Lease {
            let lease = crate::model::Lease::new(
                &crate::model::ShardId::from_index(n),
                crate::model::Checkpoint::TrimHorizon,
                vec![],
                None,
            );
            assert!(self.table.create_if_absent(&lease).await.unwrap());
            lease
        }
    }

    pub const SECOND: Duration = Duration::from_secs(1);
}
