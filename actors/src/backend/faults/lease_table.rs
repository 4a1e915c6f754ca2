//! The fault injector on the [`LeaseTable`], each call named by its method; reads also
//! count the items and read units they cost.

use futures::future::BoxFuture;

use super::{ENDPOINT, Faulty, Injected};
use crate::backend::{
    HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable, ScanOutput, TableState,
};
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId, WorkerLoad,
};

impl Injected for LeaseError {
    fn throttled(op: &'static str) -> Self {
        LeaseError::Throttled {
            op,
            message: "injected throttle".into(),
        }
    }
    fn transient(op: &'static str, why: &str) -> Self {
        LeaseError::Transient {
            op,
            endpoint: ENDPOINT.into(),
            message: why.into(),
        }
    }
}

impl<B: LeaseTable> LeaseTable for Faulty<B> {
    fn table_name(&self) -> &str {
        self.inner.table_name()
    }

    fn worker_table_name(&self) -> &str {
        self.inner.worker_table_name()
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        Box::pin(self.run("ensure_table", self.inner.ensure_table()))
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        Box::pin(async move {
            let scan = self.run("scan", self.inner.scan()).await?;
            let rows =
                scan.leases.len() + scan.heartbeats.len() + scan.malformed.len() + scan.other_rows;
            self.count_items("scan", rows);
            self.count_units("scan", scan.read_units);
            Ok(scan)
        })
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        Box::pin(async move {
            let got = self.run("get", self.inner.get(key)).await?;
            self.count_items("get", 1);
            Ok(got)
        })
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run("create_if_absent", self.inner.create_if_absent(lease)))
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(self.run("take", self.inner.take(key, expected, new_owner)))
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(
            self.run(
                "take",
                self.inner
                    .take_expired(key, expected, new_owner, owner_heartbeat),
            ),
        )
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("release", self.inner.release(key, expected)))
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("renew", self.inner.renew(key, expected)))
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run(
            "checkpoint",
            self.inner.checkpoint(key, expected, checkpoint, children),
        ))
    }

    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run(
            "prepare_checkpoint",
            self.inner.prepare_checkpoint(key, expected, pending, state),
        ))
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("delete", self.inner.delete(key, expected)))
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run(
            "request_handoff",
            self.inner.request_handoff(key, expected, requester),
        ))
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("transfer", self.inner.transfer(key, expected, to)))
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("clear_handoff", self.inner.clear_handoff(key, requester)))
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("heartbeat", self.inner.heartbeat(worker, load)))
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("remove_heartbeat", self.inner.remove_heartbeat(worker)))
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("join_roster", self.inner.join_roster(workers)))
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        Box::pin(async move {
            let out = self
                .run("heartbeats", self.inner.heartbeats(detail))
                .await?;
            self.count_items("heartbeats", out.items_read);
            self.count_units("heartbeats", out.read_units);
            if out.summary {
                // Which of the reads went through the heartbeat index.
                *self.lock().calls.entry("heartbeats_summary").or_insert(0) += 1;
            }
            Ok(out)
        })
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run(
            "remove_dead_heartbeat",
            self.inner.remove_dead_heartbeat(worker, counter),
        ))
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a crate::backend::layout::Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run("retire_legacy", self.inner.retire_legacy(plan)))
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run(
            "stamp_source",
            self.inner.stamp_source(key, source, created, overwrite),
        ))
    }
}
