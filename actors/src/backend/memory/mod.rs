//! In-process adapters: the embedded default of `flotilla demo` and the fast test
//! double. They keep state and check conditions like the services do; they are not
//! call-expectation mocks.

mod lease_table;
mod metrics;
mod stream;
mod table_stream;

pub use lease_table::{MemoryDynamo, MemoryLeaseTable};
pub use metrics::MemoryMetrics;
pub use stream::{MemoryStreams, MemoryStreamsConfig, ReadLimits, ReadRules};
pub use table_stream::{MemoryTableStreams, MemoryTableStreamsConfig};
