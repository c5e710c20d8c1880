//! Bounded admission: an agent runs at most its limit of runs at once and
//! refuses one more at once.

use std::time::Duration;

use wma_agent::{AgentStreamPart, ChatMessage, FinishReason};
use wma_runtime::{AgentConfig, ProviderSource, Runtime, RuntimeError};

use crate::support::{TokenModel, end, wait_until};

#[tokio::test]
async fn a_run_over_the_limit_is_refused_and_admitted_once_a_slot_frees() {
    let model = TokenModel::new("model", ["word ".repeat(1000), "Short answer.".to_string()])
        .with_tick(Duration::from_millis(20));
    let runtime = Runtime::builder(ProviderSource::new({
        let model = model.clone();
        move || model.clone()
    }))
    .agent(AgentConfig::new("helper").with_max_concurrent_runs(1))
    .start()
    .await
    .unwrap();
    let agent = runtime.agent("helper").unwrap();

    let first = agent.run(vec![ChatMessage::user("long")]).await.unwrap();
    let refused = agent
        .run(vec![ChatMessage::user("again")])
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        RuntimeError::Busy {
            agent: "helper".into(),
            limit: 1
        }
    );
    assert!(refused.to_string().contains("try again"));

    first.stop();
    let parts = first.collect_parts().await;
    assert_eq!(
        end(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Aborted
        }
    );
    wait_until("the slot is free", || agent.active_runs() == 0).await;
    let parts = agent
        .run(vec![ChatMessage::user("short")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert_eq!(
        parts[1],
        AgentStreamPart::Text {
            text: "Short answer.".into()
        }
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn unknown_agents_and_duplicate_names_are_errors() {
    let runtime = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("model", Vec::<String>::new())
    }))
    .agent(AgentConfig::new("helper"))
    .start()
    .await
    .unwrap();
    assert_eq!(
        runtime.agent("nobody").unwrap_err(),
        RuntimeError::UnknownAgent("nobody".into())
    );
    runtime.shutdown().await;

    let twice = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("model", Vec::<String>::new())
    }))
    .agent(AgentConfig::new("helper"))
    .agent(AgentConfig::new("helper"))
    .start()
    .await;
    assert!(matches!(twice, Err(RuntimeError::Config(_))));
}

#[tokio::test]
async fn handles_that_outlive_the_runtime_fail_with_a_clear_error() {
    let runtime = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("model", Vec::<String>::new())
    }))
    .agent(AgentConfig::new("helper"))
    .start()
    .await
    .unwrap();
    let agent = runtime.agent("helper").unwrap();
    let provider = runtime.provider();
    runtime.shutdown().await;
    match agent.run(vec![ChatMessage::user("hi")]).await {
        Err(RuntimeError::Unavailable { reason, .. }) => {
            assert!(reason.contains("shut down"), "{reason}")
        }
        other => panic!("expected the agent to be unavailable, got {other:?}"),
    }
    assert!(matches!(
        provider.current_info().await,
        Err(RuntimeError::Unavailable { .. })
    ));
}
