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
