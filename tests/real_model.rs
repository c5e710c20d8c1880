//! Whole agent runs with the default model (made by `scripts/setup.sh`)
//! against the demo shop's Rust-native tools, and against the web shop's
//! WebMCP tools in headless Chromium (installed by
//! `scripts/install-peers.sh`).

use std::sync::Arc;

use futures::StreamExt;
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, LocalLoopOptions, Provider, run_local_agent,
};
use webmcp_agents::demo_shop::{self, Shop};
use webmcp_agents::usage::UsageMeter;
use wma_provider_ort::{OrtProvider, OrtProviderOptions};

fn default_model() -> OrtProvider {
    let provider = OrtProvider::new(OrtProviderOptions::default().with_max_new_tokens(96))
        .expect("the ONNX Runtime library and the default model are set up (run scripts/setup.sh)");
    let dir = provider.model_dir();
    assert!(
        dir.join("config.json").exists(),
        "the default model is missing at {}: run scripts/setup.sh",
        dir.display()
    );
    provider
}

/// The default model, loaded.
async fn loaded_model() -> OrtProvider {
    let model = default_model();
    model
        .prepare(Arc::new(|_| {}), Default::default())
        .await
        .expect("the default model loads");
    model
}

/// One run of the loop's defaults with `instructions`, to its end.
async fn run_to_end<P: Provider + 'static>(
    model: P,
    ask: &str,
    tools: Arc<dyn webmcp_agents::agent::ToolHost>,
    instructions: &str,
) -> Vec<AgentStreamPart> {
    let options = LocalLoopOptions {
        tools_inline: model.tools_inline(),
        instructions: Some(instructions.to_string()),
        ..LocalLoopOptions::default()
    };
    let request = AgentRunRequest::new(vec![ChatMessage::user(ask)], tools);
    run_local_agent(Arc::new(model), request, options)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_model_run_against_the_demo_shop_finishes_and_reports_tokens() {
    let provider = Arc::new(UsageMeter::new(Arc::new(loaded_model().await)));
    let shop = Shop::new();
    let request = AgentRunRequest::new(
        vec![ChatMessage::user(demo_shop::DEFAULT_REQUEST)],
        Arc::new(shop.tools()),
    );
    let options = LocalLoopOptions {
        max_steps: 3,
        tools_inline: provider.tools_inline(),
        instructions: Some(demo_shop::INSTRUCTIONS.to_string()),
        ..LocalLoopOptions::default()
    };
    let parts: Vec<AgentStreamPart> = run_local_agent(provider.clone(), request, options)
        .collect()
        .await;
    let last = parts.last().expect("parts");
    assert!(
        matches!(last, AgentStreamPart::Finish { .. }),
        "the run ends with a finish part: {parts:#?}"
    );
    assert!(matches!(
        parts[0],
        AgentStreamPart::MessageStart { step: 1 }
    ));
    let usage = provider.usage();
    assert!(usage.generations >= 1);
    assert!(
        usage.input_tokens > 100,
        "the prompt has the system prompt and tools: {usage:?}"
    );
    assert!(usage.output_tokens > 0, "{usage:?}");
}

/// The main job, as `wma run` does it: the default model, the default
/// request, the demo shop, the loop's defaults (constraints and grounding
/// on). The backpack must end up in the cart, found by a search for the
/// person's words rather than an id the model made up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_puts_the_backpack_in_the_cart() {
    let shop = Shop::new();
    let parts = run_to_end(
        loaded_model().await,
        demo_shop::DEFAULT_REQUEST,
        Arc::new(shop.tools()),
        demo_shop::INSTRUCTIONS,
    )
    .await;
    let calls: Vec<(&str, &serde_json::Value)> = parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::ToolCall {
                name, arguments, ..
            } => Some((name.as_str(), arguments)),
            _ => None,
        })
        .collect();
    assert_eq!(
        shop.cart()
            .iter()
            .map(|l| l.product_id.as_str())
            .collect::<Vec<_>>(),
        ["p-17"],
        "{calls:?}"
    );
    let (first, arguments) = calls[0];
    assert_eq!(first, "search_products", "{calls:?}");
    let query = arguments["query"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(query.contains("backpack"), "{calls:?}");
    assert!(
        matches!(parts.last(), Some(AgentStreamPart::Finish { .. })),
        "{parts:#?}"
    );
}

/// A general question to the shop's agent is the model's to answer: its
/// words make no call likelier than the same prompt without them (the
/// neutral baseline), so nothing pushes the model toward a search (it
/// searched the shop for "France" twice, and answered "items: No
/// results.", while a lookup was forced on every question).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_answers_a_general_question_without_a_call() {
    let shop = Shop::new();
    let parts = run_to_end(
        loaded_model().await,
        "What is the capital of France? Answer in one word.",
        Arc::new(shop.tools()),
        demo_shop::INSTRUCTIONS,
    )
    .await;
    let calls = crate::support::calls_made(&parts);
    assert!(calls.is_empty(), "{calls:?}");
    let answer: String = parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(answer.contains("Paris"), "{answer}");
}

/// Runs the `wma` binary with `args`, `stdin` piped in, in the time a
/// real model's runs may take: (success, stdout, stderr).
async fn model_wma(args: &[&str], stdin: &str) -> (bool, String, String) {
    crate::support::run_wma(
        args,
        stdin,
        std::iter::empty::<(&str, &str)>(),
        std::time::Duration::from_secs(600),
    )
    .await
}

/// The example team of `configs/shop-team.toml`, as its header says to run
/// it: the parent hands the search to its catalog helper and the found
/// backpack, one item with its id, to its cart helper, which adds it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_team_config_puts_the_backpack_in_the_cart() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/shop-team.toml");
    let (ok, stdout, stderr) =
        model_wma(&["run", "--config", config, demo_shop::DEFAULT_REQUEST], "").await;
    assert!(ok, "{stdout}\n{stderr}");
    // The cart's end state is reported after the run, with the usage.
    assert!(
        stderr.contains("cart of `cart`: 1 x p-17"),
        "{stdout}\n{stderr}"
    );
}

/// `wma run` exits 0 only on an answer: a run that reaches its step limit
/// says so in its finish and its exit status (3), and one that answers
/// exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_run_exits_with_the_status_of_how_the_run_ended() {
    // Blocking waits inside an async test: each child runs on its own.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_wma"))
        .args(["run", "--max-steps", "1", demo_shop::DEFAULT_REQUEST])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("wma runs");
    assert_eq!(
        status.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let answered = std::process::Command::new(env!("CARGO_BIN_EXE_wma"))
        .args(["run", "What is the capital of France? Answer in one word."])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("wma runs");
    assert_eq!(
        answered.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&answered.stdout)
    );
}

/// "two" is a quantity: the loop copies it into the number argument as 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_adds_as_many_as_the_person_asked_for() {
    let shop = Shop::new();
    let parts = run_to_end(
        loaded_model().await,
        "Add two of product p-21 to my cart.",
        Arc::new(shop.tools()),
        demo_shop::INSTRUCTIONS,
    )
    .await;
    let cart: Vec<(String, u32)> = shop
        .cart()
        .into_iter()
        .map(|l| (l.product_id, l.quantity))
        .collect();
    assert_eq!(
        cart,
        [("p-21".to_string(), 2)],
        "{:?}",
        crate::support::calls_made(&parts)
    );
}

/// The web shop in headless Chromium: its tools come through WebMCP, and
/// `add_to_cart` exists only on a product's page, so the model must search,
/// open the product and add it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_shops_on_a_real_web_page() {
    use webmcp_agents::tools::{Browser, BrowserOptions, LoopbackSite, SourceOptions, ToolSet};

    let model = loaded_model().await;
    let site = LoopbackSite::serve(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/web_shop"))
        .await
        .unwrap();
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = Browser::launch(BrowserOptions::default())
        .await
        .expect("Chromium is installed (scripts/install-peers.sh)");
    let page = browser.open(&site.url()).await.unwrap();
    // Tabs of one origin share storage: start from an empty cart.
    page.evaluate("localStorage.removeItem('trailhead-cart')")
        .await
        .unwrap();
    let mut tools = ToolSet::new();
    tools.add_with("shop", page.clone(), SourceOptions::default());
    let parts = run_to_end(
        model,
        demo_shop::DEFAULT_REQUEST,
        Arc::new(tools),
        "This is an outdoor shop. To buy something: search_products, then open_product \
         with the product's id, then add_to_cart on the product's page.",
    )
    .await;
    let cart = page
        .evaluate("JSON.parse(localStorage.getItem('trailhead-cart') || '[]')")
        .await
        .unwrap();
    page.close().await;
    browser.close().await;
    let ids: Vec<&str> = cart
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["product_id"].as_str())
        .collect();
    assert_eq!(ids, ["p-17"], "{:?}", crate::support::calls_made(&parts));
}

/// A model is chosen by the name the set-up installed it under, from any
/// folder, and a mistyped name is an error that lists the installed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_chosen_by_its_installed_name() {
    let name = wma_provider_ort::DEFAULT_MODEL_NAME;
    let (ok, stdout, stderr) = model_wma(
        &[
            "run",
            "--model",
            name,
            "What is the capital of France? Answer in one word.",
        ],
        "",
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("Paris"), "{stdout}\n{stderr}");
    let (ok, stdout, stderr) =
        model_wma(&["run", "--model", "SmolLM2-135M-Instruckt", "Hello"], "").await;
    assert!(!ok, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("installed models:") && stderr.contains(name),
        "{stderr}"
    );
}

/// `wma run` prints the person's view (calls, results, the answer); `-v`
/// adds what the loop's policy did at each step, and `--json` carries
/// every part for programs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_quiet_about_the_policy_unless_asked() {
    let rule_lines = |out: &str| out.lines().filter(|l| l.starts_with("· ")).count();
    let (ok, quiet, stderr) = model_wma(&["run"], "").await;
    assert!(ok, "{quiet}\n{stderr}");
    assert!(quiet.contains("→ add_to_cart"), "{quiet}");
    assert_eq!(rule_lines(&quiet), 0, "{quiet}");
    let (ok, verbose, stderr) = model_wma(&["run", "-v"], "").await;
    assert!(ok, "{verbose}\n{stderr}");
    assert!(rule_lines(&verbose) > 0, "{verbose}");
    // The same run, greedy: only the rule lines differ.
    let without: Vec<&str> = verbose.lines().filter(|l| !l.starts_with("· ")).collect();
    assert_eq!(without, quiet.lines().collect::<Vec<_>>());
}

/// `wma chat` with no config talks to the demo shop's agent on the default
/// model, turn after turn: a general question is answered, and the next
/// turn looks at the cart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_chat_without_a_config_talks_to_the_demo_agent() {
    let (ok, stdout, stderr) = model_wma(
        &["chat"],
        "What is the capital of France? Answer in one word.\nShow me my cart.\n",
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stderr.contains("talking to `shopper`"), "{stderr}");
    assert_eq!(stdout.matches("[finished:").count(), 2, "{stdout}");
    let (first, second) = stdout.split_once("[finished:").unwrap();
    assert!(first.contains("Paris"), "{stdout}");
    assert!(second.contains("→ view_cart"), "{stdout}");
}

/// `wma models` lists what the set-up installed, the default model marked,
/// with its family and the policy it gets.
#[test]
fn wma_models_lists_the_installed_models() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wma"))
        .arg("models")
        .output()
        .expect("wma runs");
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    let default = listed
        .lines()
        .find(|l| l.contains(wma_provider_ort::DEFAULT_MODEL_NAME))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        default.contains("(the default model)") && default.contains("| llama |"),
        "{default}"
    );
    assert!(default.contains("q4 ("), "{default}");
    // The evaluation model, where the set-up installed it too.
    let cache = wma_provider_ort::cache_dir().unwrap();
    if cache
        .join("models/Qwen2.5-Coder-0.5B-Instruct/config.json")
        .is_file()
    {
        assert!(
            listed.contains("| Qwen2.5-Coder-0.5B-Instruct | qwen2 |"),
            "{listed}"
        );
    }
}
