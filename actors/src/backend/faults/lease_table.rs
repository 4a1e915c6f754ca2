//! The fault injector on the lease-table ports, as their [`Hook`]: each call named by
//! its method; reads also count the items and read units they cost.

use futures::future::BoxFuture;

use super::{ENDPOINT, Faulty, Injected};
use crate::backend::hook::{Call, Hook, Op};
use crate::backend::{LeaseError, LeaseTable};

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

/// Each call runs under the fault the plan picks for it (`Faulty::run`); a read that
/// succeeds also counts the items and read units it cost.
impl<B: LeaseTable> Hook for Faulty<B> {
    type Inner = B;

    fn inner(&self) -> &B {
        &self.inner
    }

    fn around<'a, C: Call<'a>>(&'a self, call: C) -> BoxFuture<'a, Result<C::Out, LeaseError>> {
        let op = fault_op(C::OP);
        Box::pin(async move {
            let out = self.run(op, call.send(&self.inner)).await?;
            if let Some(cost) = C::read_cost(&out) {
                self.count_items(op, cost.items);
                if let Some(units) = cost.units {
                    self.count_units(op, units);
                }
                if cost.summary {
                    // Which of the reads went through the heartbeat index.
                    *self.lock().calls.entry("heartbeats_summary").or_insert(0) += 1;
                }
            }
            Ok(out)
        })
    }
}

/// The name a call's faults and counts go by: its method's, but a take of an expired
/// lease is a `take` (plans schedule faults for takes of both kinds by that name).
fn fault_op(op: Op) -> &'static str {
    match op {
        Op::TakeExpired => Op::Take.name(),
        other => other.name(),
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::faults::{Fault, FaultPlan};
    use crate::backend::memory::MemoryDynamo;
    use crate::backend::{HeartbeatDetail, WorkerRows};
    use crate::model::{Checkpoint, Lease, ShardId, WorkerId, WorkerLoad};

    /// A take of an expired lease is faulted and counted as a `take`; a read counts the
    /// items and units its answer reports, and only when it succeeds; a write reads
    /// nothing.
    #[tokio::test(start_paused = true)]
    async fn takes_of_both_kinds_are_faulted_as_take_and_reads_count_what_they_cost() {
        let plan = FaultPlan::seeded(1)
            .then(Some("take"), 1, Fault::Throttle)
            .then(Some("get"), 1, Fault::Transient);
        let table = Faulty::new(MemoryDynamo::new().lease_table("t"), plan);
        table.ensure_table().await.unwrap();
        let lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        assert!(table.create_if_absent(&lease).await.unwrap());
        let me = WorkerId::new("me");
        let taken = table.take(&lease.key, &lease.fence(), &me).await.unwrap();
        let other = WorkerId::new("other");
        let refused = table
            .take_expired(&lease.key, &taken.fence(), &other, None)
            .await;
        assert!(
            matches!(refused, Err(LeaseError::Throttled { op: "take", .. })),
            "the plan's second take: {refused:?}"
        );
        assert_eq!((table.calls("take"), table.calls("take_expired")), (2, 0));

        table.get(&lease.key).await.unwrap();
        assert!(table.get(&lease.key).await.is_err());
        assert_eq!(table.items_read("get"), 1, "the failed get read nothing");
        let scan = table.scan().await.unwrap();
        assert_eq!(table.items_read("scan"), 1);
        assert_eq!(table.read_units("scan"), scan.read_units);
        table.heartbeat(&me, &WorkerLoad::default()).await.unwrap();
        table.join_roster(std::slice::from_ref(&me)).await.unwrap();
        let beats = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert!(beats.items_read >= 2, "{beats:?}");
        assert_eq!(table.items_read("heartbeats"), beats.items_read as u64);
        assert_eq!(table.read_units("heartbeats"), beats.read_units);
        assert_eq!(table.items_read("heartbeat"), 0);
    }
}
