//! Whether the shard is stalled, and the news of it: a shard stalls when it cannot be
//! read (a subscription refused, reads failing in a row) or when its processor waits
//! on something outside past its stall time ([`pure::processor_stall_time`]).
//!
//! A change is said once (an ERROR when a stall starts, an INFO when it ends), and the
//! shard's gauge is 1 while stalled (sampled again every metrics interval), 0 once not.
//! This part decides; the reader emits what it says ([`StallNews`]).

use std::time::Duration;

use tokio::time::Instant;

use super::pure::{self, Phase};
use crate::processor::Waiting;

#[derive(Default)]
pub(super) struct StallWatch {
    /// Why the shard cannot be read, from the first refusal of the current run of
    /// failures. Cleared by the next read or subscription that succeeds.
    read_stall: Option<String>,
    /// Why the failure policy's batch cannot go on (its destination cannot be written,
    /// or a record past its retries has nowhere to go). Cleared when it goes on.
    failure_stall: Option<String>,
    /// Since when the stall shown now was reported (ERROR and gauge), and when its gauge
    /// was last sampled; `None` while the shard is not stalled.
    stalled: Option<(Instant, Instant)>,
}

/// What a look at the stall found to say.
#[derive(Debug, PartialEq)]
pub(super) enum StallNews {
    /// A stall began, for this reason (ERROR, gauge 1).
    Started(String),
    /// The shard is processed again after this long (INFO, gauge 0).
    Ended(Duration),
    /// The stall ends with the shard's processing (a shutdown, a lost lease): no news
    /// of the stall, its gauge alone is ended.
    GaugeOff,
    /// Still stalled, and a metrics interval has passed: the gauge again.
    GaugeOn,
    Nothing,
}

impl StallWatch {
    /// Why the shard is stalled now, if it is.
    pub fn reason(
        &self,
        phase: Phase,
        waiting: Option<Waiting>,
        processor_timeout: Duration,
        now: Instant,
    ) -> Option<String> {
        if !pure::may_stall(phase) {
            return None;
        }
        if let Some(why) = self.read_stall.as_ref().or(self.failure_stall.as_ref()) {
            return Some(why.clone());
        }
        let wait = waiting?;
        let waited = now.saturating_duration_since(wait.since);
        let after = pure::processor_stall_time(wait.limit, processor_timeout);
        (waited >= after).then(|| format!("{} for {} s", wait.what, waited.as_secs()))
    }

    /// Takes the stall's `reason` now (from [`Self::reason`]) and says what changed.
    pub fn note(
        &mut self,
        phase: Phase,
        reason: Option<String>,
        now: Instant,
        metrics_interval: Duration,
    ) -> StallNews {
        match (self.stalled, reason) {
            (None, Some(reason)) => {
                self.stalled = Some((now, now));
                StallNews::Started(reason)
            }
            (Some((since, _)), None) if pure::may_stall(phase) => {
                self.stalled = None;
                StallNews::Ended(now.saturating_duration_since(since))
            }
            (Some(_), None) => {
                self.stalled = None;
                StallNews::GaugeOff
            }
            (Some((since, sampled)), Some(_))
                if now.saturating_duration_since(sampled) >= metrics_interval =>
            {
                self.stalled = Some((since, now));
                StallNews::GaugeOn
            }
            _ => StallNews::Nothing,
        }
    }

    /// The shard cannot be read, for `why`: the first reason of a run is kept. `true`
    /// when this starts the run (the caller looks at the stall again).
    pub fn unreadable(&mut self, why: String) -> bool {
        if self.read_stall.is_some() {
            return false;
        }
        self.read_stall = Some(why);
        true
    }

    /// The failure policy's batch cannot go on, for `why` (the latest reason is kept: a
    /// destination's error changes as it is retried).
    pub fn failing(&mut self, why: String) {
        self.failure_stall = Some(why);
    }

    /// The failure policy's batch goes on again.
    pub fn failing_ended(&mut self) {
        self.failure_stall = None;
    }

    /// A read or a subscription succeeded: `true` if it ends a run of refusals.
    pub fn readable(&mut self) -> bool {
        self.read_stall.take().is_some()
    }

    /// The reader stops: `true` if a stall was shown (its gauge goes to 0).
    pub fn end(&mut self) -> bool {
        self.stalled.take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);
    const MINUTE: Duration = Duration::from_secs(60);

    fn waiting(since: Instant, limit: Option<Duration>) -> Option<Waiting> {
        Some(Waiting {
            what: "the MultiLang child has not answered processRecords".into(),
            since,
            limit,
        })
    }

    #[test]
    fn a_processor_waiting_past_its_stall_time_stalls_the_shard_while_it_may_stall() {
        let watch = StallWatch::default();
        let t0 = Instant::now();
        let timeout = 5 * MINUTE;
        let stall_time = pure::processor_stall_time(None, timeout);
        let table = [
            (Phase::Reading, None, stall_time * 2, false),
            (
                Phase::Reading,
                waiting(t0, None),
                stall_time - SECOND,
                false,
            ),
            (Phase::Reading, waiting(t0, None), stall_time, true),
            (Phase::Draining, waiting(t0, None), stall_time, true),
            (Phase::ShuttingDown, waiting(t0, None), stall_time, false),
            (Phase::LeaseLost, waiting(t0, None), stall_time, false),
        ];
        for (phase, wait, after, stalled) in table {
            let reason = watch.reason(phase, wait, timeout, t0 + after);
            assert_eq!(
                reason.is_some(),
                stalled,
                "{phase:?} after {after:?}: {reason:?}"
            );
        }
    }

    #[test]
    fn the_first_reason_a_shard_cannot_be_read_is_kept_until_it_reads_again() {
        let mut watch = StallWatch::default();
        let now = Instant::now();
        assert!(watch.unreadable("cannot subscribe: refused".into()));
        assert!(!watch.unreadable("GetRecords failed 20 times".into()));
        assert_eq!(
            watch.reason(Phase::Reading, None, MINUTE, now).as_deref(),
            Some("cannot subscribe: refused")
        );
        assert!(watch.readable());
        assert!(!watch.readable(), "once");
        assert_eq!(watch.reason(Phase::Reading, None, MINUTE, now), None);
    }

    #[test]
    fn a_stall_is_news_once_and_its_gauge_is_sampled_every_interval() {
        let t0 = Instant::now();
        let interval = 10 * SECOND;
        let why = || Some("stuck".to_owned());
        let mut watch = StallWatch::default();
        let steps = [
            (Phase::Reading, None, 0, StallNews::Nothing),
            (Phase::Reading, why(), 1, StallNews::Started("stuck".into())),
            (Phase::Reading, why(), 5, StallNews::Nothing),
            (Phase::Reading, why(), 11, StallNews::GaugeOn),
            (Phase::Reading, why(), 12, StallNews::Nothing),
            (Phase::Reading, None, 31, StallNews::Ended(30 * SECOND)),
            (
                Phase::Reading,
                why(),
                40,
                StallNews::Started("stuck".into()),
            ),
            // Stopping is no news of the stall: its gauge alone ends.
            (Phase::ShuttingDown, None, 41, StallNews::GaugeOff),
            (Phase::ShuttingDown, None, 42, StallNews::Nothing),
        ];
        for (phase, reason, at, news) in steps {
            let now = t0 + at * SECOND;
            assert_eq!(watch.note(phase, reason, now, interval), news, "at {at} s");
        }
        assert!(!watch.end(), "no stall shown at the end");
    }
}
