//! What the actors add to a run, and what tracing adds to it.
//!
//! - `step`: one run through the runtime (agent actor, provider actor, tool
//!   bridge) against the same run of `run_local_agent` called directly, with
//!   a scripted provider that answers at once, so the difference is the cost
//!   of the actors. `answer` is a one-step run; `tool_call` is two steps (a
//!   call through the tool bridge, then the answer).
//! - `tracing`: the runtime's one-step run with no subscriber at all, with
//!   the telemetry crate's subscriber with export off (the default), and
//!   with OTLP export on (to an in-process receiver).
//!
//! Run with `cargo bench -p wma-runtime --bench actor_overhead`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use serde_json::json;
use wma_agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, LocalLoopOptions, ToolDefinition,
    run_local_agent,
};
use wma_runtime::{AgentConfig, ProviderSource, Runtime, ToolSource};
use wma_telemetry::TelemetryConfig;
use wma_testkit::{InMemoryToolHost, OtlpReceiver, ScriptedProvider};

fn shop() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart.",
            json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
        ),
        |_| Ok("added".to_string()),
    );
    host
}

const CALL: &str = r#"{"name": "add_to_cart", "arguments": {"id": "tent"}}"#;
const ANSWER: &str = "The tent is in your cart.";

fn options() -> LocalLoopOptions {
    LocalLoopOptions {
        tools_inline: true,
        ..LocalLoopOptions::default()
    }
}

fn ask() -> Vec<ChatMessage> {
    vec![ChatMessage::user("Add the tent to my cart")]
}

fn check(parts: &[AgentStreamPart]) {
    assert!(
        matches!(parts.last(), Some(AgentStreamPart::Finish { .. })),
        "{parts:?}"
    );
}

struct Setup {
    model: ScriptedProvider,
    host: Arc<InMemoryToolHost>,
    runtime: Runtime,
}

async fn setup() -> Setup {
    let model = ScriptedProvider::new(Vec::<String>::new());
    let host = shop();
    let runtime = Runtime::builder(ProviderSource::new({
        let model = model.clone();
        move || model.clone()
    }))
    .tool_source(ToolSource::shared("shop", host.clone()))
    .agent(AgentConfig::new("shopper").with_options(options()))
    .start()
    .await
    .expect("runtime");
    Setup {
        model,
        host,
        runtime,
    }
}

fn bench_step(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let setup = rt.block_on(setup());
    let agent = setup.runtime.agent("shopper").expect("agent");
    let mut group = c.benchmark_group("step");
    for (name, script) in [("answer", vec![ANSWER]), ("tool_call", vec![CALL, ANSWER])] {
        group.bench_function(format!("{name}/direct"), |b| {
            b.to_async(&rt).iter(|| async {
                for reply in &script {
                    setup.model.push(*reply);
                }
                let request = AgentRunRequest::new(ask(), setup.host.clone());
                let parts: Vec<_> = run_local_agent(setup.model.clone(), request, options())
                    .collect()
                    .await;
                check(&parts);
            });
        });
        group.bench_function(format!("{name}/actors"), |b| {
            b.to_async(&rt).iter(|| async {
                for reply in &script {
                    setup.model.push(*reply);
                }
                let parts = agent
                    .run(ask())
                    .await
                    .expect("admitted")
                    .collect_parts()
                    .await;
                check(&parts);
            });
        });
    }
    group.finish();
    rt.block_on(setup.runtime.shutdown());
}

fn bench_tracing(c: &mut Criterion) {
    let receiver = OtlpReceiver::start().expect("receiver");
    let off = TelemetryConfig::default()
        .resolve(|_| None)
        .expect("settings");
    let on = TelemetryConfig::exporting_to(receiver.endpoint())
        .resolve(|_| None)
        .expect("settings");
    let mut group = c.benchmark_group("tracing");
    let variants = [
        ("no_subscriber", None),
        ("export_off", Some(off)),
        ("export_on", Some(on)),
    ];
    for (name, settings) in variants {
        let built = settings.map(|s| wma_telemetry::build(&s).expect("subscriber"));
        let dispatch = built
            .as_ref()
            .map(|(dispatch, _)| dispatch.clone())
            .unwrap_or_else(
                || tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()),
            );
        // Scoped to this thread; the current-thread runtime keeps every
        // actor and task of the run on it.
        tracing::dispatcher::with_default(&dispatch, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let setup = rt.block_on(setup());
            let agent = setup.runtime.agent("shopper").expect("agent");
            group.bench_function(name, |b| {
                b.to_async(&rt).iter(|| async {
                    setup.model.push(ANSWER);
                    let parts = agent
                        .run(ask())
                        .await
                        .expect("admitted")
                        .collect_parts()
                        .await;
                    check(&parts);
                });
            });
            rt.block_on(setup.runtime.shutdown());
        });
        drop(built);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_step, bench_tracing
}
criterion_main!(benches);
