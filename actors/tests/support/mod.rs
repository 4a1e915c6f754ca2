#![allow(dead_code)]

pub mod servers;
