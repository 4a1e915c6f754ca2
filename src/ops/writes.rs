//! A batch of checkpoint writes (`rewind`, `position import`): each conditional on the
//! lease as it was read, each printed, the failures gathered for one error at the end.

use anyhow::bail;
use flotilla_actors::backend::{LeaseError, LeaseTable};
use flotilla_actors::model::{Checkpoint, Lease, WorkerId};

/// What a batch of checkpoint writes did, printed one lease per line.
#[derive(Debug, Default)]
pub(super) struct Writes {
    pub(super) written: usize,
    pub(super) unchanged: usize,
    pub(super) skipped: usize,
    pub(super) failed: Vec<String>,
}

impl Writes {
    /// ", N failed" when some writes failed, for the summary line.
    pub(super) fn failed_suffix(&self) -> String {
        if self.failed.is_empty() {
            String::new()
        } else {
            format!(", {} failed", self.failed.len())
        }
    }

    pub(super) async fn apply(&mut self, table: &dyn LeaseTable, lease: &Lease, to: &Checkpoint) {
        let key = lease.key.as_str();
        if &lease.checkpoint == to {
            self.unchanged += 1;
            println!("{key}: {to}, unchanged");
            return;
        }
        match table.checkpoint(&lease.key, &lease.fence(), to, &[]).await {
            Ok(()) => {
                self.written += 1;
                println!("{key}: {} -> {to}", lease.checkpoint);
            }
            Err(LeaseError::ConditionFailed { owner, counter, .. }) => {
                let now = match (owner, counter) {
                    (_, None) => "its row is gone".to_owned(),
                    (Some(owner), Some(c)) => format!("{owner} owns it now (counter {c})"),
                    (None, Some(c)) => format!("nobody owns it now (counter {c})"),
                };
                self.failed.push(format!(
                    "{key}: changed since it was read ({now}; owner was {}, counter {})",
                    lease.owner.as_ref().map_or("nobody", WorkerId::as_str),
                    lease.counter
                ));
            }
            Err(other) => self.failed.push(format!("{key}: {other}")),
        }
    }

    pub(super) fn finish(self, what: &str) -> anyhow::Result<()> {
        if self.failed.is_empty() {
            return Ok(());
        }
        bail!(
            "{} of the leases were not {what} (the others were):\n  {}\nA worker may have \
             taken them meanwhile; stop the workers and run the command again",
            self.failed.len(),
            self.failed.join("\n  ")
        )
    }
}
