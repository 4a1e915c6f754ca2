//! Wall-clock time that follows tokio's clock.
//!
//! Record arrival times and metric timestamps are wall-clock (`SystemTime`), but tests
//! pause and advance tokio's clock. A [`Clock`] reads the wall clock once, when made,
//! and from then on adds the tokio time that has passed, so both move together.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Wall-clock time that moves with tokio's clock (see the module doc). Copies share the
/// same origin.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall: SystemTime,
    base: Instant,
}

impl Clock {
    /// Must be called inside a tokio runtime (paused or not).
    pub fn new() -> Self {
        Self {
            wall: SystemTime::now(),
            base: Instant::now(),
        }
    }

    /// Tokio's current instant, for deadlines and durations.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// The wall-clock time now: the wall time when this clock was made plus the tokio
    /// time elapsed since.
    pub fn wall(&self) -> SystemTime {
        self.wall + self.base.elapsed()
    }

    /// Tokio time since this clock was made.
    pub fn elapsed(&self) -> Duration {
        self.base.elapsed()
    }

    /// The tokio instant this clock was made at, which [`Self::wall`] counts from.
    pub fn base(&self) -> Instant {
        self.base
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
