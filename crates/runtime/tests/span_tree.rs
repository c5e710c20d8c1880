//! The exported span tree, in a test binary of its own.
//!
//! These tests scope a subscriber to their thread. With other tests creating
//! the same spans on other threads at the same time, tracing's per-callsite
//! interest cache now and then dropped a run's first step; alone, and one at
//! a time, the exported tree is exact.

// The support module is shared with the main test binary; this one uses
// only part of it.
#[allow(dead_code)]
mod support;

mod spans;
