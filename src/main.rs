//! `wma`: run an on-device agent from the command line.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, LocalLoopOptions, Progress, Provider,
    run_local_agent,
};
use webmcp_agents::demo_shop::{self, Shop};
use webmcp_agents::display::render_part;
use webmcp_agents::usage::UsageMeter;
use wma_provider_ort::{OrtProvider, OrtProviderOptions, SamplingOptions};

/// Host on-device LLM agents that operate tools.
#[derive(Parser)]
#[command(name = "wma", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one request with a local model against the demo shop's tools.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// What to ask the agent.
    #[arg(default_value = demo_shop::DEFAULT_REQUEST)]
    request: String,
    /// A model folder or hub id (default: the model the set-up made).
    #[arg(long, env = "WMA_MODEL")]
    model: Option<String>,
    /// The graph file inside the model folder (e.g. onnx/model.onnx for fp32).
    #[arg(long)]
    variant: Option<String>,
    /// Model steps per request.
    #[arg(long, default_value_t = 6)]
    max_steps: u32,
    /// Time limit per generation, in seconds.
    #[arg(long, default_value_t = 60)]
    step_timeout: u64,
    /// CPU threads for ONNX Runtime (default: ONNX Runtime's choice).
    #[arg(long)]
    threads: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed for sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Print the parts as JSON lines instead of text.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args).await,
    }
}

async fn run(args: RunArgs) -> Result<()> {
    let mut options = OrtProviderOptions {
        model: args.model.clone(),
        variant: args.variant.clone(),
        intra_threads: args.threads,
        sampling: SamplingOptions {
            temperature: args.temperature,
            seed: args.seed,
            ..SamplingOptions::default()
        },
        ..OrtProviderOptions::default()
    };
    // A reply is a call or a sentence or two; a small model that rambles past
    // this is not going to say anything useful.
    options.max_new_tokens = 160;
    let provider = OrtProvider::new(options).context("could not set up the model")?;
    let started = Instant::now();
    let progress = Arc::new(|p: Progress| {
        match p.total {
            Some(total) => eprint!("\r{}: {}/{}   ", p.stage, p.done, total),
            None => eprint!("\r{}: {}   ", p.stage, p.done),
        }
        let _ = std::io::stderr().flush();
    });
    provider
        .prepare(progress, CancellationToken::new())
        .await
        .context("could not load the model")?;
    eprintln!(
        "\rmodel ready in {:.1} s{:30}",
        started.elapsed().as_secs_f64(),
        ""
    );

    let provider = Arc::new(UsageMeter::new(Arc::new(provider)));
    let shop = Shop::new();
    let request = AgentRunRequest::new(
        vec![ChatMessage::user(args.request.clone())],
        Arc::new(shop.tools()),
    );
    let cancel = request.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let loop_options = LocalLoopOptions {
        max_steps: args.max_steps,
        step_timeout: Duration::from_secs(args.step_timeout),
        tools_inline: provider.tools_inline(),
        instructions: Some(demo_shop::INSTRUCTIONS.to_string()),
        ..LocalLoopOptions::default()
    };
    if !args.json {
        println!("you: {}", args.request);
    }
    let started = Instant::now();
    let mut parts = run_local_agent(provider.clone(), request, loop_options);
    let mut failed = false;
    while let Some(part) = parts.next().await {
        failed |= matches!(part, AgentStreamPart::Error { .. });
        if args.json {
            println!("{}", serde_json::to_string(&part)?);
        } else {
            println!("{}", render_part(&part));
        }
    }
    let usage = provider.usage();
    let cart: Vec<String> = shop
        .cart()
        .iter()
        .map(|l| format!("{} x {}", l.quantity, l.product_id))
        .collect();
    eprintln!(
        "\nusage: {usage}; {:.1} s in all\ncart: {}",
        started.elapsed().as_secs_f64(),
        if cart.is_empty() {
            "empty".to_string()
        } else {
            cart.join(", ")
        }
    );
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
