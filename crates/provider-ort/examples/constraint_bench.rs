//! What constrained decoding costs per token on a real model: the time to
//! compute each token's mask and advance the grammar, against the model's
//! own time per token, and the time to compile a grammar.
//!
//! ```text
//! cargo run --release -p wma-provider-ort --example constraint_bench -- [--threads N] [--model DIR] [--variant NAME] [--repeat N]
//! ```
//!
//! `--variant` picks the graph file (`onnx/model.onnx` is the default model's
//! fp32 variant, made by `scripts/setup.sh --fp32`).
//!
//! It asks the model (the default one unless `--model` says otherwise) a few
//! shop requests with the shop's tools in the prompt, once with "calls only"
//! and once with "text or calls", under the decoding the loop's small-model
//! policy asks for (docs/providers.md), and prints one table. A second table
//! sets the same requests with the forced tokens fed in one pass (fast
//! forward, off by default) beside one decode step each: reply tokens per
//! second, the share of forced tokens, and whether the replies match.

use anyhow::{Context, Result, bail};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    Constraint, Decoding, GenerateRequest, PromptMessage, PromptRole, Provider, ToolDefinition,
    prompt::SystemPromptInput, prompt::system_prompt,
};
use wma_provider_ort::{OrtProvider, OrtProviderOptions};

const REQUESTS: [&str; 4] = [
    "Add two of product p-17 to my cart.",
    "Find a waterproof backpack.",
    "What is in my cart?",
    "Show me the details of product p-33.",
];

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        ToolDefinition::new(
            "open_product",
            "Get the details of one product by its id.",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
        ),
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart by its id.",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1}
            }, "required": ["product_id"]}),
        ),
        ToolDefinition::new(
            "view_cart",
            "Show the items in the cart and the total.",
            json!({"type": "object", "properties": {}}),
        ),
    ]
}

/// The small-model policy's decoding: bounded values, up to four calls to
/// one tool, a 0.5% call threshold, a copy bias of 3, greedy calls and cut
/// calls finished.
fn small_model_decoding() -> Decoding {
    Decoding {
        avoid_in_values: Vec::new(),
        max_string_chars: Some(100),
        max_array_items: Some(16),
        max_calls: Some(4),
        one_tool_per_reply: true,
        call_threshold: Some(0.005),
        copy_bias: 3.0,
        greedy_calls: true,
        finish_cut_calls: Some(64),
        ..Decoding::default()
    }
}

fn main() -> Result<()> {
    let mut threads = 2;
    let mut repeat = 3;
    let mut model = None;
    let mut variant = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--threads" => threads = value("--threads")?.parse()?,
            "--repeat" => repeat = value("--repeat")?.parse()?,
            "--model" => model = Some(value("--model")?),
            "--variant" => variant = Some(value("--variant")?),
            "-h" | "--help" => {
                println!(
                    "constraint_bench [--threads N] [--model DIR] [--variant NAME] [--repeat N]"
                );
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let mut options = OrtProviderOptions::default().with_threads(threads);
    options.model = model;
    options.variant = variant;
    let provider = OrtProvider::load(options).context("could not load the model")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tools = tools();
    let system = system_prompt(&SystemPromptInput {
        tools: &tools,
        tools_inline: provider.tools_inline(),
        call_format: provider.call_format(),
        ..SystemPromptInput::default()
    });
    println!(
        "| constraint | generations | tokens | grammar compile | constraint per token | model per token | share |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, constraint) in [
        (
            "calls only",
            Constraint::CallsOnly {
                tools: tools.clone(),
            },
        ),
        (
            "text or calls",
            Constraint::TextOrCalls {
                tools: tools.clone(),
            },
        ),
    ] {
        let before = provider.constraint_totals();
        for _ in 0..repeat {
            for request in REQUESTS {
                let request = GenerateRequest {
                    messages: vec![
                        PromptMessage::new(PromptRole::System, system.clone()),
                        PromptMessage::new(PromptRole::User, request),
                    ],
                    tools: Vec::new(),
                    constraint: Some(constraint.clone()),
                    max_new_tokens: Some(96),
                    decoding: small_model_decoding(),
                    ..GenerateRequest::default()
                };
                runtime.block_on(provider.generate(request, CancellationToken::new()))?;
            }
        }
        let after = provider.constraint_totals();
        let mut d = after;
        d.generations -= before.generations;
        d.compile_time -= before.compile_time;
        d.tokens -= before.tokens;
        d.constraint_time -= before.constraint_time;
        d.decode_steps -= before.decode_steps;
        d.decode_time -= before.decode_time;
        d.generated_tokens -= before.generated_tokens;
        d.forced_tokens -= before.forced_tokens;
        println!(
            "| {label} | {} | {} | {:.2} ms | {} µs | {:.1} ms | {:.2}% |",
            d.generations,
            d.tokens,
            d.compile_time.as_secs_f64() * 1e3 / d.generations.max(1) as f64,
            d.per_token().as_micros(),
            d.model_per_token().as_secs_f64() * 1e3,
            d.overhead() * 100.0
        );
    }
    fast_forward_table(&provider, &runtime, &system, &tools, repeat)
}

/// Replies of both constraints with fast forward on and off, side by side.
fn fast_forward_table(
    provider: &OrtProvider,
    runtime: &tokio::runtime::Runtime,
    system: &str,
    tools: &[ToolDefinition],
    repeat: usize,
) -> Result<()> {
    println!(
        "\n| constraint | forced tokens | reply tok/s, one step each | reply tok/s, fast forward | speed-up | same replies |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, constraint) in [
        (
            "calls only",
            Constraint::CallsOnly {
                tools: tools.to_vec(),
            },
        ),
        (
            "text or calls",
            Constraint::TextOrCalls {
                tools: tools.to_vec(),
            },
        ),
    ] {
        // Per mode: reply tokens, time after the first token, the replies.
        let mut runs = Vec::new();
        let mut forced = (0, 0);
        for fast in [false, true] {
            provider.with_model(|m| m.set_fast_forward(fast))?;
            let before = provider.constraint_totals();
            let (mut tokens, mut time, mut texts) = (0usize, 0f64, Vec::new());
            for _ in 0..repeat {
                for request in REQUESTS {
                    let request = GenerateRequest {
                        messages: vec![
                            PromptMessage::new(PromptRole::System, system.to_string()),
                            PromptMessage::new(PromptRole::User, request),
                        ],
                        constraint: Some(constraint.clone()),
                        max_new_tokens: Some(96),
                        decoding: small_model_decoding(),
                        ..GenerateRequest::default()
                    };
                    let g =
                        runtime.block_on(provider.generate(request, CancellationToken::new()))?;
                    // After the first token: the reply's own pace, without
                    // the prefill (the same in both modes).
                    tokens += g.output_tokens.unwrap_or(0).saturating_sub(1) as usize;
                    time += g
                        .total_time
                        .unwrap_or_default()
                        .saturating_sub(g.time_to_first_token.unwrap_or_default())
                        .as_secs_f64();
                    texts.push(g.text);
                }
            }
            let after = provider.constraint_totals();
            if fast {
                forced = (
                    after.forced_tokens - before.forced_tokens,
                    after.generated_tokens - before.generated_tokens,
                );
            }
            runs.push((tokens as f64 / time.max(1e-9), texts));
        }
        provider.with_model(|m| m.set_fast_forward(true))?;
        let same = runs[0]
            .1
            .iter()
            .zip(&runs[1].1)
            .filter(|(a, b)| a == b)
            .count();
        println!(
            "| {label} | {}/{} ({:.0}%) | {:.1} | {:.1} | {:.2}x | {same}/{} |",
            forced.0,
            forced.1,
            100.0 * forced.0 as f64 / forced.1.max(1) as f64,
            runs[0].0,
            runs[1].0,
            runs[1].0 / runs[0].0.max(1e-9),
            runs[0].1.len()
        );
        for (a, b) in runs[0].1.iter().zip(&runs[1].1).filter(|(a, b)| a != b) {
            println!("  differs: one step each {a:?}\n           fast forward  {b:?}");
        }
    }
    Ok(())
}
