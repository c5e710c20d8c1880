//! Tools built into `wma`, for `kind = "native"` sources.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;
use wma_agent::{ToolAnnotations, ToolDefinition, ToolError, ToolErrorCode};
use wma_tools::NativeTools;

/// The built-in tools a native source may offer.
pub const BUILTINS: &[&str] = &["calculator", "current_time"];

/// A native source with these built-ins (names from [`BUILTINS`]; others are skipped).
pub fn builtin_tools(names: &[String]) -> NativeTools {
    let mut tools = NativeTools::new();
    let read_only = ToolAnnotations {
        read_only: true,
        ..ToolAnnotations::default()
    };
    for name in names {
        match name.as_str() {
            "calculator" => {
                tools.add_fn(
                    ToolDefinition::new(
                        "calculator",
                        "Add, subtract, multiply or divide two numbers.",
                        json!({"type": "object", "properties": {
                            "a": {"type": "number"},
                            "b": {"type": "number"},
                            "op": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]}},
                            "required": ["a", "b", "op"]}),
                    )
                    .with_annotations(read_only.clone()),
                    |args| {
                        let a = args["a"].as_f64().unwrap_or(0.0);
                        let b = args["b"].as_f64().unwrap_or(0.0);
                        let value = match args["op"].as_str().unwrap_or("") {
                            "add" => a + b,
                            "subtract" => a - b,
                            "multiply" => a * b,
                            "divide" if b == 0.0 => {
                                return Err(ToolError::new(
                                    ToolErrorCode::ToolFailed,
                                    "cannot divide by zero",
                                ));
                            }
                            "divide" => a / b,
                            other => {
                                return Err(ToolError::new(
                                    ToolErrorCode::InvalidArguments,
                                    format!("unknown op `{other}`"),
                                ));
                            }
                        };
                        Ok(json!({"result": value}).to_string())
                    },
                );
            }
            "current_time" => {
                tools.add_fn(
                    ToolDefinition::new(
                        "current_time",
                        "The current date and time (UTC).",
                        json!({"type": "object", "properties": {}}),
                    )
                    .with_annotations(read_only.clone()),
                    |_| {
                        let secs = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs());
                        Ok(utc(secs))
                    },
                );
            }
            _ => {}
        }
    }
    tools
}

/// Seconds since 1970 as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian),
/// after Howard Hinnant's days-to-civil algorithm.
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;
    use wma_agent::ToolHost;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[tokio::test]
    async fn calculator_divides_and_refuses_zero() {
        let tools = builtin_tools(&["calculator".to_string()]);
        let out = tools
            .call_tool(
                "calculator",
                json!({"a": 7, "b": 2, "op": "divide"}),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(out, r#"{"result":3.5}"#);
        let err = tools
            .call_tool(
                "calculator",
                json!({"a": 7, "b": 0, "op": "divide"}),
                CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::ToolFailed);
    }
}
