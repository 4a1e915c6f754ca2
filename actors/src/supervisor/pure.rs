//! The supervisor's decisions, over plain facts: what a child's end means, whether a
//! failed shard restarts or is given up, whether a failed core restarts or stops the
//! worker, and which requests each phase of the worker's life still serves.
//!
//! Nothing here touches an actor, reads a clock or draws a random number: the shell
//! (`supervisor/mod.rs`) finds which child ended and asks the restart intensity for a
//! [`Verdict`], calls these, and does what they say (casts, restarts, stops).
//!
//! * A failed shard reader (or its processor) restarts from the last checkpoint after a
//!   jittered exponential backoff. Past `shard_max_restarts` within
//!   `shard_restart_window` its lease is released and the shard cooled down locally.
//! * A failed core actor restarts the whole core (they hold references to each other)
//!   and every shard reader; past `core_max_restarts` within `core_restart_window` the
//!   worker stops with an error.

use std::time::Duration;

use crate::backoff::Verdict;
use crate::protocol::StopReason;

/// Where the worker is in its life, from the supervisor's two marks (a shutdown asked
/// for, its drain over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reading: gained leases get readers, failed children are restarted.
    Running,
    /// A shutdown was asked for and the keeper hands leases to the peers that ask for
    /// them. Readers keep reading (and restart on failure) until theirs is asked for;
    /// no new lease gets a reader.
    Draining,
    /// Past the drain: every child is being stopped on purpose, so their ends are
    /// expected, not failures.
    Stopping,
}

impl Phase {
    /// `stopping` (the drain is over) wins over `draining` (a shutdown is asked for).
    pub(crate) fn of(drain_over: bool, shutdown_asked: bool) -> Self {
        match (drain_over, shutdown_asked) {
            (true, _) => Self::Stopping,
            (false, true) => Self::Draining,
            (false, false) => Self::Running,
        }
    }

    /// A gained lease gets a reader. Draining or stopping, it is left to the keeper,
    /// which releases it with the rest.
    pub(crate) fn takes_leases(self) -> bool {
        match self {
            Self::Running => true,
            Self::Draining | Self::Stopping => false,
        }
    }

    /// A shutdown request starts the drain; a second one is answered by the first
    /// one's report only.
    pub(crate) fn accepts_shutdown(self) -> bool {
        self.takes_leases()
    }

    /// Children that end are supervised (restarted, given up on, reported): not once
    /// the supervisor stops them itself.
    pub(crate) fn supervises(self) -> bool {
        match self {
            Self::Running | Self::Draining => true,
            Self::Stopping => false,
        }
    }

    /// `WorkerStatus::state`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Draining => "draining",
            Self::Stopping => "stopping",
        }
    }
}

/// How a child ended, from its supervision event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChildEnd {
    /// Stopped at its shard's end (SHARD_END written).
    ShardEnd,
    /// Stopped because its lease is another worker's now.
    LeaseLost,
    /// Stopped gracefully (a shutdown or a handoff).
    Shutdown,
    /// Failed (panicked or returned an error), or stopped for no reason it gives: the
    /// error, as text.
    Failed(String),
}

impl ChildEnd {
    /// A child stopped with `reason`: one of the protocol's [`StopReason`]s, or a
    /// failure that names what it said.
    pub(crate) fn stopped(reason: Option<&str>) -> Self {
        match StopReason::parse(reason) {
            Some(StopReason::ShardEnd) => Self::ShardEnd,
            Some(StopReason::LeaseLost) => Self::LeaseLost,
            Some(StopReason::Shutdown) => Self::Shutdown,
            None => Self::Failed(format!(
                "stopped unexpectedly ({})",
                reason.unwrap_or("no reason given")
            )),
        }
    }
}

/// Which of the supervisor's children ended, as the shell found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Child {
    /// A shard reader. `current`: it is its shard's reader now, not one of an earlier
    /// epoch ending late. `handing_off`: its shard is being passed on, so its end is
    /// the handoff task's to report.
    Reader { current: bool, handing_off: bool },
    /// The HTTP status endpoint: read-only and stateless, outside the core.
    StatusServer,
    /// A core actor, by name (`lease_keeper`, …).
    Core(&'static str),
    /// None of the supervisor's current children (a reader already forgotten).
    Unknown,
}

/// What the lease keeper is told about a shard whose reader is gone for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeeperNote {
    /// The shard is finished: its children may be taken.
    Finished,
    /// The lease is not held any more.
    Lost,
}

/// What the supervisor does when a child ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing: the worker is stopping its children itself, or the child is not one
    /// of its own any more.
    Ignore,
    /// A reader of an earlier epoch ended late: forget it, leave its shard alone.
    StaleReader,
    /// The shard is done on this worker: drop its entry and tell the keeper, unless
    /// `None` (a handoff task reports it).
    ShardDone(Option<KeeperNote>),
    /// The shard's reader failed: restart it or give the shard up, as
    /// [`shard_recovery`] says for the shard's restart intensity.
    ShardFailed(String),
    /// Start the status endpoint again; the worker goes on either way.
    RestartStatusServer,
    /// A core actor ended: restart the core or stop the worker, as [`core_recovery`]
    /// says for the core's restart intensity.
    CoreFailed { name: &'static str, why: String },
}

/// What a child's end means. Every end of a core actor is a failure, even a graceful
/// stop: the core is never stopped but by the supervisor.
pub(crate) fn on_exit(phase: Phase, child: Child, end: ChildEnd) -> Step {
    if !phase.supervises() {
        return Step::Ignore;
    }
    match child {
        Child::Reader { current: false, .. } => Step::StaleReader,
        Child::Reader {
            current: true,
            handing_off: true,
        } => Step::ShardDone(match end {
            ChildEnd::ShardEnd => Some(KeeperNote::Finished),
            ChildEnd::LeaseLost => Some(KeeperNote::Lost),
            // The handoff task reports the rest to the keeper.
            ChildEnd::Shutdown | ChildEnd::Failed(_) => None,
        }),
        Child::Reader {
            current: true,
            handing_off: false,
        } => match end {
            ChildEnd::ShardEnd => Step::ShardDone(Some(KeeperNote::Finished)),
            ChildEnd::LeaseLost | ChildEnd::Shutdown => Step::ShardDone(Some(KeeperNote::Lost)),
            ChildEnd::Failed(why) => Step::ShardFailed(why),
        },
        Child::StatusServer => Step::RestartStatusServer,
        Child::Core(name) => Step::CoreFailed {
            name,
            why: match end {
                ChildEnd::Failed(why) => why,
                ChildEnd::ShardEnd | ChildEnd::LeaseLost | ChildEnd::Shutdown => {
                    "stopped".to_owned()
                }
            },
        },
        Child::Unknown => Step::Ignore,
    }
}

/// What happens to a shard whose reader failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShardRecovery {
    /// Start a reader again after the backoff's next delay. `fresh_backoff`: the first
    /// restart within the window starts the backoff over from its minimum.
    Restart { attempt: u32, fresh_backoff: bool },
    /// Release the lease and forget the shard: it failed too often.
    GiveUp { restarts_in_window: u32 },
}

/// The shard's restart intensity's verdict, as what to do.
pub(crate) fn shard_recovery(verdict: Verdict) -> ShardRecovery {
    match verdict {
        Verdict::Restart { attempt } => ShardRecovery::Restart {
            attempt,
            fresh_backoff: attempt == 1,
        },
        Verdict::GiveUp { restarts_in_window } => ShardRecovery::GiveUp { restarts_in_window },
    }
}

/// What happens to the worker when a core actor failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CoreRecovery {
    /// Stop every reader and the core, and start the core afresh (the new keeper takes
    /// this worker's leases again).
    Restart,
    /// Stop the worker with `reason` (what `Worker::wait` returns).
    Stop { reason: String },
}

/// The core's restart intensity's verdict for core actor `name`, failed with `why`;
/// `window` is `supervision.core_restart_window`, for the reason's text.
pub(crate) fn core_recovery(
    verdict: Verdict,
    name: &str,
    why: &str,
    window: Duration,
) -> CoreRecovery {
    match verdict {
        Verdict::Restart { .. } => CoreRecovery::Restart,
        Verdict::GiveUp { restarts_in_window } => CoreRecovery::Stop {
            reason: format!(
                "the {name} failed {restarts_in_window} times within {}: {why}",
                humantime::format_duration(window)
            ),
        },
    }
}

/// What a request to pass a shard on (to a peer, or back to nobody) finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOff {
    /// Held under the request's epoch and not being passed already: mark it, stop its
    /// reader if it has one, flush, pass it on.
    Claim,
    /// Held under another epoch, or already being passed on: nothing to do.
    Skip,
    /// Not held here (given up, or between two epochs): flush and pass it on anyway, so
    /// the keeper answers the request.
    Unheld,
}

impl HandOff {
    /// `held`: the shard's entry, if any, as (held under the request's fence, already
    /// being handed off).
    pub(crate) fn of(held: Option<(bool, bool)>) -> Self {
        match held {
            Some((true, false)) => Self::Claim,
            Some((false, _)) | Some((true, true)) => Self::Skip,
            None => Self::Unheld,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (the two marks, phase, label, takes leases, accepts a shutdown, supervises)
    type PhaseRow = ((bool, bool), Phase, &'static str, bool, bool, bool);
    /// (name, the entry as (same fence, handing off), what the request finds)
    type HandOffRow = (&'static str, Option<(bool, bool)>, HandOff);

    const RUNNING: Phase = Phase::Running;
    const DRAINING: Phase = Phase::Draining;
    const STOPPING: Phase = Phase::Stopping;
    const READER: Child = Child::Reader {
        current: true,
        handing_off: false,
    };
    const PASSING: Child = Child::Reader {
        current: true,
        handing_off: true,
    };
    const STALE: Child = Child::Reader {
        current: false,
        handing_off: false,
    };
    const STALE_PASSING: Child = Child::Reader {
        current: false,
        handing_off: true,
    };
    const KEEPER: Child = Child::Core("lease_keeper");

    fn failed(why: &str) -> ChildEnd {
        ChildEnd::Failed(why.to_owned())
    }

    fn core(why: &str) -> Step {
        Step::CoreFailed {
            name: "lease_keeper",
            why: why.to_owned(),
        }
    }

    /// Every phase, every kind of child and every end: input → the step the supervisor
    /// takes.
    #[test]
    fn scenarios() {
        use ChildEnd::{LeaseLost, ShardEnd, Shutdown};
        use KeeperNote::{Finished, Lost};
        use Step::{Ignore, RestartStatusServer, ShardDone, StaleReader};
        let table: &[(&str, Phase, Child, ChildEnd, Step)] = &[
            // A reader that ends on its own.
            (
                "reader at shard end",
                RUNNING,
                READER,
                ShardEnd,
                ShardDone(Some(Finished)),
            ),
            (
                "reader lost its lease",
                RUNNING,
                READER,
                LeaseLost,
                ShardDone(Some(Lost)),
            ),
            (
                "reader shut down",
                RUNNING,
                READER,
                Shutdown,
                ShardDone(Some(Lost)),
            ),
            (
                "reader failed",
                RUNNING,
                READER,
                failed("boom"),
                Step::ShardFailed("boom".into()),
            ),
            (
                "reader failed while draining: still restarted",
                DRAINING,
                READER,
                failed("boom"),
                Step::ShardFailed("boom".into()),
            ),
            (
                "reader at shard end while draining",
                DRAINING,
                READER,
                ShardEnd,
                ShardDone(Some(Finished)),
            ),
            // A reader whose shard is being handed off: the handoff task reports a
            // graceful stop or a failure; shard end and loss are the keeper's at once.
            (
                "passing reader at shard end",
                RUNNING,
                PASSING,
                ShardEnd,
                ShardDone(Some(Finished)),
            ),
            (
                "passing reader lost its lease",
                RUNNING,
                PASSING,
                LeaseLost,
                ShardDone(Some(Lost)),
            ),
            (
                "passing reader shut down",
                RUNNING,
                PASSING,
                Shutdown,
                ShardDone(None),
            ),
            (
                "passing reader failed",
                DRAINING,
                PASSING,
                failed("boom"),
                ShardDone(None),
            ),
            // An earlier epoch's reader ending late leaves the shard alone, whatever.
            (
                "stale reader failed",
                RUNNING,
                STALE,
                failed("boom"),
                StaleReader,
            ),
            (
                "stale reader at shard end",
                RUNNING,
                STALE,
                ShardEnd,
                StaleReader,
            ),
            (
                "stale passing reader lost",
                DRAINING,
                STALE_PASSING,
                LeaseLost,
                StaleReader,
            ),
            // The status endpoint restarts alone, however it ended.
            (
                "status server failed",
                RUNNING,
                Child::StatusServer,
                failed("bind"),
                RestartStatusServer,
            ),
            (
                "status server stopped",
                DRAINING,
                Child::StatusServer,
                Shutdown,
                RestartStatusServer,
            ),
            // Any end of a core actor is a failure of the core.
            (
                "core actor failed",
                RUNNING,
                KEEPER,
                failed("table gone"),
                core("table gone"),
            ),
            (
                "core actor stopped gracefully",
                RUNNING,
                KEEPER,
                Shutdown,
                core("stopped"),
            ),
            (
                "core actor at shard end",
                DRAINING,
                KEEPER,
                ShardEnd,
                core("stopped"),
            ),
            (
                "core actor lost",
                RUNNING,
                KEEPER,
                LeaseLost,
                core("stopped"),
            ),
            // Not ours.
            (
                "unknown child",
                RUNNING,
                Child::Unknown,
                failed("x"),
                Ignore,
            ),
            (
                "unknown child stopped",
                DRAINING,
                Child::Unknown,
                Shutdown,
                Ignore,
            ),
            // Stopping: the supervisor ends its children itself.
            (
                "stopping: reader failed",
                STOPPING,
                READER,
                failed("boom"),
                Ignore,
            ),
            (
                "stopping: reader shut down",
                STOPPING,
                READER,
                Shutdown,
                Ignore,
            ),
            (
                "stopping: passing reader",
                STOPPING,
                PASSING,
                ShardEnd,
                Ignore,
            ),
            ("stopping: stale reader", STOPPING, STALE, LeaseLost, Ignore),
            (
                "stopping: status server",
                STOPPING,
                Child::StatusServer,
                Shutdown,
                Ignore,
            ),
            (
                "stopping: core actor",
                STOPPING,
                KEEPER,
                failed("x"),
                Ignore,
            ),
            (
                "stopping: unknown",
                STOPPING,
                Child::Unknown,
                ShardEnd,
                Ignore,
            ),
        ];
        for (name, phase, child, end, expected) in table {
            assert_eq!(
                on_exit(*phase, *child, end.clone()),
                *expected,
                "{name}: {phase:?}, {child:?}, {end:?}"
            );
        }
        // The table names every arm: each phase, each kind of child, each end.
        let phases = [RUNNING, DRAINING, STOPPING];
        assert!(phases.iter().all(|p| table.iter().any(|row| row.1 == *p)));
        let children = [READER, PASSING, STALE, STALE_PASSING, KEEPER];
        assert!(children.iter().all(|c| table.iter().any(|row| row.2 == *c)));
        assert!(table.iter().any(|row| row.2 == Child::StatusServer));
        assert!(table.iter().any(|row| row.2 == Child::Unknown));
        for end in [ShardEnd, LeaseLost, Shutdown, failed("")] {
            let kind = std::mem::discriminant(&end);
            assert!(
                table
                    .iter()
                    .any(|row| std::mem::discriminant(&row.3) == kind),
                "{end:?}"
            );
        }
    }

    #[test]
    fn a_stop_reason_is_an_end_and_anything_else_a_failure() {
        let table: &[(Option<&str>, ChildEnd)] = &[
            (Some("shard_end"), ChildEnd::ShardEnd),
            (Some("lease_lost"), ChildEnd::LeaseLost),
            (Some("shutdown"), ChildEnd::Shutdown),
            (Some("oops"), failed("stopped unexpectedly (oops)")),
            (None, failed("stopped unexpectedly (no reason given)")),
        ];
        for (reason, expected) in table {
            assert_eq!(ChildEnd::stopped(*reason), *expected, "{reason:?}");
        }
    }

    #[test]
    fn a_failed_shard_restarts_with_backoff_until_the_window_is_full() {
        let table: &[(&str, Verdict, ShardRecovery)] = &[
            (
                "first failure in the window: the backoff starts over",
                Verdict::Restart { attempt: 1 },
                ShardRecovery::Restart {
                    attempt: 1,
                    fresh_backoff: true,
                },
            ),
            (
                "a later failure: the backoff keeps growing",
                Verdict::Restart { attempt: 3 },
                ShardRecovery::Restart {
                    attempt: 3,
                    fresh_backoff: false,
                },
            ),
            (
                "past the limit: given up",
                Verdict::GiveUp {
                    restarts_in_window: 4,
                },
                ShardRecovery::GiveUp {
                    restarts_in_window: 4,
                },
            ),
        ];
        for (name, verdict, expected) in table {
            assert_eq!(shard_recovery(*verdict), *expected, "{name}");
        }
    }

    #[test]
    fn a_failed_core_restarts_until_the_window_is_full_then_stops_the_worker() {
        let window = Duration::from_secs(60);
        let table: &[(&str, Verdict, CoreRecovery)] = &[
            (
                "first failure",
                Verdict::Restart { attempt: 1 },
                CoreRecovery::Restart,
            ),
            (
                "a later failure",
                Verdict::Restart { attempt: 2 },
                CoreRecovery::Restart,
            ),
            (
                "past the limit: the reason names the actor, the count, the window, the error",
                Verdict::GiveUp {
                    restarts_in_window: 3,
                },
                CoreRecovery::Stop {
                    reason: "the lease_keeper failed 3 times within 1m: table gone".to_owned(),
                },
            ),
        ];
        for (name, verdict, expected) in table {
            assert_eq!(
                core_recovery(*verdict, "lease_keeper", "table gone", window),
                *expected,
                "{name}"
            );
        }
    }

    #[test]
    fn each_phase_serves_what_it_should() {
        // (marks, phase, label, takes leases, accepts a shutdown, supervises)
        let table: &[PhaseRow] = &[
            ((false, false), RUNNING, "running", true, true, true),
            ((false, true), DRAINING, "draining", false, false, true),
            ((true, false), STOPPING, "stopping", false, false, false),
            ((true, true), STOPPING, "stopping", false, false, false),
        ];
        for ((drain_over, asked), phase, label, takes, accepts, supervises) in table {
            let got = Phase::of(*drain_over, *asked);
            assert_eq!(got, *phase, "{drain_over} {asked}");
            assert_eq!(got.label(), *label, "{phase:?}");
            assert_eq!(got.takes_leases(), *takes, "{phase:?}");
            assert_eq!(got.accepts_shutdown(), *accepts, "{phase:?}");
            assert_eq!(got.supervises(), *supervises, "{phase:?}");
        }
    }

    #[test]
    fn a_hand_off_claims_only_a_shard_held_under_its_epoch_and_not_passing() {
        let table: &[HandOffRow] = &[
            ("held, same epoch", Some((true, false)), HandOff::Claim),
            (
                "held, same epoch, already passing",
                Some((true, true)),
                HandOff::Skip,
            ),
            (
                "held under another epoch",
                Some((false, false)),
                HandOff::Skip,
            ),
            ("another epoch, passing", Some((false, true)), HandOff::Skip),
            ("not held", None, HandOff::Unheld),
        ];
        for (name, held, expected) in table {
            assert_eq!(HandOff::of(*held), *expected, "{name}");
        }
    }
}
