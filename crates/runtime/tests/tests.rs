//! The runtime's integration tests, one module per behaviour. The exported
//! span tree is checked in `span_tree.rs`, a binary of its own.

mod admission;
mod bridge;
mod crash;
mod stop;
mod support;
mod swap;
