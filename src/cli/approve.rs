//! Approvals on the terminal: `wma run` and `wma chat` show a call that
//! needs approval with its full arguments and read the answer from stdin.
//! A chat that keeps its conversation in the store also records there each
//! call that needs it before it is sent ([`RecordingApprover`]).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;

use anyhow::{Result, bail};
use async_trait::async_trait;
use clap::{Args, ValueEnum};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use webmcp_agents::agent::{
    ApprovalAnswer, ApprovalMode, ApprovalRequest, ApprovalRule, Approver, CallRecordRequest,
    FixedApprover,
};
use webmcp_agents::display::terminal_safe;
use webmcp_agents::runtime::TaggedPart;
use webmcp_agents::store::{CallRecorder, RunCallId, Store};

/// How long a question answered by Ctrl-C waits for the reply's stop
/// (the SIGINT the editor passed on) before it is a plain denial.
#[cfg(unix)]
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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

/// What asking for a line gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// A line, trimmed.
    Line(String),
    /// Ctrl-C at the line editor. On Unix it is passed on as SIGINT too,
    /// so it also stops the reply in flight, or ends the command between
    /// replies, as Ctrl-C does while no editor holds the terminal.
    Interrupted,
    /// The input ended: Ctrl-D, the end of a pipe, or a terminal that
    /// cannot be read.
    Ended,
}

/// A line asked of the line editor, and where its answer goes.
struct Asked {
    prompt: String,
    /// Whether the line joins the history Up and Down walk: a chat's
    /// requests do, answers to questions do not.
    kept: bool,
    reply: oneshot::Sender<Input>,
}

/// Where the lines come from.
enum Source {
    /// Stdin read ahead, on a thread of its own (reading blocks), for a
    /// pipe or a file. Lines that are not UTF-8 come as their number.
    Read(tokio::sync::Mutex<mpsc::Receiver<Result<String, usize>>>),
    /// A line editor on the terminal, on a thread of its own, asked for
    /// one line at a time: it shows a prompt only when a line is wanted,
    /// never in the middle of a reply. The lock keeps one question at the
    /// editor at a time, so a line goes to the one who asked for it.
    Edited(tokio::sync::Mutex<mpsc::Sender<Asked>>),
}

/// The person's lines, shared by a chat's requests and the answers to its
/// questions: read from stdin, or on a terminal through a line editor.
#[derive(Clone)]
pub(crate) struct Lines {
    source: Arc<Source>,
}

impl Lines {
    /// Starts reading stdin as plain lines.
    pub(crate) fn stdin() -> Self {
        Self::reading(std::io::BufReader::new(std::io::stdin()))
    }

    /// A line editor for a person at a terminal (arrow keys, history of
    /// the chat's lines, in memory only) when stdin is one; else plain
    /// lines, as [`stdin`](Self::stdin) reads them.
    pub(crate) fn terminal_or_stdin() -> Self {
        if !std::io::stdin().is_terminal() {
            return Self::stdin();
        }
        // The editor draws on the terminal itself rather than on stdout,
        // so stdout carries only the chat's output even when it is
        // redirected.
        let config = rustyline::Config::builder()
            .behavior(rustyline::Behavior::PreferTerm)
            .build();
        match rustyline::DefaultEditor::with_config(config) {
            Ok(mut editor) => Self::editing(move |prompt: &str, kept: bool| {
                use rustyline::error::ReadlineError;
                match editor.readline(prompt) {
                    Ok(line) => {
                        let line = line.trim().to_string();
                        if kept && !line.is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        Input::Line(line)
                    }
                    Err(ReadlineError::Interrupted) => {
                        // The editor holds the terminal in raw mode, where
                        // Ctrl-C is a key and no signal: passed on, it
                        // does what it does everywhere else in wma.
                        #[cfg(unix)]
                        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGINT);
                        Input::Interrupted
                    }
                    Err(ReadlineError::Eof) => Input::Ended,
                    Err(e) => {
                        eprintln!("error: the terminal could not be read: {e}");
                        Input::Ended
                    }
                }
            }),
            Err(e) => {
                eprintln!("warning: no line editing ({e}); reading plain lines");
                Self::stdin()
            }
        }
    }

    /// Starts reading `input` on a thread of its own. A line that is not
    /// UTF-8 is passed on as its line number, and reading goes on after
    /// it: one bad line must not end a chat or lose the lines after it.
    fn reading(mut input: impl std::io::BufRead + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel::<Result<String, usize>>(1);
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let mut number = 0;
            loop {
                bytes.clear();
                match input.read_until(b'\n', &mut bytes) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        number += 1;
                        let line = match std::str::from_utf8(&bytes) {
                            Ok(text) => Ok(text.trim().to_string()),
                            Err(_) => Err(number),
                        };
                        if tx.blocking_send(line).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            source: Arc::new(Source::Read(tokio::sync::Mutex::new(rx))),
        }
    }

    /// Serves each line asked for with `read(prompt, kept)`, on a thread
    /// of its own (the editor blocks), until the input ends.
    fn editing(mut read: impl FnMut(&str, bool) -> Input + Send + 'static) -> Self {
        let (tx, mut rx) = mpsc::channel::<Asked>(1);
        std::thread::spawn(move || {
            while let Some(asked) = rx.blocking_recv() {
                let input = read(&asked.prompt, asked.kept);
                let ended = input == Input::Ended;
                // A question given up on (its wait ran out) while the person
                // typed: the line was typed for that question's prompt, so
                // it answers nothing else.
                if let Err(Input::Line(line)) = asked.reply.send(input)
                    && !line.is_empty()
                {
                    eprintln!("(the question had stopped waiting; that line was not used)");
                }
                if ended {
                    return;
                }
            }
        });
        Self {
            source: Arc::new(Source::Edited(tokio::sync::Mutex::new(tx))),
        }
    }

    /// Whether a line editor reads the lines (it shows the prompts).
    pub(crate) fn edits(&self) -> bool {
        matches!(*self.source, Source::Edited(_))
    }

    /// A request of the chat, after `prompt` (on stdout when read plainly;
    /// an empty prompt prints nothing); the editor keeps it in its
    /// history.
    pub(crate) async fn request(&self, prompt: &str) -> Result<Input> {
        if !self.edits() && !prompt.is_empty() {
            let mut out = std::io::stdout();
            write!(out, "{prompt}")?;
            out.flush()?;
        }
        Ok(self.next(prompt, true).await)
    }

    /// An answer to a question, after `prompt` (on stderr when read
    /// plainly, beside the question).
    pub(crate) async fn answer(&self, prompt: &str) -> Input {
        if !self.edits() {
            let mut err = std::io::stderr();
            let _ = write!(err, "{prompt}");
            let _ = err.flush();
        }
        self.next(prompt, false).await
    }

    /// The next line. Read plainly, a line that is not UTF-8 is refused on
    /// stderr, saying which it was, and the next is read.
    async fn next(&self, prompt: &str, kept: bool) -> Input {
        match &*self.source {
            Source::Read(rx) => {
                let mut rx = rx.lock().await;
                loop {
                    match rx.recv().await {
                        None => return Input::Ended,
                        Some(Ok(line)) => return Input::Line(line),
                        Some(Err(number)) => eprintln!(
                            "error: line {number} of the input is not valid UTF-8; it was not \
                             sent (the chat goes on)"
                        ),
                    }
                }
            }
            Source::Edited(editor) => {
                let editor = editor.lock().await;
                let (reply, answer) = oneshot::channel();
                let asked = Asked {
                    prompt: prompt.to_string(),
                    kept,
                    reply,
                };
                if editor.send(asked).await.is_err() {
                    return Input::Ended;
                }
                answer.await.unwrap_or(Input::Ended)
            }
        }
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
        // The call is the model's and its reason names the tool's source:
        // neither may write to the terminal around the question.
        let _ = writeln!(
            err,
            "\n`{}` wants to call `{}` ({}) with:\n{}",
            terminal_safe(&request.agent),
            terminal_safe(&request.tool),
            terminal_safe(&request.reason),
            terminal_safe(&arguments)
        );
        loop {
            let line = match self
                .lines
                .answer("run it? [y]es, [n]o, [a]lways or [never] for this session: ")
                .await
            {
                Input::Line(line) => line,
                // On Unix the reply is being stopped as well (the editor
                // passed Ctrl-C on as SIGINT), and the run's stop ends this
                // question: the loop races it against the answer. A denial
                // given at once would let the run go on to its next step
                // before the stop lands, so it waits for the stop first.
                Input::Interrupted => {
                    let _ = writeln!(err, "(Ctrl-C: denied)");
                    #[cfg(unix)]
                    tokio::time::sleep(STOP_GRACE).await;
                    return ApprovalAnswer::deny()
                        .by("terminal")
                        .with_note("the person pressed Ctrl-C instead of answering");
                }
                Input::Ended => {
                    let _ = writeln!(err, "(no answer: the input ended; denied)");
                    return ApprovalAnswer::deny()
                        .by("terminal")
                        .with_note("nobody answered (the input ended)");
                }
            };
            if let Some(answer) = parse_answer(&line) {
                if answer.remember {
                    self.remembered.lock().insert(
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

/// The approver of a chat kept in the store (`--session`, `--new-session`):
/// questions go to the chat's own approver, and each call that needs a
/// record (a consequential tool's, however it was let run, and every one
/// that asked) is recorded `in-flight` in the turn's run before the loop
/// sends it, as `wma serve` does (docs/sessions.md), through the turn's
/// [`CallRecorder`]. Its key goes with the call to its source. The chat
/// hands each part to [`record_answer`](Self::record_answer), which
/// records the call's result or error, and ends each turn with
/// [`end_turn`](Self::end_turn), which marks the calls that never answered
/// (the turn was stopped in the middle of one) in doubt.
pub(crate) struct RecordingApprover {
    inner: Arc<dyn Approver>,
    store: Store,
    /// The calls of the turn going on, kept in its run; `None` between
    /// turns.
    turn: Mutex<Option<Arc<CallRecorder>>>,
}

impl RecordingApprover {
    /// Asks through `inner` and records in `store`.
    pub(crate) fn new(inner: Arc<dyn Approver>, store: Store) -> Self {
        Self {
            inner,
            store,
            turn: Mutex::new(None),
        }
    }

    /// The turn going on is the store's run `run_id`: its calls are
    /// recorded under it.
    pub(crate) fn begin_turn(&self, run_id: &str) {
        *self.turn.lock() = Some(Arc::new(CallRecorder::new(self.store.clone(), run_id)));
    }

    /// A part of the turn: when it is the result or the error of a call
    /// recorded before it was sent, its answer is recorded (off the
    /// turn's path; [`end_turn`](Self::end_turn) waits for it).
    pub(crate) fn record_answer(&self, part: &TaggedPart) {
        let Some((call, output, is_error)) = part.call_answer() else {
            return;
        };
        if let Some(turn) = &*self.turn.lock() {
            turn.answer(&call, output, is_error);
        }
    }

    /// The turn ended: its answers are recorded, and a recorded call that
    /// never answered (the turn was stopped while it ran) may or may not
    /// have happened, so it is marked in doubt now, as a restart would.
    /// Returns those calls' keys by (calling agent, sub-agent run, call
    /// id).
    pub(crate) async fn end_turn(&self) -> HashMap<RunCallId, String> {
        let Some(turn) = self.turn.lock().take() else {
            return HashMap::new();
        };
        let ended = turn.end().await;
        for problem in &ended.problems {
            eprintln!("warning: {problem}");
        }
        for ((_, _, call_id), key) in &ended.unanswered {
            if ended.in_doubt.contains(key) {
                eprintln!(
                    "call {call_id} (key {key}) did not answer before the turn ended: it is in doubt; check whether it happened"
                );
            }
        }
        ended.unanswered
    }
}

#[async_trait]
impl Approver for RecordingApprover {
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer {
        self.inner.ask(request).await
    }

    fn remembered(&self, agent: &str, tool: &str) -> Option<ApprovalAnswer> {
        self.inner.remembered(agent, tool)
    }

    /// Recorded in the turn's run, committed before the call is sent; an
    /// error (the store cannot be reached, no turn is going on) means the
    /// call is not sent, and the model reads why.
    async fn before_call(&self, call: &CallRecordRequest) -> Result<Option<String>, String> {
        let turn = self
            .turn
            .lock()
            .clone()
            .ok_or("no turn of the chat is going on to record it in")?;
        // Which of the turn's sub-agent runs calls, as its parts carry it.
        let sub_run = TaggedPart::current_sub_run();
        let key = turn
            .begin(
                &call.agent,
                &sub_run,
                &call.call_id,
                &call.tool,
                &call.arguments,
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(Some(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use webmcp_agents::agent::AgentStreamPart;

    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_skipped_and_the_rest_is_read() {
        let input: &'static [u8] = b"first\nbad \xff\xfe line\nthird\n";
        let lines = Lines::reading(std::io::BufReader::new(input));
        assert!(!lines.edits());
        assert_eq!(
            lines.request("").await.unwrap(),
            Input::Line("first".into())
        );
        assert_eq!(lines.answer("").await, Input::Line("third".into()));
        assert_eq!(lines.request("").await.unwrap(), Input::Ended);
    }

    /// What an editor was asked, in order: (prompt, kept in history).
    type Asks = Arc<Mutex<Vec<(String, bool)>>>;

    /// A line editor whose person types what is sent on the returned
    /// sender (nothing left: Ctrl-D), and what it was asked.
    fn scripted_editor() -> (Lines, std::sync::mpsc::Sender<Input>, Asks) {
        let (keys, typed) = std::sync::mpsc::channel::<Input>();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let lines = Lines::editing(move |prompt: &str, kept: bool| {
            seen.lock().push((prompt.to_string(), kept));
            typed.recv().unwrap_or(Input::Ended)
        });
        (lines, keys, asked)
    }

    #[tokio::test]
    async fn the_editor_reads_a_line_only_when_one_is_asked_for_with_the_askers_prompt() {
        let (lines, keys, asked) = scripted_editor();
        for input in [
            Input::Line("Show me my cart".into()),
            Input::Line("y".into()),
            Input::Interrupted,
            Input::Ended,
            Input::Line("never read".into()),
        ] {
            keys.send(input).unwrap();
        }
        assert!(lines.edits());
        // Lines are waiting to be typed, yet none is read before it is asked for.
        assert!(asked.lock().is_empty());
        assert_eq!(
            lines.request("you> ").await.unwrap(),
            Input::Line("Show me my cart".into())
        );
        assert_eq!(lines.answer("run it? ").await, Input::Line("y".into()));
        assert_eq!(lines.request("you> ").await.unwrap(), Input::Interrupted);
        assert_eq!(lines.request("you> ").await.unwrap(), Input::Ended);
        // Once the input ended, the editor is not asked again.
        assert_eq!(lines.request("you> ").await.unwrap(), Input::Ended);
        assert_eq!(
            *asked.lock(),
            [
                ("you> ".to_string(), true),
                ("run it? ".to_string(), false),
                ("you> ".to_string(), true),
                ("you> ".to_string(), true),
            ]
        );
    }

    #[tokio::test]
    async fn a_line_typed_for_a_question_given_up_on_answers_nothing_else() {
        use futures::FutureExt;
        let (lines, keys, asked) = scripted_editor();
        // The question is put to the editor, then given up on (its wait ran
        // out) while the person has not typed yet.
        assert!(lines.answer("run it? ").now_or_never().is_none());
        keys.send(Input::Line("y".into())).unwrap();
        keys.send(Input::Line("Show me my cart".into())).unwrap();
        assert_eq!(
            lines.request("you> ").await.unwrap(),
            Input::Line("Show me my cart".into())
        );
        assert_eq!(
            *asked.lock(),
            [("run it? ".to_string(), false), ("you> ".to_string(), true)]
        );
    }

    fn order(call_id: &str) -> CallRecordRequest {
        CallRecordRequest {
            agent: "main".into(),
            call_id: call_id.into(),
            tool: "place_order".into(),
            arguments: serde_json::json!({"item": "tent"}),
            annotations: webmcp_agents::agent::ToolAnnotations {
                consequential: true,
                ..Default::default()
            },
            asked: false,
        }
    }

    #[tokio::test]
    async fn a_kept_chat_records_each_call_before_it_is_sent_and_refuses_one_it_cannot_record() {
        use webmcp_agents::agent::{ToolError, ToolErrorCode};
        use webmcp_agents::store::{CallStatus, RunStatus, StoreOptions};
        let dir = std::env::temp_dir().join(format!(
            "wma-chat-record-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let store = Store::open(StoreOptions::in_data_dir(&dir)).await.unwrap();
        let session = store.create_session("main", "").await.unwrap();
        let run = store.start_run(&session.id, "main", None).await.unwrap();
        let asking: Arc<dyn Approver> = Arc::new(FixedApprover::approve_all("test"));
        let recorder = RecordingApprover::new(asking, store.clone());
        // Between turns there is no run to record a call in: not sent.
        let refused = recorder.before_call(&order("call_1_1")).await.unwrap_err();
        assert!(refused.contains("no turn"), "{refused}");

        recorder.begin_turn(&run.id);
        let answered = recorder
            .before_call(&order("call_1_1"))
            .await
            .unwrap()
            .expect("a key");
        let cut = recorder
            .before_call(&order("call_2_1"))
            .await
            .unwrap()
            .expect("a key");
        assert_ne!(answered, cut);
        let recorded = store.call(&answered).await.unwrap().unwrap();
        assert_eq!(recorded.status, CallStatus::InFlight);
        assert_eq!(recorded.run_id, run.id);
        // A result of another agent's call of the same id answers nothing.
        let failed = AgentStreamPart::ToolError {
            call_id: "call_1_1".into(),
            name: "place_order".into(),
            error: ToolError::new(ToolErrorCode::ToolFailed, "out of tents"),
        };
        recorder.record_answer(&TaggedPart::new("helper".to_string(), 1, failed.clone()));
        recorder.record_answer(&TaggedPart::new("main".to_string(), 0, failed));
        let cut_short = recorder.end_turn().await;
        assert_eq!(
            cut_short,
            HashMap::from([(
                ("main".to_string(), String::new(), "call_2_1".to_string()),
                cut.clone()
            )])
        );
        let recorded = store.call(&answered).await.unwrap().unwrap();
        assert_eq!(recorded.status, CallStatus::Answered);
        assert!(recorded.is_error);
        assert_eq!(
            recorded.output.as_deref(),
            Some("Error [tool_failed]: out of tents")
        );
        // The call that never answered is in doubt once its turn ended.
        let recorded = store.call(&cut).await.unwrap().unwrap();
        assert_eq!(recorded.status, CallStatus::InDoubt);

        // A store that refuses the record (the run ended): not sent.
        recorder.begin_turn(&run.id);
        store
            .set_run_status(&run.id, RunStatus::Finished)
            .await
            .unwrap();
        let refused = recorder.before_call(&order("call_3_1")).await.unwrap_err();
        assert!(refused.contains("finished"), "{refused}");
        assert_eq!(store.calls_of_run(&run.id).await.unwrap().len(), 2);
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

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
