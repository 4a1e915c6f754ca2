//! The shard as the status page shows it, read from the reader's parts.

use tokio::time::Instant;

use super::context::Ctx;
use super::failures::FailureBook;
use super::gather::Gather;
use super::health::ReadHealth;
use super::outbox::Outbox;
use super::pure::{self, Phase};
use super::source::Source;
use super::stall::StallWatch;
use crate::status::ShardStatus;

/// The parts the status is read from.
pub(super) struct Parts<'a> {
    pub ctx: &'a Ctx,
    pub phase: Phase,
    pub outbox: &'a Outbox,
    pub health: &'a ReadHealth,
    pub stall: &'a StallWatch,
    pub source: &'a Source,
    /// What the batching window holds back: in memory, not yet delivered.
    pub gather: &'a Gather,
    pub failures: &'a FailureBook,
}

pub(super) fn shard_status(parts: Parts<'_>) -> ShardStatus {
    let Parts {
        ctx,
        phase,
        outbox,
        health,
        stall,
        source,
        gather,
        failures,
    } = parts;
    let now = Instant::now();
    let stall = stall.reason(
        phase,
        ctx.ports.wait.get(),
        ctx.settings().reader.processor_timeout,
        now,
    );
    let (records_per_second, bytes_per_second) = outbox.throughput().per_second(now);
    let last_error = health.last_error(now);
    let ledger = outbox.ledger();
    ShardStatus {
        shard_id: ctx.shard.clone(),
        stream: ctx.key.stream_name().map(str::to_owned),
        state: pure::shard_state(phase, health.signals(stall.is_some())),
        lease_counter: ctx.fence.counter,
        checkpoint: outbox.checkpoint().map(|c| c.to_string()),
        last_delivered: outbox.last_delivered().map(|p| p.to_string()),
        millis_behind_latest: health.millis_behind(),
        records_delivered: outbox.throughput().records,
        bytes_delivered: outbox.throughput().bytes,
        records_per_second,
        bytes_per_second,
        last_error: last_error.map(|(error, _)| error.to_owned()),
        last_error_ms_ago: last_error.map(|(_, ago)| ago.as_millis() as u64),
        in_flight_records: ledger.in_flight_records() as u64,
        in_flight_bytes: ledger.in_flight_bytes(),
        memory_bytes: ledger.memory() + source.held_memory() + gather.memory(),
        restarts: ctx.restarts,
        fenced: health.fenced().cloned(),
        stall,
        subscription: source.view(now),
        records_discarded: failures.discarded,
        last_failure: failures.last_failure.clone(),
        lanes: match ctx.settings().processor.parallelism {
            lanes if lanes > 1 => ledger.lanes(lanes, now),
            _ => Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::context::testing::Rig;
    use super::*;
    use crate::backend::StreamError;
    use crate::settings::Settings;
    use crate::status::ShardState;
    use crate::telemetry::Call;

    fn status(rig: &Rig, source: &Source) -> ShardStatus {
        shard_status(Parts {
            ctx: &rig.ctx,
            phase: Phase::Reading,
            outbox: &rig.outbox,
            health: &rig.health,
            stall: &rig.stall,
            source,
            gather: &rig.gather,
            failures: &FailureBook::default(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn the_status_shows_what_is_in_flight_and_a_stall_with_its_reason() {
        let mut rig = Rig::new(Settings::default()).await;
        let mut source = Source::new(None, Duration::ZERO, Instant::now());
        rig.put(3).await;
        source.acquire(&mut rig.reading()).await.unwrap();
        source.read(&mut rig.reading()).await.unwrap();
        let shown = status(&rig, &source);
        assert_eq!(shown.shard_id, rig.ctx.shard);
        assert_eq!(shown.in_flight_records, 3);
        assert_eq!(shown.records_delivered, 3);
        assert_eq!(
            shown.last_delivered,
            rig.out.delivered()[0]
                .last()
                .cloned()
                .map(|s| format!("{s}/0"))
        );
        assert!(shown.memory_bytes > 0);
        assert_eq!(shown.stall, None);
        assert!(matches!(
            shown.state,
            ShardState::CaughtUp | ShardState::Processing
        ));

        let error = StreamError::Throttled {
            op: "GetRecords",
            message: "slow down".into(),
        };
        for _ in 0..pure::STALL_REPORT_EVERY {
            rig.reading().count_failure(Call::GetRecords, &error);
        }
        let shown = status(&rig, &source);
        assert_eq!(shown.state, ShardState::Stalled);
        let why = shown.stall.expect("the stall is shown with its reason");
        assert!(why.contains("GetRecords failed 20 times in a row"), "{why}");
        assert!(shown.last_error.unwrap().contains("slow down"));
    }
}
