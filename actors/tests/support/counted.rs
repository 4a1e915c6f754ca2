//! [`Counted`]: a processor that counts the records of each batch the processor it
//! wraps has finished (not merely been handed): for waiting until work is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError, ShardInfo};

pub struct Counted<P> {
    pub inner: P,
    pub count: Arc<AtomicU64>,
}

impl<P: Processor> Processor for Counted<P> {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.inner.initialize(shard).await
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.process(batch, cp).await?;
        self.count.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.inner.lease_lost().await
    }

    async fn shard_ended(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.shard_ended(cp).await
    }

    async fn shutdown_requested(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.shutdown_requested(cp).await
    }
}
