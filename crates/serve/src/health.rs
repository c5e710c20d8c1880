//! `GET /v1/health`: each actor's state, asked of the actor itself.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use wma_runtime::{RunId, RuntimeError};

use crate::api::Api;

/// How long the health check waits for one actor's answer. An actor that
/// is restarting (a provider reloading its model takes a while) is
/// reported as such instead of holding the check up.
pub const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A run id the runtime never hands out (its ids count up from 1), so a
/// Stop for it reaches the agent actor and stops nothing.
const PROBE_RUN: RunId = RunId::MAX;

/// One actor's state as the health check saw it.
enum State {
    /// It answered.
    Serving,
    /// It did not answer in time (restarting, or busy): degraded, not down.
    NotAnswering(String),
    /// The supervisor gave up on it (or the runtime is going away).
    GivenUp(String),
}

impl State {
    async fn of<T>(probe: impl Future<Output = Result<T, RuntimeError>>) -> Self {
        match tokio::time::timeout(HEALTH_PROBE_TIMEOUT, probe).await {
            Ok(Ok(_)) => Self::Serving,
            Ok(Err(RuntimeError::Unavailable { reason, .. })) => Self::GivenUp(reason),
            Ok(Err(other)) => Self::NotAnswering(other.to_string()),
            Err(_) => Self::NotAnswering(format!(
                "it did not answer within {:.1} s",
                HEALTH_PROBE_TIMEOUT.as_secs_f64()
            )),
        }
    }

    fn json(&self) -> Value {
        match self {
            Self::Serving => json!({"state": "serving"}),
            Self::NotAnswering(why) => json!({"state": "not_answering", "reason": why}),
            Self::GivenUp(why) => json!({"state": "given_up", "reason": why}),
        }
    }
}

/// The health status and its body. `detailed` is false for a request
/// without the token: it learns only whether the host serves.
pub(crate) async fn report(api: &Api, detailed: bool) -> (StatusCode, Value) {
    let agent_states = futures::future::join_all(
        api.agents
            .iter()
            .map(|agent| State::of(agent.handle.stop(PROBE_RUN))),
    );
    let provider_states = futures::future::join_all(
        api.providers
            .iter()
            .map(|(_, handle)| State::of(handle.current_info())),
    );
    let (agent_states, provider_states) = tokio::join!(agent_states, provider_states);
    let all = agent_states.iter().chain(&provider_states);
    let sources: Vec<wma_tools::SourceHealth> = api
        .tool_sets
        .iter()
        .flat_map(|(_, set)| set.health())
        .collect();
    // A tool source given up on (past its restart budget) leaves the agents
    // serving, without that source's tools: degraded, not down.
    let source_down = sources
        .iter()
        .any(|s| matches!(s.state, wma_tools::SourceState::GaveUp { .. }));
    let (status, code) = if all.clone().any(|s| matches!(s, State::GivenUp(_))) {
        ("unavailable", StatusCode::SERVICE_UNAVAILABLE)
    } else if source_down || all.clone().any(|s| matches!(s, State::NotAnswering(_))) {
        ("degraded", StatusCode::OK)
    } else {
        ("ok", StatusCode::OK)
    };
    if !detailed {
        return (code, json!({"status": status}));
    }
    let agents: Vec<Value> = api
        .agents
        .iter()
        .zip(&agent_states)
        .map(|(agent, state)| {
            let mut entry = state.json();
            entry["name"] = json!(agent.handle.name());
            entry["restarts"] = json!(agent.handle.restarts());
            entry["active_runs"] = json!(agent.handle.active_runs());
            // The bridge offers no query that reports a given-up state
            // (its listing answers an empty list instead), so only its
            // restarts are known here.
            if let Some(tools) = &agent.tools {
                entry["tool_bridge"] = json!({"restarts": tools.restarts()});
            }
            entry
        })
        .collect();
    let providers: Vec<Value> = api
        .providers
        .iter()
        .zip(&provider_states)
        .map(|((name, handle), state)| {
            let mut entry = state.json();
            entry["name"] = json!(name);
            entry["restarts"] = json!(handle.restarts());
            entry["in_flight"] = json!(handle.in_flight());
            entry
        })
        .collect();
    (
        code,
        json!({
            "status": status,
            "agents": api.agents.len(),
            "uptime_secs": api.started.elapsed().as_secs(),
            "actors": {"agents": agents, "providers": providers},
            "tool_sources": sources,
        }),
    )
}
