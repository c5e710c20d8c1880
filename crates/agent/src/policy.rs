//! The loop's policy: what it does beyond the reference's steps.
//!
//! `run_local_agent` runs the eleven steps of the reference loop and asks a
//! [`Policy`] at fixed points: which tools to offer in what order, how to
//! shape a constrained attempt, whether a prose reply earns a retry, and
//! whether the calls just made end the run. [`Policy::reference`] answers
//! every question the way the reference does (it makes no move of its own,
//! with constraints on or off); [`Policy::small_model`] is a set of named
//! rules, each a switch documented with its default and the measurement that
//! chose it, that help a tiny model through the same steps.
//!
//! A rule that fires is reported three ways: a `rule` span event on the step
//! (`wma.rule`, `wma.detail`), an [`AgentStreamPart::Rule`](crate::AgentStreamPart::Rule)
//! in the run's stream, and so a count in whatever ledger the host keeps
//! (`wma eval` prints one per task and category).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ToolError, ToolErrorCode};
use crate::ground::{
    Identifiers, digit_runs, example_shapes, fill_required_lists, ground_string_values,
    ground_tool, ground_when_values, is_free_string, lists_a_written_value, requires_a_number,
    short_of_numbers, short_of_strings, takes_free_text, takes_identifier, waits_for_a_number,
    without_leading_zeros,
};
use crate::lexicon::{ASKING, AUXILIARY, POLITE, TELLING, is_change_verb};
use crate::parse::ParsedCall;
use crate::provider::{Decoding, PromptMessage, PromptRole};
use crate::rank::score_tools;
use crate::tool::ToolDefinition;
use crate::validate::{ArgsError, ValidatorCache};

/// The detail of the event a rule reports when it stood down for a request
/// in another language (it decides on English words): the rule did not
/// act, and a ledger counts it apart from the rules that did.
pub const STOOD_DOWN: &str = "stood down: it reads English words and the request is not English";

/// The named policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// The reference loop exactly.
    Reference,
    /// The reference loop with the small-model rules.
    SmallModel,
}

impl MeasuredModel {
    /// The measured model a provider's model name is, if any.
    pub(crate) fn find(model: &str) -> Option<&'static MeasuredModel> {
        let model = model.to_lowercase();
        MEASURED_MODELS
            .iter()
            .find(|m| model.contains(&m.name.to_lowercase()))
    }
}

impl PolicyName {
    /// The name as configs and `wma eval` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::SmallModel => "small-model",
        }
    }

    /// Reads a name as configs and `wma eval` write it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "reference" => Some(Self::Reference),
            "small-model" => Some(Self::SmallModel),
            _ => None,
        }
    }
}

/// A model whose default policy was chosen by measurement: both policies
/// run on the task suite's `dev` half (`wma eval tasks --half dev`, greedy)
/// and the one that solved more kept (docs/loop.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MeasuredModel {
    /// The model's name as its folder, hub repository or served model
    /// names it (`SmolLM2-135M-Instruct`); matched ignoring case, anywhere
    /// in a provider's model name, so `HuggingFaceTB/SmolLM2-135M-Instruct`
    /// and `SmolLM2-135M-Instruct.Q4_1.gguf` are the same model.
    pub name: &'static str,
    /// The policy it gets when an agent names none.
    pub policy: PolicyName,
    /// The measurement behind the choice.
    pub measured: &'static str,
}

/// The models measured under both policies. Any other model gets the
/// reference loop (with constrained decoding, [`ConstraintMode::Auto`]):
/// the rules were fitted to small models' habits, and a model nobody
/// measured must not do worse because of one. An agent's `policy` key
/// overrides either.
///
/// [`ConstraintMode::Auto`]: crate::ConstraintMode::Auto
pub(crate) const MEASURED_MODELS: [MeasuredModel; 2] = [
    MeasuredModel {
        name: "SmolLM2-135M-Instruct",
        policy: PolicyName::SmallModel,
        measured: "dev half: small-model 10/51, reference 5/51",
    },
    MeasuredModel {
        name: "Qwen2.5-Coder-0.5B-Instruct",
        policy: PolicyName::SmallModel,
        measured: "dev half: small-model 23/51, reference 15/51",
    },
];

/// What the loop does beyond the reference: one switch per rule. Build it
/// from [`Policy::reference`] or [`Policy::small_model`] and change fields;
/// every field is also a key of an agent's `[agents.NAME.rules]` table.
///
/// The rules that narrow what a constrained attempt may call (grounding,
/// `move_on`, `offer_appeared`, `offer_id_takers`, `skip_used_ids`,
/// `read_only_questions`) apply only to attempts that carry a constraint:
/// without one there is nothing to narrow. The order rule and the retries
/// apply with or without.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The policy this one started from, for traces and tables.
    pub base: PolicyName,
    /// Identifier arguments (`id`, `product_id`, `orderId`, …) may only take
    /// values the conversation has shown; a tool whose required identifier
    /// has none cannot be called yet. Small-model default: on (the shop went
    /// from invented ids on every run to none).
    pub ground_identifiers: bool,
    /// Numbers the person wrote go to number arguments: with none written an
    /// optional count is left to the tool's default, and numbers beyond the
    /// required ones make optional counts required; a tool that requires a
    /// number waits while the conversation (the person's words or a result)
    /// shows none and another tool is shown. Default: on ("add two of p-21"
    /// adds 2, was 1; asked for the weather, the default model called
    /// `get-sum {"a": 10, "b": 20}`).
    pub ground_numbers: bool,
    /// A date or time argument of a constrained call (a string whose
    /// `format` is `date`, `time` or `date-time`, or whose description
    /// spells `YYYY-MM-DD` / `HH:MM`) may only take a date or time of its
    /// kind that the conversation shows; an optional one with none shown is
    /// left to the tool's default. Asked to add a to-do with no date, the
    /// default model gave it `"due": "2023-01-01T00:00:00Z"`, and asked for
    /// a haircut "at 09:00" it wrote the date as the start time. Default:
    /// on.
    pub ground_dates: bool,
    /// A required array argument of a constrained call (at any depth of
    /// objects and array items, with no `minItems` of its own) holds at
    /// least one item. An empty list satisfies such a schema but asks the
    /// tool to do nothing: Qwen2.5-Coder, asked to remember a fact, wrote
    /// `create_entities {"entities": []}`, and `request_planning` with
    /// `"tasks": []` for a plan. Default: on.
    pub filled_lists: bool,
    /// Free string arguments of a constrained call (a string, at any depth,
    /// that is not an identifier, a date or a time and lists no values,
    /// pattern or format of its own) are biased toward what the run has
    /// seen, never held to it: the copy bias (`copy_bias`) favours the
    /// person's phrases, what they quoted or wrote after a colon, the values
    /// and lines of successful results, and what the agent's instructions
    /// state (paths, names). A value that needs the model's own knowledge
    /// (`Asia/Tokyo` for "Tokyo", a query, a sentence to write) stays
    /// writable. A tool that requires a free string for which the run has
    /// seen no fitting phrase is *short* of it: the named-tool retry does
    /// not count it as named, and a step that offers only such tools has no
    /// call threshold ("What is a holy book?" beside `search_holy_books`).
    /// Default: on.
    pub ground_strings: bool,
    /// A lookup that just answered (whether it found anything or not), or
    /// an action that just succeeded, is not offered on the next step: the
    /// model uses what it found or moves on instead of repeating itself.
    /// Default: on.
    pub move_on: bool,
    /// Right after the last call made tools appear (a page navigated), the
    /// step offers those alone, first. Default: on (the WebMCP shop went from
    /// 0 of 3 to 10 of 10).
    pub offer_appeared: bool,
    /// Right after a lookup found ids, the step offers the tools that take
    /// an id, first (when one can be called). Default: on.
    pub offer_id_takers: bool,
    /// Among the tools a constrained step may call, one that the request
    /// names (two words of its name or more, and all of them or all but
    /// one) and that was not called yet in the run is offered alone ("Can
    /// you renew my loan of …?" after the search: `renew_loan`, not
    /// `return_book`, listed beside it). Default: on.
    pub offer_named_tool: bool,
    /// A tool is not offered an id it was already called with in this run.
    /// Default: on.
    pub skip_used_ids: bool,
    /// The tools that can be called now are listed first (a tiny model calls
    /// the first tool listed, and the worked example shows it); on the first
    /// step, when the request has phrases to copy, tools that require a
    /// number come first among them when the person wrote one, then tools
    /// that take free text. Default: on.
    pub order_for_calls: bool,
    /// A constrained reply calls a tool that takes an id at most once (a
    /// tiny model given a list of ids calls the tool with each in turn).
    /// Default: on.
    pub one_id_per_reply: bool,
    /// A constrained reply calls a tool annotated as changing things at most
    /// once, when the tool set annotates tools as read-only (a delegation
    /// to a sub-agent counts as a change). The default model renamed
    /// draft.txt to plan-final.txt and, in the same reply, back again; the
    /// next change waits for the result of the first. Tool sets that
    /// annotate nothing (BFCL's parallel calls) are not affected.
    /// Default: on.
    pub one_change_per_reply: bool,
    /// A request that asks for information (no verb that asks for a change)
    /// is offered only the tools annotated read-only, when the tool set
    /// annotates any: a question is never answered with a write. Default: on.
    pub read_only_questions: bool,
    /// Once the conversation has shown identifiers, a delegation to a
    /// sub-agent must name one of them in its task: the sub-agent sees only
    /// its task, and a parent that found a product and then asks the cart
    /// agent to "add it to the cart" hands it nothing to act on. Default: on.
    pub ground_delegation: bool,
    /// A delegation's free-text task is chosen from the person's words:
    /// the whole request when it has one part, else its next sentence or
    /// clause (split at "and", "then", commas and semicolons) in the order
    /// the request names them; once a sub-agent answered, each followed by
    /// the newest answer (an `enum` on the task; it replaces the id
    /// `pattern` of `ground_delegation`, since the answer carries the ids).
    /// The part goes to the one helper whose name and description share the
    /// most of its words, when one does; once every part was handed on, no
    /// delegation is offered. The sub-agent sees only its task, and the
    /// default model wrote tasks such as "read_to_do_list_task_1", handed
    /// on "add its action item to my to-do list" without the item, and gave
    /// "write what's on it into agenda.txt" to the to-do helper.
    /// Default: on.
    pub ground_tasks: bool,
    /// A delegated run (its task handed over by a parent agent) starts with a
    /// call: its first attempt allows calls only, when a tool can be
    /// called. The parent delegated because this agent's tools do the task;
    /// a tiny sub-agent otherwise chats about the task ("A waterproof
    /// backpack is a great idea.") and hands back nothing. Default: on:
    /// alone on the task suite's `dev` half it changed no task, but
    /// `configs/shop-team.toml`'s catalog helper answers exactly that
    /// without it, and the backpack never reaches the cart (docs/loop.md).
    pub delegated_calls_first: bool,
    /// A run whose every offered tool is a sub-agent (a coordinator with no
    /// tools of its own) starts with a delegation when the request seeks
    /// information or asks for a change: its first attempt allows calls
    /// only. Such an agent can learn or change nothing itself, so a prose
    /// first reply only invents: the default model, asked to "tell me
    /// what's still open on my to-do list" beside `todo_agent`, wrote "I'm
    /// glad you asked…" for 160 tokens. A turn that seeks nothing
    /// ("Thanks!") is answered in words. Default: off: measured alone on
    /// the task suite's `dev` half it gained the default model one task
    /// and cost Qwen2.5-Coder-0.5B that same task (docs/loop.md).
    pub coordinator_calls_first: bool,
    /// The calls-only retry of a prose reply on the first step, when the
    /// request names a shown tool (two of its name's words, or one and an id
    /// for a tool that takes one) and the model gave a call at least this
    /// probability at its first token. `None` turns it off. Default 0: the
    /// request naming the tool is the evidence. A gate of 0.1% (the median
    /// a call got in prose replies to BFCL requests a tool fits) kept the
    /// default model answering math questions itself: on the first 25
    /// simple_python records it made 20% right calls, with no gate 44%,
    /// while irrelevance stayed at 96% (its tools are not named).
    pub named_tool_retry: Option<f32>,
    /// A call that a calls-only retry forced (`named_tool_retry`,
    /// `change_request_retry`, `question_lookup_retry`) is dropped, and the
    /// prose reply it replaced stands, when its values look made up (see
    /// `made_up_value`): one string for two different arguments (`season`
    /// and `league` both "LeBron James"), a list that repeats a number
    /// nobody wrote that often, or a string that is only its argument's
    /// name (`case_year: "year"`). The request did not give the tool what
    /// it needs. Default: on. On BFCL irrelevance (240 records) it dropped
    /// five such calls.
    pub grounded_retry_values: bool,
    /// The reference's "you do it. Call now" correction runs only when the
    /// model gave a call at least this probability (when the provider
    /// reports one). `None` is the reference: no gate. Default 0.05%: on
    /// BFCL irrelevance, replies that set the correction off wrongly gave a
    /// call 0.01%.
    pub call_now_min_probability: Option<f32>,
    /// Once an action succeeded, a lookup repeated word for word (same
    /// answer) ends the run with the gist of what was done. Default: on,
    /// with [`Policy::stop_changing_when_done`]: alone on the task suite's
    /// `dev` half it changed no task, but without the two the demo run
    /// ends going in circles instead of done (docs/loop.md).
    pub done_on_repeated_lookup: bool,
    /// The longest free string of a constrained call; `None` leaves
    /// strings as the schema bounds them. Default: `None`. A cap forbids
    /// values a tool may need (a long query, a note's text); a tiny model
    /// that never closes a string is finished at the token limit by
    /// `finish_cut_calls` instead. Measured alone, a cap of 100 changed
    /// no task of the suite for either model and no BFCL figure.
    pub max_string_chars: Option<u32>,
    /// The most items of an array argument where the schema sets no bound.
    /// Default 16.
    pub max_array_items: Option<u32>,
    /// The most calls one constrained reply may hold. Default 4.
    pub max_calls: Option<u32>,
    /// Every call of one constrained reply names the same tool. Default:
    /// off. Measured alone it raised the default model's `dev` half (13 ->
    /// 10 of 51 without it) and none of the 9 `test` tasks where it changed
    /// the calls, nor any task of Qwen2.5-Coder's: fitted, not general
    /// (docs/loop.md).
    pub one_tool_per_reply: bool,
    /// Where prose and a call are both allowed, call once the model gives a
    /// call at least this probability at the first token. Default 0.5%.
    pub call_threshold: Option<f32>,
    /// Measure `call_threshold` against the call probability the model
    /// gives the same prompt with the person's turn emptied (see
    /// [`Decoding::call_baseline`]): a call is pushed only where the
    /// request itself makes one more likely. Default: on.
    pub call_baseline: bool,
    /// On a run's first step, the call threshold applies only where a
    /// calls-only retry would follow a prose reply anyway: the request
    /// names a shown tool (`named_tool_retry`), asks for a change a tool
    /// makes (`change_request_retry`) or seeks what a read-only tool looks
    /// up (`question_lookup_retry`). The named tool counts only when
    /// `named_tool_retry` is at most `call_threshold`, as the retry itself
    /// would not follow a call given less. For a host where no call beats
    /// a wrong one. Default: off. On BFCL irrelevance (240 records) it stopped the
    /// three calls the threshold still forced, all to tools that do
    /// something else (the model gave each call 0.7–0.8%): 235 -> 238
    /// right. But the first 100 records of simple_python, multiple and
    /// parallel lost 7 right calls (76 -> 69), where the request describes
    /// the tool in other words than its name ("the distance between New
    /// York City and Los Angeles" for `geodistance.find`).
    pub threshold_on_evidence: bool,
    /// Logit bonus for copying the person's phrases into string and number
    /// arguments. Default 3.0; 0 is off.
    pub copy_bias: f32,
    /// A call, once begun, is written greedily even when sampling. Default: on.
    pub greedy_calls: bool,
    /// A constrained call that the token limit cuts is finished in up to
    /// this many more tokens, closing its strings, arrays and objects as
    /// soon as the grammar allows. Default 64: the default model fills
    /// free-form objects and arrays with repeats until the limit (BFCL
    /// simple_javascript, first 25 records: 78% of its calls parsed and
    /// validated); `None` is the reference: a cut call is malformed and
    /// goes to the repair.
    pub finish_cut_calls: Option<u32>,
    /// A free string value of a constrained call may not begin with a name
    /// the prompt shows: a tool's name of two or more words (`write_file`)
    /// or an argument's placeholder of the worked example (`<query`), unless
    /// the person wrote it. A tiny model fills values with the nearest
    /// words of its prompt (`read_text_file {"path": "write_file.txt"}`,
    /// `{"query": "<query_1_2>"}`). Default: on.
    pub no_prompt_names_in_values: bool,
    /// A call is held to the step's offer however the model wrote it: one
    /// written inside prose, which no constraint shapes, that calls a tool
    /// the offer withheld or gives an argument the offer does not allow (an
    /// id nobody has shown) goes back as a repair, with what to do instead.
    /// Without it every narrowing rule above has a way around it: a model
    /// that writes its call in a Markdown fence (Qwen2.5-Coder does, as
    /// `<tool_call><name>…`) returned a book by the example id of the
    /// instructions before searching for it. Default: on.
    pub calls_within_offer: bool,
    /// The calls-only retry of a prose reply when the request asks for a
    /// change (a common verb of change, or the verb a shown tool that
    /// changes things starts its name with), a shown tool is annotated as
    /// changing things, and none has succeeded in the run yet: words cannot
    /// add, move or delete anything, so a prose reply to such a request only
    /// claims what it did not do. After the first step it needs a tool that
    /// changes things among those offered (a lookup again makes no
    /// headway). Tool sets that annotate nothing (BFCL's) are never retried
    /// by it. Default: on.
    pub change_request_retry: bool,
    /// The calls-only retry of a prose reply on the first step when the
    /// request seeks information (a question, or "tell me", "show", "list",
    /// "check"…) and asks for no change, the tool set annotates tools as
    /// read-only, and one is offered. Whatever the person asks of an agent
    /// that can look it up lives in its tools, not in a tiny model's
    /// weights: asked "What's on my calendar on 2026-03-12?" beside
    /// `list_events`, the default model invented a list of dates. Tool sets
    /// that annotate nothing (BFCL's) are never retried by it, nor is a
    /// turn that seeks nothing ("Thanks, that's all."). Default: on.
    pub question_lookup_retry: bool,
    /// The calls-only retry of a prose reply that is a call in the wrong
    /// form: a tool offered on the step written as code (`` `calculate` ``,
    /// `calculate(`, `"name": "calculate"`, or its name inside a fenced
    /// block), or a reply of markup alone (an opened fence, a tag: the
    /// call the model began could not be written as prose). The evidence
    /// is the model's own reply, in any language: it chose the tool and
    /// only missed the form. Qwen2.5-Coder opens calls with a Markdown
    /// fence, which the "text or calls" grammar reads as prose: asked
    /// "What's the square root of 1764?" it answered "you can use the
    /// `calculate` function … `sqrt(1764)`", and for an average it wrote
    /// "```json" and stopped. Default: on.
    pub described_call_retry: bool,
    /// Once a lookup answered a request for information (its result holds
    /// a word of the request), the next step offers no tool: the model
    /// answers from what it found. An answer that then shares no word with
    /// the run's results is the model's own invention and becomes the gist
    /// of the result that answered. A tiny model that has called a tool
    /// calls again and again (the default model echoed "blue harbor" and
    /// then asked for the weather and a sum), and its own answers drift
    /// from the result in front of it. Default: on.
    pub answer_after_lookup: bool,
    /// Once every change the request names has been made (each of its words
    /// that begins the name of a tool that changes things is the verb of a
    /// tool that succeeded in the run, a common verb of change that names
    /// no tool is made by any change that succeeded, and each identifier
    /// the person wrote was acted on), the next steps offer
    /// no tool that changes things: what is left is to
    /// look or to answer. Asked to "Cancel the budget review on
    /// 2026-03-10", the default model cancelled it and then added it again.
    /// Default: on, as a guard against changes nobody asked for: alone on
    /// the task suite's `dev` half it changed no task, but without it (and
    /// `done_on_repeated_lookup`) the default model, having added what it
    /// was asked to, went on to tick off other to-dos and to add a second
    /// backpack to the demo cart (docs/loop.md).
    pub stop_changing_when_done: bool,
    /// An answer that still passes over the last failed call after the
    /// reference's "Don't say it worked" correction keeps its words, gets
    /// the failure said after it, and the run ends `unrepaired`: a call
    /// that failed is never silently dropped from what the person (or a
    /// parent agent) is told. The reference shows the second reply as it
    /// is; asked what 16:30 in London is in New York, Qwen's call with
    /// "London" as a time zone failed, and its answer "Call the
    /// `convert_time` function with the given arguments." ended `stop`.
    /// Whether a reply admits a failure is read from the lexicon's English
    /// words or the error's own words. Default: on.
    pub say_ignored_failure: bool,
    /// A call is pushed only toward tools that relate to the request (see
    /// `PolicyState::related`: a term of the request in a tool's name, two
    /// in its description and arguments, or one in the agent's
    /// instructions). Where no tool offered relates, the call threshold is
    /// held back, the repair of a bad call may answer in text instead of
    /// being held to calls, and a reply of the loop's own words is not
    /// retried as calls only (`echo_retry`): a model that began a call to
    /// a tool that does something else is not made to finish one, nor one
    /// that echoed the prompt made to start one. Default: on.
    pub push_toward_related: bool,
    /// A prose reply that says nothing but the loop's own words (it only
    /// repeats the prompt's sentences, as `no_prompt_echo_answers` reads
    /// it), on a step that offers a tool under a constraint, is retried
    /// as calls only, once per step, before any other correction: it is
    /// no answer, and ending on it tells the person nothing. After
    /// `read_text_file {"path": "config.yaml"}` failed, Qwen2.5-Coder
    /// replied "The next step for it is to call it now.", then, corrected,
    /// "Call the tool again with fixed arguments, or tell me what went
    /// wrong.", and the run ended with no answer. It reads only the reply
    /// against the loop's own words: it holds for any tool set. Where no
    /// tool offered relates to the request (as `push_toward_related` reads
    /// it, when that is on) the echo is not retried: a forced call there
    /// is a call to a tool that does something else. Default: on.
    pub echo_retry: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self::small_model()
    }
}

impl Policy {
    /// The reference loop: no rule of its own.
    pub fn reference() -> Self {
        Self {
            base: PolicyName::Reference,
            ground_identifiers: false,
            ground_numbers: false,
            ground_dates: false,
            filled_lists: false,
            ground_strings: false,
            move_on: false,
            offer_appeared: false,
            offer_id_takers: false,
            offer_named_tool: false,
            skip_used_ids: false,
            order_for_calls: false,
            one_id_per_reply: false,
            one_change_per_reply: false,
            read_only_questions: false,
            ground_delegation: false,
            ground_tasks: false,
            delegated_calls_first: false,
            coordinator_calls_first: false,
            named_tool_retry: None,
            grounded_retry_values: false,
            call_now_min_probability: None,
            done_on_repeated_lookup: false,
            max_string_chars: None,
            max_array_items: None,
            max_calls: None,
            one_tool_per_reply: false,
            call_threshold: None,
            call_baseline: false,
            threshold_on_evidence: false,
            copy_bias: 0.0,
            greedy_calls: false,
            finish_cut_calls: None,
            no_prompt_names_in_values: false,
            calls_within_offer: false,
            change_request_retry: false,
            question_lookup_retry: false,
            described_call_retry: false,
            answer_after_lookup: false,
            stop_changing_when_done: false,
            say_ignored_failure: false,
            push_toward_related: false,
            echo_retry: false,
        }
    }

    /// Every small-model rule at its default.
    pub fn small_model() -> Self {
        Self {
            base: PolicyName::SmallModel,
            ground_identifiers: true,
            ground_numbers: true,
            ground_dates: true,
            filled_lists: true,
            ground_strings: true,
            move_on: true,
            offer_appeared: true,
            offer_id_takers: true,
            offer_named_tool: true,
            skip_used_ids: true,
            order_for_calls: true,
            one_id_per_reply: true,
            one_change_per_reply: true,
            read_only_questions: true,
            ground_delegation: true,
            ground_tasks: true,
            delegated_calls_first: true,
            coordinator_calls_first: false,
            named_tool_retry: Some(0.0),
            grounded_retry_values: true,
            call_now_min_probability: Some(0.0005),
            done_on_repeated_lookup: true,
            max_string_chars: None,
            max_array_items: Some(16),
            max_calls: Some(4),
            one_tool_per_reply: false,
            call_threshold: Some(0.005),
            call_baseline: true,
            threshold_on_evidence: false,
            copy_bias: 3.0,
            greedy_calls: true,
            finish_cut_calls: Some(64),
            no_prompt_names_in_values: true,
            calls_within_offer: true,
            change_request_retry: true,
            question_lookup_retry: true,
            described_call_retry: true,
            answer_after_lookup: true,
            stop_changing_when_done: true,
            say_ignored_failure: true,
            push_toward_related: true,
            echo_retry: true,
        }
    }

    /// The named policy at its defaults.
    pub fn named(name: PolicyName) -> Self {
        match name {
            PolicyName::Reference => Self::reference(),
            PolicyName::SmallModel => Self::small_model(),
        }
    }

    /// The default for the model a provider names
    /// ([`ProviderInfo::model`](crate::ProviderInfo::model)): the measured
    /// policy of a model of the measured table (`MEASURED_MODELS`), else the reference.
    pub fn for_model(model: &str) -> Self {
        Self::named(MeasuredModel::find(model).map_or(PolicyName::Reference, |m| m.policy))
    }

    /// This policy with some rules set from a map of rule name to value
    /// (as a config's `[agents.NAME.rules]` table or `wma eval --rule`
    /// gives them): `{"copy_bias": 0, "named_tool_retry": null}`. An unknown
    /// rule or a value of the wrong type is an error that names it.
    pub fn with_rules(&self, rules: &Value) -> Result<Policy, serde_json::Error> {
        let Value::Object(rules) = rules else {
            return Err(serde::de::Error::custom(
                "rules are a table of rule = value",
            ));
        };
        // Serializing a struct of plain fields cannot fail.
        let mut merged = serde_json::to_value(self).unwrap_or_default();
        if let Value::Object(map) = &mut merged {
            for (k, v) in rules {
                if !map.contains_key(k) || k == "base" {
                    return Err(serde::de::Error::custom(format!(
                        "unknown rule `{k}`, expected one of {}",
                        map.keys()
                            .filter(|n| *n != "base")
                            .map(|n| format!("`{n}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                map.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(merged)
    }

    /// This policy for a request that is (`english`) or is not English
    /// ([`crate::lexicon::speaks_english`]): the rules that decide on the
    /// words of [`crate::lexicon`] stand down for a request in another
    /// language, where they would match nothing and take every request for
    /// a question or for none. Each rule that stood down is reported.
    pub(crate) fn for_language(&self, english: bool) -> (Policy, Vec<Fired>) {
        let mut policy = self.clone();
        let mut fired = Vec::new();
        if english {
            return (policy, fired);
        }
        let mut stand_down = |on: bool, rule: Rule| {
            if on {
                fired.push(Fired {
                    rule,
                    detail: STOOD_DOWN.to_string(),
                });
            }
        };
        stand_down(policy.read_only_questions, Rule::ReadOnlyQuestions);
        stand_down(policy.change_request_retry, Rule::ChangeRequestRetry);
        stand_down(policy.question_lookup_retry, Rule::QuestionLookupRetry);
        stand_down(policy.answer_after_lookup, Rule::AnswerAfterLookup);
        stand_down(policy.stop_changing_when_done, Rule::StopChangingWhenDone);
        stand_down(policy.coordinator_calls_first, Rule::CoordinatorCallsFirst);
        stand_down(policy.ground_tasks, Rule::GroundTasks);
        stand_down(policy.say_ignored_failure, Rule::SayIgnoredFailure);
        policy.read_only_questions = false;
        policy.change_request_retry = false;
        policy.question_lookup_retry = false;
        policy.answer_after_lookup = false;
        policy.stop_changing_when_done = false;
        policy.coordinator_calls_first = false;
        policy.ground_tasks = false;
        policy.say_ignored_failure = false;
        (policy, fired)
    }

    /// Whether any rule narrows what a constrained attempt may call.
    pub(crate) fn narrows(&self) -> bool {
        self.ground_identifiers
            || self.ground_numbers
            || self.ground_dates
            || self.filled_lists
            || self.ground_strings
            || self.move_on
            || self.offer_appeared
            || self.offer_id_takers
            || self.offer_named_tool
            || self.skip_used_ids
            || self.read_only_questions
            || self.ground_delegation
            || self.ground_tasks
            || self.answer_after_lookup
            || self.stop_changing_when_done
    }

    /// The shape of a constrained reply for the tools shown.
    pub(crate) fn decoding(&self, shown: &[ToolDefinition], written: &str) -> Decoding {
        Decoding {
            // The worked example's placeholders are never values, under
            // every policy: a model that copies the example (`"<query>"`)
            // has not made the call the person needs.
            avoid_in_values: if self.no_prompt_names_in_values {
                prompt_names(shown, written)
            } else {
                placeholders(shown, &written.to_lowercase())
            },
            max_string_chars: self.max_string_chars,
            max_array_items: self.max_array_items,
            max_calls: self.max_calls,
            one_tool_per_reply: self.one_tool_per_reply,
            single_call: {
                let annotated = shown.iter().any(|t| t.annotations.read_only);
                shown
                    .iter()
                    .filter(|t| {
                        (self.one_id_per_reply && takes_identifier(t))
                            || (self.one_change_per_reply && annotated && !t.annotations.read_only)
                    })
                    .map(|t| t.name.clone())
                    .collect()
            },
            call_threshold: self.call_threshold,
            call_baseline: self.call_baseline,
            copy_bias: self.copy_bias,
            // Shapes only steer the copy bias: without one they are not
            // worth reading.
            copy_shapes: if self.copy_bias > 0.0 {
                example_shapes(shown)
            } else {
                Vec::new()
            },
            greedy_calls: self.greedy_calls,
            finish_cut_calls: self.finish_cut_calls,
        }
    }
}

/// The names of the prompt a value may not begin with (see
/// [`Policy::no_prompt_names_in_values`]): the shown tools' names of two or
/// more words, and `<` + each argument name (the worked example's
/// placeholder, without its end so that `<query_1>` is caught too), and the
/// label the loop restates the request under (asked to call now, the
/// default model searched for `"my request"`, and then for `"my_request"`).
/// A name of several words is avoided in each way of writing it
/// ([`spellings`]). A name the person wrote (`written`, any case, any of its
/// spellings) is theirs to use.
fn prompt_names(shown: &[ToolDefinition], written: &str) -> Vec<String> {
    let written = written.to_lowercase();
    let mut buffer = String::new();
    let mut names: Vec<String> = Vec::new();
    let mut avoid_name = |name: &str| {
        let all = spellings(&name_words(name));
        if !all.iter().any(|n| written.contains(&n.to_lowercase())) {
            names.extend(all);
        }
    };
    avoid_name(crate::messages::REQUEST_LABEL);
    for tool in shown {
        let mut words = 0;
        crate::rank::for_each_term(&tool.name, &mut buffer, |_| words += 1);
        if words >= 2 {
            avoid_name(&tool.name);
        }
    }
    names.extend(placeholders(shown, &written));
    names.sort();
    names.dedup();
    names
}

/// The worked example's placeholders (`<` + each argument name, without its
/// end so that `<query_1>` is caught too) that the person did not write
/// (`written`, lowercased).
fn placeholders(shown: &[ToolDefinition], written: &str) -> Vec<String> {
    let mut names: Vec<String> = shown
        .iter()
        .filter_map(|tool| {
            tool.input_schema
                .get("properties")
                .and_then(Value::as_object)
        })
        .flat_map(|props| props.keys().map(|k| format!("<{k}")))
        .filter(|n| !written.contains(&n.to_lowercase()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The words of a name as written, in small letters: split at anything but
/// a letter or digit and where a small letter meets a capital (`writeFile`).
fn name_words(name: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if (!c.is_alphanumeric() || (prev_lower && c.is_uppercase())) && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
        }
        prev_lower = c.is_lowercase();
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// The ways a name of several words is commonly written: joined by `_`, `-`
/// or a space, or in camel case, each with its first letter small or
/// capital (`write_file`, `write file`, `writeFile`, `Write_file`,
/// `WriteFile`…). A tiny model kept from one spelling writes the next.
fn spellings(terms: &[String]) -> Vec<String> {
    if terms.is_empty() {
        return Vec::new();
    }
    let capital = |w: &str| {
        let mut c = w.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    let camel: String = terms
        .iter()
        .enumerate()
        .map(|(i, t)| if i == 0 { t.clone() } else { capital(t) })
        .collect();
    let mut out: Vec<String> = ["_", "-", " "]
        .iter()
        .map(|sep| terms.join(sep))
        .chain([camel])
        .collect();
    let capitals: Vec<String> = out.iter().map(|n| capital(n)).collect();
    out.extend(capitals);
    out
}

/// One rule of the policy, as traces, stream parts and tables name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Rule {
    /// See [`Policy::ground_identifiers`].
    GroundIdentifiers,
    /// See [`Policy::ground_numbers`].
    GroundNumbers,
    /// See [`Policy::ground_dates`].
    GroundDates,
    /// See [`Policy::filled_lists`].
    FilledLists,
    /// See [`Policy::ground_strings`].
    GroundStrings,
    /// See [`Policy::move_on`].
    MoveOn,
    /// See [`Policy::offer_appeared`].
    OfferAppeared,
    /// See [`Policy::offer_id_takers`].
    OfferIdTakers,
    /// See [`Policy::offer_named_tool`].
    OfferNamedTool,
    /// See [`Policy::skip_used_ids`].
    SkipUsedIds,
    /// See [`Policy::order_for_calls`].
    OrderForCalls,
    /// See [`Policy::read_only_questions`].
    ReadOnlyQuestions,
    /// See [`Policy::ground_delegation`].
    GroundDelegation,
    /// See [`Policy::ground_tasks`].
    GroundTasks,
    /// See [`Policy::delegated_calls_first`].
    DelegatedCallsFirst,
    /// See [`Policy::coordinator_calls_first`].
    CoordinatorCallsFirst,
    /// See [`Policy::named_tool_retry`].
    NamedToolRetry,
    /// See [`Policy::grounded_retry_values`].
    GroundedRetryValues,
    /// See [`Policy::threshold_on_evidence`].
    ThresholdOnEvidence,
    /// See [`Policy::call_now_min_probability`]: the reference's correction
    /// was held back.
    CallNowGate,
    /// See [`Policy::call_baseline`]: the call threshold would have pushed
    /// a call, but the prompt without the request's words gave a call as
    /// much weight, so the model was left to choose.
    CallBaseline,
    /// See [`Policy::done_on_repeated_lookup`].
    DoneOnRepeatedLookup,
    /// See [`Policy::calls_within_offer`].
    CallsWithinOffer,
    /// A plain answer lost the lines that repeat the prompt's system or
    /// user turns (the restated request, a correction, the worked example):
    /// the loop's own words are never the answer, under every policy. An
    /// answer that was nothing else becomes the gist of the last result.
    /// The prose beside a reply's calls loses them too, and is written to
    /// the history without them (a model copies its own history).
    NoPromptEchoAnswers,
    /// An answer that repeats a sentence or line of its own was cut before
    /// the first repeat (every policy: a model that loops on a sentence
    /// until the token limit says it once).
    CutRepeats,
    /// See [`Policy::change_request_retry`].
    ChangeRequestRetry,
    /// See [`Policy::question_lookup_retry`].
    QuestionLookupRetry,
    /// See [`Policy::described_call_retry`].
    DescribedCallRetry,
    /// See [`Policy::answer_after_lookup`].
    AnswerAfterLookup,
    /// See [`Policy::stop_changing_when_done`].
    StopChangingWhenDone,
    /// See [`Policy::say_ignored_failure`].
    SayIgnoredFailure,
    /// See [`Policy::push_toward_related`].
    PushTowardRelated,
    /// See [`Policy::echo_retry`].
    EchoRetry,
    /// See [`Policy::call_threshold`]: the first token went to a call
    /// where the model ranked prose first.
    CallThreshold,
    /// See [`Policy::copy_bias`]: it changed the model's first choice
    /// inside a call's arguments.
    CopyBias,
    /// See [`Policy::no_prompt_names_in_values`]: a value was kept from
    /// beginning with one of the prompt's names.
    NoPromptNamesInValues,
    /// A value was kept from beginning with the worked example's
    /// placeholder (`"<query>"`), under every policy.
    NoPlaceholderValues,
    /// See [`Policy::finish_cut_calls`]: a call the token limit cut was
    /// finished.
    FinishCutCalls,
    /// See [`Policy::max_string_chars`]: a string argument reached it.
    MaxStringChars,
    /// See [`Policy::max_array_items`]: an array argument reached it.
    MaxArrayItems,
    /// See [`Policy::max_calls`]: the reply held as many calls as it
    /// allows.
    MaxCalls,
}

impl Rule {
    /// The rule's name (kebab-case, as in `wma.rule`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::GroundIdentifiers => "ground-identifiers",
            Self::GroundNumbers => "ground-numbers",
            Self::GroundDates => "ground-dates",
            Self::FilledLists => "filled-lists",
            Self::GroundStrings => "ground-strings",
            Self::MoveOn => "move-on",
            Self::OfferAppeared => "offer-appeared",
            Self::OfferIdTakers => "offer-id-takers",
            Self::OfferNamedTool => "offer-named-tool",
            Self::SkipUsedIds => "skip-used-ids",
            Self::OrderForCalls => "order-for-calls",
            Self::ReadOnlyQuestions => "read-only-questions",
            Self::GroundDelegation => "ground-delegation",
            Self::GroundTasks => "ground-tasks",
            Self::DelegatedCallsFirst => "delegated-calls-first",
            Self::CoordinatorCallsFirst => "coordinator-calls-first",
            Self::NamedToolRetry => "named-tool-retry",
            Self::GroundedRetryValues => "grounded-retry-values",
            Self::ThresholdOnEvidence => "threshold-on-evidence",
            Self::CallNowGate => "call-now-gate",
            Self::CallBaseline => "call-baseline",
            Self::DoneOnRepeatedLookup => "done-on-repeated-lookup",
            Self::CallsWithinOffer => "calls-within-offer",
            Self::NoPromptEchoAnswers => "no-prompt-echo-answers",
            Self::CutRepeats => "cut-repeats",
            Self::ChangeRequestRetry => "change-request-retry",
            Self::QuestionLookupRetry => "question-lookup-retry",
            Self::DescribedCallRetry => "described-call-retry",
            Self::AnswerAfterLookup => "answer-after-lookup",
            Self::StopChangingWhenDone => "stop-changing-when-done",
            Self::SayIgnoredFailure => "say-ignored-failure",
            Self::PushTowardRelated => "push-toward-related",
            Self::EchoRetry => "echo-retry",
            Self::CallThreshold => "call-threshold",
            Self::CopyBias => "copy-bias",
            Self::NoPromptNamesInValues => "no-prompt-names-in-values",
            Self::NoPlaceholderValues => "no-placeholder-values",
            Self::FinishCutCalls => "finish-cut-calls",
            Self::MaxStringChars => "max-string-chars",
            Self::MaxArrayItems => "max-array-items",
            Self::MaxCalls => "max-calls",
        }
    }
}

/// A rule that fired, with what it changed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fired {
    pub(crate) rule: Rule,
    pub(crate) detail: String,
}

/// The tool with its top-level identifier arguments required.
fn with_required_identifiers(tool: &ToolDefinition) -> ToolDefinition {
    let mut tool = tool.clone();
    let ids: Vec<Value> = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.keys()
                .filter(|k| crate::tool::is_identifier_key(k))
                .map(|k| Value::String(k.clone()))
                .collect()
        })
        .unwrap_or_default();
    if let Some(map) = tool.input_schema.as_object_mut() {
        let required = map
            .entry("required")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = required {
            for id in ids {
                if !list.contains(&id) {
                    list.push(id);
                }
            }
        }
    }
    tool
}

/// The most identifiers a delegation's task may choose from (the newest).
const MAX_DELEGATION_IDS: usize = 8;

/// The longest answer of a sub-agent a grounded task hands on, in
/// characters: about as long as a gist.
const MAX_HANDED_CHARS: usize = 240;

/// Narrows the free-text task of a delegation to `phrases` (the parts of
/// the request to hand on next, [`next_phrases`]), each followed by the
/// newest sub-agent `answer` when there is one (see
/// [`Policy::ground_tasks`]). A delegation without a free-text string
/// property, or no phrase to hand on, leaves the tool alone; false then.
fn ground_task(
    tool: &mut ToolDefinition,
    phrases: &[String],
    answer: Option<&str>,
    fired: &mut Vec<Fired>,
) -> bool {
    if phrases.is_empty() {
        return false;
    }
    let Some(properties) = tool
        .input_schema
        .get_mut("properties")
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    let Some((key, prop)) = properties.iter_mut().find(|(_, p)| {
        p.get("type").and_then(Value::as_str) == Some("string")
            && !p.as_object().is_some_and(|o| o.contains_key("enum"))
    }) else {
        return false;
    };
    // Of a helper's answer in lines, a part gets the lines it asks about
    // ("add its action item" gets "Action item: order new chairs", not the
    // minutes' title line the next helper took), else all of it.
    let handed = |part: &str| -> Vec<String> {
        let Some(a) = answer else {
            return Vec::new();
        };
        let lines = crate::prompt::relevant_part(a, part, "").unwrap_or(a);
        // A list's count is the loop's word, not the helper's finding:
        // handed on, "3 results" gave the next helper a quantity of 3.
        let lines = crate::prompt::without_count(lines);
        let one_line = lines.split_whitespace().collect::<Vec<_>>().join(" ");
        // A list of items with ids goes on one item at a time: a helper
        // handed three products added each of them.
        let items = crate::prompt::labelled_items(&one_line);
        let pieces = if items.len() >= 2 {
            items
        } else {
            vec![one_line]
        };
        pieces
            .iter()
            .map(|p| crate::prompt::truncate_chars(p, MAX_HANDED_CHARS))
            .collect()
    };
    // Once a helper answered, what it found goes with the next part: the
    // default model, offered the part alone too, took it and handed on
    // nothing ("add its action item to my to-do list").
    let choices: Vec<String> = phrases
        .iter()
        .flat_map(|p| {
            let found = handed(p);
            if found.is_empty() {
                vec![p.clone()]
            } else {
                found.into_iter().map(|a| format!("{p}: {a}")).collect()
            }
        })
        .collect();
    let Some(prop) = prop.as_object_mut() else {
        return false;
    };
    prop.remove("pattern");
    prop.insert(
        "enum".to_string(),
        Value::Array(choices.iter().cloned().map(Value::String).collect()),
    );
    fired.push(Fired {
        rule: Rule::GroundTasks,
        detail: format!(
            "the {key} for {} is one of {} phrases of the request{}",
            tool.name,
            phrases.len(),
            if answer.is_some() {
                ", each with the newest answer"
            } else {
                ""
            }
        ),
    });
    true
}

/// The one helper (among `ranked`'s delegations) whose name and
/// description share the most of the words of `part`; `None` when none
/// shares any or two share the most alike.
fn route_part(part: &str, ranked: &[ToolDefinition], sub_agents: &[String]) -> Option<String> {
    let helpers: Vec<ToolDefinition> = ranked
        .iter()
        .filter(|t| sub_agents.contains(&t.name))
        .cloned()
        .collect();
    if helpers.len() < 2 {
        return None;
    }
    let mut scores = score_tools(&helpers, part, &[]);
    scores.sort_by(|a, b| b.score.total_cmp(&a.score));
    match scores.as_slice() {
        [best, next, ..] if best.score > 0.0 && best.score > next.score => Some(best.name.clone()),
        _ => None,
    }
}

/// The phrases of the request a task can be next (see
/// [`Policy::ground_tasks`]): the request works through its parts in the
/// order it names them, and a later part needs what the earlier ones find.
/// So a request of one part is handed on whole; one of several parts,
/// first its first sentence and clause (a tiny model offered the whole
/// request too took it, and gave it to the wrong helper), then the
/// sentence and clause that begin first after the phrases already handed
/// on (a task counts as handing on each phrase it begins with). A part
/// that does not `speak` of any helper ("Ask around") is no task of its
/// own while another part does. Once every part was handed on, none: the
/// delegations are held, and the agent answers from what its helpers
/// found. `None` when the request has no phrase of two words.
fn next_phrases(
    request: &str,
    handed: &[String],
    speaks: &dyn Fn(&str) -> bool,
) -> Option<Vec<String>> {
    let mut phrases = request_phrases(request);
    if phrases.is_empty() {
        return None;
    }
    if phrases.iter().skip(1).any(|(_, _, p)| speaks(p)) {
        let mut index = 0;
        phrases.retain(|(_, _, p)| {
            index += 1;
            index == 1 || speaks(p)
        });
    }
    let done = |p: &str| handed.iter().any(|h| h.starts_with(p));
    let cursor = phrases
        .iter()
        .filter(|(_, _, p)| done(p))
        .map(|&(_, end, _)| end)
        .max();
    let after = |start: usize| cursor.is_none_or(|c| start >= c);
    let Some(first) = phrases
        .iter()
        .skip(1)
        .filter(|(start, _, p)| after(*start) && !done(p))
        .map(|&(start, _, _)| start)
        .min()
    else {
        // One part, or every part handed on: the whole request is left
        // while it was not handed on itself.
        return Some(
            match done(&phrases[0].2) || cursor.is_some() && phrases.len() > 1 {
                true => Vec::new(),
                false => vec![phrases[0].2.clone()],
            },
        );
    };
    Some(
        phrases
            .into_iter()
            .enumerate()
            .filter(|(i, (start, _, p))| *i > 0 && *start == first && !done(p))
            .map(|(_, (_, _, p))| p)
            .collect(),
    )
}

/// The person's phrases a task can be, with where each begins and ends in
/// the request: the whole request first, then each of its sentences, then
/// each clause of a sentence (split at "and", "then", commas and
/// semicolons); of two words at least, without end punctuation, each once.
fn request_phrases(request: &str) -> Vec<(usize, usize, String)> {
    let mut out: Vec<(usize, usize, String)> = Vec::new();
    let mut push = |start: usize, piece: &str| {
        let lead = piece.len() - piece.trim_start().len();
        let text = piece
            .trim()
            .trim_end_matches(['.', '!', '?', ',', ';', ':'])
            .trim_end();
        if text.split_whitespace().count() >= 2 && !out.iter().any(|(_, _, p)| p == text) {
            let start = start + lead;
            out.push((start, start + text.len(), text.to_string()));
        }
    };
    push(0, request);
    let mut sentences: Vec<(usize, &str)> = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = request.char_indices().collect();
    for (i, &(at, c)) in chars.iter().enumerate() {
        let ends = matches!(c, '.' | '!' | '?')
            && chars.get(i + 1).is_none_or(|&(_, n)| n.is_whitespace());
        if ends {
            let end = at + c.len_utf8();
            sentences.push((start, &request[start..end]));
            start = end;
        }
    }
    if start < request.len() {
        sentences.push((start, &request[start..]));
    }
    for &(at, sentence) in &sentences {
        push(at, sentence);
    }
    for &(at, sentence) in &sentences {
        let mut from = 0;
        let mut cuts: Vec<(usize, usize)> = Vec::new();
        for cut in [";", ",", " and then ", " then ", " and "] {
            let mut search = 0;
            while let Some(found) = sentence[search..].find(cut) {
                let begin = search + found;
                if !cuts
                    .iter()
                    .any(|&(b, e)| begin < e && b < begin + cut.len())
                {
                    cuts.push((begin, begin + cut.len()));
                }
                search = begin + cut.len();
            }
        }
        cuts.sort_unstable();
        for (begin, end) in cuts {
            push(at + from, &sentence[from..begin]);
            from = end;
        }
        push(at + from, &sentence[from..]);
    }
    out
}

/// `text` as a regular expression that matches it literally.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if !c.is_alphanumeric() && c != '_' && c != ' ' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether the request is asked as a question: its last sentence ends with
/// `?` and opens with a question word ("When is my library book due
/// back?", "By when do I…", "Is it…") rather than a polite request ("Could
/// you renew my book?"). Its words then ask about things, whatever verbs
/// they share: "book" in "when is my library book due" is a noun, and the
/// verb list alone took the question for a change.
pub(crate) fn is_question(request: &str) -> bool {
    let text = request.trim();
    if !text.ends_with('?') {
        return false;
    }
    let last = text[..text.len() - 1]
        .rsplit(['.', '!', '?', '\n'])
        .next()
        .unwrap_or("");
    let words: Vec<String> = last
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let Some(first) = words.first() else {
        return false;
    };
    if POLITE.contains(&first.as_str()) {
        return false;
    }
    AUXILIARY.contains(&first.as_str())
        || words.iter().take(3).any(|w| ASKING.contains(&w.as_str()))
}

/// Whether `text` holds a term of `request` (a word that is not a common
/// one, stemmed as the ranking stems it).
pub(crate) fn shares_a_term(text: &str, request: &str) -> bool {
    let wanted = crate::prompt::query_terms(request);
    crate::prompt::shared_terms(text, &wanted, &mut String::new()) > 0
}

/// Whether a result found nothing: empty, an empty list or object, or
/// `null`.
fn finds_nothing(output: &str) -> bool {
    match serde_json::from_str::<Value>(output.trim()) {
        Ok(Value::Array(items)) => items.is_empty(),
        Ok(Value::Object(map)) => map.is_empty(),
        Ok(Value::Null) => true,
        Ok(Value::String(s)) => s.trim().is_empty(),
        Ok(_) => false,
        // "No results.", "Nothing found", "None matched".
        Err(_) => {
            let text = output.trim().to_lowercase();
            let first = text
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or("");
            text.is_empty() || (text.len() < 80 && matches!(first, "no" | "nothing" | "none"))
        }
    }
}

/// Whether `answer` tells something of `found` beyond the words of
/// `request`: a term of the result that the request does not hold. Of a
/// plain-text result only the part that answers the request counts (see
/// [`crate::prompt::relevant_part`]): "I'm unable to check your home
/// network" tells nothing of a note whose line "Wifi password: …" answered
/// "I forgot the wifi password", though the line above names the network.
pub(crate) fn tells_of(answer: &str, found: &Found, request: &str) -> bool {
    // Of JSON only the values speak: its keys and literals ("done":
    // false) are the tool's vocabulary, and an answer that says "done"
    // tells nothing of the items.
    let values;
    let found = match serde_json::from_str::<Value>(found.output.trim()) {
        Ok(value) => {
            values = value_words(&value);
            values.as_str()
        }
        Err(_) => crate::prompt::relevant_part(&found.output, request, &found.named)
            .unwrap_or(&found.output),
    };
    let mut buffer = String::new();
    let mut asked = Vec::new();
    crate::rank::for_each_term(request, &mut buffer, |t| asked.push(t.to_string()));
    let mut new_terms = Vec::new();
    crate::rank::for_each_term(found, &mut buffer, |t| {
        if crate::rank::is_query_term(t) && !asked.iter().any(|a| a == t) {
            new_terms.push(t.to_string());
        }
    });
    let mut tells = false;
    crate::rank::for_each_term(answer, &mut buffer, |t| {
        tells |= new_terms.iter().any(|n| n == t);
    });
    tells
}

/// The strings and numbers inside a JSON value, one per line.
fn value_words(value: &Value) -> String {
    let mut out = String::new();
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => {
                out.push_str(s);
                out.push('\n');
            }
            Value::Number(n) => {
                out.push_str(&n.to_string());
                out.push('\n');
            }
            Value::Array(items) => stack.extend(items.iter().rev()),
            Value::Object(map) => stack.extend(map.values().rev()),
            Value::Bool(_) | Value::Null => {}
        }
    }
    out
}

/// Whether the request seeks to learn something: it asks (a question mark,
/// or one of [`ASKING`]) or asks to be told or shown (one of [`TELLING`]).
/// "Thanks, that's all." seeks nothing.
pub(crate) fn seeks_information(request: &str) -> bool {
    request.trim_end().ends_with('?')
        || request
            .split(|c: char| !c.is_alphanumeric())
            .map(str::to_lowercase)
            .any(|w| ASKING.contains(&w.as_str()) || TELLING.contains(&w.as_str()))
}

/// Whether the request asks for a change (a word [`is_change_verb`] knows).
pub(crate) fn asks_for_change(request: &str) -> bool {
    request
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| is_change_verb(&w.to_lowercase()))
}

/// Whether the request uses the verb of a shown tool that changes things:
/// the first word of its name ("borrow the book" and `borrow_book`, "renew
/// my loan" and `renewLoan`). The tools themselves say which verbs ask for a
/// change, so a request is not taken for a question only because its verb
/// is not one [`is_change_verb`] knows; a noun they share ("cart" in `add_to_cart`)
/// is no such sign.
fn names_a_change(request: &str, shown: &[ToolDefinition], read_only: &[String]) -> bool {
    let words = request_words(request);
    shown
        .iter()
        .filter(|t| !read_only.contains(&t.name))
        .filter_map(|t| tool_verb(&t.name))
        .any(|verb| words.iter().any(|w| w.starts_with(&verb)))
}

/// The text without its quoted parts: between double quotes, and between
/// a single quote that begins a word and one that ends a word (an
/// apostrophe inside a word, as in "what's", is no quote).
fn without_quotes(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut closing: Option<char> = None;
    for (i, &c) in chars.iter().enumerate() {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i + 1).copied();
        let starts_word = before.is_none_or(|b| !b.is_alphanumeric());
        let ends_word = after.is_none_or(|a| !a.is_alphanumeric());
        match closing {
            Some(q) if c == q && (q != '\'' || ends_word) => closing = None,
            Some(_) => {}
            None if matches!(c, '"' | '\u{201c}') => {
                closing = Some(if c == '"' { '"' } else { '\u{201d}' })
            }
            None if matches!(c, '\'' | '\u{2018}') && starts_word => {
                closing = Some(if c == '\'' { '\'' } else { '\u{2019}' })
            }
            None => out.push(c),
        }
    }
    // An unclosed quote quoted nothing.
    if closing.is_some() {
        return text.to_string();
    }
    out
}

/// The request's words of three letters or more, lowercased.
fn request_words(request: &str) -> Vec<String> {
    request
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() >= 3)
        .map(str::to_lowercase)
        .collect()
}

/// The first word of a tool's name (`cancel` of `cancel_event` and of
/// `cancelEvent`), when it has three letters or more.
fn tool_verb(name: &str) -> Option<String> {
    let first: String = name
        .chars()
        .enumerate()
        .take_while(|&(i, c)| c.is_alphanumeric() && !(i > 0 && c.is_uppercase()))
        .map(|(_, c)| c.to_ascii_lowercase())
        .collect();
    (first.len() >= 3).then_some(first)
}

/// Whether two words of the request (other than common ones) are in the name
/// of one shown tool: "show the cart items" names `view_cart_items`. One
/// shared word is too weak a sign: requests no tool fits often share one (a
/// "time" question and `calculate_time`). An identifier the person wrote
/// counts as the second sign for a tool that takes one: "put three of p-17
/// in my cart" hands `add_to_cart` its product. A tool that requires more
/// numbers than the conversation (`ids`) gives ([`short_of_numbers`]) is
/// not named: "What type of blood cells clot?" shares two words with
/// `getCellType`, whose `nucleus_count` nothing in it gives.
///
/// A tool of `short` (the step's offer's [`Offer::short_of_strings`]),
/// short of a required string, is not named either.
pub(crate) fn names_a_tool(
    request: &str,
    shown: &[ToolDefinition],
    ids: &Identifiers,
    short: &[String],
) -> bool {
    let mut written = Identifiers::new();
    let hands_an_id = written.add_user_text(request) > 0;
    score_tools(shown, request, &[]).iter().any(|s| {
        let tool = &shown[s.index];
        let id_sign = hands_an_id && takes_identifier(tool);
        let lacks_strings = short.contains(&tool.name);
        s.name_matches.len() + usize::from(id_sign) >= 2
            && !short_of_numbers(tool, ids, request)
            && !lacks_strings
    })
}

/// Why a call's arguments look made up rather than taken from `written`
/// (what the conversation wrote), if they do:
/// - one free string given to more arguments than `written` holds it
///   (case and surrounding space aside): "Flappy Bird" as both the game
///   and its platform. Arguments whose `schema` fixes their values (an
///   `enum`, a `format`, a date or time) may share one;
/// - a list that repeats a number `written` holds more often than it does
///   (`[120, 120, 120]` for a request that wrote 120 once);
/// - a string that is only words of its own argument's name
///   (`case_year: "year"`), unless the person quoted it.
pub(crate) fn made_up_value(arguments: &Value, schema: &Value, written: &str) -> Option<String> {
    let args = arguments.as_object()?;
    let lower = written.to_lowercase();
    let props = schema.get("properties").and_then(Value::as_object);
    let free = |key: &str| {
        props
            .and_then(|p| p.get(key))
            .is_none_or(|prop| is_free_string(Some(key), prop))
    };
    let mut seen: Vec<String> = Vec::new();
    for (key, value) in args {
        let Some(text) = value.as_str().map(|t| t.trim().to_lowercase()) else {
            continue;
        };
        if text.is_empty() || !free(key) {
            continue;
        }
        let uses = 1 + seen.iter().filter(|t| **t == text).count();
        if uses > 1 && uses > lower.matches(text.as_str()).count() {
            return Some(format!("gave \"{text}\" to {uses} arguments"));
        }
        seen.push(text);
    }
    let numbers = digit_runs(written);
    if let Some((number, n)) = args.values().find_map(|v| repeated_item(v, &numbers)) {
        return Some(format!("listed {number} {n} times"));
    }
    args.iter().find_map(|(key, value)| {
        let text = value.as_str()?.trim();
        let key_words = name_words(key);
        let words = name_words(text);
        let of_key = |w: &String| {
            key_words
                .iter()
                .any(|k| k == w || k.strip_suffix('s') == Some(w) || w.strip_suffix('s') == Some(k))
        };
        let said = text.to_lowercase();
        let quoted = [('\'', '\''), ('"', '"'), ('\u{201c}', '\u{201d}')]
            .iter()
            .any(|(open, close)| lower.contains(&format!("{open}{said}{close}")));
        (!words.is_empty() && words.iter().all(of_key) && !quoted)
            .then(|| format!("gave {key} its own name, \"{text}\""))
    })
}

/// A whole number that `written` holds and one array inside `value` lists
/// more often than that, with its count. Arguments of their own may share
/// a number (a square's two sides), and a list may hold numbers nobody
/// wrote (a polynomial's zero coefficients); a list that repeats a written
/// one is filling items nobody gave.
fn repeated_item(value: &Value, written: &[String]) -> Option<(String, usize)> {
    match value {
        Value::Array(items) => {
            let mut counts: Vec<(String, usize)> = Vec::new();
            for digits in items.iter().filter_map(whole_digits) {
                match counts.iter_mut().find(|(d, _)| *d == digits) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((digits, 1)),
                }
            }
            counts
                .into_iter()
                .find(|(d, n)| {
                    let times = written.iter().filter(|w| *w == d).count();
                    times > 0 && *n > times
                })
                .or_else(|| items.iter().find_map(|v| repeated_item(v, written)))
        }
        Value::Object(map) => map.values().find_map(|v| repeated_item(v, written)),
        _ => None,
    }
}

/// The digits of a whole number (sign aside); fractions are left out,
/// since "5%" may be written 0.05.
fn whole_digits(value: &Value) -> Option<String> {
    let n = value.as_number()?;
    let whole = n
        .as_i64()
        .map(i64::unsigned_abs)
        .or(n.as_u64())
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0)
                .map(|f| f.abs() as u64)
        })?;
    Some(without_leading_zeros(&whole.to_string()))
}

/// A call's result, and what the call named.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Found {
    /// The result.
    pub(crate) output: String,
    /// The strings of the call's arguments, one per line (see
    /// [`crate::prompt::gist_of_call`]); none for a sub-agent's answer.
    pub(crate) named: String,
}

impl Found {
    /// The result `output` of a call with `arguments`.
    pub(crate) fn of_call(arguments: &Value, output: &str) -> Self {
        let named: Vec<&str> = arguments
            .as_object()
            .map(|args| args.values().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        Found {
            output: output.to_string(),
            named: named.join("\n"),
        }
    }

    /// The result's gist for `request` (see [`crate::prompt::gist_of_call`]).
    pub(crate) fn gist(&self, request: &str) -> String {
        crate::prompt::gist_of_call(&self.output, request, &self.named)
    }
}

/// Whether the request holds two words or more of the tool's name, and
/// all of them or all but one ("renew my loan" names `renew_loan`, "turn
/// on the simulated logging" names `toggle-simulated-logging`; a one-word
/// name, or one word of `add_to_cart`, is too weak a sign).
fn names_whole_tool(request: &str, tool: &ToolDefinition) -> bool {
    let mut buffer = String::new();
    let mut name_terms: Vec<String> = Vec::new();
    crate::rank::for_each_term(&tool.name, &mut buffer, |t| {
        if crate::rank::is_query_term(t) && !name_terms.iter().any(|n| n == t) {
            name_terms.push(t.to_string());
        }
    });
    let held = crate::prompt::shared_terms(
        &tool.name,
        &crate::prompt::query_terms(request),
        &mut buffer,
    );
    held >= 2 && held + 1 >= name_terms.len()
}

/// What the small-model rules remember across the steps of one run.
#[derive(Debug, Default)]
pub(crate) struct PolicyState {
    /// Identifiers the conversation has shown, for grounding.
    pub(crate) identifiers: Identifiers,
    /// A read-only tool whose call in the last step brought new identifiers.
    looked_up: Option<String>,
    /// A tool that changes things and succeeded in the last step.
    just_acted: Option<String>,
    /// A read-only tool that answered in the last step, whatever it found.
    just_looked: Option<String>,
    /// The result of a lookup in the last step that speaks of the request
    /// (see [`Policy::answer_after_lookup`]).
    pub(crate) answered: Option<Found>,
    /// Names of the read-only tools listed this step.
    read_only: Vec<String>,
    /// Names of the tools listed the step before, once there was one.
    listed_before: Option<Vec<String>>,
    /// Tools listed this step that were not listed the step before.
    appeared: Vec<String>,
    /// Tool → identifiers it was called with successfully in this run.
    used: HashMap<String, Vec<Value>>,
    /// The newest successful result of a tool that changes things.
    pub(crate) last_action: Option<String>,
    /// The newest successful result of each tool, by name (a sub-agent's
    /// answer is handed on by [`Policy::ground_tasks`]).
    latest: Vec<(String, String)>,
    /// The strings of the successful calls' arguments in this run (the
    /// tasks handed to sub-agents among them).
    handed: Vec<String>,
    /// The names of the tools that delegate to a sub-agent, as the newest
    /// step's facts gave them.
    sub_agents: Vec<String>,
    /// Those of the tools listed this step.
    helpers: Vec<ToolDefinition>,
    /// Found-ids and acted markers of the step being run, moved into
    /// `looked_up` / `just_acted` when its calls are done.
    step_looked_up: Option<String>,
    step_acted: Option<String>,
    step_looked: Option<String>,
    step_answered: Option<Found>,
    /// The verbs (see [`tool_verb`]) of the tools that changed things with
    /// success in this run.
    acted_verbs: Vec<String>,
    /// The agent's instructions: they say what its tools are about (see
    /// [`PolicyState::related`]).
    pub(crate) instructions: String,
}

/// What the loop knows of a step when it asks for the step's offer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepFacts<'a> {
    /// The person's request.
    pub(crate) request: &'a str,
    /// Whether the step's attempts carry a constraint.
    pub(crate) constrained: bool,
    /// Whether no call was made yet in this run.
    pub(crate) first_step: bool,
    /// Whether the request has phrases a call could copy.
    pub(crate) has_phrases: bool,
    /// The names of the tools that delegate to a sub-agent.
    pub(crate) sub_agents: &'a [String],
}

/// The tools a step offers, as the policy decided them.
pub(crate) struct Offer {
    /// The ranked tools in the order the prompt lists them.
    pub(crate) ranked: Vec<ToolDefinition>,
    /// The tools a constraint may call (grounded schemas), by name.
    pub(crate) callable: Vec<ToolDefinition>,
    /// The ranked tools it may not call, each with the rule that held it.
    pub(crate) held: Vec<(String, Rule)>,
    /// The rules that fired deciding it.
    pub(crate) fired: Vec<Fired>,
    /// The callable tools that require a free string for which the run has
    /// seen no phrase that fits (see [`Policy::ground_strings`]): a call
    /// would have to make the value up.
    pub(crate) short_of_strings: Vec<String>,
}

impl Offer {
    /// The first of `calls` this offer does not allow, as the tool error
    /// that sends the reply back and the note of the rule (see
    /// [`Policy::calls_within_offer`]). `offered` is what the step's
    /// constraint offers: the shown tools the offer lets be called, in
    /// their grounded form. A call of a tool the step did not rank is left
    /// to the reference's own checks. A held tool that changes things is
    /// sent back even when nothing is offered: a provider without a "text
    /// or calls" grammar (a served model) can still write the call, and the
    /// step that owes an answer would otherwise run it (Qwen2.5-Coder on
    /// llama.cpp added an event after the lookup that answered "What's on
    /// my calendar?"). A lookup there runs as the reference would run it:
    /// it changes nothing, and sent back it cost Qwen2.5-Coder on ONNX
    /// Runtime its answer (the repair failed too, and the run ended in the
    /// apology).
    pub(crate) fn outside(
        &self,
        calls: &[ParsedCall],
        offered: &[ToolDefinition],
        validators: &ValidatorCache,
    ) -> Option<(Fired, ToolError)> {
        let names: Vec<&str> = offered.iter().map(|t| t.name.as_str()).collect();
        let instead = if names.is_empty() {
            "Answer the person with what the conversation shows.".to_string()
        } else {
            format!("Call one of {} instead, or answer.", names.join(", "))
        };
        let harmless = |name: &str| {
            offered.is_empty()
                && self
                    .ranked
                    .iter()
                    .any(|t| t.name == name && t.annotations.read_only)
        };
        for call in calls {
            if let Some((_, rule)) = self
                .held
                .iter()
                .find(|(n, _)| *n == call.name && !harmless(n))
            {
                let why = why_held(*rule, &call.name);
                return Some((
                    Fired {
                        rule: Rule::CallsWithinOffer,
                        detail: format!("sent back a call of {}: {why}", call.name),
                    },
                    ToolError::new(ToolErrorCode::Unavailable, format!("{why}. {instead}")),
                ));
            }
            let Some(tool) = offered.iter().find(|t| t.name == call.name) else {
                continue;
            };
            // Only the identifiers are held: they name things, and one nobody
            // has shown names nothing. The offer's other narrowings (numbers
            // the person wrote, optional counts made required) are nudges for
            // a model that needs them, and a well-formed call in prose that
            // went another way is not wrong for it.
            let Some((ids, schema)) = identifier_part(call, tool) else {
                continue;
            };
            // A grounded schema that does not compile leaves the call to the
            // tool's own schema, which the reply was checked against.
            if let Err(ArgsError::Invalid(message)) = validators.validate(&schema, &ids) {
                return Some((
                    Fired {
                        rule: Rule::CallsWithinOffer,
                        detail: format!("sent back a call of {}: {message}", call.name),
                    },
                    ToolError::new(
                        ToolErrorCode::InvalidArguments,
                        format!(
                            "{message} for {}: an id must be one the conversation has shown",
                            call.name
                        ),
                    ),
                ));
            }
        }
        None
    }
}

/// The identifier arguments of `call` and the part of the offered tool's
/// schema that grounds them (an `enum` of the ids shown); `None` when the
/// call gives no grounded identifier.
fn identifier_part(call: &ParsedCall, offered: &ToolDefinition) -> Option<(Value, Value)> {
    let args = call.arguments.as_object()?;
    let props = offered.input_schema.get("properties")?.as_object()?;
    let mut ids = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for (key, value) in args {
        if !crate::tool::is_identifier_key(key) {
            continue;
        }
        let Some(prop) = props.get(key) else { continue };
        let grounded = prop.get("enum").is_some()
            || prop.get("items").is_some_and(|i| i.get("enum").is_some());
        if grounded {
            ids.insert(key.clone(), value.clone());
            schemas.insert(key.clone(), prop.clone());
        }
    }
    if ids.is_empty() {
        return None;
    }
    Some((
        Value::Object(ids),
        serde_json::json!({"type": "object", "properties": schemas}),
    ))
}

/// Whether a line is markup: a fence, or a lone tag.
fn is_markup(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("```") || (line.starts_with('<') && line.ends_with('>'))
}

/// Whether a non-empty reply is markup alone: every line a fence, a tag,
/// or without a letter or digit.
fn is_markup_alone(reply: &str) -> bool {
    !reply.trim().is_empty()
        && reply
            .lines()
            .filter(|l| !is_markup(l))
            .all(|l| !l.chars().any(char::is_alphanumeric))
}

/// Whether a prose reply is a call to one of the `offered` tools written in
/// the wrong form (see [`Policy::described_call_retry`]): one of their names
/// as code (between backquotes, before an opening parenthesis, as the
/// value of a `name` key, or anywhere inside a fenced block), or a reply of
/// markup alone (a fence or a tag opened, and nothing said). A name in
/// running prose is not enough: "To calculate the price…" beside
/// `calculate` is prose; nor is a name in a block tagged as a program
/// (```python), which is a script, not a call.
pub(crate) fn writes_a_call(reply: &str, offered: &[ToolDefinition]) -> bool {
    let reply = reply.trim();
    if offered.is_empty() || reply.is_empty() {
        return false;
    }
    if is_markup_alone(reply) {
        return true;
    }
    // The text inside fenced blocks: a call, whatever form it takes. A
    // block tagged as a program (```python) is a program, not a call: a
    // script that uses a library function of a tool's name
    // (`requests.get(url)`) asks for no call, and is left out of both
    // scans.
    let mut fenced = String::new();
    let mut outside = String::new();
    for (i, part) in reply.split("```").enumerate() {
        if i % 2 == 0 {
            outside.push_str(part);
            outside.push('\n');
        } else if !is_program_block(part) {
            fenced.push_str(part);
            fenced.push('\n');
        }
    }
    let reply = outside.as_str();
    let is_name_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    offered.iter().any(|tool| {
        let name = tool.name.as_str();
        let whole_word_at = |text: &str, at: usize| {
            let before = text[..at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            !before.is_some_and(is_name_char) && !after.is_some_and(is_name_char)
        };
        let in_fence = fenced
            .match_indices(name)
            .any(|(at, _)| whole_word_at(&fenced, at));
        in_fence
            || reply.match_indices(name).any(|(at, _)| {
                let before = reply[..at].trim_end_matches(['"', '\'', ' ']);
                let after = &reply[at + name.len()..];
                whole_word_at(reply, at)
                    && (reply[..at].ends_with('`')
                        || after.starts_with('(')
                        || before.ends_with("name:")
                        || before.ends_with("\"name\":"))
            })
    })
}

/// Whether a fenced block (the text after its opening ```) is tagged as
/// a program: an info string that names no data format a call is written
/// in (JSON, XML, YAML, TOML). An untagged block may hold a call. The
/// parser's own fence languages (`parse::fenced`) take `python` too, as
/// a call may be written `f(x=1)` there; this is asked only of a reply
/// the parser found no call in, where a program block is a script.
fn is_program_block(block: &str) -> bool {
    const CALL_FORMATS: &[&str] = &["json", "jsonc", "json5", "xml", "yaml", "yml", "toml"];
    let tag = block
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    !tag.is_empty()
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+#-_".contains(c))
        && !CALL_FORMATS.contains(&tag.as_str())
}

/// A plain answer without the lines that only repeat the prompt (see
/// [`Rule::NoPromptEchoAnswers`]): `Some` with the lines left when
/// some were cut, `Some("")` when every line was an echo or the markup
/// around one (a fence, a lone tag), `None` when nothing was. A line
/// repeats the system or a user turn when it is part of one of their
/// lines, and a failed call's turn (`Error [code]: …`, the loop's own
/// words to the model) when it is one of its lines whole; a result's lines
/// are the answer's to quote. A line of one word, or an answer of fewer than three, is
/// never an echo: "Yes." or "Done." can be both. An answer of markup alone
/// (fences, tags, lines without a letter or digit) is `Some("")`: it tells
/// nothing.
pub(crate) fn without_prompt_echoes(answer: &str, prompt: &[PromptMessage]) -> Option<String> {
    fn norm(text: &str) -> String {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect::<Vec<_>>()
            .join(" ")
    }
    // Markup alone (fences, tags, brackets) tells nothing: a model that
    // wanted a call it was not offered writes "```json" or an empty
    // `<tool_response>`.
    if is_markup_alone(answer) {
        return Some(String::new());
    }
    if answer.split_whitespace().count() < 3 {
        return None;
    }
    let lines_of = |tool: bool| -> Vec<String> {
        prompt
            .iter()
            .filter(|m| (m.role == PromptRole::Tool) == tool && m.role != PromptRole::Assistant)
            .flat_map(|m| m.content.lines().map(norm).collect::<Vec<_>>())
            .filter(|l| l.contains(' ') && (!tool || l.starts_with("error ")))
            .collect()
    };
    let (said, returned) = (lines_of(false), lines_of(true));
    // The loop's own sentences, reworded a little ("If the results above
    // answer it, answer me." for "…, answer me from them."), echo too:
    // most of the line's words are the sentence's, and most of its.
    let own: Vec<Vec<String>> = crate::messages::own_sentences()
        .iter()
        .map(|s| norm(s).split(' ').map(str::to_string).collect())
        .collect();
    let rewords = |line: &str| {
        let words: Vec<&str> = line.split(' ').collect();
        words.len() >= 4
            && own.iter().any(|sentence| {
                let shared = words
                    .iter()
                    .filter(|w| sentence.iter().any(|s| s == *w))
                    .count();
                shared * 10 >= words.len() * 8 && shared * 10 >= sentence.len() * 6
            })
    };
    let echoes = |line: &str| {
        let sentences: Vec<String> = line
            .split(['.', '!', '?'])
            .map(norm)
            .filter(|s| !s.is_empty())
            .collect();
        let line = norm(line);
        line.contains(' ')
            && (said.iter().any(|s| s.contains(&line))
                || returned.contains(&line)
                || (!sentences.is_empty() && sentences.iter().all(|s| rewords(s))))
    };
    // A sentence of the model's that holds a run of the loop's own words,
    // word for word, is the loop's too ("The next step for it is to call
    // hash." after "Do the next step for it, …"; "Don't say it worked."
    // beside a sentence of its own): it is cut up to its full stop or
    // colon, and the line keeps the rest.
    let runs: Vec<&[String]> = own.iter().flat_map(|s| s.windows(OWN_WORD_RUN)).collect();
    let quotes_own = |sentence: &str| {
        let words: Vec<String> = norm(sentence).split(' ').map(str::to_string).collect();
        words.windows(OWN_WORD_RUN).any(|w| runs.contains(&w))
    };
    let without_own = |line: &str| -> String {
        line.split_inclusive(['.', '!', '?', ':'])
            .filter(|s| !quotes_own(s))
            .collect::<String>()
            .trim()
            .to_string()
    };
    // Each line read once: whether it echoes whole, and what is left of
    // it without the sentences that quote the loop.
    let lines: Vec<(&str, bool, String)> = answer
        .lines()
        .map(|l| (l, echoes(l), without_own(l)))
        .collect();
    if !lines
        .iter()
        .any(|(l, echo, rest)| *echo || rest != l.trim())
    {
        return None;
    }
    let kept: Vec<String> = lines
        .into_iter()
        .filter(|(l, echo, rest)| !echo && !is_markup(l) && !rest.is_empty())
        .map(|(_, _, rest)| rest)
        .collect();
    Some(kept.join("\n").trim().to_string())
}

/// How many words in a row of one of the loop's own sentences make a
/// sentence of an answer the loop's: five is longer than the phrases an
/// answer shares with them by chance ("for it", "the next step").
const OWN_WORD_RUN: usize = 5;

/// Why the offer held a tool back, in words for the model.
fn why_held(rule: Rule, tool: &str) -> String {
    match rule {
        Rule::ReadOnlyQuestions => {
            format!("the request asks for information, and {tool} changes things")
        }
        Rule::MoveOn => format!("{tool} was just called: use what it returned"),
        Rule::SkipUsedIds => format!("{tool} was already called with each id shown"),
        Rule::GroundIdentifiers | Rule::GroundDelegation => {
            format!("{tool} needs an id that no tool has shown yet: find it first")
        }
        Rule::OfferAppeared => format!("new tools just appeared for the next step, not {tool}"),
        Rule::OfferIdTakers => {
            format!("the ids just found are for a tool that takes an id, not {tool}")
        }
        Rule::AnswerAfterLookup => {
            format!("what was looked up answers the request: {tool} is not needed")
        }
        Rule::StopChangingWhenDone => {
            format!("every change the request asks for is made: {tool} is not needed")
        }
        Rule::GroundTasks => {
            format!("{tool} is not the helper for what is left of the request")
        }
        _ => format!("{tool} is not the next step"),
    }
}

impl PolicyState {
    /// Notes which tools delegate to a sub-agent (before
    /// [`PolicyState::observe_tools`], which keeps their definitions).
    pub(crate) fn observe_sub_agents(&mut self, names: &[String]) {
        self.sub_agents = names.to_vec();
    }

    /// The parts of `request` a delegation's task can be next (see
    /// [`next_phrases`]); a part speaks of a helper when it shares a word
    /// with the helper's name or description.
    fn next_parts(&self, request: &str) -> Option<Vec<String>> {
        let speaks = |part: &str| {
            score_tools(&self.helpers, part, &[])
                .iter()
                .any(|s| !s.name_matches.is_empty() || !s.description_matches.is_empty())
        };
        next_phrases(request, &self.handed, &speaks)
    }

    /// Starts a step: notes which tools are read-only and which appeared.
    pub(crate) fn observe_tools(&mut self, all: &[ToolDefinition]) {
        self.helpers = all
            .iter()
            .filter(|t| self.sub_agents.contains(&t.name))
            .cloned()
            .collect();
        self.read_only = all
            .iter()
            .filter(|t| t.annotations.read_only)
            .map(|t| t.name.clone())
            .collect();
        let listed: Vec<String> = all.iter().map(|t| t.name.clone()).collect();
        self.appeared = match self.listed_before.replace(listed.clone()) {
            Some(before) => listed.into_iter().filter(|n| !before.contains(n)).collect(),
            None => Vec::new(),
        };
    }

    /// Whether the request asks for a change that a shown tool annotated
    /// as changing things could make (see [`Policy::change_request_retry`]);
    /// false for a tool set that annotates no tool read-only, whose tools
    /// say nothing of what they change.
    pub(crate) fn asks_a_change_of(&self, request: &str, shown: &[ToolDefinition]) -> bool {
        !self.read_only.is_empty()
            && shown.iter().any(|t| !self.is_read_only(&t.name))
            && !is_question(request)
            && (asks_for_change(request) || names_a_change(request, shown, &self.read_only))
    }

    /// Whether a prose reply still owes the change the request asks for
    /// (see [`Policy::change_request_retry`]): no tool that changes things
    /// has succeeded in this run, and a call can make headway: on the first
    /// step any offered call (a lookup first is fine), later only one of a
    /// tool that changes things.
    pub(crate) fn change_still_owed(
        &self,
        request: &str,
        shown: &[ToolDefinition],
        offered: &[ToolDefinition],
        first_step: bool,
    ) -> bool {
        self.last_action.is_none()
            && self.asks_a_change_of(request, shown)
            && (first_step || offered.iter().any(|t| !self.is_read_only(&t.name)))
    }

    /// Whether the request asks for information rather than a change, in a
    /// tool set that annotates tools as read-only (one that annotates none
    /// says nothing of what its tools change): a question, or a request
    /// that seeks to be told something ([`seeks_information`]) with no verb
    /// of change and none of a shown tool that changes things. A statement
    /// is no question: "Please remember that Olga has a spare key" asks
    /// for a write whose verb no list holds.
    fn asks_for_information(&self, request: &str, shown: &[ToolDefinition]) -> bool {
        !self.read_only.is_empty()
            && (is_question(request)
                || (seeks_information(request)
                    && !asks_for_change(request)
                    && !names_a_change(request, shown, &self.read_only)))
    }

    /// Whether a prose reply on the first step should have looked it up
    /// (see [`Policy::question_lookup_retry`]): the tool set annotates
    /// read-only tools, the request asks for no change and seeks to learn
    /// something, and a read-only tool is offered.
    pub(crate) fn lookup_owed(
        &self,
        request: &str,
        shown: &[ToolDefinition],
        offered: &[ToolDefinition],
    ) -> bool {
        let related = self.related(request, offered);
        self.asks_for_information(request, shown)
            && seeks_information(request)
            && offered
                .iter()
                .any(|t| self.is_read_only(&t.name) && related.contains(&t.name))
    }

    /// The names of the `tools` that relate to the request: a term of the
    /// request (stemmed, not a common word) is in the tool's name, or two
    /// are in its description, its arguments' names and the values it
    /// lists (one shared word of a description is a weak sign: "Answer in
    /// one word" shares "word" with "Search the catalog by words"); or a
    /// term is in the agent's instructions, which say what all its tools
    /// are about. A question no tool relates to ("What is the capital of
    /// France?" beside a shop's search) is the model's to answer: no rule
    /// pushes it toward a call.
    pub(crate) fn related(&self, request: &str, tools: &[ToolDefinition]) -> Vec<String> {
        let in_domain = shares_a_term(&self.instructions, request);
        score_tools(tools, request, &[])
            .into_iter()
            .filter(|s| in_domain || !s.name_matches.is_empty() || s.description_matches.len() >= 2)
            .map(|s| s.name)
            .collect()
    }

    /// Whether the last step changed something with success, in a tool set
    /// that annotates its lookups (one that annotates nothing says nothing
    /// of what its tools change).
    pub(crate) fn acted_last_step(&self) -> bool {
        self.just_acted.is_some() && !self.read_only.is_empty()
    }

    /// Whether the tool was annotated read-only this step.
    pub(crate) fn is_read_only(&self, name: &str) -> bool {
        self.read_only.iter().any(|n| n == name)
    }

    /// The step's offer: which ranked tools a constraint may call (and in
    /// what grounded form), and the order the prompt lists them in.
    pub(crate) fn offer(
        &self,
        policy: &Policy,
        ranked: Vec<ToolDefinition>,
        facts: StepFacts<'_>,
    ) -> Offer {
        let mut fired = Vec::new();
        if !facts.constrained || !policy.narrows() {
            return Offer {
                callable: ranked.clone(),
                ranked,
                held: Vec::new(),
                fired,
                short_of_strings: Vec::new(),
            };
        }
        let request = facts.request;
        let mut callable: Vec<ToolDefinition> = Vec::new();
        let mut short: Vec<String> = Vec::new();
        let mut withheld: HashMap<Rule, Vec<String>> = HashMap::new();
        let question = policy.read_only_questions && self.asks_for_information(request, &ranked);
        let answer_owed = policy.answer_after_lookup && self.answer_owed(request, &ranked);
        let changes_done = policy.stop_changing_when_done && self.changes_done(request, &ranked);
        // What of the request is left to hand on, the newest helper's
        // answer to go with it, and the helper whose name and description
        // share the most words with that part (when one does).
        let next = if policy.ground_tasks && !facts.sub_agents.is_empty() {
            self.next_parts(request)
        } else {
            None
        };
        let answer = self
            .latest
            .iter()
            .rev()
            .find(|(n, _)| facts.sub_agents.contains(n))
            .map(|(_, a)| a.as_str());
        let route = next
            .as_ref()
            .filter(|p| !p.is_empty())
            .and_then(|parts| route_part(&parts.join(" "), &ranked, facts.sub_agents));
        let string_choices = policy
            .ground_strings
            .then(|| self.identifiers.string_choices(&ranked))
            .filter(|c| !c.is_empty());
        for tool in &ranked {
            let name = tool.name.as_str();
            // The first rule that holds the tool back this step, if any.
            let read_only = self.is_read_only(name);
            let delegation = facts.sub_agents.contains(&tool.name);
            let held_by = if answer_owed {
                Some(Rule::AnswerAfterLookup)
            } else if delegation
                && (next.as_ref().is_some_and(Vec::is_empty)
                    || route.as_ref().is_some_and(|r| r != name))
            {
                // Every part was handed on, or another helper takes the next.
                Some(Rule::GroundTasks)
            } else if changes_done && !read_only {
                Some(Rule::StopChangingWhenDone)
            } else if question && !read_only {
                Some(Rule::ReadOnlyQuestions)
            } else if policy.ground_numbers
                && ranked.len() > 1
                && waits_for_a_number(tool, &self.identifiers)
            {
                // A number the tool cannot do without, none in the
                // conversation, and another tool to call: a tiny model makes
                // one up (asked for the weather, `get-sum {"a": 10, "b":
                // 20}`). A lone tool is left to the model, whose number may
                // be implied ("a unit circle").
                Some(Rule::GroundNumbers)
            } else if policy.move_on
                && (self.just_looked.as_deref() == Some(name)
                    || self.just_acted.as_deref() == Some(name))
            {
                Some(Rule::MoveOn)
            } else {
                None
            };
            if let Some(rule) = held_by {
                withheld.entry(rule).or_default().push(tool.name.clone());
                continue;
            }
            let ids = match self.used.get(name).filter(|_| policy.skip_used_ids) {
                Some(used) => self.identifiers.without(used),
                None => self.identifiers.clone(),
            };
            // A delegation that takes an id is for acting on it: under
            // `ground_delegation` it waits until one was shown.
            let needs_id = policy.ground_delegation && delegation && takes_identifier(tool);
            let required_id;
            let tool = if needs_id {
                required_id = with_required_identifiers(tool);
                &required_id
            } else {
                tool
            };
            match ground_tool(
                tool,
                &ids,
                policy.ground_identifiers || needs_id,
                policy.ground_numbers,
            ) {
                Some(mut grounded) => {
                    // A delegation that asks for the id itself is grounded
                    // by it; one that takes only a task must name one.
                    // Phrases of the request (and the answer that carries
                    // the ids) come first; the id pattern is the fallback.
                    let tasked = delegation
                        && next.as_ref().is_some_and(|parts| {
                            ground_task(&mut grounded, parts, answer, &mut fired)
                        });
                    if !tasked && policy.ground_delegation && delegation && !takes_identifier(tool)
                    {
                        self.ground_delegation(&mut grounded, &mut fired);
                    }
                    if grounded.input_schema != tool.input_schema {
                        let rule = if policy.ground_identifiers && takes_identifier(tool) {
                            Rule::GroundIdentifiers
                        } else {
                            Rule::GroundNumbers
                        };
                        fired.push(Fired {
                            rule,
                            detail: format!("narrowed the arguments of {name}"),
                        });
                    }
                    if policy.ground_dates {
                        let narrowed = ground_when_values(&grounded, &ids);
                        if narrowed.input_schema != grounded.input_schema {
                            fired.push(Fired {
                                rule: Rule::GroundDates,
                                detail: format!("narrowed the dates and times of {name}"),
                            });
                            grounded = narrowed;
                        }
                    }
                    if policy.filled_lists {
                        let filled = fill_required_lists(&grounded);
                        if filled.input_schema != grounded.input_schema {
                            fired.push(Fired {
                                rule: Rule::FilledLists,
                                detail: format!("asked {name} for at least one item of its lists"),
                            });
                            grounded = filled;
                        }
                    }
                    // Free strings are never held to what the run has seen:
                    // a zone name, a query or a sentence to write needs the
                    // model's own words. The phrases seen go to the copy
                    // bias instead ([`PolicyState::copy_evidence`]); here
                    // they only tell whether a required string has any
                    // evidence at all.
                    if policy.ground_strings
                        && short_of_strings(&ground_string_values(
                            &grounded,
                            string_choices.as_deref().unwrap_or(&[]),
                        ))
                    {
                        short.push(tool.name.clone());
                    }
                    callable.push(grounded);
                }
                None => {
                    let rule = if self.used.contains_key(name) && policy.skip_used_ids {
                        Rule::SkipUsedIds
                    } else if needs_id {
                        Rule::GroundDelegation
                    } else {
                        Rule::GroundIdentifiers
                    };
                    withheld.entry(rule).or_default().push(tool.name.clone());
                }
            }
        }
        let mut withheld: Vec<(Rule, Vec<String>)> = withheld.into_iter().collect();
        withheld.sort();
        let mut held: Vec<(String, Rule)> = withheld
            .iter()
            .flat_map(|(rule, names)| names.iter().map(|n| (n.clone(), *rule)))
            .collect();
        for (rule, names) in withheld {
            fired.push(Fired {
                rule,
                detail: format!("withheld {}", names.join(", ")),
            });
        }
        // Right after tools appeared, or a lookup found ids: offer those
        // alone, when any of them can be called.
        if policy.offer_appeared && callable.iter().any(|t| self.appeared.contains(&t.name)) {
            let (keep, drop): (Vec<_>, Vec<_>) = callable
                .into_iter()
                .partition(|t| self.appeared.contains(&t.name));
            held.extend(drop.iter().map(|t| (t.name.clone(), Rule::OfferAppeared)));
            if !drop.is_empty() {
                fired.push(Fired {
                    rule: Rule::OfferAppeared,
                    detail: format!(
                        "offered {} alone",
                        keep.iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
            callable = keep;
        } else if policy.offer_id_takers
            && self.looked_up.is_some()
            && callable.iter().any(takes_identifier)
        {
            let (keep, drop): (Vec<_>, Vec<_>) = callable.into_iter().partition(takes_identifier);
            held.extend(drop.iter().map(|t| (t.name.clone(), Rule::OfferIdTakers)));
            if !drop.is_empty() {
                fired.push(Fired {
                    rule: Rule::OfferIdTakers,
                    detail: format!(
                        "offered {} for the ids found",
                        keep.iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
            callable = keep;
        }
        // A tool the request calls by its whole name is the one meant.
        if policy.offer_named_tool && callable.len() > 1 {
            let named: Vec<usize> = (0..callable.len())
                .filter(|&i| {
                    !self.used.contains_key(&callable[i].name)
                        && names_whole_tool(request, &callable[i])
                })
                .collect();
            if let [only] = named[..] {
                let keep = callable.swap_remove(only);
                held.extend(
                    callable
                        .iter()
                        .map(|t| (t.name.clone(), Rule::OfferNamedTool)),
                );
                fired.push(Fired {
                    rule: Rule::OfferNamedTool,
                    detail: format!("offered {} alone: the request names it", keep.name),
                });
                callable = vec![keep];
            }
        }
        let ranked = if policy.order_for_calls {
            self.order(
                ranked,
                &callable,
                (facts.first_step && facts.has_phrases).then_some(request),
                &mut fired,
            )
        } else {
            ranked
        };
        Offer {
            ranked,
            callable,
            held,
            fired,
            short_of_strings: short,
        }
    }

    /// Narrows a delegation's task to text that names one of the
    /// identifiers the conversation has shown (a regular-expression
    /// `pattern` on the task, which a constraint holds to), preferring ids
    /// that look like ids (`p-17`, `ORD_7`) over any word with a digit.
    fn ground_delegation(&self, tool: &mut ToolDefinition, fired: &mut Vec<Fired>) {
        let strings: Vec<&str> = self
            .identifiers
            .values()
            .iter()
            .rev()
            .filter_map(Value::as_str)
            .collect();
        let joined: Vec<&str> = strings
            .iter()
            .copied()
            .filter(|s| s.trim_matches(['-', '_']).contains(['-', '_']))
            .collect();
        let mut ids = if joined.is_empty() { strings } else { joined };
        ids.truncate(MAX_DELEGATION_IDS);
        if ids.is_empty() {
            return;
        }
        let Some(task) = tool
            .input_schema
            .get("required")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return;
        };
        let Some(prop) = tool
            .input_schema
            .get_mut("properties")
            .and_then(|p| p.get_mut(&task))
            .and_then(Value::as_object_mut)
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("string"))
        else {
            return;
        };
        let alternatives: Vec<String> = ids.iter().map(|id| regex_escape(id)).collect();
        prop.insert(
            "pattern".to_string(),
            Value::String(format!("({})", alternatives.join("|"))),
        );
        fired.push(Fired {
            rule: Rule::GroundDelegation,
            detail: format!("the task for {} names one of {}", tool.name, ids.join(", ")),
        });
    }

    /// The ranked tools, reordered: the tools that can be called now first;
    /// among them the tools that appeared, then (after a lookup found ids)
    /// those that take an id, then (when `phrases`) those that take free
    /// text. Stable: the ranking decides within each group.
    fn order(
        &self,
        ranked: Vec<ToolDefinition>,
        callable: &[ToolDefinition],
        first_request: Option<&str>,
        fired: &mut Vec<Fired>,
    ) -> Vec<ToolDefinition> {
        let found_ids = self.looked_up.is_some();
        // On a first step with phrases to copy: a value a tool lists for an
        // argument that the person wrote says which tool is meant
        // ("Chicago" beside a `location` of three cities); numbers the
        // person wrote are there to be used: a tool that needs numbers
        // comes before one that takes any text ("What is 48 plus 27?"
        // beside `echo` and `get-sum`).
        let phrases = first_request.is_some();
        let before: Vec<String> = ranked.iter().map(|t| t.name.clone()).collect();
        let numbers = phrases && self.identifiers.has_numbers();
        type Key = (bool, bool, bool, bool, bool, bool);
        let mut keyed: Vec<(Key, ToolDefinition)> = ranked
            .into_iter()
            .map(|t| {
                let can = callable.iter().any(|c| c.name == t.name);
                let new = self.appeared.contains(&t.name);
                let uses_ids = found_ids && takes_identifier(&t);
                let named = first_request.is_some_and(|r| lists_a_written_value(&t, r));
                let counts = numbers && requires_a_number(&t);
                let text = phrases && takes_free_text(&t);
                ((!can, !new, !uses_ids, !named, !counts, !text), t)
            })
            .collect();
        keyed.sort_by_key(|(key, _)| *key);
        let ordered: Vec<ToolDefinition> = keyed.into_iter().map(|(_, t)| t).collect();
        if ordered.first().map(|t| &t.name) != before.first() {
            fired.push(Fired {
                rule: Rule::OrderForCalls,
                detail: format!("listed {} first", ordered[0].name),
            });
        }
        ordered
    }

    /// Notes a successful call; `new_ids` is how many identifiers its result
    /// brought; `request` is the person's request.
    pub(crate) fn called(
        &mut self,
        name: &str,
        arguments: &Value,
        output: &str,
        new_ids: usize,
        request: &str,
    ) {
        self.used
            .entry(name.to_string())
            .or_default()
            .extend(Identifiers::of_call(arguments));
        self.latest.retain(|(n, _)| n != name);
        self.latest.push((name.to_string(), output.to_string()));
        if let Value::Object(args) = arguments {
            self.handed
                .extend(args.values().filter_map(Value::as_str).map(str::to_string));
        }
        if self.sub_agents.iter().any(|n| n == name) {
            // What a sub-agent did is its own run's business: its answer is
            // no change of the parent's and no lookup either, until it
            // answers the last part of the request (see
            // `Policy::ground_tasks`), whatever words it answers in ("3
            // results: Buy milk, …" for "tell me what's still open").
            self.last_action = Some(output.to_string());
            self.step_acted = Some(name.to_string());
            if self.next_parts(request).is_some_and(|left| left.is_empty()) {
                self.step_answered = Some(Found {
                    output: output.to_string(),
                    named: String::new(),
                });
            }
            return;
        }
        if self.is_read_only(name) {
            self.step_looked = Some(name.to_string());
            // A lookup made with the person's own words that found something
            // answered too, though its result may not repeat them
            // (`{"location": "Chicago"}` gave a temperature and conditions);
            // one that found ids found them to be used.
            let asked_in_their_words = new_ids == 0
                && arguments.as_object().is_some_and(|args| {
                    args.values()
                        .filter_map(Value::as_str)
                        .any(|v| shares_a_term(v, request))
                })
                && !finds_nothing(output);
            if shares_a_term(output, request) || asked_in_their_words {
                self.step_answered = Some(Found::of_call(arguments, output));
            }
            if new_ids > 0 {
                self.step_looked_up = Some(name.to_string());
            }
        } else {
            self.last_action = Some(output.to_string());
            self.step_acted = Some(name.to_string());
            if let Some(verb) = tool_verb(name)
                && !self.acted_verbs.contains(&verb)
            {
                self.acted_verbs.push(verb);
            }
        }
    }

    /// Ends a step's calls: what it found and did steers the next step.
    pub(crate) fn step_done(&mut self) {
        self.looked_up = self.step_looked_up.take();
        self.just_acted = self.step_acted.take();
        self.just_looked = self.step_looked.take();
        self.answered = self.step_answered.take();
    }

    /// Whether every change the request names has been made (see
    /// [`Policy::stop_changing_when_done`]); false while none was.
    pub(crate) fn changes_done(&self, request: &str, shown: &[ToolDefinition]) -> bool {
        if self.acted_verbs.is_empty() {
            return false;
        }
        let verbs: Vec<String> = shown
            .iter()
            .filter(|t| !self.is_read_only(&t.name))
            .filter_map(|t| tool_verb(&t.name))
            .collect();
        let names_a_tool = |w: &str| verbs.iter().any(|v| w.starts_with(v.as_str()));
        // A common verb of change that no shown tool is named by is the
        // person's word for what some tool does ("rename" beside
        // `move_file`): any change that succeeded made it. One that names a
        // tool is made only by that tool's verb.
        let made = |w: &str| {
            !names_a_tool(w) || self.acted_verbs.iter().any(|v| w.starts_with(v.as_str()))
        };
        // A quoted text is what to write, not what to do: "Add 'book a
        // dentist appointment'" asks for one add, not a booking.
        let verbs_made = request_words(&without_quotes(request))
            .iter()
            .filter(|w| is_change_verb(w) || names_a_tool(w))
            .all(|w| made(w));
        // Every identifier the person wrote is acted on ("add p-17 and
        // p-21" is two adds).
        let mut written = Identifiers::new();
        written.add_user_text(request);
        let acted_on: Vec<&Value> = self
            .used
            .iter()
            .filter(|(tool, _)| !self.is_read_only(tool))
            .flat_map(|(_, ids)| ids.iter())
            .collect();
        verbs_made
            && written
                .values()
                .iter()
                .filter(|v| v.is_string())
                .all(|v| acted_on.contains(&v))
    }

    /// Whether the step after a lookup that answered a request for
    /// information offers no tool (see [`Policy::answer_after_lookup`]).
    pub(crate) fn answer_owed(&self, request: &str, shown: &[ToolDefinition]) -> bool {
        self.answered.is_some() && self.asks_for_information(request, shown)
    }

    /// Whether a repeated call of `name` (same arguments, same answer) ends
    /// the run as done: the text to end it with.
    pub(crate) fn done_on_repeat(&self, policy: &Policy, name: &str) -> Option<&str> {
        if policy.done_on_repeated_lookup && self.is_read_only(name) {
            self.last_action.as_deref()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::ToolAnnotations;
    use serde_json::json;

    /// A request in another language turns the English-reading rules off,
    /// and each one that was on says so with the stand-down detail, which
    /// the ledgers count apart from the rules that acted.
    #[test]
    fn rules_that_read_english_stand_down_and_say_so() {
        let small = Policy::small_model();
        let (english, said) = small.for_language(true);
        assert!(said.is_empty());
        assert!(english.read_only_questions);
        let (other, said) = small.for_language(false);
        assert!(!other.read_only_questions && !other.question_lookup_retry);
        assert!(said.iter().any(|f| f.rule == Rule::ReadOnlyQuestions));
        assert!(said.iter().all(|f| f.detail == STOOD_DOWN), "{said:?}");
    }

    fn tool(name: &str, schema: Value, read_only: bool) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: String::new(),
            input_schema: schema,
            annotations: ToolAnnotations {
                read_only,
                ..ToolAnnotations::default()
            },
        }
    }

    /// A read-only search that takes words.
    #[test]
    fn a_tool_written_as_code_or_a_bare_fence_is_a_call_in_the_wrong_form() {
        let offered = [
            tool("calculate", json!({"type": "object"}), true),
            tool("count", json!({"type": "object"}), true),
        ];
        for reply in [
            "To calculate the square root of 1764, you can use the `calculate` function: `sqrt(1764)`.",
            "calculate(\"7 * 24\")",
            "```json",
            "```json\n```json\nname: count, arguments: text: \"The quick brown fox\"\n```",
            "{\"name\": \"count\", \"arguments\": {}}",
            "<tool_call>",
        ] {
            assert!(writes_a_call(reply, &offered), "{reply}");
        }
        for reply in [
            "To calculate the price of the jacket, take 35% off 240.",
            "A week has 604800 seconds.",
            "Use `recalculate` for that.",
            "```python\nprint(7 * 24 * 60 * 60)\n```",
        ] {
            assert!(!writes_a_call(reply, &offered), "{reply}");
        }
        assert!(!writes_a_call("```json", &[]));
        // A script that uses a library function of a tool's name is a
        // program, not a call; untagged or in a data format, it is a call.
        let get = [tool("requests.get", json!({"type": "object"}), true)];
        for (reply, call) in [
            (
                "Here is how:\n```python\nimport requests\nresponse = requests.get(url)\n```",
                false,
            ),
            ("```\nrequests.get(url)\n```", true),
            (
                "```xml\n<tool_call><name>requests.get</name></tool_call>\n```",
                true,
            ),
        ] {
            assert_eq!(writes_a_call(reply, &get), call, "{reply}");
        }
    }

    fn search_tool() -> ToolDefinition {
        tool(
            "search",
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            true,
        )
    }

    fn files() -> Vec<ToolDefinition> {
        vec![
            tool(
                "write_file",
                json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}),
                false,
            ),
            tool(
                "read_file",
                json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
                true,
            ),
        ]
    }

    fn facts(
        request: &str,
        constrained: bool,
        first_step: bool,
        has_phrases: bool,
    ) -> StepFacts<'_> {
        StepFacts {
            request,
            constrained,
            first_step,
            has_phrases,
            sub_agents: &[],
        }
    }

    fn offer(policy: &Policy, state: &PolicyState, request: &str) -> (Offer, Vec<Fired>) {
        let o = state.offer(policy, files(), facts(request, true, true, false));
        let fired = o.fired.clone();
        (o, fired)
    }

    #[test]
    fn a_constrained_call_fills_its_required_lists_under_the_small_model_policy() {
        let remember = vec![tool(
            "create_entities",
            json!({"type": "object", "properties": {"entities": {"type": "array", "items": {"type": "string"}}}, "required": ["entities"]}),
            false,
        )];
        let mut state = PolicyState::default();
        state.observe_tools(&remember);
        let request = "Please remember that Olga has a spare key.";
        let small = state.offer(
            &Policy::small_model(),
            remember.clone(),
            facts(request, true, true, false),
        );
        assert_eq!(
            small.callable[0].input_schema["properties"]["entities"]["minItems"],
            json!(1)
        );
        assert!(
            small.fired.iter().any(|f| f.rule == Rule::FilledLists),
            "{:?}",
            small.fired
        );
        let reference = state.offer(
            &Policy::reference(),
            remember.clone(),
            facts(request, true, true, false),
        );
        assert_eq!(reference.callable, remember, "the reference limits nothing");
    }

    #[test]
    fn a_number_argument_may_take_a_number_the_request_does_not_spell() {
        // "From rest" is 0 and "$200,000" is one number: a model that knows
        // that must be able to write it. The person's numbers are evidence
        // for the copy bias, never the only numbers a call may hold.
        let speed = vec![tool(
            "calculate_speed_from_rest",
            json!({"type": "object", "properties": {
                "distance": {"type": "number"},
                "time": {"type": "number"},
                "initial_speed": {"type": "number"},
                "cost": {"type": "integer"}},
                "required": ["distance", "time", "initial_speed", "cost"]}),
            true,
        )];
        let mut state = PolicyState::default();
        state.observe_tools(&speed);
        let request = "It started from rest and went 20 meters in 4 seconds; it cost $200,000.";
        state.identifiers.add_user_text(request);
        let o = state.offer(
            &Policy::small_model(),
            speed.clone(),
            facts(request, true, true, false),
        );
        let props = &o.callable[0].input_schema["properties"];
        for name in ["distance", "time", "initial_speed", "cost"] {
            assert!(props[name].get("enum").is_none(), "{name}: {}", props[name]);
        }
    }

    #[test]
    fn the_examples_shape_the_copy_bias_only_where_there_is_one() {
        let time = vec![tool(
            "get_current_time",
            json!({"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA name (e.g. 'America/New_York', 'Europe/London')"}}, "required": ["timezone"]}),
            true,
        )];
        let shapes = Policy::small_model().decoding(&time, "").copy_shapes;
        assert_eq!(shapes, vec![("timezone".to_string(), "/".to_string())]);
        let off = Policy {
            copy_bias: 0.0,
            ..Policy::small_model()
        };
        assert!(off.decoding(&time, "").copy_shapes.is_empty());
    }

    #[test]
    fn the_reference_policy_offers_every_ranked_tool_in_rank_order() {
        let mut state = PolicyState::default();
        state.observe_tools(&files());
        let (o, fired) = offer(&Policy::reference(), &state, "What is in notes.txt?");
        assert_eq!(o.callable, files());
        assert_eq!(o.ranked, files());
        assert!(fired.is_empty());
        // The reference's constraint shapes nothing beyond the schema but
        // the worked example's placeholders, which are never values.
        assert_eq!(
            Policy::reference().decoding(&files(), ""),
            Decoding {
                avoid_in_values: vec!["<content".to_string(), "<path".to_string()],
                ..Decoding::default()
            }
        );
    }

    #[test]
    fn values_may_not_begin_with_the_prompts_names_unless_the_person_wrote_them() {
        let mut tools = files();
        tools.push(tool(
            "search",
            json!({"type": "object", "properties": {"query": {"type": "string"}}}),
            true,
        ));
        let avoid = Policy::small_model()
            .decoding(&tools, "Read notes.txt")
            .avoid_in_values;
        assert!(
            ["<content", "<path", "<query"]
                .iter()
                .all(|n| avoid.contains(&n.to_string())),
            "the example's placeholders: {avoid:?}"
        );
        for name in [
            "read_file",
            "readFile",
            "Read file",
            "write-file",
            "my request",
            "My_request",
            "myRequest",
        ] {
            assert!(avoid.contains(&name.to_string()), "{name} in {avoid:?}");
        }
        assert!(
            !avoid.iter().any(|n| n.eq_ignore_ascii_case("search")),
            "a one-word name may be a value: {avoid:?}"
        );
        let theirs = Policy::small_model()
            .decoding(&tools, "Search for my request form")
            .avoid_in_values;
        assert!(
            !theirs.iter().any(|n| n.eq_ignore_ascii_case("my request")),
            "{theirs:?}"
        );
        let written = Policy::small_model()
            .decoding(&tools, "What does Read_File return?")
            .avoid_in_values;
        assert!(!written.contains(&"read_file".to_string()), "{written:?}");
        let off = Policy::small_model()
            .with_rules(&json!({"no_prompt_names_in_values": false}))
            .unwrap();
        // With the rule off only the worked example's placeholders stay
        // barred, as under every policy.
        assert!(
            off.decoding(&tools, "")
                .avoid_in_values
                .iter()
                .all(|v| v.starts_with('<'))
        );
    }

    #[test]
    fn a_question_is_offered_only_tools_that_read() {
        let mut state = PolicyState::default();
        state.observe_tools(&files());
        let (o, fired) = offer(&Policy::small_model(), &state, "What is in notes.txt?");
        let names: Vec<&str> = o.callable.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["read_file"]);
        assert_eq!(o.ranked[0].name, "read_file", "callable tools first");
        assert!(
            fired
                .iter()
                .any(|f| f.rule == Rule::ReadOnlyQuestions && f.detail.contains("write_file"))
        );
        assert!(fired.iter().any(|f| f.rule == Rule::OrderForCalls));
        // A request for a change may write.
        let (o, _) = offer(&Policy::small_model(), &state, "Write hello to notes.txt");
        assert_eq!(o.callable.len(), 2);
        // A verb the tools name asks for a change too.
        let tools = vec![
            tool("renew_loan", json!({"type": "object"}), false),
            tool("list_loans", json!({"type": "object"}), true),
        ];
        state.observe_tools(&tools);
        let o = state.offer(
            &Policy::small_model(),
            tools,
            facts("Could you renew my library book?", true, true, false),
        );
        assert_eq!(o.callable.len(), 2, "renew is the tool's own word");
    }

    fn call(name: &str, arguments: Value) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn a_call_written_in_prose_is_held_to_the_offer() {
        let tools = vec![
            tool(
                "search_books",
                json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
                true,
            ),
            tool(
                "return_book",
                json!({"type": "object", "properties": {"book_id": {"type": "string"}}, "required": ["book_id"]}),
                false,
            ),
            tool(
                "renew_loan",
                json!({"type": "object", "properties": {"book_id": {"type": "string"}}, "required": ["book_id"]}),
                false,
            ),
        ];
        let validators = ValidatorCache::default();
        let mut state = PolicyState::default();
        state.observe_tools(&tools);
        let request = "Please return Stars Over the Desert";
        let o = state.offer(
            &Policy::small_model(),
            tools.clone(),
            facts(request, true, true, true),
        );
        // No id shown yet: the id takers are held, with the reason.
        let (fired, error) = o
            .outside(
                &[call("return_book", json!({"book_id": "b-1"}))],
                &o.callable,
                &validators,
            )
            .expect("an invented id before any search");
        assert_eq!(fired.rule, Rule::CallsWithinOffer);
        assert_eq!(error.code, ToolErrorCode::Unavailable);
        assert!(error.message.contains("find it first"), "{}", error.message);
        assert!(error.message.contains("search_books"), "{}", error.message);
        assert!(
            o.outside(
                &[call("search_books", json!({"query": "stars"}))],
                &o.callable,
                &validators
            )
            .is_none()
        );
        // After the search found b-7, only b-7 may be returned.
        let new = state
            .identifiers
            .add_result(r#"[{"id": "b-7", "title": "Stars Over the Desert"}]"#);
        state.called(
            "search_books",
            &json!({"query": "stars"}),
            "[]",
            new,
            "stars",
        );
        state.step_done();
        state.observe_tools(&tools);
        let o = state.offer(
            &Policy::small_model(),
            tools.clone(),
            facts(request, true, false, true),
        );
        let (_, error) = o
            .outside(
                &[call("return_book", json!({"book_id": "b-4"}))],
                &o.callable,
                &validators,
            )
            .expect("an id no tool returned");
        assert_eq!(error.code, ToolErrorCode::InvalidArguments);
        assert!(
            o.outside(
                &[call("return_book", json!({"book_id": "b-7"}))],
                &o.callable,
                &validators
            )
            .is_none()
        );
        // Numbers are not held: an optional count the person's extra number
        // made required is a nudge, and a call without it stands.
        let cart = vec![tool(
            "add_to_cart",
            json!({"type": "object", "properties": {"book_id": {"type": "string"}, "quantity": {"type": "integer"}}, "required": ["book_id"]}),
            false,
        )];
        state.observe_tools(&cart);
        state.identifiers.add_user_text("Add two of b-7");
        let o2 = state.offer(
            &Policy::small_model(),
            cart.clone(),
            facts("Add two of b-7", true, false, true),
        );
        assert_eq!(
            o2.callable[0].input_schema["required"],
            json!(["book_id", "quantity"]),
            "the nudge this checks is there"
        );
        assert!(
            o2.outside(
                &[call("add_to_cart", json!({"book_id": "b-7"}))],
                &o2.callable,
                &validators
            )
            .is_none()
        );
        // A tool the step did not rank is left to the reference's checks,
        // and with nothing offered there is nothing else to ask for.
        assert!(
            o.outside(&[call("send_mail", json!({}))], &o.callable, &validators)
                .is_none()
        );
        assert!(
            o.outside(
                &[call("return_book", json!({"book_id": "b-4"}))],
                &[],
                &validators
            )
            .is_none()
        );
    }

    #[test]
    fn a_question_is_not_answered_by_a_write_written_in_prose() {
        let mut state = PolicyState::default();
        state.observe_tools(&files());
        let (o, _) = offer(&Policy::small_model(), &state, "What is in notes.txt?");
        let written = call("write_file", json!({"path": "notes.txt", "content": ""}));
        let (_, error) = o
            .outside(
                std::slice::from_ref(&written),
                &o.callable,
                &ValidatorCache::default(),
            )
            .expect("a write for a question");
        assert!(
            error.message.contains("asks for information"),
            "{}",
            error.message
        );
        // The reference holds nothing back.
        let (o, _) = offer(&Policy::reference(), &state, "What is in notes.txt?");
        assert!(o.held.is_empty());
        assert!(
            o.outside(&[written], &o.callable, &ValidatorCache::default())
                .is_none()
        );
    }

    #[test]
    fn answers_lose_the_lines_that_repeat_the_prompt() {
        let prompt = vec![
            PromptMessage {
                role: PromptRole::System,
                content: "You have these tools.\nTo call search_books, reply with:\n{}".into(),
            },
            PromptMessage {
                role: PromptRole::User,
                content: "Which books by Mira Castell do you have?".into(),
            },
            PromptMessage {
                role: PromptRole::Tool,
                content: "The Salt Road, by Mira Castell".into(),
            },
            PromptMessage {
                role: PromptRole::User,
                content: "My request: Which books by Mira Castell do you have?\nDo the next step for it, or answer me if it is done.".into(),
            },
        ];
        let echo = |a: &str| without_prompt_echoes(a, &prompt);
        assert_eq!(
            echo("Do the next step for it, or answer me if it is done.").as_deref(),
            Some("")
        );
        assert_eq!(
            echo("To call search_books, reply with:\nThe library has The Salt Road.").as_deref(),
            Some("The library has The Salt Road.")
        );
        // The error the loop wrote back, in the markup the model wraps it in.
        let mut with_error = prompt.clone();
        with_error.push(PromptMessage {
            role: PromptRole::Tool,
            content: "Error [unavailable]: return_book needs an id. Try again.".into(),
        });
        assert_eq!(
            without_prompt_echoes(
                "```json\n<tool_response>\nError [unavailable]: return_book needs an id. Try again.\n</tool_response>\n```",
                &with_error
            )
            .as_deref(),
            Some("")
        );
        // An answer with something of its own, one that quotes part of a
        // result, a result it repeats whole (another rule's business), and
        // short answers are left alone.
        assert_eq!(echo("The library has The Salt Road by Mira Castell."), None);
        assert_eq!(
            echo("The Salt Road by Mira Castell\nis on the shelf."),
            None
        );
        assert_eq!(echo("Do it."), None);
        // A sentence that holds five words in a row of the loop's own is
        // cut from the line, which keeps the rest.
        assert_eq!(
            echo("The next step for it is to call search_books.").as_deref(),
            Some("")
        );
        assert_eq!(
            echo("The tool failed. Don't say it worked. Call the tool again with fixed arguments, or tell me what went wrong.").as_deref(),
            Some("The tool failed.")
        );
        assert_eq!(echo("The next step is to read the book."), None);
        // The loop's own sentences reworded a little are still its own.
        assert_eq!(
            echo("If the results above answer it, answer me. If something is still to be done, do it.")
                .as_deref(),
            Some("")
        );
        // Its words before a colon are cut; what follows is the model's.
        assert_eq!(
            echo("The results above answer it: The Salt Road is on the shelf.").as_deref(),
            Some("The Salt Road is on the shelf.")
        );
    }

    #[test]
    fn questions_are_told_by_their_form() {
        for q in [
            "When is my library book due back?",
            "By when do I need to call the plumber?",
            "I spent 1250 on rent. How much is that altogether?",
            "What's on my calendar on 2026-03-12?",
            "Are the Ridge hiking boots in stock?",
        ] {
            assert!(is_question(q), "{q}");
        }
        for r in [
            "Could you renew my library book?",
            "The guide is out. Could you reserve the next copy for me?",
            "I need a stove, could you add one to the cart?",
            "Book a table for two",
            "When you can, add milk.",
        ] {
            assert!(!is_question(r), "{r}");
        }
        // A question is offered only what reads, whatever verb it shares.
        let mut state = PolicyState::default();
        let tools = vec![
            tool("return_book", json!({"type": "object"}), false),
            tool("list_loans", json!({"type": "object"}), true),
        ];
        state.observe_tools(&tools);
        let o = state.offer(
            &Policy::small_model(),
            tools.clone(),
            facts("When is my library book due back?", true, true, false),
        );
        let names: Vec<&str> = o.callable.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["list_loans"]);
        assert!(!state.asks_a_change_of("When is my library book due back?", &tools));
    }

    #[test]
    fn a_tool_set_without_annotations_is_not_narrowed_for_questions() {
        let tools: Vec<ToolDefinition> = files()
            .into_iter()
            .map(|mut t| {
                t.annotations.read_only = false;
                t
            })
            .collect();
        let mut state = PolicyState::default();
        state.observe_tools(&tools);
        let o = state.offer(
            &Policy::small_model(),
            tools.clone(),
            facts("What is in notes.txt?", true, true, false),
        );
        assert_eq!(o.callable.len(), 2);
    }

    #[test]
    fn nothing_is_narrowed_without_a_constraint() {
        let mut state = PolicyState::default();
        state.observe_tools(&files());
        let o = state.offer(
            &Policy::small_model(),
            files(),
            facts("What is in notes.txt?", false, true, false),
        );
        let fired = o.fired.clone();
        assert_eq!(o.callable, files());
        assert!(fired.is_empty());
    }

    #[test]
    fn a_lookup_that_found_ids_moves_on_to_the_tools_that_take_them() {
        let tools = vec![
            search_tool(),
            tool(
                "open_product",
                json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
                true,
            ),
        ];
        let policy = Policy::small_model();
        let mut state = PolicyState::default();
        state.observe_tools(&tools);
        let o = state.offer(
            &policy,
            tools.clone(),
            facts("find a tent", true, true, true),
        );
        assert_eq!(
            o.callable.len(),
            1,
            "no id yet: open_product cannot be called"
        );
        let new = state.identifiers.add_result(r#"[{"id": "p-3"}]"#);
        state.called(
            "search",
            &json!({"q": "tent"}),
            "[{\"id\": \"p-3\"}]",
            new,
            "tent",
        );
        state.step_done();
        state.observe_tools(&tools);
        let o = state.offer(
            &policy,
            tools.clone(),
            facts("find a tent", true, false, true),
        );
        let fired = o.fired.clone();
        assert_eq!(o.callable.len(), 1);
        assert_eq!(o.callable[0].name, "open_product");
        assert_eq!(
            o.callable[0].input_schema["properties"]["product_id"]["enum"],
            json!(["p-3"])
        );
        assert!(fired.iter().any(|f| f.rule == Rule::MoveOn));
        assert!(fired.iter().any(|f| f.rule == Rule::GroundIdentifiers));
    }

    /// A lookup that found nothing is not offered again on the next step
    /// either: the same call would give the same nothing.
    #[test]
    fn a_lookup_that_found_nothing_is_not_offered_on_the_next_step() {
        let tools = vec![
            search_tool(),
            tool(
                "add_to_cart",
                json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
                false,
            ),
        ];
        // The request names add_to_cart whole: that rule is not this test's.
        let policy = Policy {
            offer_named_tool: false,
            ..Policy::small_model()
        };
        let mut state = PolicyState::default();
        state.identifiers.add_user_text("Add p-21 to my cart.");
        state.observe_tools(&tools);
        let ask = "Add p-21 to my cart.";
        let o = state.offer(&policy, tools.clone(), facts(ask, true, true, true));
        assert_eq!(o.callable.len(), 2, "{:?}", o.callable);
        state.called("search", &json!({"q": "p-21"}), "[]", 0, "p-21");
        state.step_done();
        state.observe_tools(&tools);
        let o = state.offer(&policy, tools.clone(), facts(ask, true, false, true));
        let names: Vec<&str> = o.callable.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["add_to_cart"]);
        assert!(
            o.fired
                .iter()
                .any(|f| f.rule == Rule::MoveOn && f.detail.contains("search"))
        );
        // One step later it is offered again.
        state.step_done();
        let o = state.offer(&policy, tools.clone(), facts(ask, true, false, true));
        assert_eq!(o.callable.len(), 2);
    }

    #[test]
    fn a_delegation_after_ids_were_found_must_name_one() {
        let delegate = tool(
            "cart_agent",
            json!({"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}),
            false,
        );
        let subs = vec!["cart_agent".to_string()];
        let mut state = PolicyState::default();
        state.observe_tools(std::slice::from_ref(&delegate));
        let facts = |first_step| StepFacts {
            request: "Find a backpack and add it to my cart",
            constrained: true,
            first_step,
            has_phrases: false,
            sub_agents: &subs,
        };
        // The id pattern is what grounds a task when the person's phrases
        // do not (`ground_tasks`, tested on its own).
        let policy = Policy {
            ground_tasks: false,
            ..Policy::small_model()
        };
        let o = state.offer(&policy, vec![delegate.clone()], facts(true));
        assert_eq!(
            o.callable,
            vec![delegate.clone()],
            "no id yet: the task is free"
        );
        state
            .identifiers
            .add_result("The Summit 30L Backpack (p-17) costs $89.");
        let o = state.offer(&policy, vec![delegate.clone()], facts(false));
        assert_eq!(
            o.callable[0].input_schema["properties"]["task"]["pattern"],
            json!("(p\\-17)"),
            "an id-like id is preferred over words with digits"
        );
        assert!(o.fired.iter().any(|f| f.rule == Rule::GroundDelegation));
        let o = state.offer(&Policy::reference(), vec![delegate.clone()], facts(false));
        assert_eq!(o.callable, vec![delegate]);
    }

    #[test]
    fn a_tool_the_request_names_whole_is_offered_alone() {
        let id = json!({"type": "object", "properties": {"book_id": {"type": "string"}}, "required": ["book_id"]});
        let renew = tool("renew_loan", id.clone(), false);
        let ret = tool("return_book", id.clone(), false);
        let get = tool("get_book", id, true);
        let all = || vec![ret.clone(), renew.clone(), get.clone()];
        let request = "Can you renew my loan of Stars Over the Desert?";
        let mut state = PolicyState::default();
        state.observe_tools(&all());
        state.identifiers.add_user_text(request);
        state
            .identifiers
            .add_result(r#"[{"id": "b-7", "title": "Stars Over the Desert"}]"#);
        let facts = StepFacts {
            request,
            constrained: true,
            first_step: false,
            has_phrases: false,
            sub_agents: &[],
        };
        let o = state.offer(&Policy::small_model(), all(), facts);
        let names: Vec<&str> = o.callable.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["renew_loan"]);
        assert!(o.fired.iter().any(|f| f.rule == Rule::OfferNamedTool));
        assert!(
            o.held
                .contains(&("return_book".to_string(), Rule::OfferNamedTool))
        );
        // Once called, it narrows nothing; the reference never does.
        state.called("renew_loan", &json!({"book_id": "b-7"}), "{}", 0, request);
        state.step_done();
        let o = state.offer(&Policy::small_model(), all(), facts);
        assert!(o.fired.iter().all(|f| f.rule != Rule::OfferNamedTool));
        let o = state.offer(&Policy::reference(), all(), facts);
        assert_eq!(o.callable.len(), 3);
        // All of a name's words but one name it too; a name of one word,
        // or one word of two, is too weak a sign.
        let logging = tool("toggle-simulated-logging", json!({}), false);
        assert!(names_whole_tool("Turn on the simulated logging", &logging));
        assert!(!names_whole_tool("Turn on the logging", &logging));
        assert!(!names_whole_tool(
            "get the book",
            &tool("get", json!({}), true)
        ));
        assert!(!names_whole_tool(
            "add a tent",
            &tool("add_to_cart", json!({}), false)
        ));
    }

    #[test]
    fn a_tool_that_needs_a_number_nobody_gave_is_not_named() {
        let cell = tool(
            "getCellType",
            json!({"type": "object", "properties": {
                "nucleus_count": {"type": "integer"}, "organism_type": {"type": "string"}},
                "required": ["nucleus_count", "organism_type"]}),
            true,
        );
        let named = |request: &str| {
            let mut ids = Identifiers::new();
            ids.add_user_text(request);
            names_a_tool(request, std::slice::from_ref(&cell), &ids, &[])
        };
        assert!(!named(
            "What type of blood cells are responsible for clotting?"
        ));
        assert!(named("What type of cell has 2 nuclei in a fungus?"));
    }

    #[test]
    fn a_call_that_repeats_a_value_or_its_own_name_looks_made_up() {
        let made_up = |arguments: Value, request: &str| {
            made_up_value(&arguments, &json!({"type": "object"}), request)
        };
        // One phrase for two arguments, written once.
        assert!(
            made_up(
                json!({"game_name": "Flappy Bird", "platform": "flappy bird "}),
                "What's the lowest score in the Flappy Bird game?"
            )
            .is_some()
        );
        assert!(made_up(json!({"from": "Paris", "to": "Paris"}), "Paris to Paris").is_none());
        // Arguments whose schema fixes their values may share one.
        let event = json!({"type": "object", "properties": {
            "start": {"type": "string", "format": "date"},
            "end": {"type": "string", "format": "date"},
            "status": {"type": "string", "enum": ["all", "open"]},
            "category": {"type": "string", "enum": ["all", "work"]}}});
        assert!(
            made_up_value(
                &json!({"start": "2026-03-12", "end": "2026-03-12", "status": "all", "category": "all"}),
                &event,
                "Block out 2026-03-12"
            )
            .is_none()
        );
        // A list that repeats a written number more often than written,
        // at any depth; floats that are whole count.
        let flows = "cash flows of -$100, $40, $60, $80, $120?";
        assert!(
            made_up(
                json!({"cash_flows": [120, 120, 120, 120], "guess": 120}),
                flows
            )
            .is_some()
        );
        assert!(made_up(json!({"project": {"flows": [120.0, 120.0]}}), flows).is_some());
        assert!(made_up(json!({"cash_flows": [-100, 40, 60, 80, 120]}), flows).is_none());
        assert!(made_up(json!({"sides": [5, 5]}), "A rectangle of 5 by 5").is_none());
        // Numbers nobody wrote may repeat: a polynomial's zero coefficients.
        assert!(made_up(json!({"coefficients": [1, 0, 0, 2]}), "Roots of x^3 + 2").is_none());
        // Arguments of their own may share one: a square's two sides.
        assert!(made_up(json!({"a": 5, "b": 5}), "A square with sides of 5").is_none());
        // A value that is only its argument's name, unless quoted.
        assert!(
            made_up(
                json!({"case_id": "2020", "case_year": "year"}),
                "cases of 2020"
            )
            .is_some()
        );
        assert!(made_up(json!({"caseYear": "Years"}), "cases").is_some());
        assert!(made_up(json!({"new_name": "name"}), "Rename the field to 'name'").is_none());
        assert!(made_up(json!({"case_year": "2020"}), "cases of 2020").is_none());
        assert!(
            made_up(
                json!({"city": "Paris", "country": "France"}),
                "Paris, France"
            )
            .is_none()
        );
    }

    #[test]
    fn an_answer_tells_of_a_result_by_its_values_not_its_keys() {
        let todos = Found {
            output: r#"[{"id": "t-2", "title": "Call the plumber", "due": "2026-03-12", "done": false}]"#
                .into(),
            named: String::new(),
        };
        let request = "When is the plumber call due?";
        assert!(tells_of("It is due on 2026-03-12.", &todos, request));
        assert!(!tells_of(
            "If it is done, I will answer your next question.",
            &todos,
            request
        ));
        let note = Found {
            output: "Wifi network: Larkspur\nWifi password: teal-otter-42\n".into(),
            named: "house-notes.txt".into(),
        };
        let request = "I forgot the wifi password";
        assert!(tells_of("It is teal-otter-42.", &note, request));
        assert!(!tells_of(
            "I can't check the Larkspur network.",
            &note,
            request
        ));
    }

    #[test]
    fn a_task_is_a_phrase_of_the_request_and_carries_the_newest_answer() {
        let delegate = tool(
            "todo_agent",
            json!({"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}),
            false,
        );
        let files = tool(
            "files_agent",
            json!({"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}),
            false,
        );
        let (mut delegate, mut files) = (delegate, files);
        delegate.description = "Reads and changes the person's to-do list.".into();
        files.description = "Reads and writes the person's files (paths like notes.txt).".into();
        let subs = vec!["todo_agent".to_string(), "files_agent".to_string()];
        let request = "Read meeting.txt and add its action item to my to-do list.";
        let mut state = PolicyState::default();
        state.observe_sub_agents(&subs);
        state.observe_tools(&[delegate.clone(), files.clone()]);
        let facts = |first_step| StepFacts {
            request,
            constrained: true,
            first_step,
            has_phrases: false,
            sub_agents: &subs,
        };
        let tasks = |o: &Offer, name: &str| -> Vec<Value> {
            o.callable
                .iter()
                .find(|t| t.name == name)
                .map(|t| {
                    t.input_schema["properties"]["task"]["enum"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .unwrap_or_default()
        };
        let both = || vec![files.clone(), delegate.clone()];
        let answered = |state: &mut PolicyState, name: &str, task: &str, answer: &str| {
            state.called(name, &json!({ "task": task }), answer, 0, request);
            state.step_done();
        };
        // First the first part of a request of several parts.
        let o = state.offer(&Policy::small_model(), both(), facts(true));
        assert_eq!(tasks(&o, "files_agent"), vec![json!("Read meeting.txt")]);
        assert!(
            o.held
                .contains(&("todo_agent".to_string(), Rule::GroundTasks))
        );
        assert!(o.fired.iter().any(|f| f.rule == Rule::GroundTasks));
        // The helper answered: the next part, with the lines of its answer
        // that the part asks about.
        answered(
            &mut state,
            "files_agent",
            "Read meeting.txt",
            "Minutes of the March meeting\nAction item: order new chairs\n",
        );
        let o = state.offer(&Policy::small_model(), both(), facts(false));
        let handed = "add its action item to my to-do list: Action item: order new chairs";
        assert_eq!(tasks(&o, "todo_agent"), vec![json!(handed)]);
        // Each part goes to the helper it speaks of.
        assert!(o.callable.iter().all(|t| t.name == "todo_agent"));
        assert!(
            o.held
                .contains(&("files_agent".to_string(), Rule::GroundTasks))
        );
        // Every part handed on: no more delegations; the reference never narrows.
        answered(
            &mut state,
            "todo_agent",
            handed,
            "Added t-5 order new chairs",
        );
        let o = state.offer(&Policy::small_model(), both(), facts(false));
        assert!(o.callable.is_empty(), "{:?}", o.callable);
        let o = state.offer(&Policy::reference(), both(), facts(false));
        assert_eq!(o.callable, both());
        // A part that speaks of no helper is no task of its own.
        let request = "Ask around and tell me what's still open on my to-do list.";
        let mut state = PolicyState::default();
        state.observe_sub_agents(&subs);
        state.observe_tools(&both());
        let o = state.offer(
            &Policy::small_model(),
            both(),
            StepFacts {
                request,
                ..facts(true)
            },
        );
        assert_eq!(
            tasks(&o, "todo_agent"),
            vec![json!("tell me what's still open on my to-do list")]
        );
    }

    #[test]
    fn free_strings_are_biased_toward_the_evidence_never_held_to_it() {
        let search = tool(
            "search_books",
            json!({"type": "object", "properties": {
                "query": {"type": "string"},
                "sort": {"type": "string", "enum": ["title", "year"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}}
            }, "required": ["query"]}),
            true,
        );
        let clock = tool(
            "get_current_time",
            json!({"type": "object", "properties": {
                "timezone": {"type": "string", "description": "IANA timezone name, e.g. 'America/New_York'"}
            }, "required": ["timezone"]}),
            true,
        );
        let request =
            "I'd like to borrow Learning Rust the Slow Way. And what time is it in Tokyo?";
        let mut state = PolicyState::default();
        state.observe_tools(&[search.clone(), clock.clone()]);
        state.identifiers.add_user_text(request);
        state
            .identifiers
            .add_stated(
                "The repository is at /srv/git/notes.git; the branch is 'main'; commits have ids like c-42.",
            );
        let facts = StepFacts {
            request,
            constrained: true,
            first_step: true,
            has_phrases: true,
            sub_agents: &[],
        };
        let o = state.offer(
            &Policy::small_model(),
            vec![search.clone(), clock.clone()],
            facts,
        );
        // Nothing a tool needs is forbidden: `Asia/Tokyo`, which nobody
        // wrote, stays writable, as does any query; lists of values keep
        // their own.
        assert_eq!(o.callable, vec![search.clone(), clock.clone()]);
        assert!(o.short_of_strings.is_empty(), "{:?}", o.short_of_strings);
        // What the run has seen is the evidence the copy bias reads: the
        // person's phrases, what the instructions state.
        let evidence = state
            .identifiers
            .string_choices(std::slice::from_ref(&search));
        for want in [
            "Learning Rust the Slow Way",
            "Tokyo",
            "/srv/git/notes.git",
            "main",
        ] {
            assert!(evidence.contains(&want.to_string()), "{want}: {evidence:?}");
        }
        // An id the instructions give is an example of the form, no value.
        assert!(!evidence.contains(&"c-42".to_string()), "{evidence:?}");
        // A result's values and their parts are evidence too.
        state
            .identifiers
            .add_result("Sam Ortiz: 3 Harbour Road, Eastfield");
        let evidence = state
            .identifiers
            .string_choices(std::slice::from_ref(&search));
        for piece in ["3 Harbour Road", "Eastfield"] {
            assert!(
                evidence.contains(&piece.to_string()),
                "{piece}: {evidence:?}"
            );
        }
        // With no evidence at all, a tool that requires a free string is
        // short of it (a call would make it up), and still offered whole.
        let mut bare = PolicyState::default();
        bare.observe_tools(std::slice::from_ref(&clock));
        let o = bare.offer(&Policy::small_model(), vec![clock.clone()], facts);
        assert_eq!(o.short_of_strings, vec!["get_current_time".to_string()]);
        assert_eq!(o.callable, vec![clock]);
    }

    #[test]
    fn change_requests_are_told_from_questions() {
        for q in ["What is in notes.txt?", "Show me my cart", "list the files"] {
            assert!(!asks_for_change(q), "{q}");
        }
        for c in [
            "Write hello to a.txt",
            "Add p-17 to my cart",
            "delete old.log",
        ] {
            assert!(asks_for_change(c), "{c}");
        }
    }

    #[test]
    fn rules_are_set_by_name_and_typos_are_refused() {
        let p = Policy::small_model()
            .with_rules(&json!({"copy_bias": 0.0, "named_tool_retry": null}))
            .unwrap();
        assert_eq!(p.copy_bias, 0.0);
        assert_eq!(p.named_tool_retry, None);
        assert!(p.ground_identifiers, "the other rules keep their values");
        let e = Policy::small_model()
            .with_rules(&json!({"ground_identifers": false}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown rule `ground_identifers`"), "{e}");
        assert!(e.contains("`ground_identifiers`"), "{e}");
        let e = Policy::small_model()
            .with_rules(&json!({"move_on": "yes"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected a boolean"), "{e}");
    }

    #[test]
    fn policies_are_chosen_by_name_and_measurement() {
        assert_eq!(PolicyName::parse("reference"), Some(PolicyName::Reference));
        assert_eq!(PolicyName::parse("small"), None);
        for name in [
            "SmolLM2-135M-Instruct",
            "HuggingFaceTB/SmolLM2-135M-Instruct@main",
            "smollm2-135m-instruct.Q4_1.gguf",
        ] {
            assert_eq!(
                Policy::for_model(name).base,
                PolicyName::SmallModel,
                "{name}"
            );
        }
        assert_eq!(
            Policy::for_model("Qwen2.5-Coder-0.5B-Instruct").base,
            PolicyName::SmallModel
        );
        // Unmeasured, whatever its size: the plain loop.
        for name in [
            "tiny-random-llama",
            "Qwen2.5-7B-Instruct",
            "SmolLM2-360M-Instruct",
            "",
        ] {
            assert_eq!(
                Policy::for_model(name).base,
                PolicyName::Reference,
                "{name}"
            );
        }
    }

    #[test]
    fn a_lookup_answers_when_its_result_speaks_of_the_request() {
        let request = "Which tents do you have?";
        let mut state = PolicyState::default();
        state.observe_tools(&[search_tool()]);
        let found = r#"[{"id": "p-4", "title": "Trail Tent"}]"#;
        state.called("search", &json!({"q": "tents"}), found, 1, request);
        state.step_done();
        assert_eq!(
            state.answered.as_ref().map(|a| a.output.as_str()),
            Some(found)
        );
        state.called("search", &json!({"q": "tents"}), "No results.", 0, request);
        state.step_done();
        assert_eq!(state.answered, None, "nothing of the request in it");
        // A lookup made with the person's words that found something
        // answered, though its result does not repeat them.
        let request = "What's the weather like in Chicago right now?";
        let weather = r#"{"temperature": 22.5, "conditions": "Partly cloudy"}"#;
        state.called("search", &json!({"q": "Chicago"}), weather, 0, request);
        state.step_done();
        assert_eq!(
            state.answered.as_ref().map(|a| a.output.as_str()),
            Some(weather)
        );
        state.called("search", &json!({"q": "Chicago"}), "[]", 0, request);
        state.step_done();
        assert_eq!(state.answered, None, "it found nothing");
    }

    /// A fresh state that has seen `shown`, for the changes-done tests.
    fn seen(shown: &[ToolDefinition]) -> PolicyState {
        let mut state = PolicyState::default();
        state.observe_tools(shown);
        state
    }

    #[test]
    fn a_verb_of_change_no_tool_is_named_by_is_made_by_any_change() {
        let change = |name: &str| tool(name, json!({"type": "object", "properties": {}}), false);
        let shown = [change("move_file"), change("write_file"), search_tool()];
        let mut state = seen(&shown);
        let request = "Please rename draft.txt to plan-final.txt";
        assert!(!state.changes_done(request, &shown), "nothing made yet");
        state.called("move_file", &json!({}), "Moved.", 0, request);
        assert!(
            state.changes_done(request, &shown),
            "the move was the rename"
        );
        // A verb that names a shown tool still needs that tool.
        assert!(!state.changes_done("Rename draft.txt and write a note", &shown));
        state.called("write_file", &json!({}), "Written.", 0, request);
        assert!(state.changes_done("Rename draft.txt and write a note", &shown));
    }

    #[test]
    fn changes_are_done_when_every_verb_of_change_was_made() {
        let change = |name: &str| tool(name, json!({"type": "object", "properties": {}}), false);
        let shown = [change("cancel_event"), change("add_event"), search_tool()];
        let mut state = seen(&shown);
        let request = "Cancel the budget review and add a dentist visit";
        assert!(!state.changes_done(request, &shown), "nothing made yet");
        state.called("cancel_event", &json!({}), "Cancelled.", 0, request);
        assert!(
            !state.changes_done(request, &shown),
            "the add is still owed"
        );
        state.called("add_event", &json!({}), "Added.", 0, request);
        assert!(state.changes_done(request, &shown));
        assert!(state.changes_done("Cancel the budget review", &shown));
        // A quoted title's verbs are what to write.
        let mut added = seen(&shown);
        let request = "Add 'cancel the gym' to my calendar";
        added.called("add_event", &json!({}), "Added.", 0, request);
        assert!(added.changes_done(request, &shown));
        assert!(!added.changes_done("Add the gym and cancel yoga", &shown));
        assert_eq!(
            without_quotes("Add 'book a table' and \"buy milk\" now"),
            "Add  and  now"
        );
        assert_eq!(
            without_quotes("What's on? It's fine"),
            "What's on? It's fine"
        );
    }
}
