//! Test doubles.
