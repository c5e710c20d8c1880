//! A remote sub-agent's spans join the parent's trace: the parent's node
//! sends the W3C trace context with `start`, and the worker's node makes
//! its `remote_delegation` span a child of the parent's `execute_tool`.
//!
//! The test scopes a subscriber to its thread, so it has a binary of its
//! own (see `span_tree.rs` for why), and both nodes run in this process,
//! connected over loopback: the parent's call still crosses the wire.

// The support module is shared with the main test binary; this one uses
// only part of it.
#[allow(dead_code)]
mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tracing::Instrument;
use wma_agent::{AgentStreamPart, ChatMessage, FinishReason};
use wma_runtime::{AgentConfig, ClusterNode, ClusterOptions, ProviderSource, RuntimeBuilder};
use wma_telemetry::TelemetryConfig;
use wma_testkit::{CapturedSpan, OtlpReceiver, ScriptedProvider};

use crate::support::{call, wait_until};

const COOKIE: &str = "4d9e2b7f1a6c3e8d0b5f9a2c7e1d4b8f6a3c0e9d2b7f5a1c8e4d6b0f3a9c2e7d";

fn named<'a>(spans: &'a [CapturedSpan], name: &str) -> &'a CapturedSpan {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("a span named {name:?} in {spans:#?}"))
}

// The subscriber is scoped to this test's thread, so everything (both
// runtimes, both nodes) runs on the current-thread runtime with it.
#[tokio::test]
async fn a_remote_sub_agents_spans_share_the_parents_trace() {
    let receiver = OtlpReceiver::start().unwrap();
    let config = TelemetryConfig {
        log: Some("off".to_string()),
        ..TelemetryConfig::exporting_to(receiver.endpoint())
    };
    let (dispatch, guard) = wma_telemetry::build(&config.resolve(|_| None).unwrap()).unwrap();
    let _scope = tracing::dispatcher::set_default(&dispatch);

    let worker = RuntimeBuilder::new()
        .provider(
            "small",
            ProviderSource::shared(Arc::new(ScriptedProvider::new(["It is 5."]))),
        )
        .agent(AgentConfig::new("adder").with_provider("small"))
        .start()
        .await
        .unwrap();
    let worker_node = ClusterNode::start(
        ClusterOptions {
            node_name: "worker".to_string(),
            export: vec!["adder".to_string()],
            ..ClusterOptions::new(COOKIE)
        },
        &worker,
    )
    .await
    .unwrap();
    let parent = RuntimeBuilder::new()
        .provider(
            "small",
            ProviderSource::shared(Arc::new(ScriptedProvider::new([
                call("adder", json!({"task": "Add 2 and 3"})),
                "The adder says 5.".to_string(),
            ]))),
        )
        .remote_agent("adder", "Adds numbers.")
        .agent(
            AgentConfig::new("parent")
                .with_provider("small")
                .with_sub_agents(["adder"]),
        )
        .start()
        .await
        .unwrap();
    let parent_node = ClusterNode::start(
        ClusterOptions {
            node_name: "parent".to_string(),
            ..ClusterOptions::new(COOKIE)
        },
        &parent,
    )
    .await
    .unwrap();
    parent_node
        .connect(&worker_node.addr().to_string())
        .await
        .unwrap();
    parent_node
        .wait_for_agent("adder", Duration::from_secs(30))
        .await
        .unwrap();

    let request = tracing::info_span!("request");
    let parts = async {
        parent
            .agent("parent")
            .unwrap()
            .run(vec![ChatMessage::user("What is 2 + 3?")])
            .await
            .unwrap()
            .collect_tagged()
            .await
    }
    .instrument(request.clone())
    .await;
    assert_eq!(
        parts.last().map(|p| &p.part),
        Some(&AgentStreamPart::Finish {
            reason: FinishReason::Stop
        }),
        "{parts:#?}"
    );
    assert!(
        parts.iter().any(|p| p.agent == "adder"),
        "the remote run's parts reached the parent: {parts:#?}"
    );
    let trace = wma_telemetry::trace_id(&request).expect("the request span is exported");
    drop(request);

    guard.flush().unwrap();
    wait_until("the remote run's spans are exported", || {
        let spans = receiver.spans();
        spans.iter().any(|s| s.name == "invoke_agent adder")
            && spans.iter().any(|s| s.name == "invoke_agent parent")
    })
    .await;
    let spans = receiver.spans();
    let call = named(&spans, "execute_tool adder");
    let remote = named(&spans, "remote_delegation");
    let sub_agent = named(&spans, "invoke_agent adder");
    assert_eq!(call.trace_id, trace);
    assert!(
        remote.is_child_of(call),
        "the worker's span hangs under the parent's call: {remote:#?} {call:#?}"
    );
    assert_eq!(sub_agent.trace_id, trace, "{sub_agent:#?}");
    assert!(sub_agent.is_child_of(remote));

    parent_node.shutdown().await;
    worker_node.shutdown().await;
    parent.shutdown().await;
    worker.shutdown().await;
}
