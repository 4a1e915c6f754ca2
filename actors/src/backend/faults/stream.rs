//! The fault injector on the Kinesis ports: [`StreamClient`] (a subscription's events
//! included) and [`StreamAdmin`], each call named by its AWS operation.

use futures::future::BoxFuture;

use super::{ENDPOINT, Faulty, Injected};
use crate::backend::{
    IteratorPosition, PutRecord, PutResult, RecordBatch, ShardIterator, StreamAdmin, StreamClient,
    StreamError, StreamSummary, Subscription,
};
use crate::model::{Shard, ShardId};

impl Injected for StreamError {
    fn throttled(op: &'static str) -> Self {
        StreamError::Throttled {
            op,
            message: "injected throttle".into(),
        }
    }
    fn transient(op: &'static str, why: &str) -> Self {
        StreamError::Transient {
            op,
            endpoint: ENDPOINT.into(),
            message: why.into(),
        }
    }
}

impl<B: StreamClient> StreamClient for Faulty<B> {
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        Box::pin(self.run("ListShards", self.inner.list_shards(stream)))
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>> {
        Box::pin(self.run(
            "GetShardIterator",
            self.inner.get_shard_iterator(stream, shard, position),
        ))
    }

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>> {
        Box::pin(self.run("GetRecords", self.inner.get_records(iterator, limit)))
    }

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>> {
        Box::pin(self.run(
            "DescribeStreamSummary",
            self.inner.describe_stream_summary(stream),
        ))
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<crate::backend::Consumer, StreamError>> {
        Box::pin(self.run(
            "RegisterStreamConsumer",
            self.inner.register_stream_consumer(stream_arn, name),
        ))
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<crate::backend::Consumer, StreamError>> {
        Box::pin(self.run(
            "DescribeStreamConsumer",
            self.inner.describe_stream_consumer(stream_arn, name),
        ))
    }

    fn list_stream_consumers<'a>(
        &'a self,
        stream_arn: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::backend::Consumer>, StreamError>> {
        Box::pin(self.run(
            "ListStreamConsumers",
            self.inner.list_stream_consumers(stream_arn),
        ))
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        consumer_arn: &'a str,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run(
            "DeregisterStreamConsumer",
            self.inner.deregister_stream_consumer(consumer_arn),
        ))
    }

    /// The subscription's events go through the injector too, as op
    /// `SubscribeToShardEvent`: a transient fault there is a dropped connection.
    fn subscribe_to_shard<'a>(
        &'a self,
        consumer_arn: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<Box<dyn Subscription>, StreamError>> {
        Box::pin(async move {
            let inner = self
                .run(
                    "SubscribeToShard",
                    self.inner.subscribe_to_shard(consumer_arn, shard, position),
                )
                .await?;
            let faults = Faulty {
                inner: (),
                state: self.state.clone(),
                freezer: self.freezer.clone(),
            };
            Ok(Box::new(FaultySubscription { inner, faults }) as Box<dyn Subscription>)
        })
    }

    fn capabilities(&self) -> crate::backend::Capabilities {
        self.inner.capabilities()
    }
}

/// A subscription whose events pass the fault injector and the freezer.
struct FaultySubscription {
    inner: Box<dyn Subscription>,
    faults: Faulty<()>,
}

impl Subscription for FaultySubscription {
    fn next_event(
        &mut self,
    ) -> BoxFuture<'_, Result<Option<crate::backend::ShardEvent>, StreamError>> {
        Box::pin(
            self.faults
                .run("SubscribeToShardEvent", self.inner.next_event()),
        )
    }
}

impl<B: StreamAdmin> StreamAdmin for Faulty<B> {
    fn create_stream<'a>(
        &'a self,
        stream: &'a str,
        shards: u32,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run("CreateStream", self.inner.create_stream(stream, shards)))
    }

    fn delete_stream<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run("DeleteStream", self.inner.delete_stream(stream)))
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: &'a [PutRecord],
    ) -> BoxFuture<'a, Result<Vec<PutResult>, StreamError>> {
        Box::pin(self.run("PutRecords", self.inner.put_records(stream, records)))
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        new_starting_hash_key: u128,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run(
            "SplitShard",
            self.inner.split_shard(stream, shard, new_starting_hash_key),
        ))
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        adjacent: &'a ShardId,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run(
            "MergeShards",
            self.inner.merge_shards(stream, shard, adjacent),
        ))
    }
}
