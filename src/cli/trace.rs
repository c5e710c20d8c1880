//! `wma trace`: a trace file printed as a tree.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

/// `wma trace`.
#[derive(Args)]
pub(crate) struct TraceArgs {
    /// The trace file (OTLP JSON lines) to print.
    pub(crate) file: PathBuf,
}

/// Prints the runs of a trace file as indented trees.
pub(crate) fn print(_args: TraceArgs) -> Result<()> {
    bail!("wma trace is not built yet")
}
