//! The embedding example of README.md, "Embedding a worker", kept here so that it compiles
//! with every build; tests/book.rs checks that README shows exactly the code below these
//! lines. `cargo run -p flotilla-actors --example readme_embedding` runs it against AWS
//! with `my-app.toml`.

use flotilla_actors::{Backend, Batch, Checkpointer, Processor, ProcessorError, Settings, Worker};

struct Audit;

impl Processor for Audit {
    async fn process(&mut self, batch: &Batch, _cp: &Checkpointer) -> Result<(), ProcessorError> {
        for record in batch.records() {
            println!("{}: {} bytes", record.partition_key, record.data.len()); // your work
        }
        Ok(()) // acks the batch; an Err restarts the shard from its last checkpoint
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Settings::load(Some("my-app.toml".as_ref()))?; // + FLOTILLA__* variables
    let backend = Backend::aws(&settings.aws).await;
    let worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(|_shard| Audit)
        .start()
        .await?;
    tokio::signal::ctrl_c().await?; // a service listens for SIGTERM too: see the guide
    let report = worker.shutdown().await?; // checkpoints flushed, leases handed off
    std::process::exit(if report.clean() { 0 } else { 1 });
}
