//! The drained stream of the drain benchmarks (P2, P11): `records` records of 100 bytes
//! over `shards` shards, 1,024 partition keys, put 500 at a time.

use bytes::Bytes;
use flotilla_actors::backend::{PutRecord, StreamAdmin};

pub async fn load(streams: &dyn StreamAdmin, stream: &str, shards: u32, records: u64) {
    streams.create_stream(stream, shards).await.unwrap();
    let payload = Bytes::from(vec![b'x'; 100]);
    let records: Vec<PutRecord> = (0..records)
        .map(|i| PutRecord {
            partition_key: format!("k{}", i % 1024),
            explicit_hash_key: None,
            data: payload.clone(),
        })
        .collect();
    for chunk in records.chunks(500) {
        streams.put_records(stream, chunk).await.unwrap();
    }
}
