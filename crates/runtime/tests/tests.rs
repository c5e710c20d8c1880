//! The runtime's integration tests, one module per behaviour.

mod admission;
mod bridge;
mod crash;
mod spans;
mod stop;
mod support;
mod swap;
