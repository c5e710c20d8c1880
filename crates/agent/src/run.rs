//! `run_local_agent`: the loop itself.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, field};

use crate::approval::{
    ApprovalAnswer, ApprovalPolicy, ApprovalRequest, ApprovalRule, Approver, CallRecordRequest,
    Reason, Refusals, Verdict, decide, needs_record, next_approval_id,
};
use crate::error::{ProviderError, ToolError, ToolErrorCode};
use crate::ground::{copy_phrases, short_of_numbers};
use crate::host::{AgentRunRequest, CallContext, ToolHost};
use crate::lexicon::{FAILURE_MARKERS, HAND_BACK_MARKERS, is_action_verb};
use crate::message::{ChatMessage, ToolCall};
use crate::messages;
use crate::parse::{ParsedReply, parse_tool_calls};
use crate::part::{AgentStreamPart, FinishReason};
use crate::policy::{
    Fired, Found, Offer, Policy, PolicyState, Rule, StepFacts, asks_for_change, made_up_value,
    names_a_tool, seeks_information, tells_of, without_prompt_echoes, writes_a_call,
};
use crate::prompt::{
    HISTORY_TURNS, RESULT_CHARS, SystemPromptInput, Turn, compact_schema, gist, history_turns,
    page_note, prompt_messages, system_prompt, truncate_chars, window,
};
use crate::provider::{
    Constraint, Decoding, GenerateRequest, Generation, PromptMessage, PromptRole, Provider,
};
use crate::rank::rank_tools;
use crate::steered::decoding_events;
use crate::tool::{PageContext, SubAgentInfo, ToolAnnotations, ToolDefinition};
use crate::validate::{ArgsError, ValidatorCache};

/// The longest request (the newest user message) the loop takes, in bytes:
/// 64 KiB is some 16k tokens, more than the context of the models this loop
/// is for. A longer one ends the run at once with the "too long" error.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The stream of parts a run returns.
pub(crate) type AgentStream = Pin<Box<dyn Stream<Item = AgentStreamPart> + Send>>;

/// When the loop asks the provider for constrained decoding (providers that
/// cannot constrain ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConstraintMode {
    /// Never constrain.
    Off,
    /// A step's first attempt may answer in text or call one of the tools
    /// shown; the "call now" correction and the repair retry allow calls only,
    /// so the retry cannot fail the same way again. The default.
    #[default]
    Auto,
    /// Every attempt must be a call.
    CallsOnly,
}

/// The loop's limits and prompt options.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalLoopOptions {
    /// Model steps per user message. Default 6. The request's agent profile wins.
    pub max_steps: u32,
    /// Time limit per generation. Default 60 s.
    pub step_timeout: Duration,
    /// Most tools shown to the model per step. Default 8.
    pub max_tools: usize,
    /// List the tools in the prompt text with a JSON reply format, for
    /// providers without chat-template tools. Default false; pass
    /// [`Provider::tools_inline`] to follow the provider.
    pub tools_inline: bool,
    /// What the site is and how its tools fit together ("About this site").
    /// Default none. The request's agent profile wins.
    pub instructions: Option<String>,
    /// Constrained decoding per attempt. Default [`ConstraintMode::Auto`].
    pub constraints: ConstraintMode,
    /// What the loop does beyond the reference's steps (see [`Policy`]).
    /// Default `None`: [`Policy::for_model`] picks one by the provider's
    /// model: the measured policy of a known model, else the reference.
    pub policy: Option<Policy>,
    /// Which calls a person approves first (see `docs/approvals.md`).
    /// Default [`ApprovalPolicy::default`]: consequential tools ask. Asking
    /// needs the request's [`approver`](AgentRunRequest::approver); without
    /// one, calls that would ask run.
    pub approval: ApprovalPolicy,
}

impl Default for LocalLoopOptions {
    fn default() -> Self {
        Self {
            max_steps: 6,
            step_timeout: Duration::from_secs(60),
            max_tools: 8,
            tools_inline: false,
            instructions: None,
            constraints: ConstraintMode::Auto,
            policy: None,
            approval: ApprovalPolicy::default(),
        }
    }
}

/// Runs the agent loop and returns its parts as a stream.
///
/// The run makes progress only while the stream is polled, like the
/// original's async generator; dropping the stream drops the run (and
/// cancels the generation and call in flight through their tokens).
pub fn run_local_agent<P>(
    provider: P,
    request: AgentRunRequest,
    options: LocalLoopOptions,
) -> AgentStream
where
    P: Provider + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let run = Run::new(provider, request, options, tx);
    Box::pin(Driven {
        run: Some(Box::pin(run.execute())),
        rx,
    })
}

/// A stream that drives the run's future whenever the consumer asks for the
/// next part, so no task is spawned and nothing outlives the stream.
struct Driven {
    run: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    rx: mpsc::UnboundedReceiver<AgentStreamPart>,
}

impl Stream for Driven {
    type Item = AgentStreamPart;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Poll::Ready(item) = this.rx.poll_recv(cx) {
                return Poll::Ready(item);
            }
            let Some(run) = this.run.as_mut() else {
                return Poll::Pending;
            };
            match run.as_mut().poll(cx) {
                // The sender went with the run: drain, then the channel says None.
                Poll::Ready(()) => this.run = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// How a run ends.
enum End {
    Finish(FinishReason),
    Error(String),
}

/// Why this attempt is being made; picks the constraint and names the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    First,
    DelegatedFirst,
    FailureCorrection,
    CallNow,
    NamedTool,
    Repair,
    /// A repair that may answer in text (see `Policy::push_toward_related`).
    RepairOrAnswer,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::DelegatedFirst => "first:calls-only",
            Self::FailureCorrection => "correction:failed-call",
            Self::CallNow => "correction:call-now",
            Self::NamedTool => "correction:named-tool",
            Self::Repair => "repair",
            Self::RepairOrAnswer => "repair:text-or-calls",
        }
    }
}

struct Run<P> {
    provider: P,
    tools: Arc<dyn ToolHost>,
    cancel: CancellationToken,
    messages: Vec<ChatMessage>,
    max_steps: u32,
    step_timeout: Duration,
    max_tools: usize,
    tools_inline: bool,
    constraints: ConstraintMode,
    /// The rules beyond the reference, and what they remember.
    policy: Policy,
    rules: PolicyState,
    /// The rules that stood down for the request's language, reported at
    /// the first step.
    stood_down: Vec<Fired>,
    /// The step's offered tools that require a free string the run has
    /// seen no phrase for ([`crate::policy::Offer::short_of_strings`]).
    short_of_strings: Vec<String>,
    /// The tools whose results are untrusted content (as this step lists
    /// them): their results are delimited in the prompt.
    untrusted: Vec<String>,
    instructions: Option<String>,
    sub_agents: Vec<SubAgentInfo>,
    /// The run's task came from a parent agent.
    delegated: bool,
    agent_name: String,
    tx: mpsc::UnboundedSender<AgentStreamPart>,
    /// The conversation as prompt turns; append-only so a provider's prefix
    /// cache stays valid from one step to the next.
    turns: Vec<Turn>,
    /// The system prompt the run's steps reuse while they show the same
    /// tools on the same page.
    kept_system: Option<KeptSystem>,
    /// The person's request: what tools are ranked against and what is restated.
    request_text: String,
    /// (name, canonical arguments) → the answer it gave, for loop detection.
    seen: HashMap<String, String>,
    /// Loop detection already warned the model once.
    loop_flagged: bool,
    /// The newest call's failure, until a later call succeeds.
    last_failure: Option<String>,
    /// The newest successful result, for gists.
    last_result: Option<Found>,
    /// Every result of this run, to spot a reply that only echoes one.
    results: Vec<String>,
    /// Tools used, most recent first, for the ranking bonus.
    recent: Vec<String>,
    /// Compiled schemas, so a tool's schema is compiled once per run.
    validators: ValidatorCache,
    /// Approvals: the agent's policy, the request's own rules, the host's
    /// approver, and what the run learnt on the way.
    approvals: Approvals,
    /// The highest step number in the ids of the calls the conversation
    /// already holds after the person's last message (a run that goes on
    /// after an approval given to a run of an earlier process): this run's
    /// calls are numbered after them (`call_2_1` after `call_1_1`), so that
    /// no two calls of one run share an id.
    call_steps_before: u32,
}

/// What a step decided before its first attempt.
struct StepPlan {
    /// Every tool the host lists this step (a call of one not shown is
    /// still told apart from an unknown tool).
    all_tools: Vec<ToolDefinition>,
    /// The tools the prompt shows, in its order.
    shown: Vec<ToolDefinition>,
    /// The shown tools a constraint may call, in their grounded form.
    offered: Vec<ToolDefinition>,
    /// The policy's offer, which also holds calls written in prose to it.
    offer: Offer,
    /// The prompt of the step's attempts; corrections and repairs append to
    /// it.
    request: GenerateRequest,
    /// Whether no call was made yet in this run.
    first_step: bool,
    /// How the first attempt is constrained.
    attempt: Attempt,
    /// Whether no offered tool relates to the request, where the policy
    /// asks (`Policy::push_toward_related`): read once per step for the
    /// first attempt's threshold and a repair.
    unrelated: bool,
}

/// A system prompt a step wrote, kept for the steps after it: a step that
/// shows the same tools on the same page writes it again as it was (the
/// tools in the order that step listed them, its worked example), so the
/// provider's cached prefix holds through the whole conversation. Which
/// tools a step may call is the constraint's business, not the listing's.
struct KeptSystem {
    /// The tools the model was last told of (by this prompt, or by the
    /// page note after it), as that listed them.
    listed: Vec<ToolDefinition>,
    /// The page the model was last told of.
    page: Option<PageContext>,
    text: String,
    /// Whether a page note in the history told of other tools or another
    /// page than this prompt does ([`page_note`]).
    noted: bool,
}

/// Which system prompt a step's request carries, as
/// [`Run::build_request`] chose it.
enum SystemChoice {
    /// The kept one, as it was.
    Kept,
    /// The kept one, and this page note after the history.
    Noted(String),
    /// A new one, written for this step.
    Fresh,
}

impl KeptSystem {
    /// Whether a step showing `shown` on `page` writes this prompt again:
    /// the same tools (in any order, with the same definitions) and the
    /// same page as the model was last told of. `whole` says whether the
    /// step's window holds the whole history: a page note the window let
    /// go no longer tells the model anything.
    fn serves(&self, shown: &[ToolDefinition], page: Option<&PageContext>, whole: bool) -> bool {
        (whole || !self.noted)
            && self.page.as_ref() == page
            && self.listed.len() == shown.len()
            && shown.iter().all(|t| self.listed.contains(t))
    }
}

/// What the run needs to decide and ask about approvals.
struct Approvals {
    policy: ApprovalPolicy,
    rules: Vec<ApprovalRule>,
    approver: Option<Arc<dyn Approver>>,
    /// Each tool's annotations, as the step listed them.
    annotations: HashMap<String, ToolAnnotations>,
    /// The first tool whose untrusted result entered the run.
    untrusted_seen: Option<String>,
    /// Answers given "for the rest of the session", by tool.
    remembered: HashMap<String, ApprovalAnswer>,
    /// The tools a person said no to in this run (approval.rs).
    refusals: Refusals,
}

impl<P: Provider + 'static> Run<P> {
    fn new(
        provider: P,
        request: AgentRunRequest,
        options: LocalLoopOptions,
        tx: mpsc::UnboundedSender<AgentStreamPart>,
    ) -> Self {
        let profile = request.agent.unwrap_or_default();
        let call_steps_before = call_steps_before(&request.messages);
        Self {
            call_steps_before,
            max_steps: profile.max_steps.unwrap_or(options.max_steps).max(1),
            instructions: profile.instructions.or(options.instructions),
            sub_agents: profile.sub_agents,
            delegated: profile.delegated,
            agent_name: profile.name.unwrap_or_else(|| "agent".to_string()),
            step_timeout: options.step_timeout,
            max_tools: options.max_tools.max(1),
            tools_inline: options.tools_inline,
            constraints: options.constraints,
            policy: options
                .policy
                .unwrap_or_else(|| Policy::for_model(&provider.info().model)),
            rules: PolicyState::default(),
            stood_down: Vec::new(),
            short_of_strings: Vec::new(),
            untrusted: Vec::new(),
            provider,
            tools: request.tools,
            cancel: request.cancel,
            messages: request.messages,
            tx,
            turns: Vec::new(),
            kept_system: None,
            request_text: String::new(),
            seen: HashMap::new(),
            loop_flagged: false,
            last_failure: None,
            last_result: None,
            results: Vec::new(),
            recent: Vec::new(),
            validators: ValidatorCache::new(),
            approvals: Approvals {
                policy: options.approval,
                rules: request.approval_rules,
                approver: request.approver,
                annotations: HashMap::new(),
                untrusted_seen: None,
                remembered: HashMap::new(),
                refusals: Refusals::default(),
            },
        }
    }

    fn emit(&self, part: AgentStreamPart) {
        // A closed channel means the consumer dropped the stream; the run is
        // being dropped with it, so there is nobody left to tell.
        let _ = self.tx.send(part);
    }

    async fn execute(mut self) {
        let info = self.provider.info();
        let span = tracing::info_span!(
            "invoke_agent",
            otel.name = %format!("invoke_agent {}", self.agent_name),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = %self.agent_name,
            gen_ai.provider.name = %info.provider,
            gen_ai.request.model = %info.model,
            wma.steps = field::Empty,
            wma.finish_reason = field::Empty,
            error.type = field::Empty,
        );
        let end = self.run().instrument(span.clone()).await;
        let last = match end {
            End::Finish(reason) => {
                span.record("wma.finish_reason", reason.as_str());
                AgentStreamPart::Finish { reason }
            }
            End::Error(message) => {
                span.record("error.type", "agent_error");
                tracing::error!(parent: &span, %message, "run ended with an error");
                AgentStreamPart::Error { message }
            }
        };
        // The run's span ends before its terminal part goes out: a consumer
        // that exits on that part (`wma run`) flushes its traces next, and a
        // span still open then is never exported.
        drop(span);
        self.emit(last);
    }

    async fn run(&mut self) -> End {
        let Some(request_index) = self.messages.iter().rposition(ChatMessage::is_user) else {
            return End::Error(
                "There is nothing to answer: the conversation has no user message.".to_string(),
            );
        };
        if let ChatMessage::User { content } = &self.messages[request_index] {
            // Longer than any on-device context can hold: say so before any
            // work on it (scans, ranking, rendering, tokenizing).
            if content.len() > MAX_REQUEST_BYTES {
                return End::Error(messages::TOO_LONG.to_string());
            }
            self.request_text = content.clone();
        }
        let (policy, stood_down) = self
            .policy
            .for_language(crate::lexicon::speaks_english(&self.request_text));
        self.policy = policy;
        self.stood_down = stood_down;
        self.turns = history_turns(&self.messages, self.provider.call_format());
        for message in &self.messages {
            match message {
                ChatMessage::User { content } => {
                    self.rules.identifiers.add_user_text(content);
                }
                ChatMessage::Tool {
                    content,
                    is_error: false,
                    ..
                } => {
                    self.rules.identifiers.add_result(content);
                }
                _ => {}
            }
        }
        if let Some(instructions) = &self.instructions {
            self.rules.identifiers.add_stated(instructions);
            self.rules.instructions = instructions.clone();
        }
        if matches!(self.messages.last(), Some(ChatMessage::Tool { .. })) {
            self.resume(request_index);
        }
        for step in 1..=self.max_steps {
            if self.cancel.is_cancelled() {
                return End::Finish(FinishReason::Aborted);
            }
            Span::current().record("wma.steps", i64::from(step));
            self.emit(AgentStreamPart::MessageStart { step });
            let span = tracing::info_span!(
                "step",
                otel.name = %format!("step {step}"),
                wma.step = i64::from(step),
                wma.tools_shown = field::Empty,
                wma.outcome = field::Empty,
            );
            if let Some(end) = self.step(step).instrument(span).await {
                return end;
            }
        }
        let mut text = String::new();
        if let Some(result) = &self.last_result {
            text.push_str(&result.gist(&self.request_text));
            text.push_str("\n\n");
        }
        text.push_str(&messages::max_steps(self.max_steps));
        self.emit(AgentStreamPart::Text { text });
        End::Finish(FinishReason::MaxSteps)
    }

    /// The calls that finished after the person's last message count as if
    /// this run had made them: they seed loop detection and the last failure.
    fn resume(&mut self, request_index: usize) {
        let mut calls: HashMap<String, ToolCall> = HashMap::new();
        for message in &self.messages[request_index + 1..] {
            match message {
                ChatMessage::Assistant { tool_calls, .. } => {
                    for call in tool_calls {
                        calls.insert(call.id.clone(), call.clone());
                    }
                }
                ChatMessage::Tool {
                    call_id,
                    name,
                    content,
                    is_error,
                } => {
                    let arguments = calls
                        .get(call_id)
                        .map(|c| c.arguments.clone())
                        .unwrap_or(Value::Null);
                    self.seen
                        .insert(call_key(name, &arguments), content.clone());
                    touch_recent(&mut self.recent, name);
                    if *is_error {
                        self.last_failure = Some(content.clone());
                    } else {
                        self.last_failure = None;
                        self.last_result = Some(Found::of_call(&arguments, content));
                        self.results.push(content.clone());
                    }
                }
                ChatMessage::User { .. } => {}
            }
        }
        self.turns.push(Turn::new(
            PromptRole::User,
            messages::resume(&self.request_text),
        ));
    }

    /// One model step. `None` means the loop goes on.
    /// One step of the reference: tools and prompt (steps 3 and 4, with the
    /// policy's offer), then attempts until the reply is calls to run or an
    /// answer: generate (5), read it whole (6), repair (8) or correct (7)
    /// it, and run its calls (9, 10).
    async fn step(&mut self, step: u32) -> Option<End> {
        let stood_down = std::mem::take(&mut self.stood_down);
        self.report(stood_down);
        let mut plan = match self.plan_step().await {
            Ok(plan) => plan,
            Err(end) => return Some(end),
        };
        let mut attempt = plan.attempt;
        let mut corrected = false;
        let mut repaired = false;
        // The prose reply a calls-only retry replaced, while the retry runs.
        let mut before_retry: Option<String> = None;
        loop {
            plan.request.constraint = self.constraint(attempt, &plan.shown, &plan.offered);
            let generation = match self.generate(plan.request.clone(), attempt).await {
                Ok(g) => g,
                Err(end) => return Some(end),
            };
            let reply = parse_tool_calls(&generation.text);
            if plan.request.constraint.is_some() {
                self.report(decoding_events(
                    &generation,
                    &plan.request.decoding,
                    &reply,
                    &plan.offered,
                    self.policy.no_prompt_names_in_values,
                ));
            }
            if let Some(problem) = self.problem(&generation.text, &reply, &plan) {
                if repaired {
                    // On a step that offered no tool because a lookup
                    // answered the request, the second call attempt stands
                    // for an answer that told nothing: the lookup's gist
                    // answers, not the apology.
                    if self.policy.answer_after_lookup
                        && plan.offered.is_empty()
                        && self.rules.answered.is_some()
                    {
                        tracing::debug!(%problem, "a call again where the step offered none");
                        return Some(self.answer(
                            String::new(),
                            &generation,
                            &plan.request.messages,
                        ));
                    }
                    Span::current().record("wma.outcome", "apology");
                    self.emit(AgentStreamPart::Text {
                        text: messages::APOLOGY.to_string(),
                    });
                    return Some(End::Finish(FinishReason::Unrepaired));
                }
                repaired = true;
                tracing::debug!(%problem, "repairing a bad reply");
                self.push_turn(PromptRole::Assistant, generation.text.trim());
                self.push_turn(
                    PromptRole::Tool,
                    format!("{problem} {}", messages::TRY_AGAIN),
                );
                attempt = self.repair_attempt(&plan);
                self.append_to(&mut plan.request);
                continue;
            }
            let reply = self.unless_made_up(reply, before_retry.take(), &plan.shown);
            if !reply.calls.is_empty() {
                Span::current().record("wma.outcome", "calls");
                return self
                    .run_calls(step, reply, &generation.text, &plan.request.messages)
                    .await;
            }
            if !corrected && let Some(next) = self.correction(&reply.text, &generation, &plan) {
                corrected = true;
                if next == Attempt::NamedTool {
                    before_retry = Some(reply.text);
                }
                attempt = next;
                self.append_to(&mut plan.request);
                continue;
            }
            return Some(self.answer(reply.text, &generation, &plan.request.messages));
        }
    }

    /// Steps 3 and 4 with the policy's offer: the host's tools read fresh,
    /// ranked, offered as the policy decides (once per step: every attempt
    /// uses the same decision), fitted to the model; and how the first
    /// attempt is constrained.
    async fn plan_step(&mut self) -> Result<StepPlan, End> {
        let all_tools = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(End::Finish(FinishReason::Aborted)),
            tools = self.tools.list_tools() => tools,
        };
        let page = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(End::Finish(FinishReason::Aborted)),
            page = self.tools.page_context() => page,
        };
        let sub_agents: Vec<String> = self.sub_agents.iter().map(|s| s.name.clone()).collect();
        self.rules.observe_sub_agents(&sub_agents);
        self.rules.observe_tools(&all_tools);
        self.untrusted = all_tools
            .iter()
            .filter(|t| t.annotations.untrusted_content)
            .map(|t| t.name.clone())
            .collect();
        self.observe_for_approvals(&all_tools);
        // A tool a person denied in this run is not offered again.
        let all_tools = self.approvals.refusals.offerable(all_tools);
        let ranked = rank_tools(&all_tools, &self.request_text, &self.recent, self.max_tools);
        let constrained = self.constrains(&ranked);
        let first_step = self.seen.is_empty();
        let has_phrases = self.policy.order_for_calls
            && constrained
            && first_step
            && !copy_phrases(std::iter::once(self.request_text.as_str()), &ranked).is_empty();
        let mut offer = self.rules.offer(
            &self.policy,
            ranked,
            StepFacts {
                request: &self.request_text,
                constrained,
                first_step,
                has_phrases,
                sub_agents: &sub_agents,
            },
        );
        let (mut request, shown, system) = self.fit(&offer.ranked, page.as_ref()).await?;
        let mut fired = std::mem::take(&mut offer.fired);
        self.short_of_strings = std::mem::take(&mut offer.short_of_strings);
        match system {
            SystemChoice::Kept => {
                // The kept prompt lists the tools as an earlier step did:
                // the order this step chose changed nothing the model reads.
                fired.retain(|f| f.rule != Rule::OrderForCalls);
            }
            SystemChoice::Noted(note) => {
                // The step told of its page and tools after the history:
                // the note joins the history where the request has it.
                self.push_turn(PromptRole::System, note);
                if let Some(kept) = &mut self.kept_system {
                    kept.listed = shown.clone();
                    kept.page = page.clone();
                    kept.noted = true;
                }
            }
            SystemChoice::Fresh => {
                self.kept_system = Some(KeptSystem {
                    listed: shown.clone(),
                    page: page.clone(),
                    text: request.messages[0].content.clone(),
                    noted: false,
                });
            }
        }
        self.report(fired);
        Span::current().record("wma.tools_shown", shown.len() as i64);
        // What the constraint offers: the shown tools the policy lets be
        // called, in their (grounded) constrained form.
        let offered: Vec<ToolDefinition> = shown
            .iter()
            .filter_map(|t| offer.callable.iter().find(|c| c.name == t.name).cloned())
            .collect();
        let unrelated = self.policy.push_toward_related
            && self.rules.related(&self.request_text, &offered).is_empty();
        let attempt = match self.calls_first(&shown, &offered, &sub_agents, first_step) {
            Some(fired) => {
                self.report(vec![fired]);
                Attempt::DelegatedFirst
            }
            None => {
                if let Some(fired) =
                    self.threshold_held_back(&shown, &offered, first_step, unrelated, &request)
                {
                    request.decoding.call_threshold = None;
                    self.report(vec![fired]);
                }
                Attempt::First
            }
        };
        Ok(StepPlan {
            all_tools,
            shown,
            offered,
            offer,
            request,
            first_step,
            attempt,
            unrelated,
        })
    }

    /// Why a first step that can start with a call under a constraint has
    /// to (a delegated run, or a coordinator asked for something), if it
    /// does: its first attempt then allows calls only.
    fn calls_first(
        &self,
        shown: &[ToolDefinition],
        offered: &[ToolDefinition],
        sub_agents: &[String],
        first_step: bool,
    ) -> Option<Fired> {
        let can_start_with_a_call = first_step
            && self.constraints == ConstraintMode::Auto
            && self.constrains(shown)
            && !offered.is_empty();
        if !can_start_with_a_call {
            None
        } else if self.policy.delegated_calls_first && self.delegated {
            Some(Fired {
                rule: Rule::DelegatedCallsFirst,
                detail: "a delegated run's first attempt allows calls only".to_string(),
            })
        } else if self.policy.coordinator_calls_first
            && offered.iter().all(|t| sub_agents.contains(&t.name))
            && (asks_for_change(&self.request_text) || seeks_information(&self.request_text))
            // A question none of the helpers relates to ("What's the
            // capital of Japan?" beside a database helper) is the
            // coordinator's to answer: forcing a delegation sent it to
            // SQL. Read on the helpers as shown: the offered forms carry
            // the request's own phrases as tasks.
            && !self
                .rules
                .related(
                    &self.request_text,
                    &shown
                        .iter()
                        .filter(|t| offered.iter().any(|o| o.name == t.name))
                        .cloned()
                        .collect::<Vec<_>>(),
                )
                .is_empty()
        {
            Some(Fired {
                rule: Rule::CoordinatorCallsFirst,
                detail: "a coordinator's first attempt allows only delegations".to_string(),
            })
        } else {
            None
        }
    }

    /// Step 6: what is wrong with a reply read whole, if anything (an
    /// unknown tool, a call that cannot be read, invalid arguments, an
    /// empty reply), or a call outside the policy's offer.
    fn problem(&self, raw: &str, reply: &ParsedReply, plan: &StepPlan) -> Option<ToolError> {
        check_reply(raw, reply, &plan.all_tools, &plan.shown, &self.validators).or_else(|| {
            if !(self.policy.calls_within_offer && self.constrains(&plan.shown)) {
                return None;
            }
            let (fired, problem) =
                plan.offer
                    .outside(&reply.calls, &plan.offered, &self.validators)?;
            self.report(vec![fired]);
            Some(problem)
        })
    }

    /// The reply of a calls-only retry, or the prose it replaced when the
    /// retried call's values look made up (see
    /// [`Policy::grounded_retry_values`]).
    fn unless_made_up(
        &self,
        reply: ParsedReply,
        retried_prose: Option<String>,
        shown: &[ToolDefinition],
    ) -> ParsedReply {
        let made_up = retried_prose
            .as_ref()
            .and_then(|_| self.made_up_call(&reply, shown));
        match (retried_prose, made_up) {
            (Some(prose), Some(why)) if self.policy.grounded_retry_values => {
                self.report(vec![Fired {
                    rule: Rule::GroundedRetryValues,
                    detail: format!("dropped the retried call ({why}); the prose reply stands"),
                }]);
                ParsedReply {
                    text: prose,
                    ..ParsedReply::default()
                }
            }
            _ => reply,
        }
    }

    /// Step 7's corrections of a prose reply (once per step), and the
    /// policy's calls-only retry: the attempt that follows, with the turns
    /// that ask for it pushed, or `None` when the prose stands.
    fn correction(
        &mut self,
        text: &str,
        generation: &Generation,
        plan: &StepPlan,
    ) -> Option<Attempt> {
        // A reply of the loop's own words alone is no answer: while a tool
        // that relates to the request can be called, the model gets to call
        // one instead. Where none relates, a forced call is a call to a tool
        // that does something else (Qwen2.5-Coder, asked how many
        // continents there are, echoed "The next step for it is to call
        // read_text_file." and was made to read a file that does not
        // exist): the corrections below and the answer's own checks take it.
        if self.policy.echo_retry
            && !plan.offered.is_empty()
            && self.constrains(&plan.shown)
            && without_prompt_echoes(text, &plan.request.messages).is_some_and(|k| k.is_empty())
        {
            if !plan.unrelated {
                let fired = Fired {
                    rule: Rule::EchoRetry,
                    detail: "retried a reply of the loop's own words as calls only".to_string(),
                };
                return Some(self.retry_as_calls(text, fired));
            }
            self.report(vec![Fired {
                rule: Rule::PushTowardRelated,
                detail: "no calls-only retry of a reply of the loop's own words: no tool offered relates to the request"
                    .to_string(),
            }]);
        }
        // A plain reply that ignores the last failed call.
        if let Some(failure) = self
            .last_failure
            .clone()
            .filter(|f| !acknowledges_failure(text, f))
        {
            self.push_turn(PromptRole::Assistant, text);
            self.push_turn(PromptRole::User, messages::dont_say_it_worked(&failure));
            return Some(Attempt::FailureCorrection);
        }
        // A reply to an action request that tells the person to use a tool
        // that is right here. Under constraints the retry can only be a
        // call, and a call where no tool fits is always wrong; a model that
        // gave a call almost no weight was explaining, not handing the work
        // back.
        // Right after a change succeeded, a reply that asks the person to
        // press something speaks of what the change left to them (a form
        // filled and waiting for their submit), not of a tool to call.
        if is_action_request(&self.request_text)
            && !self.rules.acted_last_step()
            && tells_user_to_act(text, &plan.shown)
        {
            match generation
                .call_probability
                .filter(|&p| self.explaining(Some(p)))
            {
                Some(p) => self.report(vec![Fired {
                    rule: Rule::CallNowGate,
                    detail: format!("held back \"call now\": a call had {:.3}%", p * 100.0),
                }]),
                None => {
                    tracing::debug!("correction: the reply tells the person to act");
                    self.push_turn(PromptRole::Assistant, text);
                    self.push_turn(PromptRole::User, messages::call_now(&self.request_text));
                    return Some(Attempt::CallNow);
                }
            }
        }
        // The policy's calls-only retry: a tiny model that has called
        // nothing yet and answers in prose while a tool plainly fits cannot
        // fail the same way again.
        let fired = self.calls_only_retry(
            text,
            &plan.shown,
            &plan.offered,
            plan.first_step,
            generation.call_probability,
        )?;
        Some(self.retry_as_calls(text, fired))
    }

    /// Sends a prose reply back with the calls-only retry's note, reporting
    /// the rule that asked for it.
    fn retry_as_calls(&mut self, text: &str, fired: Fired) -> Attempt {
        self.report(vec![fired]);
        self.push_turn(PromptRole::Assistant, text);
        self.push_turn(PromptRole::User, messages::use_the_tool(&self.request_text));
        Attempt::NamedTool
    }

    /// The run's answer from a prose reply that stands: an echo of a result
    /// becomes its gist (step 7); the loop's own words and repeats are cut;
    /// the policy may replace an answer that tells nothing of what was
    /// looked up. Emits it and ends the run, saying whether it answered.
    fn answer(&mut self, text: String, generation: &Generation, prompt: &[PromptMessage]) -> End {
        let text = match &self.last_result {
            Some(last) if echoes_a_result(&text, &self.results) => last.gist(&self.request_text),
            _ => text,
        };
        let text = match self.without_prompt_echoes(text, prompt) {
            Ok(text) => text,
            Err(no_answer) => {
                Span::current().record("wma.outcome", "no-answer");
                self.emit(AgentStreamPart::Text { text: no_answer });
                return End::Finish(FinishReason::Unrepaired);
            }
        };
        // A reply the token limit cut is an answer that may be incomplete,
        // unless what was cut was a repeat.
        let mut reason = if generation.finish_reason.as_deref() == Some("length") {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let text = match crate::prompt::cut_repeats(&text) {
            Some(cut) => {
                reason = FinishReason::Stop;
                self.report(vec![Fired {
                    rule: Rule::CutRepeats,
                    detail: format!(
                        "cut the answer at its first repeat ({} of {} characters kept)",
                        cut.chars().count(),
                        text.chars().count()
                    ),
                }]);
                cut
            }
            None => text,
        };
        let text = match &self.rules.answered {
            Some(found)
                if self.policy.answer_after_lookup
                    && !tells_of(&text, found, &self.request_text) =>
            {
                self.report(vec![Fired {
                    rule: Rule::AnswerAfterLookup,
                    detail: "an answer that told nothing the lookup found became its gist"
                        .to_string(),
                }]);
                found.gist(&self.request_text)
            }
            _ => text,
        };
        let (text, reason) = match &self.last_failure {
            Some(failure)
                if self.policy.say_ignored_failure && !acknowledges_failure(&text, failure) =>
            {
                self.report(vec![Fired {
                    rule: Rule::SayIgnoredFailure,
                    detail: "the answer passed over the last failed call: it is said after it"
                        .to_string(),
                }]);
                (
                    format!("{text}\n\n{}", messages::ignored_failure(failure)),
                    FinishReason::Unrepaired,
                )
            }
            _ => (text, reason),
        };
        Span::current().record("wma.outcome", "answer");
        self.emit(AgentStreamPart::Text { text });
        End::Finish(reason)
    }

    /// How a bad reply is repaired (step 8): held to calls, or, where no
    /// offered tool relates to the request (`Policy::push_toward_related`),
    /// free to answer in text instead.
    fn repair_attempt(&self, plan: &StepPlan) -> Attempt {
        if !(plan.unrelated && self.constrains(&plan.shown)) {
            return Attempt::Repair;
        }
        self.report(vec![Fired {
            rule: Rule::PushTowardRelated,
            detail: "the repair may answer in text: no tool offered relates to the request"
                .to_string(),
        }]);
        Attempt::RepairOrAnswer
    }

    /// Why the first attempt's call threshold is held back, if it is. The
    /// threshold settles prose or a call in favour of a call on little
    /// weight; that takes the evidence a calls-only retry would take
    /// (`threshold_on_evidence`, first step) and a tool the conversation
    /// can fill: when every tool offered requires more numbers, or a
    /// string, than it gives, whether to call is left to the model; and,
    /// under `push_toward_related`, a tool that relates to the request.
    fn threshold_held_back(
        &self,
        shown: &[ToolDefinition],
        offered: &[ToolDefinition],
        first_step: bool,
        unrelated: bool,
        request: &GenerateRequest,
    ) -> Option<Fired> {
        let threshold = request.decoding.call_threshold;
        if threshold.is_none() || offered.is_empty() {
            return None;
        }
        if self.policy.threshold_on_evidence
            && first_step
            && self
                .calls_only_retry("", shown, offered, true, threshold)
                .is_none()
        {
            return Some(Fired {
                rule: Rule::ThresholdOnEvidence,
                detail: "no call threshold: the request names no shown tool, asks no change a tool makes and seeks nothing a read-only tool looks up".to_string(),
            });
        }
        if unrelated {
            return Some(Fired {
                rule: Rule::PushTowardRelated,
                detail: "no call threshold: no tool offered relates to the request".to_string(),
            });
        }
        let lacks_numbers = |o: &ToolDefinition| {
            // The shown form: the offered one may hold its numbers to
            // those written, which no longer reads as requiring them.
            self.policy.ground_numbers
                && shown.iter().find(|t| t.name == o.name).is_some_and(|t| {
                    short_of_numbers(t, &self.rules.identifiers, &self.request_text)
                })
        };
        let lacks_strings = |o: &ToolDefinition| self.short_of_strings.contains(&o.name);
        let (rule, what) = if offered.iter().all(lacks_numbers) {
            (Rule::GroundNumbers, "numbers")
        } else if offered.iter().all(|o| lacks_numbers(o) || lacks_strings(o)) {
            (Rule::GroundStrings, "numbers or a string")
        } else {
            return None;
        };
        Some(Fired {
            rule,
            detail: format!(
                "no call threshold: every tool offered requires more {what} than the conversation gives"
            ),
        })
    }

    /// Why a call of `reply` looks made up ([`made_up_value`], against the
    /// tool's schema as `shown`: the offered one lists phrases for every
    /// free string), if one does. A retried call's values must come from
    /// what the conversation wrote: the person's words and the results.
    fn made_up_call(&self, reply: &ParsedReply, shown: &[ToolDefinition]) -> Option<String> {
        let written = std::iter::once(self.request_text.as_str())
            .chain(self.results.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("\n");
        reply.calls.iter().find_map(|c| {
            let schema = shown
                .iter()
                .find(|t| t.name == c.name)
                .map_or(&Value::Null, |t| &t.input_schema);
            made_up_value(&c.arguments, schema, &written).map(|why| format!("{} {why}", c.name))
        })
    }

    /// The calls-only retry a prose reply gets, if any, and the rule that
    /// takes it: the request names a shown tool and the model gave a call
    /// at least `named_tool_retry` (`call_probability`: what the provider
    /// reported), or the request asks for a change a tool makes, or (on the
    /// first step) seeks what a read-only tool looks up.
    fn calls_only_retry(
        &self,
        reply: &str,
        shown: &[ToolDefinition],
        offered: &[ToolDefinition],
        first_step: bool,
        call_probability: Option<f32>,
    ) -> Option<Fired> {
        if offered.is_empty() || !self.constrains(shown) {
            return None;
        }
        let (rule, why) = if let Some(min) = self.policy.named_tool_retry
            && first_step
            && call_probability.is_some_and(|p| p >= min)
            && names_a_tool(
                &self.request_text,
                shown,
                &self.rules.identifiers,
                &self.short_of_strings,
            ) {
            (Rule::NamedToolRetry, "the request names a tool")
        } else if self.policy.change_request_retry
            && self
                .rules
                .change_still_owed(&self.request_text, shown, offered, first_step)
        {
            (
                Rule::ChangeRequestRetry,
                "the request asks for a change a tool makes",
            )
        } else if self.policy.question_lookup_retry
            && first_step
            && self.rules.lookup_owed(&self.request_text, shown, offered)
        {
            (
                Rule::QuestionLookupRetry,
                "a read-only tool looks up what the request asks",
            )
        } else if self.policy.described_call_retry && writes_a_call(reply, offered) {
            (
                Rule::DescribedCallRetry,
                "the reply wrote a call to an offered tool in the wrong form",
            )
        } else {
            return None;
        };
        Some(Fired {
            rule,
            detail: format!("retried a prose reply as calls only: {why}"),
        })
    }

    /// Whether a reply whose first token gave a call this probability was
    /// explaining, not withholding a call: under the least probability of
    /// [`Policy::call_now_min_probability`], which gates the "call now"
    /// correction. The lookup retry is not gated: a lookup changes nothing,
    /// and a tiny model gives one almost no weight before a question about
    /// the person's own data ("What do I still have to do?": 0.01–0.03%).
    fn explaining(&self, call_probability: Option<f32>) -> bool {
        matches!(
            (self.policy.call_now_min_probability, call_probability),
            (Some(min), Some(p)) if p < min
        )
    }

    /// An answer without its lines that repeat the prompt; one that was
    /// nothing else becomes the gist of the last result, when there is one.
    fn without_prompt_echoes(
        &self,
        text: String,
        prompt: &[PromptMessage],
    ) -> Result<String, String> {
        let Some(kept) = without_prompt_echoes(&text, prompt) else {
            return Ok(text);
        };
        let (text, detail) = match (&self.last_result, kept.is_empty()) {
            (_, false) => (Ok(kept), "cut the answer's lines that repeat the prompt"),
            (Some(last), true) => (
                Ok(last.gist(&self.request_text)),
                "an answer that repeats the prompt became the last result's gist",
            ),
            // Nothing found to tell of: the run has no answer, and says
            // what went wrong if a call failed.
            (None, true) => (
                Err(match &self.last_failure {
                    Some(failure) => messages::not_done(failure),
                    None => messages::NO_ANSWER.to_string(),
                }),
                "an answer that only repeats the prompt is no answer",
            ),
        };
        self.report(vec![Fired {
            rule: Rule::NoPromptEchoAnswers,
            detail: detail.to_string(),
        }]);
        text
    }

    /// What a free string may be biased toward copying: the phrases of the
    /// person's messages and, under [`Policy::ground_strings`], every
    /// string the run has seen (what the person dictated, the pieces of
    /// the results, the values the instructions state). A bias, never a
    /// limit: a value that needs the model's own knowledge (a zone name, a
    /// query) stays writable.
    fn copy_evidence(&self, shown: &[ToolDefinition]) -> Vec<String> {
        let mut phrases = copy_phrases(
            self.messages.iter().filter_map(|m| match m {
                ChatMessage::User { content } => Some(content.as_str()),
                _ => None,
            }),
            shown,
        );
        if self.policy.ground_strings {
            for choice in self.rules.identifiers.string_choices(shown) {
                if phrases.len() >= crate::ground::MAX_COPY_PHRASES {
                    break;
                }
                if !phrases.contains(&choice) {
                    phrases.push(choice);
                }
            }
        }
        phrases
    }

    /// Picks the most tools (max_tools, then 4, 2, 1) and then the most
    /// history that fit the model; the newest user turn always stays.
    async fn fit(
        &self,
        ranked: &[ToolDefinition],
        page: Option<&PageContext>,
    ) -> Result<(GenerateRequest, Vec<ToolDefinition>, SystemChoice), End> {
        let mut counts: Vec<usize> = [self.max_tools, 4, 2, 1]
            .into_iter()
            .filter(|&n| n <= self.max_tools)
            .map(|n| n.min(ranked.len()))
            .collect();
        counts.dedup();
        let turns = window(&self.turns, HISTORY_TURNS);
        for &count in &counts {
            let shown = &ranked[..count];
            let (request, system) = self.build_request(shown, page, turns);
            if self.fits(&request).await? {
                return Ok((self.shaped(request, shown), shown.to_vec(), system));
            }
        }
        let fewest = &ranked[..counts.last().copied().unwrap_or(0)];
        let newest_user = turns
            .iter()
            .rposition(|t| t.role == PromptRole::User)
            .unwrap_or(0);
        for start in 1..=newest_user {
            let (request, system) = self.build_request(fewest, page, &turns[start..]);
            if self.fits(&request).await? {
                return Ok((self.shaped(request, fewest), fewest.to_vec(), system));
            }
        }
        Err(End::Error(messages::TOO_LONG.to_string()))
    }

    /// The fitted request with how its replies are shaped for `shown`:
    /// the policy's decoding and the phrases a copy bias favours. Made once
    /// per step, not for every fit attempt: neither changes the prompt.
    fn shaped(&self, mut request: GenerateRequest, shown: &[ToolDefinition]) -> GenerateRequest {
        // Only a copy bias reads the phrases: without one they are not
        // worth finding.
        if self.policy.copy_bias > 0.0 {
            request.copy_phrases = self.copy_evidence(shown);
        }
        request.decoding = self.policy.decoding(shown, &self.request_text);
        request
    }

    async fn fits(&self, request: &GenerateRequest) -> Result<bool, End> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(End::Finish(FinishReason::Aborted)),
            fits = self.provider.fits(request) => {
                fits.map_err(|e| End::Error(format!("{}{e}", messages::FAILED_PREFIX)))
            }
        }
    }

    /// The request for a step that shows `shown` on `page` with `turns` of
    /// the history, and which system prompt it carries.
    ///
    /// The run's system prompt is written again when the step shows what
    /// the model was last told of. When the page or the tools changed, a
    /// step whose window holds the whole history keeps that prompt and
    /// tells of the change in a page note at the end ([`page_note`]), so
    /// the prefix the provider cached holds through the navigation;
    /// otherwise (tools the chat template lists, or a window that moved
    /// on) it writes a new system prompt.
    fn build_request(
        &self,
        shown: &[ToolDefinition],
        page: Option<&PageContext>,
        turns: &[Turn],
    ) -> (GenerateRequest, SystemChoice) {
        let whole = turns.len() == self.turns.len();
        let kept = self.kept_system.as_ref();
        let serving = kept.filter(|k| k.serves(shown, page, whole));
        let noting =
            kept.filter(|_| serving.is_none() && self.tools_inline && whole && !shown.is_empty());
        let note = noting.map(|k| page_note(page, shown, &k.listed, self.provider.call_format()));
        let (system, listed) = match serving.or(noting) {
            Some(k) => (k.text.clone(), k.listed.as_slice()),
            None => (
                system_prompt(&SystemPromptInput {
                    page,
                    instructions: self.instructions.as_deref(),
                    sub_agents: &self.sub_agents,
                    tools: shown,
                    tools_inline: self.tools_inline,
                    call_format: self.provider.call_format(),
                }),
                shown,
            ),
        };
        let tools = if self.tools_inline {
            Vec::new()
        } else {
            listed
                .iter()
                .map(|t| ToolDefinition {
                    input_schema: compact_schema(&t.input_schema),
                    ..t.clone()
                })
                .collect()
        };
        let mut messages = prompt_messages(&system, turns, &self.untrusted);
        if let Some(note) = &note {
            messages.push(PromptMessage::new(PromptRole::System, note.clone()));
        }
        // The decoding shape and the copy phrases are not part of the
        // prompt: `shaped` adds them once the request fits.
        let request = GenerateRequest {
            messages,
            tools,
            constraint: None,
            max_new_tokens: None,
            copy_phrases: Vec::new(),
            decoding: Decoding::default(),
        };
        let system = match (serving, note) {
            (Some(_), _) => SystemChoice::Kept,
            (None, Some(note)) => SystemChoice::Noted(note),
            (None, None) => SystemChoice::Fresh,
        };
        (request, system)
    }

    /// Whether this step's attempts carry a constraint, without building
    /// one.
    fn constrains(&self, shown: &[ToolDefinition]) -> bool {
        self.constraints != ConstraintMode::Off
            && self.provider.supports_constraints()
            && !shown.is_empty()
    }

    /// The constraint for one attempt; `offered` is what the policy lets
    /// the step's attempts call.
    fn constraint(
        &self,
        attempt: Attempt,
        shown: &[ToolDefinition],
        offered: &[ToolDefinition],
    ) -> Option<Constraint> {
        if !self.constrains(shown) {
            return None;
        }
        let tools = offered.to_vec();
        match (self.constraints, attempt) {
            (ConstraintMode::Off, _) => None,
            (ConstraintMode::CallsOnly, _)
            | (
                ConstraintMode::Auto,
                Attempt::DelegatedFirst | Attempt::CallNow | Attempt::NamedTool | Attempt::Repair,
            ) => Some(Constraint::CallsOnly { tools }),
            (
                ConstraintMode::Auto,
                Attempt::First | Attempt::FailureCorrection | Attempt::RepairOrAnswer,
            ) => Some(Constraint::TextOrCalls { tools }),
        }
    }

    /// One generation, raced against Stop and the step timeout.
    async fn generate(
        &self,
        request: GenerateRequest,
        attempt: Attempt,
    ) -> Result<Generation, End> {
        let info = self.provider.info();
        let span = tracing::info_span!(
            "chat",
            otel.name = %format!("chat {}", info.model),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %info.provider,
            gen_ai.request.model = %info.model,
            gen_ai.usage.input_tokens = field::Empty,
            gen_ai.usage.output_tokens = field::Empty,
            gen_ai.usage.cached_tokens = field::Empty,
            gen_ai.response.finish_reasons = field::Empty,
            gen_ai.server.time_to_first_token = field::Empty,
            wma.attempt = attempt.as_str(),
            wma.constraint = request.constraint.as_ref().map(constraint_name).unwrap_or("none"),
            error.type = field::Empty,
        );
        let token = self.cancel.child_token();
        // Cancels the provider's work however this function ends: a lost
        // race, or the whole run dropped with its stream mid-generation.
        let _stop_provider = token.clone().drop_guard();
        let generation = self.provider.generate(request, token.clone());
        let outcome = async {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => Err(End::Finish(FinishReason::Aborted)),
                result = tokio::time::timeout(self.step_timeout, generation) => match result {
                    Err(_) => Err(End::Error(messages::TIMEOUT.to_string())),
                    Ok(Err(ProviderError::Cancelled)) if self.cancel.is_cancelled() => {
                        Err(End::Finish(FinishReason::Aborted))
                    }
                    Ok(Err(e)) => Err(End::Error(format!("{}{e}", messages::FAILED_PREFIX))),
                    Ok(Ok(g)) => Ok(g),
                },
            }
        }
        .instrument(span.clone())
        .await;
        match &outcome {
            Ok(g) => {
                if let Some(n) = g.input_tokens {
                    span.record("gen_ai.usage.input_tokens", i64::from(n));
                }
                if let Some(n) = g.output_tokens {
                    span.record("gen_ai.usage.output_tokens", i64::from(n));
                }
                if let Some(n) = g.cached_tokens {
                    span.record("gen_ai.usage.cached_tokens", i64::from(n));
                }
                if let Some(t) = g.time_to_first_token {
                    span.record("gen_ai.server.time_to_first_token", t.as_secs_f64());
                }
                let reason = g
                    .finish_reason
                    .clone()
                    .unwrap_or_else(|| "stop".to_string());
                span.record(
                    "gen_ai.response.finish_reasons",
                    field::display(format!("[\"{reason}\"]")),
                );
            }
            Err(End::Finish(_)) => {
                span.record("error.type", "cancelled");
            }
            Err(End::Error(message)) => {
                let kind = if message == messages::TIMEOUT {
                    "timeout"
                } else {
                    "provider_error"
                };
                span.record("error.type", kind);
            }
        }
        outcome
    }

    /// Runs a validated reply's calls in order; `raw` is the reply as the
    /// model wrote it, `prompt` what it was written to.
    async fn run_calls(
        &mut self,
        step: u32,
        mut reply: ParsedReply,
        raw: &str,
        prompt: &[PromptMessage],
    ) -> Option<End> {
        // Prose beside the calls that only repeats the prompt (the worked
        // example's "to call …, reply with:") is the loop's words, not the
        // model's: it is neither shown nor kept in the history, where the
        // model would copy it again on the next step.
        if let Some(kept) = without_prompt_echoes(&reply.text, prompt) {
            self.report(vec![Fired {
                rule: Rule::NoPromptEchoAnswers,
                detail: "cut the prose beside the calls that repeats the prompt".to_string(),
            }]);
            reply.text = kept;
        }
        let calls: Vec<ToolCall> = reply
            .calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                // Saturating: the history is the host's, whatever ids it holds.
                let step = self.call_steps_before.saturating_add(step);
                ToolCall::new(format!("call_{step}_{}", i + 1), c.name, c.arguments)
            })
            .collect();
        if !reply.text.is_empty() {
            self.emit(AgentStreamPart::Text {
                text: reply.text.clone(),
            });
        }
        let mut content = reply.text;
        if !content.is_empty() {
            content.push('\n');
        }
        content.push_str(&self.provider.call_format().write_all(&calls));
        // A reply that is these calls and nothing else, only laid out
        // otherwise (a constraint lets the model break lines and indent),
        // goes back as the model wrote it: the provider holds those very
        // tokens, so the next step's cached prefix runs on through them.
        let squash = |t: &str| t.split_whitespace().collect::<String>();
        if squash(raw) == squash(&content) {
            content = raw.trim().to_string();
        }
        self.push_turn(PromptRole::Assistant, content);
        // Whether every call of the step was a lookup that succeeded: the
        // restatement then asks for the answer.
        let mut only_lookups = true;
        for call in calls {
            if self.cancel.is_cancelled() {
                return Some(End::Finish(FinishReason::Aborted));
            }
            self.emit(AgentStreamPart::ToolCall {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            let span = tool_span(&call);
            let outcome = match self.approve(&call, &span).await {
                None => return Some(End::Finish(FinishReason::Aborted)),
                Some(Err(denied)) => {
                    span.record("error.type", denied.code.as_str());
                    Err(denied)
                }
                Some(Ok(asked)) => match self.before_send(&call, asked, &span).await {
                    Err(unrecorded) => {
                        span.record("error.type", unrecorded.code.as_str());
                        Err(unrecorded)
                    }
                    // Every call here passed `check_reply` against the
                    // schema the model was shown: the mark spares the tool
                    // set a second validation of the same arguments.
                    Ok(context) => match self
                        .call_tool(&call, &context.with_arguments_checked(), span)
                        .await
                    {
                        Some(outcome) => outcome,
                        None => return Some(End::Finish(FinishReason::Aborted)),
                    },
                },
            };
            if outcome.is_ok()
                && self.approvals.untrusted_seen.is_none()
                && self.untrusted.contains(&call.name)
            {
                self.approvals.untrusted_seen = Some(call.name.clone());
            }
            only_lookups &= outcome.is_ok() && self.rules.is_read_only(&call.name);
            touch_recent(&mut self.recent, &call.name);
            let answer = match &outcome {
                Ok(output) => output.clone(),
                Err(error) => error.to_string(),
            };
            let key = call_key(&call.name, &call.arguments);
            let repeated = self.seen.get(&key) == Some(&answer);
            self.seen.insert(key, answer.clone());
            let mut for_model = truncate_chars(&answer, RESULT_CHARS);
            let failed = outcome.is_err();
            match outcome {
                Ok(output) => {
                    self.emit(AgentStreamPart::ToolResult {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        output: output.clone(),
                    });
                    self.last_failure = None;
                    let new_ids = self.rules.identifiers.add_result(&output);
                    self.rules.called(
                        &call.name,
                        &call.arguments,
                        &output,
                        new_ids,
                        &self.request_text,
                    );
                    self.last_result = Some(Found::of_call(&call.arguments, &output));
                    self.results.push(output);
                }
                Err(error) => {
                    self.emit(AgentStreamPart::ToolError {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        error,
                    });
                    self.last_failure = Some(answer.clone());
                }
            }
            if repeated {
                if let Some(done) = self.rules.done_on_repeat(&self.policy, &call.name) {
                    let text = gist(done, &self.request_text);
                    self.report(vec![Fired {
                        rule: Rule::DoneOnRepeatedLookup,
                        detail: format!("{} repeated after an action succeeded", call.name),
                    }]);
                    Span::current().record("wma.outcome", "done");
                    self.emit(AgentStreamPart::Text { text });
                    return Some(End::Finish(FinishReason::Stop));
                }
                if self.loop_flagged {
                    Span::current().record("wma.outcome", "circles");
                    // What was done (or found) is worth more to the person
                    // than how the run ended; a call that kept failing is
                    // why it ended, and its error is what no rephrasing of
                    // the request can fix.
                    let done = match (&self.rules.last_action, &self.last_result) {
                        (Some(done), _) => Some(gist(done, &self.request_text)),
                        (None, Some(found)) => Some(found.gist(&self.request_text)),
                        (None, None) => None,
                    };
                    let failure = failed.then(|| messages::last_call_failed(&answer));
                    let text = done
                        .into_iter()
                        .chain(failure)
                        .chain([messages::CIRCLES.to_string()])
                        .collect::<Vec<_>>()
                        .join("\n\n");
                    self.emit(AgentStreamPart::Text { text });
                    return Some(End::Finish(FinishReason::Loop));
                }
                self.loop_flagged = true;
                for_model.push('\n');
                for_model.push_str(&messages::repeated_call(&call.name));
            }
            self.turns.push(Turn::result(&call.name, for_model));
        }
        self.rules.step_done();
        let restated = if only_lookups {
            messages::restate_after_lookup(&self.request_text)
        } else {
            messages::restate(&self.request_text)
        };
        self.push_turn(PromptRole::User, restated);
        None
    }

    /// Notes the step's tools for approvals: their annotations, and
    /// whether a result of an untrusted one is in the conversation already
    /// (a chat's earlier turn).
    fn observe_for_approvals(&mut self, tools: &[ToolDefinition]) {
        self.approvals.annotations = tools
            .iter()
            .map(|t| (t.name.clone(), t.annotations.clone()))
            .collect();
        if self.approvals.untrusted_seen.is_none() {
            self.approvals.untrusted_seen = self.messages.iter().find_map(|m| match m {
                ChatMessage::Tool {
                    name,
                    is_error: false,
                    ..
                } if self.untrusted.contains(name) => Some(name.clone()),
                _ => None,
            });
        }
    }

    /// Whether a validated call may run, by the approval policy and, when
    /// it says ask, the host's approver: `Some(Ok(asked))` runs it (`asked`:
    /// the policy said ask, and the call was approved), `Some(Err)` is the
    /// `denied` error the model gets, `None` means the run was stopped
    /// while it waited. Each decision is an event on the call's span.
    async fn approve(&mut self, call: &ToolCall, span: &Span) -> Option<Result<bool, ToolError>> {
        let a = &self.approvals;
        // A person said no to this tool in this run: not asked again.
        if let Some(denied) = a.refusals.second_request(&call.name) {
            tracing::info!(
                parent: span,
                wma.approval.decision = "denied",
                wma.approval.by = "run",
                "approval-decided"
            );
            return Some(Err(denied));
        }
        let annotations = a.annotations.get(&call.name).cloned().unwrap_or_default();
        let verdict = decide(
            &a.policy,
            &call.name,
            &annotations,
            &a.rules,
            a.untrusted_seen.as_deref(),
        );
        let reason = match verdict {
            Verdict::Run => return Some(Ok(false)),
            Verdict::Deny(reason) => {
                let why = reason.describe(&call.name);
                tracing::info!(
                    parent: span,
                    wma.approval.decision = "denied",
                    wma.approval.by = "policy",
                    wma.approval.reason = %why,
                    "approval-decided"
                );
                return Some(Err(ToolError::new(
                    ToolErrorCode::Denied,
                    format!("the approval policy does not allow this call: {why}"),
                )));
            }
            Verdict::Ask(reason) => reason,
        };
        // Nobody to ask: the loop as it was before approvals.
        let Some(approver) = a.approver.clone() else {
            return Some(Ok(true));
        };
        let untrusted = matches!(reason, Reason::Untrusted { .. });
        let why = reason.describe(&call.name);
        let approval_id = next_approval_id();
        // An "always" given earlier answers at once, except that an
        // approval given before untrusted content arrived does not cover
        // a call that asks because of it; a remembered "no" always holds.
        let remembered = a
            .remembered
            .get(&call.name)
            .cloned()
            .or_else(|| approver.remembered(&self.agent_name, &call.name))
            .filter(|r| !(untrusted && r.approved))
            .map(|r| r.by("session"));
        let answer = match remembered {
            Some(answer) => answer,
            None => {
                self.emit(AgentStreamPart::ApprovalRequested {
                    approval_id: approval_id.clone(),
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    reason: why.clone(),
                });
                tracing::info!(
                    parent: span,
                    wma.approval.id = %approval_id,
                    wma.approval.reason = %why,
                    "approval-requested"
                );
                let request = ApprovalRequest {
                    approval_id: approval_id.clone(),
                    agent: self.agent_name.clone(),
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    arguments: call.arguments.clone(),
                    reason: why,
                };
                let limit = self.approvals.policy.timeout;
                tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => {
                        tracing::info!(
                            parent: span,
                            wma.approval.id = %approval_id,
                            wma.approval.decision = "stopped",
                            "approval-decided"
                        );
                        span.record("error.type", "cancelled");
                        return None;
                    }
                    answer = approver.ask(request) => answer,
                    _ = tokio::time::sleep(limit) => ApprovalAnswer::deny()
                        .by("timeout")
                        .with_note(format!("nobody answered within {} s", limit.as_secs())),
                }
            }
        };
        if answer.remember && answer.by != "session" {
            self.approvals
                .remembered
                .insert(call.name.clone(), answer.clone());
        }
        self.approvals.refusals.record(&call.name, &answer);
        let decision = if answer.approved {
            "approved"
        } else {
            "denied"
        };
        tracing::info!(
            parent: span,
            wma.approval.id = %approval_id,
            wma.approval.decision = decision,
            wma.approval.by = %answer.by,
            wma.approval.remember = answer.remember,
            "approval-decided"
        );
        self.emit(AgentStreamPart::ApprovalDecided {
            approval_id,
            call_id: call.id.clone(),
            name: call.name.clone(),
            approved: answer.approved,
            by: answer.by.clone(),
            remember: answer.remember,
        });
        if answer.approved {
            return Some(Ok(true));
        }
        let message = match (answer.by.as_str(), answer.note) {
            (_, Some(note)) => format!("the call was not approved: {note}"),
            ("session", None) => {
                "the person said no to this tool for the rest of the session".to_string()
            }
            (_, None) => "the person did not approve this call".to_string(),
        };
        Some(Err(ToolError::new(ToolErrorCode::Denied, message)))
    }

    /// Records a call that may run with the host before it is sent, when
    /// it needs a record ([`needs_record`]: a consequential tool, or a call
    /// that asked) and the run has an approver: what goes with the call to
    /// its source (the record's idempotency key), or the error the model
    /// gets instead of the call when it could not be recorded (the call is
    /// never sent unrecorded).
    async fn before_send(
        &self,
        call: &ToolCall,
        asked: bool,
        span: &Span,
    ) -> Result<CallContext, ToolError> {
        let annotations = self
            .approvals
            .annotations
            .get(&call.name)
            .cloned()
            .unwrap_or_default();
        let Some(approver) = &self.approvals.approver else {
            return Ok(CallContext::new());
        };
        if !needs_record(&annotations, asked) {
            return Ok(CallContext::new());
        }
        let request = CallRecordRequest {
            agent: self.agent_name.clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
            annotations,
            asked,
        };
        match approver.before_call(&request).await {
            Ok(Some(key)) => {
                tracing::info!(parent: span, wma.idempotency_key = %key, "call-recorded");
                Ok(CallContext::new().with_idempotency_key(key))
            }
            Ok(None) => Ok(CallContext::new()),
            Err(why) => {
                tracing::warn!(parent: span, tool = %call.name, error = %why, "the call could not be recorded; it is not sent");
                Err(ToolError::new(
                    ToolErrorCode::Denied,
                    format!("the host could not record the call before sending it: {why}"),
                ))
            }
        }
    }

    /// One call, raced against Stop, in its `execute_tool` span. `None`
    /// means the run was stopped.
    async fn call_tool(
        &self,
        call: &ToolCall,
        context: &CallContext,
        span: Span,
    ) -> Option<Result<String, ToolError>> {
        let token = self.cancel.child_token();
        // Cancels the call however this function ends, the run's stream
        // being dropped included.
        let _stop_call = token.clone().drop_guard();
        let result = async {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => None,
                result = self.tools.call_tool_with(&call.name, call.arguments.clone(), context, token.clone()) => Some(result),
            }
        }
        .instrument(span.clone())
        .await
        .map(|outcome| outcome.and_then(crate::error::error_framed_result));
        match &result {
            Some(Err(error)) => {
                span.record("error.type", error.code.as_str());
            }
            None => {
                span.record("error.type", "cancelled");
            }
            Some(Ok(_)) => {}
        }
        result
    }

    /// Reports rules that fired: a span event on the step (named after the
    /// rule, with `wma.rule` and `wma.detail`) and a stream part.
    fn report(&self, fired: Vec<Fired>) {
        for Fired { rule, detail } in fired {
            let name = rule.as_str();
            tracing::info!(wma.rule = name, wma.detail = %detail, "{name}");
            self.emit(AgentStreamPart::Rule {
                rule: name.to_string(),
                detail,
            });
        }
    }

    fn push_turn(&mut self, role: PromptRole, content: impl Into<String>) {
        self.turns.push(Turn::new(role, content));
    }

    /// Appends this step's new turns to the request already fitted, so a
    /// retry does not reshuffle tools or history.
    fn append_to(&self, request: &mut GenerateRequest) {
        let last_two = &self.turns[self.turns.len().saturating_sub(2)..];
        request.messages.extend(
            prompt_messages("", last_two, &self.untrusted)
                .into_iter()
                .skip(1),
        );
    }
}

/// The highest step of the loop's call ids (`call_{step}_{n}`) among the
/// calls after the last user message; 0 when there are none.
fn call_steps_before(messages: &[ChatMessage]) -> u32 {
    let start = messages
        .iter()
        .rposition(ChatMessage::is_user)
        .map_or(0, |i| i + 1);
    let step_of = |id: &str| -> Option<u32> {
        let (step, n) = id.strip_prefix("call_")?.split_once('_')?;
        n.parse::<u32>().ok()?;
        step.parse().ok()
    };
    messages[start..]
        .iter()
        .flat_map(|m| match m {
            ChatMessage::Assistant { tool_calls, .. } => {
                tool_calls.iter().filter_map(|c| step_of(&c.id)).collect()
            }
            ChatMessage::Tool { call_id, .. } => step_of(call_id).into_iter().collect(),
            _ => Vec::new(),
        })
        .max()
        .unwrap_or(0)
}

/// The `execute_tool` span of one call; its approval events and the
/// call itself go in it.
fn tool_span(call: &ToolCall) -> Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format!("execute_tool {}", call.name),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
        gen_ai.tool.type = "function",
        error.type = field::Empty,
    )
}

fn constraint_name(c: &Constraint) -> &'static str {
    match c {
        Constraint::TextOrCalls { .. } => "text-or-calls",
        Constraint::CallsOnly { .. } => "calls-only",
        Constraint::JsonSchema { .. } => "json-schema",
        Constraint::Grammar { .. } => "grammar",
    }
}

/// What is wrong with a reply, as the tool error that sends it back; `None`
/// when every call names a tool and has valid arguments (or there are none).
fn check_reply(
    raw: &str,
    reply: &ParsedReply,
    tools: &[ToolDefinition],
    shown: &[ToolDefinition],
    validators: &ValidatorCache,
) -> Option<ToolError> {
    if let Some(reason) = &reply.malformed {
        return Some(ToolError::new(
            ToolErrorCode::InvalidArguments,
            reason.clone(),
        ));
    }
    if raw.trim().is_empty() {
        return Some(ToolError::new(
            ToolErrorCode::InvalidArguments,
            messages::EMPTY_REPLY,
        ));
    }
    for call in &reply.calls {
        let Some(tool) = tools.iter().find(|t| t.name == call.name) else {
            // Name the tools the model was shown, not every tool the host has:
            // a list of a thousand names helps nobody.
            let names: Vec<&str> = shown.iter().map(|t| t.name.as_str()).collect();
            return Some(ToolError::new(
                ToolErrorCode::UnknownTool,
                format!(
                    "there is no tool named \"{}\". The tools are: {}.",
                    call.name,
                    names.join(", ")
                ),
            ));
        };
        match validators.validate(&tool.input_schema, &call.arguments) {
            Ok(()) => {}
            Err(ArgsError::Invalid(message)) => {
                return Some(ToolError::new(
                    ToolErrorCode::InvalidArguments,
                    format!("{} for {}", message, call.name),
                ));
            }
            // A tool whose own schema is broken cannot be called correctly;
            // tell the model so it picks another way instead of retrying.
            Err(error @ ArgsError::BadSchema(_)) => {
                return Some(ToolError::new(
                    ToolErrorCode::Unavailable,
                    format!("{}: {error}", call.name),
                ));
            }
        }
    }
    None
}

/// Key for loop detection: the tool and its arguments with object keys sorted,
/// so `{"a":1,"b":2}` and `{"b":2,"a":1}` are the same call.
fn call_key(name: &str, arguments: &Value) -> String {
    fn canonical(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), canonical(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    format!("{name}\u{0}{}", canonical(arguments))
}

fn touch_recent(recent: &mut Vec<String>, name: &str) {
    recent.retain(|n| n != name);
    recent.insert(0, name.to_string());
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether a plain reply admits that the last call failed. A reply that does
/// not is the "it worked!" a small model likes to make up.
fn acknowledges_failure(reply: &str, failure: &str) -> bool {
    let lower = reply.to_lowercase();
    if FAILURE_MARKERS.iter().any(|m| lower.contains(m)) {
        return true;
    }
    let message = failure
        .split_once("]: ")
        .map(|(_, m)| m)
        .unwrap_or(failure)
        .to_lowercase();
    let probe: String = message.chars().take(24).collect();
    probe.len() >= 8 && lower.contains(probe.trim())
}

/// Whether the person asked for something to be done (not just a question).
fn is_action_request(request: &str) -> bool {
    words(request).iter().any(|w| is_action_verb(w))
}

/// Whether a plain reply tells the person to do it themselves with a tool the
/// agent has right here ("click Add to cart").
fn tells_user_to_act(reply: &str, shown: &[ToolDefinition]) -> bool {
    if shown.is_empty() {
        return false;
    }
    let lower = reply.to_lowercase();
    if HAND_BACK_MARKERS.iter().any(|m| lower.contains(m)) {
        return true;
    }
    shown.iter().any(|t| {
        let name = t.name.to_lowercase();
        lower.contains(&name) || (name.contains('_') && lower.contains(&name.replace('_', " ")))
    })
}

/// Whether a plain reply only repeats an earlier tool result: nearly all of
/// its words come from one result, or it is that result.
fn echoes_a_result(reply: &str, results: &[String]) -> bool {
    let reply_words = words(reply);
    if reply_words.len() < 3 {
        return false;
    }
    let trimmed = reply.trim();
    results.iter().any(|result| {
        if result.trim() == trimmed {
            return true;
        }
        let result_words: std::collections::HashSet<String> = words(result).into_iter().collect();
        let shared = reply_words
            .iter()
            .filter(|w| result_words.contains(*w))
            .count();
        shared * 100 >= reply_words.len() * 85
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_are_numbered_after_those_of_the_turn_so_far() {
        let call =
            |id: &str| ChatMessage::assistant_calls("", vec![ToolCall::new(id, "t", json!({}))]);
        let result = |id: &str| ChatMessage::tool_result(id, "t", "ok");
        // An earlier turn's calls do not count; this turn's do.
        let history = vec![
            ChatMessage::user("first"),
            call("call_5_1"),
            result("call_5_1"),
            ChatMessage::user("second"),
            call("call_1_1"),
            call("call_2_3"),
            result("call_2_3"),
        ];
        assert_eq!(call_steps_before(&history), 2);
        assert_eq!(call_steps_before(&history[..4]), 0);
        // Ids the loop did not make are not its numbering.
        let foreign = vec![
            ChatMessage::user("go"),
            call("toolu_01"),
            call("call_x_1"),
            result("call_7"),
        ];
        assert_eq!(call_steps_before(&foreign), 0);
        assert_eq!(call_steps_before(&[]), 0);
    }

    #[test]
    fn call_key_ignores_key_order() {
        assert_eq!(
            call_key("t", &json!({"a": 1, "b": {"y": 2, "x": 1}})),
            call_key("t", &json!({"b": {"x": 1, "y": 2}, "a": 1}))
        );
        assert_ne!(
            call_key("t", &json!({"a": 1})),
            call_key("t", &json!({"a": 2}))
        );
    }

    #[test]
    fn failure_acknowledgement() {
        let failure = "Error [tool_failed]: product p-9 is out of stock";
        assert!(!acknowledges_failure("Done! It is in your cart.", failure));
        assert!(acknowledges_failure("Sorry, that did not work.", failure));
        assert!(acknowledges_failure(
            "Product p-9 is out of stock right now.",
            failure
        ));
    }

    #[test]
    fn action_requests_and_telling_the_user_to_act() {
        assert!(is_action_request("Please add two tents to my cart"));
        assert!(!is_action_request("What is the capital of France?"));
        let tools = vec![ToolDefinition::new("add_to_cart", "", json!({}))];
        assert!(tells_user_to_act("Click the Add to cart button.", &tools));
        assert!(tells_user_to_act(
            "You may add to cart from the page",
            &tools
        ));
        assert!(!tells_user_to_act("Paris is the capital.", &tools));
        assert!(!tells_user_to_act("Click it", &[]));
    }

    #[test]
    fn echo_detection() {
        let results =
            vec![r#"{"id": "p-17", "title": "Summit 30L Backpack", "price": 99}"#.to_string()];
        assert!(echoes_a_result(
            "id p-17 title Summit 30L Backpack price 99",
            &results
        ));
        assert!(!echoes_a_result(
            "I found the Summit 30L Backpack for you, it costs 99 dollars and is in stock.",
            &results
        ));
    }
}
