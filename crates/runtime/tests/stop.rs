//! Stop: a slow generation ends at once with finish `aborted`, and nothing
//! is left running.

use std::time::Duration;

use wma_agent::{AgentStreamPart, ChatMessage, FinishReason};
use wma_runtime::{AgentConfig, ProviderSource, Runtime};

use crate::support::{TokenModel, end, wait_until};

/// A reply long enough that, at 20 ms a token, it would take 20 s.
fn long_reply() -> String {
    "word ".repeat(1000)
}

#[tokio::test]
async fn stop_during_a_slow_generation_finishes_aborted_and_leaves_nothing_running() {
    let model = TokenModel::new("slow-model", [long_reply()]).with_tick(Duration::from_millis(20));
    let runtime = Runtime::builder(ProviderSource::new({
        let model = model.clone();
        move || model.clone()
    }))
    .agent(AgentConfig::new("helper"))
    .start()
    .await
    .unwrap();
    let agent = runtime.agent("helper").unwrap();
    let provider = runtime.provider();
    let run = agent
        .run(vec![ChatMessage::user("Tell me a long story")])
        .await
        .unwrap();
    wait_until("the model is generating", || model.tokens() >= 2).await;

    assert!(agent.stop(run.id()).await.unwrap(), "the run was running");
    let parts = run.collect_parts().await;
    assert_eq!(
        end(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Aborted
        }
    );
    // The model stopped at a token boundary, long before its reply's end,
    // because the run's token reached it through the provider actor.
    assert!(model.tokens() < 1000);
    wait_until("the model saw the cancellation", || model.saw_cancel()).await;
    wait_until("no generation, run or provider task is left", || {
        model.active() == 0 && provider.in_flight() == 0 && agent.active_runs() == 0
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn dropping_the_stream_stops_the_run() {
    let model = TokenModel::new("slow-model", [long_reply()]).with_tick(Duration::from_millis(20));
    let runtime = Runtime::builder(ProviderSource::new({
        let model = model.clone();
        move || model.clone()
    }))
    .agent(AgentConfig::new("helper"))
    .start()
    .await
    .unwrap();
    let agent = runtime.agent("helper").unwrap();
    let run = agent
        .run(vec![ChatMessage::user("Tell me a long story")])
        .await
        .unwrap();
    wait_until("the model is generating", || model.tokens() >= 1).await;
    drop(run);
    wait_until("the run and its generation ended", || {
        model.active() == 0 && agent.active_runs() == 0 && runtime.provider().in_flight() == 0
    })
    .await;
    assert!(model.saw_cancel());
    runtime.shutdown().await;
}
