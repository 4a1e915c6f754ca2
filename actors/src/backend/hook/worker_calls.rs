//! One struct per method of [`crate::backend::WorkerRows`]: its arguments, how it is sent, and what it
//! tells a [`super::Hook`] (what a `heartbeats` read cost). None is fenced, none
//! writes a lease row.

use futures::future::BoxFuture;

use super::{Call, Op, ReadCost};
use crate::backend::layout::Retirement;
use crate::backend::{HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable};
use crate::model::{Fence, WorkerId, WorkerLoad};

/// [`WorkerRows::heartbeat`](crate::backend::WorkerRows::heartbeat).
pub struct Heartbeat<'a> {
    pub(super) worker: &'a WorkerId,
    pub(super) load: &'a WorkerLoad,
}

impl<'a> Call<'a> for Heartbeat<'a> {
    type Out = u64;
    const OP: Op = Op::Heartbeat;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<u64, LeaseError>> {
        table.heartbeat(self.worker, self.load)
    }
}

/// [`WorkerRows::remove_heartbeat`](crate::backend::WorkerRows::remove_heartbeat).
pub struct RemoveHeartbeat<'a> {
    pub(super) worker: &'a WorkerId,
}

impl<'a> Call<'a> for RemoveHeartbeat<'a> {
    type Out = ();
    const OP: Op = Op::RemoveHeartbeat;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.remove_heartbeat(self.worker)
    }
}

/// [`WorkerRows::join_roster`](crate::backend::WorkerRows::join_roster).
pub struct JoinRoster<'a> {
    pub(super) workers: &'a [WorkerId],
}

impl<'a> Call<'a> for JoinRoster<'a> {
    type Out = ();
    const OP: Op = Op::JoinRoster;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.join_roster(self.workers)
    }
}

/// [`WorkerRows::heartbeats`](crate::backend::WorkerRows::heartbeats).
pub struct Heartbeats {
    pub(super) detail: HeartbeatDetail,
}

impl<'a> Call<'a> for Heartbeats {
    type Out = HeartbeatsOutput;
    const OP: Op = Op::Heartbeats;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<HeartbeatsOutput, LeaseError>> {
        table.heartbeats(self.detail)
    }

    /// The items the read asked for, as it counts them.
    fn read_cost(out: &HeartbeatsOutput) -> Option<ReadCost> {
        Some(ReadCost {
            items: out.items_read,
            units: Some(out.read_units),
            summary: out.summary,
        })
    }
}

/// [`WorkerRows::remove_dead_heartbeat`](crate::backend::WorkerRows::remove_dead_heartbeat).
pub struct RemoveDeadHeartbeat<'a> {
    pub(super) worker: &'a WorkerId,
    pub(super) counter: u64,
}

impl<'a> Call<'a> for RemoveDeadHeartbeat<'a> {
    type Out = bool;
    const OP: Op = Op::RemoveDeadHeartbeat;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<bool, LeaseError>> {
        table.remove_dead_heartbeat(self.worker, self.counter)
    }
}

/// [`WorkerRows::retire_legacy`](crate::backend::WorkerRows::retire_legacy).
pub struct RetireLegacy<'a> {
    pub(super) plan: &'a Retirement,
}

impl<'a> Call<'a> for RetireLegacy<'a> {
    type Out = bool;
    const OP: Op = Op::RetireLegacy;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<bool, LeaseError>> {
        table.retire_legacy(self.plan)
    }
}
