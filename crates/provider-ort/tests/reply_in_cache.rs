//! A reply fed back in the history is served from the KV cache in the ids
//! the model wrote it in, and a history whose text differs from the reply
//! falls back to the prompt's own tokenization. Tiny random-weight model:
//! its replies are token soup, which the tokenizer almost never writes the
//! way the model did (the case this is for).

mod common;

use common::{options, tiny_model};
use tokio_util::sync::CancellationToken;
use wma_agent::{GenerateRequest, Generation, PromptMessage, PromptRole, Provider};
use wma_provider_ort::{OrtProvider, OrtProviderOptions, common_prefix};

fn provider(options: OrtProviderOptions) -> OrtProvider {
    OrtProvider::load(options).expect("load the tiny model")
}

fn tiny_provider() -> OrtProvider {
    provider(options(&tiny_model()).with_max_new_tokens(12))
}

fn turns(turns: &[(PromptRole, &str)]) -> GenerateRequest {
    GenerateRequest {
        messages: turns
            .iter()
            .map(|(role, text)| PromptMessage::new(*role, *text))
            .collect(),
        ..GenerateRequest::default()
    }
}

async fn generate(p: &OrtProvider, session: &str, request: &GenerateRequest) -> Generation {
    p.generate_in_session(session, request.clone(), CancellationToken::new())
        .await
        .expect("generate")
}

/// The tokens the model holds, the prompt's first.
fn cached(p: &OrtProvider) -> Vec<u32> {
    p.with_model(|m| m.cached_ids().to_vec()).unwrap()
}

const FIRST: &str = "Find a tent for two people.";
const NEXT: &str = "A cheaper one, please.";

/// The first step, and what the model was fed for its reply: the ids after
/// the prompt in the cache (every generated token but the last).
async fn first_step(p: &OrtProvider, session: &str) -> (GenerateRequest, Generation, Vec<u32>) {
    let request = turns(&[(PromptRole::User, FIRST)]);
    let reply = generate(p, session, &request).await;
    let prompt = p.encode_prompt(&request).unwrap();
    let cache = cached(p);
    assert!(cache.starts_with(&prompt));
    (request, reply, cache)
}

fn second_request(reply: &str) -> GenerateRequest {
    turns(&[
        (PromptRole::User, FIRST),
        (PromptRole::Assistant, reply),
        (PromptRole::User, NEXT),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_fed_back_is_served_from_the_cache_to_its_end() {
    let p = tiny_provider();
    let (_, reply, after_first) = first_step(&p, "agent#1").await;
    let output = reply.output_tokens.unwrap() as usize;
    assert!(output >= 2, "a reply of several tokens: {reply:?}");
    let next = second_request(&reply.text);
    // The case at hand: tokenized from text, the second prompt leaves the
    // model's own ids inside the reply.
    let own = p.encode_prompt(&next).unwrap();
    assert!(
        common_prefix(&own, &after_first) < after_first.len(),
        "the tokenizer wrote the reply as the model did; this test shows nothing: {:?}",
        reply.text
    );

    let second = generate(&p, "agent#1", &next).await;
    assert_eq!(
        second.cached_tokens.unwrap() as usize,
        after_first.len(),
        "every token up to the end of the reply comes from the cache"
    );
    // The ids fed spell the prompt, with its control tokens where its own
    // tokenization has them.
    let fed = &cached(&p)[..second.input_tokens.unwrap() as usize];
    let encoder = p.prompt_encoder().unwrap();
    assert!(encoder.same_text(fed, &own).unwrap());
    assert_eq!(p.decode(fed).unwrap(), p.decode(&own).unwrap());

    // A third step goes on from the second's reply in the same way.
    let mut third = next.clone();
    third.messages.push(PromptMessage::new(
        PromptRole::Assistant,
        second.text.clone(),
    ));
    third
        .messages
        .push(PromptMessage::new(PromptRole::User, "And a stove?"));
    let held = cached(&p).len();
    let third_reply = generate(&p, "agent#1", &third).await;
    assert_eq!(third_reply.cached_tokens.unwrap() as usize, held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_unlike_the_reply_is_computed_as_a_fresh_session_would() {
    let p = tiny_provider();
    let (request, reply, _) = first_step(&p, "agent#1").await;
    let first_prompt = p.encode_prompt(&request).unwrap().len();
    // The loop wrote something else in the reply's place.
    let next = second_request("I will look for tents.");
    assert_ne!(reply.text, "I will look for tents.");
    let reused = generate(&p, "agent#1", &next).await;
    let own = p.encode_prompt(&next).unwrap();
    assert_eq!(
        &cached(&p)[..own.len()],
        &own[..],
        "the prompt's own ids are fed"
    );
    let cached_tokens = reused.cached_tokens.unwrap() as usize;
    assert!(
        cached_tokens <= first_prompt,
        "nothing of the reply is taken"
    );
    assert!(cached_tokens > 0, "the first prompt still is");

    let fresh = generate(&tiny_provider(), "agent#1", &next).await;
    assert_eq!(fresh.cached_tokens, Some(0));
    assert_eq!(
        reused.text, fresh.text,
        "reuse gives what recomputing gives"
    );
    assert_eq!(reused.output_tokens, fresh.output_tokens);
    assert_eq!(reused.input_tokens, fresh.input_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_that_leaves_the_reply_midway_keeps_the_part_it_repeats() {
    let p = tiny_provider();
    let (request, reply, after_first) = first_step(&p, "agent#1").await;
    let first_prompt = p.encode_prompt(&request).unwrap().len();
    // The reply's first characters, then text of the loop's own.
    let cut = reply
        .text
        .char_indices()
        .map(|(i, _)| i)
        .nth(reply.text.chars().count() / 2)
        .unwrap();
    let written = format!("{} (written by the loop)", &reply.text[..cut]);
    let next = second_request(&written);
    let second = generate(&p, "agent#1", &next).await;
    let own = p.encode_prompt(&next).unwrap();
    let fed = &cached(&p)[..second.input_tokens.unwrap() as usize];
    assert!(
        p.prompt_encoder().unwrap().same_text(fed, &own).unwrap(),
        "the ids fed spell the prompt"
    );
    assert_eq!(p.decode(fed).unwrap(), p.decode(&own).unwrap());
    // The model's tokens whose text the history repeats.
    let generated = &after_first[first_prompt..];
    let repeated = (0..=generated.len())
        .rev()
        .find(|&k| written.starts_with(&p.decode(&generated[..k]).unwrap()))
        .unwrap();
    assert!(
        repeated >= 1,
        "the cut leaves a token of the reply: {written:?}"
    );
    assert!(
        second.cached_tokens.unwrap() as usize >= first_prompt + repeated,
        "the reply's tokens that the history repeats come from the cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_serves_its_own_reply() {
    let p = tiny_provider();
    let (_, reply_a, held_a) = first_step(&p, "parent#1").await;
    // Another run in between, with a prompt of its own.
    let other = turns(&[(PromptRole::User, "Show me my cart.")]);
    let reply_b = generate(&p, "helper#1", &other).await;
    let held_b = cached(&p);

    let second_a = generate(&p, "parent#1", &second_request(&reply_a.text)).await;
    assert_eq!(second_a.cached_tokens.unwrap() as usize, held_a.len());

    let mut next_b = other.clone();
    next_b.messages.push(PromptMessage::new(
        PromptRole::Assistant,
        reply_b.text.clone(),
    ));
    next_b
        .messages
        .push(PromptMessage::new(PromptRole::User, NEXT));
    let second_b = generate(&p, "helper#1", &next_b).await;
    assert_eq!(second_b.cached_tokens.unwrap() as usize, held_b.len());
}

#[test]
fn same_text_tells_a_control_token_from_its_spelling() {
    let p = provider(options(&tiny_model()));
    let encoder = p.prompt_encoder().unwrap();
    let end = p.encode("<|im_end|>").unwrap();
    assert_eq!(end.len(), 1, "one control token");
    let spelled = encoder.encode_plain("<|im_end|>").unwrap();
    assert!(spelled.len() > 1);
    let hi = p.encode("Hi").unwrap();
    let with_control = [hi.clone(), end].concat();
    let with_spelling = [hi.clone(), spelled].concat();
    assert_eq!(
        p.decode(&with_control).unwrap(),
        p.decode(&with_spelling).unwrap()
    );
    assert!(!encoder.same_text(&with_control, &with_spelling).unwrap());

    // The same text in other pieces is the same text.
    let word = p.encode("tent").unwrap();
    let pieces: Vec<u32> = "tent"
        .chars()
        .flat_map(|c| p.encode(&c.to_string()).unwrap())
        .collect();
    assert_ne!(word, pieces);
    assert!(encoder.same_text(&word, &pieces).unwrap());
    assert!(
        !encoder
            .same_text(&word, &p.encode("tend").unwrap())
            .unwrap()
    );
}
