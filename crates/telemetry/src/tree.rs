//! Reading a trace file back: the OTLP JSON lines grouped into traces, and
//! each trace printed as an indented tree a person can read without a
//! trace backend (what `wma trace FILE` prints).

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::path::Path;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

use crate::error::TelemetryError;

/// One trace of a file: its spans, ordered by start time.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The trace id, 32 hex digits.
    pub id: String,
    /// Its spans, by start time (a span written twice appears once).
    pub spans: Vec<RecordedSpan>,
}

/// A span as read from a trace file.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSpan {
    /// 16 hex digits.
    pub span_id: String,
    /// The parent's span id; `None` for a root.
    pub parent_span_id: Option<String>,
    /// `invoke_agent shopper`, `step 1`, ...
    pub name: String,
    /// Start, in nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// End, in nanoseconds since the Unix epoch.
    pub end_unix_nano: u64,
    /// Attributes in the order they were written, values as text.
    pub attributes: Vec<(String, String)>,
    /// Events (the loop's rules that fired, approvals, errors).
    pub events: Vec<RecordedEvent>,
    /// `Some(message)` when the span's status is an error.
    pub error: Option<String>,
    /// `service.name` of the resource that wrote it.
    pub service: Option<String>,
}

/// An event of a span.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    /// For a rule that fired, the rule's name; else the event's message.
    pub name: String,
    /// When it happened, in nanoseconds since the Unix epoch.
    pub time_unix_nano: u64,
    /// Its attributes, values as text.
    pub attributes: Vec<(String, String)>,
}

impl RecordedSpan {
    /// The value of attribute `key`, if the span has it.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        lookup(&self.attributes, key)
    }

    fn duration_nanos(&self) -> u64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano)
    }
}

/// The last value of `key`: a field recorded twice (by files written before
/// the exporter kept only the last) counts as its last value, as backends
/// read it.
fn lookup<'a>(attributes: &'a [(String, String)], key: &str) -> Option<&'a str> {
    attributes
        .iter()
        .rfind(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Reads the trace file at `path`: every non-blank line must be an OTLP JSON
/// `ExportTraceServiceRequest`. A line that is not is an error naming its
/// number, rather than a trace printed with spans silently missing.
pub fn read_trace_file(path: &Path) -> Result<Vec<Trace>, TelemetryError> {
    let error = |why: String| TelemetryError::ReadTraceFile {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    parse_traces(&text).map_err(error)
}

/// [`read_trace_file`] on text already read; the error names the line.
///
/// ```
/// let line = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{
///     "traceId":"4bf92f3577b34da6a3ce929d0e0e4736","spanId":"00f067aa0ba902b7",
///     "name":"invoke_agent shopper",
///     "startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000500000000"}]}]}]}"#;
/// let traces = wma_telemetry::parse_traces(&line.replace('\n', "")).unwrap();
/// assert_eq!(traces[0].spans[0].name, "invoke_agent shopper");
/// assert!(traces[0].to_string().contains("invoke_agent shopper"));
/// ```
pub fn parse_traces(text: &str) -> Result<Vec<Trace>, String> {
    let mut by_trace: HashMap<String, Vec<RecordedSpan>> = HashMap::new();
    let mut seen: HashSet<(String, String)> = HashSet::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let request: ExportTraceServiceRequest = serde_json::from_str(line)
            .map_err(|e| format!("line {number} is not an OTLP JSON export request: {e}"))?;
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(|kv| text_of(kv.value.as_ref()));
            for span in resource_spans
                .scope_spans
                .into_iter()
                .flat_map(|scope| scope.spans)
            {
                if span.trace_id.len() != 16 || span.span_id.len() != 8 {
                    return Err(format!(
                        "line {number}: the span `{}` has no valid trace or span id",
                        span.name
                    ));
                }
                let trace_id = hex(&span.trace_id);
                let span_id = hex(&span.span_id);
                if !seen.insert((trace_id.clone(), span_id.clone())) {
                    continue;
                }
                let error = span
                    .status
                    .as_ref()
                    .filter(|s| s.code == StatusCode::Error as i32)
                    .map(|s| s.message.clone());
                by_trace.entry(trace_id).or_default().push(RecordedSpan {
                    span_id,
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    name: span.name,
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                    attributes: pairs(&span.attributes),
                    events: span
                        .events
                        .into_iter()
                        .map(|e| RecordedEvent {
                            name: e.name,
                            time_unix_nano: e.time_unix_nano,
                            attributes: pairs(&e.attributes),
                        })
                        .collect(),
                    error,
                    service: service.clone(),
                });
            }
        }
    }
    let mut traces: Vec<Trace> = by_trace
        .into_iter()
        .map(|(id, mut spans)| {
            spans.sort_by_key(|s| (s.start_unix_nano, std::cmp::Reverse(s.end_unix_nano)));
            Trace { id, spans }
        })
        .collect();
    traces.sort_by_key(|t| (t.start(), t.id.clone()));
    Ok(traces)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), text_of(kv.value.as_ref())))
        .collect()
}

fn text_of(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| text_of(Some(v)))
            .collect::<Vec<_>>()
            .join(","),
        Some(any_value::Value::KvlistValue(list)) => list
            .values
            .iter()
            .map(|kv| format!("{}={}", kv.key, text_of(kv.value.as_ref())))
            .collect::<Vec<_>>()
            .join(","),
        Some(any_value::Value::BytesValue(bytes)) => hex(bytes),
        Some(_) => String::new(),
    }
}

impl Trace {
    /// When the first span started (Unix nanoseconds).
    pub fn start(&self) -> u64 {
        self.spans
            .iter()
            .map(|s| s.start_unix_nano)
            .min()
            .unwrap_or(0)
    }

    /// When the last span ended (Unix nanoseconds).
    pub fn end(&self) -> u64 {
        self.spans
            .iter()
            .map(|s| s.end_unix_nano)
            .max()
            .unwrap_or(0)
    }

    /// The spans with no parent in this trace (a root, or a span whose
    /// parent was not written to this file), by start time.
    fn roots(&self) -> Vec<usize> {
        let ids: HashSet<&str> = self.spans.iter().map(|s| s.span_id.as_str()).collect();
        (0..self.spans.len())
            .filter(|&i| {
                self.spans[i]
                    .parent_span_id
                    .as_deref()
                    .is_none_or(|p| !ids.contains(p))
            })
            .collect()
    }
}

/// A line of the tree before the columns are lined up.
struct Row {
    /// Tree drawing and the span's (or event's) name.
    left: String,
    /// Start (relative to the trace's) and duration; events have no duration.
    start: u64,
    duration: Option<u64>,
    /// What matters about it: `key=value` pairs, or a rule's detail.
    details: String,
}

/// What sits under a span: its children and its events, in time order.
enum Item<'a> {
    Span(usize),
    Event(&'a RecordedEvent),
}

impl fmt::Display for Trace {
    /// The trace as a tree: a header line, then one line per span and per
    /// event, indented under its parent, with its start (from the trace's
    /// start), its duration and the attributes that matter.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let start = self.start();
        let service = self
            .spans
            .iter()
            .find_map(|s| s.service.as_deref())
            .unwrap_or("unknown service");
        writeln!(
            f,
            "trace {}  {service}  {}  {}  {} span{}",
            self.id,
            utc(start),
            duration(self.end().saturating_sub(start)),
            self.spans.len(),
            if self.spans.len() == 1 { "" } else { "s" }
        )?;
        let mut children: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, span) in self.spans.iter().enumerate() {
            if let Some(parent) = &span.parent_span_id {
                children.entry(parent.as_str()).or_default().push(i);
            }
        }
        let mut rows = Vec::new();
        for root in self.roots() {
            let span = &self.spans[root];
            let mut left = span.name.clone();
            if let Some(parent) = &span.parent_span_id {
                let _ = write!(left, " (parent {parent} not in the file)");
            }
            self.rows(root, left, "", &children, &mut rows);
        }
        let width = rows
            .iter()
            .map(|r| r.left.chars().count())
            .max()
            .unwrap_or(0);
        for row in rows {
            let pad = width - row.left.chars().count();
            let took = row.duration.map(duration).unwrap_or_default();
            let line = format!(
                "{}{:pad$}  {:>10}  {:>9}  {}",
                row.left,
                "",
                format!("+{}", duration(row.start.saturating_sub(start))),
                took,
                row.details
            );
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

impl Trace {
    /// The rows of span `index` (whose own line starts with `left`) and,
    /// below it, of everything under it; `prefix` is the tree drawing that
    /// goes before the lines under it.
    fn rows(
        &self,
        index: usize,
        left: String,
        prefix: &str,
        children: &HashMap<&str, Vec<usize>>,
        rows: &mut Vec<Row>,
    ) {
        let span = &self.spans[index];
        rows.push(Row {
            left,
            start: span.start_unix_nano,
            duration: Some(span.duration_nanos()),
            details: span_details(span),
        });
        let mut items: Vec<(u64, u8, Item<'_>)> = span
            .events
            .iter()
            .map(|e| (e.time_unix_nano, 0, Item::Event(e)))
            .collect();
        if let Some(kids) = children.get(span.span_id.as_str()) {
            items.extend(
                kids.iter()
                    .map(|&k| (self.spans[k].start_unix_nano, 1, Item::Span(k))),
            );
        }
        // Stable: children keep their start order, an event at the same
        // instant as a span's start comes first.
        items.sort_by_key(|(time, rank, _)| (*time, *rank));
        let count = items.len();
        for (n, (_, _, item)) in items.into_iter().enumerate() {
            let last = n + 1 == count;
            let (branch, below) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            match item {
                Item::Span(k) => {
                    let left = format!("{prefix}{branch}{}", self.spans[k].name);
                    self.rows(k, left, &format!("{prefix}{below}"), children, rows);
                }
                Item::Event(event) => {
                    let (name, details) = event_line(event);
                    rows.push(Row {
                        left: format!("{prefix}{branch}· {name}"),
                        start: event.time_unix_nano,
                        duration: None,
                        details,
                    });
                }
            }
        }
    }
}

/// Attributes said by the span's name or the tree itself, or bookkeeping
/// of the tracing layer: not repeated on its line.
const HIDDEN: [&str; 10] = [
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.tool.name",
    "gen_ai.tool.type",
    "gen_ai.tool.call.id",
    "wma.step",
    "busy_ns",
    "idle_ns",
    "level",
    "target",
];

/// Short names for the attributes that matter, in the order they print.
const LABELS: [(&str, &str); 14] = [
    ("error.type", "error"),
    ("gen_ai.request.model", "model"),
    ("gen_ai.provider.name", "provider"),
    ("wma.steps", "steps"),
    ("wma.finish_reason", "finish"),
    ("wma.tools_shown", "tools"),
    ("wma.outcome", "outcome"),
    ("gen_ai.usage.input_tokens", "in"),
    ("gen_ai.usage.output_tokens", "out"),
    ("gen_ai.usage.cached_tokens", "cached"),
    ("gen_ai.response.finish_reasons", "finish"),
    ("gen_ai.server.time_to_first_token", "ttft"),
    ("wma.attempt", "attempt"),
    ("wma.constraint", "constraint"),
];

fn span_details(span: &RecordedSpan) -> String {
    let chat = span.attribute("gen_ai.operation.name") == Some("chat");
    let mut out: Vec<String> = Vec::new();
    if let Some(message) = &span.error
        && span.attribute("error.type") != Some(message.as_str())
    {
        out.push(format!(
            "status=error{}",
            if message.is_empty() {
                String::new()
            } else {
                format!(":{}", quoted(message))
            }
        ));
    }
    for (key, label) in LABELS {
        // A generation's model is in its name already, and its provider
        // on the run's line.
        if chat && matches!(key, "gen_ai.request.model" | "gen_ai.provider.name") {
            continue;
        }
        let Some(value) = span.attribute(key) else {
            continue;
        };
        // The usual case says nothing: only a retry or a constraint is news.
        if matches!(
            (key, value),
            ("wma.attempt", "first") | ("wma.constraint", "none")
        ) {
            continue;
        }
        // Recorded as a JSON list in a string; a person reads `stop`.
        if key == "gen_ai.response.finish_reasons"
            && let Ok(reasons) = serde_json::from_str::<Vec<String>>(value)
        {
            out.push(format!("{label}={}", quoted(&reasons.join(","))));
            continue;
        }
        // Seconds, as the conventions have it; a person reads `12.3ms`.
        let time = (key == "gen_ai.server.time_to_first_token")
            .then(|| value.parse::<f64>().ok())
            .flatten();
        match time {
            Some(seconds) => out.push(format!(
                "{label}={}",
                duration((seconds * 1e9) as u64).replace(' ', "")
            )),
            None => out.push(format!("{label}={}", quoted(value))),
        }
    }
    let mut shown: HashSet<&str> = HashSet::new();
    for (key, _) in &span.attributes {
        let known = LABELS.iter().any(|(k, _)| k == key);
        if known
            || HIDDEN.contains(&key.as_str())
            || key.starts_with("code.")
            || key.starts_with("thread.")
            || !shown.insert(key)
        {
            continue;
        }
        let value = span.attribute(key).unwrap_or_default();
        out.push(format!("{}={}", short(key), quoted(value)));
    }
    out.join(" ")
}

/// An event's name and details: a rule that fired reads as `rule` then
/// what it did, like `wma run -v` prints it; other events as their
/// message and attributes, led by the level when it is a warning or error.
fn event_line(event: &RecordedEvent) -> (String, String) {
    if let Some(rule) = lookup(&event.attributes, "wma.rule") {
        let detail = lookup(&event.attributes, "wma.detail").unwrap_or_default();
        return (rule.to_string(), clip(detail, 200));
    }
    let name = match lookup(&event.attributes, "level") {
        Some(level @ ("WARN" | "ERROR")) => format!("{level} {}", event.name),
        _ => event.name.clone(),
    };
    let details = event
        .attributes
        .iter()
        .filter(|(k, _)| !HIDDEN.contains(&k.as_str()) && !k.starts_with("code."))
        .map(|(k, v)| format!("{}={}", short(k), quoted(v)))
        .collect::<Vec<_>>()
        .join(" ");
    (name, details)
}

/// `wma.approval.decision` → `decision`, `wma.agent` → `agent`.
fn short(key: &str) -> &str {
    ["wma.approval.", "wma."]
        .iter()
        .find_map(|p| key.strip_prefix(p))
        .unwrap_or(key)
}

/// A value as one word: quoted when it has spaces (or is empty), and cut
/// when long, so one attribute cannot swamp the line.
fn quoted(value: &str) -> String {
    let value = clip(value, 120);
    if value.is_empty() || value.contains(char::is_whitespace) || value.contains('"') {
        format!("{value:?}")
    } else {
        value
    }
}

fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// `850 µs`, `12.3 ms`, `1.25 s`.
fn duration(nanos: u64) -> String {
    if nanos < 1_000_000 {
        format!("{} µs", nanos / 1_000)
    } else if nanos < 1_000_000_000 {
        format!("{:.1} ms", nanos as f64 / 1e6)
    } else {
        format!("{:.2} s", nanos as f64 / 1e9)
    }
}

/// `2026-12-05 06:41:02.120 UTC` for Unix nanoseconds.
fn utc(nanos: u64) -> String {
    let secs = nanos / 1_000_000_000;
    let millis = (nanos / 1_000_000) % 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{millis:03} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`), to print a time without a date crate.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    /// 2023-11-14 22:13:20 UTC.
    const T0: u64 = 1_700_000_000_000_000_000;

    /// A span as the exporter writes it, `ms` milliseconds after T0.
    fn span(id: &str, parent: &str, name: &str, ms: (u64, u64), attributes: &str) -> String {
        format!(
            r#"{{"traceId":"{TRACE}","spanId":"{id}","parentSpanId":"{parent}","name":"{name}","kind":1,"startTimeUnixNano":"{}","endTimeUnixNano":"{}","attributes":[{attributes}],"events":[],"status":{{"code":0,"message":""}}}}"#,
            T0 + ms.0 * 1_000_000,
            T0 + ms.1 * 1_000_000
        )
    }

    fn line(spans: &[String]) -> String {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"webmcp-agents"}}}}]}},"scopeSpans":[{{"scope":{{"name":"webmcp-agents"}},"spans":[{}]}}]}}]}}"#,
            spans.join(",")
        )
    }

    fn s(key: &str, value: &str) -> String {
        format!(r#"{{"key":"{key}","value":{{"stringValue":"{value}"}}}}"#)
    }

    fn i(key: &str, value: i64) -> String {
        format!(r#"{{"key":"{key}","value":{{"intValue":"{value}"}}}}"#)
    }

    /// A parent that delegates to a helper: the helper's spans come in an
    /// earlier line (its run ended first), the parent's in a later one, out
    /// of order within the line, as batches are.
    fn team() -> String {
        let helper = line(&[
            span(
                "00000000000000b2",
                "00000000000000b1",
                "step 1",
                (3, 5),
                &[i("wma.step", 1), s("wma.outcome", "answer")].join(","),
            ),
            span(
                "00000000000000b1",
                "00000000000000a3",
                "invoke_agent helper",
                (3, 6),
                &[
                    s("gen_ai.operation.name", "invoke_agent"),
                    s("gen_ai.request.model", "helper-model"),
                    i("wma.steps", 1),
                    s("wma.finish_reason", "stop"),
                ]
                .join(","),
            ),
        ]);
        let mut step = span(
            "00000000000000a2",
            "00000000000000a1",
            "step 1",
            (1, 7),
            &[
                i("wma.step", 1),
                i("wma.tools_shown", 1),
                s("wma.outcome", "calls"),
            ]
            .join(","),
        );
        // A rule that fired on the step, after the call.
        step = step.replace(
            r#""events":[]"#,
            &format!(
                r#""events":[{{"timeUnixNano":"{}","name":"loop-guard","attributes":[{},{}]}}]"#,
                T0 + 6_500_000,
                s("wma.rule", "loop-guard"),
                s("wma.detail", "the same call again")
            ),
        );
        let parent = line(&[
            span(
                "00000000000000a3",
                "00000000000000a2",
                "execute_tool helper",
                (2, 6),
                &[
                    s("gen_ai.tool.name", "helper"),
                    s("error.type", "tool_failed"),
                ]
                .join(","),
            )
            .replace(
                r#""code":0,"message":"""#,
                r#""code":2,"message":"tool_failed""#,
            ),
            span(
                "00000000000000a1",
                "",
                "invoke_agent parent",
                (0, 10),
                &[
                    s("gen_ai.request.model", "parent-model"),
                    s("gen_ai.provider.name", "onnx"),
                    i("wma.steps", 1),
                    i("wma.steps", 2),
                    s("wma.finish_reason", "stop"),
                ]
                .join(","),
            ),
            step,
            span(
                "00000000000000a4",
                "00000000000000a2",
                "chat parent-model",
                (1, 2),
                &[
                    s("gen_ai.operation.name", "chat"),
                    s("gen_ai.request.model", "parent-model"),
                    i("gen_ai.usage.input_tokens", 120),
                    i("gen_ai.usage.output_tokens", 9),
                    r#"{"key":"gen_ai.server.time_to_first_token","value":{"doubleValue":0.0005}}"#
                        .to_string(),
                    s("gen_ai.provider.name", "onnx"),
                    s("gen_ai.response.finish_reasons", r#"[\"stop\"]"#),
                    s("wma.attempt", "first"),
                    s("wma.constraint", "calls-only"),
                ]
                .join(","),
            ),
        ]);
        format!("{helper}\n\n{parent}\n")
    }

    #[test]
    fn a_team_run_prints_as_a_tree_with_the_helper_under_the_parents_call() {
        let traces = parse_traces(&team()).unwrap();
        assert_eq!(traces.len(), 1);
        assert_eq!(traces[0].id, TRACE);
        assert_eq!(traces[0].spans.len(), 6);
        let printed = traces[0].to_string();
        let expected = "\
trace 4bf92f3577b34da6a3ce929d0e0e4736  webmcp-agents  2023-11-14 22:13:20.000 UTC  10.0 ms  6 spans
invoke_agent parent                +0 µs    10.0 ms  model=parent-model provider=onnx steps=2 finish=stop
└─ step 1                        +1.0 ms     6.0 ms  tools=1 outcome=calls
   ├─ chat parent-model          +1.0 ms     1.0 ms  in=120 out=9 finish=stop ttft=500µs constraint=calls-only
   ├─ execute_tool helper        +2.0 ms     4.0 ms  error=tool_failed
   │  └─ invoke_agent helper     +3.0 ms     3.0 ms  model=helper-model steps=1 finish=stop
   │     └─ step 1               +3.0 ms     2.0 ms  outcome=answer
   └─ · loop-guard               +6.5 ms             the same call again
";
        assert_eq!(printed, expected, "\n{printed}");
    }

    #[test]
    fn a_malformed_line_is_an_error_with_its_number() {
        let text = format!(
            "{}\n{{\"resourceSpans\": [\n",
            team().lines().next().unwrap()
        );
        let error = parse_traces(&text).unwrap_err();
        assert!(
            error.starts_with("line 2 is not an OTLP JSON export request"),
            "{error}"
        );
        let bad_id = line(&[span("00b2", "", "x", (0, 1), "")]);
        let error = parse_traces(&bad_id).unwrap_err();
        assert!(error.contains("line 1") && error.contains("`x`"), "{error}");
    }

    #[test]
    fn traces_are_told_apart_and_a_span_written_twice_counts_once() {
        let other = line(&[span(
            "00000000000000c1",
            "",
            "invoke_agent early",
            (0, 1),
            "",
        )])
        .replace(TRACE, "0af7651916cd43dd8448eb211c80319c")
        .replace(
            &format!("\"{}\"", T0),
            &format!("\"{}\"", T0 - 5_000_000_000),
        );
        let text = format!("{}\n{other}\n{}", team(), team());
        let traces = parse_traces(&text).unwrap();
        assert_eq!(traces.len(), 2);
        // Ordered by start: the other trace began five seconds earlier.
        assert_eq!(traces[0].id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(traces[1].spans.len(), 6);
    }

    #[test]
    fn a_span_whose_parent_is_missing_is_a_root_that_says_so() {
        let text = line(&[span(
            "00000000000000d2",
            "00000000000000d1",
            "step 3",
            (0, 1),
            "",
        )]);
        let printed = parse_traces(&text).unwrap()[0].to_string();
        assert!(
            printed.contains("step 3 (parent 00000000000000d1 not in the file)"),
            "{printed}"
        );
    }

    #[test]
    fn other_events_show_their_level_and_attributes() {
        let event = RecordedEvent {
            name: "run ended with an error".to_string(),
            time_unix_nano: 0,
            attributes: vec![
                ("level".to_string(), "ERROR".to_string()),
                ("target".to_string(), "wma_agent::run".to_string()),
                ("message".to_string(), "no model".to_string()),
                ("wma.approval.decision".to_string(), "denied".to_string()),
            ],
        };
        assert_eq!(
            event_line(&event),
            (
                "ERROR run ended with an error".to_string(),
                "message=\"no model\" decision=denied".to_string()
            )
        );
    }

    #[test]
    fn times_print_in_a_readable_unit() {
        assert_eq!(duration(850_000), "850 µs");
        assert_eq!(duration(12_340_000), "12.3 ms");
        assert_eq!(duration(1_250_000_000), "1.25 s");
        assert_eq!(utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(951_782_400_123_000_000), "2000-02-29 00:00:00.123 UTC");
        assert_eq!(utc(T0), "2023-11-14 22:13:20.000 UTC");
    }
}
