//! Delegation: sub-agents as tools of their parent, with their own tools,
//! a depth limit, Stop reaching them and tagged parts. How a sub-agent's run
//! nests in the exported trace is checked in the runtime's `span_tree` tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use webmcp_agents::agent::{
    AgentStreamPart, ChatMessage, FinishReason, GenerateRequest, ToolDefinition,
};
use webmcp_agents::runtime::{
    AgentConfig, DEFAULT_MAX_DELEGATION_DEPTH, ProviderSource, Runtime, RuntimeBuilder, TaggedPart,
    ToolSource,
};
use wma_testkit::{InMemoryToolHost, ScriptedProvider, ScriptedReply};

use crate::support::call;

/// Polls `condition` until it holds; panics (naming `what`) if it does not
/// within a generous bound, so a broken runtime fails instead of hanging.
pub(crate) async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A scripted model and the runtime source that serves it.
fn model(name: &str, replies: Vec<ScriptedReply>) -> (ScriptedProvider, ProviderSource) {
    let provider = ScriptedProvider::new(replies).with_model(name);
    let source = ProviderSource::shared(Arc::new(provider.clone()));
    (provider, source)
}

fn text(reply: &str) -> ScriptedReply {
    ScriptedReply::text(reply)
}

fn task(agent: &str, task: &str) -> ScriptedReply {
    ScriptedReply::text(call(agent, json!({"task": task})))
}

/// Everything the model was shown in one request: the prompt and the tools.
fn shown(request: &GenerateRequest) -> String {
    let mut all: Vec<String> = request.messages.iter().map(|m| m.content.clone()).collect();
    all.extend(request.tools.iter().map(|t| t.name.clone()));
    all.join("\n")
}

fn search_host() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        |_| Ok(json!([{"id": "p-17", "title": "Summit 30L Backpack"}]).to_string()),
    );
    host
}

fn cart_host() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart.",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
        ),
        |args| Ok(format!("added {}", args["product_id"].as_str().unwrap_or("?"))),
    );
    host
}

/// The parts of one agent, in order.
fn of<'a>(parts: &'a [TaggedPart], agent: &str) -> Vec<&'a AgentStreamPart> {
    parts
        .iter()
        .filter(|p| p.agent == agent)
        .map(|p| &p.part)
        .collect()
}

fn position(parts: &[TaggedPart], agent: &str, wanted: impl Fn(&AgentStreamPart) -> bool) -> usize {
    parts
        .iter()
        .position(|p| p.agent == agent && wanted(&p.part))
        .unwrap_or_else(|| panic!("no such part of {agent} in {parts:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_delegates_to_two_sub_agents_that_see_only_their_own_tools() {
    let (parent_model, parent_source) = model(
        "parent-model",
        vec![
            task("finder", "Find a backpack"),
            task("buyer", "Add p-17 to the cart"),
            text("Done: the Summit 30L Backpack is in your cart."),
        ],
    );
    let (finder_model, finder_source) = model(
        "finder-model",
        vec![
            text(&call("search_products", json!({"query": "backpack"}))),
            text("The best match is p-17, the Summit backpack."),
        ],
    );
    let (buyer_model, buyer_source) = model(
        "buyer-model",
        vec![
            text(&call("add_to_cart", json!({"product_id": "p-17"}))),
            text("I put p-17 in the basket for you."),
        ],
    );
    let search = search_host();
    let cart = cart_host();
    let runtime = RuntimeBuilder::new()
        .provider("parent", parent_source)
        .provider("finder", finder_source)
        .provider("buyer", buyer_source)
        .tool_source(ToolSource::shared("search", search.clone()))
        .tool_source(ToolSource::shared("cart", cart.clone()))
        .agent(
            AgentConfig::new("shopper")
                .with_provider("parent")
                .with_tool_sources(Vec::<String>::new())
                .with_sub_agents(["finder", "buyer"]),
        )
        .agent(
            AgentConfig::new("finder")
                .with_description("Finds products and their ids.")
                .with_provider("finder")
                .with_tool_sources(["search"]),
        )
        .agent(
            AgentConfig::new("buyer")
                .with_description("Adds a product to the cart by id.")
                .with_provider("buyer")
                .with_tool_sources(["cart"]),
        )
        .start()
        .await
        .unwrap();

    let parts = runtime
        .agent("shopper")
        .unwrap()
        .run(vec![ChatMessage::user("Buy me a backpack")])
        .await
        .unwrap()
        .collect_tagged()
        .await;

    // The parent's own run: two delegations, then its answer.
    let own = of(&parts, "shopper");
    assert!(
        parts
            .iter()
            .filter(|p| p.agent == "shopper")
            .all(|p| p.depth == 0)
    );
    assert_eq!(
        own.last(),
        Some(&&AgentStreamPart::Finish {
            reason: FinishReason::Stop
        })
    );
    assert!(
        parts.last().unwrap().ends_the_run(),
        "the parent's end comes last"
    );
    // Each sub-agent's final answer is the tool result its parent read.
    let results: Vec<(&str, &str)> = own
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::ToolResult { name, output, .. } => {
                Some((name.as_str(), output.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        [
            ("finder", "The best match is p-17, the Summit backpack."),
            ("buyer", "I put p-17 in the basket for you.")
        ]
    );
    // The sub-agents' parts reached the host, tagged, between the call
    // that started them and its result.
    for sub in ["finder", "buyer"] {
        let sub_parts: Vec<&TaggedPart> = parts.iter().filter(|p| p.agent == sub).collect();
        assert!(sub_parts.iter().all(|p| p.depth == 1), "{sub_parts:#?}");
        assert!(matches!(
            sub_parts.last().unwrap().part,
            AgentStreamPart::Finish {
                reason: FinishReason::Stop
            }
        ));
        let called = position(
            &parts,
            "shopper",
            |p| matches!(p, AgentStreamPart::ToolCall { name, .. } if name == sub),
        );
        let answered = position(
            &parts,
            "shopper",
            |p| matches!(p, AgentStreamPart::ToolResult { name, .. } if name == sub),
        );
        let first = position(&parts, sub, |_| true);
        let last = parts.iter().rposition(|p| p.agent == sub).unwrap();
        assert!(called < first && last < answered, "{parts:#?}");
    }

    // Isolation: each model was shown its own tools only.
    let parent_prompt = shown(&parent_model.requests()[0]);
    assert!(
        parent_prompt.contains("Some tools are helper agents"),
        "{parent_prompt}"
    );
    assert!(parent_prompt.contains("- finder: Finds products and their ids."));
    assert!(parent_prompt.contains("- buyer: Adds a product to the cart by id."));
    assert!(!parent_prompt.contains("search_products") && !parent_prompt.contains("add_to_cart"));
    for request in finder_model.requests() {
        let prompt = shown(&request);
        assert!(prompt.contains("search_products"));
        assert!(
            !prompt.contains("add_to_cart") && !prompt.contains("buyer"),
            "{prompt}"
        );
        assert!(!prompt.contains("helper agents"));
    }
    for request in buyer_model.requests() {
        let prompt = shown(&request);
        assert!(prompt.contains("add_to_cart"));
        assert!(
            !prompt.contains("search_products") && !prompt.contains("finder"),
            "{prompt}"
        );
    }
    // The sub-agent's task is its user message.
    assert!(shown(&finder_model.requests()[0]).contains("Find a backpack"));
    assert_eq!(search.calls().len(), 1);
    assert_eq!(cart.calls().len(), 1);
    assert_eq!(cart.calls()[0].arguments, json!({"product_id": "p-17"}));
    runtime.shutdown().await;
}

/// planner → middle → leaf, each with its own scripted model.
async fn chain(
    depth: Option<u32>,
    middle_replies: Vec<ScriptedReply>,
) -> (Runtime, ScriptedProvider, ScriptedProvider) {
    let (_, planner_source) = model(
        "planner-model",
        vec![task("middle", "Ask leaf for the time"), text("Done.")],
    );
    let (middle_model, middle_source) = model("middle-model", middle_replies);
    let (leaf_model, leaf_source) = model("leaf-model", vec![text("It is noon where I run.")]);
    let mut builder = RuntimeBuilder::new()
        .provider("planner", planner_source)
        .provider("middle", middle_source)
        .provider("leaf", leaf_source)
        .agent(
            AgentConfig::new("planner")
                .with_provider("planner")
                .with_sub_agents(["middle"]),
        )
        .agent(
            AgentConfig::new("middle")
                .with_provider("middle")
                .with_description("Asks leaf.")
                .with_sub_agents(["leaf"]),
        )
        .agent(
            AgentConfig::new("leaf")
                .with_provider("leaf")
                .with_description("Knows the time."),
        );
    if let Some(depth) = depth {
        builder = builder.max_delegation_depth(depth);
    }
    (builder.start().await.unwrap(), middle_model, leaf_model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegation_stops_at_the_depth_limit() {
    assert_eq!(DEFAULT_MAX_DELEGATION_DEPTH, 2);

    // Within the default limit, planner → middle → leaf nests two levels deep.
    let (runtime, _, leaf_model) = chain(
        None,
        vec![
            task("leaf", "What time is it?"),
            text("It is noon, I was told."),
        ],
    )
    .await;
    let parts = runtime
        .agent("planner")
        .unwrap()
        .run(vec![ChatMessage::user("Ask middle")])
        .await
        .unwrap()
        .collect_tagged()
        .await;
    let leaf_parts: Vec<&TaggedPart> = parts.iter().filter(|p| p.agent == "leaf").collect();
    assert!(
        !leaf_parts.is_empty() && leaf_parts.iter().all(|p| p.depth == 2),
        "{parts:#?}"
    );
    assert_eq!(leaf_model.requests().len(), 1);
    runtime.shutdown().await;

    // With the limit at 1, middle (at depth 1) is not offered leaf: its
    // prompt has no delegation note, its call to leaf is refused as an
    // unknown tool, and leaf's model is never asked.
    let (runtime, middle_model, leaf_model) = chain(
        Some(1),
        vec![
            task("leaf", "What time is it?"),
            text("I cannot reach anyone who knows the time from here."),
        ],
    )
    .await;
    let parts = runtime
        .agent("planner")
        .unwrap()
        .run(vec![ChatMessage::user("Ask middle")])
        .await
        .unwrap()
        .collect_tagged()
        .await;
    assert!(parts.last().unwrap().ends_the_run());
    assert!(parts.iter().all(|p| p.agent != "leaf"), "{parts:#?}");
    assert!(leaf_model.requests().is_empty());
    let middle_requests = middle_model.requests();
    assert!(!shown(&middle_requests[0]).contains("helper agents"));
    assert!(
        shown(&middle_requests[1]).contains("there is no tool named \"leaf\""),
        "{}",
        shown(&middle_requests[1])
    );
    let middle_answer = parts.iter().find_map(|p| match &p.part {
        AgentStreamPart::ToolResult { name, output, .. }
            if p.agent == "planner" && name == "middle" =>
        {
            Some(output.clone())
        }
        _ => None,
    });
    assert_eq!(
        middle_answer.as_deref(),
        Some("I cannot reach anyone who knows the time from here.")
    );

    // The same middle, asked by the host (depth 0), may still delegate to leaf.
    middle_model.push(task("leaf", "What time is it?"));
    middle_model.push(text("It is noon, I was told."));
    leaf_model.push(text("It is noon where I run."));
    let direct = runtime
        .agent("middle")
        .unwrap()
        .run(vec![ChatMessage::user("Ask leaf")])
        .await
        .unwrap()
        .collect_tagged()
        .await;
    assert!(
        direct.iter().any(|p| p.agent == "leaf" && p.depth == 1),
        "{direct:#?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_on_the_parent_stops_its_sub_agents() {
    let (_, parent_source) = model(
        "parent-model",
        vec![task("worker", "Think for a long time")],
    );
    // A reply that would take ten minutes: only Stop ends it.
    let (worker_model, worker_source) = model(
        "worker-model",
        vec![text("Finally done.").delayed(Duration::from_secs(600))],
    );
    let runtime = RuntimeBuilder::new()
        .provider("parent", parent_source)
        .provider("worker", worker_source)
        .agent(
            AgentConfig::new("parent")
                .with_provider("parent")
                .with_sub_agents(["worker"]),
        )
        .agent(AgentConfig::new("worker").with_provider("worker"))
        .start()
        .await
        .unwrap();
    let parent = runtime.agent("parent").unwrap();
    let worker = runtime.agent("worker").unwrap();
    let mut run = parent
        .run(vec![ChatMessage::user("Delegate something slow")])
        .await
        .unwrap();
    wait_until("the worker's model is generating", || {
        worker_model.requests().len() == 1 && worker.active_runs() == 1
    })
    .await;

    assert!(
        parent.stop(run.id()).await.unwrap(),
        "the parent was running"
    );
    let mut parts = Vec::new();
    while let Some(part) = run.next_tagged().await {
        parts.push(part);
    }
    // The worker's run ended aborted and its end reached the host before
    // the parent's own end, which is the last part.
    let worker_end = position(&parts, "worker", |p| {
        *p == AgentStreamPart::Finish {
            reason: FinishReason::Aborted,
        }
    });
    assert_eq!(
        parts.last().map(|p| (&p.agent, &p.part)),
        Some((
            &"parent".to_string(),
            &AgentStreamPart::Finish {
                reason: FinishReason::Aborted
            }
        ))
    );
    assert!(worker_end < parts.len() - 1);
    wait_until("no run is left", || {
        worker.active_runs() == 0 && parent.active_runs() == 0
    })
    .await;
    assert_eq!(
        worker_model.remaining(),
        0,
        "the slow reply was taken, not finished"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_parents_stream_stops_its_sub_agents() {
    let (_, parent_source) = model(
        "parent-model",
        vec![task("worker", "Think for a long time")],
    );
    let (worker_model, worker_source) = model(
        "worker-model",
        vec![text("Finally done.").delayed(Duration::from_secs(600))],
    );
    let runtime = RuntimeBuilder::new()
        .provider("parent", parent_source)
        .provider("worker", worker_source)
        .agent(
            AgentConfig::new("parent")
                .with_provider("parent")
                .with_sub_agents(["worker"]),
        )
        .agent(AgentConfig::new("worker").with_provider("worker"))
        .start()
        .await
        .unwrap();
    let parent = runtime.agent("parent").unwrap();
    let worker = runtime.agent("worker").unwrap();
    let run = parent
        .run(vec![ChatMessage::user("Delegate")])
        .await
        .unwrap();
    wait_until("the worker is generating", || {
        worker_model.requests().len() == 1
    })
    .await;
    drop(run);
    wait_until("the worker's run ended", || {
        worker.active_runs() == 0 && parent.active_runs() == 0
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_parts_stay_between_the_call_that_started_it_and_its_result() {
    // One step, three delegations in a row: each sub-agent run's parts must
    // come after its call and before its result, never among another's.
    let calls = [1, 2, 3]
        .map(|i| call("echo_agent", json!({"task": format!("Task {i}")})))
        .join("\n");
    let (_, parent_source) = model(
        "parent-model",
        vec![text(&calls), text("All three are done.")],
    );
    let (_, echo_source) = model(
        "echo-model",
        vec![
            text("First answer."),
            text("Second answer."),
            text("Third answer."),
        ],
    );
    let runtime = RuntimeBuilder::new()
        .provider("parent", parent_source)
        .provider("echo", echo_source)
        .agent(
            AgentConfig::new("parent")
                .with_provider("parent")
                .with_sub_agents(["echo_agent"]),
        )
        .agent(AgentConfig::new("echo_agent").with_provider("echo"))
        .start()
        .await
        .unwrap();
    let parts = runtime
        .agent("parent")
        .unwrap()
        .run(vec![ChatMessage::user("Do three things")])
        .await
        .unwrap()
        .collect_tagged()
        .await;
    let mut expected = Vec::new();
    for (i, answer) in ["First answer.", "Second answer.", "Third answer."]
        .iter()
        .enumerate()
    {
        let id = format!("call_1_{}", i + 1);
        expected.push(format!("parent call {id}"));
        expected.extend([
            "echo_agent message-start".to_string(),
            format!("echo_agent text {answer}"),
            "echo_agent finish".to_string(),
        ]);
        expected.push(format!("parent result {id} {answer}"));
    }
    let seen: Vec<String> = parts
        .iter()
        .filter_map(|p| match &p.part {
            AgentStreamPart::ToolCall { call_id, .. } => {
                Some(format!("{} call {call_id}", p.agent))
            }
            AgentStreamPart::ToolResult {
                call_id, output, ..
            } => Some(format!("{} result {call_id} {output}", p.agent)),
            AgentStreamPart::MessageStart { .. } if p.depth == 1 => {
                Some(format!("{} message-start", p.agent))
            }
            AgentStreamPart::Text { text } if p.depth == 1 => {
                Some(format!("{} text {text}", p.agent))
            }
            AgentStreamPart::Finish { .. } if p.depth == 1 => Some(format!("{} finish", p.agent)),
            _ => None,
        })
        .collect();
    assert_eq!(seen, expected, "{parts:#?}");
    runtime.shutdown().await;
}

/// Records, as a host's approver does, which run each call it is told
/// about comes from.
#[derive(Default)]
struct WhoCalls {
    calls: parking_lot::Mutex<Vec<(String, String, String)>>,
}

#[async_trait::async_trait]
impl webmcp_agents::agent::Approver for WhoCalls {
    async fn ask(
        &self,
        _request: webmcp_agents::agent::ApprovalRequest,
    ) -> webmcp_agents::agent::ApprovalAnswer {
        webmcp_agents::agent::ApprovalAnswer::approve()
    }

    async fn before_call(
        &self,
        call: &webmcp_agents::agent::CallRecordRequest,
    ) -> Result<Option<String>, String> {
        let sub_run = TaggedPart::current_sub_run();
        self.calls
            .lock()
            .push((call.agent.clone(), sub_run.clone(), call.call_id.clone()));
        Ok(Some(format!("key-{sub_run}")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sub_agent_run_in_a_run_is_told_apart_in_its_parts_and_by_its_approver() {
    let (_, planner_source) = model(
        "planner-model",
        vec![
            task("middle", "Stamp the first form"),
            task("middle", "Stamp the second form"),
            text("Both are stamped."),
        ],
    );
    let (_, middle_source) = model(
        "middle-model",
        vec![
            task("leaf", "Stamp it"),
            text("Stamped."),
            task("leaf", "Stamp it"),
            text("Stamped."),
        ],
    );
    let stamp = call("stamp", json!({"form": "A"}));
    let (_, leaf_source) = model(
        "leaf-model",
        vec![text(&stamp), text("Done."), text(&stamp), text("Done.")],
    );
    let desk = Arc::new(InMemoryToolHost::new());
    desk.add(
        ToolDefinition::new(
            "stamp",
            "Stamps a form.",
            json!({"type": "object", "properties": {"form": {"type": "string"}}, "required": ["form"]}),
        )
        .with_annotations(webmcp_agents::agent::ToolAnnotations {
            consequential: true,
            ..Default::default()
        }),
        |_| Ok("stamped".to_string()),
    );
    let runtime = RuntimeBuilder::new()
        .provider("planner", planner_source)
        .provider("middle", middle_source)
        .provider("leaf", leaf_source)
        .tool_source(ToolSource::shared("desk", desk.clone()))
        .agent(
            AgentConfig::new("planner")
                .with_provider("planner")
                .with_sub_agents(["middle"]),
        )
        .agent(
            AgentConfig::new("middle")
                .with_provider("middle")
                .with_description("Has forms stamped.")
                .with_sub_agents(["leaf"]),
        )
        .agent(
            AgentConfig::new("leaf")
                .with_provider("leaf")
                .with_description("Stamps forms.")
                .with_tool_sources(["desk"]),
        )
        .start()
        .await
        .unwrap();
    let who = Arc::new(WhoCalls::default());
    let parts = runtime
        .agent("planner")
        .unwrap()
        .run_with(
            vec![ChatMessage::user("Stamp both forms")],
            tokio_util::sync::CancellationToken::new(),
            webmcp_agents::runtime::RunApprovals::asking(who.clone()),
        )
        .await
        .unwrap()
        .collect_tagged()
        .await;
    assert_eq!(desk.calls().len(), 2);

    // Both of `leaf`'s runs call `call_1_1`; the delegations that started
    // them tell them apart: the first `middle` run's first, the second's.
    let calls: Vec<(&str, &str, &str)> = parts
        .iter()
        .filter_map(|p| match &p.part {
            AgentStreamPart::ToolCall { call_id, .. } => {
                Some((p.agent.as_str(), p.sub_run.as_str(), call_id.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("planner", "", "call_1_1"),
            ("middle", "1", "call_1_1"),
            ("leaf", "1.1", "call_1_1"),
            ("planner", "", "call_2_1"),
            ("middle", "2", "call_1_1"),
            ("leaf", "2.1", "call_1_1"),
        ]
    );
    // Every part of one sub-agent run carries its id, its end included.
    for part in &parts {
        let expected = match part.agent.as_str() {
            "planner" => &[""][..],
            "middle" => &["1", "2"][..],
            _ => &["1.1", "2.1"][..],
        };
        assert!(expected.contains(&part.sub_run.as_str()), "{part:?}");
    }
    // The host's approver, told about each consequential call before it
    // is sent, knows which run makes it: the same id its parts carry.
    assert_eq!(
        *who.calls.lock(),
        [
            (
                "leaf".to_string(),
                "1.1".to_string(),
                "call_1_1".to_string()
            ),
            (
                "leaf".to_string(),
                "2.1".to_string(),
                "call_1_1".to_string()
            ),
        ]
    );
    // Outside an approver's call there is none.
    assert_eq!(TaggedPart::current_sub_run(), "");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_sub_agent_that_did_not_finish_is_a_tool_error_to_its_parent() {
    let (parent_model, parent_source) = model(
        "parent-model",
        vec![
            task("finder", "Find a backpack"),
            text("I could not find a backpack."),
        ],
    );
    // The finder repeats its search until the loop gives up on it.
    let search_call = call("search_products", json!({"query": "backpack"}));
    let (_finder_model, finder_source) = model(
        "finder-model",
        vec![
            text(&search_call),
            text(&search_call),
            text(&search_call),
            text("never read"),
        ],
    );
    let runtime = RuntimeBuilder::new()
        .provider("parent", parent_source)
        .provider("finder", finder_source)
        .tool_source(ToolSource::shared("search", search_host()))
        .agent(
            AgentConfig::new("shopper")
                .with_provider("parent")
                .with_tool_sources(Vec::<String>::new())
                .with_sub_agents(["finder"]),
        )
        .agent(
            AgentConfig::new("finder")
                .with_description("Finds products and their ids.")
                .with_provider("finder")
                .with_tool_sources(["search"]),
        )
        .start()
        .await
        .unwrap();
    let parts = runtime
        .agent("shopper")
        .unwrap()
        .run(vec![ChatMessage::user("Buy me a backpack")])
        .await
        .unwrap()
        .collect_tagged()
        .await;
    assert!(
        of(&parts, "finder").contains(&&AgentStreamPart::Finish {
            reason: FinishReason::Loop
        }),
        "the finder's run went in circles"
    );
    // The parent reads a tool error, not the loop's words as an answer.
    let own = of(&parts, "shopper");
    let error = own
        .iter()
        .find_map(|p| match p {
            AgentStreamPart::ToolError { name, error, .. } if name == "finder" => Some(error),
            _ => None,
        })
        .expect("the delegation failed");
    assert_eq!(error.code, webmcp_agents::agent::ToolErrorCode::ToolFailed);
    assert!(
        error.message.contains("did not finish"),
        "{}",
        error.message
    );
    assert!(
        !own.iter()
            .any(|p| matches!(p, AgentStreamPart::ToolResult { name, .. } if name == "finder"))
    );
    let shown_to_parent = shown(&parent_model.requests()[1]);
    assert!(
        !shown_to_parent.contains("going in circles"),
        "{shown_to_parent}"
    );
}
