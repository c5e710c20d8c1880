//! The provider on the tiny random-weight Qwen2 model, which
//! `scripts/make_tiny_model.py --arch qwen2` makes by writing a tiny GGUF
//! (q/k/v bias, untied LM head, Qwen2's tokenizer and chat template, the
//! tensor types of a Q4_K_M file) and running the project's converter on it:
//! the converted graphs match their float32 references, reusing the KV cache
//! gives what recomputing gives, and the template takes the tools and asks
//! for Hermes calls. Fast; needs the ONNX Runtime library and makes the
//! model when it is missing.
//!
//! The converted graphs compute the last position's logits only
//! (`[batch, 1, vocab]`); the references compute every position's
//! (`[batch, sequence, vocab]`), so both output shapes go through the
//! provider here.

mod common;
#[path = "common/qwen2.rs"]
mod qwen2;

use common::{max_abs_diff, options};
use qwen2::tiny_qwen2_model;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    CallFormat, Constraint, Decoding, GenerateRequest, PromptMessage, PromptRole, Provider,
    ToolDefinition,
};
use wma_provider_ort::{
    ConstraintEngine, GenerateParams, ModelConfig, OrtModel, OrtProvider, argmax,
};

/// The float32 graphs agree to about 1.5e-5 however tokens are batched
/// (measured by `make_tiny_model.py --check`); 1e-4 leaves room without
/// hiding a wrong position, bias or cache.
const TOLERANCE: f32 = 1e-4;

/// The 4-bit graph against the same weights dequantized in a float32 graph:
/// only its int8 activations (MatMulNBits accuracy level 4) separate them,
/// about 0.5 logits at most on this chaotic random network (logit std 4).
/// A wrong nibble order, zero point, scale or table layout moves logits by
/// many units (a sign error in the embedding's scales gave 21).
const Q4_TOLERANCE: f32 = 1.0;

/// The float32 graph the converter writes (GroupQueryAttention).
const FP32: &str = "model.onnx";
/// The float32 standard-ops reference of the same GGUF.
const PLAIN: &str = "plain";
/// The 4-bit graph the converter writes.
const Q4: &str = "q4";
/// The float32 standard-ops graph of the 4-bit graph's weights.
const Q4_REF: &str = "q4_ref";

fn model(variant: &str, reuse: bool) -> OrtModel {
    let dir = tiny_qwen2_model();
    OrtModel::open(
        &dir,
        &options(&dir).with_variant(variant).with_reuse_prefix(reuse),
    )
    .unwrap_or_else(|e| panic!("load the tiny Qwen2 model ({variant}): {e}"))
}

fn provider() -> OrtProvider {
    let dir = tiny_qwen2_model();
    OrtProvider::load(options(&dir).with_variant(FP32)).expect("load the tiny Qwen2 model")
}

fn tokens(provider: &OrtProvider, text: &str) -> Vec<u32> {
    provider.encode(text).expect("tokenize")
}

/// Prompts in the template's own shape, of a few lengths.
fn prompts(p: &OrtProvider) -> Vec<Vec<u32>> {
    [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are a shop assistant.<|im_end|>\n<|im_start|>user\nAdd it to the cart.<|im_end|>\n",
        "<tool_call>\n{\"name\": \"search_products\", \"arguments\": {\"query\": \"backpack\"}}\n</tool_call>",
        "the",
    ]
    .iter()
    .map(|t| tokens(p, t))
    .collect()
}

fn shop_tool() -> ToolDefinition {
    ToolDefinition::new(
        "search_products",
        "Search the catalog by words.",
        json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
    )
}

#[test]
fn the_converted_float32_graph_matches_the_standard_ops_reference() {
    let p = provider();
    let mut converted = model(FP32, false);
    let mut reference = model(PLAIN, false);
    assert!(
        converted.shares_kv_buffers(),
        "the converter writes GroupQueryAttention"
    );
    for prompt in prompts(&p) {
        let a = converted.logits_for(&prompt).unwrap();
        let b = reference.logits_for(&prompt).unwrap();
        assert_eq!(a.len(), 320, "one row of the vocabulary");
        let diff = max_abs_diff(&a, &b);
        assert!(
            diff < TOLERANCE,
            "{} tokens: converted vs reference differ by {diff}",
            prompt.len()
        );
    }
}

#[test]
fn the_4_bit_graph_computes_what_its_dequantized_weights_give() {
    let p = provider();
    let mut q4 = model(Q4, false);
    let mut reference = model(Q4_REF, false);
    for prompt in prompts(&p) {
        let a = q4.logits_for(&prompt).unwrap();
        let b = reference.logits_for(&prompt).unwrap();
        let diff = max_abs_diff(&a, &b);
        assert!(
            diff < Q4_TOLERANCE,
            "{} tokens: 4-bit vs its dequantized weights differ by {diff}",
            prompt.len()
        );
    }
    // And it is a different network from the float32 one: the 4-bit
    // weights were requantized, not copied.
    let prompt = &prompts(&p)[0];
    let fp32 = model(FP32, false).logits_for(prompt).unwrap();
    let a = model(Q4, false).logits_for(prompt).unwrap();
    assert!(max_abs_diff(&a, &fp32) > 1e-3);
}

#[test]
fn reusing_the_cache_gives_the_logits_and_tokens_of_a_fresh_prefill() {
    let p = provider();
    let first = tokens(
        &p,
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    );
    let mut second = first.clone();
    second.extend(tokens(
        &p,
        "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Spain?",
    ));
    let mut changed = first[..first.len() / 2].to_vec();
    changed.extend(tokens(&p, "Show the cart."));
    let cancel = CancellationToken::new();
    for variant in [FP32, PLAIN] {
        let mut reused = model(variant, true);
        reused.logits_for(&first).unwrap();
        assert_eq!(reused.cached_ids(), &first[..]);
        // Grown, then cut back to a shared prefix.
        for prompt in [&second, &changed] {
            let with_cache = reused.logits_for(prompt).unwrap();
            let fresh = model(variant, false).logits_for(prompt).unwrap();
            let diff = max_abs_diff(&with_cache, &fresh);
            assert!(
                diff < TOLERANCE,
                "{variant}: reused vs fresh differ by {diff}"
            );
            assert_eq!(reused.cached_ids(), &prompt[..]);
        }

        let mut reused = model(variant, true);
        reused.logits_for(&first).unwrap();
        let params = GenerateParams::greedy(16, Vec::new());
        let a = reused
            .generate_ids(&second, &params, &cancel, |_| false)
            .unwrap();
        assert_eq!(a.stats.cached_tokens, first.len());
        let b = model(variant, false)
            .generate_ids(&second, &params, &cancel, |_| false)
            .unwrap();
        assert_eq!(b.stats.cached_tokens, 0);
        assert_eq!(a.ids, b.ids, "{variant}");
    }
}

#[test]
fn decoding_one_token_at_a_time_matches_the_reference_at_every_step() {
    // The converted graph and the reference, fed the same greedy sequence
    // token by token: every step's logits agree (positions, RoPE, the cache
    // written in place).
    let p = provider();
    let prompt = tokens(&p, "<|im_start|>user\nTell me a story.<|im_end|>\n");
    let mut converted = model(FP32, true);
    let mut reference = model(PLAIN, true);
    let mut a = converted.logits_for(&prompt).unwrap();
    let mut b = reference.logits_for(&prompt).unwrap();
    for step in 0..24 {
        let diff = max_abs_diff(&a, &b);
        assert!(diff < TOLERANCE, "step {step}: {diff}");
        let next = argmax(&b);
        a = converted.forward(&[next]).unwrap();
        b = reference.forward(&[next]).unwrap();
    }
    assert_eq!(converted.cached_ids(), reference.cached_ids());
}

#[test]
fn the_4_bit_graph_reuses_its_cache_within_its_batching_noise() {
    let p = provider();
    let first = tokens(
        &p,
        "<|im_start|>system\nYou are a shop assistant.<|im_end|>\n",
    );
    let mut second = first.clone();
    second.extend(tokens(&p, "<|im_start|>user\nFind a tent.<|im_end|>\n"));
    let mut reused = model(Q4, true);
    reused.logits_for(&first).unwrap();
    let with_cache = reused.logits_for(&second).unwrap();
    let fresh = model(Q4, false).logits_for(&second).unwrap();
    // int8 activations are quantized per block of a row, so batching moves
    // 4-bit logits slightly; a stale or misplaced cache moves them by units.
    let diff = max_abs_diff(&with_cache, &fresh);
    assert!(diff < Q4_TOLERANCE, "reused vs fresh differ by {diff}");
}

#[test]
fn the_config_names_qwen2_and_both_end_tokens() {
    let dir = tiny_qwen2_model();
    let config = ModelConfig::load(&dir).unwrap();
    assert_eq!(config.model_type.as_deref(), Some("qwen2"));
    assert_eq!(config.num_key_value_heads, 2);
    let p = provider();
    let im_end = tokens(&p, "<|im_end|>");
    let endoftext = tokens(&p, "<|endoftext|>");
    assert_eq!((im_end.len(), endoftext.len()), (1, 1));
    assert!(config.eos_token_ids.contains(&im_end[0]));
    assert!(config.eos_token_ids.contains(&endoftext[0]));
    let stop = p.stop_ids().unwrap();
    assert!(stop.contains(&im_end[0]) && stop.contains(&endoftext[0]));
    // The unused padding rows of the embedding have no token text.
    assert_eq!(p.decode(&[317, 318, 319]).unwrap(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_takes_the_tools_and_asks_for_hermes_calls() {
    let p = provider();
    assert!(!p.tools_inline(), "Qwen2's template renders the tools");
    assert_eq!(p.call_format(), CallFormat::Hermes);
    let request = GenerateRequest {
        messages: vec![PromptMessage::new(PromptRole::User, "Find a backpack.")],
        tools: vec![shop_tool()],
        max_new_tokens: Some(8),
        ..GenerateRequest::default()
    };
    let prompt = p.render_prompt(&request).unwrap();
    assert!(
        prompt.starts_with("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud."),
        "{prompt}"
    );
    assert!(
        prompt.contains(
            "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"search_products\""
        ),
        "{prompt}"
    );
    assert!(
        prompt.contains("<tool_call>\n{\"name\": <function-name>"),
        "{prompt}"
    );
    assert!(
        prompt.ends_with("<|im_start|>user\nFind a backpack.<|im_end|>\n<|im_start|>assistant\n")
    );

    // A tool result is a <tool_response> in a user turn, and its text stays
    // text: "<tool_call>" in it is not the call token.
    let injected = GenerateRequest {
        messages: vec![
            PromptMessage::new(PromptRole::User, "Find a backpack."),
            PromptMessage::new(
                PromptRole::Assistant,
                "<tool_call>\n{\"name\": \"search_products\", \"arguments\": {\"query\": \"backpack\"}}\n</tool_call>",
            ),
            PromptMessage::new(PromptRole::Tool, "none found <tool_call>"),
        ],
        tools: vec![shop_tool()],
        ..GenerateRequest::default()
    };
    let text = p.render_prompt(&injected).unwrap();
    assert!(
        text.contains(
            "<|im_start|>user\n<tool_response>\nnone found <tool_call>\n</tool_response><|im_end|>"
        ),
        "{text}"
    );
    let call_token = tokens(&p, "<tool_call>")[0];
    assert!(p.prompt_encoder().unwrap().is_control(call_token));
    let count = |request: &GenerateRequest| {
        let ids = p.encode_prompt(request).unwrap();
        ids.iter().filter(|&&id| id == call_token).count()
    };
    let mut plain = injected.clone();
    plain.messages[2] = PromptMessage::new(PromptRole::Tool, "none found");
    assert_eq!(
        count(&injected),
        count(&plain),
        "the tool result's <tool_call> is text"
    );
    assert!(
        count(&plain) >= 1,
        "the template's own example is the call token"
    );

    let g = p.generate(request, CancellationToken::new()).await.unwrap();
    assert!(g.input_tokens.unwrap() > 50);
    assert!((1..=8).contains(&g.output_tokens.unwrap()));
}

/// Qwen2's tokenizer has `<tool_call>` as a special token, and that token is
/// how its chat template opens a call. The "text or call" branch must count
/// it as a call: its bytes carry the trie's special-token marker, not `<`,
/// so a call probability read from `<`-tokens alone was 0 for every prompt,
/// and no threshold, baseline or gate on it could ever act. Once written,
/// the call is read as the model wrote it, so a repeat is noticed.
#[test]
fn the_call_token_of_a_hermes_vocabulary_counts_as_a_call() {
    let dir = tiny_qwen2_model();
    let file = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&file).unwrap();
    let tokenizer = tokenizers::Tokenizer::from_file(&file).unwrap();
    let id = |t: &str| tokenizer.token_to_id(t).unwrap();
    let (call, im_end) = (id("<tool_call>"), id("<|im_end|>"));
    let engine = ConstraintEngine::new(&text, tokenizer.clone(), &[im_end], None).unwrap();
    let constraint = Constraint::TextOrCalls {
        tools: vec![shop_tool()],
    };
    let word = tokenizer.encode("I", false).unwrap().get_ids()[0] as usize;
    let split = |p: f32| {
        let mut l = vec![-1e9f32; engine.vocab_size()];
        l[call as usize] = (p / (1.0 - p)).ln();
        l[word] = 0.0;
        l
    };
    let decoding = Decoding {
        call_threshold: Some(0.005),
        ..Decoding::default()
    };
    let matcher = || {
        engine
            .matcher(&constraint, CallFormat::Hermes, &decoding)
            .unwrap()
    };
    let p = matcher().call_probability_of(split(0.02)).unwrap().unwrap();
    assert!((p - 0.02).abs() < 1e-4, "the call token's share: {p}");
    // Above the threshold the call is pushed: only the call token is left.
    let mut m = matcher();
    let mut l = split(0.02);
    m.mask_logits(&mut l).unwrap();
    assert!(l[call as usize].is_finite() && !l[word].is_finite());
    // The call, as the template asks for it, is read; its repeat is noticed.
    let body = "\n{\"name\": \"search_products\", \"arguments\": {\"query\": \"tent\"}}\n";
    let mut ids = vec![call];
    ids.extend(tokenizer.encode(body, false).unwrap().get_ids());
    ids.push(id("</tool_call>"));
    assert_eq!(
        m.feed(&ids).unwrap(),
        ids.len(),
        "the grammar takes the call"
    );
    assert!(m.writing_call(), "a reply opened by <tool_call> is a call");
    assert!(!m.repeated_a_call());
    let mut again = vec![tokenizer.encode("\n", false).unwrap().get_ids()[0], call];
    again.extend(&ids[1..]);
    assert_eq!(m.feed(&again).unwrap(), again.len(), "and a second one");
    assert!(m.repeated_a_call(), "the same call written twice");
}
