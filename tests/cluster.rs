//! A parent in this process delegating to sub-agents that a `wma` process
//! hosts, over ractor_cluster on loopback, with its cookie authentication.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use webmcp_agents::agent::{AgentStreamPart, ChatMessage, FinishReason};
use webmcp_agents::runtime::{
    AgentConfig, ClusterNode, ClusterOptions, ProviderSource, RuntimeBuilder, TaggedPart,
};
use wma_testkit::ScriptedProvider;

use crate::delegation::wait_until;
use crate::support::call;

const COOKIE: &str = "loopback-test-cookie";

/// The worker node: two exported agents on scripted models.
const WORKER: &str = r#"
[providers.finder]
kind = "scripted"
model = "worker-model"
replies = ['{"name": "calculator", "arguments": {"a": 2, "b": 3, "op": "add"}}', "Two and three make 5."]

[providers.slow]
kind = "scripted"
replies = ["Too late."]
delay_ms = 600000

[tools.math]
kind = "native"
builtins = ["calculator"]

[agents.adder]
description = "Adds numbers."
provider = "finder"
tools = ["math"]

[agents.sleeper]
description = "Takes its time."
provider = "slow"

[cluster]
node_name = "worker"
cookie_env = "WMA_CLUSTER_COOKIE"
export = ["adder", "sleeper"]
"#;

/// Starts `wma serve --no-http` on the worker config and returns the
/// process and the address its node listens on.
async fn worker() -> (Child, String) {
    let dir = std::env::temp_dir().join(format!("wma-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("worker.toml");
    std::fs::write(&config, WORKER).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_wma"))
        .args(["serve", "--no-http", "--config"])
        .arg(&config)
        .env("WMA_CLUSTER_COOKIE", COOKIE)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the wma binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(addr) = line.strip_prefix("cluster listening on ") {
                return addr.to_string();
            }
        }
        panic!("the worker ended without its node listening");
    })
    .await
    .expect("the worker's node listens");
    // Keep reading so the worker never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

fn task(agent: &str) -> String {
    call(agent, json!({"task": "Please do it"}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_delegates_to_a_sub_agent_in_another_process() {
    let (mut child, addr) = worker().await;

    let parent_model = ScriptedProvider::new([task("adder"), "The adder says 5.".to_string()])
        .with_model("parent-model");
    let sleepy_parent = ScriptedProvider::new([task("sleeper")]).with_model("sleepy-model");
    let runtime = RuntimeBuilder::new()
        .provider(
            "parent",
            ProviderSource::shared(Arc::new(parent_model.clone())),
        )
        .provider(
            "sleepy",
            ProviderSource::shared(Arc::new(sleepy_parent.clone())),
        )
        .remote_agent("adder", "Adds numbers.")
        .remote_agent("sleeper", "Takes its time.")
        .agent(
            AgentConfig::new("parent")
                .with_provider("parent")
                .with_sub_agents(["adder"]),
        )
        .agent(
            AgentConfig::new("impatient")
                .with_provider("sleepy")
                .with_sub_agents(["sleeper"]),
        )
        .start()
        .await
        .unwrap();
    let node = ClusterNode::start(
        ClusterOptions {
            node_name: "parent".to_string(),
            ..ClusterOptions::new(COOKIE)
        },
        &runtime,
    )
    .await
    .unwrap();
    node.connect(&addr).await.unwrap();
    node.wait_for_agent("adder", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(node.sessions().authenticated >= 1);

    // The remote sub-agent's description reached the parent's prompt, its
    // parts reach this host tagged, and its answer is the tool result.
    let parts = runtime
        .agent("parent")
        .unwrap()
        .run(vec![ChatMessage::user("What is 2 + 3?")])
        .await
        .unwrap()
        .collect_tagged()
        .await;
    let prompt = &parent_model.requests()[0].messages[0].content;
    assert!(prompt.contains("- adder: Adds numbers."), "{prompt}");
    let remote: Vec<&TaggedPart> = parts.iter().filter(|p| p.agent == "adder").collect();
    assert!(remote.iter().all(|p| p.depth == 1), "{parts:#?}");
    assert!(remote.iter().any(|p| matches!(
        &p.part,
        AgentStreamPart::ToolResult { name, output, .. } if name == "calculator" && output == r#"{"result":5.0}"#
    )), "the worker ran its own tool: {parts:#?}");
    assert!(parts.iter().any(|p| p.agent == "parent"
        && matches!(
            &p.part,
            AgentStreamPart::ToolResult { name, output, .. } if name == "adder" && output == "Two and three make 5."
        )));
    assert_eq!(
        parts.last().map(|p| (&p.agent, &p.part)),
        Some((
            &"parent".to_string(),
            &AgentStreamPart::Finish {
                reason: FinishReason::Stop
            }
        ))
    );

    // Stop reaches the other process: the remote run ends aborted, and its
    // end arrives before the parent's.
    let impatient = runtime.agent("impatient").unwrap();
    let mut run = impatient
        .run(vec![ChatMessage::user("Ask the sleeper")])
        .await
        .unwrap();
    let mut parts = Vec::new();
    while let Some(part) = run.next_tagged().await {
        let started =
            part.agent == "sleeper" && part.part == AgentStreamPart::MessageStart { step: 1 };
        parts.push(part);
        if started {
            break;
        }
    }
    assert!(impatient.stop(run.id()).await.unwrap());
    while let Some(part) = run.next_tagged().await {
        parts.push(part);
    }
    let aborted = AgentStreamPart::Finish {
        reason: FinishReason::Aborted,
    };
    let remote_end = parts
        .iter()
        .position(|p| p.agent == "sleeper" && p.part == aborted)
        .unwrap_or_else(|| panic!("the remote run ended aborted: {parts:#?}"));
    assert_eq!(parts.last().unwrap().part, aborted);
    assert_eq!(parts.last().unwrap().agent, "impatient");
    assert!(remote_end < parts.len() - 1);

    // A node with another cookie fails the handshake and never sees the
    // worker's agents.
    let stranger = ClusterNode::start(ClusterOptions::new("another-cookie"), &runtime)
        .await
        .unwrap();
    stranger.connect(&addr).await.unwrap();
    wait_until("the stranger's connection is closed", || {
        stranger.sessions().disconnected >= 1
    })
    .await;
    assert_eq!(stranger.sessions().authenticated, 0);

    stranger.shutdown().await;
    node.shutdown().await;
    runtime.shutdown().await;
    child.kill().await.unwrap();
}
