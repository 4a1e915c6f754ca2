//! How the shard's reads are going, for the reader's next step and the state it shows:
//! the backoff between failed calls, the run of failures, the last error, whether the
//! last read was throttled, caught up or held back by the memory budget, the lag, and
//! whether self-fencing holds delivery back.
//!
//! Plain state with no I/O: the reader tells it what happened and acts on what it
//! answers (the events to emit are the reader's).

use std::time::Duration;

use tokio::time::Instant;

use super::pure;
use crate::backend::{CallFailure, Classified, StreamError};
use crate::backoff::Backoff;
use crate::fencing::FenceReason;

pub(super) struct ReadHealth {
    pub backoff: Backoff,
    /// The last GetRecords was throttled; cleared by the next success.
    throttled: bool,
    /// The last GetRecords returned nothing and said the shard is at its tip.
    caught_up: bool,
    millis_behind: Option<u64>,
    /// Stream calls that failed since the last GetRecords answered.
    failures_in_row: u32,
    /// The last call that failed and when, for the status page.
    last_error: Option<(String, Instant)>,
    /// Why delivery is paused, while it is (self-fencing).
    fenced: Option<FenceReason>,
    /// The last read was held back by the memory budget (for the state shown).
    pub budget_wait: bool,
}

/// A change of the fencing verdict, said once.
#[derive(Debug, PartialEq)]
pub(super) enum FenceNews {
    Paused(FenceReason),
    Resumed(FenceReason),
}

impl ReadHealth {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            throttled: false,
            caught_up: false,
            millis_behind: None,
            failures_in_row: 0,
            last_error: None,
            fenced: None,
            budget_wait: false,
        }
    }

    /// A call on the stream answered: ends a run of failures, and says how long it was
    /// when it was long enough to have been reported.
    pub fn answered(&mut self) -> Option<u32> {
        let run = std::mem::take(&mut self.failures_in_row);
        (run >= pure::STALL_REPORT_EVERY).then_some(run)
    }

    /// A read answered (a GetRecords batch or a subscription's event): no backoff, no
    /// throttle, caught up if it was empty at the tip, and its lag.
    pub fn read_ok(&mut self, empty: bool, millis_behind_latest: Option<u64>) {
        self.backoff.reset();
        self.throttled = false;
        self.caught_up = empty && millis_behind_latest.unwrap_or(0) == 0;
        self.millis_behind = millis_behind_latest;
    }

    /// A stream call failed: how many have in a row now.
    pub fn failed(&mut self, error: &StreamError, now: Instant) -> u32 {
        self.throttled = error.call_failure() == CallFailure::Throttled;
        self.last_error = Some((error.to_string(), now));
        self.failures_in_row += 1;
        self.failures_in_row
    }

    pub fn failures_in_row(&self) -> u32 {
        self.failures_in_row
    }

    /// Whether this shard may hand records to its processor now, from self-fencing's
    /// verdict; a change of verdict is news (a new kind of reason counts as a change).
    pub fn fencing(&mut self, verdict: Result<(), FenceReason>) -> (bool, Option<FenceNews>) {
        match verdict {
            Ok(()) => (true, self.fenced.take().map(FenceNews::Resumed)),
            Err(reason) => {
                let news = self.fenced.as_ref().is_none_or(|was| {
                    std::mem::discriminant(was) != std::mem::discriminant(&reason)
                });
                self.fenced = Some(reason.clone());
                (false, news.then_some(FenceNews::Paused(reason)))
            }
        }
    }

    pub fn fenced(&self) -> Option<&FenceReason> {
        self.fenced.as_ref()
    }

    pub fn millis_behind(&self) -> Option<u64> {
        self.millis_behind
    }

    /// The last error and how long ago it was.
    pub fn last_error(&self, now: Instant) -> Option<(&str, Duration)> {
        self.last_error
            .as_ref()
            .map(|(error, at)| (error.as_str(), now.saturating_duration_since(*at)))
    }

    pub fn signals(&self, stalled: bool) -> pure::Signals {
        pure::Signals {
            fenced: self.fenced.is_some(),
            throttled: self.throttled,
            caught_up: self.caught_up,
            budget_wait: self.budget_wait,
            stalled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> ReadHealth {
        ReadHealth::new(Backoff::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
        ))
    }

    fn transient() -> StreamError {
        StreamError::Transient {
            op: "GetRecords",
            endpoint: "http://127.0.0.1:1".into(),
            message: "connection reset".into(),
        }
    }

    #[test]
    fn a_run_of_failures_is_reported_only_once_it_was_long() {
        let mut health = health();
        let now = Instant::now();
        assert_eq!(health.failed(&transient(), now), 1);
        assert_eq!(health.answered(), None, "a short run is no news");
        for _ in 0..pure::STALL_REPORT_EVERY {
            health.failed(&transient(), now);
        }
        assert_eq!(health.failures_in_row(), pure::STALL_REPORT_EVERY);
        assert_eq!(health.answered(), Some(pure::STALL_REPORT_EVERY));
        assert_eq!(health.failures_in_row(), 0);
        assert_eq!(
            health
                .last_error(now)
                .map(|(e, _)| e.contains("connection reset")),
            Some(true)
        );
    }

    #[test]
    fn a_read_at_the_tip_with_nothing_is_caught_up() {
        let table = [
            (true, Some(0), true),
            (true, None, true),
            (true, Some(5), false),
            (false, Some(0), false),
        ];
        for (empty, lag, caught_up) in table {
            let mut health = health();
            health.read_ok(empty, lag);
            assert_eq!(
                health.signals(false).caught_up,
                caught_up,
                "{empty} {lag:?}"
            );
            assert_eq!(health.millis_behind(), lag);
        }
    }

    #[test]
    fn each_change_of_the_fencing_verdict_is_news_once() {
        let mut health = health();
        let frozen = FenceReason::HeartbeatUnconfirmed {
            silent_ms: Some(10),
            error: None,
        };
        let thawed = FenceReason::HeartbeatUnconfirmed {
            silent_ms: Some(20),
            error: None,
        };
        let revoked = FenceReason::Revoked {
            why: "owned by w2".into(),
        };
        assert_eq!(health.fencing(Ok(())), (true, None));
        assert_eq!(
            health.fencing(Err(frozen.clone())),
            (false, Some(FenceNews::Paused(frozen.clone())))
        );
        assert_eq!(
            health.fencing(Err(thawed)),
            (false, None),
            "said once per kind"
        );
        assert_eq!(
            health.fencing(Err(revoked.clone())),
            (false, Some(FenceNews::Paused(revoked.clone()))),
            "another kind of reason is news"
        );
        assert!(health.signals(false).fenced);
        assert_eq!(
            health.fencing(Ok(())),
            (true, Some(FenceNews::Resumed(revoked)))
        );
        assert_eq!(health.fenced(), None);
    }
}
