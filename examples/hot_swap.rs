//! Change the model while an agent is working: the runtime loads the new
//! model while the old one keeps serving, the step in flight finishes on the
//! old model, and the next step runs on the new one.
//!
//! Run it with `cargo run --example hot_swap`.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use webmcp_agents::agent::{ChatMessage, Provider};
use webmcp_agents::demo_shop::Shop;
use webmcp_agents::display::render_part;
use webmcp_agents::runtime::{AgentConfig, ProviderSource, Runtime, ToolSource};
use wma_testkit::{ScriptedProvider, ScriptedReply};

fn call(name: &str, arguments: serde_json::Value) -> String {
    json!({"name": name, "arguments": arguments}).to_string()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Scripted models stand in for real ones, so the example runs anywhere;
    // with ONNX models, the sources would load model folders instead.
    let small = ScriptedProvider::new([ScriptedReply::text(call(
        "search_products",
        json!({"query": "backpack"}),
    ))
    // Slow enough that the swap happens while this step is generating.
    .delayed(Duration::from_millis(500))])
    .with_model("small-model");
    let large = ScriptedProvider::new([
        call("add_to_cart", json!({"product_id": "p-17", "quantity": 1})),
        "The Summit 30L Backpack is in your cart.".to_string(),
    ])
    .with_model("large-model");

    let shop = Shop::new();
    let runtime = Runtime::builder(ProviderSource::new({
        let small = small.clone();
        move || small.clone()
    }))
    .tool_source(ToolSource::new("shop", {
        let shop = shop.clone();
        move || shop.tools()
    }))
    .agent(AgentConfig::new("shopper"))
    .start()
    .await?;
    println!("serving {}", runtime.model().model);

    let mut run = runtime
        .agent("shopper")?
        .run(vec![ChatMessage::user(
            "Find a backpack and add it to my cart",
        )])
        .await?;
    let printer = tokio::spawn(async move {
        while let Some(part) = run.next().await {
            println!("  {}", render_part(&part));
        }
    });

    // Wait until step 1 is generating on the small model, then swap.
    while small.requests().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("swapping to the large model while step 1 is still generating");
    let info = runtime
        .provider()
        .swap(
            ProviderSource::new({
                let large = large.clone();
                move || large.clone()
            }),
            |p| println!("  loading: {} {}/{}", p.stage, p.done, p.total.unwrap_or(0)),
        )
        .await?;
    println!(
        "now serving {} ({})",
        info.model,
        runtime.provider().info().provider
    );

    printer.await?;
    println!(
        "small-model answered {} generation(s), large-model {}; cart: {:?}",
        small.requests().len(),
        large.requests().len(),
        shop.cart()
    );
    runtime.shutdown().await;
    Ok(())
}
