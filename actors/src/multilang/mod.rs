//! Runs record processors written for the KCL MultiLangDaemon (amazon_kclpy, aws-kcl
//! and the other language bindings) without a JVM: flotilla reads the daemon's
//! properties file and speaks its protocol to one child process per held lease.
//!
//! * `properties`: the Java properties-file syntax, read as the daemon reads it.
//! * `protocol`: the messages, one JSON object a line, both ways.
//! * `child`: [`MultiLangProcessor`], the processor that runs the child per shard.
//! * `daemon_config`: a properties file as the child's command and flotilla settings.
//! * `program`: the child's program, found as the operating system finds it.

pub mod child;
pub mod daemon_config;
mod program;
pub mod properties;
pub mod protocol;

pub use child::{ChildCommand, ChildError, MultiLangProcessor};
pub use daemon_config::{DaemonConfig, DaemonConfigError};
