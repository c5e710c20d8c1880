//! Hot swap: the new model takes the next step, nothing in flight is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde_json::json;
use wma_agent::{AgentStreamPart, ChatMessage, FinishReason, Provider};
use wma_runtime::{AgentConfig, ProviderSource, Runtime, RuntimeError, ToolSource};

use crate::support::{TokenModel, call, shop, wait_until};

#[tokio::test]
async fn a_swap_during_a_multi_step_run_answers_later_steps_with_the_new_model() {
    let old = TokenModel::new("old-model", [call("add_to_cart", json!({"id": "tent"}))]).gated();
    let new = TokenModel::new(
        "new-model",
        [
            call("add_to_cart", json!({"id": "stove"})),
            "Both are in your cart now.".to_string(),
        ],
    );
    let host = Arc::new(shop());
    let runtime = Runtime::builder(ProviderSource::new({
        let old = old.clone();
        move || old.clone()
    }))
    .tool_source(ToolSource::shared("shop", host.clone()))
    .agent(AgentConfig::new("shopper"))
    .start()
    .await
    .unwrap();
    let agent = runtime.agent("shopper").unwrap();
    let run = agent
        .run(vec![ChatMessage::user(
            "Add the tent and the stove to my cart",
        )])
        .await
        .unwrap();

    // Step 1's generation is running on the old model (held at its gate).
    wait_until("the old model is generating step 1", || old.started() == 1).await;

    let progress = Arc::new(Mutex::new(Vec::new()));
    let seen = progress.clone();
    let info = runtime
        .provider()
        .swap(
            ProviderSource::new({
                let new = new.clone();
                move || new.clone()
            }),
            move |p| seen.lock().push((p.done, p.total)),
        )
        .await
        .unwrap();
    assert_eq!(info.model, "new-model");
    assert_eq!(
        *progress.lock(),
        vec![(1, Some(3)), (2, Some(3)), (3, Some(3))],
        "the caller sees the new model's loading progress"
    );
    // The swap finished while the old model still holds step 1.
    assert_eq!(old.active(), 1);
    assert_eq!(runtime.model().model, "new-model");

    old.release(1);
    let parts = run.collect_parts().await;
    assert_eq!(
        parts,
        vec![
            AgentStreamPart::MessageStart { step: 1 },
            AgentStreamPart::ToolCall {
                call_id: "call_1_1".into(),
                name: "add_to_cart".into(),
                arguments: json!({"id": "tent"}),
            },
            AgentStreamPart::ToolResult {
                call_id: "call_1_1".into(),
                name: "add_to_cart".into(),
                output: "added tent to the cart".into(),
            },
            AgentStreamPart::MessageStart { step: 2 },
            AgentStreamPart::ToolCall {
                call_id: "call_2_1".into(),
                name: "add_to_cart".into(),
                arguments: json!({"id": "stove"}),
            },
            AgentStreamPart::ToolResult {
                call_id: "call_2_1".into(),
                name: "add_to_cart".into(),
                output: "added stove to the cart".into(),
            },
            AgentStreamPart::MessageStart { step: 3 },
            AgentStreamPart::Text {
                text: "Both are in your cart now.".into()
            },
            AgentStreamPart::Finish {
                reason: FinishReason::Stop
            },
        ]
    );
    assert_eq!(old.served(), 1, "step 1 finished on the old model");
    assert_eq!(new.served(), 2, "steps 2 and 3 ran on the new model");
    assert_eq!(host.calls().len(), 2);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_swap_that_fails_to_load_keeps_the_old_model_serving() {
    let old = TokenModel::new("old-model", ["Still here."]);
    let runtime = Runtime::builder(ProviderSource::new({
        let old = old.clone();
        move || old.clone()
    }))
    .agent(AgentConfig::new("helper"))
    .start()
    .await
    .unwrap();

    let broken = TokenModel::new("broken-model", Vec::<String>::new())
        .failing_to_load("model.onnx is missing");
    let error = runtime
        .provider()
        .swap(ProviderSource::new(move || broken.clone()), |_| {})
        .await
        .unwrap_err();
    assert!(matches!(error, RuntimeError::SwapFailed(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("model.onnx is missing"), "{message}");
    assert!(message.contains("current one keeps serving"), "{message}");
    assert_eq!(runtime.provider().info().model, "old-model");

    let parts = runtime
        .agent("helper")
        .unwrap()
        .run(vec![ChatMessage::user("Are you there?")])
        .await
        .unwrap()
        .collect_parts()
        .await;
    assert_eq!(
        parts[1],
        AgentStreamPart::Text {
            text: "Still here.".into()
        }
    );
    assert_eq!(old.served(), 1);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_second_swap_while_one_loads_is_refused() {
    let runtime = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("old-model", Vec::<String>::new())
    }))
    .start()
    .await
    .unwrap();
    let slow = SlowLoad::default();
    let provider = runtime.provider();
    let first = tokio::spawn({
        let provider = provider.clone();
        let slow = slow.clone();
        async move {
            provider
                .swap(ProviderSource::new(move || slow.clone()), |_| {})
                .await
        }
    });
    wait_until("the first swap is loading", || {
        slow.entered.load(Ordering::SeqCst)
    })
    .await;
    let refused = provider
        .swap(
            ProviderSource::new(|| TokenModel::new("third", Vec::<String>::new())),
            |_| {},
        )
        .await;
    assert_eq!(refused, Err(RuntimeError::SwapInProgress));
    slow.loaded.notify_one();
    assert_eq!(first.await.unwrap().unwrap().model, "slow-model");
    assert_eq!(runtime.model().model, "slow-model");
    runtime.shutdown().await;
}

/// A provider whose prepare() waits until notified.
#[derive(Clone, Default)]
struct SlowLoad {
    entered: Arc<AtomicBool>,
    loaded: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl Provider for SlowLoad {
    fn info(&self) -> wma_agent::ProviderInfo {
        wma_agent::ProviderInfo {
            provider: "slow".into(),
            model: "slow-model".into(),
            context_length: None,
        }
    }
    async fn prepare(
        &self,
        _progress: wma_agent::ProgressFn,
        _cancel: tokio_util::sync::CancellationToken,
    ) -> Result<(), wma_agent::ProviderError> {
        self.entered.store(true, Ordering::SeqCst);
        self.loaded.notified().await;
        Ok(())
    }
    async fn generate(
        &self,
        _request: wma_agent::GenerateRequest,
        _cancel: tokio_util::sync::CancellationToken,
    ) -> Result<wma_agent::Generation, wma_agent::ProviderError> {
        Ok(wma_agent::Generation::text("slow"))
    }
    async fn fits(
        &self,
        _request: &wma_agent::GenerateRequest,
    ) -> Result<bool, wma_agent::ProviderError> {
        Ok(true)
    }
    fn call_format(&self) -> wma_agent::CallFormat {
        wma_agent::CallFormat::Json
    }
    fn tools_inline(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn a_model_that_cannot_be_made_fails_the_start_or_the_swap_with_its_reason() {
    let start = Runtime::builder(ProviderSource::try_new(|| {
        Err::<TokenModel, _>("no model folder at models/tiny")
    }))
    .start()
    .await;
    match start {
        Err(error @ RuntimeError::Load(_)) => {
            assert!(error.to_string().contains("no model folder at models/tiny"))
        }
        other => panic!("expected a load error, got {other:?}"),
    }

    let runtime = Runtime::builder(ProviderSource::new(|| {
        TokenModel::new("old-model", Vec::<String>::new())
    }))
    .start()
    .await
    .unwrap();
    let error = runtime
        .provider()
        .swap(
            ProviderSource::try_new(|| Err::<TokenModel, _>("no model folder at models/big")),
            |_| {},
        )
        .await
        .unwrap_err();
    assert!(matches!(error, RuntimeError::SwapFailed(_)));
    assert!(error.to_string().contains("models/big"));
    assert_eq!(runtime.model().model, "old-model");
    runtime.shutdown().await;
}
