//! Config files: strict parsing, whole-file validation, and errors that name
//! the file, the line and the key of the mistake.

use crate::support::node_and_filesystem_server;
use webmcp_agents::agent::{policy::Policy, policy::PolicyName};
use webmcp_agents::config::{Config, ConfigError, ProviderSpec, ToolSourceSpec};

const FILE: &str = "configs/team.toml";

/// The error a config text gives, with its location checked to be in
/// `FILE` at `line`, on `key`, and its message to contain `says`.
fn assert_error(text: &str, line: usize, key: &str, says: &str) -> ConfigError {
    let error = Config::parse_with_env(text, FILE, |_| None).expect_err("the config is refused");
    let at = error.location().expect("the error has a location");
    assert_eq!(at.file.to_str(), Some(FILE), "{error}");
    assert_eq!(at.line, line, "line of: {error}");
    assert_eq!(at.key, key, "key of: {error}");
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("{FILE}:{line}:")),
        "the message starts with the file and line: {shown}"
    );
    assert!(
        shown.contains(&format!("`{key}`")),
        "the message names the key: {shown}"
    );
    assert!(shown.contains(says), "{shown:?} should say {says:?}");
    error
}

const GOOD: &str = r#"
[providers.script]
kind = "scripted"
replies = ["Done."]

[tools.shop]
kind = "demo-shop"

[agents.parent]
description = "Talks to the person."
sub_agents = ["child"]

[agents.child]
description = "Does the work."
tools = ["shop"]
"#;

#[test]
fn a_good_config_validates_with_its_defaults() {
    let config = Config::parse(GOOD, FILE).unwrap();
    assert_eq!(config.agents.len(), 2);
    let parent = config.agent("parent").unwrap();
    // The only provider is every agent's default.
    assert_eq!(parent.provider, "script");
    assert_eq!(parent.sub_agents, ["child"]);
    assert_eq!(parent.max_steps, 6);
    assert!(parent.tools.is_empty(), "no tools unless listed");
    assert_eq!(config.agent("child").unwrap().tools, ["shop"]);
    assert_eq!(config.server_listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.max_delegation_depth, 2);
    assert!(config.cluster.is_none());
    assert_eq!(
        config
            .top_level_agents()
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>(),
        ["parent"]
    );
    assert!(matches!(
        config.provider("script").unwrap().spec,
        ProviderSpec::Scripted(_)
    ));
    assert_eq!(config.tools[0].spec, ToolSourceSpec::DemoShop);
}

#[test]
fn an_agents_policy_and_rules_come_from_its_table() {
    let config = Config::parse(GOOD, FILE).unwrap();
    assert_eq!(
        config.agent("child").unwrap().policy,
        None,
        "no policy named: the loop picks one by the model's size"
    );
    let text = GOOD.replace(
        "[agents.child]\n",
        "[agents.child]\npolicy = \"reference\"\n",
    );
    let config = Config::parse(&text, FILE).unwrap();
    assert_eq!(
        config.agent("child").unwrap().policy,
        Some(Policy::reference())
    );
    let text = GOOD.replace(
        "[agents.child]\n",
        "[agents.child]\nrules = { ground_identifiers = false, copy_bias = 1.5 }\n",
    );
    let config = Config::parse(&text, FILE).unwrap();
    let policy = config.agent("child").unwrap().policy.clone().unwrap();
    assert_eq!(policy.base, PolicyName::SmallModel);
    assert!(!policy.ground_identifiers);
    assert_eq!(policy.copy_bias, 1.5);
    assert!(policy.move_on, "rules not named keep their defaults");
    assert_eq!(config.agent("parent").unwrap().policy, None);
}

#[test]
fn a_misspelt_rule_or_policy_is_an_error_that_names_it() {
    let text = GOOD.replace(
        "[agents.child]\n",
        "[agents.child]\nrules = { ground_identifers = false }\n",
    );
    let e = Config::parse(&text, FILE).unwrap_err().to_string();
    assert!(e.contains("agents.child.rules"), "{e}");
    assert!(e.contains("unknown rule `ground_identifers`"), "{e}");
    let text = GOOD.replace(
        "[agents.child]\n",
        "[agents.child]\npolicy = \"smal-model\"\n",
    );
    let e = Config::parse(&text, FILE).unwrap_err().to_string();
    assert!(e.contains("agents.child.policy"), "{e}");
    assert!(e.contains("unknown policy `smal-model`"), "{e}");
}

#[test]
fn an_unknown_key_names_its_line_and_key() {
    let text = GOOD.replace("[agents.child]\n", "[agents.child]\nmax_stepz = 3\n");
    assert_error(
        &text,
        14,
        "agents.child.max_stepz",
        "unknown field `max_stepz`",
    );
}

#[test]
fn an_unknown_key_in_a_provider_names_it_too() {
    let text = GOOD.replace(
        "kind = \"scripted\"\n",
        "kind = \"scripted\"\ntemprature = 0.2\n",
    );
    assert_error(
        &text,
        4,
        "providers.script.temprature",
        "unknown field `temprature`",
    );
}

#[test]
fn a_wrong_type_names_its_line_and_key() {
    let text = GOOD.replace("[agents.child]\n", "[agents.child]\nmax_steps = \"six\"\n");
    assert_error(&text, 14, "agents.child.max_steps", "invalid type");
}

#[test]
fn an_unknown_provider_is_refused_before_anything_starts() {
    let text = GOOD.replace("[agents.child]\n", "[agents.child]\nprovider = \"qwen\"\n");
    assert_error(
        &text,
        14,
        "agents.child.provider",
        "there is no provider named `qwen` (there are `script`)",
    );
}

#[test]
fn an_unknown_sub_agent_is_refused() {
    let text = GOOD.replace(
        "sub_agents = [\"child\"]",
        "sub_agents = [\"child\", \"helper\"]",
    );
    assert_error(
        &text,
        11,
        "agents.parent.sub_agents",
        "there is no agent named `helper`",
    );
}

#[test]
fn a_delegation_cycle_is_refused() {
    let text = GOOD.replace(
        "[agents.child]\n",
        "[agents.child]\nsub_agents = [\"parent\"]\n",
    );
    // Found where the circle closes, walking the agents in name order.
    assert_error(
        &text,
        11,
        "agents.parent.sub_agents",
        "delegation goes in a circle: child → parent → child",
    );
}

#[test]
fn an_agent_that_delegates_to_itself_is_a_cycle() {
    let text = GOOD.replace("sub_agents = [\"child\"]", "sub_agents = [\"parent\"]");
    assert_error(&text, 11, "agents.parent.sub_agents", "parent → parent");
}

#[test]
fn an_unknown_tool_source_is_refused() {
    let text = GOOD.replace("tools = [\"shop\"]", "tools = [\"shop\", \"files\"]");
    assert_error(
        &text,
        15,
        "agents.child.tools",
        "there is no tool source named `files`",
    );
}

#[test]
fn a_setting_of_another_kind_is_refused() {
    let text = GOOD.replace("kind = \"scripted\"", "kind = \"onnx\"");
    assert_error(
        &text,
        4,
        "providers.script.replies",
        "`replies` is not a setting of a onnx provider",
    );
    let text = GOOD.replace(
        "kind = \"demo-shop\"\n",
        "kind = \"demo-shop\"\nurl = \"http://127.0.0.1:3001/mcp\"\n",
    );
    assert_error(
        &text,
        8,
        "tools.shop.url",
        "not a setting of a demo-shop source",
    );
}

#[test]
fn a_missing_required_setting_is_named() {
    let text = GOOD.replace("replies = [\"Done.\"]\n", "");
    assert_error(&text, 3, "providers.script", "needs `replies`");
    let text = GOOD.replace("kind = \"demo-shop\"", "kind = \"mcp-stdio\"");
    assert_error(&text, 7, "tools.shop", "a mcp-stdio source needs `command`");
}

#[test]
fn an_unknown_kind_is_refused_with_the_kinds_there_are() {
    let text = GOOD.replace("kind = \"demo-shop\"", "kind = \"sql\"");
    assert_error(&text, 7, "tools.shop.kind", "unknown variant `sql`");
}

#[test]
fn an_unknown_builtin_is_refused() {
    let text = GOOD.replace(
        "kind = \"demo-shop\"",
        "kind = \"native\"\nbuiltins = [\"calculator\", \"weather\"]",
    );
    assert_error(
        &text,
        8,
        "tools.shop.builtins",
        "no built-in tool `weather`",
    );
}

#[test]
fn a_toml_syntax_error_names_its_line() {
    let text = GOOD.replace(
        "description = \"Does the work.\"",
        "description = \"Does the work.",
    );
    let error = Config::parse(&text, FILE).unwrap_err();
    let at = error.location().unwrap();
    assert_eq!(at.line, 14, "{error}");
    assert!(
        error.to_string().starts_with("configs/team.toml:14:"),
        "{error}"
    );
}

#[test]
fn a_bad_address_is_refused() {
    let text = format!("{GOOD}\n[server]\nlisten = \"localhost\"\n");
    assert_error(&text, 18, "server.listen", "is not an address and port");
}

#[test]
fn several_providers_need_the_agent_to_choose() {
    let text = format!("{GOOD}\n[providers.other]\nkind = \"scripted\"\nreplies = []\n");
    assert_error(&text, 13, "agents.child", "must name one with `provider`");
}

#[test]
fn a_cluster_needs_a_cookie_and_remote_agents_need_a_cluster() {
    let remote = GOOD.replace(
        "[agents.child]\n",
        "[agents.far]\nremote = true\ndescription = \"Elsewhere.\"\n\n[agents.child]\n",
    );
    assert_error(&remote, 13, "agents.far", "add a [cluster] table");

    let with_cluster = format!("{remote}\n[cluster]\ncookie_env = \"WMA_TEST_COOKIE\"\n");
    assert_error(
        &with_cluster,
        22,
        "cluster.cookie_env",
        "the variable `WMA_TEST_COOKIE` is not set",
    );
    let config = Config::parse_with_env(&with_cluster, FILE, |name| {
        (name == "WMA_TEST_COOKIE").then(|| "secret".to_string())
    })
    .unwrap();
    let cluster = config.cluster.unwrap();
    assert_eq!(cluster.cookie, "secret");
    assert_eq!(cluster.listen.ip().to_string(), "127.0.0.1");
    assert_eq!(config.remote_agents[0].name, "far");

    let remote_with_tools =
        remote.replace("remote = true\n", "remote = true\ntools = [\"shop\"]\n");
    assert_error(
        &format!("{remote_with_tools}\n[cluster]\ncookie = \"x\"\n"),
        15,
        "agents.far.tools",
        "not a setting of a remote agent",
    );
}

#[test]
fn a_missing_file_names_it() {
    let error = Config::load("configs/no-such-file.toml").unwrap_err();
    assert!(matches!(error, ConfigError::Read { .. }));
    assert!(error.to_string().contains("configs/no-such-file.toml"));
}

/// Every example config validates, and `wma check` passes it as a person
/// runs it, from the repository's root with the path its header gives.
#[test]
fn every_config_in_configs_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::parse_with_env(&std::fs::read_to_string(&path).unwrap(), &path, |_| {
                Some("cookie".to_string())
            })
            .unwrap_or_else(|e| panic!("{e}"));
            let relative = format!("configs/{}", path.file_name().unwrap().to_string_lossy());
            let (code, stdout, stderr) = finished(
                wma_command()
                    .current_dir(env!("CARGO_MANIFEST_DIR"))
                    .args(["check", &relative])
                    // The cluster examples name the variable of their cookie.
                    .env("WMA_CLUSTER_COOKIE", "a-long-enough-cookie-for-the-check"),
            );
            assert_eq!(code, Some(0), "wma check {relative}: {stdout}\n{stderr}");
            assert!(stdout.starts_with(&format!("{relative}: ok")), "{stdout}");
            checked += 1;
        }
    }
    assert!(checked >= 5, "the example configs are there");
}

/// The pids of this process's descendants whose program name contains
/// `what` (a browser runs under a watchdog shell, so not as a child).
fn descendants_named(what: &str) -> Vec<u32> {
    let out = std::process::Command::new("ps")
        .args(["-eo", "pid=,ppid=,comm="])
        .output()
        .expect("ps runs");
    let table: Vec<(u32, u32, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.collect::<Vec<_>>().join(" "),
            ))
        })
        .collect();
    let mut family = vec![std::process::id()];
    let mut i = 0;
    while i < family.len() {
        let parent = family[i];
        family.extend(
            table
                .iter()
                .filter(|(_, pp, _)| *pp == parent)
                .map(|(p, _, _)| *p),
        );
        i += 1;
    }
    table
        .iter()
        .filter(|(p, _, comm)| family.contains(p) && comm.contains(what))
        .map(|(p, _, _)| *p)
        .collect()
}

/// A config-hosted WebMCP page whose Chromium was killed serves again on
/// the next step, and the set's health counts the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_hosted_webmcp_source_whose_browser_was_killed_serves_again() {
    use webmcp_agents::agent::ToolHost;
    use webmcp_agents::config::StartOptions;
    use wma_tools::{LoopbackSite, SourceState};

    // It kills every Chromium under this process: none of another test's.
    let _chromium = crate::support::CHROMIUM.write().await;
    let site = LoopbackSite::serve(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/web_shop"))
        .await
        .unwrap();
    let text = format!(
        "[providers.script]\nkind = \"scripted\"\nreplies = [\"Done.\"]\n\n\
         [tools.page]\nkind = \"webmcp\"\nurl = \"{}\"\ncall_timeout_secs = 90\n\n\
         [agents.shopper]\ntools = [\"page\"]\n",
        site.url()
    );
    let config = Config::parse(&text, FILE).unwrap();
    let hosted = config.start(StartOptions::default()).await.unwrap();
    let tools = hosted.runtime.tools();
    let names = |tools: &[webmcp_agents::agent::ToolDefinition]| -> Vec<String> {
        tools.iter().map(|t| t.name.clone()).collect()
    };
    assert!(names(&tools.list_tools().await).contains(&"view_cart".to_string()));
    let browsers = descendants_named("chromium");
    assert!(
        !browsers.is_empty(),
        "the page's Chromium runs as our child"
    );
    for pid in browsers {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    // The next step's listing reopens the page (bounded wait: the page
    // notices the dead browser on its next use).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = names(&tools.list_tools().await);
        if listed.contains(&"view_cart".to_string()) {
            let health = &hosted.tool_sets[0].1.health()[0];
            if health.restarts >= 1 {
                assert_eq!(health.state, SourceState::Ready, "{health:?}");
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the page never came back: {:?}",
            hosted.tool_sets[0].1.health()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let result = tools
        .call_tool(
            "view_cart",
            serde_json::json!({}),
            tokio_util::sync::CancellationToken::new(),
        )
        .await;
    assert!(result.is_ok(), "{result:?}");
    hosted.shutdown().await;
}

#[test]
fn the_servers_token_and_limits_come_from_its_table() {
    use webmcp_agents::serve::{ServerOptions, TokenSource};
    let config = Config::parse(GOOD, FILE).unwrap();
    assert_eq!(config.server_options, ServerOptions::default());
    let text = format!(
        "{GOOD}\n[server]\ntoken_env = \"WMA_TEAM_TOKEN\"\nallowed_origins = [\"https://app.example\"]\nheader_timeout_secs = 3\nmax_runs_per_client = 2\nmax_connections_per_client = 5\n"
    );
    let options = Config::parse(&text, FILE).unwrap().server_options;
    assert_eq!(options.token, TokenSource::Env("WMA_TEAM_TOKEN".into()));
    assert_eq!(options.allowed_origins, ["https://app.example"]);
    assert_eq!(options.header_timeout, std::time::Duration::from_secs(3));
    assert_eq!(options.max_runs_per_client, 2);
    assert_eq!(options.max_connections_per_client, 5);
    let text = format!("{GOOD}\n[server]\ntoken_file = \"secret/token\"\n");
    assert_eq!(
        Config::parse(&text, FILE).unwrap().server_options.token,
        TokenSource::File("configs/secret/token".into()),
        "a token file is read relative to the config's folder"
    );
    let lines = GOOD.lines().count();
    let both = format!("{GOOD}\n[server]\ntoken_env = \"A\"\ntoken_file = \"b\"\n");
    assert_error(&both, lines + 4, "server.token_file", "not both");
    let zero = format!("{GOOD}\n[server]\nmax_connections = 0\n");
    assert_error(&zero, lines + 3, "server.max_connections", "at least 1");
    let zero = format!("{GOOD}\n[server]\nmax_connections_per_client = 0\n");
    assert_error(
        &zero,
        lines + 3,
        "server.max_connections_per_client",
        "at least 1",
    );
}

const SERVED: &str = r#"
[providers.served]
kind = "openai"
url = "http://127.0.0.1:8080/v1"
model = "SmolLM2-135M-Instruct"
api_key_env = "OPENAI_API_KEY"
context_length = 4096
max_new_tokens = 128
temperature = 0.2
request_timeout_secs = 90
dialect = "llamacpp"

[agents.helper]
provider = "served"
"#;

#[test]
fn a_served_provider_takes_its_settings() {
    let config = Config::parse_with_env(SERVED, FILE, |_| None).unwrap();
    let ProviderSpec::Openai(options) = &config.provider("served").unwrap().spec else {
        panic!("an openai provider");
    };
    assert_eq!(options.url, "http://127.0.0.1:8080/v1");
    assert_eq!(options.model, "SmolLM2-135M-Instruct");
    // The variable's name, not its value: the key is read when the
    // provider is made.
    assert_eq!(options.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
    assert_eq!(options.context_length, Some(4096));
    assert_eq!(options.max_new_tokens, 128);
    assert_eq!(options.temperature, Some(0.2));
    assert_eq!(options.request_timeout, std::time::Duration::from_secs(90));
    assert_eq!(
        options.dialect,
        Some(wma_provider_openai::Dialect::LlamaCpp)
    );
    // Unset: the server's template decides.
    assert_eq!(options.tools_inline, None);
    // A dialect nobody speaks is a mistake, named.
    let unknown = SERVED.replace("\"llamacpp\"", "\"ollama\"");
    assert!(Config::parse_with_env(&unknown, FILE, |_| None).is_err());
}

#[test]
fn a_served_providers_mistakes_name_their_key() {
    let typo = SERVED.replace("api_key_env", "api_key_evn");
    assert_error(
        &typo,
        6,
        "providers.served.api_key_evn",
        "unknown field `api_key_evn`",
    );
    // A setting of another kind is refused on a served model by name.
    let other = SERVED.replace("temperature = 0.2", "top_k = 40");
    assert_error(
        &other,
        9,
        "providers.served.top_k",
        "`top_k` is not a setting of a openai provider",
    );
    let scheme = SERVED.replace("http://127.0.0.1:8080/v1", "127.0.0.1:8080");
    assert_error(
        &scheme,
        4,
        "providers.served.url",
        "not an http:// or https:// address",
    );
    let no_url = SERVED.replace("url = \"http://127.0.0.1:8080/v1\"\n", "");
    assert_error(&no_url, 3, "providers.served", "needs `url`");
    let zero = SERVED.replace("request_timeout_secs = 90", "request_timeout_secs = 0");
    assert_error(
        &zero,
        10,
        "providers.served.request_timeout_secs",
        "must be at least 1",
    );
    // And the served model's keys are refused on the other kinds.
    let onnx = SERVED.replace("kind = \"openai\"", "kind = \"onnx\"");
    assert_error(
        &onnx,
        4,
        "providers.served.url",
        "`url` is not a setting of a onnx provider",
    );
}

const ONNX_CACHE: &str = r#"
[providers.small]
kind = "onnx"
kv_sessions = 3
kv_cache_mib = 256
fast_forward = true
prompt_lookup = true

[agents.shopper]
description = "Shops."
"#;

#[test]
fn an_onnx_providers_cache_settings_reach_its_options() {
    let config = Config::parse_with_env(ONNX_CACHE, FILE, |_| None).unwrap();
    let ProviderSpec::Onnx(options) = &config.provider("small").unwrap().spec else {
        panic!("an onnx provider");
    };
    assert_eq!(options.kv_sessions, 3);
    assert_eq!(options.kv_cache_bytes, 256 << 20);
    assert!(options.fast_forward);
    assert!(options.prompt_lookup);

    // Unset, they are the provider's own defaults.
    let plain = Config::parse_with_env(
        GOOD.replace("scripted\"\nreplies = [\"Done.\"]", "onnx\"")
            .as_str(),
        FILE,
        |_| None,
    )
    .unwrap();
    let ProviderSpec::Onnx(defaults) = &plain.provider("script").unwrap().spec else {
        panic!("an onnx provider");
    };
    let own = wma_provider_ort::OrtProviderOptions::default();
    assert_eq!(defaults.kv_sessions, own.kv_sessions);
    assert_eq!(defaults.kv_cache_bytes, own.kv_cache_bytes);
    assert_eq!(defaults.fast_forward, own.fast_forward);
    assert_eq!(defaults.prompt_lookup, own.prompt_lookup);

    // No cache at all is a mistake, named; so is a cache setting on a scripted model.
    let none = ONNX_CACHE.replace("kv_sessions = 3", "kv_sessions = 0");
    assert_error(
        &none,
        4,
        "providers.small.kv_sessions",
        "must be at least 1",
    );
    let empty = ONNX_CACHE.replace("kv_cache_mib = 256", "kv_cache_mib = 0");
    assert_error(
        &empty,
        5,
        "providers.small.kv_cache_mib",
        "must be at least 1",
    );
    let scripted = ONNX_CACHE.replace(
        "kind = \"onnx\"",
        "kind = \"scripted\"\nreplies = [\"Done.\"]",
    );
    assert_error(
        &scripted,
        5,
        "providers.small.kv_sessions",
        "not a setting of a scripted provider",
    );
}

#[test]
fn a_webmcp_source_offers_debugging_tools_only_when_it_says_so() {
    let page = |extra: &str| {
        let text = GOOD.replace(
            "kind = \"demo-shop\"\n",
            &format!("kind = \"webmcp\"\nurl = \"http://127.0.0.1:8080/\"\n{extra}"),
        );
        let config =
            Config::parse_with_env(&text, FILE, |_| None).unwrap_or_else(|e| panic!("{e}"));
        let source = config.tools.iter().find(|t| t.name == "shop").unwrap();
        match &source.spec {
            ToolSourceSpec::WebMcp {
                debugging_tools, ..
            } => *debugging_tools,
            other => panic!("{other:?}"),
        }
    };
    assert!(!page(""), "held back by default");
    assert!(page("debugging_tools = true\n"));
    let text = GOOD.replace(
        "kind = \"demo-shop\"\n",
        "kind = \"demo-shop\"\ndebugging_tools = true\n",
    );
    assert_error(
        &text,
        8,
        "tools.shop.debugging_tools",
        "not a setting of a demo-shop source",
    );
}

/// `wma check --pages` reads a page's tools as the host opens it: forms
/// with and without autosubmit, a frame's tool, and a debugging tool that
/// is not offered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webmcp_sources_page_tools_show_forms_frames_and_annotations() {
    use wma_tools::LoopbackSite;

    let _chromium = crate::support::CHROMIUM.read().await;
    let site = LoopbackSite::serve(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/tools/tests/pages/conformance"
    ))
    .await
    .unwrap();
    let text = format!(
        "[providers.script]\nkind = \"scripted\"\nreplies = [\"Done.\"]\n\n\
         [tools.bistro]\nkind = \"webmcp\"\nurl = \"{}\"\n\n\
         [agents.host]\ntools = [\"bistro\"]\n",
        site.url_of("/index.html")
    );
    let config = Config::parse(&text, FILE).unwrap();
    let pages = config.page_tools().await;
    assert_eq!(pages.len(), 1);
    let (source, tools) = &pages[0];
    assert_eq!(source, "bistro");
    let tools = tools.as_ref().unwrap_or_else(|e| panic!("{e}"));
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.definition.name == name)
            .unwrap_or_else(|| panic!("no {name} in {tools:?}"))
    };
    assert!(tool("book_table").declarative && !tool("book_table").autosubmit);
    assert!(tool("find_flight").declarative && tool("find_flight").autosubmit);
    assert!(tool("dump_state").debugging && !tool("dump_state").offered);
    assert!(
        tool("late_tool").offered,
        "the page's late tool is waited for"
    );
    assert!(
        tool("widget_hours")
            .frame_url
            .as_deref()
            .is_some_and(|u| u.ends_with("/frame.html"))
    );
}

/// A scripted agent, `clerk`, that answers "Hi.".
const SCRIPTED_CLERK: &str =
    "[providers.p]\nkind = \"scripted\"\nreplies = [\"Hi.\"]\n\n[agents.clerk]\nprovider = \"p\"\n";

/// A scratch folder for one test, with `config.toml` holding `text`: the
/// folder (to remove at the end) and the config's path.
fn scratch_config(name: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("wma-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

/// The `wma` binary with its stdin closed.
fn wma_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wma"));
    command.stdin(std::process::Stdio::null());
    command
}

/// Runs `command` to its end: its exit status, stdout and stderr.
fn finished(command: &mut std::process::Command) -> (Option<i32>, String, String) {
    let out = command.output().expect("wma runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `wma run --config` with the plain run's flags: a loop flag given on the
/// command line overrides the agent's setting and says so; a model flag is
/// an error that says where the model is set, before anything starts.
#[test]
fn run_flags_with_a_config_apply_or_say_why_not() {
    let (dir, config) = scratch_config("run-flags", &format!("{SCRIPTED_CLERK}max_steps = 4\n"));
    let wma = |flags: &[&str]| {
        finished(
            wma_command()
                .arg("run")
                .arg("--config")
                .arg(&config)
                .args(flags)
                .arg("Hello"),
        )
    };
    let (code, stdout, stderr) = wma(&["--max-steps", "2", "--policy", "reference"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Hi."), "{stdout}");
    assert!(
        stderr.contains("max_steps 2 (the config: 4)") && stderr.contains("policy reference"),
        "{stderr}"
    );
    let (code, stdout, stderr) = wma(&["--model", "SmolLM2-135M-Instruct"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("--model cannot be used with --config"),
        "{stderr}"
    );
    assert!(!stdout.contains("Hi."), "nothing ran: {stdout}");
    let (code, _, stderr) = wma(&["--rule", "copy_bias=0"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--rule needs --policy"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `wma completions SHELL` prints a completion script the shell accepts,
/// with every command.
#[test]
fn completions_are_printed_for_a_shell() {
    let (code, script, _) = finished(wma_command().args(["completions", "bash"]));
    assert_eq!(code, Some(0));
    for command in ["run", "chat", "serve", "check", "eval", "completions"] {
        assert!(script.contains(command), "{command} missing");
    }
    let checked = std::process::Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .expect("bash runs");
    assert!(checked.success(), "bash refuses the script");
    let (code, _, _) = finished(wma_command().args(["completions", "tcsh"]));
    assert_eq!(code, Some(2), "an unknown shell is a usage error");
}

/// A tool source the agent needs that cannot start is an error of the run
/// (exit status 1, the reason said), not a warning before an answer made
/// without its tools.
#[test]
fn a_run_whose_tool_source_cannot_start_is_an_error() {
    let (dir, config) = scratch_config(
        "broken-source",
        &format!(
            "{SCRIPTED_CLERK}tools = [\"broken\"]\n\n\
             [tools.broken]\nkind = \"mcp-stdio\"\ncommand = \"/nonexistent/mcp-server\"\n"
        ),
    );
    let (code, stdout, stderr) = finished(
        wma_command()
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("Hello"),
    );
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the tool source `broken` that `clerk` needs could not start")
            && stderr.contains("/nonexistent/mcp-server"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("Hi."),
        "no answer without the tools: {stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Traces sent to a collector that is not there: the run still answers,
/// and says once that its spans went nowhere.
#[test]
fn an_unreachable_collector_is_said_once() {
    let (dir, config) = scratch_config("no-collector", SCRIPTED_CLERK);
    // A port nobody listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, stdout, stderr) = finished(
        wma_command()
            .args(["run", "--otlp", "--config"])
            .arg(&config)
            .arg("Hello")
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{port}"),
            )
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Hi."), "{stdout}");
    assert_eq!(
        stderr.matches("traces could not be sent to").count(),
        1,
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `wma models rm NAME` removes a model `wma models` lists, and refuses a
/// name that is not installed (a path included) without touching anything.
#[test]
fn an_installed_model_is_removed_by_name() {
    let cache = std::env::temp_dir().join(format!("wma-models-rm-{}", std::process::id()));
    let model = cache.join("models").join("Small-Model");
    std::fs::create_dir_all(model.join("onnx")).unwrap();
    std::fs::write(model.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    std::fs::write(model.join("onnx/model_q4.onnx"), "graph").unwrap();
    let wma = |args: &[&str]| finished(wma_command().args(args).env("WMA_CACHE_DIR", &cache));
    let (code, listed, _) = wma(&["models"]);
    assert_eq!(code, Some(0));
    assert!(listed.contains("| Small-Model | llama |"), "{listed}");
    for wrong in ["Other-Model", "../models/Small-Model", "."] {
        let (code, _, stderr) = wma(&["models", "rm", wrong]);
        assert_eq!(code, Some(1), "{wrong}: {stderr}");
        assert!(stderr.contains("no installed model is named"), "{stderr}");
        assert!(model.is_dir(), "{wrong} removed nothing");
    }
    let (code, stdout, stderr) = wma(&["models", "rm", "Small-Model"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("removed Small-Model"), "{stdout}");
    assert!(!model.exists());
    let (_, listed, _) = wma(&["models"]);
    assert!(listed.contains("no models in"), "{listed}");
    std::fs::remove_dir_all(&cache).unwrap();
}

// ---------------------------------------------------------------------------
// MCP servers from an `mcpServers` JSON file (`mcp_servers = "mcp.json"`).

/// A scratch folder holding `mcp.json` and `config.toml`: the folder and
/// the config's path.
fn scratch_mcp_config(
    name: &str,
    json: &str,
    toml: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (dir, config) = scratch_config(name, toml);
    std::fs::write(dir.join("mcp.json"), json).unwrap();
    (dir, config)
}

/// A scripted provider and `mcp_servers = "mcp.json"`, before any table.
const MCP_HEAD: &str =
    "mcp_servers = \"mcp.json\"\n\n[providers.p]\nkind = \"scripted\"\nreplies = [\"Hi.\"]\n";

/// The error a config of `mcp.json` holding `json` gives, with the JSON
/// file and its line checked, the key named and `says` said.
fn assert_mcp_error(name: &str, json: &str, line: usize, key: &str, says: &str) {
    let (dir, config) = scratch_mcp_config(name, json, MCP_HEAD);
    let error = Config::load(&config).expect_err("the file is refused");
    let at = error.location().expect("the error has a location");
    assert_eq!(at.file, dir.join("mcp.json"), "{error}");
    assert_eq!((at.line, at.key.as_str()), (line, key), "{error}");
    let shown = error.to_string();
    assert!(
        key.is_empty() || shown.contains(&format!("`{key}`")),
        "{shown}"
    );
    assert!(shown.contains(says), "{shown:?} should say {says:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_mcp_servers_file_makes_a_tool_source_of_each_server() {
    // Other clients' settings beside `mcpServers` (a whole Claude Desktop
    // config), and keys they write that change nothing here.
    let json = r#"{
  "globalShortcut": "Ctrl+Space",
  "mcpServers": {
    "files": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/files"],
      "env": {"LOG_LEVEL": "debug"},
      "description": "My files.",
      "timeout": 60,
      "alwaysAllow": ["read_text_file"],
      "autoApprove": [],
      "disabledTools": ["write_file"]
    },
    "remote": {"url": "http://127.0.0.1:3001/mcp"},
    "typed": {"type": "streamable-http", "url": "http://127.0.0.1:3002/mcp", "headers": {}},
    "old": {"command": "old-server", "disabled": true, "whatever": 1}
  }
}"#;
    let toml = format!(
        "{MCP_HEAD}\n[tools.shop]\nkind = \"demo-shop\"\n\n\
         [agents.helper]\ntools = [\"files\", \"remote\", \"typed\", \"shop\"]\n"
    );
    let (dir, config) = scratch_mcp_config("mcp-sources", json, &toml);
    let config = Config::load(&config).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = config.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["shop", "files", "remote", "typed"],
        "the config's tables, then the file's servers in its order; `old` is disabled"
    );
    let files = &config.tools[1];
    assert_eq!(
        files.spec,
        ToolSourceSpec::McpStdio {
            command: "npx".into(),
            args: vec![
                "-y".into(),
                "@modelcontextprotocol/server-filesystem".into(),
                "/srv/files".into()
            ],
            env: vec![("LOG_LEVEL".into(), "debug".into())],
            cwd: None,
        }
    );
    assert_eq!(
        files.policy.deny,
        ["write_file"],
        "disabledTools is a deny list"
    );
    for (source, url) in [
        (2, "http://127.0.0.1:3001/mcp"),
        (3, "http://127.0.0.1:3002/mcp"),
    ] {
        assert_eq!(
            config.tools[source].spec,
            ToolSourceSpec::McpHttp { url: url.into() }
        );
    }
    assert_eq!(
        config.agent("helper").unwrap().tools,
        ["files", "remote", "typed", "shop"]
    );
    assert_eq!(config.notes.len(), 1, "{:?}", config.notes);
    assert!(
        config.notes[0].contains("`mcpServers.old` is marked \"disabled\": true")
            && config.notes[0].contains("mcp.json"),
        "{:?}",
        config.notes
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `wma check` says which `mcpServers` entries are disabled and so not
/// started: a run only logs it, and a person checking the config should
/// see it there.
#[test]
fn wma_check_says_which_mcp_servers_are_disabled() {
    let json = r#"{"mcpServers": {"files": {"command": "fs-server"}, "off": {"command": "old-server", "disabled": true}}}"#;
    let (dir, config) = scratch_mcp_config("mcp-check-notes", json, MCP_HEAD);
    let (code, stdout, stderr) = finished(wma_command().arg("check").arg(&config));
    assert_eq!(code, Some(0), "{stderr}");
    let note = stdout
        .lines()
        .find(|line| line.starts_with("  note: "))
        .unwrap_or_else(|| panic!("no note: {stdout}"));
    assert!(
        note.contains(
            "mcp.json: `mcpServers.off` is marked \"disabled\": true, so it is not started"
        ),
        "{note}"
    );
    assert!(stdout.contains("tools: files\n"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A provider and an `mcpServers` file are a whole config: its one agent
/// sees every tool source. Without a provider to run it on, or with
/// several to choose from, the config says so.
#[test]
fn a_config_without_agents_gets_one_agent_over_every_tool_source() {
    let json = r#"{"mcpServers": {"files": {"command": "fs-server"}, "remote": {"url": "http://127.0.0.1:3001/mcp"}}}"#;
    let (dir, config) = scratch_mcp_config("mcp-no-agents", json, MCP_HEAD);
    let loaded = Config::load(&config).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = loaded.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, [webmcp_agents::config::DEFAULT_AGENT]);
    let agent = &loaded.agents[0];
    assert_eq!(agent.name, "assistant");
    assert_eq!(agent.provider, "p");
    assert_eq!(agent.tools, ["files", "remote"]);
    assert_eq!(agent.max_steps, 6, "every other setting at its default");
    let (code, stdout, stderr) = finished(wma_command().arg("check").arg(&config));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("agent assistant on p, tools: files, remote"),
        "{stdout}"
    );

    let none = "mcp_servers = \"mcp.json\"\n";
    std::fs::write(&config, none).unwrap();
    let e = Config::load(&config).unwrap_err().to_string();
    assert!(
        e.contains("`providers`") && e.contains("add a [providers.NAME] table"),
        "{e}"
    );
    let two = format!("{MCP_HEAD}\n[providers.q]\nkind = \"scripted\"\nreplies = []\n");
    std::fs::write(&config, two).unwrap();
    let e = Config::load(&config).unwrap_err().to_string();
    assert!(
        e.contains("(there are `p`, `q`)") && e.contains("add an [agents.NAME] table"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // With no tool source either, an agent must still be written.
    assert_error(
        "[providers.p]\nkind = \"scripted\"\nreplies = []\n",
        1,
        "agents",
        "the config has no agents",
    );
}

#[test]
fn a_server_named_like_a_tools_table_is_an_error_that_says_which() {
    let json = r#"{"mcpServers": {"shop": {"command": "shop-server"}}}"#;
    let toml = format!("{MCP_HEAD}\n[tools.shop]\nkind = \"demo-shop\"\n");
    let (dir, config) = scratch_mcp_config("mcp-clash", json, &toml);
    let error = Config::load(&config).unwrap_err();
    let at = error.location().unwrap();
    assert_eq!(
        (at.file.as_path(), at.line),
        (config.as_path(), 7),
        "{error}"
    );
    assert_eq!(at.key, "tools.shop");
    let shown = error.to_string();
    assert!(
        shown.contains(&format!(
            "`shop` is also a server of {} (`mcpServers.shop`)",
            dir.join("mcp.json").display()
        )) && shown.contains("rename one of them"),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An SSE server cannot be reached, so it is a mistake named at its entry
/// in the JSON file, not a source that never answers.
#[test]
fn a_transport_wma_does_not_speak_is_an_error_naming_the_entry() {
    let json = |kind: &str| {
        format!(
            "{{\n  \"mcpServers\": {{\n    \"files\": {{\"command\": \"fs\"}},\n    \"legacy\": {{\n      \"type\": \"{kind}\",\n      \"url\": \"http://127.0.0.1:3001/sse\"\n    }}\n  }}\n}}\n"
        )
    };
    assert_mcp_error(
        "mcp-sse",
        &json("sse"),
        5,
        "mcpServers.legacy.type",
        "`legacy` is an SSE server, a transport wma does not speak",
    );
    assert_mcp_error(
        "mcp-ws",
        &json("websocket"),
        5,
        "mcpServers.legacy.type",
        "unknown transport `websocket`",
    );
}

#[test]
fn a_missing_or_broken_mcp_servers_file_is_an_error() {
    let (dir, config) =
        scratch_config("mcp-missing", &MCP_HEAD.replace("mcp.json", "no-such.json"));
    let error = Config::load(&config).unwrap_err();
    let at = error.location().unwrap();
    assert_eq!(
        (at.file.as_path(), at.line),
        (config.as_path(), 1),
        "{error}"
    );
    assert_eq!(at.key, "mcp_servers");
    let shown = error.to_string();
    assert!(
        shown.contains(&format!(
            "could not read the mcpServers file {}",
            dir.join("no-such.json").display()
        )),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Not JSON: the JSON file's own line and column.
    let (dir, config) = scratch_mcp_config(
        "mcp-broken",
        "{\"mcpServers\": {\n  \"a\": {,}\n}}",
        MCP_HEAD,
    );
    let error = Config::load(&config).unwrap_err();
    let at = error.location().unwrap();
    assert_eq!(
        (at.file.clone(), at.line),
        (dir.join("mcp.json"), 2),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    assert_mcp_error(
        "mcp-no-servers",
        "{\"servers\": {}}",
        1,
        "",
        "the file has no `mcpServers` object",
    );
}

/// Keys of an entry that would change what the server does, and that wma
/// cannot honour, are refused by name, as is a key no client writes.
#[test]
fn keys_of_an_entry_that_cannot_be_honoured_are_errors() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#""url": "http://127.0.0.1:3001/mcp", "headers": {"Authorization": "Bearer x"}"#,
            "headers",
            "wma sends no extra headers",
        ),
        (
            r#""command": "fs", "envFile": ".env""#,
            "envFile",
            "wma does not read env files",
        ),
        (
            r#""comand": "fs""#,
            "comand",
            "wma does not know `comand`: it reads `type`, `command`",
        ),
        (
            r#""command": "fs", "env": {"TOKEN": "${GITHUB_TOKEN}"}"#,
            "env",
            "wma does not expand `${...}`",
        ),
        (
            r#""command": "fs", "url": "http://127.0.0.1:3001/mcp""#,
            "url",
            "has both `command`",
        ),
        (
            r#""type": "stdio", "url": "http://127.0.0.1:3001/mcp""#,
            "url",
            "`url` is a setting of an HTTP server",
        ),
        (
            r#""type": "http", "url": "http://127.0.0.1:3001/mcp", "args": ["x"]"#,
            "args",
            "`args` is a setting of a stdio server",
        ),
        (
            r#""args": 3, "command": "fs""#,
            "args",
            "should be a list of strings",
        ),
        (
            r#""disabled": "yes""#,
            "disabled",
            "should be true or false",
        ),
    ];
    for (i, (entry, key, says)) in cases.iter().enumerate() {
        assert_mcp_error(
            &format!("mcp-keys-{i}"),
            &format!("{{\"mcpServers\": {{\n\"files\": {{{entry}}}}}}}"),
            2,
            &format!("mcpServers.files.{key}"),
            says,
        );
    }
    assert_mcp_error(
        "mcp-keys-none",
        "{\"mcpServers\": {\n\"files\": {\"description\": \"x\"}}}",
        2,
        "mcpServers.files",
        "needs `command`",
    );
    assert_mcp_error(
        "mcp-keys-name",
        "{\"mcpServers\": {\n\"my files\": {\"command\": \"fs\"}}}",
        2,
        "mcpServers.my files",
        "may use only letters, digits",
    );
}

#[test]
fn an_agent_that_lists_a_disabled_server_is_told_it_is_disabled() {
    let json = r#"{"mcpServers": {"files": {"command": "fs", "disabled": true}}}"#;
    let toml = format!("{MCP_HEAD}\n[agents.helper]\ntools = [\"files\"]\n");
    let (dir, config) = scratch_mcp_config("mcp-disabled-agent", json, &toml);
    let error = Config::load(&config).unwrap_err();
    assert_eq!(error.location().unwrap().key, "agents.helper.tools");
    let shown = error.to_string();
    assert!(
        shown.contains("`files` is marked \"disabled\": true in")
            && shown.contains("take it out of `tools`"),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The repository's root, where the example configs' relative paths start.
fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An agent-less config and an `mcpServers` file: `wma run` starts the
/// real server the file names, the scripted model's call reads a file
/// through it, and the disabled entry is said and not started.
#[test]
fn an_mcp_servers_file_runs_the_reference_filesystem_server() {
    let (node, server) = node_and_filesystem_server();
    let (dir, _) = scratch_config("mcp-run", "");
    let folder = dir.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("plan.txt"), "Meet at the lighthouse at nine.\n").unwrap();
    let json = serde_json::json!({"mcpServers": {
        "files": {
            "command": node,
            "args": [server, folder.canonicalize().unwrap()],
            "description": "The plans folder."
        },
        "off": {"command": "/nonexistent/mcp-server", "disabled": true}
    }});
    std::fs::write(dir.join("mcp.json"), json.to_string()).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "mcp_servers = \"mcp.json\"\n\n[providers.p]\nkind = \"scripted\"\nreplies = [\
         '{\"name\": \"read_text_file\", \"arguments\": {\"path\": \"plan.txt\"}}', \
         \"At the lighthouse at nine.\"]\n",
    )
    .unwrap();
    let (code, stdout, stderr) = finished(
        wma_command()
            .args(["run", "--config"])
            .arg(&config)
            .arg("Where do we meet?"),
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("← read_text_file: Meet at the lighthouse at nine."),
        "the server read the file: {stdout}"
    );
    assert!(
        stderr.contains("`mcpServers.off` is marked \"disabled\": true, so it is not started"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `configs/mcp-files.toml` and its `configs/mcp-servers.json`, run from
/// the repository's root as their header says, with a scripted model in
/// place of the default one: the agent reads the example folder through
/// the real server.
#[test]
fn the_example_mcp_config_reads_its_folder_through_the_real_server() {
    node_and_filesystem_server();
    let example = std::fs::read_to_string(repo().join("configs/mcp-files.toml")).unwrap();
    let servers = "mcp_servers = \"mcp-servers.json\"";
    // The provider's table, up to the next table.
    let provider = example.find("[providers.small]").and_then(|start| {
        let end = start + 1 + example[start + 1..].find("\n[")?;
        Some(start..end)
    });
    let (Some(provider), true) = (provider, example.contains(servers)) else {
        panic!("the example's shape changed: update this test");
    };
    let mut scripted = example.clone();
    scripted.replace_range(
        provider,
        "[providers.small]\nkind = \"scripted\"\nreplies = [\
         '{\"name\": \"read_text_file\", \"arguments\": {\"path\": \"notes.txt\"}}', \
         \"It is teal-otter-42.\"]\n",
    );
    let scripted = scripted.replace(
        servers,
        &format!(
            "mcp_servers = {:?}",
            repo()
                .join("configs/mcp-servers.json")
                .display()
                .to_string()
        ),
    );
    let (dir, config) = scratch_config("mcp-example", &scripted);
    let (code, stdout, stderr) = finished(
        wma_command()
            .current_dir(repo())
            .args(["run", "--config"])
            .arg(&config)
            .arg("What is the wifi password?"),
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Wifi password: teal-otter-42"),
        "the server read configs/files-example/notes.txt: {stdout}"
    );
    assert!(
        stderr.contains("`mcpServers.everything` is marked \"disabled\""),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `configs/webmcp-library.toml` on the library page its header serves
/// (here on a loopback port of the test's own): the page's tools are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_webmcp_config_opens_the_library_page() {
    use wma_tools::LoopbackSite;

    let _chromium = crate::support::CHROMIUM.read().await;
    let site = LoopbackSite::serve(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/library"))
        .await
        .unwrap();
    let example = std::fs::read_to_string(repo().join("configs/webmcp-library.toml")).unwrap();
    let url = "url = \"http://127.0.0.1:8000/\"";
    assert!(example.contains(url), "the example's shape changed");
    let text = example.replace(url, &format!("url = {:?}", site.url()));
    let config = Config::parse(&text, FILE).unwrap();
    let pages = config.page_tools().await;
    let (source, tools) = &pages[0];
    assert_eq!(source, "library");
    let tools = tools.as_ref().unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = tools.iter().map(|t| t.definition.name.as_str()).collect();
    for wanted in ["search_books", "borrow_book"] {
        assert!(names.contains(&wanted), "{names:?}");
    }
}

/// `wma check --probe` starts every tool source as a run would and lists
/// its tools, without loading a model; a source that cannot start fails
/// the command (exit 1) and is named, so a script learns before a run
/// does that a server is missing. Without `--probe` nothing is started.
#[test]
fn wma_check_probe_starts_each_source_and_fails_on_one_that_cannot_start() {
    let (node, server) = node_and_filesystem_server();
    let toml = format!(
        "[providers.p]\nkind = \"scripted\"\nreplies = []\n\n\
         [tools.files]\nkind = \"mcp-stdio\"\ncommand = {node:?}\nargs = [{server:?}, \".\"]\n\n\
         [tools.calc]\nkind = \"native\"\nbuiltins = [\"calculator\"]\n",
        node = node.display().to_string(),
        server = server.display().to_string(),
    );
    let (dir, config) = scratch_config("check-probe", &toml);
    let (code, stdout, stderr) = finished(wma_command().arg("check").arg("--probe").arg(&config));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("source calc: started, 1 tool(s): calculator"),
        "{stdout}"
    );
    let files = stdout
        .lines()
        .find(|line| line.starts_with("  source files: started"))
        .unwrap_or_else(|| panic!("no line for files: {stdout}"));
    assert!(files.contains("read_text_file"), "{files}");

    let broken = format!(
        "{toml}\n[tools.gone]\nkind = \"mcp-stdio\"\ncommand = {:?}\n",
        dir.join("no-such-server").display().to_string()
    );
    std::fs::write(&config, broken).unwrap();
    let (code, stdout, stderr) = finished(wma_command().arg("check").arg(&config));
    assert_eq!(code, Some(0), "without --probe nothing starts: {stderr}");
    assert!(!stdout.contains("source gone"), "{stdout}");
    let (code, stdout, stderr) = finished(wma_command().arg("check").arg("--probe").arg(&config));
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("source gone: could not start:") && stdout.contains("no-such-server"),
        "{stdout}"
    );
    assert!(stdout.contains("source calc: started"), "{stdout}");
    assert!(
        stderr.contains("tool source(s) that could not start: gone"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
