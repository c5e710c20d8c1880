//! `wma trace`: a trace file printed as a tree.
//!
//! The file holds OTLP JSON lines (what `--trace-file`, `[telemetry] file`
//! or the OpenTelemetry collector's file exporter write); reading and
//! drawing live in `wma_telemetry`, this only picks the traces and prints.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use webmcp_agents::telemetry::{Trace, read_trace_file};

/// `wma trace`.
#[derive(Args)]
pub(crate) struct TraceArgs {
    /// The trace file (OTLP JSON lines) to print.
    pub(crate) file: PathBuf,
    /// Print only the trace with this id (the one a run prints; its first
    /// digits are enough when they are unique in the file).
    #[arg(long = "trace", value_name = "ID")]
    pub(crate) trace: Option<String>,
}

/// Prints the runs of a trace file as indented trees, oldest first.
pub(crate) fn print(args: TraceArgs) -> Result<()> {
    let traces = read_trace_file(&args.file)?;
    if traces.is_empty() {
        bail!("{} holds no spans", args.file.display());
    }
    let chosen = pick(&traces, args.trace.as_deref())
        .map_err(|why| anyhow::anyhow!("{}: {why}", args.file.display()))?;
    let printed: Vec<String> = chosen.iter().map(ToString::to_string).collect();
    print!("{}", printed.join("\n"));
    Ok(())
}

/// The traces to print: all, or the one whose id starts with `id`.
fn pick<'a>(traces: &'a [Trace], id: Option<&str>) -> Result<Vec<&'a Trace>, String> {
    let Some(id) = id else {
        return Ok(traces.iter().collect());
    };
    let id = id.trim().to_ascii_lowercase();
    let found: Vec<&Trace> = traces.iter().filter(|t| t.id.starts_with(&id)).collect();
    match found.len() {
        1 => Ok(found),
        0 => Err(format!(
            "no trace {id} (the file has {})",
            traces
                .iter()
                .map(|t| t.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        n => Err(format!("{n} traces start with {id}; give more digits")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(id: &str) -> Trace {
        Trace {
            id: id.to_string(),
            spans: Vec::new(),
        }
    }

    #[test]
    fn a_trace_is_picked_by_its_id_or_a_unique_start_of_it() {
        let traces = [
            trace("4bf92f3577b34da6a3ce929d0e0e4736"),
            trace("4bf9aaaa77b34da6a3ce929d0e0e4736"),
            trace("0af7651916cd43dd8448eb211c80319c"),
        ];
        assert_eq!(pick(&traces, None).unwrap().len(), 3);
        let one = pick(&traces, Some("0AF765")).unwrap();
        assert_eq!(one[0].id, traces[2].id);
        assert!(
            pick(&traces, Some("4bf9"))
                .unwrap_err()
                .contains("2 traces")
        );
        let missing = pick(&traces, Some("ffff")).unwrap_err();
        assert!(missing.contains("no trace ffff") && missing.contains("0af765"));
    }
}
