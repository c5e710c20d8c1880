//! Every numbered step and note of the loop's reference, each with a named
//! test, run under the reference policy: the loop alone, none of the
//! small-model rules.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use webmcp_agents::agent::{
    AgentProfile, AgentRunRequest, AgentStreamPart, CallFormat, ChatMessage, Constraint,
    FinishReason, LocalLoopOptions, PageContext, PromptRole, SubAgentInfo, ToolAnnotations,
    ToolCall, ToolDefinition, ToolErrorCode, messages, policy::Policy, prompt::MAX_REQUEST_BYTES,
};
use wma_testkit::{InMemoryToolHost, ScriptedProvider, ScriptedReply};

use crate::support::*;

/// The loop's options under the reference policy, tools inline as the
/// scripted provider wants.
fn reference() -> LocalLoopOptions {
    LocalLoopOptions {
        policy: Some(Policy::reference()),
        ..inline()
    }
}

// 1. History -----------------------------------------------------------------

#[tokio::test]
async fn history_keeps_the_last_12_turns_starting_on_a_user_turn() {
    let mut conversation = Vec::new();
    for i in 0..10 {
        conversation.push(ChatMessage::user(format!("question {i}")));
        conversation.push(ChatMessage::assistant(format!("answer {i}")));
    }
    // 21 messages; the last 12 start at "answer 4", so the window starts at "question 5".
    conversation.push(ChatMessage::user("the newest question"));
    let provider = ScriptedProvider::new(["Fine."]);
    let request = AgentRunRequest::new(conversation, shop());
    let parts = run_all(provider.clone(), request, reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    let prompt = &provider.requests()[0];
    let turns = &prompt.messages[1..];
    assert_eq!(turns.len(), 11, "{turns:#?}");
    assert_eq!(turns[0].role, PromptRole::User);
    assert_eq!(turns[0].content, "question 5");
    assert_eq!(turns.last().unwrap().content, "the newest question");
}

#[tokio::test]
async fn history_writes_earlier_calls_in_the_providers_call_format() {
    let conversation = vec![
        ChatMessage::user("find a tent"),
        ChatMessage::assistant_calls(
            "",
            vec![ToolCall::new(
                "c1",
                "search_products",
                json!({"query": "tent"}),
            )],
        ),
        ChatMessage::tool_result("c1", "search_products", "[]"),
        ChatMessage::assistant("No tents."),
        ChatMessage::user("ok, thanks"),
    ];
    let provider = ScriptedProvider::new(["You're welcome."]).with_call_format(CallFormat::Hermes);
    let parts = run_all(
        provider.clone(),
        AgentRunRequest::new(conversation, shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let assistant = turns_with(&provider.requests()[0], PromptRole::Assistant);
    assert_eq!(
        assistant[0],
        "<tool_call>\n{\"name\": \"search_products\", \"arguments\": {\"query\": \"tent\"}}\n</tool_call>"
    );
}

#[tokio::test]
async fn history_cuts_tool_results_to_1500_characters() {
    let conversation = vec![
        ChatMessage::user("list everything"),
        ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "view_cart", json!({}))]),
        ChatMessage::tool_result("c1", "view_cart", "x".repeat(5000)),
        ChatMessage::assistant("Here it is."),
        ChatMessage::user("thanks"),
    ];
    let provider = ScriptedProvider::new(["Welcome."]);
    run_all(
        provider.clone(),
        AgentRunRequest::new(conversation, shop()),
        reference(),
    )
    .await;
    let tool = turns_with(&provider.requests()[0], PromptRole::Tool);
    assert_eq!(
        tool[0].chars().count(),
        1501,
        "1500 characters and the cut mark"
    );
}

// 2. Resume ------------------------------------------------------------------

fn resumed_conversation(result: ChatMessage) -> Vec<ChatMessage> {
    vec![
        ChatMessage::user("add p-17 to my cart"),
        ChatMessage::assistant_calls(
            "",
            vec![ToolCall::new(
                "c1",
                "add_to_cart",
                json!({"product_id": "p-17"}),
            )],
        ),
        result,
    ]
}

#[tokio::test]
async fn resume_after_a_tool_result_adds_the_next_step_turn() {
    let provider = ScriptedProvider::new(["It is in your cart."]);
    let conversation = resumed_conversation(ChatMessage::tool_result(
        "c1",
        "add_to_cart",
        r#"{"ok":true,"message":"Added p-17 to the cart"}"#,
    ));
    let parts = run_all(
        provider.clone(),
        AgentRunRequest::new(conversation, shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let last = provider.requests()[0].messages.last().unwrap().clone();
    assert_eq!(last.role, PromptRole::User);
    assert_eq!(last.content, messages::resume("add p-17 to my cart"));
}

#[tokio::test]
async fn resume_counts_the_finished_call_toward_loop_detection() {
    let same = call("add_to_cart", json!({"product_id": "p-17"}));
    // The resumed call counts as the first; this run repeats it twice.
    let provider = ScriptedProvider::new([same.clone(), same]);
    let conversation = resumed_conversation(ChatMessage::tool_result(
        "c1",
        "add_to_cart",
        r#"{"ok":true,"message":"Added p-17 to the cart"}"#,
    ));
    let parts = run_all(
        provider.clone(),
        AgentRunRequest::new(conversation, shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Loop);
    // The stop message leads with what the last result said.
    assert_eq!(
        texts(&parts).last().unwrap(),
        &format!("Added p-17 to the cart\n\n{}", messages::CIRCLES)
    );
}

#[tokio::test]
async fn resume_counts_the_finished_calls_failure_as_the_last_failure() {
    let provider = ScriptedProvider::new(["Great, it's done!", "Sorry, it is out of stock."]);
    let conversation = resumed_conversation(ChatMessage::tool_error(
        "c1",
        "add_to_cart",
        "Error [tool_failed]: product p-17 is out of stock",
    ));
    let parts = run_all(
        provider.clone(),
        AgentRunRequest::new(conversation, shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let second = prompt_text(&provider.requests()[1]);
    assert!(second.contains("Don't say it worked"), "{second}");
    assert_eq!(texts(&parts), vec!["Sorry, it is out of stock."]);
}

// 3. Tool ranking ------------------------------------------------------------

fn many_tools(n: usize) -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    for i in 0..n {
        host.add(
            ToolDefinition::new(
                format!("tool_{i}"),
                format!("Does thing number {i}."),
                json!({"type": "object", "properties": {}}),
            ),
            |_| Ok("ok".to_string()),
        );
    }
    host.add(
        ToolDefinition::new(
            "get_weather",
            "Get the weather forecast for a city.",
            json!({"type": "object", "properties": {"city": {"type": "string", "title": "City", "examples": ["Paris"]}}, "required": ["city"]}),
        ),
        |_| Ok("sunny".to_string()),
    );
    host
}

#[tokio::test]
async fn ranking_keeps_at_most_max_tools_best_first_with_compact_schemas() {
    let provider = ScriptedProvider::new(["It is sunny."]).with_tools_inline(false);
    let options = LocalLoopOptions {
        max_tools: 5,
        ..LocalLoopOptions::default()
    };
    run_all(
        provider.clone(),
        ask("What is the weather forecast in Paris?", many_tools(20)),
        options,
    )
    .await;
    let request = &provider.requests()[0];
    assert_eq!(request.tools.len(), 5);
    assert_eq!(
        request.tools[0].name, "get_weather",
        "the matching tool ranks first"
    );
    assert_eq!(
        request.tools[0].input_schema,
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    );
}

#[tokio::test]
async fn ranking_reads_the_tools_fresh_every_step() {
    let host = shop();
    let provider = ScriptedProvider::new([
        call("view_cart", json!({})),
        "Your cart has a backpack.".to_string(),
    ]);
    run_all(
        provider.clone(),
        ask("show my cart", host.clone()),
        reference(),
    )
    .await;
    assert_eq!(host.list_count(), 2);
}

#[tokio::test]
async fn ranking_gives_recently_used_tools_a_bonus() {
    // Only open_product matches the request. With two tools shown, the second
    // place goes to the first tool in the host's order, until view_cart is
    // used: then its recency bonus wins it the place.
    let provider = ScriptedProvider::new([call("view_cart", json!({})), "Done.".to_string()])
        .with_tools_inline(false);
    let options = LocalLoopOptions {
        max_tools: 2,
        ..LocalLoopOptions::default()
    };
    run_all(provider.clone(), ask("open the backpack", shop()), options).await;
    let shown = |i: usize| -> Vec<String> {
        provider.requests()[i]
            .tools
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(shown(0), vec!["open_product", "search_products"]);
    assert_eq!(shown(1), vec!["open_product", "view_cart"]);
}

// 4. Prompt fitting ----------------------------------------------------------

#[tokio::test]
async fn fitting_drops_to_4_2_then_1_tools() {
    let host = many_tools(12);
    // Measure the prompt with 1 and with 2 tools, then allow just between them.
    let probe = ScriptedProvider::new(["x"]);
    let options = LocalLoopOptions {
        max_tools: 1,
        tools_inline: true,
        ..LocalLoopOptions::default()
    };
    run_all(
        probe.clone(),
        ask("weather in Paris", host.clone()),
        options,
    )
    .await;
    let one_tool = ScriptedProvider::prompt_chars(&probe.requests()[0]);

    let provider = ScriptedProvider::new(["Sunny."]).with_max_prompt_chars(one_tool + 10);
    let parts = run_all(provider.clone(), ask("weather in Paris", host), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    let prompt = prompt_text(&provider.requests()[0]);
    assert!(prompt.contains("get_weather"), "the best tool stays");
    assert!(!prompt.contains("tool_0"), "the others were dropped");
}

#[tokio::test]
async fn fitting_drops_the_oldest_turns_but_keeps_the_newest_user_turn() {
    let mut conversation = Vec::new();
    for i in 0..5 {
        conversation.push(ChatMessage::user(format!(
            "old question {i} {}",
            "padding ".repeat(40)
        )));
        conversation.push(ChatMessage::assistant("old answer"));
    }
    conversation.push(ChatMessage::user("new question"));
    let host = Arc::new(InMemoryToolHost::new());
    let probe = ScriptedProvider::new(["x"]);
    run_all(
        probe.clone(),
        AgentRunRequest::new(vec![ChatMessage::user("new question")], host.clone()),
        reference(),
    )
    .await;
    let minimal = ScriptedProvider::prompt_chars(&probe.requests()[0]);

    let provider = ScriptedProvider::new(["Answer."]).with_max_prompt_chars(minimal + 400);
    let parts = run_all(
        provider.clone(),
        AgentRunRequest::new(conversation, host),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let request = &provider.requests()[0];
    assert!(request.messages.len() < 12, "old turns were dropped");
    assert_eq!(request.messages.last().unwrap().content, "new question");
}

#[tokio::test]
async fn fitting_fails_with_the_too_long_error() {
    let provider = ScriptedProvider::new(["never used"]).with_max_prompt_chars(10);
    let parts = run_all(provider.clone(), ask("hello", shop()), reference()).await;
    assert_error(&parts, "This request is too long for the on-device model.");
    assert_eq!(provider.remaining(), 1, "nothing was generated");
}

#[tokio::test]
async fn a_request_beyond_the_size_cap_gets_the_too_long_error_without_model_work() {
    let provider = ScriptedProvider::new(["never"]);
    let host = shop();
    let huge = "find a tent ".repeat((1 << 20) / 12 + 1);
    assert!(huge.len() > MAX_REQUEST_BYTES);
    assert!(huge.len() > 1 << 20, "a 1 MiB request");
    let parts = run_all(provider.clone(), ask(&huge, host.clone()), reference()).await;
    assert_error(&parts, messages::TOO_LONG);
    assert!(provider.requests().is_empty(), "no generation");
    assert!(host.calls().is_empty());
}

// 5. Generate ----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn generation_past_the_step_timeout_ends_with_the_timeout_error() {
    let provider =
        ScriptedProvider::new([ScriptedReply::text("late").delayed(Duration::from_secs(120))]);
    let options = LocalLoopOptions {
        step_timeout: Duration::from_secs(5),
        ..reference()
    };
    let parts = run_all(provider, ask("hi", shop()), options).await;
    assert_error(&parts, "The on-device model took too long.");
}

#[tokio::test]
async fn a_provider_failure_ends_with_the_failed_error() {
    let provider = ScriptedProvider::new([ScriptedReply::failure("out of memory")]);
    let parts = run_all(provider, ask("hi", shop()), reference()).await;
    assert_error(&parts, "The on-device model failed: out of memory");
}

#[tokio::test(start_paused = true)]
async fn stop_during_generation_finishes_aborted() {
    let provider =
        ScriptedProvider::new([ScriptedReply::text("late").delayed(Duration::from_secs(30))]);
    let request = ask("hi", shop());
    let cancel = request.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    });
    let parts = run_all(provider, request, reference()).await;
    assert_finish(&parts, FinishReason::Aborted);
    assert!(texts(&parts).is_empty());
}

// 6. Read before showing -----------------------------------------------------

#[tokio::test]
async fn prose_is_shown_only_after_the_reply_is_parsed_and_validated() {
    // The first reply has prose and a call with bad arguments: none of it is shown.
    let bad = format!(
        "Sure, adding it now! {}",
        call("add_to_cart", json!({"product_id": 17}))
    );
    let good = call("add_to_cart", json!({"product_id": "p-17"}));
    let provider = ScriptedProvider::new([bad, good, "It is in your cart.".to_string()]);
    let parts = run_all(provider, ask("add p-17 to my cart", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert!(
        !texts(&parts).iter().any(|t| t.contains("Sure")),
        "{parts:#?}"
    );
    // The whole reply arrives as one text part, not token by token.
    assert_eq!(texts(&parts), vec!["It is in your cart."]);
}

// 7. Corrections -------------------------------------------------------------

#[tokio::test]
async fn correction_a_reply_ignoring_the_failed_call_is_sent_back() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-404"})),
        "Done! It's in your cart.".to_string(),
        "Sorry, p-404 is out of stock.".to_string(),
    ]);
    let parts = run_all(
        provider.clone(),
        ask("add p-404 to my cart", shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let third = prompt_text(&provider.requests()[2]);
    assert!(third.contains("Error [tool_failed]: product p-404 is out of stock"));
    assert!(third.contains("Don't say it worked"));
    assert_eq!(texts(&parts), vec!["Sorry, p-404 is out of stock."]);
}

/// The reference shows a reply that passes over the failed call even after
/// the correction; the small-model policy keeps it but says the failure
/// after it, and the run ends `unrepaired` (a parent agent then gets a tool
/// error, not an answer).
#[tokio::test]
async fn an_answer_that_still_ignores_the_failed_call_is_followed_by_the_failure() {
    let script = || {
        ScriptedProvider::new([
            call("add_to_cart", json!({"product_id": "p-404"})),
            "Done! It's in your cart.".to_string(),
            "Your order is on its way.".to_string(),
        ])
    };
    let parts = run_all(script(), ask("add p-404 to my cart", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(texts(&parts), vec!["Your order is on its way."]);

    let small = LocalLoopOptions {
        policy: Some(Policy::small_model()),
        ..inline()
    };
    let parts = run_all(script(), ask("add p-404 to my cart", shop()), small).await;
    assert_finish(&parts, FinishReason::Unrepaired);
    assert_eq!(
        texts(&parts),
        vec![format!(
            "Your order is on its way.\n\n{}",
            messages::ignored_failure("Error [tool_failed]: product p-404 is out of stock")
        )]
    );
}

#[tokio::test]
async fn correction_b_telling_the_user_to_click_gets_call_now() {
    let provider = ScriptedProvider::new([
        "Click the Add to cart button on the product page.".to_string(),
        call("add_to_cart", json!({"product_id": "p-17"})),
        "Added.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("add p-17 to my cart", shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert!(prompt_text(&requests[1]).contains("you do it. Call now"));
    assert!(matches!(
        requests[0].constraint,
        Some(Constraint::TextOrCalls { .. })
    ));
    assert!(
        matches!(requests[1].constraint, Some(Constraint::CallsOnly { .. })),
        "the retry allows calls only"
    );
    assert!(
        parts
            .iter()
            .any(|p| matches!(p, AgentStreamPart::ToolCall { name, .. } if name == "add_to_cart"))
    );
}

#[tokio::test]
async fn correction_c_a_reply_that_echoes_a_result_is_replaced_by_its_gist() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-17"})),
        r#"{"ok": true, "message": "Added p-17 to the cart"}"#.to_string(),
    ]);
    let parts = run_all(provider, ask("add p-17 to my cart", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(texts(&parts), vec!["Added p-17 to the cart"]);
}

/// Prose beside a call that copies the worked example's words is the
/// loop's, not the model's: it is not shown, and the history keeps the call
/// without it, so the next step has nothing of it to copy.
#[tokio::test]
async fn prose_beside_a_call_that_repeats_the_worked_example_is_dropped() {
    let provider = ScriptedProvider::new([
        format!(
            "To call add_to_cart, reply with:\n{}",
            call("add_to_cart", json!({"product_id": "p-17"}))
        ),
        "Added p-17 to your cart.".to_string(),
    ]);
    let parts = run_all(
        provider.clone(),
        ask("add p-17 to my cart", shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(texts(&parts), vec!["Added p-17 to your cart."]);
    let history = turns_with(&provider.requests()[1], PromptRole::Assistant);
    assert_eq!(history.len(), 1);
    assert!(!history[0].contains("reply with"), "{history:?}");
    assert!(history[0].contains("p-17"), "{history:?}");
}

#[tokio::test]
async fn corrections_happen_once_per_step() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-404"})),
        "Done!".to_string(),
        "Done, really!".to_string(),
    ]);
    let parts = run_all(
        provider.clone(),
        ask("add p-404 to my cart", shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(
        provider.requests().len(),
        3,
        "one correction, then the reply is shown"
    );
    assert_eq!(texts(&parts), vec!["Done, really!"]);
}

// 8. Repair ------------------------------------------------------------------

#[tokio::test]
async fn repair_sends_an_unknown_tool_back_as_a_tool_error() {
    let provider = ScriptedProvider::new([
        call("add_item", json!({"product_id": "p-17"})),
        call("add_to_cart", json!({"product_id": "p-17"})),
        "Added.".to_string(),
    ]);
    let parts = run_all(provider.clone(), ask("add p-17", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    let tool_turns = turns_with(&provider.requests()[1], PromptRole::Tool);
    let repair = tool_turns.last().unwrap();
    assert!(repair.starts_with("Error [unknown_tool]:"), "{repair}");
    assert!(
        repair.contains("add_item") && repair.ends_with("Try again."),
        "{repair}"
    );
}

#[tokio::test]
async fn repair_names_the_invalid_argument() {
    let provider = ScriptedProvider::new([
        call(
            "add_to_cart",
            json!({"product_id": "p-17", "quantity": "two"}),
        ),
        call("add_to_cart", json!({"product_id": "p-17", "quantity": 2})),
        "Added two.".to_string(),
    ]);
    let parts = run_all(
        provider.clone(),
        ask("add two of p-17", shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let repair = turns_with(&provider.requests()[1], PromptRole::Tool)
        .pop()
        .unwrap();
    assert!(
        repair.starts_with("Error [invalid_arguments]:") && repair.contains("quantity"),
        "{repair}"
    );
}

#[tokio::test]
async fn repair_of_an_unreadable_call() {
    let provider = ScriptedProvider::new([
        r#"<tool_call>{"name": "view_cart", "arguments": {</tool_call>"#.to_string(),
        call("view_cart", json!({})),
        "One backpack.".to_string(),
    ]);
    let parts = run_all(provider.clone(), ask("show my cart", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    let repair = turns_with(&provider.requests()[1], PromptRole::Tool)
        .pop()
        .unwrap();
    assert!(repair.starts_with("Error [invalid_arguments]:"), "{repair}");
}

#[tokio::test]
async fn a_second_bad_reply_ends_the_run_with_an_apology() {
    let provider = ScriptedProvider::new([
        call("add_item", json!({})),
        call("add_item", json!({})),
        "never used".to_string(),
    ]);
    let parts = run_all(provider.clone(), ask("add p-17", shop()), reference()).await;
    // The run did not do what was asked, and its finish says so.
    assert_finish(&parts, FinishReason::Unrepaired);
    assert_eq!(texts(&parts), vec![messages::APOLOGY]);
    assert!(
        !parts
            .iter()
            .any(|p| matches!(p, AgentStreamPart::ToolCall { .. }))
    );
}

// 9. Run calls ---------------------------------------------------------------

#[tokio::test]
async fn calls_run_in_order_as_tool_call_then_result_or_error() {
    let both = format!(
        "{}\n{}",
        call("add_to_cart", json!({"product_id": "p-404"})),
        call("view_cart", json!({}))
    );
    let provider = ScriptedProvider::new([
        both,
        "p-404 is out of stock; your cart has a backpack.".to_string(),
    ]);
    let host = shop();
    let parts = run_all(
        provider,
        ask("add p-404 and show my cart", host.clone()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let names: Vec<String> = host.calls().iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, vec!["add_to_cart", "view_cart"]);
    let kinds: Vec<&str> = parts
        .iter()
        .map(|p| match p {
            AgentStreamPart::MessageStart { .. } => "start",
            AgentStreamPart::ToolCall { .. } => "call",
            AgentStreamPart::ToolResult { .. } => "result",
            AgentStreamPart::ToolError { .. } => "error",
            AgentStreamPart::Text { .. } => "text",
            AgentStreamPart::Finish { .. } => "finish",
            AgentStreamPart::Error { .. } => "run-error",
            AgentStreamPart::Rule { .. } => "rule",
            AgentStreamPart::ApprovalRequested { .. } | AgentStreamPart::ApprovalDecided { .. } => {
                "approval"
            }
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "start", "call", "error", "call", "result", "start", "text", "finish"
        ]
    );
    match &parts[2] {
        AgentStreamPart::ToolError { error, .. } => {
            assert_eq!(error.code, ToolErrorCode::ToolFailed)
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_request_is_restated_after_each_step() {
    let provider =
        ScriptedProvider::new([call("view_cart", json!({})), "One backpack.".to_string()]);
    run_all(provider.clone(), ask("show my cart", shop()), reference()).await;
    let second = &provider.requests()[1];
    let last = second.messages.last().unwrap();
    assert_eq!(last.role, PromptRole::User);
    assert_eq!(last.content, messages::restate("show my cart"));
}

#[tokio::test]
async fn the_request_is_restated_for_an_answer_after_a_lookup() {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "get_weather",
            "Current weather for a city.",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        )
        .with_annotations(ToolAnnotations {
            read_only: true,
            ..ToolAnnotations::default()
        }),
        |_| Ok("Sunny, 21 C".to_string()),
    );
    let provider = ScriptedProvider::new([
        call("get_weather", json!({"city": "Oslo"})),
        "Sunny, 21 C in Oslo.".to_string(),
    ]);
    run_all(provider.clone(), ask("weather in Oslo?", host), reference()).await;
    let last = provider.requests()[1].messages.last().unwrap().clone();
    assert_eq!(
        last.content,
        messages::restate_after_lookup("weather in Oslo?")
    );
}

#[tokio::test]
async fn a_result_framed_as_an_error_is_a_tool_error() {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "write_query",
            "Run a query that changes the database.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        |_| Ok("Error: Only SELECT queries are allowed".to_string()),
    );
    let provider = ScriptedProvider::new([
        call("write_query", json!({"query": "DELETE FROM notes"})),
        "The query failed: only SELECT queries are allowed.".to_string(),
    ]);
    let parts = run_all(provider, ask("delete every note", host), reference()).await;
    let error = parts
        .iter()
        .find_map(|p| match p {
            AgentStreamPart::ToolError { error, .. } => Some(error.clone()),
            _ => None,
        })
        .expect("a tool error");
    assert_eq!(error.code, ToolErrorCode::ToolFailed);
    assert_eq!(error.message, "Error: Only SELECT queries are allowed");
    assert!(
        !parts
            .iter()
            .any(|p| matches!(p, AgentStreamPart::ToolResult { .. }))
    );
}

#[tokio::test]
async fn an_answer_that_repeats_itself_is_cut_at_the_first_repeat() {
    let looping = "I'm a pizza maker. ".repeat(40);
    let provider = ScriptedProvider::new([looping]);
    let parts = run_all(provider, ask("who are you?", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(texts(&parts), vec!["I'm a pizza maker."]);
}

#[tokio::test]
async fn the_loops_own_words_are_never_the_answer() {
    // The model answers with the correction's own sentence after a failed
    // call: under the reference policy too, it is not shown as the answer.
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-404"})),
        "Call the tool again with fixed arguments, or tell me what went wrong.".to_string(),
        "Call the tool again with fixed arguments, or tell me what went wrong.".to_string(),
    ]);
    let parts = run_all(provider, ask("add p-404", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Unrepaired);
    assert_eq!(
        texts(&parts),
        vec![messages::not_done(
            "Error [tool_failed]: product p-404 is out of stock"
        )]
    );
}

// 10. Loop detection ---------------------------------------------------------

#[tokio::test]
async fn a_repeated_call_is_flagged_once_then_the_run_stops() {
    let same = call("view_cart", json!({}));
    let provider = ScriptedProvider::new([same.clone(), same.clone(), same, "never".to_string()]);
    let parts = run_all(provider.clone(), ask("show my cart", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Loop);
    let flagged = turns_with(&provider.requests()[2], PromptRole::Tool)
        .pop()
        .unwrap();
    assert!(
        flagged.contains(&messages::repeated_call("view_cart")),
        "{flagged}"
    );
    assert_eq!(
        texts(&parts).last().unwrap(),
        &format!(
            "items: 1 result: Summit 30L Backpack (p-17), quantity: 1.\n\n{}",
            messages::CIRCLES
        )
    );
    assert_eq!(provider.requests().len(), 3);
}

#[tokio::test]
async fn a_run_that_stops_on_a_failing_call_says_what_failed() {
    // The same failing call three times: the person is told the tool's
    // error, which rephrasing the request cannot fix, not only that the run
    // went in circles.
    let same = call("add_to_cart", json!({"product_id": "p-404"}));
    let provider = ScriptedProvider::new([same.clone(), same.clone(), same]);
    let parts = run_all(provider, ask("add p-404", shop()), reference()).await;
    assert_finish(&parts, FinishReason::Loop);
    assert_eq!(
        texts(&parts).last().unwrap(),
        &format!(
            "{}\n\n{}",
            messages::last_call_failed("Error [tool_failed]: product p-404 is out of stock"),
            messages::CIRCLES
        )
    );
}

#[tokio::test]
async fn the_same_call_with_a_different_answer_is_not_a_loop() {
    let host = Arc::new(InMemoryToolHost::new());
    let counter = std::sync::atomic::AtomicU32::new(0);
    host.add(
        ToolDefinition::new(
            "next",
            "Next number",
            json!({"type": "object", "properties": {}}),
        ),
        move |_| {
            Ok(counter
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                .to_string())
        },
    );
    let same = call("next", json!({}));
    let provider = ScriptedProvider::new([
        same.clone(),
        same.clone(),
        same,
        "Counted to 2.".to_string(),
    ]);
    let parts = run_all(provider, ask("count", host), reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(texts(&parts), vec!["Counted to 2."]);
}

// 11. Max steps --------------------------------------------------------------

#[tokio::test]
async fn max_steps_ends_with_the_last_gist_and_the_stop_message() {
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "tent"})),
        call("open_product", json!({"product_id": "p-4"})),
        call("never_reached", json!({})),
    ]);
    let options = LocalLoopOptions {
        max_steps: 2,
        ..reference()
    };
    let parts = run_all(provider, ask("find a tent", shop()), options).await;
    assert_finish(&parts, FinishReason::MaxSteps);
    let last = texts(&parts).pop().unwrap();
    assert_eq!(
        last,
        format!(
            "id: p-4, title: Summit 30L Backpack, price: 99\n\n{}",
            messages::max_steps(2)
        )
    );
}

#[tokio::test]
async fn the_agent_profile_wins_for_max_steps_and_instructions() {
    let provider = ScriptedProvider::new([call("view_cart", json!({})), "x".to_string()]);
    let mut request = ask("show my cart", shop());
    request.agent = Some(AgentProfile {
        max_steps: Some(1),
        instructions: Some("The page's own words.".to_string()),
        ..AgentProfile::default()
    });
    let options = LocalLoopOptions {
        instructions: Some("The host's words.".to_string()),
        ..reference()
    };
    let parts = run_all(provider.clone(), request, options).await;
    assert_finish(&parts, FinishReason::MaxSteps);
    let system = &provider.requests()[0].messages[0].content;
    assert!(
        system.contains("About this site:\nThe page's own words.") && !system.contains("host's")
    );
}

// Notes ----------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn stop_during_a_tool_call_finishes_aborted() {
    let host = Arc::new(InMemoryToolHost::new());
    host.add_slow(
        ToolDefinition::new(
            "slow",
            "Slow tool",
            json!({"type": "object", "properties": {}}),
        ),
        Duration::from_secs(60),
        |_| Ok("done".into()),
    );
    let provider = ScriptedProvider::new([call("slow", json!({}))]);
    let request = ask("do the slow thing", host);
    let cancel = request.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    });
    let parts = run_all(provider, request, reference()).await;
    assert_finish(&parts, FinishReason::Aborted);
}

#[tokio::test]
async fn every_step_opens_a_new_message() {
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "backpack"})),
        call("add_to_cart", json!({"product_id": "p-17"})),
        "Added the backpack.".to_string(),
    ]);
    let parts = run_all(
        provider,
        ask("add a backpack to my cart", shop()),
        reference(),
    )
    .await;
    let steps: Vec<u32> = parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::MessageStart { step } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, vec![1, 2, 3]);
}

/// A step repeats the prompt of the step before it and adds to it, so a
/// provider's cached prefix serves the whole of it: the same tools on the
/// same page give the same system prompt whatever their rank this step,
/// and a call laid out over several lines goes back as the model wrote it.
#[tokio::test]
async fn each_steps_prompt_begins_with_the_whole_prompt_of_the_step_before() {
    let laid_out =
        "{\n  \"name\": \"search_products\",\n  \"arguments\": {\"query\": \"backpack\"}\n}";
    let provider = ScriptedProvider::new([
        laid_out.to_string(),
        call("add_to_cart", json!({"product_id": "p-17"})),
        "Added the backpack.".to_string(),
    ]);
    run_all(
        provider.clone(),
        ask("add a backpack to my cart", shop()),
        reference(),
    )
    .await;
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    for pair in requests.windows(2) {
        let (before, after) = (&pair[0].messages, &pair[1].messages);
        assert!(
            after.len() > before.len() && after[..before.len()] == before[..],
            "{before:#?}\n--- then ---\n{after:#?}"
        );
    }
    assert_eq!(requests[1].messages[2].role, PromptRole::Assistant);
    assert_eq!(requests[1].messages[2].content, laid_out);
}

/// A step on another page says so after the history: the run's system
/// prompt stays, so the cached prefix holds through the navigation, and a
/// page note ends the request with the page and the tools that came with
/// it. The step after, on the same page, repeats the note where it stood
/// and writes no other.
#[tokio::test]
async fn a_step_on_another_page_names_that_page_after_the_history() {
    let host = shop();
    host.set_page(Some(PageContext {
        path: "/search".into(),
        title: "Search".into(),
        h1: None,
    }));
    let moved = host.clone();
    host.add(
        ToolDefinition::new(
            "go_to_product",
            "Open a product's page.",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
        ),
        move |_| {
            moved.set_page(Some(PageContext {
                path: "/products/p-17".into(),
                title: "Summit 30L".into(),
                h1: None,
            }));
            moved.add(
                ToolDefinition::new(
                    "write_review",
                    "Review the product of this page.",
                    json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
                ),
                |_| Ok("reviewed".into()),
            );
            Ok("opened".into())
        },
    );
    let provider = ScriptedProvider::new([
        call("go_to_product", json!({"product_id": "p-17"})),
        call("view_cart", json!({})),
        "Here it is.".to_string(),
    ]);
    run_all(provider.clone(), ask("open p-17", host), reference()).await;
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    let system = |i: usize| requests[i].messages[0].content.clone();
    assert!(system(0).contains("(path /search)"), "{}", system(0));
    assert_eq!(system(1), system(0), "the system prompt is kept");
    assert_eq!(system(2), system(0));
    for pair in requests.windows(2) {
        let (before, after) = (&pair[0].messages, &pair[1].messages);
        assert!(
            after.len() > before.len() && after[..before.len()] == before[..],
            "{before:#?}\n--- then ---\n{after:#?}"
        );
    }
    let note = requests[1].messages.last().unwrap();
    assert_eq!(note.role, PromptRole::System);
    assert!(
        note.content.contains("(path /products/p-17)") && note.content.contains("write_review"),
        "{}",
        note.content
    );
    // Only the tool the model was not told of is listed.
    assert!(
        !note.content.contains("\"name\":\"view_cart\""),
        "{}",
        note.content
    );
    let notes = |i: usize| {
        requests[i]
            .messages
            .iter()
            .filter(|m| m.role == PromptRole::System)
            .count()
    };
    assert_eq!((notes(0), notes(1), notes(2)), (1, 2, 2));
}

#[tokio::test]
async fn the_system_prompt_carries_page_example_codes_and_delegation() {
    let host = shop();
    host.set_page(Some(PageContext {
        path: "/products/p-17".into(),
        title: "Summit 30L | Northwind".into(),
        h1: Some("Summit 30L Backpack".into()),
    }));
    let provider = ScriptedProvider::new(["Hi."]);
    let mut request = ask("hello", host);
    request.agent = Some(AgentProfile {
        sub_agents: vec![SubAgentInfo {
            name: "researcher".into(),
            description: "looks things up".into(),
        }],
        ..AgentProfile::default()
    });
    let options = LocalLoopOptions {
        instructions: Some("To buy: search_products, open_product, then add_to_cart.".into()),
        ..reference()
    };
    run_all(provider.clone(), request, options).await;
    let system = &provider.requests()[0].messages[0];
    assert_eq!(system.role, PromptRole::System);
    let s = &system.content;
    assert!(
        s.contains("/products/p-17")
            && s.contains("Summit 30L | Northwind")
            && s.contains("\"Summit 30L Backpack\""),
        "{s}"
    );
    assert!(s.contains("About this site:\nTo buy: search_products"));
    assert!(s.contains("Example: to call "), "{s}");
    for code in ToolErrorCode::ALL {
        assert!(s.contains(code.as_str()) && s.contains(code.meaning()));
    }
    assert!(s.contains("- researcher: looks things up"));
}

#[tokio::test]
async fn a_conversation_without_a_user_message_is_an_error() {
    let provider = ScriptedProvider::new(["x"]);
    let parts = run_all(provider, AgentRunRequest::new(vec![], shop()), reference()).await;
    assert_error(&parts, "There is nothing to answer");
}

// The adapter ------------------------------------------------------------------

#[tokio::test]
async fn the_local_adapter_runs_the_loop_with_its_options_and_the_providers_inline_flag() {
    use futures::StreamExt;
    use webmcp_agents::agent::{
        ProgressFn, adapter::AgentAdapter, adapter::LocalAdapterOptions,
        adapter::create_local_adapter,
    };

    // A provider without chat-template tools: the adapter must list the tools
    // inline, or the model would never see them.
    let provider =
        Arc::new(ScriptedProvider::new([call("view_cart", json!({}))]).with_tools_inline(true));
    let adapter = create_local_adapter(
        provider.clone(),
        LocalAdapterOptions {
            id: "shop".into(),
            label: "Shop assistant".into(),
            max_steps: 1,
            instructions: Some("Use view_cart for the cart.".into()),
            ..LocalAdapterOptions::default()
        },
    );
    assert_eq!((adapter.id(), adapter.label()), ("shop", "Shop assistant"));
    let progress: ProgressFn = Arc::new(|_| {});
    adapter.prepare(progress, Default::default()).await.unwrap();
    assert!(provider.prepared());
    let parts: Vec<_> = adapter.run(ask("show my cart", shop())).collect().await;
    assert_finish(&parts, FinishReason::MaxSteps);
    let system = &provider.requests()[0].messages[0].content;
    assert!(
        system.contains("<tools>") && system.contains("About this site:\nUse view_cart"),
        "{system}"
    );
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_generation_in_flight() {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use webmcp_agents::agent::{
        CallFormat, GenerateRequest, Generation, ProgressFn, Provider, ProviderError, ProviderInfo,
    };

    /// A provider that waits for its token and records that it saw it.
    struct Waiting(Arc<AtomicBool>);

    #[async_trait::async_trait]
    impl Provider for Waiting {
        fn info(&self) -> ProviderInfo {
            ProviderInfo::default()
        }
        async fn prepare(
            &self,
            _: ProgressFn,
            _: tokio_util::sync::CancellationToken,
        ) -> Result<(), ProviderError> {
            Ok(())
        }
        async fn generate(
            &self,
            _: GenerateRequest,
            cancel: tokio_util::sync::CancellationToken,
        ) -> Result<Generation, ProviderError> {
            let seen = self.0.clone();
            // Like a model on a blocking thread: it goes on until told to stop.
            tokio::spawn(async move {
                cancel.cancelled().await;
                seen.store(true, Ordering::SeqCst);
            });
            futures::future::pending().await
        }
        async fn fits(&self, _: &GenerateRequest) -> Result<bool, ProviderError> {
            Ok(true)
        }
        fn call_format(&self) -> CallFormat {
            CallFormat::Json
        }
        fn tools_inline(&self) -> bool {
            true
        }
    }

    let seen = Arc::new(AtomicBool::new(false));
    let mut parts = webmcp_agents::agent::run_local_agent(
        Waiting(seen.clone()),
        ask("hi", shop()),
        reference(),
    );
    assert!(matches!(
        parts.next().await,
        Some(AgentStreamPart::MessageStart { step: 1 })
    ));
    // Poll once more so the generation starts, then give up on the run.
    let _ = tokio::time::timeout(Duration::from_millis(50), parts.next()).await;
    drop(parts);
    for _ in 0..200 {
        if seen.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the provider's token was not cancelled when the stream was dropped");
}
