//! The provider's KV cache across the steps and runs of agents: reusing a
//! cached prefix computes what a fresh model computes, and each agent run
//! keeps its own session, so a sub-agent does not evict its parent's prefix
//! and an agent's next run finds its system prompt computed.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    CallFormat, ChatMessage, ConstraintMode, GenerateRequest, Generation, LocalLoopOptions,
    ProgressFn, PromptMessage, PromptRole, Provider, ProviderError, ProviderInfo, ToolDefinition,
    policy::Policy, prompt::tool_line,
};
use webmcp_agents::runtime::{AgentConfig, ProviderSource, RuntimeBuilder, ToolSource};
use wma_provider_ort::{OrtProvider, OrtProviderOptions, cache_dir};
use wma_testkit::InMemoryToolHost;

use crate::support::call;

/// The tiny random-weight fp32 model of the set-up.
fn tiny_model() -> PathBuf {
    let dir = cache_dir()
        .expect("a cache folder")
        .join("models/tiny-random-llama");
    assert!(
        dir.join("onnx/model.onnx").is_file(),
        "the tiny test model is missing at {}: run scripts/setup.sh",
        dir.display()
    );
    dir
}

async fn load(options: OrtProviderOptions) -> OrtProvider {
    let provider = OrtProvider::new(options.with_threads(2))
        .expect("the ONNX Runtime library is set up (run scripts/setup.sh)");
    let dir = provider.model_dir();
    assert!(
        dir.join("config.json").exists(),
        "no model at {}: run scripts/setup.sh",
        dir.display()
    );
    provider
        .prepare(Arc::new(|_| {}), CancellationToken::new())
        .await
        .expect("the model loads");
    provider
}

fn tool(name: &str, description: &str) -> ToolDefinition {
    ToolDefinition::new(
        name,
        description,
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
    )
}

/// A short system prompt in the loop's layout: the stable text first, then
/// the tools shown this step (which change from step to step).
fn system(shown: &[ToolDefinition]) -> String {
    let mut text = String::from("You call tools.\nTools:\n");
    for t in shown {
        text.push_str(&tool_line(t));
        text.push('\n');
    }
    text
}

/// Reuse equals recompute: a four-step run whose tool selection changes
/// between steps (so the prompt's prefix holds only up to the tools, and
/// each step also appends the last reply and a result) gets, from the
/// provider that reuses its cache, the same logits and the same reply as a
/// fresh provider that computes every prompt whole. On both the copying
/// cache (plain graph) and the shared in-place buffers (GroupQueryAttention
/// graph) of the tiny fp32 model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_equals_recompute_across_a_run_whose_tools_change() {
    let dir = tiny_model();
    let tools = [
        tool("search", "Find items."),
        tool("open", "Open one item."),
        tool("add", "Add to the cart."),
        tool("cart", "Show the cart."),
    ];
    // The tools of each step: re-ranked, so both the set and the order move.
    let steps: [&[usize]; 4] = [&[0, 1], &[1, 0], &[1, 2], &[2, 3]];
    for variant in ["onnx/model.onnx", "onnx/model_gqa.onnx"] {
        if !dir.join(variant).is_file() {
            assert_eq!(variant, "onnx/model_gqa.onnx", "{variant} is missing");
            continue;
        }
        let options = || {
            OrtProviderOptions::default()
                .with_model(dir.to_string_lossy())
                .with_variant(variant)
                .with_max_new_tokens(6)
        };
        let reusing = load(options()).await;
        let fresh = load(options().with_reuse_prefix(false)).await;
        let mut history = vec![PromptMessage::new(
            PromptRole::User,
            "put item 7 in my cart",
        )];
        let mut cached = Vec::new();
        for (step, shown) in steps.iter().enumerate() {
            let shown: Vec<ToolDefinition> = shown.iter().map(|&i| tools[i].clone()).collect();
            let mut messages = vec![PromptMessage::new(PromptRole::System, system(&shown))];
            messages.extend(history.iter().cloned());
            let request = GenerateRequest {
                messages,
                ..GenerateRequest::default()
            };
            let ids = reusing.encode_prompt(&request).unwrap();
            let a = reusing
                .generate(request.clone(), CancellationToken::new())
                .await
                .unwrap();
            let b = fresh
                .generate(request.clone(), CancellationToken::new())
                .await
                .unwrap();
            assert_eq!(a.text, b.text, "{variant}, step {step}: the replies differ");
            assert_eq!(b.cached_tokens, Some(0), "the fresh provider recomputes");
            cached.push(a.cached_tokens.unwrap_or(0));
            // The logits of the whole prompt, through the cache the reply
            // left, against a cache emptied first.
            let with_cache = reusing.with_model(|m| m.logits_for(&ids)).unwrap().unwrap();
            let without = fresh.with_model(|m| m.logits_for(&ids)).unwrap().unwrap();
            let diff = with_cache
                .iter()
                .zip(&without)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                diff < 1e-3,
                "{variant}, step {step}: logits differ by {diff}"
            );
            history.push(PromptMessage::new(
                PromptRole::Assistant,
                call(&shown[0].name, json!({"id": "7"})),
            ));
            history.push(PromptMessage::new(PromptRole::Tool, format!("ok {step}")));
        }
        // Steps after the first found their common prefix in the cache: the
        // stable text before the tools at least.
        assert_eq!(cached[0], 0);
        assert!(
            cached[1..].iter().all(|&n| n > 0),
            "{variant}: cached tokens per step {cached:?}"
        );
    }
}

/// One generation as the steering provider saw it.
#[derive(Debug, Clone)]
struct Seen {
    /// The session it was asked in (`agent#run`).
    session: String,
    input_tokens: u32,
    cached_tokens: u32,
}

/// The real provider computes every prompt (one new token), and the reply
/// the loop reads comes from a script per agent: the run's prompts, cache
/// and counts are the model's own, its course is the test's.
struct Steered {
    inner: OrtProvider,
    replies: Mutex<HashMap<String, VecDeque<String>>>,
    seen: Mutex<Vec<Seen>>,
}

impl Steered {
    fn new(inner: OrtProvider, replies: &[(&str, &[String])]) -> Self {
        Self {
            inner,
            replies: Mutex::new(
                replies
                    .iter()
                    .map(|(agent, r)| (agent.to_string(), r.iter().cloned().collect()))
                    .collect(),
            ),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// What each agent's generations were served from the cache, in order.
    fn seen_by(&self, agent: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .iter()
            .filter(|s| s.session.split('#').next() == Some(agent))
            .cloned()
            .collect()
    }
}

#[async_trait]
impl Provider for Steered {
    fn info(&self) -> ProviderInfo {
        self.inner.info()
    }
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        self.inner.prepare(progress, cancel).await
    }
    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.generate_in_session("", request, cancel).await
    }
    async fn generate_in_session(
        &self,
        session: &str,
        mut request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        request.max_new_tokens = Some(1);
        let generation = self
            .inner
            .generate_in_session(session, request, cancel)
            .await?;
        let agent = session.split('#').next().unwrap_or_default().to_string();
        let text = self
            .replies
            .lock()
            .get_mut(&agent)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| panic!("no reply left for {agent}"));
        self.seen.lock().push(Seen {
            session: session.to_string(),
            input_tokens: generation.input_tokens.unwrap_or(0),
            cached_tokens: generation.cached_tokens.unwrap_or(0),
        });
        Ok(Generation { text, ..generation })
    }
    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        self.inner.fits(request).await
    }
    fn call_format(&self) -> CallFormat {
        self.inner.call_format()
    }
    fn tools_inline(&self) -> bool {
        self.inner.tools_inline()
    }
}

/// A shopper that hands the search to a finder, then answers; run twice.
/// Returns what the shopper's and the finder's generations were served from
/// the cache.
async fn delegated_runs(options: OrtProviderOptions) -> (Vec<Seen>, Vec<Seen>) {
    let delegate = call("finder", json!({"task": "Find a waterproof backpack"}));
    let answer = "The Summit 30L Backpack (p-17) is waterproof.".to_string();
    let shopper: Vec<String> = [delegate, answer].iter().cycle().take(4).cloned().collect();
    let finder: Vec<String> = [
        call("search_products", json!({"query": "waterproof backpack"})),
        "p-17, the Summit 30L Backpack.".to_string(),
    ]
    .iter()
    .cycle()
    .take(4)
    .cloned()
    .collect();
    let steered = Arc::new(Steered::new(
        load(options).await,
        &[("shopper", &shopper), ("finder", &finder)],
    ));
    let search = Arc::new(InMemoryToolHost::new());
    search.add(
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        |_| Ok(json!([{"id": "p-17", "title": "Summit 30L Backpack"}]).to_string()),
    );
    let loop_options = LocalLoopOptions {
        constraints: ConstraintMode::Off,
        policy: Some(Policy::reference()),
        ..LocalLoopOptions::default()
    };
    let runtime = RuntimeBuilder::new()
        .provider("model", ProviderSource::shared(steered.clone()))
        .tool_source(ToolSource::shared("search", search))
        .agent(
            AgentConfig::new("shopper")
                .with_provider("model")
                .with_tool_sources(Vec::<String>::new())
                .with_sub_agents(["finder"])
                .with_options(loop_options.clone()),
        )
        .agent(
            AgentConfig::new("finder")
                .with_description("Finds products and their ids.")
                .with_provider("model")
                .with_tool_sources(["search"])
                .with_options(loop_options),
        )
        .start()
        .await
        .unwrap();
    for _ in 0..2 {
        let parts = runtime
            .agent("shopper")
            .unwrap()
            .run(vec![ChatMessage::user("Find me a waterproof backpack")])
            .await
            .unwrap()
            .collect_tagged()
            .await;
        assert!(
            parts.iter().any(|p| p.agent == "finder"),
            "the shopper delegated: {parts:#?}"
        );
    }
    (steered.seen_by("shopper"), steered.seen_by("finder"))
}

/// Parent → sub-agent → parent on one provider: the parent's second step is
/// served from its own session (the whole first prompt), which the
/// sub-agent's run, in its own session, left alone; the parent's next run
/// starts from what its first computed. With one session for everybody
/// (the old behaviour) the sub-agent evicts the parent's prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_does_not_evict_its_parents_prefix() {
    let (shopper, finder) = delegated_runs(OrtProviderOptions::default()).await;
    assert_eq!(shopper.len(), 4, "{shopper:#?}");
    assert_eq!(finder.len(), 4, "{finder:#?}");
    let [first, second, next_run, _] = &shopper[..] else {
        unreachable!()
    };
    assert_ne!(first.session, finder[0].session, "one session per run");
    assert_eq!(first.session, second.session);
    assert_ne!(first.session, next_run.session, "a session per run");
    // The second step's prompt extends the first: all of the first prompt
    // comes from the parent's cache, although the finder ran in between.
    assert!(
        second.cached_tokens + 1 >= first.input_tokens,
        "parent step 2 served {} of its first prompt's {} tokens from the cache",
        second.cached_tokens,
        first.input_tokens
    );
    // The next run asks the same: its first prompt is the last run's first
    // prompt, computed already (one token is always computed anew).
    assert_eq!(next_run.cached_tokens + 1, next_run.input_tokens);

    let (shopper, _) = delegated_runs(OrtProviderOptions::default().with_kv_sessions(1)).await;
    assert!(
        shopper[1].cached_tokens * 2 < shopper[0].input_tokens,
        "with one shared session the finder evicts the shopper's prefix: {shopper:#?}"
    );
}
