//! The one path of a tool call through a [`ToolSet`]: allow and deny →
//! validation → time limit and panic guard → restart budget. One test per
//! guard, each failing if its guard is taken out, and one that a config's
//! source, a raw source and Rust functions all go through the same guards.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use wma_agent::{CallContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost};
use wma_testkit::InMemoryToolHost;
use wma_tools::{CANCEL_GRACE, NativeTools, RestartBudget, SourceOptions, SourceState, ToolSet};

/// A schema that needs a string `text`.
fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
}

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition::new(name, "A tool.", schema())
}

/// Long enough that only a guard ends the wait.
const FOREVER: Duration = Duration::from_secs(24 * 3600);

/// A call that hangs for ever unless the set's time limit ends it; bounded
/// by [`FOREVER`] so that a missing guard fails the test instead of hanging
/// it (time is paused in these tests, so no one waits for either).
async fn call_bounded(
    set: &ToolSet,
    name: &str,
    arguments: serde_json::Value,
) -> Result<String, ToolError> {
    tokio::time::timeout(
        FOREVER,
        set.call_tool(name, arguments, CancellationToken::new()),
    )
    .await
    .expect("the set's time limit ended the call")
}

#[tokio::test]
async fn invalid_arguments_are_refused_and_the_source_is_not_called() {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(tool("echo"), |args| Ok(args["text"].to_string()));
    let mut set = ToolSet::new();
    set.add_shared("page", host.clone(), SourceOptions::default());

    let error = set
        .call_tool("echo", json!({"text": 7}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidArguments);
    assert!(error.message.contains("text"), "{}", error.message);
    let error = set
        .call_tool("echo", json!({}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidArguments);
    assert!(error.message.contains("text"), "{}", error.message);
    assert!(host.calls().is_empty(), "the source never saw a bad call");

    assert_eq!(
        set.call_tool("echo", json!({"text": "hi"}), CancellationToken::new())
            .await
            .unwrap(),
        "\"hi\""
    );
    assert_eq!(host.calls().len(), 1);
}

/// The loop validates each call against the schema the model was shown
/// (it needs the error for its repair message) and marks the call so; the
/// set then leaves it alone, so no call is validated twice.
#[tokio::test]
async fn a_call_the_loop_validated_is_not_validated_again() {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(tool("echo"), |_| Ok("reached".into()));
    let mut set = ToolSet::new();
    set.add_shared("page", host.clone(), SourceOptions::default());
    let marked = CallContext::new().with_arguments_checked();
    // Arguments the set would refuse: only the mark lets them through.
    let out = set
        .call_tool_with("echo", json!({}), &marked, CancellationToken::new())
        .await;
    assert_eq!(out.unwrap(), "reached");
    assert_eq!(host.calls().len(), 1);
}

#[tokio::test]
async fn allow_and_deny_come_before_validation() {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(tool("delete_all"), |_| Ok("gone".into()));
    let mut set = ToolSet::new();
    set.add_shared(
        "files",
        host.clone(),
        SourceOptions::default().deny(["delete_*"]),
    );
    let error = set
        .call_tool("delete_all", json!({"text": 1}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Denied, "{error:?}");
    assert!(host.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_tool_times_out_with_its_sources_limit() {
    let mut tools = NativeTools::new();
    tools.add_async(tool("wait"), |_| async {
        futures::future::pending::<()>().await;
        Ok(String::new())
    });
    let mut set = ToolSet::new();
    set.add_with(
        "rust",
        tools,
        SourceOptions::default().call_timeout(Duration::from_secs(7)),
    );
    let started = tokio::time::Instant::now();
    let error = call_bounded(&set, "wait", json!({"text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Timeout, "{error:?}");
    assert!(error.message.contains("within 7 s"), "{}", error.message);
    // Paused time: this is the clock the set's timer runs on, not the wall.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(7) && waited <= Duration::from_secs(7) + CANCEL_GRACE,
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_panicking_tool_becomes_a_tool_error_and_the_set_keeps_serving() {
    let mut tools = NativeTools::new();
    tools.add_fn(tool("boom"), |_| panic!("kaboom"));
    tools.add_fn(tool("echo"), |args| Ok(args["text"].to_string()));
    let mut set = ToolSet::new();
    set.add("rust", tools);

    for _ in 0..2 {
        let error = set
            .call_tool("boom", json!({"text": "x"}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Unavailable, "{error:?}");
        assert!(error.message.contains("kaboom"), "{}", error.message);
        assert!(error.message.contains("`rust`"), "{}", error.message);
    }
    assert_eq!(
        set.call_tool(
            "echo",
            json!({"text": "still here"}),
            CancellationToken::new()
        )
        .await
        .unwrap(),
        "\"still here\""
    );
    assert_eq!(set.health()[0].panics, 2);
}

#[tokio::test]
async fn a_source_that_keeps_crashing_is_rebuilt_until_its_budget_is_spent_then_reported() {
    let builds = Arc::new(AtomicUsize::new(0));
    let counted = builds.clone();
    let mut set =
        ToolSet::new().with_restart_budget(RestartBudget::new(2, Duration::from_secs(600)));
    set.add_built(
        "flaky",
        move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut tools = NativeTools::new();
            tools.add_fn(tool("work"), |_| panic!("the source broke"));
            tools
        },
        SourceOptions::default(),
    );
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    // Listed once, as the loop does each step: calls then go by that listing.
    assert_eq!(set.list_tools().await.len(), 1);
    let work = async || {
        set.call_tool("work", json!({"text": "x"}), CancellationToken::new())
            .await
            .unwrap_err()
    };

    // Two panics, two fresh sources: the budget allows two.
    for rebuilt in 1..=2 {
        let error = work().await;
        assert_eq!(error.code, ToolErrorCode::Unavailable);
        assert!(error.message.contains("made afresh"), "{}", error.message);
        assert_eq!(builds.load(Ordering::SeqCst), 1 + rebuilt);
        assert_eq!(set.health()[0].state, SourceState::Ready);
    }
    // The third is over the budget: no fresh source, and the set says so.
    let error = work().await;
    assert!(!error.message.contains("made afresh"), "{}", error.message);
    assert_eq!(builds.load(Ordering::SeqCst), 3);
    let health = &set.health()[0];
    assert!(
        matches!(&health.state, SourceState::GaveUp { reason } if reason.contains("restart budget")),
        "{health:?}"
    );
    assert_eq!((health.restarts, health.panics), (2, 3));

    // The next call is refused without reaching (or making) the source.
    let error = work().await;
    assert_eq!(error.code, ToolErrorCode::Unavailable);
    assert!(
        error.message.contains("restart budget"),
        "{}",
        error.message
    );
    assert_eq!(set.health()[0].panics, 3, "the source was not called");
    assert_eq!(builds.load(Ordering::SeqCst), 3);
    assert!(
        set.list_tools().await.is_empty(),
        "a source given up on offers nothing"
    );
}

/// A source as a config hosts it (a set of its own, under the config's
/// policy, inside the set that merges every source, as the runtime's tool
/// bridge holds it), a raw [`ToolHost`] and Rust functions: each refuses
/// invalid arguments before its source sees them, and each call times out
/// after its own source's limit.
#[tokio::test(start_paused = true)]
async fn a_config_source_a_raw_source_and_rust_functions_take_the_same_path() {
    let config_host = Arc::new(InMemoryToolHost::new());
    config_host.add(tool("config_check"), |_| Ok("config".into()));
    config_host.add_slow(tool("config_hang"), FOREVER, |_| Ok("late".into()));
    let config = {
        let mut policy = ToolSet::new();
        let host = config_host.clone();
        policy.add_built_shared(
            "config",
            move || host.clone() as Arc<dyn ToolHost>,
            SourceOptions::default().call_timeout(Duration::from_secs(5)),
        );
        Arc::new(policy)
    };

    let raw_host = Arc::new(InMemoryToolHost::new());
    raw_host.add(tool("raw_check"), |_| Ok("raw".into()));
    raw_host.add_slow(tool("raw_hang"), FOREVER, |_| Ok("late".into()));

    let native_calls = Arc::new(AtomicUsize::new(0));
    let mut native = NativeTools::new();
    let counted = native_calls.clone();
    native.add_fn(tool("native_check"), move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok("native".into())
    });
    native.add_async(tool("native_hang"), |_| async {
        futures::future::pending::<()>().await;
        Ok(String::new())
    });

    let mut set = ToolSet::new();
    set.add_shared("config", config, SourceOptions::default());
    set.add_shared(
        "raw",
        raw_host.clone(),
        SourceOptions::default().call_timeout(Duration::from_secs(6)),
    );
    set.add_with(
        "native",
        native,
        SourceOptions::default().call_timeout(Duration::from_secs(7)),
    );
    assert_eq!(set.list_tools().await.len(), 6);

    for (source, limit) in [("config", 5), ("raw", 6), ("native", 7)] {
        let error = call_bounded(&set, &format!("{source}_check"), json!({"text": 1}))
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::InvalidArguments, "{source}");
        let answer = call_bounded(&set, &format!("{source}_check"), json!({"text": "ok"})).await;
        assert_eq!(answer.unwrap(), source);

        let error = call_bounded(&set, &format!("{source}_hang"), json!({"text": "x"}))
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Timeout, "{source}: {error:?}");
        assert!(
            error.message.contains(&format!("within {limit} s")),
            "{source}: {}",
            error.message
        );
    }
    // Only the valid calls reached a source.
    assert_eq!(config_host.calls().len(), 2, "the valid check and the hang");
    assert_eq!(raw_host.calls().len(), 2, "the valid check and the hang");
    assert_eq!(native_calls.load(Ordering::SeqCst), 1);
}
