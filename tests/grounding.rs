//! What the loop adds to a constraint beyond the tool schemas: grounded
//! identifiers, one action per reply, phrases to copy, and the calls-only
//! retry for a prose reply to a request that names a tool.

use std::sync::Arc;

use serde_json::{Value, json};
use webmcp_agents::agent::{
    AgentStreamPart, Constraint, ConstraintMode, Decoding, FinishReason, GenerateRequest,
    LocalLoopOptions, Steered, ToolAnnotations, ToolDefinition, messages, policy::Policy,
};
use wma_testkit::{InMemoryToolHost, ScriptedProvider, ScriptedReply};

use crate::support::*;

/// The scripted model stands in for a small on-device model, so these
/// runs are under the small-model policy, which a model of its kind gets
/// (an unmeasured model gets the reference loop: `Policy::for_model`).
fn inline() -> LocalLoopOptions {
    LocalLoopOptions {
        policy: Some(Policy::small_model()),
        ..crate::support::inline()
    }
}

/// A shop whose lookups are marked read-only, as real hosts mark them.
fn annotated_shop() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    let read_only = ToolAnnotations {
        read_only: true,
        ..ToolAnnotations::default()
    };
    host.add(
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        )
        .with_annotations(read_only.clone()),
        |_| Ok(json!([{"id": "p-17", "title": "Summit Backpack"}, {"id": "p-4", "title": "Trail Tent"}]).to_string()),
    );
    host.add(
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart by its id.",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1}},
                "required": ["product_id"]}),
        ),
        |args| Ok(json!({"ok": true, "message": format!("Added {} to the cart.", args["product_id"].as_str().unwrap_or("?"))}).to_string()),
    );
    host.add(
        ToolDefinition::new(
            "view_cart",
            "Show the cart.",
            json!({"type": "object", "properties": {}}),
        )
        .with_annotations(read_only),
        |_| Ok(json!({"items": [], "total": 0}).to_string()),
    );
    host
}

/// The tools a request's constraint allows, by name.
fn allowed(request: &GenerateRequest) -> Vec<String> {
    match &request.constraint {
        Some(Constraint::TextOrCalls { tools } | Constraint::CallsOnly { tools }) => {
            let mut names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
            names.sort();
            names
        }
        other => panic!("expected a calls constraint, got {other:?}"),
    }
}

/// The schema a request's constraint gives one tool's argument.
fn argument_schema(request: &GenerateRequest, tool: &str, argument: &str) -> Option<Value> {
    let (Some(Constraint::TextOrCalls { tools }) | Some(Constraint::CallsOnly { tools })) =
        &request.constraint
    else {
        return None;
    };
    tools
        .iter()
        .find(|t| t.name == tool)
        .and_then(|t| t.input_schema["properties"].get(argument).cloned())
}

#[tokio::test]
async fn a_tool_that_needs_an_id_nobody_has_shown_cannot_be_called_yet() {
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "tent"})),
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Added the Trail Tent.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Find a tent and add it to my cart", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert_eq!(
        allowed(&requests[0]),
        ["search_products", "view_cart"],
        "add_to_cart needs a product id and none was shown"
    );
    assert_eq!(
        argument_schema(&requests[1], "add_to_cart", "product_id"),
        Some(json!({"type": "string", "enum": ["p-4"]})),
        "after the search, the id of the one item it found that the request names"
    );
    assert!(
        !allowed(&requests[1]).contains(&"search_products".to_string()),
        "the lookup that found the ids is not offered again right away"
    );
    assert!(
        requests[1].tools.is_empty() && prompt_text(&requests[1]).contains("search_products"),
        "the prompt still lists every tool; only the constraint narrows"
    );
}

#[tokio::test]
async fn ids_the_person_wrote_are_grounded_too() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-17", "quantity": 2})),
        "Done.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Add 2 of p-17 to my cart", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let first = &provider.requests()[0];
    assert_eq!(
        argument_schema(first, "add_to_cart", "product_id"),
        Some(json!({"type": "string", "enum": ["p-17"]}))
    );
    assert_eq!(
        argument_schema(first, "add_to_cart", "quantity"),
        Some(json!({"type": "integer", "minimum": 1})),
        "a number was written, so the quantity is offered (an id's digits do not count), \
         and the model may write any count"
    );
}

#[tokio::test]
async fn an_action_is_not_offered_the_next_step_nor_on_the_same_id_again() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-17"})),
        call("view_cart", json!({})),
        call("add_to_cart", json!({"product_id": "p-21"})),
        "Both are in the cart.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Add p-17 and p-21 to my cart", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert!(allowed(&requests[0]).contains(&"add_to_cart".to_string()));
    assert_eq!(
        requests[0].decoding.single_call,
        ["add_to_cart"],
        "a tool that changes things gets one call per reply; lookups may fan out"
    );
    assert!(
        !allowed(&requests[1]).contains(&"add_to_cart".to_string()),
        "the step after an action does not offer it again"
    );
    assert_eq!(
        argument_schema(&requests[2], "add_to_cart", "product_id"),
        Some(json!({"type": "string", "enum": ["p-21"]})),
        "p-17 was added already"
    );
}

#[tokio::test]
async fn a_tool_the_last_call_made_appear_is_offered_alone_and_first() {
    // A web shop: add_to_cart exists only on a product's page, which
    // open_product opens.
    let host = annotated_shop();
    host.remove("add_to_cart");
    let page = Arc::downgrade(&host);
    host.add(
        ToolDefinition::new(
            "open_product",
            "Open a product's page.",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
        )
        .with_annotations(ToolAnnotations {
            read_only: true,
            ..ToolAnnotations::default()
        }),
        move |args| {
            if let Some(page) = page.upgrade() {
                page.add(
                    ToolDefinition::new(
                        "add_to_cart",
                        "Add this page's product to the cart.",
                        json!({"type": "object", "properties": {"quantity": {"type": "integer"}}}),
                    ),
                    |_| Ok("Added.".to_string()),
                );
            }
            Ok(json!({"id": args["product_id"], "title": "Summit Backpack"}).to_string())
        },
    );
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "backpack"})),
        call("open_product", json!({"product_id": "p-17"})),
        call("add_to_cart", json!({})),
        "Done.".to_string(),
    ])
    .with_constraints(true);
    run_all(
        provider.clone(),
        ask("Find a backpack and add it to my cart", host),
        inline(),
    )
    .await;
    let requests = provider.requests();
    // The constraint lists the offered tools in the order the prompt shows them.
    let first = |r: &GenerateRequest| match &r.constraint {
        Some(Constraint::TextOrCalls { tools } | Constraint::CallsOnly { tools }) => {
            tools.first().map(|t| t.name.clone())
        }
        _ => None,
    };
    assert_eq!(first(&requests[2]).as_deref(), Some("add_to_cart"));
    assert_eq!(
        allowed(&requests[2]),
        ["add_to_cart"],
        "the step after it appeared offers only what appeared"
    );
    assert_ne!(
        first(&requests[3]).as_deref(),
        Some("add_to_cart"),
        "only the step right after it appeared"
    );
    assert_eq!(
        argument_schema(&requests[3], "open_product", "product_id"),
        Some(json!({"type": "string", "enum": ["p-4"]})),
        "p-17 was opened already: its page is in the conversation"
    );
}

#[tokio::test]
async fn the_reference_policy_narrows_nothing_under_constraints() {
    let provider = ScriptedProvider::new(["Sure."]).with_constraints(true);
    let options = LocalLoopOptions {
        policy: Some(Policy::reference()),
        ..inline()
    };
    run_all(
        provider.clone(),
        ask("Find a tent and add it to my cart", annotated_shop()),
        options,
    )
    .await;
    let first = &provider.requests()[0];
    assert_eq!(
        allowed(first),
        ["add_to_cart", "search_products", "view_cart"]
    );
    assert_eq!(
        first.decoding,
        reference_decoding(&["product_id", "quantity", "query"])
    );
    assert!(first.copy_phrases.is_empty());
}

#[tokio::test]
async fn the_persons_phrases_reach_the_provider_without_tool_words() {
    let provider = ScriptedProvider::new(["Sure."]).with_constraints(true);
    run_all(
        provider.clone(),
        ask("Add a waterproof backpack to my cart", annotated_shop()),
        inline(),
    )
    .await;
    let phrases = &provider.requests()[0].copy_phrases;
    assert!(
        phrases.contains(&"waterproof backpack".to_string()),
        "{phrases:?}"
    );
    for tool_word in ["Add", "cart", "my cart", "Add a waterproof backpack"] {
        assert!(
            !phrases.contains(&tool_word.to_string()),
            "{tool_word}: {phrases:?}"
        );
    }
}

#[tokio::test]
async fn a_prose_reply_to_a_request_naming_a_tool_gets_the_calls_only_retry() {
    let provider = retried_after_prose([
        "I'm sorry, I cannot help with that.".to_string(),
        call("view_cart", json!({})),
        "Your cart is empty.".to_string(),
    ]);
    let parts = run_all(
        provider.clone(),
        ask("View my cart, please.", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert!(matches!(
        requests[1].constraint,
        Some(Constraint::CallsOnly { .. })
    ));
    assert!(
        prompt_text(&requests[1]).contains(&messages::use_the_tool("View my cart, please.")),
        "{}",
        prompt_text(&requests[1])
    );
    assert_eq!(texts(&parts), ["Your cart is empty."]);
}

/// The inline options with the small-model policy as `set` changes it.
fn small_model_with(set: impl FnOnce(&mut Policy)) -> LocalLoopOptions {
    let mut policy = Policy::small_model();
    set(&mut policy);
    LocalLoopOptions {
        policy: Some(policy),
        ..inline()
    }
}

/// A game tracker whose one tool needs two strings.
fn game_tracker() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "game_high_score",
            "The highest score recorded in a game on a platform.",
            json!({"type": "object", "properties": {
                "game_name": {"type": "string"}, "platform": {"type": "string"}
            }, "required": ["game_name", "platform"]}),
        ),
        |_| Ok(json!({"high_score": 999}).to_string()),
    );
    host
}

#[tokio::test]
async fn a_retried_call_whose_values_are_made_up_is_dropped_for_the_prose() {
    let request = "What's the lowest score in the Flappy Bird game?";
    let prose = "The lowest score in Flappy Bird is 0.";
    // (the retried call, whether it is dropped): the request names no
    // platform, so the call gives the game's name twice, or the argument's
    // own name; a call that names a platform runs.
    for (arguments, dropped) in [
        (
            json!({"game_name": "Flappy Bird", "platform": "flappy bird "}),
            true,
        ),
        (
            json!({"game_name": "Flappy Bird", "platform": "platform"}),
            true,
        ),
        (
            json!({"game_name": "Flappy Bird", "platform": "Android"}),
            false,
        ),
    ] {
        let provider = retried_after_prose([
            prose.to_string(),
            call("game_high_score", arguments.clone()),
            "The high score is 999.".to_string(),
        ]);
        let host = game_tracker();
        let parts = run_all(provider.clone(), ask(request, host.clone()), inline()).await;
        assert_finish(&parts, FinishReason::Stop);
        assert!(
            fired(&parts).contains(&"named-tool-retry".to_string()),
            "{:?}",
            fired(&parts)
        );
        assert_eq!(
            fired(&parts).contains(&"grounded-retry-values".to_string()),
            dropped,
            "{arguments}"
        );
        if dropped {
            assert!(host.calls().is_empty(), "the made-up call ran");
            assert_eq!(texts(&parts), [prose]);
        } else {
            assert_eq!(host.calls().len(), 1);
            assert_eq!(texts(&parts), ["The high score is 999."]);
        }
    }
    // With the rule off, what the retry wrote runs.
    let provider = retried_after_prose([
        prose.to_string(),
        call(
            "game_high_score",
            json!({"game_name": "Flappy Bird", "platform": "Flappy Bird"}),
        ),
        "The high score is 999.".to_string(),
    ]);
    let options = small_model_with(|p| p.grounded_retry_values = false);
    let host = game_tracker();
    run_all(provider, ask(request, host.clone()), options).await;
    assert_eq!(host.calls().len(), 1);
}

#[tokio::test]
async fn with_threshold_on_evidence_the_first_steps_call_threshold_takes_the_evidence_a_retry_takes()
 {
    // (request, whether the threshold stands): a request naming the tool
    // keeps it; one about something else leaves the choice to the model.
    for (request, kept) in [
        ("What's the high score of Flappy Bird on Android?", true),
        (
            "What is the volume of a sphere of radius 3 on Android?",
            false,
        ),
    ] {
        // A prose reply the named tool's retry turns into a call.
        let provider = retried_after_prose([
            "I cannot tell.".to_string(),
            call(
                "game_high_score",
                json!({"game_name": "Flappy Bird", "platform": "Android"}),
            ),
            "It is 999.".to_string(),
        ]);
        let options = small_model_with(|p| p.threshold_on_evidence = true);
        let parts = run_all(provider.clone(), ask(request, game_tracker()), options).await;
        assert_finish(&parts, FinishReason::Stop);
        let first = &provider.requests()[0];
        assert_eq!(
            first.decoding.call_threshold.is_some(),
            kept,
            "{request}: {:?}",
            fired(&parts)
        );
        assert_eq!(
            fired(&parts).contains(&"threshold-on-evidence".to_string()),
            !kept,
            "{request}"
        );
    }
    // Off (the small-model default), the threshold stands, named tool or
    // not; the neutral baseline then decides whether the request's words
    // make a call likelier.
    let provider = ScriptedProvider::new(["I cannot tell.".to_string()]).with_constraints(true);
    run_all(
        provider.clone(),
        ask(
            "What is the best score anyone got this season on Android?",
            game_tracker(),
        ),
        inline(),
    )
    .await;
    assert!(provider.requests()[0].decoding.call_threshold.is_some());
}

/// No push toward a call where no offered tool relates to the request: a
/// general question keeps no call threshold, and the repair of a call the
/// model began anyway may answer in text instead of being held to calls.
#[tokio::test]
async fn no_push_toward_a_call_where_no_offered_tool_relates_to_the_request() {
    // (request, whether a tool relates): nothing of the tool (its name,
    // description, arguments) nor of the agent's instructions is in a
    // general question, which is the model's to answer.
    for (request, related) in [
        ("What is the capital of France? Answer in one word.", false),
        ("What is the volume of a sphere of radius 3?", false),
        ("What's the high score of Flappy Bird on Android?", true),
    ] {
        // A call missing its required arguments, then an answer.
        let provider = ScriptedProvider::new([
            call("game_high_score", json!({})),
            "I cannot tell.".to_string(),
        ])
        .with_constraints(true);
        let parts = run_all(provider.clone(), ask(request, game_tracker()), inline()).await;
        let requests = provider.requests();
        assert_eq!(
            requests[0].decoding.call_threshold.is_some(),
            related,
            "{request}: {:?}",
            fired(&parts)
        );
        assert_eq!(
            matches!(requests[1].constraint, Some(Constraint::CallsOnly { .. })),
            related,
            "{request}: the repair's constraint {:?}",
            requests[1].constraint
        );
        assert_eq!(
            fired(&parts).contains(&"push-toward-related".to_string()),
            !related,
            "{request}"
        );
    }
    // The agent's instructions say what its tools are about: a question on
    // that is related, though no tool's own words hold it.
    let provider = ScriptedProvider::new(["I cannot tell.".to_string()]).with_constraints(true);
    let options = LocalLoopOptions {
        instructions: Some("Scores of arcade games, tracked per console.".to_string()),
        ..inline()
    };
    run_all(
        provider.clone(),
        ask("Which console is the most popular?", game_tracker()),
        options,
    )
    .await;
    assert!(provider.requests()[0].decoding.call_threshold.is_some());
}

#[tokio::test]
async fn the_retry_needs_two_named_words_and_the_models_own_weight_on_a_call() {
    // (request, call probability the model gave, the policy's least
    // probability): one named word only; no tool named at all; a gate set
    // above the model's own weight on a call.
    for (request, p, gate) in [
        ("What is in my cart?", 0.5, retry_probability()),
        ("What is the capital of France?", 0.5, retry_probability()),
        ("View my cart, please.", 0.0001, 0.001),
    ] {
        let provider = ScriptedProvider::new(["Some prose."])
            .with_constraints(true)
            .with_call_probability(p);
        let options = small_model_with(|p| {
            p.named_tool_retry = Some(gate);
            // "cart" is in view_cart's name, the sign of another rule.
            p.question_lookup_retry = false;
        });
        let parts = run_all(provider.clone(), ask(request, annotated_shop()), options).await;
        assert_eq!(provider.requests().len(), 1, "no retry for {request:?}");
        assert_eq!(texts(&parts), ["Some prose."]);
    }
}

#[tokio::test]
async fn an_id_the_person_wrote_is_the_second_sign_for_a_tool_that_takes_one() {
    let request = "Put three of p-17 in my cart.";
    let provider = retried_after_prose([
        "I'm sorry, I can't find that product.".to_string(),
        call("add_to_cart", json!({"product_id": "p-17", "quantity": 3})),
        "Added three.".to_string(),
    ]);
    let parts = run_all(provider.clone(), ask(request, annotated_shop()), inline()).await;
    let requests = provider.requests();
    assert!(
        prompt_text(&requests[1]).contains(&messages::use_the_tool(request)),
        "{}",
        prompt_text(&requests[1])
    );
    assert_eq!(texts(&parts), ["Added three."]);
    // "cart" alone names `view_cart` and `add_to_cart`, but `view_cart`
    // takes no id, and without one neither is named twice. ("Put" asks
    // for a change, which is another rule's sign: it is off here.)
    let named_only = LocalLoopOptions {
        policy: Some(Policy {
            change_request_retry: false,
            ..Policy::small_model()
        }),
        ..inline()
    };
    for request in [
        "Put my p-17 notes aside, what is the view?",
        "Put it in my cart.",
    ] {
        let provider = ScriptedProvider::new(["Some prose."])
            .with_constraints(true)
            .with_call_probability(0.5);
        let parts = run_all(
            provider.clone(),
            ask(request, annotated_shop()),
            named_only.clone(),
        )
        .await;
        assert_eq!(provider.requests().len(), 1, "no retry for {request:?}");
        assert_eq!(texts(&parts), ["Some prose."]);
    }
}

/// A push the request's words do not earn is held back and said: the
/// model gave a call 1%, above the 0.5% threshold, but as much without the
/// request's words; with the baseline off nothing is said.
#[tokio::test]
async fn a_call_the_baseline_does_not_earn_is_reported_as_held_back() {
    for (baseline_on, neutral, said) in [
        (true, 0.02, true),
        (true, 0.001, false),
        (false, 0.02, false),
    ] {
        let provider = ScriptedProvider::new(["Some prose."])
            .with_constraints(true)
            .with_call_probability(0.01)
            .with_call_baseline(neutral);
        let options = small_model_with(|p| {
            p.call_baseline = baseline_on;
            p.named_tool_retry = None;
            p.question_lookup_retry = false;
            p.change_request_retry = false;
        });
        let parts = run_all(
            provider.clone(),
            ask("View my cart, please.", annotated_shop()),
            options,
        )
        .await;
        assert_eq!(provider.requests()[0].decoding.call_baseline, baseline_on);
        assert_eq!(
            fired(&parts).iter().any(|r| r == "call-baseline"),
            said,
            "baseline {baseline_on}, neutral {neutral}: {:?}",
            fired(&parts)
        );
    }
}

/// The decoding's pulls are rules like the others: where the provider says
/// the copy bias or the call threshold changed the model's choice, the
/// step says so, and a call that reached the policy's limits says which;
/// an attempt with no constraint reports none of them.
#[tokio::test]
async fn a_pull_that_changed_the_models_choice_is_a_rule_event() {
    let steered = Steered {
        call_threshold: true,
        copy_bias: 2,
        ..Steered::default()
    };
    let calls = (0..4)
        .map(|_| call("search_products", json!({"query": "backpack"})))
        .collect::<Vec<_>>()
        .join("\n");
    for constrained in [true, false] {
        let provider = ScriptedProvider::new([
            ScriptedReply::text(calls.clone()).steered(steered),
            ScriptedReply::text("Found the Summit Backpack."),
        ])
        .with_constraints(constrained)
        .with_call_probability(0.01);
        let parts = run_all(
            provider,
            ask("Find me a backpack.", annotated_shop()),
            small_model_with(|p| p.move_on = false),
        )
        .await;
        let fired = fired(&parts);
        for rule in ["call-threshold", "copy-bias", "max-calls"] {
            assert_eq!(
                fired.iter().any(|r| r == rule),
                constrained,
                "{rule}, constrained {constrained}: {fired:?}"
            );
        }
    }
}

#[tokio::test]
async fn without_constraints_a_prose_reply_stands_as_the_reference_has_it() {
    for (provider, mode) in [
        (
            ScriptedProvider::new(["I'm sorry, I cannot help with that."]),
            ConstraintMode::Auto,
        ),
        (
            ScriptedProvider::new(["I'm sorry, I cannot help with that."])
                .with_constraints(true)
                .with_call_probability(0.5),
            ConstraintMode::Off,
        ),
    ] {
        let options = LocalLoopOptions {
            constraints: mode,
            ..inline()
        };
        let parts = run_all(
            provider.clone(),
            ask("View my cart, please.", annotated_shop()),
            options,
        )
        .await;
        assert_eq!(provider.requests().len(), 1, "no retry");
        assert_eq!(texts(&parts), ["I'm sorry, I cannot help with that."]);
    }
}

/// The small-model policy with `move_on` off: under it a lookup is not
/// offered right after it answered, so a model could not repeat it at once,
/// and the rules for a repeated call would not be reached. With
/// `done_on_repeated_lookup` on (off by default: docs/loop.md).
fn repeats_offered() -> LocalLoopOptions {
    LocalLoopOptions {
        policy: Some(Policy {
            move_on: false,
            done_on_repeated_lookup: true,
            ..Policy::small_model()
        }),
        ..inline()
    }
}

#[tokio::test]
async fn after_an_action_a_repeated_lookup_ends_the_run_with_what_was_done() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-17"})),
        call("view_cart", json!({})),
        call("view_cart", json!({})),
        "never asked".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Add p-17 to my cart", annotated_shop()),
        repeats_offered(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(texts(&parts), ["Added p-17 to the cart."]);
    assert_eq!(provider.requests().len(), 3);
}

#[tokio::test]
async fn going_in_circles_still_says_what_was_found() {
    let provider = ScriptedProvider::new([
        call("view_cart", json!({})),
        call("view_cart", json!({})),
        call("view_cart", json!({})),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider,
        ask("Show my cart", annotated_shop()),
        repeats_offered(),
    )
    .await;
    assert_finish(&parts, FinishReason::Loop);
    assert_eq!(
        texts(&parts).pop().unwrap(),
        format!("items: No results.\n\n{}", messages::CIRCLES)
    );
}

#[tokio::test]
async fn under_constraints_call_now_needs_some_weight_on_a_call() {
    let reply = "You can use the formula for the area of a circle.";
    // A request that seeks no information: the lookup retry, which is not
    // gated, stays out of it.
    for (p, retried) in [(call_now_probability() / 10.0, false), (0.01, true)] {
        let provider = ScriptedProvider::new([
            reply.to_string(),
            call("search_products", json!({"query": "circle"})),
            "Found it.".to_string(),
        ])
        .with_constraints(true)
        .with_call_probability(p);
        run_all(
            provider.clone(),
            ask("Get the area of a circle", annotated_shop()),
            inline(),
        )
        .await;
        let requests = provider.requests();
        assert_eq!(requests.len() > 1, retried, "probability {p}");
    }
}

#[tokio::test]
async fn a_reply_of_the_loops_own_words_is_retried_as_calls() {
    // The reply only repeats the loop's restatement: no answer at all, to
    // a request a tool relates to (`view_cart`).
    let echo = "Do the next step for it, or answer me if it is done.";
    let replies = || {
        ScriptedProvider::new([
            echo.to_string(),
            call("view_cart", json!({})),
            "Found it.".to_string(),
        ])
        .with_constraints(true)
        .with_call_probability(call_now_probability() / 10.0)
    };
    let provider = replies();
    let parts = run_all(
        provider.clone(),
        ask("Get the cart", annotated_shop()),
        inline(),
    )
    .await;
    assert!(fired(&parts).contains(&"echo-retry".to_string()));
    assert!(matches!(
        provider.requests()[1].constraint,
        Some(Constraint::CallsOnly { .. })
    ));
    assert_eq!(texts(&parts).pop().unwrap(), "Found it.");

    // Without it nothing else retries this reply, and the run has no answer.
    let provider = replies();
    let parts = run_all(
        provider.clone(),
        ask("Get the cart", annotated_shop()),
        small_model_with(|p| p.echo_retry = false),
    )
    .await;
    assert_eq!(provider.requests().len(), 1);
    assert_finish(&parts, FinishReason::Unrepaired);
}

#[tokio::test]
async fn an_echo_is_not_forced_into_a_call_no_tool_relates_to() {
    // Nothing in the shop relates to a general question: made to call, the
    // model would search the shop for it.
    let echo = "Do the next step for it, or answer me if it is done.";
    let provider = ScriptedProvider::new([
        echo.to_string(),
        call("search_products", json!({"query": "continents"})),
        "Found it.".to_string(),
    ])
    .with_constraints(true)
    .with_call_probability(call_now_probability() / 10.0);
    let parts = run_all(
        provider.clone(),
        ask("How many continents are there?", annotated_shop()),
        inline(),
    )
    .await;
    assert!(!fired(&parts).contains(&"echo-retry".to_string()));
    assert!(fired(&parts).contains(&"push-toward-related".to_string()));
    assert_eq!(provider.requests().len(), 1, "no retry");
    assert_finish(&parts, FinishReason::Unrepaired);
    assert_eq!(texts(&parts).pop().unwrap(), messages::NO_ANSWER);
}

/// The small-model policy's least call probability for the named-tool retry.
fn retry_probability() -> f32 {
    Policy::small_model().named_tool_retry.unwrap()
}

/// A constrained model that answers in prose, writes a call when a
/// calls-only retry asks for one (with the probability the named-tool
/// retry needs), then answers: `[prose, call, answer]`.
fn retried_after_prose(replies: [String; 3]) -> ScriptedProvider {
    ScriptedProvider::new(replies)
        .with_constraints(true)
        .with_call_probability(retry_probability())
}

/// The small-model policy's least call probability for "call now".
fn call_now_probability() -> f32 {
    Policy::small_model().call_now_min_probability.unwrap()
}

/// The reference's decoding: nothing beyond the schema but the worked
/// example's placeholders (`<` and each argument's name), which are never
/// values under any policy.
fn reference_decoding(arguments: &[&str]) -> Decoding {
    Decoding {
        avoid_in_values: arguments.iter().map(|a| format!("<{a}")).collect(),
        ..Decoding::default()
    }
}

/// The names of the rules that fired in a run, in order.
fn fired(parts: &[AgentStreamPart]) -> Vec<String> {
    parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::Rule { rule, .. } => Some(rule.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_reference_policy_with_constraints_makes_none_of_the_small_model_moves() {
    let reference = LocalLoopOptions {
        policy: Some(Policy::reference()),
        ..inline()
    };
    // A multi-step run: a lookup that finds ids, then an action, then the
    // lookup again (which the small-model policy would end as done).
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "tent"})),
        call("add_to_cart", json!({"product_id": "p-4"})),
        call("search_products", json!({"query": "tent"})),
        "Done.".to_string(),
    ])
    .with_constraints(true)
    .with_call_probability(0.5);
    let parts = run_all(
        provider.clone(),
        ask("Find a tent and add it to my cart", annotated_shop()),
        reference.clone(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(fired(&parts), Vec::<String>::new());
    let requests = provider.requests();
    assert_eq!(requests.len(), 4, "the repeated lookup did not end the run");
    for request in &requests {
        assert_eq!(
            allowed(request),
            ["add_to_cart", "search_products", "view_cart"],
            "every shown tool is offered, as its own schema says"
        );
        assert_eq!(
            argument_schema(request, "add_to_cart", "product_id"),
            Some(json!({"type": "string"}))
        );
        assert_eq!(
            request.decoding,
            reference_decoding(&["product_id", "quantity", "query"])
        );
        assert!(request.copy_phrases.is_empty());
    }
    // No named-tool retry: prose to a request that names a tool stands.
    let provider = ScriptedProvider::new(["I'm sorry, I cannot help with that."])
        .with_constraints(true)
        .with_call_probability(0.5);
    let parts = run_all(
        provider.clone(),
        ask("View my cart, please.", annotated_shop()),
        reference.clone(),
    )
    .await;
    assert_eq!(provider.requests().len(), 1);
    assert_eq!(fired(&parts), Vec::<String>::new());
    // "Call now" is not gated on the model's weight on a call.
    let provider = ScriptedProvider::new([
        "You can use the search to find it.".to_string(),
        call("search_products", json!({"query": "circle"})),
        "Found it.".to_string(),
    ])
    .with_constraints(true)
    .with_call_probability(0.000_001);
    let parts = run_all(
        provider.clone(),
        ask("Find the area of a circle", annotated_shop()),
        reference,
    )
    .await;
    assert_eq!(provider.requests().len(), 3, "the reference's call-now ran");
    assert_eq!(fired(&parts), Vec::<String>::new());
}

#[tokio::test]
async fn each_rule_that_fires_is_a_part_of_the_run() {
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "tent"})),
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Done.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Find a tent and add it to my cart", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let fired = fired(&parts);
    // Step 1: add_to_cart has no id to take yet; step 2: the search that
    // found ids is set aside for the tools that take one.
    for rule in ["ground-identifiers", "move-on", "offer-id-takers"] {
        assert!(fired.contains(&rule.to_string()), "{rule}: {fired:?}");
    }
    let first_step_rules = parts
        .iter()
        .skip_while(|p| !matches!(p, AgentStreamPart::MessageStart { step: 1 }))
        .take_while(|p| !matches!(p, AgentStreamPart::ToolCall { .. }))
        .filter_map(|p| match p {
            AgentStreamPart::Rule { rule, detail } => Some((rule.as_str(), detail.as_str())),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert!(
        first_step_rules.contains(&("ground-identifiers", "withheld add_to_cart")),
        "{first_step_rules:?}"
    );
}

#[tokio::test]
async fn a_question_is_not_answered_with_a_tool_that_changes_things() {
    let provider = ScriptedProvider::new([
        call("view_cart", json!({})),
        "Your cart is empty.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("What is in my cart right now?", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let first = &provider.requests()[0];
    assert!(
        !allowed(first).contains(&"add_to_cart".to_string()),
        "{:?}",
        allowed(first)
    );
    assert!(fired(&parts).contains(&"read-only-questions".to_string()));
}

#[tokio::test]
async fn a_delegated_run_starts_with_a_call() {
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "tent"})),
        "p-4 Trail Tent".to_string(),
    ])
    .with_constraints(true);
    let mut request = ask("Find a tent", annotated_shop());
    request.agent = Some(webmcp_agents::agent::AgentProfile {
        delegated: true,
        ..Default::default()
    });
    let parts = run_all(provider.clone(), request, inline()).await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert!(
        matches!(requests[0].constraint, Some(Constraint::CallsOnly { .. })),
        "{:?}",
        requests[0].constraint
    );
    assert!(
        matches!(requests[1].constraint, Some(Constraint::TextOrCalls { .. })),
        "later steps may answer"
    );
    assert!(fired(&parts).contains(&"delegated-calls-first".to_string()));
    // A person's request is not delegated: its first attempt may answer.
    let provider = ScriptedProvider::new(["Hello."]).with_constraints(true);
    run_all(
        provider.clone(),
        ask("Find a tent", annotated_shop()),
        inline(),
    )
    .await;
    assert!(matches!(
        provider.requests()[0].constraint,
        Some(Constraint::TextOrCalls { .. })
    ));
}

#[tokio::test]
async fn a_call_written_in_prose_is_held_to_the_steps_offer() {
    // The call comes inside a Markdown fence, where no constraint shapes
    // it, with an id nobody has shown.
    let prose_call = format!(
        "Sure, here it is:\n```json\n{}\n```",
        call("add_to_cart", json!({"product_id": "p-99"}))
    );
    let provider = ScriptedProvider::new([
        prose_call.clone(),
        call("search_products", json!({"query": "tent"})),
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Added the Trail Tent.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Find a tent and add it to my cart", annotated_shop()),
        inline(),
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert!(fired(&parts).contains(&"calls-within-offer".to_string()));
    assert_eq!(
        calls_made(&parts),
        [
            r#"search_products {"query":"tent"}"#,
            r#"add_to_cart {"product_id":"p-4"}"#
        ],
        "the invented id never reached the tool"
    );
    let requests = provider.requests();
    assert!(matches!(
        requests[1].constraint,
        Some(Constraint::CallsOnly { .. })
    ));
    let repair = prompt_text(&requests[1]);
    assert!(
        repair.contains("add_to_cart needs an id that no tool has shown yet"),
        "{repair}"
    );
    // The reference runs what the model wrote.
    let provider = ScriptedProvider::new([prose_call, "Added.".to_string()]).with_constraints(true);
    let parts = run_all(
        provider,
        ask("Find a tent and add it to my cart", annotated_shop()),
        LocalLoopOptions {
            policy: Some(Policy::reference()),
            ..inline()
        },
    )
    .await;
    assert_eq!(calls_made(&parts), [r#"add_to_cart {"product_id":"p-99"}"#]);
}

/// "Which tents do you have?" on the annotated shop, the model's replies
/// after the search that answers it being `after`, under `options`.
async fn tents_after_the_search(
    after: &[String],
    constraints: bool,
    options: LocalLoopOptions,
) -> (ScriptedProvider, Vec<AgentStreamPart>) {
    let mut replies = vec![call("search_products", json!({"query": "tent"}))];
    replies.extend(after.iter().cloned());
    let provider = ScriptedProvider::new(replies).with_constraints(constraints);
    let parts = run_all(
        provider.clone(),
        ask("Which tents do you have?", annotated_shop()),
        options,
    )
    .await;
    (provider, parts)
}

/// The search that answers "Which tents do you have?", then `second`
/// written in a Markdown fence (a provider without a "text or calls"
/// grammar can still write a call where the step offers no tool), then an
/// answer.
async fn a_call_in_prose_after_the_answering_search(
    second: String,
) -> (ScriptedProvider, Vec<AgentStreamPart>) {
    let after = [
        format!("```json\n{second}\n```"),
        "We have the Trail Tent.".to_string(),
    ];
    tents_after_the_search(&after, true, inline()).await
}

#[tokio::test]
async fn a_call_written_in_prose_when_an_answer_is_owed_is_sent_back() {
    let (provider, parts) = a_call_in_prose_after_the_answering_search(call(
        "add_to_cart",
        json!({"product_id": "p-4"}),
    ))
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(
        calls_made(&parts),
        [r#"search_products {"query":"tent"}"#],
        "a question is not answered with a write"
    );
    assert!(fired(&parts).contains(&"calls-within-offer".to_string()));
    let repair = prompt_text(&provider.requests()[2]);
    assert!(
        repair.contains("Answer the person with what the conversation shows"),
        "{repair}"
    );
    assert_eq!(texts(&parts), ["We have the Trail Tent."]);
}

#[tokio::test]
async fn a_lookup_written_in_prose_when_an_answer_is_owed_runs() {
    // A lookup changes nothing: sent back, a model that then fails the
    // repair ends the run in the apology instead of answering.
    let (_, parts) = a_call_in_prose_after_the_answering_search(call(
        "search_products",
        json!({"query": "tent"}),
    ))
    .await;
    assert_finish(&parts, FinishReason::Stop);
    assert!(
        !fired(&parts).contains(&"calls-within-offer".to_string()),
        "{:?}",
        fired(&parts)
    );
    assert_eq!(
        calls_made(&parts).len(),
        2,
        "the lookup ran: {:?}",
        calls_made(&parts)
    );
    assert!(!texts(&parts).iter().any(|t| t.contains(messages::APOLOGY)));
}

#[tokio::test]
async fn an_answer_that_only_repeats_the_prompt_becomes_the_last_results_gist() {
    let echo = messages::restate_after_lookup("Which tents do you have?")
        .lines()
        .last()
        .unwrap()
        .to_string();
    let (_, parts) = tents_after_the_search(&[echo], true, inline()).await;
    assert_finish(&parts, FinishReason::Stop);
    let answer = texts(&parts).join("\n");
    assert!(answer.contains("Trail Tent"), "{answer}");
    assert!(!answer.contains("next step"), "{answer}");
    assert!(fired(&parts).contains(&"no-prompt-echo-answers".to_string()));
}

#[tokio::test]
async fn a_prose_reply_to_a_request_for_a_change_gets_the_calls_only_retry() {
    // "Put" asks for a change, and add_to_cart is not marked read-only;
    // no two words of the request are in a tool's name.
    let request = "Put a tent in my basket";
    let provider = ScriptedProvider::new([
        "I put a tent in your basket.".to_string(),
        call("search_products", json!({"query": "tent"})),
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Added the Trail Tent.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(provider.clone(), ask(request, annotated_shop()), inline()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert!(fired(&parts).contains(&"change-request-retry".to_string()));
    assert!(matches!(
        provider.requests()[1].constraint,
        Some(Constraint::CallsOnly { .. })
    ));
    assert_eq!(texts(&parts), ["Added the Trail Tent."]);
    // After a lookup too, while the change is still owed and a tool that
    // makes it is offered; once it is made, the answer stands.
    let provider = ScriptedProvider::new([
        call("search_products", json!({"query": "tent"})),
        "The Trail Tent is in your basket now.".to_string(),
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Added the Trail Tent.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(provider.clone(), ask(request, annotated_shop()), inline()).await;
    assert_eq!(
        calls_made(&parts),
        [
            r#"search_products {"query":"tent"}"#,
            r#"add_to_cart {"product_id":"p-4"}"#
        ]
    );
    assert!(matches!(
        provider.requests()[2].constraint,
        Some(Constraint::CallsOnly { .. })
    ));
    assert_eq!(provider.requests().len(), 4);
    assert_eq!(texts(&parts), ["Added the Trail Tent."]);
    // A tool set that marks nothing read-only says nothing of what its
    // tools change (BFCL's): the prose stands, as does a question's (which
    // is another rule's to look up: it is off here).
    let change_only = LocalLoopOptions {
        policy: Some(Policy {
            question_lookup_retry: false,
            ..Policy::small_model()
        }),
        ..inline()
    };
    for (request, host) in [(request, shop()), ("Do you have tents?", annotated_shop())] {
        let provider = ScriptedProvider::new(["We have tents."]).with_constraints(true);
        let parts = run_all(provider.clone(), ask(request, host), change_only.clone()).await;
        assert_eq!(provider.requests().len(), 1, "{request}");
        assert_eq!(texts(&parts), ["We have tents."]);
    }
}

#[tokio::test]
async fn a_prose_reply_to_a_question_a_read_only_tool_looks_up_gets_the_calls_only_retry() {
    // A question beside a read-only tool: the answer is in the tool, not
    // in the model's weights.
    let request = "What is in my cart right now?";
    let provider = ScriptedProvider::new([
        "Your cart has two tents and a stove.".to_string(),
        call("view_cart", json!({})),
        "Your cart is empty.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(provider.clone(), ask(request, annotated_shop()), inline()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert!(fired(&parts).contains(&"question-lookup-retry".to_string()));
    let requests = provider.requests();
    assert!(matches!(
        requests[1].constraint,
        Some(Constraint::CallsOnly { .. })
    ));
    // The retry may only look things up.
    assert!(!allowed(&requests[1]).contains(&"add_to_cart".to_string()));
    assert_eq!(calls_made(&parts), [r#"view_cart {}"#]);
    assert_eq!(texts(&parts), ["Your cart is empty."]);

    // A turn that seeks nothing is answered as written, as is a question
    // beside tools that say nothing of what they change, and the
    // reference policy never retries.
    let cases = [
        ("Thanks, that is all.", annotated_shop(), inline()),
        (request, shop(), inline()),
        (
            request,
            annotated_shop(),
            LocalLoopOptions {
                policy: Some(Policy::reference()),
                ..inline()
            },
        ),
    ];
    for (request, host, options) in cases {
        let provider = ScriptedProvider::new(["Paris."]).with_constraints(true);
        let parts = run_all(provider.clone(), ask(request, host), options).await;
        assert_eq!(provider.requests().len(), 1, "{request}");
        assert_eq!(texts(&parts), ["Paris."]);
        assert!(!fired(&parts).contains(&"question-lookup-retry".to_string()));
    }
}

#[tokio::test]
async fn after_a_lookup_answers_a_question_the_model_answers_from_what_it_found() {
    let request = "Which tents do you have?";
    let search = call("search_products", json!({"query": "tent"}));
    // An answer that tells nothing the search found becomes its gist.
    let provider = ScriptedProvider::new([search.clone(), "We have many things.".to_string()])
        .with_constraints(true);
    let parts = run_all(provider.clone(), ask(request, annotated_shop()), inline()).await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert!(
        allowed(&requests[1]).is_empty(),
        "the step after the answering lookup offers no tool: {:?}",
        allowed(&requests[1])
    );
    assert!(fired(&parts).contains(&"answer-after-lookup".to_string()));
    assert_eq!(
        texts(&parts),
        ["2 results: Summit Backpack (p-17), Trail Tent (p-4)."]
    );

    // One that tells of it stands.
    let provider = ScriptedProvider::new([search.clone(), "We have the Trail Tent.".to_string()])
        .with_constraints(true);
    let parts = run_all(provider, ask(request, annotated_shop()), inline()).await;
    assert_eq!(texts(&parts), ["We have the Trail Tent."]);

    // A request for a change goes on to make it.
    let provider = ScriptedProvider::new([
        search,
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Added the Trail Tent.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(
        provider.clone(),
        ask("Add a tent to my cart", annotated_shop()),
        inline(),
    )
    .await;
    assert!(allowed(&provider.requests()[1]).contains(&"add_to_cart".to_string()));
    assert!(!fired(&parts).contains(&"answer-after-lookup".to_string()));
}

#[tokio::test]
async fn an_answer_that_tells_nothing_of_the_line_that_answered_becomes_that_line() {
    // A plain-text file whose second line answers; its first shares a word
    // with the request too.
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "read_text_file",
            "Read a text file.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        )
        .with_annotations(ToolAnnotations {
            read_only: true,
            ..ToolAnnotations::default()
        }),
        |_| Ok("Wifi network: Larkspur\nWifi password: teal-otter-42\nBins go out on Tuesday.\n".to_string()),
    );
    let request = "I forgot the wifi password, can you check house-notes.txt?";
    let read = call("read_text_file", json!({"path": "house-notes.txt"}));
    // The refusal names the network, a word of the file but not of the
    // line that answers.
    let provider = ScriptedProvider::new([
        read.clone(),
        "I'm unable to check your home network.".to_string(),
    ])
    .with_constraints(true);
    let parts = run_all(provider, ask(request, host.clone()), inline()).await;
    assert!(fired(&parts).contains(&"answer-after-lookup".to_string()));
    assert_eq!(texts(&parts), ["Wifi password: teal-otter-42"]);

    // An answer that gives the password stands.
    let provider = ScriptedProvider::new([read, "The password is teal-otter-42.".to_string()])
        .with_constraints(true);
    let parts = run_all(provider, ask(request, host), inline()).await;
    assert_eq!(texts(&parts), ["The password is teal-otter-42."]);
}

#[tokio::test]
async fn once_the_change_asked_for_is_made_no_tool_that_changes_things_is_offered() {
    let provider = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-4"})),
        "Added the Trail Tent.".to_string(),
    ])
    .with_constraints(true);
    // Off by default (docs/loop.md: it changed no `dev` task); on here.
    let options = small_model_with(|p| p.stop_changing_when_done = true);
    let parts = run_all(
        provider.clone(),
        ask("Add p-4 to my cart", annotated_shop()),
        options,
    )
    .await;
    assert_finish(&parts, FinishReason::Stop);
    let requests = provider.requests();
    assert!(allowed(&requests[0]).contains(&"add_to_cart".to_string()));
    assert!(
        !allowed(&requests[1]).contains(&"add_to_cart".to_string()),
        "{:?}",
        allowed(&requests[1])
    );
    assert!(fired(&parts).contains(&"stop-changing-when-done".to_string()));
}

/// Once a lookup answered a question, the step offers no tool; a model
/// that still tries a call (Qwen writes one inside a fence, malformed) is
/// repaired once, and a second try ends in the lookup's gist, not the
/// apology.
#[tokio::test]
async fn a_call_tried_again_where_an_answer_is_owed_gives_the_lookups_gist() {
    let fenced = "```json\n<tool_call>\n  \"name\": \"search_products\",\n  \"arguments\": \"tent\"\n</tool_call>\n```";
    let (provider, parts) =
        tents_after_the_search(&[fenced.to_string(), fenced.to_string()], true, inline()).await;
    assert_finish(&parts, FinishReason::Stop);
    assert_eq!(provider.requests().len(), 3, "one repair");
    let answer = texts(&parts).join("\n");
    assert!(answer.contains("Trail Tent"), "{answer}");
}

/// An answer of markup alone says nothing, under every policy: with no
/// result to tell of, the run did not answer; after a lookup, the
/// result's gist answers.
#[tokio::test]
async fn an_answer_of_markup_alone_is_no_answer() {
    let reference = || LocalLoopOptions {
        policy: Some(Policy::reference()),
        ..inline()
    };
    let provider = ScriptedProvider::new(["```json\n```json\n```json\n[]\n```"]);
    let parts = run_all(
        provider,
        ask("Show me my cart", annotated_shop()),
        reference(),
    )
    .await;
    assert_finish(&parts, FinishReason::Unrepaired);
    assert!(
        !texts(&parts).iter().any(|t| t.contains("```")),
        "{parts:?}"
    );
    let markup = "```json\n<tool_response>\n</tool_response>\n```".to_string();
    let (_, parts) = tents_after_the_search(&[markup], false, reference()).await;
    assert_finish(&parts, FinishReason::Stop);
    let answer = texts(&parts).join("\n");
    assert!(answer.contains("Trail Tent"), "{answer}");
}

/// A coordinator (every tool a helper) starts with a delegation when a
/// helper relates to what the person asks; a question none of them
/// relates to is the coordinator's own to answer in words, not one to
/// push on a helper ("What's the capital of Japan?" went to the database
/// helper, which wrote SQL for it).
#[tokio::test]
async fn a_coordinator_delegates_first_only_what_a_helper_relates_to() {
    let helpers = || {
        let host = Arc::new(InMemoryToolHost::new());
        host.add(
            ToolDefinition::new(
                "db_agent",
                "Answers questions about the shop's orders with SQL.",
                json!({"type": "object", "properties": {
                    "task": {"type": "string"}
                }, "required": ["task"]}),
            ),
            |_| Ok("Three orders.".to_string()),
        );
        host
    };
    let profile = || webmcp_agents::agent::AgentProfile {
        name: Some("assistant".to_string()),
        sub_agents: vec![webmcp_agents::agent::SubAgentInfo {
            name: "db_agent".to_string(),
            description: "Answers questions about the shop's orders with SQL.".to_string(),
        }],
        ..Default::default()
    };
    // (request, whether the first attempt allows calls only)
    for (request, calls_first) in [
        ("What's the capital of Japan?", false),
        ("How many orders does the shop have?", true),
    ] {
        let provider = ScriptedProvider::new(["Tokyo.".to_string()]).with_constraints(true);
        let mut ask = ask(request, helpers());
        ask.agent = Some(profile());
        // Off by default (docs/loop.md: on `dev` it gained the default
        // model the task it cost Qwen); on here.
        let options = small_model_with(|p| p.coordinator_calls_first = true);
        let parts = run_all(provider.clone(), ask, options).await;
        assert_eq!(
            matches!(
                provider.requests()[0].constraint,
                Some(Constraint::CallsOnly { .. })
            ),
            calls_first,
            "{request}: {:?}",
            fired(&parts)
        );
        assert_eq!(
            fired(&parts).contains(&"coordinator-calls-first".to_string()),
            calls_first,
            "{request}"
        );
    }
}
