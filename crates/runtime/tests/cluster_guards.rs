//! The guards a cluster node puts on its peers, against real nodes on
//! loopback in this process: a connection must authenticate in time and may
//! not announce a large frame before it did, a weak cookie is refused, two
//! nodes of one name fail with an error that says so, and a peer that
//! restarts is dialled again.

// The support module is shared with the main test binary; this one uses
// only part of it.
#[allow(dead_code)]
mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wma_agent::{AgentStreamPart, ChatMessage, FinishReason};
use wma_runtime::{
    AgentConfig, ClusterGuards, ClusterNode, ClusterOptions, ProviderSource, Runtime,
    RuntimeBuilder, RuntimeError,
};
use wma_testkit::ScriptedProvider;

use crate::support::{call, wait_until};

/// 64 hex digits, as `openssl rand -hex 32` makes them.
const COOKIE: &str = "7c1f0e9a3b5d2c8e4f6a0b1c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e";

/// Long enough that a connection closed within it was closed by a guard,
/// not by its deadline.
const LONG: Duration = Duration::from_secs(600);

/// A runtime with one agent to export, whose model answers each run.
async fn worker_runtime() -> Runtime {
    let replies: Vec<String> = (0..8).map(|i| format!("Answer {i}.")).collect();
    RuntimeBuilder::new()
        .provider(
            "small",
            ProviderSource::shared(Arc::new(ScriptedProvider::new(replies))),
        )
        .agent(AgentConfig::new("adder").with_provider("small"))
        .start()
        .await
        .unwrap()
}

fn options(name: &str) -> ClusterOptions {
    ClusterOptions {
        node_name: name.to_string(),
        ..ClusterOptions::new(COOKIE)
    }
}

fn guards(handshake_timeout: Duration) -> ClusterGuards {
    ClusterGuards {
        handshake_timeout,
        ..ClusterGuards::default()
    }
}

/// Whether the node closes `stream` (a read sees its end) within a minute.
async fn is_closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // The node never writes first; anything it sends is read past.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_does_not_authenticate_in_time_is_closed() {
    let runtime = worker_runtime().await;
    let node =
        ClusterNode::start_with(options("patient"), guards(Duration::from_secs(1)), &runtime)
            .await
            .unwrap();
    let mut silent = TcpStream::connect(node.addr()).await.unwrap();
    assert!(
        is_closed(&mut silent).await,
        "a peer that never starts its handshake is let go"
    );
    node.shutdown().await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_frame_before_authentication_closes_the_connection() {
    let runtime = worker_runtime().await;
    let node = ClusterNode::start_with(options("careful"), guards(LONG), &runtime)
        .await
        .unwrap();
    let mut greedy = TcpStream::connect(node.addr()).await.unwrap();
    // A frame header announcing 1 MiB (under ractor_cluster's 16 MiB), and
    // the start of its payload.
    greedy
        .write_all(&(1024u64 * 1024).to_be_bytes())
        .await
        .unwrap();
    greedy.write_all(&[0u8; 1024]).await.unwrap();
    assert!(
        is_closed(&mut greedy).await,
        "an unauthenticated peer may not make the node wait for a large frame"
    );
    node.shutdown().await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_handshake_limit_are_closed() {
    let runtime = worker_runtime().await;
    let node = ClusterNode::start_with(
        options("crowded"),
        ClusterGuards {
            max_pending: 1,
            ..guards(LONG)
        },
        &runtime,
    )
    .await
    .unwrap();
    let _first = TcpStream::connect(node.addr()).await.unwrap();
    let mut second = TcpStream::connect(node.addr()).await.unwrap();
    assert!(
        is_closed(&mut second).await,
        "one connection in its handshake is all this node takes"
    );
    node.shutdown().await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_cookie_is_refused() {
    let runtime = worker_runtime().await;
    for weak in ["change-me", "loopback-test-cookie", &"ab".repeat(20)] {
        let error = ClusterNode::start(ClusterOptions::new(weak), &runtime)
            .await
            .expect_err("a weak cookie does not start a node");
        assert!(
            matches!(&error, RuntimeError::Config(m) if m.contains("cookie is too weak")),
            "{weak}: {error}"
        );
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_with_one_name_fail_with_an_error_that_says_so() {
    let runtime = worker_runtime().await;
    let first = ClusterNode::start(options("twin"), &runtime).await.unwrap();
    let second = ClusterNode::start(options("twin"), &runtime).await.unwrap();
    let error = second
        .connect(&first.addr().to_string())
        .await
        .expect_err("two nodes of one name cannot connect");
    let message = error.to_string();
    assert!(
        message.contains("has this node's name (`twin@127.0.0.1`)")
            && message.contains("its own `node_name`"),
        "{message}"
    );

    // With names of their own, the same two nodes connect.
    let third = ClusterNode::start(options("triplet"), &runtime)
        .await
        .unwrap();
    third.connect(&first.addr().to_string()).await.unwrap();
    assert_eq!(third.peers(), vec!["twin@127.0.0.1".to_string()]);

    for node in [first, second, third] {
        node.shutdown().await;
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_restarts_is_connected_again() {
    let worker = worker_runtime().await;
    let exports = ClusterOptions {
        export: vec!["adder".to_string()],
        ..options("worker")
    };
    let node = ClusterNode::start(exports.clone(), &worker).await.unwrap();
    let port = node.addr();

    let parent = RuntimeBuilder::new()
        .provider(
            "parent",
            ProviderSource::shared(Arc::new(ScriptedProvider::new([
                call("adder", json!({"task": "Add"})),
                "Done.".to_string(),
                call("adder", json!({"task": "Add again"})),
                "Done again.".to_string(),
            ]))),
        )
        .remote_agent("adder", "Adds numbers.")
        .agent(
            AgentConfig::new("parent")
                .with_provider("parent")
                .with_sub_agents(["adder"]),
        )
        .start()
        .await
        .unwrap();
    let here = ClusterNode::start(options("parent"), &parent)
        .await
        .unwrap();
    here.keep_connected(port.to_string());
    wait_until("the parent is connected to the worker", || {
        here.peers() == vec!["worker@127.0.0.1".to_string()]
    })
    .await;
    let run = |text: &'static str| {
        let parent = parent.agent("parent").unwrap();
        async move {
            parent
                .run(vec![ChatMessage::user(text)])
                .await
                .unwrap()
                .collect_tagged()
                .await
        }
    };
    let parts = run("Add").await;
    assert!(
        parts
            .iter()
            .any(|p| p.agent == "adder" && matches!(&p.part, AgentStreamPart::Text { .. })),
        "{parts:#?}"
    );

    // The worker goes away and comes back on the same port.
    node.shutdown().await;
    wait_until("the parent saw the worker go", || here.peers().is_empty()).await;
    let node = ClusterNode::start(
        ClusterOptions {
            listen: port,
            ..exports
        },
        &worker,
    )
    .await
    .unwrap();
    wait_until("the parent is connected to the worker again", || {
        here.peers() == vec!["worker@127.0.0.1".to_string()]
    })
    .await;
    assert!(here.sessions().authenticated >= 2);
    let parts = run("Add again").await;
    assert!(
        parts.iter().any(|p| p.agent == "parent"
            && matches!(
                &p.part,
                AgentStreamPart::ToolResult { name, .. } if name == "adder"
            )),
        "the remote run answers again: {parts:#?}"
    );
    assert_eq!(
        parts.last().map(|p| &p.part),
        Some(&AgentStreamPart::Finish {
            reason: FinishReason::Stop
        })
    );

    here.shutdown().await;
    node.shutdown().await;
    parent.shutdown().await;
    worker.shutdown().await;
}
