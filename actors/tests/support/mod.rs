#![allow(dead_code)]

pub mod probe;
pub mod servers;
