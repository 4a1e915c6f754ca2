//! What the failure policy (`[failure]`, run by the processor host) did on this shard:
//! the records discarded, the last failure, and whether a batch waits on the destination
//! (a stall). The host tells the reader ([`FailureNews`]); this part keeps the tally for
//! the status, says what to emit, and moves the stall.

use tokio::time::Instant;

use super::context::{Ctx, Out};
use super::outbox::Outbox;
use super::pure::Phase;
use super::reading;
use super::stall::StallWatch;
use crate::protocol::FailureNews;
use crate::telemetry::{DeliveryFailed, DestinationFailed, RecordsDiscarded};

/// The shard's failures since its reader started.
#[derive(Debug, Default)]
pub(super) struct FailureBook {
    /// Records discarded to the destination (any reason).
    pub discarded: u64,
    /// The processor's last error, with the record it was on.
    pub last_failure: Option<String>,
}

/// The parts the news moves.
pub(super) struct Parts<'a> {
    pub ctx: &'a Ctx,
    pub out: &'a dyn Out,
    pub phase: Phase,
    pub book: &'a mut FailureBook,
    pub stall: &'a mut StallWatch,
    pub outbox: &'a mut Outbox,
}

/// Takes one piece of news from the host.
pub(super) fn note(parts: Parts<'_>, news: FailureNews) {
    let Parts {
        ctx,
        out,
        phase,
        book,
        stall,
        outbox,
    } = parts;
    // The processor is at work on its batch: not stalled by the reader's watchdog,
    // which counts time without progress.
    outbox.progressed(Instant::now());
    let key = &ctx.key;
    match news {
        FailureNews::Failed {
            first,
            records,
            retry,
            error,
        } => {
            out.emit(&DeliveryFailed {
                key,
                first: &first,
                records,
                retry,
                error: &error,
            });
            book.last_failure = Some(format!("record {first}: {error}"));
        }
        FailureNews::Discarded(discard) => {
            out.emit(&RecordsDiscarded {
                key,
                discard: &discard,
            });
            book.discarded += discard.records.len() as u64;
        }
        FailureNews::Waiting {
            why,
            destination_failed,
        } => {
            if destination_failed {
                out.emit(&DestinationFailed { key });
            }
            stall.failing(why);
            reading::note_stall(ctx, out, stall, phase);
        }
        FailureNews::Resumed => {
            stall.failing_ended();
            reading::note_stall(ctx, out, stall, phase);
        }
    }
}
