//! A stopped process, in-process: the freezer the fault wrappers (and user code) wait on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Models a stopped process (SIGSTOP, a VM freeze, a long GC pause) in-process: while
/// frozen, every call of the backends that share this freezer waits before it starts,
/// and a call already under way waits before its answer is returned (the write took
/// effect; the caller learns of it on resume). User code can wait on it too (a frozen
/// processor). Timers keep running, so on thaw everything overdue fires at once, as it
/// does after SIGCONT. Clones share the state.
///
/// Waiters are woken on thaw in the order they began to wait (a `Notify`, not a `watch`
/// channel, whose waiters are spread over queues picked at random): the fault simulator
/// replays a seed exactly only if every wake-up order is fixed.
#[derive(Debug, Clone)]
pub struct Freezer(Arc<FreezerState>);

#[derive(Debug, Default)]
struct FreezerState {
    frozen: AtomicBool,
    thawed: tokio::sync::Notify,
}

impl Default for Freezer {
    fn default() -> Self {
        Self::new()
    }
}

impl Freezer {
    /// A freezer that is not frozen.
    pub fn new() -> Self {
        Self(Arc::default())
    }

    /// Stops every backend call that shares this freezer until [`Self::thaw`].
    pub fn freeze(&self) {
        self.0.frozen.store(true, Ordering::SeqCst);
    }

    /// Lets everything waiting go on, in the order it began to wait.
    pub fn thaw(&self) {
        self.0.frozen.store(false, Ordering::SeqCst);
        self.0.thawed.notify_waiters();
    }

    /// Whether the freezer is frozen now.
    pub fn is_frozen(&self) -> bool {
        self.0.frozen.load(Ordering::SeqCst)
    }

    /// Returns at once unless frozen; then when thawed.
    pub async fn wait_thawed(&self) {
        loop {
            // Registered before the check, so a thaw in between is not missed.
            let thawed = self.0.thawed.notified();
            tokio::pin!(thawed);
            thawed.as_mut().enable();
            if !self.is_frozen() {
                return;
            }
            thawed.await;
        }
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Unfrozen, a wait returns at once; frozen, waiters wait (however long) until the
    /// thaw, and then go on in the order they began to wait.
    #[tokio::test(start_paused = true)]
    async fn waiters_wait_until_the_thaw_and_go_on_in_order() {
        let freezer = Freezer::new();
        freezer.wait_thawed().await;
        freezer.freeze();
        assert!(freezer.is_frozen());
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (freezer, order) = (freezer.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                freezer.wait_thawed().await;
                order.lock().unwrap().push(n);
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(order.lock().unwrap().is_empty(), "still frozen");
        freezer.thaw();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert!(!freezer.is_frozen());
    }
}
