//! A memory-backend stream, lease table and metrics sink, and workers started on them.

use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{LeaseTable, StreamAdmin, StreamClient};
use flotilla_actors::model::Shard;
use flotilla_actors::{Backend, Settings, Worker};

use super::probe::{ProbeFactory, fast_settings};

pub const STREAM: &str = "orders";
pub const APP: &str = "orders-app";

pub struct Rig {
    pub streams: MemoryStreams,
    pub dynamo: MemoryDynamo,
    pub metrics: MemoryMetrics,
}

impl Rig {
    pub async fn new(shards: u32, config: MemoryStreamsConfig) -> Self {
        let streams = MemoryStreams::new(config);
        streams.create_stream(STREAM, shards).await.unwrap();
        Self {
            streams,
            dynamo: MemoryDynamo::new(),
            metrics: MemoryMetrics::new(),
        }
    }

    pub fn backend(&self) -> Backend {
        Backend::memory(
            self.streams.clone(),
            self.dynamo.clone(),
            self.metrics.clone(),
        )
    }

    pub async fn start(&self, probes: &ProbeFactory) -> Worker {
        self.start_with(probes, fast_settings(STREAM, APP)).await
    }

    pub async fn start_with(&self, probes: &ProbeFactory, settings: Settings) -> Worker {
        let f = probes.clone();
        Worker::builder()
            .settings(settings)
            .backend(self.backend())
            .processor(move |shard| f.make(shard))
            .start()
            .await
            .unwrap()
    }

    pub fn table(&self) -> impl LeaseTable {
        self.dynamo.lease_table(APP)
    }

    pub async fn shards(&self) -> Vec<Shard> {
        self.streams.list_shards(STREAM).await.unwrap()
    }
}
