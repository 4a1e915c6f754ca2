//! [`Renewing`] as the lease table: fenced writes go through its gate and its lives,
//! reads show the life's counter, and everything else passes through unchanged.

use futures::future::BoxFuture;

use super::Renewing;
use crate::backend::{
    HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable, ScanOutput, TableState,
};
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId, WorkerLoad,
};

impl LeaseTable for Renewing {
    fn table_name(&self) -> &str {
        self.inner.table_name()
    }

    fn worker_table_name(&self) -> &str {
        self.inner.worker_table_name()
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        self.inner.ensure_table()
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        Box::pin(async move {
            let mut out = self.inner.scan().await?;
            let lives = self.lives();
            out.leases = out.leases.into_iter().map(|l| lives.show(l)).collect();
            Ok(out)
        })
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        Box::pin(async move {
            let row = self.inner.get(key).await?;
            Ok(row.map(|l| self.lives().show(l)))
        })
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.create_if_absent(lease)
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move {
            let result = self
                .fenced(key, expected, true, |f| {
                    Box::pin(async move { self.inner.take(key, &f, new_owner).await })
                })
                .await;
            self.took(result)
        })
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move {
            let result = self
                .fenced(key, expected, true, |f| {
                    Box::pin(async move {
                        self.inner
                            .take_expired(key, &f, new_owner, owner_heartbeat)
                            .await
                    })
                })
                .await;
            self.took(result)
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.fenced(key, expected, true, move |f| {
            Box::pin(async move { self.inner.release(key, &f).await })
        }))
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        // Renewals are this wrapper's own; nobody above renews.
        self.inner.renew(key, expected)
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, false, move |f| {
            Box::pin(async move { self.inner.checkpoint(key, &f, checkpoint, children).await })
        }))
    }

    /// A progress write like a checkpoint: sent under the row's current counter, ordered
    /// with this lease's renewals.
    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, false, move |f| {
            Box::pin(async move { self.inner.prepare_checkpoint(key, &f, pending, state).await })
        }))
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, true, move |f| {
            Box::pin(async move { self.inner.delete(key, &f).await })
        }))
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, false, move |f| {
            Box::pin(async move { self.inner.request_handoff(key, &f, requester).await })
        }))
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.fenced(key, expected, true, move |f| {
            Box::pin(async move { self.inner.transfer(key, &f, to).await })
        }))
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.clear_handoff(key, requester)
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.inner.heartbeat(worker, load)
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.remove_heartbeat(worker)
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.join_roster(workers)
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        self.inner.heartbeats(detail)
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.remove_dead_heartbeat(worker, counter)
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a crate::backend::layout::Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.retire_legacy(plan)
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.stamp_source(key, source, created, overwrite)
    }
}
