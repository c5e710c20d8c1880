//! The served-model provider: a [`Provider`] for OpenAI-compatible
//! chat-completion servers (llama.cpp's server, Ollama, vLLM).
//!
//! [`OpenAiProvider`] sends the loop's prompt to `POST {url}/v1/chat/completions`
//! and hands the loop back text it reads like an on-device model's reply:
//!
//! - **Tools.** Where the model's chat template takes tools (the server
//!   says so in llama.cpp's `/props`; assumed elsewhere) the shown tools go
//!   in the request's `tools` and the server's template renders them; the calls the server returns in `tool_calls` are written
//!   as the loop's JSON call format (`{"name": ..., "arguments": ...}`, one
//!   per line) after the message's text, so the loop parses, validates,
//!   corrects and repairs them exactly as it does a local model's. Earlier
//!   calls in the history go back as `tool_calls` with ids, and their
//!   results as `tool` messages answering them. Where the template takes
//!   none (the default model's), or [`OpenAiOptions::tools_inline`] says
//!   so, the loop writes the tools into the system prompt itself, as for
//!   an on-device model, and the server sees plain chat.
//! - **Constraints** ([`Provider::supports_constraints`] is true) go in
//!   the fields the server reads ([`Dialect`], [`OpenAiOptions::dialect`];
//!   by default found in `prepare`: llama.cpp when `/props` answers, vLLM
//!   when `/v1/models` says `owned_by: "vllm"`, else the OpenAI API's).
//!   "Text or calls" (a step's first attempt) is a GBNF grammar of prose,
//!   or calls in the loop's JSON call format to the offered tools with
//!   arguments following their schemas as far as GBNF can say them
//!   (llama.cpp's `grammar`, vLLM's `guided_grammar`), when the tools are
//!   in the prompt and the calls come back as text. "Calls only" (the
//!   call-now correction and the repair retry) and a JSON-schema
//!   constraint are a JSON schema (llama.cpp's `json_schema`, vLLM's
//!   `guided_json`, else `response_format`): one call in the loop's JSON
//!   call format, which servers decode under a grammar whatever the
//!   template knows of tools (llama.cpp drops `tool_choice: "required"`
//!   for a template without tools). A constraint the server cannot take
//!   goes unsent, noted once in the log (tracing, `info`): "text or
//!   calls" to a server that takes no grammar, or beside tools in the
//!   request (llama.cpp refuses a grammar there; its own tool calling
//!   decodes the calls), and an llguidance grammar anywhere. The policy's
//!   [`Decoding`](wma_agent::Decoding) bounds that a grammar can hold
//!   (calls per reply, one tool per reply, string and array lengths) are
//!   in the grammar; its pulls on the model's choices (copy bias, call
//!   threshold) act on the model's probabilities token by token and are
//!   not sent. A "text or calls" request with a grammar also asks for the
//!   first token's 20 likeliest alternatives (`logprobs`,
//!   `top_logprobs`): the mass of those that open a call (`{`) is the
//!   generation's `call_probability`, which the loop weighs before it
//!   corrects a prose reply into a call (a lower bound: tokens outside the
//!   twenty count as no call).
//! - **Usage and timings**: `usage` (prompt, completion and cached tokens)
//!   and llama.cpp's `timings` (`prompt_ms` is the time to the first token,
//!   `cache_n` the cached prompt tokens).
//! - **Cancellation**: replies are streamed (server-sent events) and the
//!   stream is raced against the token; when the token wins, the request
//!   is dropped, which closes its connection, and the server stops
//!   generating when it writes the next token to nobody (llama.cpp keeps a
//!   plain, unstreamed request generating to its end).
//! - **`fits`**: the context size comes from the server (llama.cpp's
//!   `/props`, vLLM's `max_model_len` in `/v1/models`) and, where it tells
//!   none, from [`OpenAiOptions::context_length`]; when both are known the
//!   smaller counts. The prompt is counted by the server where it can
//!   (llama.cpp's `/apply-template` and `/tokenize`: the exact count);
//!   elsewhere it is estimated conservatively at one token per three bytes
//!   of the messages and tools, plus eight per message. Room is kept for
//!   the answer ([`OpenAiOptions::max_new_tokens`]).
//! - **Errors**: a server that cannot be reached, one that closes the
//!   connection mid-request (it stopped), an HTTP error (with the server's
//!   own words), an answer that is not a chat completion and a request that
//!   took too long are [`ProviderError`]s that say which; the host goes on.
//!
//! The API key, when the server wants one, is read from the environment
//! variable that [`OpenAiOptions::api_key_env`] names, when the provider is
//! made, and sent as a bearer token.
//!
//! Plain `http://` is built in; `https://` needs the crate's `https`
//! feature (rustls).

mod gbnf;
mod wire;

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wma_agent::{
    CallFormat, Constraint, GenerateRequest, Generation, Progress, ProgressFn, PromptMessage,
    Provider, ProviderError, ProviderInfo, ToolDefinition,
};

/// The `gen_ai.provider.name` of this provider.
pub const PROVIDER_NAME: &str = "openai-compatible";

/// New tokens per reply when neither the request nor the options say.
pub const DEFAULT_MAX_NEW_TOKENS: u32 = 256;

/// Which request fields a server reads a constraint from: the API is
/// shared, its grammar fields are each server's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// llama.cpp's server: a GBNF grammar in `grammar`, a JSON schema in
    /// `json_schema`.
    #[serde(rename = "llamacpp")]
    LlamaCpp,
    /// vLLM: `guided_grammar` (GBNF-style EBNF) and `guided_json`.
    Vllm,
    /// The OpenAI API and servers that follow it alone (Ollama): a JSON
    /// schema in `response_format`, no grammar.
    OpenAi,
}

impl Dialect {
    /// The name a config writes (`llamacpp`, `vllm`, `openai`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LlamaCpp => "llamacpp",
            Self::Vllm => "vllm",
            Self::OpenAi => "openai",
        }
    }
}

impl std::str::FromStr for Dialect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "llamacpp" => Ok(Self::LlamaCpp),
            "vllm" => Ok(Self::Vllm),
            "openai" => Ok(Self::OpenAi),
            other => Err(format!(
                "unknown dialect `{other}`, expected `llamacpp`, `vllm` or `openai`"
            )),
        }
    }
}

/// Settings of an [`OpenAiProvider`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiOptions {
    /// The server: `http://127.0.0.1:8080` (a trailing `/v1` is allowed).
    pub url: String,
    /// The model name sent in each request (`model`); llama.cpp serves one
    /// model whatever the name, Ollama and vLLM pick by it.
    pub model: String,
    /// The name of the environment variable that holds the API key (sent
    /// as `Authorization: Bearer`); `None` sends none.
    pub api_key_env: Option<String>,
    /// The context window when the server does not tell it (and a cap when
    /// it does).
    pub context_length: Option<u32>,
    /// New tokens per reply when the request sets none; also the room
    /// `fits` keeps for the answer.
    pub max_new_tokens: u32,
    /// Sampling temperature; `None` leaves the server's default.
    pub temperature: Option<f32>,
    /// Sampling seed; `None` leaves the server's default.
    pub seed: Option<u64>,
    /// Tools in the system prompt (the loop's JSON format) instead of the
    /// request's `tools`. `None` (the default) asks the server: tools go
    /// inline when its chat template takes none (llama.cpp's
    /// `/props` `chat_template_caps.supports_tools`), else in the request.
    pub tools_inline: Option<bool>,
    /// The fields constraints go in. `None` (the default) asks the server:
    /// llama.cpp when `/props` answers, vLLM when `/v1/models` says the
    /// model is owned by `vllm`, else the OpenAI API's `response_format`.
    pub dialect: Option<Dialect>,
    /// Longest wait for a connection.
    pub connect_timeout: Duration,
    /// Longest wait for a whole answer.
    pub request_timeout: Duration,
}

impl OpenAiOptions {
    /// Options for `model` served at `url`, the rest default.
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            model: model.into(),
            api_key_env: None,
            context_length: None,
            max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            temperature: None,
            seed: None,
            tools_inline: None,
            dialect: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
        }
    }
}

/// What the server told in `prepare`.
#[derive(Debug, Clone, Copy)]
struct ServerFacts {
    context_length: Option<u32>,
    parameters: Option<u64>,
    /// llama.cpp's `/apply-template` and `/tokenize` answer: prompts are
    /// counted exactly.
    tokenizes: bool,
    /// The server said its chat template takes no tools.
    template_without_tools: bool,
    /// The fields constraints go in.
    dialect: Dialect,
}

/// A provider for a model behind an OpenAI-compatible chat-completion API.
pub struct OpenAiProvider {
    options: OpenAiOptions,
    /// The server's root (no `/v1`).
    root: String,
    api_key: Option<String>,
    client: reqwest::Client,
    facts: OnceLock<ServerFacts>,
    /// Whether the last `/tokenize` failed (then estimates are used).
    tokenize_failed: Mutex<bool>,
    /// A seed that replaces the options' one (see [`OpenAiProvider::reseed`]).
    seed: Mutex<Option<Option<u64>>>,
    /// The kinds of constraint already noted as unsent, so that a run of
    /// many steps logs each once, not once a step.
    noted: Mutex<HashSet<&'static str>>,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.options.url)
            .field("model", &self.options.model)
            .field("prepared", &self.facts.get().is_some())
            .finish_non_exhaustive()
    }
}

/// The answer of one chat completion, before it becomes a [`Generation`].
#[derive(Debug, Clone, PartialEq)]
pub struct DirectReply {
    /// The message's text (without the calls).
    pub content: String,
    /// The server's own `tool_calls`: name and arguments (`None` when the
    /// arguments are not JSON).
    pub calls: Vec<(String, Option<Value>)>,
    /// Why it stopped.
    pub finish_reason: Option<String>,
    /// Prompt tokens, when told.
    pub input_tokens: Option<u32>,
    /// Generated tokens, when told.
    pub output_tokens: Option<u32>,
}

impl OpenAiProvider {
    /// A provider for `options`. Reads the API key's variable now; contacts
    /// no server yet (that is [`Provider::prepare`]).
    pub fn new(options: OpenAiOptions) -> Result<Self, ProviderError> {
        let url = options.url.trim().trim_end_matches('/');
        let scheme_ok =
            url.starts_with("http://") || (url.starts_with("https://") && cfg!(feature = "https"));
        if !scheme_ok {
            let why = if url.starts_with("https://") {
                "https needs wma built with the `https` feature of wma-provider-openai"
            } else {
                "the url must start with http://"
            };
            return Err(ProviderError::Load(format!(
                "cannot use the server url `{}`: {why}",
                options.url
            )));
        }
        let root = url.strip_suffix("/v1").unwrap_or(url).to_string();
        let api_key = match &options.api_key_env {
            None => None,
            Some(name) => match std::env::var(name) {
                Ok(key) if !key.is_empty() => Some(key),
                _ => {
                    return Err(ProviderError::Load(format!(
                        "the API key variable `{name}` (api_key_env) is not set"
                    )));
                }
            },
        };
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            // A connection per request: llama.cpp closes one after a
            // streamed answer, and a request sent on a pooled connection
            // the server already closed fails as if the server had died.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| ProviderError::Load(format!("cannot make an HTTP client: {e}")))?;
        Ok(Self {
            options,
            root,
            api_key,
            client,
            facts: OnceLock::new(),
            tokenize_failed: Mutex::new(false),
            seed: Mutex::new(None),
            noted: Mutex::new(HashSet::new()),
        })
    }

    /// The options it was made with.
    pub fn options(&self) -> &OpenAiOptions {
        &self.options
    }

    /// Replaces the options' sampling seed for the requests from now on
    /// (`None` sends none); evaluations seed each run on its own.
    pub fn reseed(&self, seed: Option<u64>) {
        *self.seed.lock() = Some(seed);
    }

    /// The context window in use, once prepared.
    pub fn context_length(&self) -> Option<u32> {
        self.facts.get().and_then(|f| f.context_length)
    }

    /// The fields constraints go in: the options' dialect, else the one the
    /// server was found to speak in `prepare` (the OpenAI API's before).
    pub fn dialect(&self) -> Dialect {
        self.options
            .dialect
            .or_else(|| self.facts.get().map(|f| f.dialect))
            .unwrap_or(Dialect::OpenAi)
    }

    /// Whether the loop writes the tools into the prompt (see
    /// [`OpenAiOptions::tools_inline`]).
    fn inline(&self) -> bool {
        self.options
            .tools_inline
            .unwrap_or_else(|| self.facts.get().is_some_and(|f| f.template_without_tools))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.root)
    }

    fn with_key(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// Sends one request and reads its JSON answer, raced against `cancel`
    /// (dropping the request closes its connection).
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        path: &str,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Value, ProviderError> {
        let url = self.url(path);
        let work = async {
            let response = self
                .with_key(request)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| transport_error(&url, &e, timeout))?;
            let status = response.status();
            let body = response
                .bytes()
                .await
                .map_err(|e| transport_error(&url, &e, timeout))?;
            if !status.is_success() {
                return Err(ProviderError::Generation(format!(
                    "the server at {url} answered {status}: {}",
                    body_words(&body)
                )));
            }
            serde_json::from_slice::<Value>(&body).map_err(|e| {
                ProviderError::Generation(format!(
                    "the server at {url} did not answer JSON ({e}): {}",
                    body_words(&body)
                ))
            })
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ProviderError::Cancelled),
            result = work => result,
        }
    }

    async fn get(&self, path: &str, cancel: &CancellationToken) -> Result<Value, ProviderError> {
        let request = self.client.get(self.url(path));
        self.send(request, path, self.options.connect_timeout * 3, cancel)
            .await
    }

    async fn post(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Value, ProviderError> {
        let request = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string());
        self.send(request, path, timeout, cancel).await
    }

    /// The body of a chat completion for `request`.
    fn body(&self, request: &GenerateRequest) -> Value {
        let structured = !self.inline();
        let mut body = json!({
            "model": self.options.model,
            "messages": wire::messages_json(&request.messages, structured),
            "max_tokens": request.max_new_tokens.unwrap_or(self.options.max_new_tokens),
            "stream": false,
        });
        if let Some(t) = self.options.temperature {
            body["temperature"] = json!(t);
        }
        let reseeded = *self.seed.lock();
        let seed = reseeded.unwrap_or(self.options.seed);
        if let Some(seed) = seed {
            body["seed"] = json!(seed);
        }
        let mut tools: Vec<ToolDefinition> = if structured {
            request.tools.clone()
        } else {
            Vec::new()
        };
        let dialect = self.dialect();
        let mapped = wire::map_constraint(
            request.constraint.as_ref(),
            dialect,
            structured,
            &request.decoding,
        );
        if let wire::Mapped::Unsent { what, why } = &mapped
            && self.noted.lock().insert(what)
        {
            tracing::info!(
                constraint = what,
                dialect = dialect.as_str(),
                "a constraint goes unsent to this server, and the reply is not held to it: {why}"
            );
        }
        if let (wire::Mapped::Grammar(_), Some(Constraint::TextOrCalls { .. })) =
            (&mapped, &request.constraint)
        {
            // The branch between prose and a call: the loop weighs it
            // (`Generation::call_probability`) before it corrects a prose
            // reply into a call.
            body["logprobs"] = json!(true);
            body["top_logprobs"] = json!(wire::TOP_FIRST_TOKENS);
        }
        if wire::put_constraint(&mut body, &mapped, dialect) {
            // The reply is held to the constraint as text: tools offered
            // beside it would let a template's tool format compete with it
            // (and llama.cpp refuses a grammar beside tools).
            tools.clear();
        }
        if !tools.is_empty() {
            body["tools"] = wire::tools_json(&tools);
        }
        tracing::debug!(body = %body, "chat completion request");
        body
    }

    /// One streamed chat completion, put back together; also the time
    /// until its first text or call arrived.
    async fn complete(
        &self,
        body: &Value,
        cancel: &CancellationToken,
    ) -> Result<(wire::Completion, Option<Duration>), ProviderError> {
        if self.facts.get().is_none() {
            return Err(ProviderError::NotReady(format!(
                "the served model at {} was not prepared",
                self.options.url
            )));
        }
        let url = self.url("/v1/chat/completions");
        let timeout = self.options.request_timeout;
        let mut body = body.clone();
        // Streamed, so that a Stop reaches the server: llama.cpp notices a
        // client that went away when it writes the next token, where a
        // plain request keeps its slot generating to the end.
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let started = Instant::now();
        let work = async {
            let request = self
                .client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .timeout(timeout);
            let mut response = self
                .with_key(request)
                .send()
                .await
                .map_err(|e| transport_error(&url, &e, timeout))?;
            let status = response.status();
            if !status.is_success() {
                let body = response.bytes().await.unwrap_or_default();
                return Err(ProviderError::Generation(format!(
                    "the server at {url} answered {status}: {}",
                    body_words(&body)
                )));
            }
            let mut assembler = wire::Assembler::default();
            let mut first = None;
            loop {
                let chunk = response
                    .chunk()
                    .await
                    .map_err(|e| transport_error(&url, &e, timeout))?;
                let Some(chunk) = chunk else { break };
                assembler.feed(&chunk).map_err(|message| {
                    ProviderError::Generation(format!("the server at {url} failed: {message}"))
                })?;
                if first.is_none() && assembler.started {
                    first = Some(started.elapsed());
                }
            }
            if !assembler.ended {
                return Err(ProviderError::Generation(format!(
                    "the server at {url} closed the connection before it answered (did it stop?)"
                )));
            }
            Ok((assembler.finish(), first))
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ProviderError::Cancelled),
            result = work => result,
        }
    }

    /// One chat completion with `tools`, as the server itself answers it:
    /// no loop, no parsing of the text, the calls as the server returned
    /// them (for scoring a server's own tool calling).
    pub async fn direct(
        &self,
        messages: &[PromptMessage],
        tools: &[ToolDefinition],
        cancel: CancellationToken,
    ) -> Result<DirectReply, ProviderError> {
        let request = GenerateRequest {
            messages: messages.to_vec(),
            tools: tools.to_vec(),
            ..GenerateRequest::default()
        };
        let mut body = self.body(&request);
        body["messages"] = Value::Array(wire::messages_json(messages, true));
        if !tools.is_empty() {
            body["tools"] = wire::tools_json(tools);
        }
        let (completion, _) = self.complete(&body, &cancel).await?;
        let usage = completion.usage.as_ref();
        let choice = &completion.choices[0];
        Ok(DirectReply {
            content: choice.message.content.clone().unwrap_or_default(),
            calls: wire::calls_as_values(&choice.message.tool_calls),
            finish_reason: choice.finish_reason.clone(),
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            output_tokens: usage.and_then(|u| u.completion_tokens),
        })
    }

    /// Tokens of the prompt: counted by the server where it can, else
    /// estimated high.
    async fn count(&self, request: &GenerateRequest) -> Result<usize, ProviderError> {
        let facts = self.facts.get().copied();
        let tokenizes = facts.is_some_and(|f| f.tokenizes) && !*self.tokenize_failed.lock();
        if tokenizes {
            match self.server_count(request).await {
                Ok(n) => return Ok(n),
                Err(error) => {
                    tracing::warn!(%error, "the server could not count the prompt; estimating from now on");
                    *self.tokenize_failed.lock() = true;
                }
            }
        }
        Ok(estimate(request, !self.inline()))
    }

    async fn server_count(&self, request: &GenerateRequest) -> Result<usize, ProviderError> {
        let cancel = CancellationToken::new();
        let mut body = json!({
            "messages": wire::messages_json(&request.messages, !self.inline()),
        });
        if !self.inline() && !request.tools.is_empty() {
            body["tools"] = wire::tools_json(&request.tools);
        }
        let timeout = self.options.connect_timeout * 3;
        let rendered = self
            .post("/apply-template", &body, timeout, &cancel)
            .await?;
        let prompt = rendered
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ProviderError::Generation("/apply-template answered no prompt".into())
            })?;
        let tokens = self
            .post(
                "/tokenize",
                &json!({"content": prompt, "add_special": true, "parse_special": true}),
                timeout,
                &cancel,
            )
            .await?;
        tokens
            .get("tokens")
            .and_then(Value::as_array)
            .map(Vec::len)
            .ok_or_else(|| ProviderError::Generation("/tokenize answered no tokens".into()))
    }
}

/// A conservative count: one token per three bytes (English runs near
/// four), eight per message for the template's markers, and the tools'
/// JSON when the server renders them.
fn estimate(request: &GenerateRequest, tools_sent: bool) -> usize {
    let mut bytes: usize = request.messages.iter().map(|m| m.content.len()).sum();
    if tools_sent {
        bytes += wire::tools_json(&request.tools).to_string().len();
    }
    bytes.div_ceil(3) + 8 * (request.messages.len() + 1)
}

/// The first 400 characters of an error body, on one line.
fn body_words(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return "(no body)".to_string();
    }
    match text.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// A transport failure in words a person can act on.
fn transport_error(url: &str, error: &reqwest::Error, timeout: Duration) -> ProviderError {
    let message = if error.is_timeout() {
        format!(
            "the server at {url} did not answer within {} s",
            timeout.as_secs()
        )
    } else if error.is_connect() {
        format!("cannot reach the server at {url} (is it running?): {error}")
    } else {
        // The connection was there and went away: the server stopped or
        // dropped the request mid-answer.
        format!(
            "the server at {url} closed the connection before it answered (did it stop?): {error}"
        )
    };
    ProviderError::Generation(message)
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: PROVIDER_NAME.to_string(),
            model: self.options.model.clone(),
            context_length: self.context_length().or(self.options.context_length),
        }
    }

    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        progress(Progress {
            stage: format!("connect {}", self.options.url),
            done: 0,
            total: Some(2),
        });
        let load = |e: ProviderError| match e {
            ProviderError::Generation(m) => ProviderError::Load(m),
            other => other,
        };
        // `/v1/models` is the one endpoint every such server has: it tells
        // that the server is there, and sometimes the context and size.
        let models = self.get("/v1/models", &cancel).await.map_err(load)?;
        let (models_context, parameters) = wire::models_facts(&models, &self.options.model);
        let owner = wire::models_owner(&models, &self.options.model);
        progress(Progress {
            stage: format!("read {} settings", self.options.url),
            done: 1,
            total: Some(2),
        });
        // llama.cpp's own endpoints; other servers answer 404.
        let props = self.get("/props", &cancel).await.ok();
        let server_context = props
            .as_ref()
            .and_then(wire::props_context)
            .or(models_context);
        let context_length = match (server_context, self.options.context_length) {
            (Some(server), Some(configured)) => Some(server.min(configured)),
            (server, configured) => server.or(configured),
        };
        if context_length.is_none() {
            return Err(ProviderError::Load(format!(
                "the server at {} does not tell its context size; set `context_length`",
                self.options.url
            )));
        }
        let tokenizes = props.is_some()
            && self
                .post(
                    "/tokenize",
                    &json!({"content": "a"}),
                    self.options.connect_timeout,
                    &cancel,
                )
                .await
                .is_ok();
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let template_without_tools = props
            .as_ref()
            .and_then(|p| p.pointer("/chat_template_caps/supports_tools"))
            .and_then(Value::as_bool)
            == Some(false);
        let dialect = match (props.is_some(), owner.as_deref()) {
            (true, _) => Dialect::LlamaCpp,
            (false, Some("vllm")) => Dialect::Vllm,
            _ => Dialect::OpenAi,
        };
        tracing::debug!(
            dialect = dialect.as_str(),
            configured = self.options.dialect.map(Dialect::as_str),
            "the server's constraint fields"
        );
        let _ = self.facts.set(ServerFacts {
            context_length,
            parameters,
            tokenizes,
            template_without_tools,
            dialect,
        });
        progress(Progress {
            stage: format!("ready {}", self.options.url),
            done: 2,
            total: Some(2),
        });
        Ok(())
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let started = Instant::now();
        let body = self.body(&request);
        let (completion, first) = self.complete(&body, &cancel).await?;
        let total_time = started.elapsed();
        let choice = &completion.choices[0];
        let mut text = choice.message.content.clone().unwrap_or_default();
        if !choice.message.tool_calls.is_empty() {
            let calls = wire::calls_as_text(&choice.message.tool_calls);
            if !text.trim().is_empty() {
                text.push('\n');
            }
            text.push_str(&calls);
        }
        let usage = completion.usage.as_ref();
        let timings = completion.timings.as_ref();
        let ms = |ms: f64| Duration::from_secs_f64(ms.max(0.0) / 1000.0);
        Ok(Generation {
            text,
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            output_tokens: usage.and_then(|u| u.completion_tokens),
            cached_tokens: usage
                .and_then(|u| u.prompt_tokens_details.as_ref())
                .and_then(|d| d.cached_tokens)
                .or_else(|| timings.and_then(|t| t.cache_n)),
            // Measured here (the network included); llama.cpp's own
            // prompt time where nothing arrived (an empty reply).
            time_to_first_token: first.or_else(|| timings.and_then(|t| t.prompt_ms).map(ms)),
            total_time: Some(total_time),
            finish_reason: choice.finish_reason.clone(),
            // Asked for under "text or calls" only (see `body`).
            call_probability: completion
                .first_tokens
                .as_deref()
                .map(wire::call_probability),
            call_baseline: None,
            // A server does not say where its grammar or logit biases
            // changed the model's choice.
            steered: Default::default(),
        })
    }

    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        let Some(limit) = self.context_length() else {
            return Err(ProviderError::NotReady(format!(
                "the served model at {} was not prepared",
                self.options.url
            )));
        };
        let answer = request
            .max_new_tokens
            .unwrap_or(self.options.max_new_tokens) as usize;
        let tokens = self.count(request).await?;
        Ok(tokens + answer <= limit as usize)
    }

    fn call_format(&self) -> CallFormat {
        CallFormat::Json
    }

    fn tools_inline(&self) -> bool {
        self.inline()
    }

    fn supports_constraints(&self) -> bool {
        true
    }

    fn parameters(&self) -> Option<u64> {
        self.facts.get().and_then(|f| f.parameters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_their_root_and_refuse_other_schemes() {
        let p = OpenAiProvider::new(OpenAiOptions::new("http://127.0.0.1:8080/v1/", "m")).unwrap();
        assert_eq!(p.url("/props"), "http://127.0.0.1:8080/props");
        let err = OpenAiProvider::new(OpenAiOptions::new("ftp://x", "m")).unwrap_err();
        assert!(err.to_string().contains("http://"), "{err}");
    }

    #[test]
    fn a_missing_key_variable_is_named() {
        let mut options = OpenAiOptions::new("http://127.0.0.1:1", "m");
        options.api_key_env = Some("WMA_TEST_SURELY_UNSET_KEY".into());
        let err = OpenAiProvider::new(options).unwrap_err();
        assert!(
            err.to_string().contains("WMA_TEST_SURELY_UNSET_KEY"),
            "{err}"
        );
    }

    #[test]
    fn the_estimate_counts_high() {
        let request = GenerateRequest {
            messages: vec![PromptMessage::new(
                wma_agent::PromptRole::User,
                "What is the weather in Paris today?",
            )],
            ..GenerateRequest::default()
        };
        // The real tokenizers take about 9 tokens for this sentence.
        assert!(estimate(&request, false) >= 12 + 16);
    }
}
