//! Crashes: a model or a tool source that panics mid-work ends the affected
//! work with a clear error, is restarted, and the next run works.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use wma_agent::messages::FAILED_PREFIX;
use wma_agent::{AgentStreamPart, ChatMessage, FinishReason, ToolErrorCode};
use wma_runtime::{AgentConfig, ProviderSource, Runtime, RuntimeError, ToolSource};
use wma_testkit::{InMemoryToolHost, ScriptedProvider};

use crate::support::{TokenModel, add_to_cart, call, end, shop, wait_until};

#[tokio::test]
async fn a_model_that_panics_mid_generation_ends_the_run_with_the_provider_error_and_comes_back() {
    let builds = Arc::new(AtomicUsize::new(0));
    let source = ProviderSource::new({
        let builds = builds.clone();
        move || {
            // The first instance falls over at its third token; the one the
            // supervisor makes after the crash is sound.
            match builds.fetch_add(1, Ordering::SeqCst) {
                0 => TokenModel::new("tiny", ["Paris is the capital of France."])
                    .panicking_at_token(2),
                _ => TokenModel::new("tiny", ["Paris."]),
            }
        }
    });
    let runtime = Runtime::builder(source)
        .agent(AgentConfig::new("helper"))
        .start()
        .await
        .unwrap();
    let agent = runtime.agent("helper").unwrap();
    let provider = runtime.provider();

    let parts = agent
        .run(vec![ChatMessage::user("What is the capital of France?")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    match end(&parts) {
        AgentStreamPart::Error { message } => {
            assert!(message.starts_with(FAILED_PREFIX), "{message}");
            assert!(message.contains("crashed"), "{message}");
            assert!(message.contains("fell over at token 2"), "{message}");
        }
        other => panic!("expected the provider-failure error, got {other:?}"),
    }

    wait_until("the provider actor is restarted", || {
        provider.restarts() == 1
    })
    .await;
    let parts = agent
        .run(vec![ChatMessage::user("What is the capital of France?")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert_eq!(
        parts,
        vec![
            AgentStreamPart::MessageStart { step: 1 },
            AgentStreamPart::Text {
                text: "Paris.".into()
            },
            AgentStreamPart::Finish {
                reason: FinishReason::Stop
            },
        ]
    );
    assert_eq!(
        builds.load(Ordering::SeqCst),
        2,
        "the restart made a fresh provider from the same source"
    );
    assert_eq!(provider.in_flight(), 0);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_tool_source_that_panics_fails_the_call_is_restarted_and_the_next_run_works() {
    let builds = Arc::new(AtomicUsize::new(0));
    let source = ToolSource::new("shop", {
        let builds = builds.clone();
        move || {
            if builds.fetch_add(1, Ordering::SeqCst) == 0 {
                let host = InMemoryToolHost::new();
                host.add(add_to_cart(), |_| panic!("the shop's connection broke"));
                host
            } else {
                shop()
            }
        }
    });
    let model = ScriptedProvider::new([
        call("add_to_cart", json!({"id": "tent"})),
        "Sorry, the shop is not reachable right now.".to_string(),
        call("add_to_cart", json!({"id": "tent"})),
        "The tent is in your cart.".to_string(),
    ]);
    let runtime = Runtime::builder(ProviderSource::new(move || model.clone()))
        .tool_source(source)
        .agent(AgentConfig::new("shopper"))
        .start()
        .await
        .unwrap();
    let agent = runtime.agent("shopper").unwrap();
    let tools = runtime.tools();

    let parts = agent
        .run(vec![ChatMessage::user("Add the tent to my cart")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    let error = parts
        .iter()
        .find_map(|p| match p {
            AgentStreamPart::ToolError { error, .. } => Some(error.clone()),
            _ => None,
        })
        .expect("the crashed call is reported");
    assert_eq!(error.code, ToolErrorCode::Unavailable);
    assert!(
        error.message.contains("`shop` crashed"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("the shop's connection broke"),
        "{}",
        error.message
    );
    assert_eq!(
        end(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Stop
        }
    );

    wait_until("the tool bridge is restarted", || tools.restarts() == 1).await;
    let parts = agent
        .run(vec![ChatMessage::user("Add the tent to my cart")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert!(
        parts.contains(&AgentStreamPart::ToolResult {
            call_id: "call_1_1".into(),
            name: "add_to_cart".into(),
            output: "added tent to the cart".into(),
        }),
        "{parts:#?}"
    );
    assert_eq!(
        end(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Stop
        }
    );
    assert_eq!(
        builds.load(Ordering::SeqCst),
        2,
        "the source was made afresh"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_child_that_keeps_crashing_is_given_up_with_a_clear_error() {
    let source =
        ProviderSource::new(|| TokenModel::new("fragile", ["a b c"; 8]).panicking_at_token(0));
    let runtime = Runtime::builder(source)
        .agent(AgentConfig::new("helper"))
        .restart_budget(wma_runtime::RestartBudget::new(
            2,
            std::time::Duration::from_secs(600),
        ))
        .start()
        .await
        .unwrap();
    let agent = runtime.agent("helper").unwrap();
    let provider = runtime.provider();
    for restarts in 1..=2 {
        let parts = agent
            .run(vec![ChatMessage::user("hi")])
            .await
            .unwrap()
            .collect_parts()
            .await;
        assert!(matches!(end(&parts), AgentStreamPart::Error { .. }));
        wait_until("the provider is restarted", || {
            provider.restarts() == restarts
        })
        .await;
    }
    // The third crash is over the budget: the provider stays down, and runs
    // fail at once with a message that says so instead of hanging.
    let parts = agent
        .run(vec![ChatMessage::user("hi")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert!(matches!(end(&parts), AgentStreamPart::Error { .. }));
    // Once the supervisor has given up, every request says why.
    let mut gone = None;
    for _ in 0..6000 {
        match provider.current_info().await {
            Err(error @ RuntimeError::Unavailable { .. }) => {
                gone = Some(error);
                break;
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
    let gone = gone
        .expect("the provider is reported as given up")
        .to_string();
    assert!(gone.contains("restart budget"), "{gone}");
    let parts = agent
        .run(vec![ChatMessage::user("hi")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    match end(&parts) {
        AgentStreamPart::Error { message } => {
            assert!(message.starts_with(FAILED_PREFIX), "{message}");
            assert!(message.contains("restart budget"), "{message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(provider.restarts(), 2);
    runtime.shutdown().await;
}
