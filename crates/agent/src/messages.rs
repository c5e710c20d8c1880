//! Every sentence the loop itself says, to the person or to the model, in one
//! place, so that tests, docs and translations refer to the same words.

/// The prompt does not fit even with one tool and only the newest user turn.
pub const TOO_LONG: &str =
    "This request is too long for the on-device model. Shorten it, or start a new conversation.";

/// A generation ran past the step timeout.
pub const TIMEOUT: &str =
    "The on-device model took too long. Try again, or ask for something smaller.";

/// Prefix of the message for a provider failure; the provider's error follows.
pub const FAILED_PREFIX: &str = "The on-device model failed: ";

/// The second bad reply in a step.
pub const APOLOGY: &str = "Sorry, I could not make a valid tool call for that. Please rephrase your request, or do it in smaller parts.";

/// The model's reply was nothing but the loop's own words, and no result
/// was found to tell of.
pub const NO_ANSWER: &str = "I could not work out an answer to that. Please rephrase your request.";

/// The model's reply was nothing but the loop's own words after a call
/// failed: the failure is what the person needs to know.
pub fn not_done(failure: &str) -> String {
    format!("I could not do that. {}", last_call_failed(failure))
}

/// The call a run stopped on kept failing: said after what the run did
/// before it, which may have been what the person asked for.
pub fn last_call_failed(failure: &str) -> String {
    format!("The last call failed: {failure}")
}

/// Said after an answer that passes over the last failed call, even after
/// the "Don't say it worked" correction: the answer is not what the tools
/// did.
pub fn ignored_failure(failure: &str) -> String {
    format!("Note: the last call failed, so this is not what the tools did: {failure}")
}

/// Loop detection's second hit.
pub const CIRCLES: &str = "I stopped because I was going in circles. Try rephrasing your request, or do one part at a time.";

/// The run reached its step limit.
pub fn max_steps(steps: u32) -> String {
    format!(
        "I stopped after {steps} steps without finishing. Ask me to continue, or make the request more specific."
    )
}

/// The label the loop puts before the person's request when it restates it.
/// It is the loop's word, not the person's: a value of a constrained call
/// may not begin with it (see `Policy::no_prompt_names_in_values`).
pub const REQUEST_LABEL: &str = "My request";

/// The person's request, restated after a step so a small model continues it
/// instead of echoing the last result.
pub fn restate(request: &str) -> String {
    format!("{REQUEST_LABEL}: {request}\nDo the next step for it, or answer me if it is done.")
}

/// The person's request, restated after a step whose every call was a
/// lookup that succeeded: what was looked up is in front of the model, so
/// the turn asks for the answer first. "Do the next step" after a lookup
/// had a 0.5B model announce a next step ("The next step for it is to call
/// …") instead of answering from the result.
pub fn restate_after_lookup(request: &str) -> String {
    format!(
        "{REQUEST_LABEL}: {request}\nIf the results above answer it, answer me from them. If something is still to be done, do it."
    )
}

/// The turn added when a run resumes after a finished call.
pub fn resume(request: &str) -> String {
    format!("Continue with the next step for my request: {request}")
}

/// Correction: a plain reply that ignores the last failed call.
pub fn dont_say_it_worked(failure: &str) -> String {
    format!(
        "{failure}\nThat call failed. Don't say it worked. Call the tool again with fixed arguments, or tell me what went wrong."
    )
}

/// Correction: a reply that tells the person to use a tool the agent has.
/// The request is restated last, on a line of its own, so the words the call
/// needs (what to search for, which item) are the freshest in the prompt and
/// not the tool's name; without a label, since behind "My request:" the
/// default model searched for "my request".
pub fn call_now(request: &str) -> String {
    format!(
        "Don't tell me to do it: the tool is right here, so you do it. Call now. Reply with only the tool call.\n{request}"
    )
}

/// Correction under constraints: a prose reply, with nothing called yet, to
/// a request a tool plainly serves. The request is its last line, as in
/// [`call_now`].
pub fn use_the_tool(request: &str) -> String {
    format!(
        "A tool here does this, so do it: call it now. Reply with only the tool call.\n{request}"
    )
}

/// Repair: suffix of the tool error that sends a bad call back.
pub const TRY_AGAIN: &str = "Try again.";

/// Repair: the reply was empty.
pub const EMPTY_REPLY: &str = "the reply was empty; reply with a tool call or an answer";

/// Loop detection's first hit, appended to the repeated call's result.
pub fn repeated_call(tool: &str) -> String {
    format!(
        "Note: you already called {tool} with these arguments and got this same result. Do not call it again: use the result, or do something else."
    )
}

/// The sentences the loop itself writes to the model in its turns (the
/// restatements and corrections, without the request they carry): an
/// answer that is one of them, even reworded a little, is no answer.
pub(crate) fn own_sentences() -> Vec<String> {
    let templates = [
        restate(""),
        restate_after_lookup(""),
        resume(""),
        dont_say_it_worked(""),
        call_now(""),
        use_the_tool(""),
        repeated_call(""),
    ];
    let mut out: Vec<String> = Vec::new();
    for template in templates {
        for sentence in template.split(['.', '\n', ':']) {
            let sentence = sentence.trim();
            if sentence.split_whitespace().count() >= 3 && !out.iter().any(|s| s == sentence) {
                out.push(sentence.to_string());
            }
        }
    }
    out
}
