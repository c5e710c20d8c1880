//! Replays an agent workload (prompt ids of each loop step) on the default
//! model, with the KV cache's prefix reuse on and then off, and prints what
//! one agent request costs.
//!
//! ```text
//! cargo run --release -p wma-provider-ort --example ort_bench -- \
//!     [WORKLOAD.json] [--threads N] [--repeat N] [--model DIR] [--variant NAME] [--copy-kv]
//!     [--no-genai] [--no-llamacpp] [--gguf PATH] [--omp-wait-policy active|passive] [--calls-only]
//! ```
//!
//! `--copy-kv` turns off the in-place cache buffers, to measure what they save.
//!
//! The workload tables decode one token per forward pass, as the reference
//! runtimes do. A last table asks for shop tool calls under a "calls only"
//! constraint with the small-model decoding (copy bias included), with
//! prompt lookup off and on in the same run: reply tokens per second after
//! the first token, the speed-up, and whether the replies are the same.
//! A second row replays the workload's steps (no constraint) the same
//! way. `--calls-only` prints that table alone.
//!
//! At the end it runs `scripts/bench_genai.py` (onnxruntime-genai, from the
//! set-up's Python environment) on the same folder, workload and threads, and
//! `scripts/bench_llamacpp.py` (llama.cpp through the pinned `xllamacpp`) on
//! the GGUF file the folder was converted from (the same source weights;
//! the converter may requantize them), and prints the three side by side. `--no-genai` and `--no-llamacpp` skip
//! them; `--gguf PATH` names the GGUF file, which otherwise is the one in the
//! cache's `downloads/` whose name starts with the model folder's name.
//! `--omp-wait-policy passive` makes llama.cpp's OpenMP threads sleep
//! instead of spin while they wait (see scripts/bench_llamacpp.py: on a
//! machine busy with other work, spinning slows it down many times).
//!
//! The workload defaults to `shared/bench/agent-workload-4step.json` (looked
//! for here and one folder up). Each step generates greedily from its
//! `prompt_ids` until the eos id or `max_new_tokens`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wma_agent::{
    Constraint, Decoding, GenerateRequest, PromptMessage, PromptRole, Provider, ToolDefinition,
    prompt::SystemPromptInput, prompt::system_prompt,
};
use wma_provider_ort::{GenerateParams, OrtProvider, OrtProviderOptions};

const DEFAULT_WORKLOAD: &str = "shared/bench/agent-workload-4step.json";

struct Args {
    workload: Option<PathBuf>,
    threads: usize,
    repeat: usize,
    model: Option<String>,
    variant: Option<String>,
    copy_kv: bool,
    genai: bool,
    llamacpp: bool,
    gguf: Option<PathBuf>,
    /// OMP_WAIT_POLICY for llama.cpp only; `None` leaves OpenMP's default.
    omp_wait_policy: Option<String>,
    /// Only the constrained-calls table (prompt lookup off and on).
    calls_only: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        workload: None,
        threads: 2,
        repeat: 3,
        model: None,
        variant: None,
        copy_kv: false,
        genai: true,
        llamacpp: true,
        gguf: None,
        omp_wait_policy: None,
        calls_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--threads" => args.threads = value("--threads")?.parse()?,
            "--repeat" => args.repeat = value("--repeat")?.parse()?,
            "--model" => args.model = Some(value("--model")?),
            "--variant" => args.variant = Some(value("--variant")?),
            "--copy-kv" => args.copy_kv = true,
            "--no-genai" => args.genai = false,
            "--calls-only" => args.calls_only = true,
            "--no-llamacpp" => args.llamacpp = false,
            "--gguf" => args.gguf = Some(PathBuf::from(value("--gguf")?)),
            "--omp-wait-policy" => {
                let policy = value("--omp-wait-policy")?;
                if !matches!(policy.as_str(), "active" | "passive") {
                    bail!("--omp-wait-policy is active or passive, not {policy}");
                }
                args.omp_wait_policy = Some(policy);
            }
            "-h" | "--help" => {
                println!(
                    "ort_bench [WORKLOAD.json] [--threads N] [--repeat N] [--model DIR] [--variant NAME] [--copy-kv] [--no-genai] [--no-llamacpp] [--gguf PATH] [--omp-wait-policy active|passive] [--calls-only]"
                );
                std::process::exit(0);
            }
            other if other.starts_with("--") => bail!("unknown option {other}"),
            other => args.workload = Some(PathBuf::from(other)),
        }
    }
    Ok(args)
}

struct Step {
    prompt_ids: Vec<u32>,
    reference: Vec<u32>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|n| n as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn load_workload(path: Option<PathBuf>) -> Result<(PathBuf, Vec<Step>, usize, u32)> {
    let path = match path {
        Some(p) => p,
        None => [
            PathBuf::from(DEFAULT_WORKLOAD),
            PathBuf::from("..").join(DEFAULT_WORKLOAD),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("{DEFAULT_WORKLOAD} not found; pass the workload file"))?,
    };
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let max_new = json["max_new_tokens"].as_u64().unwrap_or(40) as usize;
    let eos = json["eos"].as_u64().unwrap_or(2) as u32;
    let steps = json["steps"]
        .as_array()
        .context("workload has no steps")?
        .iter()
        .map(|s| Step {
            prompt_ids: ids(&s["prompt_ids"]),
            reference: ids(&s["reference_output_ids"]),
        })
        .collect();
    Ok((path, steps, max_new, eos))
}

#[derive(Default, Clone, Copy)]
struct Totals {
    wall: Duration,
    prefill_tokens: usize,
    cached_tokens: usize,
    prefill_time: Duration,
    decode_steps: usize,
    decode_time: Duration,
    matching_steps: usize,
}

fn replay(
    provider: &OrtProvider,
    steps: &[Step],
    params: &GenerateParams,
    reuse: bool,
) -> Result<Totals> {
    provider.with_model(|m| {
        m.set_reuse_prefix(reuse);
        m.clear_cache();
    })?;
    let cancel = CancellationToken::new();
    let mut t = Totals::default();
    for step in steps {
        let g = provider.generate_ids_blocking(&step.prompt_ids, params, &cancel)?;
        t.wall += g.stats.total_time;
        t.prefill_tokens += g.stats.prefill_tokens;
        t.cached_tokens += g.stats.cached_tokens;
        t.prefill_time += g.stats.prefill_time;
        t.decode_steps += g.stats.decode_steps;
        t.decode_time += g.stats.decode_time;
        if g.ids == step.reference {
            t.matching_steps += 1;
        }
    }
    Ok(t)
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn median(mut runs: Vec<Totals>) -> Totals {
    runs.sort_by_key(|t| t.wall);
    runs[runs.len() / 2]
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let (path, steps, max_new, eos) = load_workload(args.workload.clone())?;
    let mut options = OrtProviderOptions::default().with_threads(args.threads);
    options.model = args.model.clone();
    options.variant = args.variant.clone();
    options.shared_kv_buffer = !args.copy_kv;
    // Loaded for prompt lookup (a graph that keeps only the last logits
    // then gives chosen positions'), which only the call table turns on.
    options.prompt_lookup = true;
    let load_start = std::time::Instant::now();
    let provider = OrtProvider::load(options)?;
    provider.with_model(|m| m.set_prompt_lookup(false))?;
    let shared = provider.with_model(|m| m.shares_kv_buffers())?;
    println!(
        "model {} ({} threads, KV cache {}), loaded in {:.2} s",
        provider.model_dir().display(),
        args.threads,
        if shared {
            "in shared buffers"
        } else {
            "copied each token"
        },
        load_start.elapsed().as_secs_f64()
    );
    println!(
        "workload {}: {} steps, prompts {:?} tokens, max {} new tokens, eos {}",
        path.display(),
        steps.len(),
        steps.iter().map(|s| s.prompt_ids.len()).collect::<Vec<_>>(),
        max_new,
        eos
    );
    let params = GenerateParams::greedy(max_new, vec![eos]);
    if args.calls_only {
        return calls_table(&provider, &steps, &params, args.repeat.max(1));
    }
    // One untimed pass warms ONNX Runtime's allocators and kernels.
    replay(&provider, &steps[..1], &params, false)?;

    println!(
        "\n{:<14} {:>9} {:>9} {:>12} {:>11} {:>11} {:>10}",
        "prefix reuse", "total s", "cached", "prefill tok", "prefill t/s", "decode t/s", "= ref"
    );
    let mut totals = Vec::new();
    for reuse in [true, false] {
        let runs = (0..args.repeat.max(1))
            .map(|_| replay(&provider, &steps, &params, reuse))
            .collect::<Result<Vec<_>>>()?;
        let t = median(runs);
        println!(
            "{:<14} {:>9.2} {:>9} {:>12} {:>11.1} {:>11.1} {:>6}/{}",
            if reuse { "on" } else { "off" },
            t.wall.as_secs_f64(),
            t.cached_tokens,
            t.prefill_tokens,
            t.prefill_tokens as f64 / t.prefill_time.as_secs_f64(),
            t.decode_steps as f64 / t.decode_time.as_secs_f64(),
            t.matching_steps,
            steps.len()
        );
        totals.push(t);
    }
    println!(
        "\nreuse speed-up: {:.2}x (median of {} runs each)",
        totals[1].wall.as_secs_f64() / totals[0].wall.as_secs_f64(),
        args.repeat.max(1)
    );
    // Decode speed on its own, at a short context (the usual headline figure).
    let short: Vec<u32> = steps[0].prompt_ids[..16.min(steps[0].prompt_ids.len())].to_vec();
    let decode = (0..args.repeat.max(1))
        .map(|_| {
            provider.with_model(|m| m.clear_cache())?;
            let g = provider.generate_ids_blocking(
                &short,
                &GenerateParams::greedy(129, Vec::new()),
                &CancellationToken::new(),
            )?;
            Ok(g.stats.decode_tokens_per_second())
        })
        .collect::<Result<Vec<f64>>>()?;
    let mut decode = decode;
    decode.sort_by(f64::total_cmp);
    let decode = decode[decode.len() / 2];
    println!(
        "decode after a {}-token prompt: {decode:.1} tok/s (128 tokens, median)",
        short.len(),
    );
    // Prefill of a 511-token prompt from scratch, as onnxruntime-genai's
    // figure is measured.
    let longest = steps
        .iter()
        .map(|s| &s.prompt_ids)
        .max_by_key(|p| p.len())
        .expect("steps");
    let prefill_ids: Vec<u32> = longest[..PREFILL_TOKENS.min(longest.len())].to_vec();
    let mut prefill = (0..args.repeat.max(1))
        .map(|_| {
            provider.with_model(|m| m.clear_cache())?;
            let g = provider.generate_ids_blocking(
                &prefill_ids,
                &GenerateParams::greedy(1, Vec::new()),
                &CancellationToken::new(),
            )?;
            Ok(g.stats.prefill_time.as_secs_f64())
        })
        .collect::<Result<Vec<f64>>>()?;
    prefill.sort_by(f64::total_cmp);
    let prefill = prefill[prefill.len() / 2];
    println!("prefill of {} tokens: {prefill:.2} s", prefill_ids.len());
    // Decode at a long context, reached by one prefill or by reusing a
    // cached half (what an agent's later steps do).
    let long: Vec<u32> = steps
        .iter()
        .rev()
        .flat_map(|s| s.prompt_ids.iter().copied())
        .collect();
    println!(
        "\n{:<10} {:>22} {:>22}",
        "context", "decode t/s, one prefill", "decode t/s, half reused"
    );
    for n in [1024usize, 2048] {
        if long.len() < n {
            continue;
        }
        let prompt = &long[..n];
        let mut fresh = Vec::new();
        let mut reused = Vec::new();
        for _ in 0..args.repeat.max(1) {
            let params = GenerateParams::greedy(33, Vec::new());
            let cancel = CancellationToken::new();
            provider.with_model(|m| m.clear_sessions())?;
            let g = provider.generate_ids_blocking(prompt, &params, &cancel)?;
            fresh.push(g.stats.decode_tokens_per_second());
            provider.with_model(|m| m.clear_sessions())?;
            provider.generate_ids_blocking(
                &prompt[..n / 2],
                &GenerateParams::greedy(1, Vec::new()),
                &cancel,
            )?;
            let g = provider.generate_ids_blocking(prompt, &params, &cancel)?;
            reused.push(g.stats.decode_tokens_per_second());
        }
        fresh.sort_by(f64::total_cmp);
        reused.sort_by(f64::total_cmp);
        println!(
            "{n:<10} {:>22.1} {:>22.1}",
            fresh[fresh.len() / 2],
            reused[reused.len() / 2]
        );
    }
    calls_table(&provider, &steps, &params, args.repeat.max(1))?;
    let peak = peak_rss_mib();
    match peak {
        Some(mib) => println!("peak RSS: {mib:.0} MiB"),
        None => println!("peak RSS: unknown (no /proc/self/status)"),
    }
    let ours = Ours {
        decode,
        prefill,
        reuse: totals[0].wall.as_secs_f64(),
        fresh: totals[1].wall.as_secs_f64(),
    };
    let genai = if args.genai {
        genai_figures(&provider, &path, &args)
    } else {
        Err("--no-genai".into())
    };
    let llamacpp = if args.llamacpp {
        llamacpp_figures(&provider, &path, &args)
    } else {
        Err("--no-llamacpp".into())
    };
    print_comparison(&ours, &genai, &llamacpp);
    Ok(())
}

/// Requests whose calls copy the person's words: ids, a phrase.
const CALL_REQUESTS: [&str; 4] = [
    "Add two of product p-17 to my cart.",
    "Show me the details of product SKU-88213-B.",
    "Search the catalog for a waterproof hiking backpack with a rain cover.",
    "Add three of product p-4417-XK to my cart.",
];

fn shop_tools() -> Vec<ToolDefinition> {
    let id = json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]});
    vec![
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        ToolDefinition::new(
            "open_product",
            "Get the details of one product by its id.",
            id,
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

/// The small-model policy's decoding (docs/providers.md): bounded values,
/// up to four calls to one tool, a 0.5% call threshold, a copy bias of 3,
/// greedy calls and cut calls finished.
fn small_model_decoding() -> Decoding {
    Decoding {
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

/// Reply tokens per second after the first token, the replies, drafted
/// and accepted tokens, and generated tokens, of one mode.
type LookupRun = (f64, Vec<String>, usize, usize, usize);

/// Constrained calls with prompt lookup off and on, in one run: reply
/// tokens per second after the first token (the prefill is the same in
/// both), and whether the replies are the same. A second row replays the
/// workload's steps (greedy, no constraint) the same way.
fn calls_table(
    provider: &OrtProvider,
    steps: &[Step],
    params: &GenerateParams,
    repeat: usize,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tools = shop_tools();
    let system = system_prompt(&SystemPromptInput {
        tools: &tools,
        tools_inline: provider.tools_inline(),
        call_format: provider.call_format(),
        ..SystemPromptInput::default()
    });
    let request = |text: &str| GenerateRequest {
        messages: vec![
            PromptMessage::new(PromptRole::System, system.clone()),
            PromptMessage::new(PromptRole::User, text),
        ],
        constraint: Some(Constraint::CallsOnly {
            tools: tools.clone(),
        }),
        max_new_tokens: Some(96),
        decoding: small_model_decoding(),
        // The loop gives the person's words for the copy bias.
        copy_phrases: vec![text.to_string()],
        ..GenerateRequest::default()
    };
    // One untimed call warms the kernels and caches the system prompt.
    runtime.block_on(provider.generate(request(CALL_REQUESTS[0]), CancellationToken::new()))?;
    // Per mode: tokens/s, the replies, drafted and accepted tokens.
    let mut runs = Vec::new();
    for lookup in [false, true] {
        provider.with_model(|m| m.set_prompt_lookup(lookup))?;
        let before = provider.constraint_totals();
        let (mut tokens, mut time, mut texts) = (0usize, 0f64, Vec::new());
        for _ in 0..repeat {
            for text in CALL_REQUESTS {
                let g =
                    runtime.block_on(provider.generate(request(text), CancellationToken::new()))?;
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
        runs.push((
            tokens as f64 / time.max(1e-9),
            texts,
            after.drafted_tokens - before.drafted_tokens,
            after.accepted_tokens - before.accepted_tokens,
            after.generated_tokens - before.generated_tokens,
        ));
    }
    // The workload's steps, each from its cached prefix as an agent's
    // next step finds it.
    let mut workload = Vec::new();
    for lookup in [false, true] {
        provider.with_model(|m| m.set_prompt_lookup(lookup))?;
        let cancel = CancellationToken::new();
        let (mut tokens, mut time, mut replies) = (0usize, 0f64, Vec::new());
        let (mut drafted, mut accepted, mut generated) = (0, 0, 0);
        for _ in 0..repeat {
            provider.with_model(|m| m.clear_sessions())?;
            for step in steps {
                let g = provider.generate_ids_blocking(&step.prompt_ids, params, &cancel)?;
                tokens += g.stats.generated_tokens.saturating_sub(1);
                time += g
                    .stats
                    .total_time
                    .saturating_sub(g.stats.time_to_first_token)
                    .as_secs_f64();
                drafted += g.stats.drafted_tokens;
                accepted += g.stats.accepted_tokens;
                generated += g.stats.generated_tokens;
                replies.push(format!("{:?}", g.ids));
            }
        }
        workload.push((
            tokens as f64 / time.max(1e-9),
            replies,
            drafted,
            accepted,
            generated,
        ));
    }
    provider.with_model(|m| m.set_prompt_lookup(false))?;
    println!(
        "\n| prompt lookup | reply tok/s, off | reply tok/s, on | speed-up | accepted/drafted | of tokens | same replies |"
    );
    println!("|---|---|---|---|---|---|---|");
    let label = format!("calls only, {} requests x {repeat}", CALL_REQUESTS.len());
    print_lookup_row(&label, &runs[0], &runs[1]);
    let label = format!("workload, {} steps x {repeat}", steps.len());
    print_lookup_row(&label, &workload[0], &workload[1]);
    Ok(())
}

/// One row of the prompt lookup table, and the replies that differ.
fn print_lookup_row(label: &str, plain: &LookupRun, looked: &LookupRun) {
    let same = plain
        .1
        .iter()
        .zip(&looked.1)
        .filter(|(a, b)| a == b)
        .count();
    println!(
        "| {label} | {:.1} | {:.1} | {:.2}x | {}/{} | {:.0}% | {same}/{} |",
        plain.0,
        looked.0,
        looked.0 / plain.0.max(1e-9),
        looked.3,
        looked.2,
        100.0 * looked.3 as f64 / looked.4.max(1) as f64,
        plain.1.len()
    );
    for (a, b) in plain.1.iter().zip(&looked.1).filter(|(a, b)| a != b) {
        println!("  differs: lookup off {a:?}\n           lookup on  {b:?}");
    }
}

/// Tokens of the prefill figure; the same as scripts/bench_genai.py's.
const PREFILL_TOKENS: usize = 511;

/// This provider's headline figures, for the side-by-side table.
struct Ours {
    decode: f64,
    prefill: f64,
    reuse: f64,
    fresh: f64,
}

/// A reference runtime's figures (the JSON line its script prints), or why
/// there are none; a missing column does not throw away this provider's.
type Figures = std::result::Result<Value, String>;

/// The set-up's Python environment and the folder of this project's scripts.
fn python_and_scripts() -> std::result::Result<(PathBuf, PathBuf), String> {
    let cache = wma_provider_ort::cache_dir().map_err(|e| e.to_string())?;
    let python = cache.join("venv").join("bin").join("python");
    if !python.is_file() {
        return Err(format!(
            "no Python environment at {} (run scripts/setup.sh)",
            python.display()
        ));
    }
    Ok((
        python,
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
    ))
}

/// Runs one of the reference scripts and reads the JSON line it prints last.
fn run_script(script: &str, args: &[&std::ffi::OsStr], workload: &Path, bench: &Args) -> Figures {
    let (python, scripts) = python_and_scripts()?;
    // Every reference runtime replays the same workload with the same
    // threads and repeats as this provider.
    let output = std::process::Command::new(&python)
        .arg(scripts.join(script))
        .args(args)
        .arg("--threads")
        .arg(bench.threads.to_string())
        .arg("--repeat")
        .arg(bench.repeat.max(1).to_string())
        .arg("--workload")
        .arg(workload)
        .output()
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "scripts/{script} failed: {}",
            stderr.lines().last().unwrap_or("")
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| format!("no JSON line from scripts/{script}"))?;
    serde_json::from_str(line).map_err(|e| format!("scripts/{script}: {e}"))
}

/// onnxruntime-genai on the same folder, graph, workload and threads.
fn genai_figures(provider: &OrtProvider, workload: &Path, args: &Args) -> Figures {
    let graph = args
        .variant
        .clone()
        .unwrap_or_else(|| "onnx/model_q4.onnx".to_string());
    println!("\nrunning onnxruntime-genai on the same folder (scripts/bench_genai.py)...");
    run_script(
        "bench_genai.py",
        &[
            provider.model_dir().as_os_str(),
            "--model-file".as_ref(),
            graph.as_ref(),
        ],
        workload,
        args,
    )
}

/// llama.cpp on the GGUF file the model folder was converted from.
fn llamacpp_figures(provider: &OrtProvider, workload: &Path, args: &Args) -> Figures {
    let gguf = match &args.gguf {
        Some(path) if path.is_file() => path.clone(),
        Some(path) => return Err(format!("no GGUF file at {}", path.display())),
        None => find_gguf(&provider.model_dir())?,
    };
    println!(
        "\nrunning llama.cpp on {} (scripts/bench_llamacpp.py)...",
        gguf.display()
    );
    let mut script_args: Vec<&std::ffi::OsStr> = vec![gguf.as_os_str()];
    if let Some(policy) = &args.omp_wait_policy {
        script_args.extend([
            std::ffi::OsStr::new("--omp-wait-policy"),
            std::ffi::OsStr::new(policy),
        ]);
    }
    run_script("bench_llamacpp.py", &script_args, workload, args)
}

/// The GGUF file a model folder was converted from: the one in the cache's
/// `downloads/` whose name is the folder's name followed by `.` or `-` (as
/// `SmolLM2-135M-Instruct.Q4_1.gguf` and
/// `Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf`, which scripts/setup.sh
/// downloads).
fn find_gguf(model_dir: &Path) -> std::result::Result<PathBuf, String> {
    let name = model_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| format!("model folder {} has no name", model_dir.display()))?;
    let downloads = wma_provider_ort::cache_dir()
        .map_err(|e| e.to_string())?
        .join("downloads");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&downloads)
        .map_err(|e| format!("cannot read {}: {e}", downloads.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let file = p.file_name().unwrap_or_default().to_string_lossy();
            file.ends_with(".gguf")
                && file
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with(['.', '-']))
        })
        .collect();
    found.sort();
    match found.len() {
        0 => Err(format!(
            "no {name}[.-]*.gguf in {}; pass --gguf PATH",
            downloads.display()
        )),
        1 => Ok(found.remove(0)),
        _ => Err(format!(
            "several GGUF files for {name} in {}; pass --gguf PATH",
            downloads.display()
        )),
    }
}

/// Prints this provider's figures next to the reference runtimes' ones.
fn print_comparison(ours: &Ours, genai: &Figures, llamacpp: &Figures) {
    for (runtime, figures) in [("onnxruntime-genai", genai), ("llama.cpp", llamacpp)] {
        match figures {
            Ok(v) => println!(
                "{runtime}: {} ({}{})",
                v["version"].as_str().unwrap_or("?"),
                v["model"].as_str().unwrap_or("?"),
                v["omp_wait_policy"]
                    .as_str()
                    .map(|p| format!(", OpenMP wait policy {p}"))
                    .unwrap_or_default()
            ),
            Err(why) => println!("{runtime} column skipped: {why}"),
        }
    }
    if let Ok(v) = llamacpp
        && v["workload_reuse_cached_tokens"].is_u64()
    {
        println!(
            "llama.cpp workload: {} prompt tokens from its cache with reuse ({} computed), \
             new tokens per step {} with reuse and {} without",
            v["workload_reuse_cached_tokens"],
            v["workload_reuse_prompt_tokens_computed"],
            v["workload_reuse_new_tokens"],
            v["workload_fresh_new_tokens"]
        );
    }
    let cell = |figures: &Figures, key: &str| match figures {
        Ok(v) => v[key]
            .as_f64()
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "-".into()),
        Err(_) => "-".into(),
    };
    // This provider's speed over theirs: for times, theirs over ours.
    let ratio = |ours: f64, figures: &Figures, key: &str, higher_better: bool| match figures {
        Ok(v) => v[key]
            .as_f64()
            .filter(|b| *b > 0.0 && ours > 0.0)
            .map(|b| if higher_better { ours / b } else { b / ours })
            .map(|r| format!("{r:.2}x"))
            .unwrap_or_else(|| "-".into()),
        Err(_) => "-".into(),
    };
    println!(
        "\n| figure | this provider | onnxruntime-genai | llama.cpp | vs genai | vs llama.cpp |"
    );
    println!("|---|---|---|---|---|---|");
    let rows = [
        (
            "decode tok/s".to_string(),
            ours.decode,
            "decode_tok_s",
            true,
        ),
        (
            format!("prefill of {PREFILL_TOKENS} tokens, s"),
            ours.prefill,
            "prefill_s",
            false,
        ),
        (
            "workload with KV reuse, s".to_string(),
            ours.reuse,
            "workload_reuse_s",
            false,
        ),
        (
            "workload without reuse, s".to_string(),
            ours.fresh,
            "workload_fresh_s",
            false,
        ),
    ];
    for (label, value, key, higher_better) in rows {
        println!(
            "| {label} | {value:.2} | {} | {} | {} | {} |",
            cell(genai, key),
            cell(llamacpp, key),
            ratio(value, genai, key, higher_better),
            ratio(value, llamacpp, key, higher_better),
        );
    }
    println!("(vs: this provider's speed over theirs; > 1 means this provider is faster)");
}
