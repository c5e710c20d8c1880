//! The loop's own cost per step, with a scripted provider that answers at
//! once (so what is measured is ranking, prompt building, fitting, parsing,
//! validation and the stream), for 8, 100 and 1000 tools; and rank_tools alone.
//!
//! Run with `cargo bench --bench loop_overhead`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use serde_json::json;
use webmcp_agents::agent::{
    AgentRunRequest, ChatMessage, LocalLoopOptions, ToolDefinition, prompt::rank_tools,
    run_local_agent,
};
use wma_testkit::{InMemoryToolHost, ScriptedProvider};

const WORDS: [&str; 12] = [
    "cart", "product", "search", "order", "coupon", "review", "shipping", "account", "wishlist",
    "address", "payment", "stock",
];

fn tools(n: usize) -> Vec<ToolDefinition> {
    (0..n)
        .map(|i| {
            let a = WORDS[i % WORDS.len()];
            let b = WORDS[(i / WORDS.len()) % WORDS.len()];
            ToolDefinition::new(
                format!("{a}_{b}_{i}"),
                format!("Works with the {a} and the {b} of the shop (variant {i})."),
                json!({"type": "object", "properties": {
                    "id": {"type": "string", "description": "The id."},
                    "quantity": {"type": "integer", "minimum": 1}},
                    "required": ["id"]}),
            )
        })
        .collect()
}

fn host(n: usize) -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    for tool in tools(n) {
        host.add(tool, |_| Ok(r#"{"ok": true}"#.to_string()));
    }
    host
}

fn bench_loop(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("loop");
    for n in [8usize, 100, 1000] {
        let host = host(n);
        let call = json!({"name": "cart_product_1", "arguments": {"id": "p-1", "quantity": 2}})
            .to_string();
        group.bench_with_input(BenchmarkId::new("one_step_answer", n), &n, |b, _| {
            b.iter(|| {
                let provider = ScriptedProvider::new(["Your cart is empty."]);
                let request = AgentRunRequest::new(
                    vec![ChatMessage::user("Add two of product p-1 to my cart")],
                    host.clone(),
                );
                let options = LocalLoopOptions {
                    tools_inline: true,
                    ..LocalLoopOptions::default()
                };
                rt.block_on(async {
                    black_box(run_local_agent(provider, request, options).count().await)
                })
            })
        });
        group.bench_with_input(
            BenchmarkId::new("two_steps_call_then_answer", n),
            &n,
            |b, _| {
                b.iter(|| {
                    let provider = ScriptedProvider::new([call.clone(), "Added.".to_string()]);
                    let request = AgentRunRequest::new(
                        vec![ChatMessage::user("Add two of product p-1 to my cart")],
                        host.clone(),
                    );
                    let options = LocalLoopOptions {
                        tools_inline: true,
                        ..LocalLoopOptions::default()
                    };
                    rt.block_on(async {
                        black_box(run_local_agent(provider, request, options).count().await)
                    })
                })
            },
        );
    }
    group.finish();
}

fn bench_rank(c: &mut Criterion) {
    let mut group = c.benchmark_group("rank_tools");
    let recent = vec!["cart_product_1".to_string()];
    for n in [8usize, 100, 1000] {
        let tools = tools(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &tools, |b, tools| {
            b.iter(|| {
                black_box(rank_tools(
                    tools,
                    "add two of product p-1 to my cart",
                    &recent,
                    8,
                ))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_loop, bench_rank);
criterion_main!(benches);
