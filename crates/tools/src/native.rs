//! Rust functions as tools.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{ArgsError, ToolDefinition, ToolError, ToolErrorCode, ToolHost, validate_args};

/// Time limit of one call unless [`NativeTools::with_timeout`] says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

type Handler = Arc<dyn Fn(Value) -> BoxFuture<'static, Result<String, ToolError>> + Send + Sync>;

struct NativeTool {
    definition: ToolDefinition,
    handler: Handler,
}

/// A set of Rust functions offered as tools.
pub struct NativeTools {
    tools: Vec<NativeTool>,
    /// Per-call limit: a hung function must not hang the agent.
    timeout: Duration,
}

impl Default for NativeTools {
    fn default() -> Self {
        Self::new()
    }
}

impl NativeTools {
    /// An empty set with the default call timeout.
    pub fn new() -> Self {
        Self {
            tools: Vec::new(),
            timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// Sets the per-call time limit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds a synchronous tool. A later tool with the same name replaces the
    /// earlier one, so names stay unique.
    pub fn add_fn<F>(&mut self, definition: ToolDefinition, f: F) -> &mut Self
    where
        F: Fn(Value) -> Result<String, ToolError> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.insert(NativeTool {
            definition,
            handler: Arc::new(move |args| {
                let f = f.clone();
                async move { f(args) }.boxed()
            }),
        });
        self
    }

    /// Adds an asynchronous tool.
    pub fn add_async<F, Fut>(&mut self, definition: ToolDefinition, f: F) -> &mut Self
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<String, ToolError>> + Send + 'static,
    {
        self.insert(NativeTool {
            definition,
            handler: Arc::new(move |args| f(args).boxed()),
        });
        self
    }

    fn insert(&mut self, tool: NativeTool) {
        self.tools
            .retain(|t| t.definition.name != tool.definition.name);
        self.tools.push(tool);
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[async_trait]
impl ToolHost for NativeTools {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        self.tools.iter().map(|t| t.definition.clone()).collect()
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let Some(tool) = self.tools.iter().find(|t| t.definition.name == name) else {
            return Err(ToolError::new(
                ToolErrorCode::UnknownTool,
                format!("no tool named \"{name}\""),
            ));
        };
        // The loop validates too, but a host can be called by anyone.
        match validate_args(&tool.definition.input_schema, &arguments) {
            Ok(()) => {}
            Err(ArgsError::Invalid(message)) => {
                return Err(ToolError::new(ToolErrorCode::InvalidArguments, message));
            }
            Err(error) => {
                return Err(ToolError::new(
                    ToolErrorCode::Unavailable,
                    error.to_string(),
                ));
            }
        }
        let run = AssertUnwindSafe((tool.handler)(arguments)).catch_unwind();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ToolError::new(ToolErrorCode::Cancelled, "the call was cancelled")),
            outcome = tokio::time::timeout(self.timeout, run) => match outcome {
                Err(_) => Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!("{name} did not answer within {} s", self.timeout.as_secs_f32()),
                )),
                Ok(Err(panic)) => {
                    let reason = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_string());
                    tracing::error!(tool = name, %reason, "tool panicked");
                    Err(ToolError::new(ToolErrorCode::ToolFailed, format!("{name} crashed: {reason}")))
                }
                Ok(Ok(result)) => result,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> NativeTools {
        let mut tools = NativeTools::new().with_timeout(Duration::from_secs(1));
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        tools.add_fn(
            ToolDefinition::new("double", "Double n.", schema.clone()),
            |a| Ok((a["n"].as_i64().unwrap_or(0) * 2).to_string()),
        );
        tools.add_fn(
            ToolDefinition::new("boom", "Panics.", json!({"type": "object"})),
            |_| panic!("kaboom"),
        );
        tools.add_async(
            ToolDefinition::new("hang", "Never answers.", json!({"type": "object"})),
            |_| async {
                futures::future::pending::<()>().await;
                Ok(String::new())
            },
        );
        tools
    }

    #[tokio::test]
    async fn calls_validate_arguments_before_running() {
        let t = tools();
        assert_eq!(
            t.call_tool("double", json!({"n": 4}), CancellationToken::new())
                .await
                .unwrap(),
            "8"
        );
        let err = t
            .call_tool("double", json!({"n": "four"}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::InvalidArguments);
        let err = t
            .call_tool("triple", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::UnknownTool);
    }

    #[tokio::test]
    async fn a_panicking_tool_becomes_tool_failed() {
        let err = tools()
            .call_tool("boom", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::ToolFailed);
        assert!(err.message.contains("kaboom"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_tool_times_out_and_cancellation_is_honoured() {
        let t = tools();
        let err = t
            .call_tool("hang", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::Timeout);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let err = t.call_tool("hang", json!({}), cancel).await.unwrap_err();
        assert_eq!(err.code, ToolErrorCode::Cancelled);
    }

    #[test]
    fn a_later_tool_with_the_same_name_replaces_the_earlier() {
        let mut t = tools();
        t.add_fn(
            ToolDefinition::new("double", "again", json!({"type": "object"})),
            |_| Ok("x".into()),
        );
        assert_eq!(t.len(), 3);
    }
}
