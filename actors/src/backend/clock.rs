//! Wall-clock time that follows tokio's clock.
//!
//! Record arrival times and metric timestamps are wall-clock (`SystemTime`), but tests
//! pause and advance tokio's clock. A [`Clock`] reads the wall clock once, when made,
//! and from then on adds the tokio time that has passed, so both move together.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

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

    pub fn now(&self) -> Instant {
        Instant::now()
    }

    pub fn wall(&self) -> SystemTime {
        self.wall + self.base.elapsed()
    }

    /// Tokio time since this clock was made.
    pub fn elapsed(&self) -> Duration {
        self.base.elapsed()
    }

    pub fn base(&self) -> Instant {
        self.base
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
