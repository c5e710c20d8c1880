//! Chat templates: the model's own Jinja template, rendered with minijinja the
//! way Hugging Face's `apply_chat_template` renders it.

use std::collections::BTreeMap;
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

/// A tool in the shape Hugging Face templates expect.
#[derive(Serialize)]
struct TemplateTool<'a> {
    r#type: &'static str,
    function: TemplateFunction<'a>,
}

#[derive(Serialize)]
struct TemplateFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: &'a str,
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
    /// them ([`ChatTemplate::tools_inline`] is false).
    pub fn render(
        &self,
        messages: &[PromptMessage],
        tools: &[ToolDefinition],
        add_generation_prompt: bool,
    ) -> Result<String, OrtError> {
        let messages: Vec<_> = messages
            .iter()
            .map(|m| TemplateMessage {
                role: m.role.as_str(),
                content: &m.content,
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
                .map(|t| TemplateTool {
                    r#type: "function",
                    function: TemplateFunction {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.input_schema,
                    },
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
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PySpaced);
            value.serialize(&mut ser)
        }
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(text))
}

/// `json.dumps`' default separators: `", "` and `": "`.
struct PySpaced;

impl serde_json::ser::Formatter for PySpaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
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
