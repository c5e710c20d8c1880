//! The agent loop with a scripted provider: watch the loop find, open and add
//! a product, repair a bad call on the way, and answer.
//!
//! Run it with `cargo run --example scripted_loop`.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::json;
use webmcp_agents::agent::{
    AgentRunRequest, ChatMessage, LocalLoopOptions, ToolDefinition, run_local_agent,
};
use webmcp_agents::display::render_part;
use wma_testkit::{InMemoryToolHost, ScriptedProvider};

#[tokio::main]
async fn main() {
    let tools = Arc::new(InMemoryToolHost::new());
    tools.add(
        ToolDefinition::new(
            "search_products",
            "Search the catalog.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        |_| Ok(json!([{"id": "p-17", "title": "Summit 30L Backpack", "price": 99}]).to_string()),
    );
    tools.add(
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart.",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
                "required": ["product_id"]}),
        ),
        |args| {
            Ok(json!({"message": format!("Added {} to the cart", args["product_id"])}).to_string())
        },
    );

    // What a small model might write: a good call, a call with a wrong
    // argument type (the loop repairs it), the fixed call, and an answer.
    let provider = ScriptedProvider::new([
        r#"{"name": "search_products", "arguments": {"query": "backpack"}}"#,
        r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "quantity": "one"}}"#,
        r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "quantity": 1}}"#,
        "I added the Summit 30L Backpack to your cart.",
    ]);

    let request = AgentRunRequest::new(
        vec![ChatMessage::user("Find a backpack and add it to my cart.")],
        tools,
    );
    let options = LocalLoopOptions {
        tools_inline: true,
        instructions: Some("To buy: search_products, then add_to_cart.".to_string()),
        ..LocalLoopOptions::default()
    };
    let mut parts = run_local_agent(provider.clone(), request, options);
    while let Some(part) = parts.next().await {
        println!("{}", render_part(&part));
    }
    println!(
        "\n(the model was asked {} times; the repair is one of them)",
        provider.requests().len()
    );
}
