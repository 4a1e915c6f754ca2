//! One struct per method of [`LeaseTable`]: its arguments, how it is sent, and what it
//! tells a [`super::Hook`] (the fence of a fenced write, what a read cost, the lease
//! rows in its answer, what a write did to its row).

use futures::future::BoxFuture;

use super::{Call, Effect, Fenced, Landed, Op, ReadCost, Rows};
use crate::backend::{LeaseError, LeaseTable, ScanOutput, TableState};
use crate::model::{self, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId};

/// [`LeaseTable::ensure_table`].
pub struct EnsureTable;

impl<'a> Call<'a> for EnsureTable {
    type Out = TableState;
    const OP: Op = Op::EnsureTable;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<TableState, LeaseError>> {
        table.ensure_table()
    }
}

/// [`LeaseTable::scan`].
pub struct Scan;

impl<'a> Call<'a> for Scan {
    type Out = ScanOutput;
    const OP: Op = Op::Scan;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<ScanOutput, LeaseError>> {
        table.scan()
    }

    /// Every row the scan returned, read or not.
    fn read_cost(out: &ScanOutput) -> Option<ReadCost> {
        Some(ReadCost {
            items: out.leases.len() + out.heartbeats.len() + out.malformed.len() + out.other_rows,
            units: Some(out.read_units),
            summary: false,
        })
    }

    fn rows(out: &mut ScanOutput) -> Rows<'_> {
        Rows::Read(&mut out.leases)
    }
}

/// [`LeaseTable::get`].
pub struct Get<'a> {
    pub(super) key: &'a LeaseKey,
}

impl<'a> Call<'a> for Get<'a> {
    type Out = Option<Lease>;
    const OP: Op = Op::Get;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<Option<Lease>, LeaseError>> {
        table.get(self.key)
    }

    /// One item, found or not.
    fn read_cost(_: &Option<Lease>) -> Option<ReadCost> {
        Some(ReadCost {
            items: 1,
            units: None,
            summary: false,
        })
    }

    fn rows(out: &mut Option<Lease>) -> Rows<'_> {
        match out {
            Some(lease) => Rows::Read(std::slice::from_mut(lease)),
            None => Rows::Read(&mut []),
        }
    }
}

/// [`LeaseTable::create_if_absent`].
pub struct CreateIfAbsent<'a> {
    pub(super) lease: &'a Lease,
}

impl<'a> Call<'a> for CreateIfAbsent<'a> {
    type Out = bool;
    const OP: Op = Op::CreateIfAbsent;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<bool, LeaseError>> {
        table.create_if_absent(self.lease)
    }
}

/// [`LeaseTable::take`].
pub struct Take<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
    pub(super) new_owner: &'a WorkerId,
}

impl<'a> Call<'a> for Take<'a> {
    type Out = Lease;
    const OP: Op = Op::Take;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<Lease, LeaseError>> {
        table.take(self.key, fence.unwrap_or(self.expected), self.new_owner)
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Ends))
    }

    fn rows(out: &mut Lease) -> Rows<'_> {
        Rows::Taken(out)
    }

    fn landed<'s>(&'s self, out: &'s Lease) -> Option<Landed<'s>> {
        Some(Landed::Row {
            owner: out.owner.as_ref(),
            counter: out.counter,
        })
    }
}

/// [`LeaseTable::take_expired`].
pub struct TakeExpired<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
    pub(super) new_owner: &'a WorkerId,
    pub(super) owner_heartbeat: Option<u64>,
}

impl<'a> Call<'a> for TakeExpired<'a> {
    type Out = Lease;
    const OP: Op = Op::TakeExpired;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<Lease, LeaseError>> {
        table.take_expired(
            self.key,
            fence.unwrap_or(self.expected),
            self.new_owner,
            self.owner_heartbeat,
        )
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Ends))
    }

    fn rows(out: &mut Lease) -> Rows<'_> {
        Rows::Taken(out)
    }

    fn landed<'s>(&'s self, out: &'s Lease) -> Option<Landed<'s>> {
        Some(Landed::Row {
            owner: out.owner.as_ref(),
            counter: out.counter,
        })
    }
}

/// [`LeaseTable::release`].
pub struct Release<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
}

impl<'a> Call<'a> for Release<'a> {
    type Out = u64;
    const OP: Op = Op::Release;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<u64, LeaseError>> {
        table.release(self.key, fence.unwrap_or(self.expected))
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Ends))
    }

    /// Unowned, at the counter returned.
    fn landed<'s>(&'s self, out: &'s u64) -> Option<Landed<'s>> {
        Some(Landed::Row {
            owner: None,
            counter: *out,
        })
    }
}

/// [`LeaseTable::renew`].
pub struct Renew<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
}

impl<'a> Call<'a> for Renew<'a> {
    type Out = u64;
    const OP: Op = Op::Renew;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<u64, LeaseError>> {
        table.renew(self.key, fence.unwrap_or(self.expected))
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Renews))
    }

    /// The fence's owner still, at the counter returned.
    fn landed<'s>(&'s self, out: &'s u64) -> Option<Landed<'s>> {
        Some(Landed::Row {
            owner: self.expected.owner.as_ref(),
            counter: *out,
        })
    }
}

/// [`LeaseTable::checkpoint`].
pub struct Checkpoint<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
    pub(super) checkpoint: &'a model::Checkpoint,
    pub(super) children: &'a [ShardId],
}

impl<'a> Call<'a> for Checkpoint<'a> {
    type Out = ();
    const OP: Op = Op::Checkpoint;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.checkpoint(
            self.key,
            fence.unwrap_or(self.expected),
            self.checkpoint,
            self.children,
        )
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Keeps))
    }
}

/// [`LeaseTable::prepare_checkpoint`].
pub struct PrepareCheckpoint<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
    pub(super) pending: &'a ExtendedSequenceNumber,
    pub(super) state: Option<&'a [u8]>,
}

impl<'a> Call<'a> for PrepareCheckpoint<'a> {
    type Out = ();
    const OP: Op = Op::PrepareCheckpoint;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.prepare_checkpoint(
            self.key,
            fence.unwrap_or(self.expected),
            self.pending,
            self.state,
        )
    }

    /// A progress write like a checkpoint.
    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Keeps))
    }
}

/// [`LeaseTable::delete`].
pub struct Delete<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
}

impl<'a> Call<'a> for Delete<'a> {
    type Out = ();
    const OP: Op = Op::Delete;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.delete(self.key, fence.unwrap_or(self.expected))
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Ends))
    }

    fn landed<'s>(&'s self, _: &'s ()) -> Option<Landed<'s>> {
        Some(Landed::Deleted)
    }
}

/// [`LeaseTable::request_handoff`].
pub struct RequestHandoff<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
    pub(super) requester: &'a WorkerId,
}

impl<'a> Call<'a> for RequestHandoff<'a> {
    type Out = ();
    const OP: Op = Op::RequestHandoff;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.request_handoff(self.key, fence.unwrap_or(self.expected), self.requester)
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Keeps))
    }
}

/// [`LeaseTable::transfer`].
pub struct Transfer<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) expected: &'a Fence,
    pub(super) to: &'a WorkerId,
}

impl<'a> Call<'a> for Transfer<'a> {
    type Out = u64;
    const OP: Op = Op::Transfer;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<u64, LeaseError>> {
        table.transfer(self.key, fence.unwrap_or(self.expected), self.to)
    }

    fn fenced(&self) -> Option<Fenced<'a>> {
        Some(Fenced::new(self.key, self.expected, Effect::Ends))
    }

    /// Owned by `to`, at the counter returned.
    fn landed<'s>(&'s self, out: &'s u64) -> Option<Landed<'s>> {
        Some(Landed::Row {
            owner: Some(self.to),
            counter: *out,
        })
    }
}

/// [`LeaseTable::clear_handoff`]: conditional on the request, not on a fence.
pub struct ClearHandoff<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) requester: &'a WorkerId,
}

impl<'a> Call<'a> for ClearHandoff<'a> {
    type Out = ();
    const OP: Op = Op::ClearHandoff;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<(), LeaseError>> {
        table.clear_handoff(self.key, self.requester)
    }
}

/// [`LeaseTable::stamp_source`]: conditional on the source, not on a fence.
pub struct StampSource<'a> {
    pub(super) key: &'a LeaseKey,
    pub(super) source: &'a str,
    pub(super) created: Option<u64>,
    pub(super) overwrite: bool,
}

impl<'a> Call<'a> for StampSource<'a> {
    type Out = bool;
    const OP: Op = Op::StampSource;

    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        _: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<bool, LeaseError>> {
        table.stamp_source(self.key, self.source, self.created, self.overwrite)
    }
}
