//! `wma`: run an on-device agent from the command line, chat with one, or
//! host a config's agents behind an HTTP API and to a cluster.

mod cli;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, ConstraintMode, FinishReason, LocalLoopOptions,
    Provider, policy::Policy, policy::PolicyName, run_local_agent,
};
use webmcp_agents::config::models::{self, ModelOrigin};
use webmcp_agents::config::{Config, ProviderConfig, ProviderSpec};
use webmcp_agents::demo_shop::{self, Shop};
use webmcp_agents::display::render_part;
use webmcp_agents::eval::{self, EvalOptions, EvalProvider, bfcl};
use webmcp_agents::usage::UsageMeter;
use wma_provider_openai::OpenAiProvider;
use wma_provider_ort::{OrtProvider, OrtProviderOptions, SamplingOptions};

/// Host on-device LLM agents that operate tools.
#[derive(Parser)]
#[command(name = "wma", version, about)]
struct Cli {
    /// Export traces over OTLP (also on when the standard OTEL_* variables
    /// say so); see docs/tracing.md.
    #[arg(long, global = true)]
    otlp: bool,
    /// Also write the spans to FILE as OTLP JSON lines (`wma trace FILE`
    /// prints them); overrides the config's `[telemetry] file`.
    #[arg(long, global = true, value_name = "FILE")]
    trace_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one request with a local model against the demo shop's tools, or
    /// against an agent of a config (--config).
    Run(RunArgs),
    /// Talk to an agent of a config, one request per line.
    Chat(cli::ChatArgs),
    /// Host a config's agents behind an HTTP API (and to a cluster).
    Serve(cli::ServeArgs),
    /// Check a config and say what it would start.
    Check(cli::CheckArgs),
    /// Serve a config's agents as MCP tools (stdio, or streamable HTTP).
    Mcp(cli::mcp::McpArgs),
    /// Print the runs of a trace file as indented trees.
    Trace(cli::trace::TraceArgs),
    /// Measure how well a model calls tools.
    #[command(subcommand)]
    Eval(EvalCommand),
    /// List the models installed in the cache (`--model NAME` takes their
    /// names): family, size, graph files, the policy each gets, where it
    /// came from and its size on disk; `pull` installs one, `rm` removes one.
    Models {
        #[command(subcommand)]
        action: Option<ModelsAction>,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish,
    /// elvish, powershell), e.g. `wma completions bash >
    /// ~/.local/share/bash-completion/completions/wma`.
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum ModelsAction {
    /// Install a model from a hub repository in the ONNX folder layout
    /// (`org/name`, downloaded into the Hugging Face cache, `$HF_ENDPOINT`
    /// and `$HF_TOKEN` honoured) under the repository's name, so
    /// `--model NAME` loads it. The default model and the evaluation model
    /// are converted by `scripts/setup.sh`, which this names.
    Pull {
        /// `org/name` (or `org/name@REVISION`), or the name of a model the
        /// set-up converts.
        id: String,
        /// The branch, tag or commit (default: main).
        #[arg(long)]
        revision: Option<String>,
        /// The graph file to download (default: the first of
        /// onnx/model_q4.onnx, onnx/model.onnx, model.onnx the repository
        /// has).
        #[arg(long)]
        variant: Option<String>,
        /// Replace what is installed under the name already.
        #[arg(long)]
        force: bool,
    },
    /// Remove an installed model (its folder in the cache's `models`, or
    /// the link there to a download, whose files stay in the Hugging Face
    /// cache).
    Rm {
        /// The model's name, as `wma models` lists it.
        name: String,
    },
}

#[derive(Subcommand)]
enum EvalCommand {
    /// BFCL records through one loop step each, constraints off and on.
    Bfcl(BfclArgs),
    /// The demo request end to end against the demo shop, N times.
    Shop(ShopArgs),
    /// The task suite: scenario files end to end through real tool
    /// sources, N times, under each policy side by side.
    Tasks(TasksArgs),
}

/// Which model, and how to run it.
#[derive(Args, Clone)]
struct ModelArgs {
    /// A model folder, the name of an installed model (`wma models` lists
    /// them, e.g. `Qwen2.5-Coder-0.5B-Instruct`), or a hub id (default: the
    /// model the set-up made).
    #[arg(long, env = "WMA_MODEL")]
    model: Option<String>,
    /// The graph file inside the model folder (e.g. onnx/model.onnx for fp32).
    #[arg(long)]
    variant: Option<String>,
    /// CPU threads for ONNX Runtime (default: ONNX Runtime's choice).
    #[arg(long)]
    threads: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed for sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Most new tokens per reply.
    #[arg(long, default_value_t = 160)]
    max_new_tokens: u32,
    /// Time limit per generation, in seconds.
    #[arg(long, default_value_t = 60)]
    step_timeout: u64,
    /// Take the provider from this config file instead (its
    /// `[providers.NAME]` table, `kind = "onnx"` or `"openai"`, set as in
    /// `wma serve`); the model flags above then do not apply, except
    /// --step-timeout. For `wma eval`.
    #[arg(long, value_name = "FILE")]
    provider_config: Option<PathBuf>,
    /// The provider of --provider-config (default: its only provider).
    #[arg(long, value_name = "NAME", requires = "provider_config")]
    provider: Option<String>,
}

/// The loop's policy, and rules set on it.
#[derive(Args, Clone, Default)]
struct PolicyArgs {
    /// The loop's policy: `reference` (the reference loop exactly) or
    /// `small-model` (its rules for tiny models). Default: the one measured
    /// for the model by name (`reference` for a model nobody measured).
    #[arg(long)]
    policy: Option<String>,
    /// Set one rule of the policy, as NAME=VALUE with a JSON value
    /// (`--rule copy_bias=0 --rule named_tool_retry=null`); repeatable. The
    /// rules are those of `[agents.NAME.rules]` (docs/loop.md).
    #[arg(long = "rule", value_name = "NAME=VALUE")]
    rules: Vec<String>,
}

impl PolicyArgs {
    /// The policy these flags ask for; `None` when they ask for none.
    fn policy(&self) -> Result<Option<Policy>> {
        if self.policy.is_none() && self.rules.is_empty() {
            return Ok(None);
        }
        let name = match &self.policy {
            None => PolicyName::SmallModel,
            Some(n) => PolicyName::parse(n).with_context(|| {
                format!("unknown policy `{n}`, expected `reference` or `small-model`")
            })?,
        };
        Policy::named(name)
            .with_rules(&self.rules_value()?)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--rule: {e}"))
    }

    /// The `--rule NAME=VALUE` flags as one JSON object of rules.
    fn rules_value(&self) -> Result<serde_json::Value> {
        let mut rules = serde_json::Map::new();
        for rule in &self.rules {
            let (key, value) = rule
                .split_once('=')
                .with_context(|| format!("--rule {rule}: expected NAME=VALUE"))?;
            let value: serde_json::Value = serde_json::from_str(value)
                .with_context(|| format!("--rule {rule}: the value is not JSON"))?;
            rules.insert(key.trim().to_string(), value);
        }
        Ok(serde_json::Value::Object(rules))
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Constraints {
    /// Never constrain decoding.
    Off,
    /// Text or a call on first attempts, calls only on retries.
    Auto,
    /// Every reply must be a call.
    CallsOnly,
}

impl From<Constraints> for ConstraintMode {
    fn from(c: Constraints) -> Self {
        match c {
            Constraints::Off => ConstraintMode::Off,
            Constraints::Auto => ConstraintMode::Auto,
            Constraints::CallsOnly => ConstraintMode::CallsOnly,
        }
    }
}

#[derive(Args)]
struct RunArgs {
    /// What to ask the agent.
    #[arg(default_value = demo_shop::DEFAULT_REQUEST)]
    request: String,
    #[command(flatten)]
    model: ModelArgs,
    /// Model steps per request.
    #[arg(long, default_value_t = 6)]
    max_steps: u32,
    /// Constrained decoding, when the model supports it.
    #[arg(long, value_enum, default_value_t = Constraints::Auto)]
    constraints: Constraints,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Print the parts as JSON lines instead of text.
    #[arg(long)]
    json: bool,
    /// Also print what the loop's policy did at each step (the rule lines,
    /// `· ground-strings: …`); without it a run prints the calls, results,
    /// approvals and the answer.
    #[arg(long, short)]
    verbose: bool,
    /// Run the request against an agent of this config instead (the model
    /// and loop options above are then the config's).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// With --config: the agent to ask (default: the config's only
    /// top-level agent).
    #[arg(long, requires = "config")]
    agent: Option<String>,
    #[command(flatten)]
    approval: cli::approve::ApprovalArgs,
}

#[derive(Args)]
struct BfclArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Folder with the BFCL data files (default: the one the set-up fetched).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Categories to run (default: simple_python, multiple, parallel, irrelevance).
    #[arg(long = "category")]
    categories: Vec<String>,
    /// More data files in the same format (a possible_answer/ folder beside
    /// them holds the answers; without one they are scored as irrelevance,
    /// or as relevance, any call right, when the file's name ends in
    /// `relevance`).
    #[arg(long = "file")]
    files: Vec<PathBuf>,
    /// Records per category (all when not given).
    #[arg(long)]
    limit: Option<usize>,
    /// Most tools shown per step.
    #[arg(long, default_value_t = 8)]
    max_tools: usize,
    /// Which columns to run: constraints `off`, `on`, or `both` side by
    /// side (a column left out halves the time and prints as "-").
    #[arg(long, value_enum, default_value_t = Columns::Both)]
    columns: Columns,
    /// Score the server's own tool calling instead of the loop's: each
    /// record's messages and tools sent once to the served model of
    /// --provider-config, its `tool_calls` scored the same way (no loop,
    /// no constraint columns).
    #[arg(long, requires = "provider_config")]
    direct: bool,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// The constraint columns of `wma eval bfcl`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Columns {
    /// Constraints off only.
    Off,
    /// Constraints on only.
    On,
    /// Both, side by side.
    Both,
}

#[derive(Args)]
struct ShopArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// How many runs.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Model steps per run.
    #[arg(long, default_value_t = 6)]
    max_steps: u32,
    /// Constrained decoding, when the model supports it.
    #[arg(long, value_enum, default_value_t = Constraints::Auto)]
    constraints: Constraints,
    #[command(flatten)]
    policy: PolicyArgs,
}

#[derive(Args)]
struct TasksArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A scenario file, or a folder of them.
    #[arg(long, default_value = eval::tasks::DEFAULT_TASKS)]
    tasks: PathBuf,
    /// Runs per task and policy (sampled runs are seeded run by run).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// A policy to run the tasks under (`reference`, `small-model`);
    /// repeatable. Default: both, side by side.
    #[arg(long = "policy", value_name = "NAME")]
    policies: Vec<String>,
    /// Set one rule on every policy run, as NAME=VALUE with a JSON value;
    /// repeatable.
    #[arg(long = "rule", value_name = "NAME=VALUE")]
    rules: Vec<String>,
    /// Only the tasks of this domain; repeatable.
    #[arg(long = "domain")]
    domains: Vec<String>,
    /// Only this task (`berlin-total`, or `duckdb/berlin-total` as the
    /// progress lines print it); repeatable.
    #[arg(long = "task")]
    names: Vec<String>,
    /// Only the tasks of this half of the suite: `dev` (the tasks rules are
    /// chosen on), `test` (the held-out ones) or `all`. The tables give
    /// each half's results and the gap between them either way.
    #[arg(long, default_value = "all", value_parser = ["dev", "test", "all"])]
    half: String,
    /// Also run every task with no loop: the served model of
    /// --provider-config on its own tool calling (its `tool_calls` run in
    /// order until it answers), in a `direct` column beside the policies.
    /// With no --policy, `direct` is the only column.
    #[arg(long, requires = "provider_config")]
    direct: bool,
}

/// `wma run --config` with flags of the plain run: each flag given on the
/// command line either applies to the config's agent, overriding the
/// config's value and saying so, or is an error that says why. The model
/// flags are errors: the agent's model is its provider's in the config.
fn apply_run_flags(given: &ArgMatches, args: &RunArgs, config: &mut Config) -> Result<()> {
    let on_line = |id: &str| given.value_source(id) == Some(ValueSource::CommandLine);
    let model_flags: Vec<String> = [
        "model",
        "variant",
        "threads",
        "temperature",
        "seed",
        "max_new_tokens",
        "provider_config",
        "provider",
    ]
    .into_iter()
    .filter(|id| on_line(id))
    .map(|id| format!("--{}", id.replace('_', "-")))
    .collect();
    if !model_flags.is_empty() {
        bail!(
            "{} cannot be used with --config: the agent's model is the one its `provider` names in {} ([providers.NAME]); change it there, or run without --config",
            model_flags.join(", "),
            args.config
                .as_deref()
                .unwrap_or(Path::new("the config"))
                .display()
        );
    }
    let name = cli::pick_agent(config, args.agent.as_deref())?;
    let Some(agent) = config.agents.iter_mut().find(|a| a.name == name) else {
        bail!("the config has no agent `{name}`");
    };
    let mut said = Vec::new();
    if on_line("max_steps") {
        said.push(format!(
            "max_steps {} (the config: {})",
            args.max_steps, agent.max_steps
        ));
        agent.max_steps = args.max_steps;
    }
    if on_line("step_timeout") {
        let timeout = Duration::from_secs(args.model.step_timeout);
        said.push(format!(
            "step_timeout {} s (the config: {} s)",
            timeout.as_secs(),
            agent.step_timeout.as_secs()
        ));
        agent.step_timeout = timeout;
    }
    if on_line("constraints") {
        let mode: ConstraintMode = args.constraints.into();
        said.push(format!(
            "constraints {mode:?} (the config: {:?})",
            agent.constraints
        ));
        agent.constraints = mode;
    }
    if on_line("policy") || on_line("rules") {
        let policy = match (&args.policy.policy, &agent.policy) {
            // Rules alone change the agent's own policy.
            (None, Some(own)) => own
                .with_rules(&args.policy.rules_value()?)
                .map_err(|e| anyhow::anyhow!("--rule: {e}"))?,
            (None, None) => bail!(
                "--rule needs --policy here: the agent `{name}` names no policy in the config (the model's name picks one)"
            ),
            (Some(_), _) => args.policy.policy()?.context("--policy names a policy")?,
        };
        said.push(format!(
            "policy {} with the rules given",
            policy.base.as_str()
        ));
        agent.policy = Some(policy);
    }
    if !said.is_empty() {
        eprintln!("agent `{name}`, from the command line: {}", said.join("; "));
    }
    Ok(())
}

/// `wma models`: each model installed in `CACHE/models` with its family,
/// size in parameters, graph files, the loop policy it gets by default,
/// where it came from (the set-up, or a hub repository and commit) and its
/// size on disk.
fn list_models() -> Result<()> {
    let cache = wma_provider_ort::cache_dir()?;
    let folder = cache.join("models");
    let installed = models::installed(&cache);
    if installed.is_empty() {
        println!(
            "no models in {} (scripts/setup.sh installs the default one; `wma models pull org/name` one from a hub)",
            folder.display()
        );
        return Ok(());
    }
    println!(
        "models in {} (choose one with --model NAME):",
        folder.display()
    );
    println!("| name | family | parameters | graphs | default policy | source | on disk |");
    println!("|---|---|---|---|---|---|---|");
    for model in installed {
        let size = match model.parameters {
            Some(n) if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
            Some(n) if n >= 1_000_000 => format!("{}M", (n as f64 / 1e6).round()),
            Some(_) => "<1M".to_string(),
            None => "?".to_string(),
        };
        let policy = Policy::for_model(&model.name).base.as_str();
        let default = if model.name == wma_provider_ort::DEFAULT_MODEL_NAME {
            " (the default model)"
        } else {
            ""
        };
        println!(
            "| {}{default} | {} | {size} | {} | {policy} | {} | {} |",
            model.name,
            model.family,
            models::graph_files(&model.dir.join("onnx")),
            ModelOrigin::of(&model.dir),
            megabytes(models::disk_size(&model.dir)),
        );
    }
    Ok(())
}

/// `wma models rm NAME`: removes an installed model's folder, or only the
/// link for a model `wma models pull` installed (its files are the Hugging
/// Face cache's), and says how to get it back.
fn remove_model(name: &str) -> Result<()> {
    let cache = wma_provider_ort::cache_dir()?;
    let folder = cache.join("models").join(name);
    match models::remove(&cache, name)? {
        models::Removed::Link { origin } => {
            println!("removed {name} (the link {})", folder.display());
            if let ModelOrigin::Hub {
                repo,
                snapshot,
                revision,
                ..
            } = origin
            {
                println!(
                    "its files stay in the Hugging Face cache ({}, {}): `wma models pull {repo}{}` installs it again without downloading",
                    snapshot.display(),
                    megabytes(models::disk_size(&snapshot)),
                    revision
                        .map(|r| format!(" --revision {r}"))
                        .unwrap_or_default(),
                );
            }
        }
        models::Removed::Folder { known } => {
            println!("removed {name} ({})", folder.display());
            if let Some(known) = known {
                println!(
                    "it was the {}: `scripts/setup.sh --model {}` installs it again",
                    known.role, known.key
                );
            }
        }
    }
    Ok(())
}

/// `96 MB`, or `<1 MB`.
fn megabytes(bytes: u64) -> String {
    if bytes < 1_000_000 {
        "<1 MB".to_string()
    } else {
        format!("{} MB", bytes / 1_000_000)
    }
}

/// `wma models pull ID`: downloads a hub repository in the ONNX folder
/// layout into the Hugging Face cache (resumable; `$HF_ENDPOINT`,
/// `$HF_TOKEN` honoured) with a progress bar, checks that the provider can
/// read it, and installs it as `CACHE/models/NAME`, a link to the snapshot,
/// so `--model NAME` loads it and `wma models rm NAME` removes only the
/// link. A name the set-up converts is answered with its set-up command.
async fn pull_model(
    id: &str,
    revision: Option<String>,
    variant: Option<&str>,
    force: bool,
) -> Result<()> {
    let cache = wma_provider_ort::cache_dir()?;
    let (target, repo, revision) = match models::plan_pull(&cache, id, revision, force)? {
        models::Pull::SetUpInstalled(known) => {
            println!(
                "{} (the {}) is installed already ({}); nothing to do",
                known.name,
                known.role,
                cache.join("models").join(known.name).display()
            );
            return Ok(());
        }
        models::Pull::Installed { target, origin } => {
            println!(
                "{} is installed already ({origin}, {}); nothing to do (--force installs it again)",
                target.name,
                target.link.display()
            );
            return Ok(());
        }
        models::Pull::Download {
            target,
            repo,
            revision,
        } => (target, repo, revision),
    };
    let name = &target.name;

    let bars = cli::progress::Bars::new();
    let progress: webmcp_agents::agent::ProgressFn = Arc::new(bars.single(name));
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let watcher = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });
    let download = {
        let (repo, revision, variant, cache) = (
            repo.clone(),
            revision.clone(),
            variant.map(str::to_string),
            cache.clone(),
        );
        let cancel = cancel.clone();
        tokio::task::spawn_blocking(move || {
            wma_provider_ort::download(
                &repo,
                revision.as_deref(),
                variant.as_deref(),
                &cache,
                None,
                &progress,
                &cancel,
            )
        })
        .await
    };
    watcher.abort();
    bars.finish();
    let snapshot = match download.context("the download stopped")? {
        Ok(snapshot) => snapshot,
        Err(wma_provider_ort::OrtError::Cancelled) => {
            bail!("stopped; the same command goes on where the download stopped")
        }
        Err(e) => return Err(e).with_context(|| format!("could not pull {repo}")),
    };
    // What `--model NAME` will read, checked before it is installed.
    wma_provider_ort::ModelConfig::load(&snapshot).with_context(|| {
        format!("{repo} was downloaded, but it is not a model folder the provider reads")
    })?;

    if let Some(replaced) = models::make_room(&target)? {
        println!("replaced {name} ({replaced})");
    }
    models::link_snapshot(&snapshot, &target.link)?;
    println!(
        "installed {name} ({}, {}) as {} -> {}",
        ModelOrigin::of(&target.link),
        megabytes(models::disk_size(&snapshot)),
        target.link.display(),
        snapshot.display()
    );
    match variant {
        Some(variant) if !models::has_default_graph(&snapshot) => {
            println!("run it with --model {name} --variant {variant}")
        }
        _ => println!("run it with --model {name}"),
    }
    Ok(())
}

/// The config a command hosts, read (and validated) before anything starts.
fn command_config(command: &Command) -> Result<Option<Config>> {
    let path = match command {
        Command::Run(RunArgs {
            config: Some(path), ..
        }) => path,
        Command::Chat(cli::ChatArgs { config, .. })
        | Command::Serve(cli::ServeArgs { config, .. })
        | Command::Mcp(cli::mcp::McpArgs { config, .. }) => match config {
            Some(path) => path,
            None => {
                return Ok(Some(Config::parse(
                    &demo_shop::demo_config(),
                    "the built-in demo config",
                )?));
            }
        },
        Command::Check(args) => &args.config,
        _ => return Ok(None),
    };
    Ok(Some(Config::load(path)?))
}

/// A `wma run` that ended without the answer it was asked for: the exit
/// status says how (docs/cli.md), so a script can tell success from
/// failure.
#[derive(Debug)]
struct Unfinished(FinishReason);

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the run did not finish its request ({})",
            self.0.as_str()
        )
    }
}

impl std::error::Error for Unfinished {}

impl Unfinished {
    /// The exit status of each way a run can end without an answer. An
    /// error of the run, or of the command, is 1.
    fn exit_code(&self) -> i32 {
        match self.0 {
            FinishReason::Stop => 0,
            FinishReason::MaxSteps => 3,
            FinishReason::Loop => 4,
            FinishReason::Length => 5,
            FinishReason::Unrepaired => 6,
            FinishReason::Aborted => 130,
        }
    }
}

/// What a run's last part says of it: `Ok` for an answer, [`Unfinished`]
/// for a finish that is not one, an error for a run that ended with one.
fn outcome(last: Option<&AgentStreamPart>) -> Result<()> {
    match last {
        Some(AgentStreamPart::Finish { reason }) if !reason.answered() => {
            Err(Unfinished(*reason).into())
        }
        Some(AgentStreamPart::Finish { .. }) => Ok(()),
        _ => bail!("the run ended with an error"),
    }
}

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("Error: could not start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_cli()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => match error.downcast_ref::<Unfinished>() {
            Some(unfinished) => {
                eprintln!("{unfinished}");
                std::process::ExitCode::from(unfinished.exit_code() as u8)
            }
            None => {
                eprintln!("Error: {error:?}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

async fn run_cli() -> Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let mut config = command_config(&cli.command)?;
    if let (Command::Run(args), Some(config), Some(("run", given))) =
        (&cli.command, config.as_mut(), matches.subcommand())
    {
        apply_run_flags(given, args, config)?;
    }
    // The config's [telemetry] table, with --otlp switching export on.
    let mut tracing_config = config
        .as_ref()
        .map(|c| c.telemetry.clone())
        .unwrap_or_default();
    tracing_config.enabled |= cli.otlp;
    if let Some(file) = &cli.trace_file {
        tracing_config.file = Some(file.clone());
    }
    let telemetry =
        webmcp_agents::telemetry::init(&tracing_config).context("could not start tracing")?;
    let span = tracing::info_span!("wma");
    // The trace id, to find the run: in a backend's search box (docs/tracing.md
    // says where), or with `wma trace FILE --trace ID`.
    if let Some(trace) = webmcp_agents::telemetry::trace_id(&span) {
        if let Some(export) = telemetry.export() {
            eprintln!("tracing to {} (trace {trace})", export.endpoint);
            if let Some(link) = tracing_config.trace_link(&trace) {
                eprintln!("see the trace at {link}");
            }
        }
        if let Some(file) = telemetry.file() {
            eprintln!(
                "trace {trace} written to {} (`wma trace {}` prints it)",
                file.display(),
                file.display()
            );
        }
    }
    let result = async {
        match (cli.command, config) {
            (Command::Run(args), Some(config)) => {
                cli::run(
                    &config,
                    args.agent.as_deref(),
                    &args.request,
                    cli::Output::new(args.json, args.verbose),
                    &args.approval,
                )
                .await
            }
            (Command::Run(args), None) => run(args).await,
            (Command::Chat(args), Some(config)) => cli::chat(args, &config).await,
            (Command::Serve(args), Some(config)) => cli::serve(args, &config).await,
            (Command::Mcp(args), Some(config)) => cli::mcp::serve(args, &config).await,
            (Command::Trace(args), _) => cli::trace::print(args),
            (Command::Models { action: None }, _) => list_models(),
            (
                Command::Models {
                    action: Some(ModelsAction::Rm { name }),
                },
                _,
            ) => remove_model(&name),
            (
                Command::Models {
                    action:
                        Some(ModelsAction::Pull {
                            id,
                            revision,
                            variant,
                            force,
                        }),
                },
                _,
            ) => pull_model(&id, revision, variant.as_deref(), force).await,
            (Command::Completions { shell }, _) => {
                clap_complete::generate(shell, &mut Cli::command(), "wma", &mut std::io::stdout());
                Ok(())
            }
            (Command::Eval(EvalCommand::Bfcl(args)), _) => eval_bfcl(args).await,
            (Command::Eval(EvalCommand::Shop(args)), _) => eval_shop(args).await,
            (Command::Eval(EvalCommand::Tasks(args)), _) => eval_tasks(args).await,
            (Command::Check(args), Some(config)) => {
                cli::check(&config);
                if args.pages {
                    cli::check_pages(&config).await;
                }
                if args.probe {
                    cli::check_probe(&config).await?;
                }
                Ok(())
            }
            (Command::Chat(_) | Command::Serve(_) | Command::Check(_) | Command::Mcp(_), None) => {
                unreachable!("these commands always read a config")
            }
        }
    }
    .instrument(span)
    .await;
    let _ = telemetry.flush();
    result
}

/// Loads the model, showing a progress bar on stderr.
async fn load_model(args: &ModelArgs) -> Result<OrtProvider> {
    let options = OrtProviderOptions {
        model: args.model.clone(),
        variant: args.variant.clone(),
        intra_threads: args.threads,
        sampling: SamplingOptions {
            temperature: args.temperature,
            seed: args.seed,
            ..SamplingOptions::default()
        },
        max_new_tokens: args.max_new_tokens,
        ..OrtProviderOptions::default()
    };
    let provider = OrtProvider::new(options).context("could not set up the model")?;
    let started = Instant::now();
    let bars = cli::progress::Bars::new();
    let prepared = provider
        .prepare(Arc::new(bars.single("model")), CancellationToken::new())
        .await;
    bars.finish();
    prepared.context("could not load the model")?;
    eprintln!("model ready in {:.1} s", started.elapsed().as_secs_f64());
    Ok(provider)
}

/// The provider an evaluation runs: `--provider-config FILE --provider
/// NAME` when given (an onnx or openai provider of a config), else the
/// model flags' ONNX Runtime model. Prepared, with progress on stderr.
async fn load_provider(args: &ModelArgs) -> Result<EvalProvider> {
    let Some(file) = &args.provider_config else {
        return Ok(EvalProvider::Onnx(load_model(args).await?));
    };
    let providers = Config::load_providers(file)?;
    let provider = ProviderConfig::pick(&providers, args.provider.as_deref(), file)
        .map_err(anyhow::Error::msg)?;
    let made = match &provider.spec {
        ProviderSpec::Onnx(options) => EvalProvider::Onnx(
            OrtProvider::new(options.clone()).context("could not set up the model")?,
        ),
        ProviderSpec::Openai(options) => EvalProvider::Served(
            OpenAiProvider::new(options.clone()).context("could not set up the served model")?,
        ),
        _ => bail!(
            "provider `{}` is neither an onnx nor an openai provider",
            provider.name
        ),
    };
    let started = Instant::now();
    let bars = cli::progress::Bars::new();
    let prepared = made
        .prepare(
            Arc::new(bars.single(&provider.name)),
            CancellationToken::new(),
        )
        .await;
    bars.finish();
    prepared.with_context(|| format!("could not load provider `{}`", provider.name))?;
    eprintln!(
        "provider `{}` ({}, {}) ready in {:.1} s",
        provider.name,
        made.info().provider,
        made.info().model,
        started.elapsed().as_secs_f64()
    );
    Ok(made)
}

async fn run(args: RunArgs) -> Result<()> {
    let output = cli::Output::new(args.json, args.verbose);
    // Flag mistakes are reported before the model loads.
    let approval_rules = args.approval.rules()?;
    let provider = Arc::new(UsageMeter::new(Arc::new(load_model(&args.model).await?)));
    let shop = Shop::new();
    let request = AgentRunRequest::new(
        vec![ChatMessage::user(args.request.clone())],
        Arc::new(shop.tools()),
    )
    .with_approver(cli::approve::approver(args.approval.mode(false), None))
    .with_approval_rules(approval_rules);
    let cancel = request.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let loop_options = LocalLoopOptions {
        max_steps: args.max_steps,
        step_timeout: Duration::from_secs(args.model.step_timeout),
        tools_inline: provider.tools_inline(),
        instructions: Some(demo_shop::INSTRUCTIONS.to_string()),
        constraints: args.constraints.into(),
        policy: args.policy.policy()?,
        ..LocalLoopOptions::default()
    };
    if !args.json {
        println!("you: {}", args.request);
    }
    let started = Instant::now();
    let mut parts = run_local_agent(provider.clone(), request, loop_options);
    let mut last = None;
    while let Some(part) = parts.next().await {
        if output.shows(&part) {
            match output {
                cli::Output::Json => {
                    println!("{}", webmcp_agents::display::json_line(&part)?)
                }
                cli::Output::Text { .. } => println!("{}", render_part(&part)),
            }
        }
        last = Some(part);
    }
    let usage = provider.usage();
    let cart = shop.cart_line();
    eprintln!(
        "\nusage: {usage}; {:.1} s in all\ncart: {}",
        started.elapsed().as_secs_f64(),
        if cart.is_empty() {
            "empty".to_string()
        } else {
            cart
        }
    );
    outcome(last.as_ref())
}

fn default_bfcl_dir() -> Result<PathBuf> {
    let cache = wma_provider_ort::cache_dir().context("no cache folder")?;
    Ok(cache.join("eval").join("bfcl"))
}

async fn eval_bfcl(args: BfclArgs) -> Result<()> {
    let dir = match args.data.clone() {
        Some(dir) => dir,
        None => default_bfcl_dir()?,
    };
    let sources = bfcl::sources(&dir, &args.categories, &args.files).map_err(anyhow::Error::msg)?;
    let loaded = load_provider(&args.model).await?;
    if args.direct {
        let EvalProvider::Served(served) = &loaded else {
            bail!("--direct scores a served model's own tool calling: name an openai provider");
        };
        return eval_bfcl_direct(served, sources, args.limit).await;
    }
    let provider = Arc::new(UsageMeter::new(Arc::new(loaded)));
    if !provider.supports_constraints() {
        eprintln!(
            "note: this provider does not support constrained decoding; the 'on' column repeats 'off'"
        );
    }
    let options = EvalOptions {
        max_tools: args.max_tools,
        step_timeout: Duration::from_secs(args.model.step_timeout),
        tools_inline: provider.tools_inline(),
        policy: args.policy.policy()?,
    };
    let mut rows = Vec::new();
    for (name, file) in sources {
        let mut records =
            bfcl::load(&file).with_context(|| format!("could not read {}", file.display()))?;
        if let Some(limit) = args.limit {
            records.truncate(limit);
        }
        let mut scores = Vec::new();
        for (label, mode) in [("off", ConstraintMode::Off), ("on", ConstraintMode::Auto)] {
            let wanted = match args.columns {
                Columns::Both => true,
                Columns::Off => mode == ConstraintMode::Off,
                Columns::On => mode == ConstraintMode::Auto,
            };
            if !wanted {
                scores.push(None);
                continue;
            }
            let total = records.len();
            let started = Instant::now();
            let score = eval::run_bfcl(&provider, &records, mode, &options, |done| {
                eprint!("\r{name} (constraints {label}): {done}/{total}   ");
                let _ = std::io::stderr().flush();
            })
            .await;
            eprintln!(
                "\r{name} (constraints {label}): {total} records in {:.0} s, accuracy {} ({} of {total}; {} of {} calls parse and validate; of the {} the grammar shaped, {})",
                started.elapsed().as_secs_f64(),
                score.accuracy(),
                score.correct,
                score.valid_calls,
                score.calls,
                score.shaped_calls,
                score.shaped_valid_calls,
            );
            scores.push(Some(score));
        }
        let on = scores.pop().flatten();
        let off = scores.pop().flatten();
        rows.push((name, off, on));
    }
    println!("{}", eval::bfcl_table(&rows));
    println!("what fired (constraints on):\n{}", eval::bfcl_ledger(&rows));
    Ok(())
}

/// `wma eval bfcl --direct`: the server's own tool calling, no loop.
async fn eval_bfcl_direct(
    provider: &OpenAiProvider,
    sources: Vec<(String, PathBuf)>,
    limit: Option<usize>,
) -> Result<()> {
    let mut rows = Vec::new();
    for (name, file) in sources {
        let mut records =
            bfcl::load(&file).with_context(|| format!("could not read {}", file.display()))?;
        if let Some(limit) = limit {
            records.truncate(limit);
        }
        let total = records.len();
        let started = Instant::now();
        let score = eval::run_bfcl_direct(provider, &records, |done| {
            eprint!("\r{name} (direct): {done}/{total}   ");
            let _ = std::io::stderr().flush();
        })
        .await;
        eprintln!(
            "\r{name} (direct): {total} records in {:.0} s, accuracy {} ({} of {total})",
            started.elapsed().as_secs_f64(),
            score.accuracy(),
            score.correct,
        );
        rows.push((name, score));
    }
    println!("the server's own tool calling (one request per record, no loop):");
    println!("{}", eval::bfcl_direct_table(&rows));
    Ok(())
}

async fn eval_shop(args: ShopArgs) -> Result<()> {
    let provider = Arc::new(load_provider(&args.model).await?);
    let runs = eval::run_shop_task(
        provider,
        args.runs,
        args.constraints.into(),
        args.max_steps,
        args.policy.policy()?,
        |i, run| {
            eprintln!(
                "run {i}: {} in {} steps, {:.1} s, ended {}, cart: {}",
                if run.success { "solved" } else { "not solved" },
                run.steps,
                run.time.as_secs_f64(),
                run.end,
                if run.cart.is_empty() {
                    "empty"
                } else {
                    &run.cart
                }
            );
        },
    )
    .await;
    println!("{}", eval::shop_summary(&runs));
    Ok(())
}

async fn eval_tasks(mut args: TasksArgs) -> Result<()> {
    let tasks = eval::tasks::select(&args.tasks, &args.domains, &args.names, &args.half)
        .map_err(anyhow::Error::msg)?;
    let names = if !args.policies.is_empty() {
        args.policies.clone()
    } else if args.direct {
        Vec::new()
    } else {
        vec!["reference".to_string(), "small-model".to_string()]
    };
    let mut policies = Vec::new();
    for name in &names {
        let policy = PolicyArgs {
            policy: Some(name.clone()),
            rules: args.rules.clone(),
        }
        .policy()?
        .context("a policy")?;
        policies.push(policy);
    }
    // Sampled runs are seeded run by run from a fixed base, so a suite can
    // be repeated; greedy runs need no seed.
    if args.model.temperature > 0.0 && args.model.seed.is_none() {
        args.model.seed = Some(1);
    }
    let provider = Arc::new(load_provider(&args.model).await?);
    let mut drivers: Vec<eval::tasks::Driver<'_>> = policies
        .into_iter()
        .map(eval::tasks::Driver::Loop)
        .collect();
    if args.direct {
        let EvalProvider::Served(served) = provider.as_ref() else {
            bail!("--direct runs a served model's own tool calling: name an openai provider");
        };
        drivers.push(eval::tasks::Driver::Direct(served));
    }
    let total = tasks.len() * drivers.len() * args.runs;
    let mut done = 0;
    eprintln!(
        "{} tasks ({} dev, {} test) x {} drivers x {} runs, {}",
        tasks.len(),
        tasks
            .iter()
            .filter(|t| t.half == eval::tasks::Half::Dev)
            .count(),
        tasks
            .iter()
            .filter(|t| t.half == eval::tasks::Half::Test)
            .count(),
        drivers.len(),
        args.runs,
        if args.model.temperature > 0.0 {
            format!("sampled at temperature {}", args.model.temperature)
        } else {
            "greedy".to_string()
        }
    );
    let results = eval::tasks::run_suite_with(
        &tasks,
        &drivers,
        args.runs,
        provider.clone(),
        |task, policy, i, run| {
            done += 1;
            let verdict = match (&run.error, run.solved) {
                (Some(e), _) => format!("error: {e}"),
                (None, true) => "solved".to_string(),
                (None, false) => format!("not solved: {}", run.failures.join("; ")),
            };
            let calls = if run.calls.is_empty() {
                "no call".to_string()
            } else {
                run.calls.join("; ")
            };
            // Which rules acted on this task, so a rule's ablation
            // (`--rule NAME=false`) can rerun just the tasks it touched.
            let mut fired: Vec<&str> = run.rules.iter().map(String::as_str).collect();
            fired.sort_unstable();
            fired.dedup();
            let fired = if fired.is_empty() {
                String::new()
            } else {
                format!("; fired {}", fired.join(", "))
            };
            eprintln!(
                "[{done}/{total}] {}/{} ({}, {policy}, run {i}): {verdict} [{} steps, {:.1} s, ended {}; {calls}{fired}]",
                task.domain,
                task.name,
                task.half,
                run.steps,
                run.time.as_secs_f64(),
                run.end
            );
        },
    )
    .await;
    println!("{}", eval::tasks::report(&results));
    Ok(())
}
