//! Runs record processors written for the KCL MultiLangDaemon (amazon_kclpy, aws-kcl
//! and the other language bindings) without a JVM: flotilla reads the daemon's
//! properties file and speaks its protocol to one child process per held lease.
//!
//! * `properties`: the Java properties-file syntax, read as the daemon reads it.
//! * `protocol`: the messages, one JSON object a line, both ways.

pub mod properties;
pub mod protocol;
