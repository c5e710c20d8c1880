//! Chat templates rendered from small in-memory templates: ChatML, templates
//! that take tools, Hermes detection, and the Jinja2 habits of Hugging Face
//! templates.

use serde_json::json;
use wma_agent::{CallFormat, PromptMessage, PromptRole, ToolDefinition};
use wma_provider_ort::{CHATML_TEMPLATE, ChatTemplate, OrtError};

/// SmolLM2-135M-Instruct's template: ChatML with a default system prompt.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A Qwen2.5-style template, cut down: tools in the system turn, calls in
/// `<tool_call>` tags.
const HERMES: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] }}
{%- endif %}
{{- "\n\n# Tools\n\n<tools>" }}
{%- for tool in tools %}
{{- "\n" }}
{{- tool | tojson }}
{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
{%- if not (message.role == 'system' and tools) %}
{{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

fn msgs(turns: &[(PromptRole, &str)]) -> Vec<PromptMessage> {
    turns
        .iter()
        .map(|(r, c)| PromptMessage::new(*r, *c))
        .collect()
}

fn cart_tool() -> ToolDefinition {
    ToolDefinition::new(
        "add_to_cart",
        "Add a product <by id> to the cart.",
        json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
    )
}

#[test]
fn chatml_renders_every_turn_and_the_generation_prompt() {
    let t = ChatTemplate::new(
        SMOLLM2,
        Some("<|im_start|>".into()),
        Some("<|im_end|>".into()),
    )
    .unwrap();
    let out = t
        .render(
            &msgs(&[(PromptRole::System, "Be brief."), (PromptRole::User, "Hi")]),
            &[],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without a system turn the template adds its own.
    let out = t
        .render(&msgs(&[(PromptRole::User, "Hi")]), &[], false)
        .unwrap();
    assert!(out.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
    assert!(out.ends_with("<|im_start|>user\nHi<|im_end|>\n"));
    assert!(
        t.tools_inline(),
        "no `tools` in the template: the loop lists them"
    );
    assert_eq!(t.call_format(), CallFormat::Json);
}

#[test]
fn tool_and_assistant_turns_keep_their_roles() {
    let t = ChatTemplate::new(CHATML_TEMPLATE, None, None).unwrap();
    let out = t
        .render(
            &msgs(&[
                (
                    PromptRole::Assistant,
                    r#"{"name": "view_cart", "arguments": {}}"#,
                ),
                (PromptRole::Tool, "[]"),
            ]),
            &[],
            true,
        )
        .unwrap();
    assert!(out.contains("<|im_start|>assistant\n{\"name\": \"view_cart\""));
    assert!(out.contains("<|im_start|>tool\n[]<|im_end|>"));
}

#[test]
fn a_template_that_takes_tools_gets_them_and_hermes_is_detected() {
    let t = ChatTemplate::new(HERMES, None, Some("<|im_end|>".into())).unwrap();
    assert!(!t.tools_inline());
    assert_eq!(t.call_format(), CallFormat::Hermes);
    let out = t
        .render(
            &msgs(&[
                (PromptRole::System, "You are a shop assistant."),
                (PromptRole::User, "  add p-1  "),
            ]),
            &[cart_tool()],
            true,
        )
        .unwrap();
    // Tools in Hugging Face's shape, written as Python's json.dumps writes
    // them: ", " and ": " separators, and `<` not escaped.
    assert!(
        out.contains(r#"{"type": "function", "function": {"name": "add_to_cart", "description": "Add a product <by id> to the cart.", "parameters": {"#),
        "{out}"
    );
    assert!(out.starts_with("<|im_start|>system\nYou are a shop assistant.\n\n# Tools"));
    // Python's `.strip()` works through the pycompat methods.
    assert!(out.contains("<|im_start|>user\nadd p-1<|im_end|>"));
    assert!(!out.contains("<|im_start|>system\nYou are a shop assistant.<|im_end|>"));

    // With no tools the template takes its other branch.
    let out = t
        .render(&msgs(&[(PromptRole::User, "hi")]), &[], true)
        .unwrap();
    assert!(!out.contains("<tools>"));
}

#[test]
fn tojson_takes_an_indent() {
    let t = ChatTemplate::new(
        "{{ tools[0].function.parameters | tojson(indent=2) }}",
        None,
        None,
    )
    .unwrap();
    let out = t.render(&[], &[cart_tool()], false).unwrap();
    assert!(out.starts_with("{\n  \"type\": \"object\""), "{out}");
}

#[test]
fn raise_exception_and_syntax_errors_are_template_errors() {
    let t = ChatTemplate::new(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with the user') }}{% endif %}",
        None,
        None,
    )
    .unwrap();
    let err = t
        .render(&msgs(&[(PromptRole::Assistant, "x")]), &[], true)
        .unwrap_err();
    assert!(
        matches!(&err, OrtError::Template(m) if m.contains("must start with the user")),
        "{err}"
    );
    assert!(matches!(
        ChatTemplate::new("{% for %}", None, None),
        Err(OrtError::Template(_))
    ));
}

#[test]
fn bos_and_eos_tokens_reach_the_template_and_blocks_are_trimmed() {
    let t = ChatTemplate::new(
        "{{ bos_token }}\n{% for m in messages %}\n  {% if loop.last %}{{ m.content }}{{ eos_token }}{% endif %}\n{% endfor %}",
        Some("<s>".into()),
        Some("</s>".into()),
    )
    .unwrap();
    let out = t
        .render(
            &msgs(&[(PromptRole::User, "a"), (PromptRole::User, "b")]),
            &[],
            false,
        )
        .unwrap();
    assert_eq!(out, "<s>\nb</s>");
}
