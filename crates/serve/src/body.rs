//! Request bodies: the JSON body extractor, which reads within the size
//! cap and the body timeout and takes a JSON object only, and the bodies
//! of the endpoints. The bodies are public so that the property tests
//! parse bodies as the server does ([`parse_body`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, HttpBody};
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::Response;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use wma_agent::{ApprovalAnswer, ApprovalMode, ApprovalRule, ChatMessage};
use wma_config::server::ServerOptions;

use crate::reply::error;
use crate::state::Server;

/// A JSON body, read as [`read_json`] reads it; its rejection is the
/// API's error answer (`413`, `408`, `400`).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: DeserializeOwned + Send> FromRequest<Arc<Server>> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, server: &Arc<Server>) -> Result<Self, Response> {
        read_json(&server.options, request.into_body())
            .await
            .map(JsonBody)
    }
}

/// Reads a JSON body within the size cap and the body timeout.
async fn read_json<T: DeserializeOwned>(
    options: &ServerOptions,
    body: Body,
) -> Result<T, Response> {
    let limit = options.max_body_bytes;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than the {limit} bytes this server reads"),
        )
    };
    // A declared length over the cap is refused before a byte is read.
    if body.size_hint().exact().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(body, limit);
    let collected = tokio::time::timeout(options.body_timeout, limited.collect())
        .await
        .map_err(|_| {
            error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {:.1} s",
                    options.body_timeout.as_secs_f64()
                ),
            )
        })?;
    let bytes = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            ));
        }
    };
    parse_body(&bytes).map_err(|e| error(StatusCode::BAD_REQUEST, e))
}

/// Parses a request body as the server does: a JSON object with the
/// endpoint's fields and no other. serde alone would also take a struct's
/// sequence form (`["fresh"]` for `{"provider": "fresh"}`); every body of
/// this API is an object, so anything else is refused before serde sees it.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    const PREFIX: &str = "the body is not what this endpoint takes";
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(format!("{PREFIX}: it must be a JSON object"));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("{PREFIX}: {e}"))
}

/// The body of `POST /v1/agents/{agent}/runs`: one request, or a whole
/// conversation. Public so that the property tests parse bodies as the
/// server does ([`parse_body`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// The person's request.
    pub input: Option<String>,
    /// The conversation so far, ending with the person's message.
    pub messages: Option<Vec<ChatMessage>>,
    /// Approval rules of this run's own, by tool name pattern: `ask` or
    /// `deny`. They only tighten the agent's policy, so `auto` is refused.
    pub approval: Option<BTreeMap<String, ApprovalMode>>,
}

impl RunBody {
    /// The run's own approval rules, or what is wrong with them.
    pub fn approval_rules(&self) -> Result<Vec<ApprovalRule>, String> {
        let mut rules = Vec::new();
        for (pattern, mode) in self.approval.iter().flatten() {
            if let Some(problem) = wma_config::tool_pattern_problem(pattern) {
                return Err(format!("`approval`: {problem}"));
            }
            if *mode == ApprovalMode::Auto {
                return Err(format!(
                    "`approval.{pattern}`: a run can only tighten the agent's approval policy (`ask`, `deny`), not loosen it (`auto`)"
                ));
            }
            rules.push(ApprovalRule::new(pattern.clone(), *mode));
        }
        Ok(rules)
    }
}

/// The body of `POST /v1/agents/{agent}/runs/{run}/approvals/{approval}`.
/// Public so that the property tests parse bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// `true` runs the call, `false` denies it.
    pub approve: bool,
    /// The same answer for later calls of this tool in the rest of the
    /// run (its sub-agents' runs included). Default false.
    #[serde(default)]
    pub for_session: bool,
    /// Why, for the model when it is a denial.
    pub note: Option<String>,
}

impl DecisionBody {
    /// The answer this body gives.
    pub fn answer(&self) -> ApprovalAnswer {
        let mut answer = if self.approve {
            ApprovalAnswer::approve()
        } else {
            ApprovalAnswer::deny()
        };
        if self.for_session {
            answer = answer.remembered();
        }
        if let Some(note) = &self.note {
            answer = answer.with_note(note.clone());
        }
        answer
    }
}

/// The body of `PUT /v1/agents/{agent}/provider`. Public so that the
/// property tests parse bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapBody {
    /// A provider of the config whose model the agent's provider loads.
    pub provider: String,
}

/// The body of `POST /v1/sessions`. Public so that the property tests
/// parse bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// The agent the conversation is with (one hosted here).
    pub agent: String,
    /// A title; default: the start of the first request.
    pub title: Option<String>,
}

/// The body of `POST /v1/sessions/{session}/runs`: the next request; the
/// history is the session's. Public so that the property tests parse
/// bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContinueBody {
    /// The person's next request.
    pub input: String,
    /// The run's own approval rules, as in a run's body.
    pub approval: Option<BTreeMap<String, ApprovalMode>>,
}
