//! flotilla-actors: consume Amazon Kinesis Data Streams with a fleet of workers that
//! share the shards through leases in a DynamoDB table, compatible with the KCL 2.x
//! lease table.
//!
//! * `model`: pure types — sequence numbers, shards and their lineage, leases,
//!   checkpoints, the lease-table row codec. No I/O, no clock.
//! * `backend`: the only place that talks to AWS. Three ports ([`backend::StreamClient`],
//!   [`backend::LeaseTable`], [`backend::MetricsSink`]), their AWS adapters, in-memory
//!   adapters that behave like the services, and a fault injector.

pub mod backend;
pub mod metrics_reporter;
pub mod model;
pub mod settings;
