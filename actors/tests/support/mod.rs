#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod changes;
pub mod counted;
pub mod events;
pub mod http;
pub mod probe;
pub mod rig;
pub mod servers;
pub mod sim;
pub mod stripping_proxy;
