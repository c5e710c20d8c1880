//! Configuration: the raw form read from a config file, and the settings
//! it resolves to once the standard `OTEL_*` variables are applied.

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::TelemetryError;

/// Where a trace's id goes in [`TelemetryConfig::trace_url`].
pub const TRACE_ID_PLACEHOLDER: &str = "{trace_id}";

/// `service.name` unless `OTEL_SERVICE_NAME` or the config says otherwise.
pub const DEFAULT_SERVICE_NAME: &str = "webmcp-agents";

/// What is printed to stderr unless `RUST_LOG` or the config says otherwise.
pub const DEFAULT_LOG_FILTER: &str = "warn";

/// What is exported unless the config says otherwise: the GenAI spans are
/// at info level. ractor's own per-actor spans live as long as the actor
/// and would only clutter a trace, so they are left out.
pub const DEFAULT_TRACE_FILTER: &str = "info,ractor=off";

/// The `[telemetry]` table of a config file. Every field is optional; the
/// defaults keep export off.
///
/// ```
/// let config: wma_telemetry::TelemetryConfig = serde_json::from_str(
///     r#"{"enabled": true, "protocol": "grpc"}"#,
/// ).unwrap();
/// let settings = config.resolve(|_| None).unwrap();
/// assert_eq!(settings.export.unwrap().endpoint, "http://localhost:4317");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Export traces over OTLP. Default false. The standard variables
    /// switch it too (see [`TelemetryConfig::resolve`]).
    pub enabled: bool,
    /// The collector's base URL, like `OTEL_EXPORTER_OTLP_ENDPOINT`. Default
    /// `http://localhost:4318` for HTTP, `http://localhost:4317` for gRPC.
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    pub protocol: Option<String>,
    /// `service.name` of the exported spans. Default [`DEFAULT_SERVICE_NAME`].
    pub service_name: Option<String>,
    /// What is printed to stderr, in `RUST_LOG` syntax. Default [`DEFAULT_LOG_FILTER`].
    pub log: Option<String>,
    /// What is exported, in the same syntax. Default [`DEFAULT_TRACE_FILTER`].
    pub traces: Option<String>,
    /// Also write the spans to this file, one OTLP JSON export request per
    /// line (appended), for `wma trace FILE` or any OTLP/JSON reader; works
    /// with or without a collector. Default none. A relative path is taken
    /// from the working directory. The `OTEL_*` variables leave it alone
    /// (they speak of OTLP export; a file is asked for by name).
    pub file: Option<PathBuf>,
    /// Where a trace is seen in the backend the spans go to, with
    /// `{trace_id}` where its id goes: every run then prints its link
    /// (Phoenix: `http://localhost:6006/redirects/traces/{trace_id}`;
    /// Jaeger: `http://localhost:16686/trace/{trace_id}`). The OTLP
    /// endpoint does not say where a backend shows its traces, so nothing
    /// is guessed from it. Default: none, and only the id is printed.
    pub trace_url: Option<String>,
}

/// The wire protocol of the OTLP exporter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP, port 4318 (`http/protobuf`).
    HttpProtobuf,
    /// gRPC, port 4317 (`grpc`).
    Grpc,
}

impl OtlpProtocol {
    fn parse(setting: &str, value: &str) -> Result<Self, TelemetryError> {
        match value.trim() {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            other => Err(TelemetryError::Invalid {
                setting: setting.to_string(),
                value: other.to_string(),
                why: "use `http/protobuf` or `grpc`".to_string(),
            }),
        }
    }
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpExport {
    /// The protocol.
    pub protocol: OtlpProtocol,
    /// The full URL the exporter sends to: for HTTP it ends in `/v1/traces`.
    pub endpoint: String,
}

/// Resolved settings: what [`crate::build`] sets up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `None`: no exporter and no OpenTelemetry layer at all.
    pub export: Option<OtlpExport>,
    /// `service.name`.
    pub service_name: String,
    /// What is printed to stderr.
    pub log_filter: String,
    /// What is exported.
    pub trace_filter: String,
    /// A file the spans are also written to, as OTLP JSON lines; `None`
    /// writes none. Independent of [`Settings::export`]: either one builds
    /// the OpenTelemetry layer.
    pub file: Option<PathBuf>,
}

impl Settings {
    /// Whether spans go anywhere (a collector or a file), that is whether
    /// the OpenTelemetry layer is built at all.
    pub fn is_tracing(&self) -> bool {
        self.export.is_some() || self.file.is_some()
    }
}

impl TelemetryConfig {
    /// A config that exports over http/protobuf to `endpoint` (a base URL).
    pub fn exporting_to(endpoint: impl Into<String>) -> Self {
        Self {
            enabled: true,
            endpoint: Some(endpoint.into()),
            ..Self::default()
        }
    }

    /// Applies the standard OpenTelemetry variables (read through `env`) on
    /// top of the config, which they override:
    ///
    /// - `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn export
    ///   off; `OTEL_TRACES_EXPORTER=otlp`, or an endpoint variable, turn it on.
    /// - `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`,
    ///   choose the protocol.
    /// - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), then
    ///   `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` added for HTTP),
    ///   choose the endpoint.
    /// - `OTEL_SERVICE_NAME` names the service; `RUST_LOG` filters the log.
    /// - The trace file ([`TelemetryConfig::file`]) is kept as configured:
    ///   the variables speak of OTLP export, and a file is asked for by
    ///   name, so not even `OTEL_SDK_DISABLED` drops it.
    ///
    /// Headers, timeout and compression (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
    /// `..._COMPRESSION`), the sampler (`OTEL_TRACES_SAMPLER`), batching
    /// (`OTEL_BSP_*`) and `OTEL_RESOURCE_ATTRIBUTES` are read by the
    /// OpenTelemetry SDK itself.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, TelemetryError> {
        if let Some(url) = &self.trace_url
            && !url.contains(TRACE_ID_PLACEHOLDER)
        {
            return Err(TelemetryError::Invalid {
                setting: "telemetry.trace_url".to_string(),
                value: url.clone(),
                why: format!("write {TRACE_ID_PLACEHOLDER} where the trace's id goes"),
            });
        }
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let traces_endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base_endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        let mut enabled = self.enabled || traces_endpoint.is_some() || base_endpoint.is_some();
        if let Some(exporter) = var("OTEL_TRACES_EXPORTER") {
            match exporter.trim() {
                "otlp" => enabled = true,
                "none" => enabled = false,
                other => {
                    return Err(TelemetryError::Invalid {
                        setting: "OTEL_TRACES_EXPORTER".to_string(),
                        value: other.to_string(),
                        why: "use `otlp` or `none`".to_string(),
                    });
                }
            }
        }
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            enabled = false;
        }
        let export = if enabled {
            let protocol = match (
                var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
                var("OTEL_EXPORTER_OTLP_PROTOCOL"),
                &self.protocol,
            ) {
                (Some(v), _, _) => OtlpProtocol::parse("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", &v)?,
                (None, Some(v), _) => OtlpProtocol::parse("OTEL_EXPORTER_OTLP_PROTOCOL", &v)?,
                (None, None, Some(v)) => OtlpProtocol::parse("telemetry.protocol", v)?,
                (None, None, None) => OtlpProtocol::HttpProtobuf,
            };
            let endpoint = match (traces_endpoint, base_endpoint.or(self.endpoint.clone())) {
                (Some(url), _) => url,
                (None, Some(base)) => signal_url(protocol, &base),
                (None, None) => match protocol {
                    OtlpProtocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_string(),
                    OtlpProtocol::Grpc => "http://localhost:4317".to_string(),
                },
            };
            Some(OtlpExport { protocol, endpoint })
        } else {
            None
        };
        Ok(Settings {
            export,
            service_name: var("OTEL_SERVICE_NAME")
                .or(self.service_name.clone())
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string()),
            log_filter: var("RUST_LOG")
                .or(self.log.clone())
                .unwrap_or_else(|| DEFAULT_LOG_FILTER.to_string()),
            trace_filter: self
                .traces
                .clone()
                .unwrap_or_else(|| DEFAULT_TRACE_FILTER.to_string()),
            file: self.file.clone(),
        })
    }

    /// The link to trace `trace_id` in the backend, from
    /// [`TelemetryConfig::trace_url`]; `None` when no URL is set.
    ///
    /// ```
    /// let config = wma_telemetry::TelemetryConfig {
    ///     trace_url: Some("http://localhost:6006/redirects/traces/{trace_id}".into()),
    ///     ..Default::default()
    /// };
    /// assert_eq!(
    ///     config.trace_link("4bf92f3577b34da6a3ce929d0e0e4736").as_deref(),
    ///     Some("http://localhost:6006/redirects/traces/4bf92f3577b34da6a3ce929d0e0e4736"),
    /// );
    /// assert_eq!(wma_telemetry::TelemetryConfig::default().trace_link("4bf9"), None);
    /// ```
    pub fn trace_link(&self, trace_id: &str) -> Option<String> {
        let url = self.trace_url.as_deref()?;
        Some(url.replace(TRACE_ID_PLACEHOLDER, trace_id))
    }

    /// [`TelemetryConfig::resolve`] with the process environment.
    pub fn resolve_from_env(&self) -> Result<Settings, TelemetryError> {
        self.resolve(|name| std::env::var(name).ok())
    }
}

/// The traces URL for a base URL: HTTP adds the signal path, gRPC does not.
fn signal_url(protocol: OtlpProtocol, base: &str) -> String {
    let base = base.trim_end_matches('/');
    match protocol {
        OtlpProtocol::Grpc => base.to_string(),
        OtlpProtocol::HttpProtobuf if base.ends_with("/v1/traces") => base.to_string(),
        OtlpProtocol::HttpProtobuf => format!("{base}/v1/traces"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn off_by_default() {
        let settings = TelemetryConfig::default().resolve(env(&[])).unwrap();
        assert_eq!(settings.export, None);
        assert_eq!(settings.service_name, DEFAULT_SERVICE_NAME);
        assert_eq!(settings.log_filter, DEFAULT_LOG_FILTER);
    }

    #[test]
    fn an_endpoint_variable_turns_export_on_and_gets_the_signal_path() {
        let settings = TelemetryConfig::default()
            .resolve(env(&[(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://collector:4318/",
            )]))
            .unwrap();
        assert_eq!(
            settings.export,
            Some(OtlpExport {
                protocol: OtlpProtocol::HttpProtobuf,
                endpoint: "http://collector:4318/v1/traces".to_string()
            })
        );
    }

    #[test]
    fn variables_override_the_config() {
        let config = TelemetryConfig {
            enabled: true,
            endpoint: Some("http://config:4318".to_string()),
            service_name: Some("from-config".to_string()),
            ..TelemetryConfig::default()
        };
        let settings = config
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317"),
                ("OTEL_SERVICE_NAME", "from-env"),
            ]))
            .unwrap();
        let export = settings.export.unwrap();
        assert_eq!(export.protocol, OtlpProtocol::Grpc);
        assert_eq!(export.endpoint, "http://traces:4317");
        assert_eq!(settings.service_name, "from-env");
    }

    #[test]
    fn the_config_endpoint_is_a_base_url() {
        let settings = TelemetryConfig::exporting_to("http://127.0.0.1:9999")
            .resolve(env(&[]))
            .unwrap();
        assert_eq!(
            settings.export.unwrap().endpoint,
            "http://127.0.0.1:9999/v1/traces"
        );
    }

    #[test]
    fn disabling_variables_win() {
        let config = TelemetryConfig::exporting_to("http://x:4318");
        for pairs in [
            [("OTEL_SDK_DISABLED", "true")],
            [("OTEL_TRACES_EXPORTER", "none")],
        ] {
            assert_eq!(config.resolve(env(&pairs)).unwrap().export, None);
        }
        let on = TelemetryConfig::default()
            .resolve(env(&[("OTEL_TRACES_EXPORTER", "otlp")]))
            .unwrap();
        assert!(on.export.is_some());
    }

    #[test]
    fn a_trace_url_needs_the_place_of_the_trace_id() {
        let config = TelemetryConfig {
            trace_url: Some("http://localhost:16686/trace/".to_string()),
            ..TelemetryConfig::default()
        };
        let e = config.resolve(env(&[])).unwrap_err().to_string();
        assert!(
            e.contains("telemetry.trace_url") && e.contains("{trace_id}"),
            "{e}"
        );
        let config = TelemetryConfig {
            trace_url: Some("http://localhost:16686/trace/{trace_id}".to_string()),
            ..TelemetryConfig::default()
        };
        config.resolve(env(&[])).unwrap();
        assert_eq!(
            config.trace_link("abc").as_deref(),
            Some("http://localhost:16686/trace/abc")
        );
    }

    #[test]
    fn a_trace_file_traces_without_a_collector_and_the_variables_leave_it_alone() {
        let config = TelemetryConfig {
            file: Some(PathBuf::from("runs.jsonl")),
            ..TelemetryConfig::default()
        };
        let settings = config.resolve(env(&[])).unwrap();
        assert_eq!(settings.file, Some(PathBuf::from("runs.jsonl")));
        assert_eq!(settings.export, None);
        assert!(settings.is_tracing());
        for pairs in [
            [("OTEL_SDK_DISABLED", "true")],
            [("OTEL_TRACES_EXPORTER", "none")],
        ] {
            let settings = config.resolve(env(&pairs)).unwrap();
            assert_eq!(settings.file, Some(PathBuf::from("runs.jsonl")));
        }
        let both = config
            .resolve(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]))
            .unwrap();
        assert!(both.export.is_some() && both.file.is_some());
        assert!(
            !TelemetryConfig::default()
                .resolve(env(&[]))
                .unwrap()
                .is_tracing()
        );
    }

    #[test]
    fn the_file_is_read_from_a_config_table() {
        let config: TelemetryConfig =
            serde_json::from_str(r#"{"file": "/tmp/wma-trace.jsonl"}"#).unwrap();
        assert_eq!(config.file, Some(PathBuf::from("/tmp/wma-trace.jsonl")));
    }

    #[test]
    fn unsupported_values_are_named() {
        let err = TelemetryConfig::default()
            .resolve(env(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ]))
            .unwrap_err();
        assert!(err.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"));
        assert!(
            TelemetryConfig::default()
                .resolve(env(&[("OTEL_TRACES_EXPORTER", "zipkin")]))
                .is_err()
        );
    }
}
