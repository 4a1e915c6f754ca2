//! [`Renewing`] as the lease table, by its [`Hook`]: fenced writes go through its gate
//! and its lives, reads show the life's counter, and everything else passes through
//! unchanged.

use futures::future::BoxFuture;

use super::Renewing;
use crate::backend::hook::{Call, Effect, Fenced, Hook, Rows};
use crate::backend::{LeaseError, LeaseTable};

impl Hook for Renewing {
    type Inner = dyn LeaseTable;

    fn inner(&self) -> &dyn LeaseTable {
        &*self.inner
    }

    fn around<'a, C: Call<'a>>(&'a self, call: C) -> BoxFuture<'a, Result<C::Out, LeaseError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let mut out = match call.fenced() {
                // Renewals are this wrapper's own; nobody above renews.
                Some(Fenced {
                    effect: Effect::Renews,
                    ..
                })
                | None => call.send(inner).await?,
                // A progress write (a prepared checkpoint too, `Keeps`) is sent under the
                // row's current counter, ordered with this lease's renewals; a success of
                // one that `Ends` ends the life.
                Some(Fenced { key, fence, effect }) => {
                    let call = &call;
                    self.fenced(key, fence, effect == Effect::Ends, move |row| {
                        Box::pin(async move { call.send_fenced(inner, &row).await })
                    })
                    .await?
                }
            };
            match C::rows(&mut out) {
                Rows::None => {}
                Rows::Read(leases) => {
                    let lives = self.lives();
                    for lease in leases {
                        lives.show(lease);
                    }
                }
                // A take of any kind: a new life once written (an error is shown
                // already by `fenced`).
                Rows::Taken(lease) => {
                    let mut lives = self.lives();
                    lives.took(lease);
                    lives.show(lease);
                }
            }
            Ok(out)
        })
    }
}
