//! Chat templates: the model's own Jinja template, rendered with minijinja the
//! way Hugging Face's `apply_chat_template` renders it.
//!
//! # Content is never control
//! The text a template is given (message content, tool names, descriptions
//! and every string of a tool's schema) comes from people, tools and pages.
//! Tokenized together with the template's own text, a tool result holding
//! `<|im_end|>\n<|im_start|>system\n…` would become real control tokens: a
//! turn that the model reads as the system's. [`ChatTemplate::render_prompt`]
//! therefore says where the given text landed in the prompt
//! ([`RenderedPrompt`]), and the provider's [`PromptEncoder`](crate::PromptEncoder)
//! reads special tokens only outside those places.
//!
//! Only strings that could take part in a control token are followed: those
//! that overlap one of the tokenizer's added tokens in some alignment (hold
//! one, begin with its end, end with its beginning, or lie inside one).
//! Others cannot, whatever surrounds them, so most prompts render once, as
//! before. A followed string is rendered between two marker characters (its
//! leading and trailing whitespace outside them, so that a template's
//! `trim` still sees it), the markers are taken out, and the result is
//! compared with a plain rendering: equal, the markers' places are exactly
//! the string's. A template that changes or inspects the strings it is
//! given in a way the markers disturb (slicing, comparing) makes the two
//! differ; then the followed strings are escaped instead (a zero-width space
//! breaks each control-token text in them, and guards their ends), and the
//! prompt is tokenized as a whole.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use wma_agent::{CallFormat, PromptMessage, ToolDefinition};

use crate::error::OrtError;

/// The name the template is stored under in its environment.
const NAME: &str = "chat";

/// ChatML, for model folders that carry no template of their own.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template and what it tells about the model.
///
/// ```
/// use wma_agent::{CallFormat, PromptMessage, PromptRole};
/// use wma_provider_ort::{CHATML_TEMPLATE, ChatTemplate};
///
/// let template = ChatTemplate::new(CHATML_TEMPLATE, None, Some("<|im_end|>".into()))?;
/// let prompt = template.render(&[PromptMessage::new(PromptRole::User, "Hi")], &[], true)?;
/// assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
/// // ChatML has no tools: the loop lists them in the prompt itself.
/// assert!(template.tools_inline());
/// assert_eq!(template.call_format(), CallFormat::Json);
/// # Ok::<(), wma_provider_ort::OrtError>(())
/// ```
pub struct ChatTemplate {
    /// Holds the compiled template; owning its source keeps it `'static`.
    env: Environment<'static>,
    /// Kept for [`ChatTemplate::source`] (people debugging a prompt want it).
    source: String,
    /// Passed to the template as `bos_token`.
    bos_token: String,
    /// Passed to the template as `eos_token`.
    eos_token: String,
    /// Whether the template renders `tools` itself.
    takes_tools: bool,
    /// How the model was trained to write calls.
    call_format: CallFormat,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("takes_tools", &self.takes_tools)
            .field("call_format", &self.call_format)
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: Cow<'a, str>,
}

/// Opens a followed string in a marked rendering: a Unicode noncharacter,
/// which no text is meant to hold (one that does has it replaced).
const OPEN: char = '\u{FDD0}';
/// Closes a followed string in a marked rendering.
const CLOSE: char = '\u{FDD1}';
/// Breaks control-token text where markers cannot be used: invisible, not
/// whitespace (a template's `trim` keeps it), and part of no token's text.
const BREAK: char = '\u{200B}';

/// A rendered prompt, and where in it the template put the strings it was
/// given that could take part in a control token (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The prompt text.
    pub text: String,
    /// Byte ranges of `text` holding given strings that could take part in
    /// a control token: tokenize them as plain text.
    pub content: Vec<Range<usize>>,
    /// False when the template disturbed the markers and the strings were
    /// escaped instead: then `content` is empty and no control-token text is
    /// left in them.
    pub exact: bool,
}

/// How a given string is rendered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// As it is.
    Plain,
    /// Followed strings between markers.
    Marked,
    /// Followed strings escaped.
    Escaped,
}

/// Whether some occurrence of a control-token text could overlap `s` in
/// a prompt: `s` holds one, begins with one's end, ends with one's
/// beginning, or lies inside one.
fn could_form_control(s: &str, controls: &[String]) -> bool {
    if s.is_empty() {
        return false;
    }
    controls.iter().filter(|c| !c.is_empty()).any(|c| {
        if s.contains(c.as_str()) || c.contains(s) {
            return true;
        }
        c.char_indices()
            .skip(1)
            .any(|(at, _)| s.ends_with(&c[..at]) || s.starts_with(&c[at..]))
    })
}

/// The text of a given string in one rendering.
fn given<'a>(s: &'a str, controls: &[String], mode: Mode) -> Cow<'a, str> {
    // Marker characters in a given string would confuse the markers.
    let s: Cow<'a, str> = if s.contains([OPEN, CLOSE]) {
        Cow::Owned(s.replace([OPEN, CLOSE], "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    };
    if mode == Mode::Plain || !could_form_control(&s, controls) {
        return s;
    }
    let core = s.trim();
    let start = s.len() - s.trim_start().len();
    let (lead, trail) = (&s[..start], &s[start + core.len()..]);
    match mode {
        Mode::Marked => Cow::Owned(format!("{lead}{OPEN}{core}{CLOSE}{trail}")),
        _ => Cow::Owned(format!(
            "{lead}{BREAK}{}{BREAK}{trail}",
            escape(core, controls)
        )),
    }
}

/// `s` with a zero-width space after the first character of every
/// control-token text in it.
fn escape(s: &str, controls: &[String]) -> String {
    let mut out = s.to_string();
    // Each pass breaks at least one occurrence and makes none (no control
    // text holds the break), so this ends.
    while let Some((at, len)) = controls
        .iter()
        .filter(|c| !c.is_empty())
        .filter_map(|c| {
            out.find(c.as_str())
                .map(|at| (at, c.chars().next().map_or(1, char::len_utf8)))
        })
        .min()
    {
        out.insert(at + len, BREAK);
    }
    out
}

/// A tool's strings (name, description, every string of its schema, keys
/// included) rendered in `mode`.
fn given_json(value: &serde_json::Value, controls: &[String], mode: Mode) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        J::String(s) => J::String(given(s, controls, mode).into_owned()),
        J::Array(items) => J::Array(
            items
                .iter()
                .map(|v| given_json(v, controls, mode))
                .collect(),
        ),
        J::Object(map) => J::Object(
            map.iter()
                .map(|(k, v)| {
                    (
                        given(k, controls, mode).into_owned(),
                        given_json(v, controls, mode),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The marked rendering without its markers, and the byte ranges they
/// enclosed; `None` when they do not pair up (the template cut a string).
fn unmark(marked: &str) -> Option<(String, Vec<Range<usize>>)> {
    let mut text = String::with_capacity(marked.len());
    let mut spans = Vec::new();
    let mut open: Option<usize> = None;
    for c in marked.chars() {
        match c {
            OPEN if open.is_none() => open = Some(text.len()),
            CLOSE => spans.push(open.take()?..text.len()),
            OPEN => return None,
            c => text.push(c),
        }
    }
    open.is_none().then_some((text, spans))
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token` and `eos_token` are the texts the
    /// template may insert (empty when not given).
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, OrtError> {
        let source = source.into();
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks on; without
        // them most templates put stray newlines into the prompt.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        // Python string methods (`.strip()`, `.startswith()`, `.items()`...)
        // that templates written for Jinja2 call.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.clone())
            .map_err(template_error)?;
        let takes_tools = source.contains("tools");
        let call_format = if source.contains("<tool_call>") {
            CallFormat::Hermes
        } else {
            CallFormat::Json
        };
        Ok(Self {
            env,
            source,
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
            takes_tools,
            call_format,
        })
    }

    /// ChatML, the template used when a model folder has none.
    pub fn chatml() -> Self {
        Self::new(CHATML_TEMPLATE, None, Some("<|im_end|>".into()))
            .expect("the built-in ChatML template compiles")
    }

    /// Renders the prompt. `tools` reach the template only when it takes
    /// them ([`ChatTemplate::tools_inline`] is false). The text as the
    /// template writes it; for the model, use
    /// [`render_prompt`](Self::render_prompt), which says where the given
    /// strings are.
    pub fn render(
        &self,
        messages: &[PromptMessage],
        tools: &[ToolDefinition],
        add_generation_prompt: bool,
    ) -> Result<String, OrtError> {
        self.render_as(messages, tools, add_generation_prompt, &[], Mode::Plain)
    }

    /// Renders the prompt and finds the given strings that could take part
    /// in one of `controls` (the texts of the tokenizer's added tokens): see
    /// the module docs.
    pub fn render_prompt(
        &self,
        messages: &[PromptMessage],
        tools: &[ToolDefinition],
        add_generation_prompt: bool,
        controls: &[String],
    ) -> Result<RenderedPrompt, OrtError> {
        let gen_prompt = add_generation_prompt;
        let text = self.render_as(messages, tools, gen_prompt, controls, Mode::Plain)?;
        let followed = |s: &str| could_form_control(s, controls);
        let any = messages.iter().any(|m| followed(&m.content))
            || (self.takes_tools
                && tools.iter().any(|t| {
                    followed(&t.name)
                        || followed(&t.description)
                        || json_strings(&t.input_schema).any(followed)
                }));
        if !any {
            return Ok(RenderedPrompt {
                text,
                content: Vec::new(),
                exact: true,
            });
        }
        let marked = self.render_as(messages, tools, gen_prompt, controls, Mode::Marked)?;
        if let Some((unmarked, content)) = unmark(&marked)
            && unmarked == text
        {
            return Ok(RenderedPrompt {
                text,
                content,
                exact: true,
            });
        }
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "the chat template changes the text it is given; control-token text in it is escaped instead of followed"
            );
        }
        Ok(RenderedPrompt {
            text: self.render_as(messages, tools, gen_prompt, controls, Mode::Escaped)?,
            content: Vec::new(),
            exact: false,
        })
    }

    fn render_as(
        &self,
        messages: &[PromptMessage],
        tools: &[ToolDefinition],
        add_generation_prompt: bool,
        controls: &[String],
        mode: Mode,
    ) -> Result<String, OrtError> {
        let messages: Vec<_> = messages
            .iter()
            .map(|m| TemplateMessage {
                role: m.role.as_str(),
                content: given(&m.content, controls, mode),
            })
            .collect();
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from(Serde(&messages)));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        if self.takes_tools && !tools.is_empty() {
            let tools: Vec<_> = tools
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "type": "function",
                        "function": {
                            "name": given(&t.name, controls, mode),
                            "description": given(&t.description, controls, mode),
                            "parameters": given_json(&t.input_schema, controls, mode),
                        }
                    })
                })
                .collect();
            ctx.insert("tools", Value::from(Serde(&tools)));
        }
        self.env
            .get_template(NAME)
            .and_then(|t| t.render(ctx))
            .map_err(template_error)
    }

    /// Whether the loop must list tools in the prompt text: true unless the
    /// template mentions `tools` (then tools go through the template).
    pub fn tools_inline(&self) -> bool {
        !self.takes_tools
    }

    /// Hermes (`<tool_call>`) when the template mentions `<tool_call>`, else JSON.
    pub fn call_format(&self) -> CallFormat {
        self.call_format
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text passed as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// Every string of a JSON value, object keys included.
fn json_strings(value: &serde_json::Value) -> Box<dyn Iterator<Item = &str> + '_> {
    use serde_json::Value as J;
    match value {
        J::String(s) => Box::new(std::iter::once(s.as_str())),
        J::Array(items) => Box::new(items.iter().flat_map(json_strings)),
        J::Object(map) => Box::new(
            map.iter()
                .flat_map(|(k, v)| std::iter::once(k.as_str()).chain(json_strings(v))),
        ),
        _ => Box::new(std::iter::empty()),
    }
}

fn template_error(e: Error) -> OrtError {
    // minijinja's Display leaves out the cause chain, which often says what
    // actually failed (an unknown filter, a failed `raise_exception`).
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    OrtError::Template(msg)
}

/// Templates call `raise_exception("...")` to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Python's `json.dumps` as Hugging Face's `tojson` calls it: no HTML
/// escaping (minijinja's own filter escapes `<`, which would change prompts),
/// `", "`/`": "` separators, or `indent` for pretty output.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    // Jinja2 accepts these; ordering and ASCII escaping are left as they are.
    let _: Option<Value> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)
        }
        None => {
            let mut ser =
                serde_json::Serializer::with_formatter(&mut out, wma_agent::SpacedFormatter);
            value.serialize(&mut ser)
        }
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(text))
}

/// `strftime_now(format)`, as Llama 3 templates use it for "Today Date".
/// Supports the directives those templates use; the date is UTC.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (unix_secs / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    let rem = unix_secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{m:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 12:34:56 UTC
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S", 1_721_997_296),
            "26 Jul 2024 12:34:56"
        );
        assert_eq!(strftime("%B %d", 0), "January 01");
    }
}
