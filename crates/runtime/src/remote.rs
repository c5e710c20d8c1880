//! The protocol between a parent's node and the endpoint of the node that
//! hosts a sub-agent, and the parent's side of it: finding the endpoint,
//! running the sub-agent there, and taking its parts in with suspicion.
//!
//! The endpoint itself, and the [`ClusterNode`](crate::ClusterNode) it
//! lives on, need the whole runtime; the delegator, which the runtime
//! starts, reaches a remote sub-agent through this module alone.

use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use wma_agent::{ToolError, ToolErrorCode};

use crate::delegation::{FinalAnswer, Job, Relay};
use crate::part::TaggedPart;
use crate::timeouts::Timeouts;

/// The process-group scope every exported agent's endpoint joins.
pub const CLUSTER_SCOPE: &str = "wma";

/// How long a `next` poll waits for the first part before answering with none.
pub const NEXT_WAIT: Duration = Duration::from_millis(500);

/// Most parts one `next` answer carries.
pub const NEXT_BATCH: usize = 64;

/// The process group of an exported agent.
pub(crate) fn group_of(agent: &str) -> String {
    format!("agent:{agent}")
}

/// The endpoint of a node that offers `agent`, if one is connected.
pub(crate) fn find_agent(agent: &str) -> Option<ActorRef<EndpointMsg>> {
    let members = ractor::pg::get_scoped_members(&CLUSTER_SCOPE.to_string(), &group_of(agent));
    // A member on another node is the one a parent means. One on this node
    // shows up beside it only when one process runs two nodes (and then the
    // call should still cross the wire, as it would between processes).
    members
        .iter()
        .find(|member| !member.get_id().is_local())
        .or(members.first())
        .cloned()
        .map(ActorRef::from)
}

/// What a parent's node asks an endpoint.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Request {
    /// Start a run of `agent` with `task` as the user's message.
    Start {
        agent: String,
        task: String,
        depth: u32,
        /// The W3C `traceparent` of the parent's `execute_tool` span, so
        /// the remote run joins the parent's trace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
    },
    /// The parts of `run` that are ready (waiting up to `wait_ms` for one).
    Next { run: u64, wait_ms: u64 },
    /// Stop `run`.
    Stop { run: u64 },
}

/// What an endpoint answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub(crate) enum Reply {
    Started {
        run: u64,
    },
    Parts {
        parts: Vec<TaggedPart>,
        done: bool,
    },
    Stopped,
    /// The run is not known (finished and read, or stopped for idleness).
    Gone,
    Refused {
        code: ToolErrorCode,
        message: String,
    },
}

/// The endpoint's one message: a JSON request whose reply is JSON too. Raw
/// bytes both ways, so ractor_cluster carries it as is.
pub(crate) enum EndpointMsg {
    Request {
        body: Vec<u8>,
        reply: RpcReplyPort<Vec<u8>>,
    },
}

impl ractor::Message for EndpointMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        let Self::Request { body, reply } = self;
        Ok(SerializedMessage::Call {
            variant: "request".to_string(),
            args: body,
            reply,
            metadata: None,
        })
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Call { args, reply, .. } => Ok(Self::Request { body: args, reply }),
            _ => Err(BoxedDowncastErr),
        }
    }
}

/// One request to an endpoint, within `timeout`.
async fn call(
    endpoint: &ActorRef<EndpointMsg>,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, String> {
    let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    match endpoint
        .call(|reply| EndpointMsg::Request { body, reply }, Some(timeout))
        .await
    {
        Ok(CallResult::Success(bytes)) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("an answer that does not parse: {e}")),
        Ok(CallResult::Timeout) => Err(format!("no answer within {:.1} s", timeout.as_secs_f64())),
        Ok(CallResult::SenderError) => Err("the node dropped the request".to_string()),
        Err(error) => Err(format!("the node cannot be reached: {error}")),
    }
}

/// Runs a sub-agent on another node: start, poll its parts into the
/// parent's stream, stop it when the parent's call is cancelled.
///
/// The peer's parts are not taken at their word: the remote run's own parts
/// (its depth 0) are tagged with the sub-agent's name whatever they say,
/// deeper ones keep their tag only when it is a valid agent name other than
/// the parent's, and
/// depths are capped at what `max_depth` allows below this job, then moved
/// one level down. So every part is at least one level below the parent's
/// run: a peer cannot pass a part off as the parent's own, end the
/// parent's run, or overflow a depth. Parts after the remote run's end are
/// dropped.
pub(crate) async fn run_remote(
    endpoint: ActorRef<EndpointMsg>,
    job: Job,
    timeouts: Timeouts,
    max_depth: u32,
) -> Result<String, ToolError> {
    let lost = |why: String| {
        ToolError::new(
            ToolErrorCode::Unavailable,
            format!("lost the node that runs the agent `{}`: {why}", job.to),
        )
    };
    let start = Request::Start {
        agent: job.to.clone(),
        task: job.task.clone(),
        depth: job.depth,
        traceparent: traceparent(&tracing::Span::current()),
    };
    let run = match call(&endpoint, &start, timeouts.control)
        .await
        .map_err(lost)?
    {
        Reply::Started { run } => run,
        Reply::Refused { code, message } => return Err(ToolError::new(code, message)),
        other => return Err(lost(format!("an unexpected answer {other:?}"))),
    };
    // Stop is a request of its own, so the poll in flight is not dropped
    // (its parts would be lost with it).
    let stopper = tokio::spawn({
        let endpoint = endpoint.clone();
        let cancel = job.cancel.clone();
        let timeout = timeouts.control;
        async move {
            cancel.cancelled().await;
            let _ = call(&endpoint, &Request::Stop { run }, timeout).await;
        }
    });
    let mut answer = FinalAnswer::new(&job.to);
    // How many levels the remote run may nest below itself.
    let below = max_depth.saturating_sub(job.depth);
    let poll = Request::Next {
        run,
        wait_ms: NEXT_WAIT.as_millis() as u64,
    };
    let result = loop {
        match call(&endpoint, &poll, NEXT_WAIT + timeouts.control).await {
            Ok(Reply::Parts { parts, done }) => {
                let mut ended = false;
                for part in parts {
                    let part = checked(part, &job.to, &job.from, below);
                    answer.observe(&part);
                    ended = part.ends_the_run();
                    if job.sink.send(Relay::Part(nested(part))).await.is_err() {
                        // The parent's host went away: stop the remote run,
                        // and read on to its end.
                        job.cancel.cancel();
                    }
                    if ended {
                        break;
                    }
                }
                if done || ended {
                    break answer.finish();
                }
            }
            Ok(Reply::Gone) => break answer.finish(),
            Ok(other) => break Err(lost(format!("an unexpected answer {other:?}"))),
            Err(why) => break Err(lost(why)),
        }
    };
    stopper.abort();
    result
}

/// A peer's part as this node trusts it: the remote run's own parts (depth
/// 0) tagged with the sub-agent's name (`agent`), deeper ones with their own
/// name when it is a valid agent name other than the delegating parent's
/// (else the sub-agent's), and the depth capped at `below`, the levels the
/// remote run may nest.
fn checked(mut part: TaggedPart, agent: &str, parent: &str, below: u32) -> TaggedPart {
    part.depth = part.depth.min(below);
    if part.depth == 0 || part.agent == parent || !is_agent_name(&part.agent) {
        part.agent = agent.to_string();
    }
    part
}

/// One level further down, as a parent's stream carries a sub-agent's part;
/// saturating, so that no depth a peer sends wraps to the parent's own.
fn nested(mut part: TaggedPart) -> TaggedPart {
    part.depth = part.depth.saturating_add(1);
    part
}

/// What a configuration accepts as an agent's name: ASCII letters, digits,
/// `_` and `-`, at most 64 of them.
fn is_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The W3C `traceparent` of `span`, when it is exported to a trace.
fn traceparent(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

/// The parent context a `traceparent` names; `None` when it does not parse
/// (a peer's header is data: a bad one only loses the link).
pub(crate) fn parse_traceparent(header: &str) -> Option<opentelemetry::Context> {
    let mut fields = header.trim().split('-');
    let (version, trace, span, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let span_context = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    span_context
        .is_valid()
        .then(|| opentelemetry::Context::new().with_remote_span_context(span_context))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wma_agent::AgentStreamPart;

    fn text(agent: &str, depth: u32) -> TaggedPart {
        TaggedPart::new(agent, depth, AgentStreamPart::Text { text: "hi".into() })
    }

    #[test]
    fn a_peer_cannot_pass_parts_off_as_the_parents() {
        // A depth that would wrap to 0 when nested stays below the parent.
        let part = nested(checked(
            text("adder", u32::MAX),
            "adder",
            "shopper",
            u32::MAX,
        ));
        assert_eq!(part.depth, u32::MAX);
        // Capped at what the parent's limit allows below the job.
        assert_eq!(
            nested(checked(text("helper", 9), "adder", "shopper", 1)).depth,
            2
        );
        // The remote run's own parts carry the sub-agent's name.
        let own = nested(checked(text("shopper", 0), "adder", "shopper", 1));
        assert_eq!((own.agent.as_str(), own.depth), ("adder", 1));
        // A deeper part keeps a valid name, not the parent's, nor one that
        // is not a name.
        assert_eq!(
            checked(text("shopper", 1), "adder", "shopper", 2).agent,
            "adder"
        );
        assert_eq!(
            checked(text("helper", 1), "adder", "shopper", 2).agent,
            "helper"
        );
        assert_eq!(
            checked(text("shopper\n[system]", 1), "adder", "shopper", 2).agent,
            "adder"
        );
    }

    #[test]
    fn a_traceparent_parses_only_when_well_formed() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_traceparent(good).expect("a valid header parses");
        assert_eq!(
            context.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }
}
