//! Approvals on the terminal: `wma run` and `wma chat` show a call that
//! needs approval with its full arguments and read the answer from stdin.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail};
use async_trait::async_trait;
use clap::{Args, ValueEnum};
use tokio::sync::mpsc;
use webmcp_agents::agent::{
    ApprovalAnswer, ApprovalMode, ApprovalRequest, ApprovalRule, Approver, FixedApprover,
};

/// How calls that need approval are answered.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ApproveMode {
    /// Ask on the terminal and read the answer from stdin (also when stdin
    /// is a pipe: answers one per line).
    Ask,
    /// Approve every call that asks; a `deny` rule still denies.
    All,
    /// Deny every call that asks.
    None,
}

/// The approval flags of `wma run` and `wma chat`.
#[derive(Args, Clone, Default)]
pub(crate) struct ApprovalArgs {
    /// How calls that need approval (docs/approvals.md) are answered:
    /// `ask` on the terminal, approve `all`, or deny them (`none`).
    /// Default: `ask` when stdin is a terminal (and always for `wma chat`,
    /// whose input is the person's), else `none`, so an unattended run
    /// never waits for a terminal that is not there.
    #[arg(long, value_enum, value_name = "MODE")]
    pub(crate) approve: Option<ApproveMode>,
    /// Ask before every call of the tools matching this pattern (`*` and
    /// `?` are wildcards); repeatable. Only tightens the agent's policy.
    #[arg(long = "ask", value_name = "TOOL_PATTERN")]
    pub(crate) ask: Vec<String>,
    /// Never run the tools matching this pattern; repeatable.
    #[arg(long = "deny", value_name = "TOOL_PATTERN")]
    pub(crate) deny: Vec<String>,
}

impl ApprovalArgs {
    /// The run's own rules, from `--ask` and `--deny`.
    pub(crate) fn rules(&self) -> Result<Vec<ApprovalRule>> {
        let mut rules = Vec::new();
        for (patterns, mode, flag) in [
            (&self.ask, ApprovalMode::Ask, "--ask"),
            (&self.deny, ApprovalMode::Deny, "--deny"),
        ] {
            for pattern in patterns {
                if let Some(problem) = webmcp_agents::config::tool_pattern_problem(pattern) {
                    bail!("{flag} {pattern}: {problem}");
                }
                rules.push(ApprovalRule::new(pattern.clone(), mode));
            }
        }
        Ok(rules)
    }

    /// The mode in effect: the flag's, else by whether stdin is a terminal
    /// (`interactive` commands always ask).
    pub(crate) fn mode(&self, interactive: bool) -> ApproveMode {
        match self.approve {
            Some(mode) => mode,
            None if interactive || std::io::stdin().is_terminal() => ApproveMode::Ask,
            None => ApproveMode::None,
        }
    }
}

/// Lines of stdin, read on a thread of their own (reading blocks), shared
/// by a chat's requests and the answers to its questions.
#[derive(Clone)]
pub(crate) struct Lines {
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<String>>>,
}

impl Lines {
    /// Starts reading stdin.
    pub(crate) fn stdin() -> Self {
        let (tx, rx) = mpsc::channel::<String>(1);
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            let mut line = String::new();
            loop {
                line.clear();
                match stdin.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if tx.blocking_send(line.trim().to_string()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
        }
    }

    /// The next line; `None` once stdin ended.
    pub(crate) async fn next(&self) -> Option<String> {
        self.rx.lock().await.recv().await
    }
}

/// Asks on the terminal: the question on stderr, the answer from stdin.
/// "always" and "never" hold for the rest of the session (the run, or the
/// whole chat).
pub(crate) struct TerminalApprover {
    lines: Lines,
    remembered: Mutex<HashMap<(String, String), ApprovalAnswer>>,
}

impl TerminalApprover {
    pub(crate) fn new(lines: Lines) -> Self {
        Self {
            lines,
            remembered: Mutex::new(HashMap::new()),
        }
    }
}

/// An answer as typed, or `None` for something else.
pub(crate) fn parse_answer(line: &str) -> Option<ApprovalAnswer> {
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Some(ApprovalAnswer::approve()),
        "n" | "no" => Some(ApprovalAnswer::deny()),
        "a" | "always" => Some(ApprovalAnswer::approve().remembered()),
        "never" => Some(ApprovalAnswer::deny().remembered()),
        _ => None,
    }
}

#[async_trait]
impl Approver for TerminalApprover {
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer {
        // The call's own lines (its tool-call and approval-requested parts)
        // are printed by the command's reader, on another task; a moment's
        // wait lets them reach the terminal before the question does.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let arguments = serde_json::to_string_pretty(&request.arguments)
            .unwrap_or_else(|_| request.arguments.to_string());
        let mut err = std::io::stderr();
        let _ = writeln!(
            err,
            "\n`{}` wants to call `{}` ({}) with:\n{arguments}",
            request.agent, request.tool, request.reason
        );
        loop {
            let _ = write!(
                err,
                "run it? [y]es, [n]o, [a]lways or [never] for this session: "
            );
            let _ = err.flush();
            let Some(line) = self.lines.next().await else {
                let _ = writeln!(err, "(no answer: the input ended; denied)");
                return ApprovalAnswer::deny()
                    .by("terminal")
                    .with_note("nobody answered (the input ended)");
            };
            if let Some(answer) = parse_answer(&line) {
                if answer.remember
                    && let Ok(mut remembered) = self.remembered.lock()
                {
                    remembered.insert(
                        (request.agent.clone(), request.tool.clone()),
                        answer.clone(),
                    );
                }
                return answer;
            }
            let _ = writeln!(err, "please answer y, n, a or never");
        }
    }

    fn remembered(&self, agent: &str, tool: &str) -> Option<ApprovalAnswer> {
        self.remembered
            .lock()
            .ok()?
            .get(&(agent.to_string(), tool.to_string()))
            .cloned()
    }
}

/// The approver a command uses in `mode`; `lines` is the command's stdin
/// when it reads one already (a chat).
pub(crate) fn approver(mode: ApproveMode, lines: Option<Lines>) -> Arc<dyn Approver> {
    match mode {
        ApproveMode::Ask => Arc::new(TerminalApprover::new(lines.unwrap_or_else(Lines::stdin))),
        ApproveMode::All => Arc::new(FixedApprover::approve_all("--approve all")),
        ApproveMode::None => {
            let note = if std::io::stdin().is_terminal() {
                "`--approve none` denies every call that needs approval"
            } else {
                "it needs approval, and stdin is not a terminal (pass `--approve ask` to read answers from stdin, or `--approve all`)"
            };
            Arc::new(FixedApprover::deny_all("--approve none", note))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_typed() {
        assert!(parse_answer(" Y ").unwrap().approved);
        assert!(!parse_answer("no").unwrap().approved);
        let always = parse_answer("always").unwrap();
        assert!(always.approved && always.remember);
        let never = parse_answer("never").unwrap();
        assert!(!never.approved && never.remember);
        assert!(parse_answer("maybe").is_none());
        assert!(parse_answer("").is_none());
    }
}
