//! Approvals: which calls a person must approve first, and how the loop
//! asks.
//!
//! One policy covers every tool source (Rust functions, MCP servers,
//! WebMCP pages, sub-agents), because it reads only what every source
//! gives: the tool's name and its [`ToolAnnotations`]. [`decide`] is the
//! one place the decision is made; the loop calls it for every validated
//! call, and asks the host's [`Approver`] when it says so.
//!
//! The defaults (see `docs/approvals.md`): read-only tools run, tools that
//! say they are consequential (an order, a payment, a write that destroys)
//! ask, other tools run. Rules per tool name pattern (`cart_*`) override
//! the defaults, the most specific pattern winning. Once a result of an
//! untrusted source entered the run, a consequential tool asks even where
//! a rule says `auto`: the result may carry instructions the person never
//! gave. A run's own request can only tighten all of this
//! ([`ApprovalPolicy::decide`] takes the stricter of the two).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ToolError, ToolErrorCode};
use crate::tool::{ToolAnnotations, ToolDefinition};

/// How long a question waits for its answer unless the policy says
/// otherwise; no answer in time denies the call.
pub(crate) const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(300);

/// What happens to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// It runs without asking.
    Auto,
    /// A person approves it first.
    Ask,
    /// It never runs; the model gets `Error [denied]`.
    Deny,
}

impl ApprovalMode {
    /// The name in configs and requests (`auto`, `ask`, `deny`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }

    /// Reads a mode by its name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "ask" => Some(Self::Ask),
            "deny" => Some(Self::Deny),
            _ => None,
        }
    }
}

impl std::fmt::Display for ApprovalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule: tools whose name matches `pattern` get `mode`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRule {
    /// A tool name, or a glob over names: `*` matches any run of
    /// characters, `?` one character (`cart_*`, `*`).
    pub pattern: String,
    /// What matching calls get.
    pub mode: ApprovalMode,
}

impl ApprovalRule {
    /// A rule for the tools matching `pattern`.
    pub fn new(pattern: impl Into<String>, mode: ApprovalMode) -> Self {
        Self {
            pattern: pattern.into(),
            mode,
        }
    }

    /// How specific the pattern is: its characters that are not wildcards.
    fn specificity(&self) -> usize {
        self.pattern
            .chars()
            .filter(|c| *c != '*' && *c != '?')
            .count()
    }
}

/// Whether `name` matches the glob `pattern` (`*` any run, `?` one character).
pub(crate) fn glob_matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The most specific rule of `rules` that matches `name` (the stricter one
/// when two are as specific).
fn matching<'a>(rules: &'a [ApprovalRule], name: &str) -> Option<&'a ApprovalRule> {
    rules
        .iter()
        .filter(|r| glob_matches(&r.pattern, name))
        .max_by_key(|r| (r.specificity(), r.mode))
}

/// An agent's approval policy: defaults by annotation, rules by tool name,
/// and how long a question waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPolicy {
    /// Tools annotated read-only. Default [`ApprovalMode::Auto`].
    pub read_only: ApprovalMode,
    /// Tools annotated consequential (MCP: not read-only and destructive).
    /// Default [`ApprovalMode::Ask`].
    pub consequential: ApprovalMode,
    /// Every other tool. Default [`ApprovalMode::Auto`].
    pub other: ApprovalMode,
    /// Rules by tool name pattern; they win over the three defaults.
    pub rules: Vec<ApprovalRule>,
    /// How long a question waits for its answer; then the call is denied.
    /// Default: five minutes.
    pub timeout: Duration,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        Self {
            read_only: ApprovalMode::Auto,
            consequential: ApprovalMode::Ask,
            other: ApprovalMode::Auto,
            rules: Vec::new(),
            timeout: DEFAULT_APPROVAL_TIMEOUT,
        }
    }
}

/// Why a call asks or is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The tool's annotations and the policy's default for them.
    Default {
        /// `read-only`, `consequential` or `other`.
        kind: &'static str,
    },
    /// A rule of the agent's policy.
    Rule(ApprovalRule),
    /// A rule of the run's own request (which can only tighten).
    Request(ApprovalRule),
    /// An untrusted result entered the run and the tool is consequential.
    Untrusted {
        /// The tool whose untrusted result it was.
        source: String,
    },
}

impl Reason {
    /// The reason in a sentence, for the person and the model.
    pub fn describe(&self, tool: &str) -> String {
        match self {
            Self::Default { kind } => match *kind {
                "consequential" => {
                    format!("`{tool}` says it has consequences (it changes or destroys something)")
                }
                kind => format!("the policy for {kind} tools applies to `{tool}`"),
            },
            Self::Rule(rule) => format!(
                "the agent's rule `{}` = \"{}\" matches `{tool}`",
                rule.pattern, rule.mode
            ),
            Self::Request(rule) => format!(
                "the request's rule `{}` = \"{}\" matches `{tool}`",
                rule.pattern, rule.mode
            ),
            Self::Untrusted { source } => format!(
                "an untrusted result (of `{source}`) entered this run, and `{tool}` has consequences"
            ),
        }
    }
}

/// What [`decide`] says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It runs.
    Run,
    /// A person approves it first.
    Ask(Reason),
    /// It does not run.
    Deny(Reason),
}

impl ApprovalPolicy {
    /// The same policy with these rules added.
    pub fn with_rules(mut self, rules: impl IntoIterator<Item = ApprovalRule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// What happens to a call of `tool` (annotated `annotations`), given
    /// the rules of the run's own request and the untrusted result that
    /// entered the run, if any. The module's own function `decide` (kept
    /// inside the crate) holds the rules, in order.
    pub fn decide(
        &self,
        tool: &str,
        annotations: &ToolAnnotations,
        request: &[ApprovalRule],
        untrusted_seen: Option<&str>,
    ) -> Verdict {
        decide(self, tool, annotations, request, untrusted_seen)
    }
}

/// The approval decision for one call, in one place.
///
/// 1. The agent's policy: the most specific rule matching the tool's name,
///    else the default for its annotations (read-only, consequential,
///    other; a tool that says both read-only and consequential counts as
///    consequential).
/// 2. A consequential tool whose mode is `auto` asks once an untrusted
///    result entered the run (`untrusted_seen` names its tool).
/// 3. The run's own request rules (`request`) apply the same way, and the
///    stricter of the two wins: a request can tighten, never loosen.
pub(crate) fn decide(
    policy: &ApprovalPolicy,
    tool: &str,
    annotations: &ToolAnnotations,
    request: &[ApprovalRule],
    untrusted_seen: Option<&str>,
) -> Verdict {
    let (mut mode, mut reason) = match matching(&policy.rules, tool) {
        Some(rule) => (rule.mode, Reason::Rule(rule.clone())),
        None if annotations.consequential => (
            policy.consequential,
            Reason::Default {
                kind: "consequential",
            },
        ),
        None if annotations.read_only => (policy.read_only, Reason::Default { kind: "read-only" }),
        None => (policy.other, Reason::Default { kind: "other" }),
    };
    if mode == ApprovalMode::Auto
        && annotations.consequential
        && let Some(source) = untrusted_seen
    {
        mode = ApprovalMode::Ask;
        reason = Reason::Untrusted {
            source: source.to_string(),
        };
    }
    if let Some(rule) = matching(request, tool)
        && rule.mode > mode
    {
        mode = rule.mode;
        reason = Reason::Request(rule.clone());
    }
    match mode {
        ApprovalMode::Auto => Verdict::Run,
        ApprovalMode::Ask => Verdict::Ask(reason),
        ApprovalMode::Deny => Verdict::Deny(reason),
    }
}

/// A question for a person: may this call run?
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Unique among all questions, across processes (128 random bits);
    /// the answer names it.
    pub approval_id: String,
    /// The agent whose run makes the call.
    pub agent: String,
    /// The call, as its tool-call part names it.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The call's full arguments, validated against the tool's schema.
    pub arguments: Value,
    /// Why the call asks, in a sentence.
    pub reason: String,
}

/// A person's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalAnswer {
    /// The call may run.
    pub approved: bool,
    /// Apply the same answer to later questions about this tool for the rest of
    /// the session (the run, or the conversation of a host that keeps one).
    #[serde(default)]
    pub remember: bool,
    /// Who or what answered, for the decision's part and span event
    /// (`person` unless the host says otherwise).
    #[serde(default = "person")]
    pub by: String,
    /// Why, when the answer says (shown to the model on a denial).
    #[serde(default)]
    pub note: Option<String>,
}

fn person() -> String {
    "person".to_string()
}

impl ApprovalAnswer {
    /// A person approved.
    pub fn approve() -> Self {
        Self {
            approved: true,
            remember: false,
            by: person(),
            note: None,
        }
    }

    /// A person denied.
    pub fn deny() -> Self {
        Self {
            approved: false,
            ..Self::approve()
        }
    }

    /// The same answer, for the rest of the session.
    pub fn remembered(mut self) -> Self {
        self.remember = true;
        self
    }

    /// The same answer, given by `by` (`session`, `host`, …).
    pub fn by(mut self, by: impl Into<String>) -> Self {
        self.by = by.into();
        self
    }

    /// The same answer with a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

/// Where a host asks its person: a terminal, an HTTP client, a page. The
/// loop calls it for each call the policy says asks, and races the answer
/// against Stop and the policy's time limit (either ends the wait; the
/// future is then dropped, so an implementation cleans up on drop).
#[async_trait]
pub trait Approver: Send + Sync {
    /// Asks about one call and waits for the answer. Called right after
    /// the run emitted the question's `approval-requested` part; whatever
    /// the implementation does before its first `.await` happens before
    /// that part reaches the host.
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer;

    /// An answer already given for the rest of the session ("always"),
    /// for a tool of an agent: asked before each question, so a host
    /// that keeps answers across runs (a chat) answers without asking.
    fn remembered(&self, agent: &str, tool: &str) -> Option<ApprovalAnswer> {
        let _ = (agent, tool);
        None
    }

    /// Records a call the loop is about to send, before it is sent: called
    /// for every call whose tool is consequential (by its annotations), and
    /// every call the policy said to ask about, once it may run, whatever
    /// let it run (the policy's `auto`, an answer given for the session, a
    /// person's yes). Calls of read-only and other tools that did not ask
    /// are not recorded (see `needs_record` in this module). Called only on a run that
    /// has an approver.
    ///
    /// `Ok(Some(key))`: recorded; the key goes with the call to its source
    /// ([`CallContext::idempotency_key`](crate::CallContext)). `Ok(None)`:
    /// this host keeps no record (the default). `Err(why)`: the call is not
    /// sent, and the model reads `Error [denied]: the host could not record
    /// the call before sending it: why`. Not raced against Stop: an
    /// implementation bounds its own wait (a store's timeouts).
    async fn before_call(&self, call: &CallRecordRequest) -> Result<Option<String>, String> {
        let _ = call;
        Ok(None)
    }
}

/// A call the loop is about to send, as [`Approver::before_call`] gets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecordRequest {
    /// The agent whose run makes the call.
    pub agent: String,
    /// The call, as its tool-call part names it.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The call's full arguments, validated against the tool's schema.
    pub arguments: Value,
    /// What the tool says of itself.
    pub annotations: ToolAnnotations,
    /// The policy said to ask about the call, and it was approved (by a
    /// person, an unattended host's fixed answer, or an answer given for
    /// the session); `false` when the policy let it run without asking.
    pub asked: bool,
}

/// Whether a call that may run is recorded before it is sent
/// ([`Approver::before_call`]): its tool is consequential, or the policy
/// made it ask (a rule said a person decides about it). A read-only call
/// changes nothing when it runs twice or not at all, and a tool that says
/// neither has no effect its source calls worth a person's attention; a
/// record for each would cost a durable commit per call for nothing a
/// person checks after a crash.
pub(crate) fn needs_record(annotations: &ToolAnnotations, asked: bool) -> bool {
    annotations.consequential || asked
}

/// The tools a person said no to in this run. Asking again about a call
/// the person just denied wears them into a yes (a model that wants the
/// call asks at every step), so a denied tool is no longer offered to the
/// model for the rest of the run, and a call of it the model makes all the
/// same is answered `Error [denied]` without asking. The person's next
/// message starts a new run, where the tool asks again: saying so is
/// theirs, not the model's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Refusals {
    /// Tool name to who said no (`person`, `timeout`, `terminal`, ...).
    denied: HashMap<String, String>,
}

impl Refusals {
    /// Notes a question's answer: a denial of `tool` holds for the rest
    /// of the run. An answer given for the session (`by` `session`) was
    /// not asked this run, and the answer it repeats holds already.
    pub(crate) fn record(&mut self, tool: &str, answer: &ApprovalAnswer) {
        if !answer.approved && answer.by != "session" {
            self.denied.insert(tool.to_string(), answer.by.clone());
        }
    }

    /// Whether a person said no to `tool` in this run.
    pub(crate) fn is_denied(&self, tool: &str) -> bool {
        self.denied.contains_key(tool)
    }

    /// The `denied` error a second call of a tool denied in this run gets,
    /// instead of a question; `None` when it was not denied.
    pub(crate) fn second_request(&self, tool: &str) -> Option<ToolError> {
        let by = self.denied.get(tool)?;
        let what = match by.as_str() {
            "person" => format!("the person already said no to `{tool}` in this run"),
            "timeout" => format!("nobody approved `{tool}` in time earlier in this run"),
            by => format!("`{tool}` was denied earlier in this run (by {by})"),
        };
        Some(ToolError::new(
            ToolErrorCode::Denied,
            format!(
                "{what}, so it is not asked again; do without it, or tell the person \
                 what you would need it for"
            ),
        ))
    }

    /// `tools` without those denied in this run: what a step may offer.
    pub(crate) fn offerable(&self, mut tools: Vec<ToolDefinition>) -> Vec<ToolDefinition> {
        if !self.denied.is_empty() {
            tools.retain(|t| !self.is_denied(&t.name));
        }
        tools
    }
}

/// A fresh approval id: 128 random bits in hex, so that it is unique
/// across processes as well as within one. A question's id is all an
/// answer names: an id that counted from 1 in every process let an answer
/// replayed after a restart approve the resumed run's next question, a
/// call nobody saw. Should the operating system's random source fail, the
/// id is made of the process id, the time and a counter, still unique
/// across restarts.
pub(crate) fn next_approval_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_ok() {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        return format!("approval-{hex}");
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "approval-{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// An approver that answers every question the same way at once (hosts
/// that run unattended: `wma run --approve all|none`).
#[derive(Debug, Clone)]
pub struct FixedApprover {
    answer: ApprovalAnswer,
}

impl FixedApprover {
    /// Approves every call that asks (a `deny` still denies).
    pub fn approve_all(by: impl Into<String>) -> Self {
        Self {
            answer: ApprovalAnswer::approve().by(by),
        }
    }

    /// Denies every call that asks, with a note for the model.
    pub fn deny_all(by: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            answer: ApprovalAnswer::deny().by(by).with_note(note),
        }
    }
}

#[async_trait]
impl Approver for FixedApprover {
    async fn ask(&self, _request: ApprovalRequest) -> ApprovalAnswer {
        self.answer.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(read_only: bool, consequential: bool) -> ToolAnnotations {
        ToolAnnotations {
            read_only,
            consequential,
            untrusted_content: false,
        }
    }

    #[test]
    fn globs() {
        assert!(glob_matches("cart_*", "cart_add"));
        assert!(glob_matches("cart_*", "cart_"));
        assert!(!glob_matches("cart_*", "add_cart"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("*_file", "write_file"));
        assert!(glob_matches("w?ite_*e", "write_file"));
        assert!(!glob_matches("write_file", "write_files"));
        assert!(glob_matches("a*b*c", "axxbyyc"));
        assert!(!glob_matches("a*b*c", "axxbyy"));
    }

    #[test]
    fn defaults_follow_the_annotations() {
        let policy = ApprovalPolicy::default();
        assert_eq!(
            policy.decide("read", &ann(true, false), &[], None),
            Verdict::Run
        );
        assert!(matches!(
            policy.decide("write", &ann(false, true), &[], None),
            Verdict::Ask(Reason::Default {
                kind: "consequential"
            })
        ));
        assert_eq!(
            policy.decide("add", &ann(false, false), &[], None),
            Verdict::Run
        );
    }

    #[test]
    fn the_most_specific_rule_wins_and_untrusted_content_makes_consequential_tools_ask() {
        let policy = ApprovalPolicy::default().with_rules([
            ApprovalRule::new("*", ApprovalMode::Ask),
            ApprovalRule::new("cart_*", ApprovalMode::Auto),
            ApprovalRule::new("cart_empty", ApprovalMode::Deny),
        ]);
        assert!(matches!(
            policy.decide("search", &ann(true, false), &[], None),
            Verdict::Ask(_)
        ));
        assert_eq!(
            policy.decide("cart_add", &ann(false, true), &[], None),
            Verdict::Run
        );
        assert!(matches!(
            policy.decide("cart_empty", &ann(false, true), &[], None),
            Verdict::Deny(_)
        ));
        assert_eq!(
            policy.decide("cart_add", &ann(false, true), &[], Some("page_text")),
            Verdict::Ask(Reason::Untrusted {
                source: "page_text".into()
            })
        );
        // Not consequential: untrusted content changes nothing.
        assert_eq!(
            policy.decide("cart_view", &ann(true, false), &[], Some("page_text")),
            Verdict::Run
        );
    }

    #[test]
    fn a_denied_tool_is_offered_no_more_and_a_second_call_is_denied_without_asking() {
        let tool = |name: &str| ToolDefinition {
            name: name.to_string(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            annotations: ann(false, true),
        };
        let mut refusals = Refusals::default();
        let tools = vec![tool("delete_everything"), tool("view")];
        assert_eq!(refusals.offerable(tools.clone()).len(), 2);
        assert!(refusals.second_request("delete_everything").is_none());
        // An approval, and an answer the session gave, change nothing.
        refusals.record("delete_everything", &ApprovalAnswer::approve());
        refusals.record(
            "delete_everything",
            &ApprovalAnswer::deny().remembered().by("session"),
        );
        assert!(!refusals.is_denied("delete_everything"));
        refusals.record("delete_everything", &ApprovalAnswer::deny());
        let offered = refusals.offerable(tools);
        assert_eq!(
            offered.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["view"]
        );
        let error = refusals.second_request("delete_everything").unwrap();
        assert_eq!(error.code, ToolErrorCode::Denied);
        assert!(error.message.contains("not asked again"), "{error}");
        assert!(refusals.second_request("view").is_none());
    }

    #[test]
    fn a_request_tightens_and_never_loosens() {
        let policy = ApprovalPolicy::default()
            .with_rules([ApprovalRule::new("delete_*", ApprovalMode::Deny)]);
        let loosen = [
            ApprovalRule::new("*", ApprovalMode::Auto),
            ApprovalRule::new("delete_file", ApprovalMode::Ask),
        ];
        assert!(matches!(
            policy.decide("write", &ann(false, true), &loosen, None),
            Verdict::Ask(_)
        ));
        assert!(matches!(
            policy.decide("delete_file", &ann(false, true), &loosen, None),
            Verdict::Deny(Reason::Rule(_))
        ));
        let tighten = [ApprovalRule::new("read*", ApprovalMode::Ask)];
        assert!(matches!(
            policy.decide("read_file", &ann(true, false), &tighten, None),
            Verdict::Ask(Reason::Request(_))
        ));
    }
}
