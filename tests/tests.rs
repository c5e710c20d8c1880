//! End-to-end tests, compiled as one binary.

mod support;

mod config;
mod delegation;
mod loop_behaviour;
mod real_model;
