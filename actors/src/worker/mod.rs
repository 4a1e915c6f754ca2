//! The embedding API: [`Worker::builder`] → [`Worker`], a handle on a running worker.
//!
//! * `error`: [`WorkerError`], why a worker could not start or stopped.
//! * `backend`: [`Backend`], the outside systems and which client reads a source.
//! * `boot`: the start's one resolution of every kind of source (stream names, ARNs,
//!   table streams, stream sets, fan-out consumers) and the lease table, before any
//!   actor starts.
//! * `builder`: [`WorkerBuilder`] and its `start`: the boot, then the supervisor.
//! * `running`: [`Worker`] (status, graceful shutdown, wait, abort) and [`StatusProbe`].

mod backend;
mod boot;
mod builder;
mod error;
mod running;

pub use self::backend::Backend;
pub use self::builder::WorkerBuilder;
pub use self::error::WorkerError;
pub use self::running::{RequestedShutdown, StatusProbe, Worker};
pub use crate::processor::ProcessorActorFactory;
