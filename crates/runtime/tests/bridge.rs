//! The tool bridge: merged sources, validation before dispatch, timeouts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use wma_agent::{ToolDefinition, ToolErrorCode, ToolHost};
use wma_runtime::{ProviderSource, Runtime, ToolSource};
use wma_testkit::InMemoryToolHost;
use wma_tools::NativeTools;

use crate::support::{TokenModel, add_to_cart, shop};

async fn runtime_with(sources: Vec<ToolSource>, timeout: Duration) -> Runtime {
    let mut builder = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("model", Vec::<String>::new())
    }))
    .tool_timeout(timeout);
    for source in sources {
        builder = builder.tool_source(source);
    }
    builder.start().await.unwrap()
}

#[tokio::test]
async fn arguments_are_validated_before_the_source_sees_the_call() {
    let host = Arc::new(shop());
    let runtime = runtime_with(
        vec![ToolSource::shared("shop", host.clone())],
        Duration::from_secs(5),
    )
    .await;
    let tools = runtime.tools();
    let error = tools
        .call_tool("add_to_cart", json!({"id": 7}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidArguments);
    assert!(host.calls().is_empty(), "the source never saw the bad call");
    assert_eq!(
        tools
            .call_tool(
                "add_to_cart",
                json!({"id": "tent"}),
                CancellationToken::new()
            )
            .await
            .unwrap(),
        "added tent to the cart"
    );
    let error = tools
        .call_tool("remove_from_cart", json!({}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::UnknownTool);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_call_over_the_time_limit_fails_with_timeout() {
    let host = InMemoryToolHost::new();
    host.add_slow(add_to_cart(), Duration::from_secs(600), |_| {
        Ok("late".into())
    });
    let runtime = runtime_with(
        vec![ToolSource::shared("slow", Arc::new(host))],
        Duration::from_millis(100),
    )
    .await;
    let error = runtime
        .tools()
        .call_tool(
            "add_to_cart",
            json!({"id": "tent"}),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Timeout);
    runtime.shutdown().await;
}

#[tokio::test]
async fn sources_are_merged_and_the_first_registered_wins_a_name_clash() {
    let first = InMemoryToolHost::new();
    first.add(
        ToolDefinition::new("search", "Search the shop.", json!({"type": "object"})),
        |_| Ok("from the page".into()),
    );
    let mut native = NativeTools::new();
    native.add_fn(
        ToolDefinition::new("search", "Search the web.", json!({"type": "object"})),
        |_| Ok("from rust".into()),
    );
    native.add_fn(
        ToolDefinition::new(
            "double",
            "Double n.",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        ),
        |args| Ok((args["n"].as_i64().unwrap_or(0) * 2).to_string()),
    );
    let runtime = runtime_with(
        vec![
            ToolSource::shared("page", Arc::new(first)),
            ToolSource::shared("rust", Arc::new(native)),
        ],
        Duration::from_secs(5),
    )
    .await;
    let tools = runtime.tools();
    let names: Vec<String> = tools
        .list_tools()
        .await
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["search", "double"]);
    assert_eq!(
        tools
            .call_tool("search", json!({}), CancellationToken::new())
            .await
            .unwrap(),
        "from the page"
    );
    assert_eq!(
        tools
            .call_tool("double", json!({"n": 21}), CancellationToken::new())
            .await
            .unwrap(),
        "42"
    );
    runtime.shutdown().await;
}
