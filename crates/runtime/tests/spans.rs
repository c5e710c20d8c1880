//! The exported span tree: a run traced through the actors, exported over
//! OTLP http/protobuf to the testkit's receiver, decoded and checked.

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wma_agent::{
    AgentStreamPart, ChatMessage, FinishReason, PageContext, ToolDefinition, ToolError,
    ToolErrorCode, ToolHost, policy::Policy,
};
use wma_runtime::{AgentConfig, ProviderSource, Runtime, RuntimeBuilder, ToolSource};
use wma_telemetry::TelemetryConfig;
use wma_testkit::{CapturedSpan, InMemoryToolHost, OtlpReceiver, SpanStatus};

use crate::support::{TokenModel, add_to_cart, call, end, wait_until};

/// A shop whose tools trace their own work, to show that the hop through
/// the tool bridge keeps them under the loop's `execute_tool` span.
struct TracedShop;

#[async_trait]
impl ToolHost for TracedShop {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        vec![
            add_to_cart(),
            ToolDefinition::new("checkout", "Pay for the cart.", json!({"type": "object"})),
        ]
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        _cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let span = tracing::info_span!("shop.request", shop.tool = name);
        async {
            match name {
                "add_to_cart" => Ok(format!("added {} to the cart", arguments["id"])),
                _ => Err(ToolError::new(
                    ToolErrorCode::ToolFailed,
                    "the cart is empty",
                )),
            }
        }
        .instrument(span)
        .await
    }

    async fn page_context(&self) -> Option<PageContext> {
        None
    }
}

/// The tests of this binary run one at a time (see the binary's docs).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Exports this thread's spans to `receiver` over OTLP http/protobuf, the
/// log off (runs that fail on purpose log errors); the subscriber is
/// scoped to the thread until the second guard drops.
fn export_over_http(
    receiver: &OtlpReceiver,
) -> (
    wma_telemetry::TelemetryGuard,
    tracing::dispatcher::DefaultGuard,
) {
    let config = TelemetryConfig {
        log: Some("off".to_string()),
        ..TelemetryConfig::exporting_to(receiver.endpoint())
    };
    let (dispatch, guard) = wma_telemetry::build(&config.resolve(|_| None).unwrap()).unwrap();
    let scope = tracing::dispatcher::set_default(&dispatch);
    (guard, scope)
}

fn one<'a>(spans: &'a [CapturedSpan], name: &str) -> &'a CapturedSpan {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(
        found.len(),
        1,
        "one span named {name:?} in {:#?}",
        names(spans)
    );
    found[0]
}

fn names(spans: &[CapturedSpan]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn children<'a>(
    spans: &'a [CapturedSpan],
    parent: &CapturedSpan,
    name: &str,
) -> Vec<&'a CapturedSpan> {
    spans
        .iter()
        .filter(|s| s.name == name && s.is_child_of(parent))
        .collect()
}

// The subscriber is scoped to this test's thread, so the runtime runs on
// the current-thread runtime (the default of `tokio::test`) with it.
#[tokio::test]
async fn a_run_exports_the_genai_span_tree_with_parent_links_across_the_actors() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let receiver = OtlpReceiver::start().unwrap();
    let (guard, _scope) = export_over_http(&receiver);

    let model = TokenModel::new(
        "tiny-model",
        [
            call("checkout", json!({})),
            call("add_to_cart", json!({"id": "tent"})),
            "Sorry, paying did not work, but the tent is in your cart.".to_string(),
            // The second run: the model fails outright.
        ],
    );
    let runtime = Runtime::builder(ProviderSource::new({
        let model = model.clone();
        move || model.clone()
    }))
    .tool_source(ToolSource::new("shop", || TracedShop))
    .agent(AgentConfig::new("shopper"))
    .start()
    .await
    .unwrap();
    let agent = runtime.agent("shopper").unwrap();

    let request = tracing::info_span!("request");
    let parts = async {
        agent
            .run(vec![ChatMessage::user(
                "Check out, then add the tent to my cart",
            )])
            .await
            .unwrap()
            .collect_parts()
            .await
    }
    .instrument(request.clone())
    .await;
    assert_eq!(
        end(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Stop
        },
        "{parts:#?}"
    );
    let trace = wma_telemetry::trace_id(&request).expect("the request span is exported");
    drop(request);

    // A second run whose model has no reply left: the error path.
    let failed = agent
        .run(vec![ChatMessage::user("Anything else?")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert!(matches!(end(&failed), AgentStreamPart::Error { .. }));

    guard.flush().unwrap();
    wait_until("both runs are exported", || {
        receiver
            .spans()
            .iter()
            .filter(|s| s.name == "invoke_agent shopper")
            .count()
            == 2
    })
    .await;
    let all = receiver.spans();
    let spans: Vec<CapturedSpan> = all
        .iter()
        .filter(|s| s.trace_id == trace)
        .cloned()
        .collect();

    // The caller's span is the root, and the run hangs under it although
    // the run was started through a message to the agent actor.
    let root = one(&spans, "request");
    assert_eq!(root.parent_span_id, None);
    assert_eq!(root.service_name.as_deref(), Some("webmcp-agents"));
    let agent_span = one(&spans, "invoke_agent shopper");
    assert!(agent_span.is_child_of(root));
    assert_eq!(
        agent_span.str_attr("gen_ai.operation.name"),
        Some("invoke_agent")
    );
    assert_eq!(agent_span.str_attr("gen_ai.agent.name"), Some("shopper"));
    assert_eq!(
        agent_span.str_attr("gen_ai.provider.name"),
        Some("token-test")
    );
    assert_eq!(
        agent_span.str_attr("gen_ai.request.model"),
        Some("tiny-model")
    );
    assert_eq!(agent_span.str_attr("wma.finish_reason"), Some("stop"));
    assert_eq!(agent_span.status, SpanStatus::Unset);

    for step in 1..=3 {
        let step_span = one(&spans, &format!("step {step}"));
        assert!(
            step_span.is_child_of(agent_span),
            "step {step} is under the run"
        );
        assert_eq!(step_span.int_attr("wma.step"), Some(step), "{step_span:#?}");

        // One generation per step, answered through the provider actor.
        let chats = children(&spans, step_span, "chat tiny-model");
        assert_eq!(chats.len(), 1, "one chat span under step {step}");
        let chat = chats[0];
        assert_eq!(chat.kind, "client");
        assert_eq!(chat.str_attr("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.str_attr("gen_ai.provider.name"), Some("token-test"));
        assert_eq!(chat.str_attr("gen_ai.request.model"), Some("tiny-model"));
        assert!(chat.int_attr("gen_ai.usage.input_tokens").unwrap() > 0);
        assert!(chat.int_attr("gen_ai.usage.output_tokens").unwrap() > 0);
        assert!(
            chat.attr("gen_ai.server.time_to_first_token")
                .and_then(|v| v.as_f64())
                .is_some(),
            "time to first token is recorded"
        );
        assert_eq!(
            chat.str_attr("gen_ai.response.finish_reasons"),
            Some(r#"["stop"]"#)
        );
        // The model's own span stayed under `chat` across the actor hop.
        assert_eq!(children(&spans, chat, "decode").len(), 1);
    }

    let step1 = one(&spans, "step 1");
    let failed_call = one(&spans, "execute_tool checkout");
    assert!(failed_call.is_child_of(step1));
    assert_eq!(
        failed_call.str_attr("gen_ai.operation.name"),
        Some("execute_tool")
    );
    assert_eq!(failed_call.str_attr("gen_ai.tool.name"), Some("checkout"));
    assert_eq!(
        failed_call.str_attr("gen_ai.tool.call.id"),
        Some("call_1_1")
    );
    assert_eq!(failed_call.str_attr("error.type"), Some("tool_failed"));
    assert_eq!(failed_call.status, SpanStatus::Error("tool_failed".into()));

    let step2 = one(&spans, "step 2");
    let good_call = one(&spans, "execute_tool add_to_cart");
    assert!(good_call.is_child_of(step2));
    assert_eq!(good_call.str_attr("gen_ai.tool.call.id"), Some("call_2_1"));
    assert_eq!(good_call.attr("error.type"), None);
    assert_eq!(good_call.status, SpanStatus::Unset);
    // The tool source's own spans stayed under `execute_tool` across the bridge.
    assert_eq!(children(&spans, failed_call, "shop.request").len(), 1);
    assert_eq!(children(&spans, good_call, "shop.request").len(), 1);

    // The failed run: error.type on the generation and on the run, both
    // exported with an error status.
    let failed_run = all
        .iter()
        .find(|s| s.name == "invoke_agent shopper" && s.trace_id != trace)
        .expect("the failed run is exported");
    assert_eq!(failed_run.parent_span_id, None);
    assert_eq!(failed_run.str_attr("error.type"), Some("agent_error"));
    assert!(matches!(failed_run.status, SpanStatus::Error(_)));
    let failed_chat = all
        .iter()
        .find(|s| s.name == "chat tiny-model" && s.trace_id == failed_run.trace_id)
        .expect("the failed generation is exported");
    assert_eq!(failed_chat.str_attr("error.type"), Some("provider_error"));
    assert!(matches!(failed_chat.status, SpanStatus::Error(_)));

    runtime.shutdown().await;
    drop(_scope);
    drop(guard);
}

/// A shop with a lookup marked read-only, as real hosts mark them, so the
/// small-model policy's rules about lookups apply.
struct AnnotatedShop;

#[async_trait]
impl ToolHost for AnnotatedShop {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        vec![
            add_to_cart(),
            ToolDefinition::new("view_cart", "Show the cart.", json!({"type": "object"}))
                .with_annotations(wma_agent::ToolAnnotations {
                    read_only: true,
                    ..Default::default()
                }),
        ]
    }

    async fn call_tool(
        &self,
        name: &str,
        _arguments: Value,
        _cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        Ok(match name {
            "add_to_cart" => "added the tent".to_string(),
            _ => "cart: tent".to_string(),
        })
    }

    async fn page_context(&self) -> Option<PageContext> {
        None
    }
}

#[tokio::test]
async fn a_rule_that_fires_is_a_named_event_on_its_step() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let receiver = OtlpReceiver::start().unwrap();
    let (guard, _scope) = export_over_http(&receiver);
    // An action, then the same lookup twice: `done_on_repeated_lookup`
    // ends the run as done on step 3.
    let model = TokenModel::new(
        "rule-model",
        [
            call("add_to_cart", json!({"id": "tent"})),
            call("view_cart", json!({})),
            call("view_cart", json!({})),
            "never reached".to_string(),
        ],
    );
    let runtime = Runtime::builder(ProviderSource::new(move || model.clone()))
        .tool_source(ToolSource::new("shop", || AnnotatedShop))
        .agent({
            let mut agent = AgentConfig::new("ruled");
            agent.options.policy = Some(Policy {
                done_on_repeated_lookup: true,
                ..Policy::small_model()
            });
            agent
        })
        .start()
        .await
        .unwrap();
    let parts = runtime
        .agent("ruled")
        .unwrap()
        .run(vec![ChatMessage::user("Add the tent to my cart")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert!(
        parts.iter().any(
            |p| matches!(p, AgentStreamPart::Rule { rule, .. } if rule == "done-on-repeated-lookup")
        ),
        "{parts:#?}"
    );
    guard.flush().unwrap();
    wait_until("the run is exported", || {
        receiver
            .spans()
            .iter()
            .any(|s| s.name == "invoke_agent ruled")
    })
    .await;
    let spans = receiver.spans();
    let run = one(&spans, "invoke_agent ruled");
    let step3 = spans
        .iter()
        .find(|s| s.name == "step 3" && s.is_child_of(run))
        .expect("step 3 is exported");
    let event = step3
        .events
        .iter()
        .find(|e| e.name == "done-on-repeated-lookup")
        .unwrap_or_else(|| panic!("the rule's event on step 3: {:#?}", step3.events));
    assert_eq!(
        event.attributes.get("wma.rule").and_then(|v| v.as_str()),
        Some("done-on-repeated-lookup")
    );
    assert!(
        event
            .attributes
            .get("wma.detail")
            .and_then(|v| v.as_str())
            .is_some_and(|d| d.contains("view_cart")),
        "{event:#?}"
    );
    for earlier in ["step 1", "step 2"] {
        let step = spans
            .iter()
            .find(|s| s.name == earlier && s.is_child_of(run))
            .unwrap();
        assert!(
            step.events
                .iter()
                .all(|e| e.name != "done-on-repeated-lookup"),
            "the event is on the step where the rule fired"
        );
    }
    runtime.shutdown().await;
    drop(_scope);
    drop(guard);
}

#[tokio::test]
async fn the_same_tree_arrives_over_grpc() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let receiver = OtlpReceiver::start().unwrap();
    let config = TelemetryConfig {
        protocol: Some("grpc".to_string()),
        log: Some("off".to_string()),
        ..TelemetryConfig::exporting_to(receiver.endpoint())
    };
    let settings = config.resolve(|_| None).unwrap();
    assert_eq!(
        settings.export.as_ref().map(|e| e.endpoint.clone()),
        Some(receiver.endpoint()),
        "gRPC takes the base URL as is"
    );
    let (dispatch, guard) = wma_telemetry::build(&settings).unwrap();
    let _scope = tracing::dispatcher::set_default(&dispatch);

    let runtime = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("grpc-model", ["Hello."])
    }))
    .agent(AgentConfig::new("greeter"))
    .start()
    .await
    .unwrap();
    let parts = runtime
        .agent("greeter")
        .unwrap()
        .run(vec![ChatMessage::user("Hi")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert_eq!(
        end(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Stop
        }
    );
    runtime.shutdown().await;

    // The gRPC exporter's flush blocks on its own runtime; keep it off this one.
    let guard = tokio::task::spawn_blocking(move || guard.flush().map(|()| guard))
        .await
        .unwrap()
        .unwrap();
    wait_until("the run arrives over gRPC", || {
        receiver
            .spans()
            .iter()
            .any(|s| s.name == "invoke_agent greeter")
    })
    .await;
    let spans = receiver.spans();
    let run = one(&spans, "invoke_agent greeter");
    let step = one(&spans, "step 1");
    let chat = one(&spans, "chat grpc-model");
    assert!(step.is_child_of(run));
    assert!(chat.is_child_of(step));
    assert_eq!(chat.int_attr("gen_ai.usage.output_tokens"), Some(1));
    assert_eq!(run.service_name.as_deref(), Some("webmcp-agents"));
    drop(guard);
}

/// A tool host with one search tool, for the sub-agent.
fn search_host() -> std::sync::Arc<InMemoryToolHost> {
    let host = std::sync::Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        |_| Ok(json!([{"id": "p-17", "title": "Summit 30L Backpack"}]).to_string()),
    );
    host
}

#[tokio::test]
async fn a_sub_agents_run_nests_under_the_parents_tool_call_in_the_trace() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let receiver = OtlpReceiver::start().unwrap();
    let (guard, _scope) = export_over_http(&receiver);

    let parent = TokenModel::new(
        "parent-model",
        [
            call("finder", json!({"task": "Find a backpack"})),
            "Found p-17 for you.".to_string(),
        ],
    );
    let finder = TokenModel::new(
        "finder-model",
        [
            call("search_products", json!({"query": "backpack"})),
            "The best match is p-17.".to_string(),
        ],
    );
    let runtime = RuntimeBuilder::new()
        .provider("parent", ProviderSource::new(move || parent.clone()))
        .provider("finder", ProviderSource::new(move || finder.clone()))
        .tool_source(ToolSource::shared("search", search_host()))
        .agent(
            AgentConfig::new("shopper")
                .with_provider("parent")
                .with_tool_sources(Vec::<String>::new())
                .with_sub_agents(["finder"]),
        )
        .agent(
            AgentConfig::new("finder")
                .with_provider("finder")
                .with_tool_sources(["search"]),
        )
        .start()
        .await
        .unwrap();
    let request = tracing::info_span!("request");
    let parts = async {
        runtime
            .agent("shopper")
            .unwrap()
            .run(vec![ChatMessage::user("Find me a backpack")])
            .await
            .unwrap()
            .collect_tagged()
            .await
    }
    .instrument(request.clone())
    .await;
    assert!(parts.last().unwrap().ends_the_run());
    let trace = wma_telemetry::trace_id(&request).unwrap();
    drop(request);
    // The runs' spans close when their tasks end, which may be just after
    // the last part arrived; wait for both instead of flushing once.
    wait_until("both runs are exported", || {
        let _ = guard.flush();
        receiver
            .spans()
            .iter()
            .filter(|s| s.name.starts_with("invoke_agent"))
            .count()
            == 2
    })
    .await;
    let spans: Vec<CapturedSpan> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == trace)
        .collect();

    let parent_run = one(&spans, "invoke_agent shopper");
    assert!(parent_run.is_child_of(one(&spans, "request")));
    let delegation = one(&spans, "execute_tool finder");
    assert_eq!(delegation.str_attr("gen_ai.tool.name"), Some("finder"));
    let parent_step = spans
        .iter()
        .find(|s| s.name == "step 1" && s.is_child_of(parent_run))
        .expect("the parent's first step");
    assert!(delegation.is_child_of(parent_step));
    // The sub-agent's run hangs under the call that started it, in the same trace.
    let sub_run = one(&spans, "invoke_agent finder");
    assert!(sub_run.is_child_of(delegation), "{sub_run:#?}");
    assert_eq!(sub_run.str_attr("gen_ai.agent.name"), Some("finder"));
    assert_eq!(
        sub_run.str_attr("gen_ai.request.model"),
        Some("finder-model")
    );
    let sub_step = spans
        .iter()
        .find(|s| s.name == "step 1" && s.is_child_of(sub_run))
        .expect("the sub-agent's first step");
    assert!(
        spans
            .iter()
            .any(|s| s.name == "chat finder-model" && s.is_child_of(sub_step))
    );
    assert!(one(&spans, "execute_tool search_products").is_child_of(sub_step));

    runtime.shutdown().await;
    drop(_scope);
    drop(guard);
}
