//! `wma eval`: how well a model calls tools through the loop.
//!
//! - [`bfcl`]: records of the Berkeley Function Calling Leaderboard, each run
//!   through one loop step (rank, prompt, generate, parse, validate, and the
//!   loop's own corrections and repair), scored as BFCL's checker does, with
//!   constrained decoding off and on side by side.
//! - [`run_shop_task`]: the demo request run end to end against the demo
//!   shop; success is the right product in the cart.
//! - [`tasks`]: the task suite, scenario files run end to end through real
//!   tool sources (MCP servers, WebMCP pages, Rust tools, teams) and their
//!   end state checked; [`native`] has its Rust tool sets.
//! - [`usage`]: what a run cost the model (tokens, time), counted by a
//!   provider wrapper; the evaluation reports it per record and task, and
//!   the `wma` command prints it after a run.
//!
//! The harness reads the task suite's scenarios as configs, so it stands on
//! `wma-config` (which also holds the demo shop); it needs nothing of the
//! HTTP server, and the server nothing of it.

pub mod bfcl;
pub mod native;
pub mod tasks;
pub mod usage;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, ConstraintMode, LocalLoopOptions, Provider,
    ToolDefinition, parse_tool_calls, policy::Policy, validate_args,
};
use wma_agent::{
    CallFormat, GenerateRequest, Generation, ProgressFn, PromptMessage, PromptRole, ProviderError,
    ProviderInfo,
};
use wma_config::demo_shop::{self, Shop};
use wma_provider_openai::OpenAiProvider;
use wma_provider_ort::OrtProvider;
use wma_tools::NativeTools;

use crate::usage::{Usage, UsageMeter};
use bfcl::{MadeCall, Record};

/// What one category scored in one mode.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CategoryScore {
    /// Records run.
    pub records: usize,
    /// Generations made (first attempts, corrections and repairs).
    pub replies: usize,
    /// Generations that contained a call (readable or not).
    pub replies_with_call: usize,
    /// Calls written, readable or not.
    pub calls: usize,
    /// Of those, calls that parsed, named a shown tool and had valid arguments.
    pub valid_calls: usize,
    /// Calls the grammar shaped (see [`usage::Shaping::shaped`]), readable or not:
    /// the others were spelled in prose, which no constraint shapes.
    pub shaped_calls: usize,
    /// Of those, calls that parsed, named a shown tool and had valid arguments.
    pub shaped_valid_calls: usize,
    /// Records whose dispatched calls matched the ground truth (or, for
    /// irrelevance, made no call; for relevance, made one).
    pub correct: usize,
    /// How the category is scored (see [`bfcl::Expected::kind`]); empty
    /// for no records.
    pub kind: &'static str,
    /// Model usage.
    pub usage: Usage,
    /// How often each rule of the policy fired, by rule name.
    pub rules: BTreeMap<String, usize>,
}

impl CategoryScore {
    fn share(n: usize, of: usize) -> String {
        if of == 0 {
            "-".to_string()
        } else {
            format!("{:.0}%", 100.0 * n as f64 / of as f64)
        }
    }

    /// Share of replies with a call.
    pub fn call_rate(&self) -> String {
        Self::share(self.replies_with_call, self.replies)
    }

    /// Share of calls that parse and validate.
    pub fn valid_rate(&self) -> String {
        Self::share(self.valid_calls, self.calls)
    }

    /// Share of the calls the grammar shaped that parse and validate, with
    /// how many it shaped ("100% of 42"), or "-" for none.
    pub fn shaped_valid_rate(&self) -> String {
        match self.shaped_calls {
            0 => "-".to_string(),
            n => format!("{} of {n}", Self::share(self.shaped_valid_calls, n)),
        }
    }

    /// Exact-call, irrelevance or relevance accuracy.
    pub fn accuracy(&self) -> String {
        Self::share(self.correct, self.records)
    }
}

/// Options of an evaluation run.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Most tools shown per step.
    pub max_tools: usize,
    /// Time limit per generation.
    pub step_timeout: Duration,
    /// Whether the provider wants tools inline.
    pub tools_inline: bool,
    /// The loop's policy (`None`: picked by the model's name).
    pub policy: Option<Policy>,
}

/// Runs each record through one loop step and scores it.
pub async fn run_bfcl<P: Provider + 'static>(
    provider: &Arc<UsageMeter<P>>,
    records: &[Record],
    mode: ConstraintMode,
    options: &EvalOptions,
    mut on_record: impl FnMut(usize),
) -> CategoryScore {
    let mut score = CategoryScore {
        kind: records.first().map_or("", |r| r.expected.kind()),
        ..CategoryScore::default()
    };
    let mut generations = Vec::new();
    for (i, record) in records.iter().enumerate() {
        provider.take();
        let mut tools = NativeTools::new();
        for tool in &record.tools {
            tools.add_fn(tool.clone(), |_| Ok(r#"{"ok": true}"#.to_string()));
        }
        let request = AgentRunRequest::new(record.messages.clone(), Arc::new(tools));
        let loop_options = LocalLoopOptions {
            max_steps: 1,
            max_tools: options.max_tools,
            step_timeout: options.step_timeout,
            tools_inline: options.tools_inline,
            constraints: mode,
            policy: options.policy.clone(),
            ..LocalLoopOptions::default()
        };
        let parts: Vec<AgentStreamPart> =
            wma_agent::run_local_agent(provider.clone(), request, loop_options)
                .collect()
                .await;
        for part in &parts {
            if let AgentStreamPart::Rule { rule, detail } = part {
                *score.rules.entry(ledger_key(rule, detail)).or_default() += 1;
            }
        }
        let made: Vec<MadeCall> = parts
            .iter()
            .filter_map(|p| match p {
                AgentStreamPart::ToolCall {
                    name, arguments, ..
                } => Some(MadeCall {
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                _ => None,
            })
            .collect();
        let shaped = provider.take_shaped();
        let format = provider.call_format();
        tracing::debug!(
            record = %record.id,
            mode = ?mode,
            replies = ?shaped.iter().map(|(_, r)| r.text.as_str()).collect::<Vec<_>>(),
            correct = bfcl::score(&made, &record.expected),
            "evaluated"
        );
        for (shaping, reply) in &shaped {
            let (calls, valid) = count_calls(&reply.text, &record.tools);
            score.replies += 1;
            score.calls += calls;
            score.valid_calls += valid;
            if shaping.shaped(&reply.text, format) {
                score.shaped_calls += calls;
                score.shaped_valid_calls += valid;
            }
            if calls > 0 {
                score.replies_with_call += 1;
            }
        }
        generations.extend(shaped.into_iter().map(|(_, g)| g));
        score.records += 1;
        if bfcl::score(&made, &record.expected) {
            score.correct += 1;
        }
        on_record(i + 1);
    }
    score.usage = Usage::of(&generations);
    score
}

/// Calls written in a reply, and how many of them are valid.
fn count_calls(reply: &str, tools: &[ToolDefinition]) -> (usize, usize) {
    let parsed = parse_tool_calls(reply);
    let valid = parsed
        .calls
        .iter()
        .filter(|c| {
            tools
                .iter()
                .find(|t| t.name == c.name)
                .is_some_and(|t| validate_args(&t.input_schema, &c.arguments).is_ok())
        })
        .count();
    (
        parsed.calls.len() + usize::from(parsed.malformed.is_some()),
        valid,
    )
}

/// One BFCL row: the category, and its scores with constraints off and on
/// (`None` for a column that was not run).
pub type BfclRow = (String, Option<CategoryScore>, Option<CategoryScore>);

/// The BFCL table: one row per category, constraints off and on side by
/// side; a column that was not run shows "-".
pub fn bfcl_table(rows: &[BfclRow]) -> String {
    let mut out = String::new();
    out.push_str(
        "| category | n | replies with a call (off / on) | calls that parse and validate (off / on) | of the calls the grammar shaped (on) | accuracy (off / on) | tokens/s (off / on) |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|\n");
    let pair = |off: &Option<CategoryScore>,
                on: &Option<CategoryScore>,
                cell: &dyn Fn(&CategoryScore) -> String| {
        let show = |s: &Option<CategoryScore>| s.as_ref().map_or("-".to_string(), cell);
        format!("{} / {}", show(off), show(on))
    };
    for (name, off, on) in rows {
        let Some(any) = off.as_ref().or(on.as_ref()) else {
            continue;
        };
        let kind = any.kind;
        out.push_str(&format!(
            "| {name} ({kind}) | {} | {} | {} | {} | {} | {} |\n",
            any.records,
            pair(off, on, &|s| s.call_rate().to_string()),
            pair(off, on, &|s| s.valid_rate().to_string()),
            on.as_ref()
                .map_or("-".to_string(), CategoryScore::shaped_valid_rate),
            pair(off, on, &|s| s.accuracy().to_string()),
            pair(off, on, &|s| format!("{:.1}", s.usage.tokens_per_second())),
        ));
    }
    out
}

/// The name a rule event is counted under in a ledger: the rule's own, or
/// with "(stood down)" where it stood down for a request in another
/// language, which is no action of the rule.
pub fn ledger_key(rule: &str, detail: &str) -> String {
    if detail == wma_agent::policy::STOOD_DOWN {
        format!("{rule} (stood down)")
    } else {
        rule.to_string()
    }
}

/// The rules that fired with constraints on (`on` of each row), rule →
/// count per category; "no rule fired" when none did.
pub fn bfcl_ledger(rows: &[BfclRow]) -> String {
    let mut rules: Vec<&String> = rows
        .iter()
        .filter_map(|(_, _, on)| on.as_ref())
        .flat_map(|on| on.rules.keys())
        .collect();
    rules.sort();
    rules.dedup();
    if rules.is_empty() {
        return "no rule fired\n".to_string();
    }
    let names: Vec<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
    let mut out = format!("| rule | {} | all |\n", names.join(" | "));
    out.push_str(&format!("|---|{}---|\n", "---|".repeat(names.len())));
    for rule in rules {
        out.push_str(&format!("| {rule} |"));
        let mut all = 0;
        for (_, _, on) in rows {
            let n = on
                .as_ref()
                .and_then(|on| on.rules.get(rule).copied())
                .unwrap_or(0);
            all += n;
            out.push_str(&format!(" {n} |"));
        }
        out.push_str(&format!(" {all} |\n"));
    }
    out
}

/// One end-to-end run of the shop task.
#[derive(Debug, Clone, PartialEq)]
pub struct ShopRun {
    /// Whether the right product ended up in the cart.
    pub success: bool,
    /// Steps the loop took.
    pub steps: u32,
    /// How the run ended.
    pub end: String,
    /// Wall time.
    pub time: Duration,
    /// What was in the cart.
    pub cart: String,
}

/// Sums up runs of the shop task in a line: how many were solved, and the
/// steps and seconds a run took on average.
pub fn shop_summary(runs: &[ShopRun]) -> String {
    let solved = runs.iter().filter(|r| r.success).count();
    let steps: u32 = runs.iter().map(|r| r.steps).sum();
    let time: f64 = runs.iter().map(|r| r.time.as_secs_f64()).sum();
    format!(
        "shop task: solved {solved} of {} runs; {:.1} steps and {:.1} s per run on average",
        runs.len(),
        f64::from(steps) / runs.len().max(1) as f64,
        time / runs.len().max(1) as f64
    )
}

/// The product the demo request should end with in the cart.
pub const SHOP_TASK_PRODUCT: &str = "p-17";

/// A provider whose sampling can be seeded run by run.
///
/// Greedy runs of the shop task are all the same; sampled runs (a
/// temperature above zero) with one fixed seed would be too. Run `i` is
/// seeded with the base seed plus `i`, so the runs differ and each can be
/// repeated on its own.
pub trait SeedPerRun {
    /// Seeds the generations of run `run` (0-based).
    fn seed_run(&self, run: usize);
}

impl SeedPerRun for OrtProvider {
    fn seed_run(&self, run: usize) {
        let seed = self
            .options()
            .sampling
            .seed
            .map(|base| base.wrapping_add(run as u64));
        self.reseed(seed);
    }
}

impl SeedPerRun for OpenAiProvider {
    fn seed_run(&self, run: usize) {
        let seed = self
            .options()
            .seed
            .map(|base| base.wrapping_add(run as u64));
        self.reseed(seed);
    }
}

/// The provider an evaluation runs: a model on ONNX Runtime or one served
/// by an OpenAI-compatible server, each as its own provider makes it.
#[derive(Debug)]
pub enum EvalProvider {
    /// A model folder run by ONNX Runtime.
    Onnx(OrtProvider),
    /// A model behind an OpenAI-compatible server.
    Served(OpenAiProvider),
}

impl EvalProvider {
    fn inner(&self) -> &dyn Provider {
        match self {
            Self::Onnx(p) => p,
            Self::Served(p) => p,
        }
    }
}

#[async_trait]
impl Provider for EvalProvider {
    fn info(&self) -> ProviderInfo {
        self.inner().info()
    }
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        self.inner().prepare(progress, cancel).await
    }
    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.inner().generate(request, cancel).await
    }
    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        self.inner().fits(request).await
    }
    fn call_format(&self) -> CallFormat {
        self.inner().call_format()
    }
    fn tools_inline(&self) -> bool {
        self.inner().tools_inline()
    }
    fn supports_constraints(&self) -> bool {
        self.inner().supports_constraints()
    }
    fn parameters(&self) -> Option<u64> {
        self.inner().parameters()
    }
}

impl SeedPerRun for EvalProvider {
    fn seed_run(&self, run: usize) {
        match self {
            Self::Onnx(p) => p.seed_run(run),
            Self::Served(p) => p.seed_run(run),
        }
    }
}

/// Scores a server's own tool calling on BFCL: each record's messages and
/// tools sent once, as they are (no system prompt of the loop's, no
/// ranking, no parsing of the text, no correction or repair), the
/// answer's `tool_calls` taken as the calls made and scored as
/// [`run_bfcl`] scores the loop's.
pub async fn run_bfcl_direct(
    provider: &OpenAiProvider,
    records: &[Record],
    mut on_record: impl FnMut(usize),
) -> CategoryScore {
    let mut score = CategoryScore {
        kind: records.first().map_or("", |r| r.expected.kind()),
        ..CategoryScore::default()
    };
    let mut generations = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let messages: Vec<PromptMessage> = record
            .messages
            .iter()
            .filter_map(|m| match m {
                ChatMessage::User { content } => {
                    Some(PromptMessage::new(PromptRole::User, content.clone()))
                }
                ChatMessage::Assistant { content, .. } => {
                    Some(PromptMessage::new(PromptRole::Assistant, content.clone()))
                }
                ChatMessage::Tool { .. } => None,
            })
            .collect();
        let started = std::time::Instant::now();
        let reply = provider
            .direct(&messages, &record.tools, CancellationToken::new())
            .await;
        score.replies += 1;
        score.records += 1;
        let made: Vec<MadeCall> = match reply {
            Ok(reply) => {
                generations.push(Generation {
                    text: reply.content.clone(),
                    input_tokens: reply.input_tokens,
                    output_tokens: reply.output_tokens,
                    total_time: Some(started.elapsed()),
                    finish_reason: reply.finish_reason.clone(),
                    ..Generation::default()
                });
                if !reply.calls.is_empty() {
                    score.replies_with_call += 1;
                }
                score.calls += reply.calls.len();
                let mut made = Vec::new();
                for (name, arguments) in reply.calls {
                    let Some(arguments) = arguments else { continue };
                    let valid = record
                        .tools
                        .iter()
                        .find(|t| t.name == name)
                        .is_some_and(|t| validate_args(&t.input_schema, &arguments).is_ok());
                    if valid {
                        score.valid_calls += 1;
                    }
                    made.push(MadeCall { name, arguments });
                }
                made
            }
            Err(error) => {
                tracing::warn!(record = %record.id, %error, "the server failed");
                Vec::new()
            }
        };
        if bfcl::score(&made, &record.expected) {
            score.correct += 1;
        }
        on_record(i + 1);
    }
    score.usage = Usage::of(&generations);
    score
}

/// The BFCL table of a server's own tool calling ([`run_bfcl_direct`]).
pub fn bfcl_direct_table(rows: &[(String, CategoryScore)]) -> String {
    let mut out = String::from(
        "| category | n | replies with a call | calls that parse and validate | accuracy | tokens/s |\n|---|---|---|---|---|---|\n",
    );
    for (name, s) in rows {
        let kind = s.kind;
        out.push_str(&format!(
            "| {name} ({kind}) | {} | {} | {} | {} | {:.1} |\n",
            s.records,
            s.call_rate(),
            s.valid_rate(),
            s.accuracy(),
            s.usage.tokens_per_second()
        ));
    }
    out
}

impl<P: SeedPerRun + ?Sized> SeedPerRun for Arc<P> {
    fn seed_run(&self, run: usize) {
        (**self).seed_run(run)
    }
}

/// Runs the demo request `runs` times, each against a fresh shop.
pub async fn run_shop_task<P: Provider + SeedPerRun + 'static>(
    provider: Arc<P>,
    runs: usize,
    mode: ConstraintMode,
    max_steps: u32,
    policy: Option<Policy>,
    mut on_run: impl FnMut(usize, &ShopRun),
) -> Vec<ShopRun> {
    let mut results = Vec::new();
    for i in 0..runs {
        provider.seed_run(i);
        let shop = Shop::new();
        let request = AgentRunRequest::new(
            vec![ChatMessage::user(demo_shop::DEFAULT_REQUEST)],
            Arc::new(shop.tools()),
        );
        let options = LocalLoopOptions {
            max_steps,
            tools_inline: provider.tools_inline(),
            instructions: Some(demo_shop::INSTRUCTIONS.to_string()),
            constraints: mode,
            policy: policy.clone(),
            ..LocalLoopOptions::default()
        };
        let started = Instant::now();
        let parts: Vec<AgentStreamPart> =
            wma_agent::run_local_agent(provider.clone(), request, options)
                .collect()
                .await;
        let steps = parts
            .iter()
            .filter(|p| matches!(p, AgentStreamPart::MessageStart { .. }))
            .count() as u32;
        let end = match parts.last() {
            Some(AgentStreamPart::Finish { reason }) => reason.as_str().to_string(),
            Some(AgentStreamPart::Error { message }) => format!("error: {message}"),
            _ => "no end".to_string(),
        };
        let cart = shop.cart();
        let run = ShopRun {
            success: cart.iter().any(|l| l.product_id == SHOP_TASK_PRODUCT),
            steps,
            end,
            time: started.elapsed(),
            cart: shop.cart_line(),
        };
        on_run(i + 1, &run);
        results.push(run);
    }
    results
}

impl SeedPerRun for wma_agent::scripted::ScriptedProvider {
    /// A script answers the same on every run: nothing to seed.
    fn seed_run(&self, _run: usize) {}
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wma_agent::scripted::ScriptedProvider;

    use super::*;

    /// A rule that stood down for a request in another language did not
    /// act: the ledgers count it under a name of its own.
    #[test]
    fn a_rule_that_stood_down_is_counted_apart() {
        assert_eq!(
            ledger_key("read-only-questions", wma_agent::policy::STOOD_DOWN),
            "read-only-questions (stood down)"
        );
        assert_eq!(
            ledger_key("read-only-questions", "withheld add_todo"),
            "read-only-questions"
        );
    }

    fn record() -> Record {
        Record {
            id: "simple_0".to_string(),
            messages: vec![ChatMessage::user("What is the area of a 3 by 4 rectangle?")],
            tools: vec![ToolDefinition::new(
                "rectangle_area",
                "The area of a rectangle.",
                json!({
                    "type": "object",
                    "properties": {"width": {"type": "number"}, "height": {"type": "number"}},
                    "required": ["width", "height"]
                }),
            )],
            expected: bfcl::Expected::AnyCall,
        }
    }

    /// A call the model spelled in prose, which no grammar shaped, fails
    /// validation and is repaired under the calls-only constraint: the
    /// column of the calls the grammar shaped holds the repair alone, so a
    /// table tells a grammar that disagrees with a schema from prose that
    /// escaped it.
    #[tokio::test]
    async fn calls_spelled_in_prose_are_told_from_the_calls_the_grammar_shaped() {
        let scripted = ScriptedProvider::new([
            "Here it is: {\"name\": \"rectangle_area\", \"arguments\": {\"width\": 3}}",
            "{\"name\": \"rectangle_area\", \"arguments\": {\"width\": 3, \"height\": 4}}",
        ])
        .with_constraints(true);
        let provider = Arc::new(UsageMeter::new(Arc::new(scripted)));
        let options = EvalOptions {
            max_tools: 8,
            step_timeout: Duration::from_secs(5),
            tools_inline: true,
            policy: Some(Policy::reference()),
        };
        let score = run_bfcl(
            &provider,
            &[record()],
            ConstraintMode::Auto,
            &options,
            |_| {},
        )
        .await;
        assert_eq!((score.calls, score.valid_calls), (2, 1), "{score:?}");
        assert_eq!((score.shaped_calls, score.shaped_valid_calls), (1, 1));
        assert_eq!(score.shaped_valid_rate(), "100% of 1");
        let table = bfcl_table(&[("simple".to_string(), None, Some(score))]);
        assert!(table.contains("| - / 50% | 100% of 1 |"), "{table}");
    }
}
