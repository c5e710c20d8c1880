//! What a run's parts say of it, read as they come: the answer, how the run
//! ended, and the calls that were denied, its sub-agents' included.

use wma_agent::{AgentStreamPart, FinishReason, ToolErrorCode};

/// What a run's parts say of it, read as they come (see
/// [`RunOutcome::observe`]).
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    /// The text of the agent's last step: its answer when it finished.
    texts: Vec<String>,
    /// The part that ended the run.
    end: Option<AgentStreamPart>,
    /// The calls denied by the approval rules or for want of a person,
    /// its sub-agents' too: `tool (of `agent`): why`.
    denied: Vec<String>,
}

impl RunOutcome {
    /// Reads one part of the run, from the agent `agent` at `depth` (0 for
    /// the run's own parts, as [`TaggedPart`](crate::TaggedPart) counts).
    pub fn observe(&mut self, depth: u32, agent: &str, part: &AgentStreamPart) {
        if let AgentStreamPart::ToolError { name, error, .. } = part
            && error.code == ToolErrorCode::Denied
        {
            self.denied
                .push(format!("{name} (of `{agent}`): {}", error.message));
        }
        // A sub-agent's words are its parent's material, not the answer.
        if depth != 0 {
            return;
        }
        match part {
            AgentStreamPart::MessageStart { .. } => self.texts.clear(),
            AgentStreamPart::Text { text } => self.texts.push(text.clone()),
            end if end.is_terminal() => self.end = Some(end.clone()),
            _ => {}
        }
    }

    /// How the run ended, in a few words, for a log.
    pub fn summary(&self) -> String {
        match &self.end {
            Some(AgentStreamPart::Finish { reason }) => format!("ended {}", reason.as_str()),
            Some(AgentStreamPart::Error { message }) => format!("failed: {message}"),
            _ => "ended without a finish".to_string(),
        }
    }

    /// The calls that were not run because they were denied:
    /// `tool (of `agent`): why`.
    pub fn denied(&self) -> &[String] {
        &self.denied
    }

    /// The answer of the agent `agent`, or, as the error, a sentence for
    /// its caller that says how the run ended without one.
    pub fn answer(&self, agent: &str) -> Result<String, String> {
        let answer = self.texts.join("\n");
        let unfinished = |why: &str| format!("The agent `{agent}` did not answer: {why}.");
        match &self.end {
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Stop,
            }) if !answer.trim().is_empty() => Ok(answer),
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Stop,
            }) => Err(unfinished("it finished without saying anything")),
            Some(AgentStreamPart::Finish {
                reason: FinishReason::MaxSteps,
            }) => Err(unfinished(
                "it reached its step limit (`max_steps`) before it finished",
            )),
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Loop,
            }) => Err(unfinished(
                "it kept repeating the same call and was stopped",
            )),
            // The words so far may still help the caller, marked as cut.
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Length,
            }) => Err(format!(
                "{} Its answer so far, which may be incomplete:\n{answer}",
                unfinished("its answer was cut at the token limit")
            )),
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Unrepaired,
            }) => Err(unfinished(
                "its model's reply could not be made into a valid call or answer",
            )),
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Aborted,
            }) => Err(unfinished("the run was stopped")),
            Some(AgentStreamPart::Error { message }) => {
                Err(unfinished(&format!("the run failed: {message}")))
            }
            _ => Err(unfinished("the run ended without a finish")),
        }
    }
}
