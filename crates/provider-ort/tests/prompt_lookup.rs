//! Prompt lookup (drafts taken from the prompt, checked in one forward
//! pass) writes the reply that one pass per token writes, token for token,
//! and does draft: on the tiny model (both cache kinds) and on the default
//! model's fp32 variant (`scripts/setup.sh --fp32`), plain and under a
//! constraint with the copy bias. The real-model tests fail, naming the
//! set-up, when the model is not installed.
//!
//! The fp32 variant is where a batched pass and one-token passes agree to
//! rounding; the 4-bit graph quantizes activations, and there batched
//! logits differ enough to change a later choice (see
//! `OrtProviderOptions::prompt_lookup`).

mod common;

use std::sync::Arc;

#[path = "common/qwen2.rs"]
mod qwen2;

use common::{default_model, default_model_fp32, options, small_model_decoding, tiny_model};
use qwen2::tiny_qwen2_model;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    Constraint, GenerateRequest, PromptMessage, PromptRole, Provider, ToolDefinition,
    prompt::SystemPromptInput, prompt::system_prompt,
};
use wma_provider_ort::copy::CopyBias;
use wma_provider_ort::{GenerateParams, IdGeneration, OrtModel, OrtProvider};

fn shop_tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart by its id.",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1}
            }, "required": ["product_id"]}),
        ),
        ToolDefinition::new(
            "open_product",
            "Get the details of one product by its id.",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
        ),
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
    ]
}

/// Generates after `prompt` from an empty cache, with prompt lookup on or
/// off; also returns what the cache holds afterwards.
fn generate(
    model: &mut OrtModel,
    prompt: &[u32],
    params: &GenerateParams,
    lookup: bool,
) -> (IdGeneration, Vec<u32>) {
    model.clear_cache();
    model.set_prompt_lookup(lookup);
    let g = model
        .generate_ids(prompt, params, &CancellationToken::new(), |_| false)
        .unwrap();
    (g, model.cached_ids().to_vec())
}

#[test]
fn tiny_model_drafts_and_writes_the_same_tokens_with_both_cache_kinds() {
    let dir = tiny_model();
    let tokenizer = OrtProvider::load(options(&dir)).unwrap();
    // Repeated text: the random model's reply repeats itself too, so the
    // last tokens are found before and drafts are fed.
    let prompt = tokenizer
        .encode(&"the cart and the tent, the tent and the cart. ".repeat(12))
        .unwrap();
    let mut drafted = 0;
    for variant in ["onnx/model.onnx", "gqa"] {
        let mut model = OrtModel::open(
            &dir,
            &options(&dir).with_variant(variant).with_prompt_lookup(true),
        )
        .unwrap();
        // Limits that fall inside a draft as well as after it.
        for max_new in [7, 40] {
            let params = GenerateParams::greedy(max_new, Vec::new());
            let (plain, plain_cache) = generate(&mut model, &prompt, &params, false);
            let (looked, looked_cache) = generate(&mut model, &prompt, &params, true);
            assert_eq!(plain.stats.drafted_tokens, 0);
            assert_eq!(looked.ids, plain.ids, "{variant}, {max_new} tokens");
            assert_eq!(looked.reason, plain.reason);
            // The rest of a draft is not left in the cache: the next
            // prompt finds what one pass per token leaves.
            assert_eq!(looked_cache, plain_cache, "{variant}, {max_new} tokens");
            assert!(looked.stats.accepted_tokens <= looked.stats.drafted_tokens);
            assert_eq!(
                looked.stats.decode_steps + looked.stats.accepted_tokens,
                plain.stats.decode_steps,
                "every accepted token saves a pass"
            );
            drafted += looked.stats.drafted_tokens;
        }
    }
    assert!(drafted > 0, "no draft was fed");
}

/// A graph that keeps only the last position's logits (the converter's
/// own, as the default model's) is loaded with that position as an input:
/// it gives the same logits as the graph as written, and drafts are
/// checked on it.
#[test]
fn a_graph_with_the_last_logits_only_gives_the_same_logits_and_drafts() {
    let dir = tiny_qwen2_model();
    let tokenizer = OrtProvider::load(options(&dir)).unwrap();
    let prompt = tokenizer
        .encode(&"the cart and the tent, the tent and the cart. ".repeat(12))
        .unwrap();
    // The float graph: batched and one-token passes agree to rounding.
    let open = |lookup: bool| {
        let options = options(&dir)
            .with_variant("onnx/model.onnx")
            .with_prompt_lookup(lookup);
        OrtModel::open(&dir, &options).unwrap()
    };
    let mut written = open(false);
    let mut patched = open(true);
    assert!(written.graph_io().logits_positions.is_none());
    assert!(patched.graph_io().logits_positions.is_some());
    assert_eq!(
        patched.logits_for(&prompt).unwrap(),
        written.logits_for(&prompt).unwrap()
    );
    let params = GenerateParams::greedy(40, Vec::new());
    let (plain, plain_cache) = generate(&mut written, &prompt, &params, false);
    let (looked, looked_cache) = generate(&mut patched, &prompt, &params, true);
    assert_eq!(looked.ids, plain.ids);
    assert_eq!(looked_cache, plain_cache);
    assert!(looked.stats.drafted_tokens > 0, "no draft was fed");
    // Loaded without it, the graph cannot check drafts: lookup turns
    // itself off, and the reply is still the same.
    let (unpatched, _) = generate(&mut written, &prompt, &params, true);
    assert_eq!(unpatched.ids, plain.ids);
    assert_eq!(unpatched.stats.drafted_tokens, 0);
    assert!(!written.prompt_lookup());
}

/// Loading the default model for prompt lookup (its last position's
/// gather reading an input) changes no logit: with lookup off, replies
/// are those of the graph as written.
#[test]
fn loading_the_default_model_for_prompt_lookup_changes_no_logit() {
    let dir = default_model();
    let tokenizer = OrtProvider::load(options(&dir)).unwrap();
    let prompt = tokenizer
        .encode("<|im_start|>user\nAdd two of product p-4417-XK to my cart.<|im_end|>\n")
        .unwrap();
    let mut logits = Vec::new();
    for lookup in [false, true] {
        let mut model = OrtModel::open(&dir, &options(&dir).with_prompt_lookup(lookup)).unwrap();
        assert_eq!(model.graph_io().logits_positions.is_some(), lookup);
        let prefill = model.logits_for(&prompt).unwrap();
        let step = model.forward(&[prompt[0]]).unwrap();
        logits.push((prefill, step));
    }
    assert!(logits[0] == logits[1], "the logits differ");
}

/// The default model's fp32 variant, prepared, loaded for prompt lookup
/// (which each test then turns off and on).
async fn fp32_provider() -> OrtProvider {
    let provider = OrtProvider::new(default_model_fp32().with_prompt_lookup(true)).unwrap();
    provider
        .prepare(Arc::new(|_| {}), CancellationToken::new())
        .await
        .unwrap();
    provider
}

fn request(system: &str, text: &str) -> GenerateRequest {
    GenerateRequest {
        messages: vec![
            PromptMessage::new(PromptRole::System, system),
            PromptMessage::new(PromptRole::User, text),
        ],
        max_new_tokens: Some(80),
        ..GenerateRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_replies_are_the_same_token_for_token_with_prompt_lookup() {
    let provider = fp32_provider().await;
    let tools = shop_tools();
    let system = system_prompt(&SystemPromptInput {
        tools: &tools,
        tools_inline: provider.tools_inline(),
        call_format: provider.call_format(),
        ..SystemPromptInput::default()
    });
    let plain_system = "You are a helpful assistant.";
    let cases = [
        // A call whose argument copies the id from the person's words.
        (system.as_str(), "Add two of product p-4417-XK to my cart."),
        (system.as_str(), "Show me the details of product SKU-88213."),
        (
            plain_system,
            "Repeat this path exactly: /home/ana/projects/webmcp/notes/2024-06-01.md",
        ),
        (plain_system, "What is the capital of France?"),
        (
            plain_system,
            "Summarize in one sentence: The quick brown fox jumps over the lazy dog while the \
             farmer watches from the porch of the old red barn.",
        ),
    ];
    let stop = provider.stop_ids().unwrap();
    let params = GenerateParams::greedy(80, stop);
    let mut accepted = 0;
    for (system, text) in cases {
        let prompt = provider.encode_prompt(&request(system, text)).unwrap();
        let (plain, looked) = provider
            .with_model(|m| {
                let (plain, _) = generate(m, &prompt, &params, false);
                let (looked, _) = generate(m, &prompt, &params, true);
                (plain, looked)
            })
            .unwrap();
        assert_eq!(
            looked.ids,
            plain.ids,
            "{text}: {:?} against {:?}",
            provider.decode(&looked.ids),
            provider.decode(&plain.ids)
        );
        assert_eq!(looked.reason, plain.reason, "{text}");
        accepted += looked.stats.accepted_tokens;
    }
    assert!(accepted > 0, "no drafted token was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_calls_are_the_same_token_for_token_with_prompt_lookup() {
    let provider = fp32_provider().await;
    let engine = provider
        .constraint_engine()
        .unwrap()
        .expect("the default model's tokenizer supports constraints");
    let tools = shop_tools();
    let system = system_prompt(&SystemPromptInput {
        tools: &tools,
        tools_inline: provider.tools_inline(),
        call_format: provider.call_format(),
        ..SystemPromptInput::default()
    });
    let decoding = small_model_decoding();
    let cases = [
        (
            "Add two of product p-4417-XK to my cart.",
            true,
            Some("4417-XK"),
        ),
        (
            "Search the catalog for a waterproof hiking backpack with a rain cover.",
            true,
            None,
        ),
        ("Show me the details of product SKU-88213.", false, None),
    ];
    let params = GenerateParams {
        greedy_calls: decoding.greedy_calls,
        finish_cut_calls: decoding.finish_cut_calls.unwrap_or(0) as usize,
        ..GenerateParams::greedy(80, provider.stop_ids().unwrap())
    };
    let mut accepted = 0;
    for (text, calls_only, copied) in cases {
        let constraint = if calls_only {
            Constraint::CallsOnly {
                tools: tools.clone(),
            }
        } else {
            Constraint::TextOrCalls {
                tools: tools.clone(),
            }
        };
        let prompt = provider.encode_prompt(&request(&system, text)).unwrap();
        // The copy bias (on the person's words) is part of the choice the
        // drafts are checked against.
        let phrases = vec![text.to_string()];
        let run = |lookup: bool| {
            let mut matcher = engine
                .matcher(&constraint, provider.call_format(), &decoding)
                .unwrap()
                .with_call_threshold(decoding.call_threshold)
                .with_copy_bias(CopyBias::new(&phrases, decoding.copy_bias));
            provider
                .with_model(|m| {
                    m.clear_cache();
                    m.set_prompt_lookup(lookup);
                    m.generate_ids_constrained(
                        &prompt,
                        &params,
                        Some(&mut matcher),
                        &CancellationToken::new(),
                        |_| false,
                    )
                })
                .unwrap()
                .unwrap()
        };
        let plain = run(false);
        let looked = run(true);
        let reply = provider.decode(&looked.ids).unwrap();
        assert_eq!(
            looked.ids,
            plain.ids,
            "{text}: {reply:?} against {:?}",
            provider.decode(&plain.ids)
        );
        assert_eq!(looked.reason, plain.reason, "{text}");
        assert_eq!(
            looked.stats.constrained_tokens, plain.stats.constrained_tokens,
            "{text}: every token is still chosen under the mask"
        );
        if let Some(id) = copied {
            assert!(reply.contains(id), "{text}: {reply:?}");
        }
        accepted += looked.stats.accepted_tokens;
    }
    assert!(accepted > 0, "no drafted token was accepted");
}

/// Through the provider (the call threshold, its baseline, the cache's
/// text marks and stop strings all in play), the reply is the same, and
/// the provider's totals count the drafts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_writes_the_same_call_with_prompt_lookup() {
    let provider = fp32_provider().await;
    let tools = shop_tools();
    let system = system_prompt(&SystemPromptInput {
        tools: &tools,
        tools_inline: provider.tools_inline(),
        call_format: provider.call_format(),
        ..SystemPromptInput::default()
    });
    let text = "Add two of product p-4417-XK to my cart.";
    let request = GenerateRequest {
        constraint: Some(Constraint::TextOrCalls {
            tools: tools.clone(),
        }),
        decoding: small_model_decoding(),
        copy_phrases: vec![text.to_string()],
        ..request(&system, text)
    };
    let mut replies = Vec::new();
    for lookup in [false, true] {
        provider
            .with_model(|m| {
                m.clear_sessions();
                m.set_prompt_lookup(lookup);
            })
            .unwrap();
        let before = provider.constraint_totals();
        let reply = provider
            .generate(request.clone(), CancellationToken::new())
            .await
            .unwrap();
        let after = provider.constraint_totals();
        replies.push((reply, after.accepted_tokens - before.accepted_tokens));
    }
    let (plain, none) = &replies[0];
    let (looked, accepted) = &replies[1];
    assert_eq!(*none, 0);
    assert_eq!(looked.text, plain.text);
    assert_eq!(looked.output_tokens, plain.output_tokens);
    assert_eq!(looked.finish_reason, plain.finish_reason);
    assert!(*accepted > 0, "no drafted token in {:?}", looked.text);
}
