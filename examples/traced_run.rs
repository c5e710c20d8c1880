//! A run traced with OpenTelemetry and exported over OTLP, to look at in
//! Jaeger: start Jaeger with `docker compose -f configs/jaeger-compose.yaml up -d`,
//! then run `cargo run --example traced_run` and open the link it prints.
//!
//! The exporter follows the standard variables: by default it sends
//! http/protobuf to http://localhost:4318; set `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`
//! for port 4317, or `OTEL_EXPORTER_OTLP_ENDPOINT` for another collector.

use serde_json::json;
use tracing::Instrument;
use webmcp_agents::agent::ChatMessage;
use webmcp_agents::demo_shop::Shop;
use webmcp_agents::display::render_part;
use webmcp_agents::runtime::{AgentConfig, ProviderSource, Runtime, ToolSource};
use webmcp_agents::telemetry::{self, TelemetryConfig};
use wma_testkit::ScriptedProvider;

fn call(name: &str, arguments: serde_json::Value) -> String {
    json!({"name": name, "arguments": arguments}).to_string()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Export is off unless asked for; this example asks for it.
    let guard = telemetry::init(&TelemetryConfig {
        enabled: true,
        service_name: Some("webmcp-agents-example".to_string()),
        ..TelemetryConfig::default()
    })?;
    let export = guard.export().cloned();

    let model = ScriptedProvider::new([
        call("search_products", json!({"query": "backpack"})),
        call("add_to_cart", json!({"product_id": "p-17", "quantity": 1})),
        "The Summit 30L Backpack is in your cart.".to_string(),
    ])
    .with_model("scripted-model");
    let shop = Shop::new();
    let runtime = Runtime::builder(ProviderSource::new(move || model.clone()))
        .tool_source(ToolSource::new("shop", move || shop.tools()))
        .agent(AgentConfig::new("shopper"))
        .start()
        .await?;

    let request = tracing::info_span!("traced_run example");
    let trace_id = telemetry::trace_id(&request);
    let parts = async {
        let run = runtime
            .agent("shopper")?
            .run(vec![ChatMessage::user(
                "Find a backpack and add it to my cart",
            )])
            .await?;
        anyhow::Ok(run.collect_parts().await)
    }
    .instrument(request)
    .await?;
    for part in &parts {
        println!("{}", render_part(part));
    }
    runtime.shutdown().await;

    // Send what is buffered before saying where to look.
    if let Err(error) = guard.flush() {
        println!("\nCould not export the trace ({error}). Is Jaeger running?");
        println!("Start it with: docker compose -f configs/jaeger-compose.yaml up -d");
    }
    if let Some(export) = export {
        println!(
            "\nThe exporter sends to {} ({:?}).",
            export.endpoint, export.protocol
        );
    }
    match trace_id {
        Some(id) => {
            println!("Open the run in Jaeger: http://localhost:16686/trace/{id}");
            println!(
                "Or search: service \"webmcp-agents-example\", operation \"invoke_agent shopper\"."
            );
        }
        None => println!("Tracing is off (OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none)."),
    }
    Ok(())
}
