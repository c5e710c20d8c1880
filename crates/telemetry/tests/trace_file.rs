//! The trace file: spans traced through the subscriber that [`build`]
//! makes land in the file as OTLP JSON lines once the guard flushes, with
//! their parents, the GenAI clean-ups (integer counts, error statuses) and
//! the resource, and read back as the same tree.

use std::path::PathBuf;

use wma_telemetry::{PROJECT_NAME_ATTRIBUTE, TelemetryConfig, build, read_trace_file, trace_id};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wma-trace-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn to_file(path: &std::path::Path) -> TelemetryConfig {
    TelemetryConfig {
        file: Some(path.to_path_buf()),
        log: Some("off".to_string()),
        service_name: Some("trace-file-test".to_string()),
        ..TelemetryConfig::default()
    }
}

#[test]
fn spans_are_written_on_flush_with_their_parents_and_read_back() {
    let path = scratch("run.jsonl");
    let settings = to_file(&path).resolve(|_| None).unwrap();
    let (dispatch, guard) = build(&settings).unwrap();
    assert!(guard.is_exporting());
    assert_eq!(guard.export(), None);
    assert_eq!(guard.file(), Some(path.as_path()));
    let id = tracing::dispatcher::with_default(&dispatch, || {
        let run = tracing::info_span!(
            "invoke_agent",
            otel.name = "invoke_agent shopper",
            wma.steps = tracing::field::Empty
        );
        let id = trace_id(&run).expect("a traced span has a trace id");
        run.in_scope(|| {
            run.record("wma.steps", 1_u64);
            run.record("wma.steps", 2_u64);
            let step = tracing::info_span!("step", otel.name = "step 1", wma.step = 1_u64);
            step.in_scope(|| {
                tracing::info!(
                    wma.rule = "loop-guard",
                    wma.detail = "the same call",
                    "loop-guard"
                );
                let call = tracing::info_span!(
                    "execute_tool",
                    otel.name = "execute_tool search",
                    error.type = "tool_failed"
                );
                drop(call);
            });
        });
        id
    });
    // The batch processor holds spans for a while; a flush writes them now.
    guard.flush().unwrap();
    let traces = read_trace_file(&path).unwrap();
    assert_eq!(traces.len(), 1);
    let trace = &traces[0];
    assert_eq!(trace.id, id);
    let names: Vec<&str> = trace.spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["invoke_agent shopper", "step 1", "execute_tool search"]
    );
    let [run, step, call] = &trace.spans[..] else {
        unreachable!()
    };
    assert_eq!(run.parent_span_id, None);
    assert_eq!(step.parent_span_id.as_ref(), Some(&run.span_id));
    assert_eq!(call.parent_span_id.as_ref(), Some(&step.span_id));
    assert_eq!(run.service.as_deref(), Some("trace-file-test"));
    assert_eq!(call.error.as_deref(), Some("tool_failed"));
    assert_eq!(step.events[0].name, "loop-guard");
    // The raw line: counts are integers, and the Phoenix project is the
    // service's name.
    let text = std::fs::read_to_string(&path).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let resource = &line["resourceSpans"][0]["resource"]["attributes"];
    assert!(
        resource
            .as_array()
            .unwrap()
            .iter()
            .any(|kv| kv["key"] == PROJECT_NAME_ATTRIBUTE
                && kv["value"]["stringValue"] == "trace-file-test"),
        "{resource}"
    );
    // A field recorded twice is one attribute with its last value.
    let steps: Vec<&serde_json::Value> = line["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|span| span["attributes"].as_array().unwrap())
        .filter(|kv| kv["key"] == "wma.steps")
        .collect();
    assert_eq!(steps.len(), 1, "{line}");
    assert_eq!(steps[0]["value"]["intValue"], "2");
    let printed = trace.to_string();
    assert!(printed.contains("invoke_agent shopper"), "{printed}");
    assert!(printed.contains("steps=2"), "{printed}");
    assert!(printed.contains("· loop-guard"), "{printed}");

    // A second run appends: the first is still there.
    drop(guard);
    let (dispatch, guard) = build(&settings).unwrap();
    tracing::dispatcher::with_default(&dispatch, || {
        drop(tracing::info_span!(
            "invoke_agent",
            otel.name = "invoke_agent again"
        ));
    });
    // Dropping the guard flushes too.
    drop(guard);
    let traces = read_trace_file(&path).unwrap();
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[1].spans[0].name, "invoke_agent again");
}

#[test]
fn a_trace_file_that_cannot_be_written_stops_the_start_with_its_name() {
    let path = scratch("missing-folder").join("run.jsonl");
    let error = build(&to_file(&path).resolve(|_| None).unwrap()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("cannot write the trace file") && message.contains("missing-folder"),
        "{message}"
    );
}

#[test]
fn a_file_that_is_not_otlp_json_is_refused_with_the_line() {
    let path = scratch("not-otlp.jsonl");
    std::fs::write(&path, "{\"resourceSpans\":[]}\nnot json\n").unwrap();
    let message = read_trace_file(&path).unwrap_err().to_string();
    assert!(
        message.contains("not-otlp.jsonl") && message.contains("line 2"),
        "{message}"
    );
}
