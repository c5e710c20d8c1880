//! The official MCP conformance suite's client scenarios, run against this
//! crate's client (the `mcp-conformance-client` binary).

use std::path::PathBuf;
use std::process::Stdio;

use crate::support::{node, npm_file};

/// Runs one client scenario; fails with the suite's own report.
async fn scenario(name: &str) {
    let results =
        std::env::temp_dir().join(format!("wma-conformance-{name}-{}", std::process::id()));
    let client = PathBuf::from(env!("CARGO_BIN_EXE_mcp-conformance-client"));
    let output = tokio::process::Command::new(node())
        .arg(npm_file("@modelcontextprotocol/conformance/dist/index.js"))
        .args([
            "client",
            "--scenario",
            name,
            "--timeout",
            "60000",
            "--command",
        ])
        .arg(&client)
        .arg("--output-dir")
        .arg(&results)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("the conformance suite runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let _ = std::fs::remove_dir_all(&results);
    assert!(
        output.status.success(),
        "scenario {name} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let report = format!("{stdout}{stderr}");
    assert!(
        report.contains("OVERALL: PASSED") && report.contains(" 0 failed"),
        "scenario {name} did not pass every check:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_client_initialize() {
    scenario("initialize").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_client_tools_call() {
    scenario("tools_call").await;
}
