//! An on-device agent shops on a real web page.
//!
//! Serves the demo shop (`examples/web_shop`, tools registered with
//! `document.modelContext.registerTool`) on 127.0.0.1, opens it in headless
//! Chromium with WebMCP on, and runs the default local model against the
//! page's tools through the CDP `WebMCP` domain. After each run the cart is
//! read back from the page, so the summary says whether the product really
//! is in it.
//!
//! ```text
//! scripts/install-peers.sh          # Chromium (and the npm peers)
//! scripts/setup.sh                  # the default model, once
//! cargo run --release --example web_shop_agent
//! cargo run --release --example web_shop_agent -- --runs 10
//! cargo run --release --example web_shop_agent -- --headed "Put a tent in my cart."
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, LocalLoopOptions, Progress, Provider,
    run_local_agent,
};
use webmcp_agents::display::render_part;
use webmcp_agents::tools::{Browser, BrowserOptions, LoopbackSite, SourceOptions, ToolSet};
use webmcp_agents::usage::UsageMeter;
use wma_provider_ort::{OrtProvider, OrtProviderOptions, SamplingOptions};

/// What the shop's agent is told about the site. The page's tools change as
/// it navigates: add_to_cart exists only on a product's page.
const INSTRUCTIONS: &str = "This is an outdoor shop. To buy something: search_products, then open_product with the product's id, then add_to_cart on the product's page. view_cart shows the cart.";

/// The product a run must put in the cart for the default request.
const WANTED: &str = "p-17";

#[derive(Parser)]
#[command(about = "Run the default local model against the demo web shop in headless Chromium.")]
struct Args {
    /// What to ask the agent.
    #[arg(default_value = "Find a waterproof backpack and add it to my cart.")]
    request: String,
    /// Runs of the same request (each with an empty cart).
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Sampling temperature; 0 (the default) is greedy, so runs repeat.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the first run when sampling; run N uses seed + N - 1.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Show the browser window instead of running headless.
    #[arg(long)]
    headed: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    // RUST_LOG filters the log (`wma_provider_ort=trace` prints each prompt
    // and reply); the standard OTEL_* variables export the runs' traces.
    let _telemetry =
        webmcp_agents::telemetry::init(&Default::default()).context("could not start tracing")?;
    let site_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/web_shop");
    let site = LoopbackSite::serve(&site_dir).await?;
    let browser = Browser::launch(BrowserOptions {
        headless: !args.headed,
        ..BrowserOptions::default()
    })
    .await?;
    eprintln!("shop at {}", site.url());

    let mut successes = 0;
    let mut outcomes = Vec::new();
    for run in 1..=args.runs {
        let options = OrtProviderOptions {
            sampling: SamplingOptions {
                temperature: args.temperature,
                seed: Some(args.seed + u64::from(run) - 1),
                ..SamplingOptions::default()
            },
            ..OrtProviderOptions::default()
        };
        // A fresh provider per run, so a seeded sampler starts afresh too.
        let provider = load(options).await?;
        let page = browser.open(&site.url()).await?;
        // Tabs of one origin share storage: start every run with an empty cart.
        page.evaluate("localStorage.removeItem('trailhead-cart')")
            .await?;

        let mut tools = ToolSet::new();
        tools.add_with("shop", page.clone(), SourceOptions::default());
        let request = AgentRunRequest::new(
            vec![ChatMessage::user(args.request.clone())],
            Arc::new(tools),
        );
        let options = LocalLoopOptions {
            tools_inline: provider.tools_inline(),
            instructions: Some(INSTRUCTIONS.to_string()),
            ..LocalLoopOptions::default()
        };
        println!(
            "\n=== run {run} of {} ===\nyou: {}",
            args.runs, args.request
        );
        let started = Instant::now();
        // Counts the run's prompt tokens, and those the KV cache served.
        let meter = Arc::new(UsageMeter::new(provider.clone()));
        let mut parts = run_local_agent(meter.clone(), request, options);
        let mut calls = Vec::new();
        let mut ending = String::new();
        while let Some(part) = parts.next().await {
            println!("{}", render_part(&part));
            match &part {
                AgentStreamPart::ToolCall { name, .. } => calls.push(name.clone()),
                AgentStreamPart::Finish { reason } => ending = format!("{reason:?}"),
                AgentStreamPart::Error { message } => ending = format!("error: {message}"),
                _ => {}
            }
        }
        let cart = page
            .evaluate("JSON.parse(localStorage.getItem('trailhead-cart') || '[]')")
            .await?;
        let got_it = cart
            .as_array()
            .is_some_and(|lines| lines.iter().any(|l| l["product_id"] == WANTED));
        successes += u32::from(got_it);
        let outcome = format!(
            "run {run}: {} in {:.1} s; calls: {}; ended: {ending}; cart: {cart}; usage: {}",
            if got_it {
                "in the cart"
            } else {
                "NOT in the cart"
            },
            started.elapsed().as_secs_f64(),
            if calls.is_empty() {
                "none".to_string()
            } else {
                calls.join(" → ")
            },
            meter.usage(),
        );
        println!("{outcome}");
        outcomes.push(outcome);
        page.close().await;
    }
    println!("\n=== summary ===");
    for outcome in &outcomes {
        println!("{outcome}");
    }
    println!("{successes} of {} runs put {WANTED} in the cart", args.runs);
    browser.close().await;
    Ok(())
}

async fn load(options: OrtProviderOptions) -> Result<Arc<OrtProvider>> {
    let provider = OrtProvider::new(options).context("could not set up the model")?;
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
        .context("could not load the model (scripts/setup.sh makes the default one)")?;
    eprintln!();
    Ok(Arc::new(provider))
}
