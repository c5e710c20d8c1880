//! A parent in this process delegating to sub-agents that a `wma` process
//! hosts, over ractor_cluster on loopback, with its cookie authentication.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use webmcp_agents::agent::{AgentStreamPart, ChatMessage, FinishReason, prompt::delimit_untrusted};
use webmcp_agents::runtime::{
    AgentConfig, ClusterNode, ClusterOptions, ProviderSource, RuntimeBuilder, TaggedPart,
};
use wma_testkit::ScriptedProvider;

use crate::delegation::wait_until;
use crate::support::call;

/// 64 hex digits, as `openssl rand -hex 32` makes them.
const COOKIE: &str = "5e0a9c3f7b1d4e8a2c6f0b9d3e7a1c5f8b2d6e0a4c9f3b7d1e5a8c2f6b0d4e9a";

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

/// Starts `wma serve --no-http` on the worker config (listening at
/// `listen`, or on a free loopback port) and returns the process and the
/// address its node listens on.
async fn worker(listen: Option<&str>) -> (Child, String) {
    static CONFIGS: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!("wma-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join(format!(
        "worker-{}.toml",
        CONFIGS.fetch_add(1, Ordering::Relaxed)
    ));
    let text = match listen {
        Some(listen) => format!("{WORKER}listen = \"{listen}\"\n"),
        None => WORKER.to_string(),
    };
    std::fs::write(&config, text).unwrap();
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

/// ractor's process groups are process-wide: two of these tests at once
/// would each see the other's worker offer `adder`. So they take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn task(agent: &str) -> String {
    call(agent, json!({"task": "Please do it"}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_delegates_to_a_sub_agent_in_another_process() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (mut child, addr) = worker(None).await;

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
    // Another node's answer is data: the parent's next prompt delimits it.
    let delimited = delimit_untrusted("adder", "Two and three make 5.");
    let next = &parent_model.requests()[1];
    assert!(
        next.messages.iter().any(|m| m.content.contains(&delimited)),
        "{next:#?}"
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

    // A node with another cookie fails the handshake, says so, and never
    // sees the worker's agents.
    let stranger = ClusterNode::start(
        ClusterOptions {
            node_name: "stranger".to_string(),
            ..ClusterOptions::new(COOKIE.chars().rev().collect::<String>())
        },
        &runtime,
    )
    .await
    .unwrap();
    let error = stranger
        .connect(&addr)
        .await
        .expect_err("another cookie fails the handshake");
    assert!(
        error.to_string().contains("the handshake failed"),
        "{error}"
    );
    assert_eq!(stranger.sessions().disconnected, 1);
    assert_eq!(stranger.sessions().authenticated, 0);
    assert!(stranger.peers().is_empty());

    stranger.shutdown().await;
    node.shutdown().await;
    runtime.shutdown().await;
    child.kill().await.unwrap();
}

/// The parent's side of the reconnect test: a parent agent that delegates
/// to the worker's `adder` twice, one run each.
async fn adder_parent() -> (webmcp_agents::runtime::Runtime, ScriptedProvider) {
    let model = ScriptedProvider::new([
        task("adder"),
        "First: 5.".to_string(),
        task("adder"),
        "Second: 5.".to_string(),
    ]);
    let runtime = RuntimeBuilder::new()
        .provider("parent", ProviderSource::shared(Arc::new(model.clone())))
        .remote_agent("adder", "Adds numbers.")
        .agent(
            AgentConfig::new("parent")
                .with_provider("parent")
                .with_sub_agents(["adder"]),
        )
        .start()
        .await
        .unwrap();
    (runtime, model)
}

/// The adder's answer, as the parent's tool result, in a run's parts.
fn adder_answered(parts: &[TaggedPart]) -> bool {
    parts.iter().any(|p| {
        p.agent == "parent"
            && matches!(
                &p.part,
                AgentStreamPart::ToolResult { name, output, .. }
                    if name == "adder" && output == "Two and three make 5."
            )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_restarts_is_dialled_again_and_serves_again() {
    let _turn = ONE_AT_A_TIME.lock().await;
    // A port for the worker to come back on.
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|probe| probe.local_addr())
        .unwrap()
        .to_string();
    let (mut child, addr) = worker(Some(&listen)).await;
    assert_eq!(addr, listen);

    let (runtime, _) = adder_parent().await;
    let node = ClusterNode::start(
        ClusterOptions {
            node_name: "parent".to_string(),
            ..ClusterOptions::new(COOKIE)
        },
        &runtime,
    )
    .await
    .unwrap();
    node.keep_connected(addr.clone());
    wait_until("the parent reaches the worker's adder", || {
        node.offers("adder")
    })
    .await;
    let parent = runtime.agent("parent").unwrap();
    let run = || async {
        parent
            .run(vec![ChatMessage::user("What is 2 + 3?")])
            .await
            .unwrap()
            .collect_tagged()
            .await
    };
    let parts = run().await;
    assert!(adder_answered(&parts), "{parts:#?}");

    // The worker stops; another one starts on the same port.
    child.kill().await.unwrap();
    wait_until("the parent saw the worker go", || {
        node.peers().is_empty() && !node.offers("adder")
    })
    .await;
    let (mut child, _) = worker(Some(&listen)).await;
    wait_until("the parent is connected to the worker again", || {
        node.peers() == vec!["worker@127.0.0.1".to_string()] && node.offers("adder")
    })
    .await;
    let parts = run().await;
    assert!(
        adder_answered(&parts),
        "the remote run succeeds again: {parts:#?}"
    );

    node.shutdown().await;
    runtime.shutdown().await;
    child.kill().await.unwrap();
}
