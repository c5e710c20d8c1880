//! `wma chat` on a terminal: the real binary in a pseudo-terminal, where
//! it reads through its line editor (arrow keys, the history of the chat's
//! requests, Ctrl-D and Ctrl-C), and asks its approval questions there.
//! The first test talks to the default model (made by `scripts/setup.sh`),
//! as the tests of `real_model.rs` do; the second to a scripted one.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rexpect::process::WaitStatus;
use rexpect::session::{Options, PtySession};

/// How long one awaited output may take: a real model's reply, as in
/// `real_model.rs`.
const LIMIT: Duration = Duration::from_secs(600);

/// The keys the tests press, as a terminal sends them.
const UP: &str = "\x1b[A";
const LEFT: &str = "\x1b[D";
const ENTER: &str = "\r";
const CTRL_C: &str = "\x03";
const CTRL_D: &str = "\x04";

/// A `wma` process on a pseudo-terminal of its own (its stdin, stdout and
/// stderr), killed when dropped.
struct Terminal {
    session: PtySession,
}

impl Terminal {
    /// Starts `wma ARGS` on a terminal of a kind the editor supports.
    fn wma(args: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wma"));
        command.args(args).env("TERM", "xterm");
        let options = Options::new()
            .timeout_ms(Some(LIMIT.as_millis() as u64))
            .strip_ansi_escape_codes(true);
        let session = rexpect::spawn_with_options(command, options).expect("wma starts on a pty");
        Self { session }
    }

    /// Waits for `text` on the terminal; returns what came before it.
    /// The terminal's output is kept one char per byte, so UTF-8 `text` is
    /// matched byte for byte and the output read back as UTF-8.
    fn wait_for(&mut self, text: &str) -> String {
        let bytes: String = text.bytes().map(char::from).collect();
        match self.session.exp_string(&bytes) {
            Ok(before) => as_text(&before),
            Err(e) => panic!("no {text:?} on the terminal: {}", as_text(&e.to_string())),
        }
    }

    /// Types `keys`.
    fn press(&mut self, keys: &str) {
        self.session.send(keys).unwrap();
        self.session.flush().unwrap();
    }

    /// Waits for the process to end: its exit code and its last output.
    fn ended(mut self) -> (Option<i32>, String) {
        let rest = self
            .session
            .exp_eof()
            .unwrap_or_else(|e| panic!("wma did not end: {}", as_text(&e.to_string())));
        let code = match self.session.process().wait().unwrap() {
            WaitStatus::Exited(_, code) => Some(code),
            _ => None,
        };
        (code, as_text(&rest))
    }
}

/// The terminal's output, one char per byte, as text.
fn as_text(bytes_as_chars: &str) -> String {
    let bytes: Vec<u8> = bytes_as_chars
        .chars()
        .map(|c| u8::try_from(c).unwrap_or(b'?'))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// With no config, the demo shop's agent on the default model answers two
/// requests typed at the editor: the second typed with a word left out and
/// put in with the arrow keys. Up recalls the line as it was sent, Enter
/// sends it again, and Ctrl-D on the empty line ends the chat.
#[test]
fn wma_chat_on_a_terminal_edits_lines_and_sends_one_again_from_its_history() {
    let mut chat = Terminal::wma(&["chat"]);
    chat.wait_for("talking to `shopper`");
    chat.wait_for("you> ");
    chat.press("What is the capital of France? Answer in one word.");
    chat.press(ENTER);
    let first = chat.wait_for("[finished:");
    assert!(first.contains("Paris"), "{first}");

    chat.wait_for("you> ");
    chat.press("Show my cart.");
    chat.press(&LEFT.repeat("my cart.".len()));
    chat.press("me ");
    chat.press(ENTER);
    let second = chat.wait_for("[finished:");
    assert!(second.contains("→ view_cart"), "{second}");

    chat.wait_for("you> ");
    chat.press(UP);
    // The editor shows the recalled line: the one sent, as edited.
    chat.wait_for("you> Show me my cart.");
    chat.press(ENTER);
    let again = chat.wait_for("[finished:");
    assert!(again.contains("→ view_cart"), "{again}");

    chat.wait_for("you> ");
    chat.press(CTRL_D);
    let (code, rest) = chat.ended();
    assert_eq!(code, Some(0), "{rest}");
}

/// A scratch config: an agent whose scripted model puts p-17 in the cart,
/// asking first, twice.
fn asking_config(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("wma-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("wma.toml");
    std::fs::write(
        &config,
        r#"
[providers.p]
kind = "scripted"
replies = [
    '{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}',
    "Added.",
    '{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}',
    "Added again.",
]

[tools.cart]
kind = "demo-shop"
allow = ["add_to_cart", "view_cart"]

[agents.clerk]
provider = "p"
tools = ["cart"]
approval = { tools = { add_to_cart = "ask" } }
"#,
    )
    .unwrap();
    (dir, config)
}

/// A question is asked at the editor, its prompt the question's, only
/// when the call needs the answer; the answer is not kept in the history,
/// which holds the chat's requests. Ctrl-C at a question denies the call
/// and stops the reply; Ctrl-C at the chat's prompt ends the chat.
#[test]
fn a_terminal_chat_asks_its_questions_at_the_editor_and_ends_on_ctrl_c() {
    let (dir, config) = asking_config("chat-terminal");
    let mut chat = Terminal::wma(&["chat", "--config", config.to_str().unwrap()]);
    chat.wait_for("you> ");
    chat.press("Put the backpack in my cart");
    chat.press(ENTER);
    let asked = chat.wait_for("run it? [y]es, [n]o, [a]lways or [never] for this session: ");
    assert!(asked.contains("wants to call `add_to_cart`"), "{asked}");
    chat.press("y");
    chat.press(ENTER);
    let answered = chat.wait_for("[finished:");
    assert!(
        answered.contains("✓ approved add_to_cart (person)") && answered.contains("Added."),
        "{answered}"
    );

    chat.wait_for("you> ");
    chat.press(UP);
    chat.wait_for("you> Put the backpack in my cart");
    chat.press(ENTER);
    chat.wait_for("run it? [y]es");
    chat.press(CTRL_C);
    let stopped = chat.wait_for("you> ");
    assert!(stopped.contains("[finished: aborted]"), "{stopped}");
    assert!(!stopped.contains("Added again."), "{stopped}");

    chat.press(CTRL_C);
    let (code, rest) = chat.ended();
    assert_eq!(code, Some(0), "{rest}");
    // The one approved call ran; the cart is said as the chat ends.
    assert!(rest.contains("cart of `cart`: 1 x p-17"), "{rest}");
    std::fs::remove_dir_all(&dir).unwrap();
}
