//! Rust functions as tools.

use std::sync::Arc;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{CallContext, ToolAnnotations, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

type Handler =
    Arc<dyn Fn(Value, CallContext) -> BoxFuture<'static, Result<String, ToolError>> + Send + Sync>;

struct NativeTool {
    definition: ToolDefinition,
    handler: Handler,
}

/// A set of Rust functions offered as tools.
///
/// A plain source: it finds the function and runs it, nothing more. Put it
/// in a [`ToolSet`](crate::ToolSet) (as every host does) for the checks
/// each call goes through: arguments validated against the tool's schema,
/// a time limit ([`SourceOptions::call_timeout`](crate::SourceOptions::call_timeout)),
/// a panic contained as a tool error. A typed tool
/// ([`NativeTools::add_typed`]) still refuses arguments its type cannot
/// read, whoever calls it.
#[derive(Default)]
pub struct NativeTools {
    tools: Vec<NativeTool>,
}

/// Rust functions run in this process: they have nothing of their own to
/// restart, so they always serve (a set that holds them contains a panic
/// and makes them afresh, when it can).
impl crate::health::Monitored for NativeTools {
    fn status(&self) -> crate::health::SourceStatus {
        crate::health::SourceStatus {
            state: crate::health::SourceState::Ready,
            restarts: 0,
        }
    }
}

impl NativeTools {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a synchronous tool. A later tool with the same name replaces the
    /// earlier one, so names stay unique.
    pub fn add_fn<F>(&mut self, definition: ToolDefinition, f: F) -> &mut Self
    where
        F: Fn(Value) -> Result<String, ToolError> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.insert(NativeTool {
            definition,
            handler: Arc::new(move |args, _| {
                let f = f.clone();
                async move { f(args) }.boxed()
            }),
        });
        self
    }

    /// Adds an asynchronous tool.
    pub fn add_async<F, Fut>(&mut self, definition: ToolDefinition, f: F) -> &mut Self
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<String, ToolError>> + Send + 'static,
    {
        self.insert(NativeTool {
            definition,
            handler: Arc::new(move |args, _| f(args).boxed()),
        });
        self
    }

    /// Adds an asynchronous tool that also gets the call's
    /// [`CallContext`]: its idempotency key, when the host recorded the
    /// call before sending it (a consequential tool's call, in a host with
    /// a store). A tool with effects keeps the keys it has acted on, and
    /// answers a key it has seen without acting twice.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::Arc;
    /// use parking_lot::Mutex;
    /// use serde_json::json;
    /// use wma_agent::{CallContext, ToolDefinition, ToolHost};
    /// use wma_tools::NativeTools;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let orders: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    /// let placed = orders.clone();
    /// let mut tools = NativeTools::new();
    /// tools.add_with_context(
    ///     ToolDefinition::new("place_order", "Place the order.", json!({"type": "object"})),
    ///     move |_args, context: CallContext| {
    ///         let placed = placed.clone();
    ///         async move {
    ///             let key = context.idempotency_key().unwrap_or("unrecorded").to_string();
    ///             let mut placed = placed.lock();
    ///             let n = placed.len() as u32 + 1;
    ///             let order = *placed.entry(key).or_insert(n);
    ///             Ok(format!("order {order}"))
    ///         }
    ///     },
    /// );
    /// let context = CallContext::new().with_idempotency_key("k1");
    /// for _ in 0..2 {
    ///     let out = tools.call_tool_with("place_order", json!({}), &context, Default::default());
    ///     assert_eq!(out.await.unwrap(), "order 1"); // sent twice, placed once
    /// }
    /// assert_eq!(orders.lock().len(), 1);
    /// # }
    /// ```
    pub fn add_with_context<F, Fut>(&mut self, definition: ToolDefinition, f: F) -> &mut Self
    where
        F: Fn(Value, CallContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<String, ToolError>> + Send + 'static,
    {
        self.insert(NativeTool {
            definition,
            handler: Arc::new(move |args, context| f(args, context).boxed()),
        });
        self
    }

    /// Adds a tool whose arguments are a Rust type: the input schema is
    /// derived from it (`#[derive(Deserialize, JsonSchema)]`, doc comments
    /// become descriptions), and the function gets the arguments already
    /// read into it.
    ///
    /// ```
    /// use schemars::JsonSchema;
    /// use serde::Deserialize;
    /// use wma_agent::ToolHost;
    /// use wma_tools::NativeTools;
    ///
    /// #[derive(Deserialize, JsonSchema)]
    /// struct Convert {
    ///     /// Degrees Celsius.
    ///     celsius: f64,
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut tools = NativeTools::new();
    /// tools.add_typed("to_fahrenheit", "Convert Celsius to Fahrenheit.", |a: Convert| {
    ///     Ok(format!("{}", a.celsius * 9.0 / 5.0 + 32.0))
    /// });
    /// let schema = &tools.list_tools().await[0].input_schema;
    /// assert_eq!(schema["properties"]["celsius"]["type"], "number");
    /// assert_eq!(schema["required"][0], "celsius");
    /// let out = tools.call_tool("to_fahrenheit", serde_json::json!({"celsius": 100}), Default::default());
    /// assert_eq!(out.await.unwrap(), "212");
    /// # }
    /// ```
    pub fn add_typed<A, F>(
        &mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        f: F,
    ) -> &mut Self
    where
        A: DeserializeOwned + JsonSchema + 'static,
        F: Fn(A) -> Result<String, ToolError> + Send + Sync + 'static,
    {
        let definition = ToolDefinition::new(name, description, input_schema::<A>());
        self.add_fn(definition, move |args| f(read_args(args)?))
    }

    /// Adds an asynchronous tool whose arguments are a Rust type (see
    /// [`NativeTools::add_typed`]).
    pub fn add_typed_async<A, F, Fut>(
        &mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        f: F,
    ) -> &mut Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(A) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<String, ToolError>> + Send + 'static,
    {
        let definition = ToolDefinition::new(name, description, input_schema::<A>());
        let f = Arc::new(f);
        self.add_async(definition, move |args| {
            let f = f.clone();
            async move { f(read_args(args)?).await }
        })
    }

    /// Sets the annotations of the tool named `name` (for tools added with
    /// [`NativeTools::add_typed`], whose definition is made for you).
    pub fn annotate(&mut self, name: &str, annotations: ToolAnnotations) -> &mut Self {
        if let Some(tool) = self.tools.iter_mut().find(|t| t.definition.name == name) {
            tool.definition.annotations = annotations;
        }
        self
    }

    fn insert(&mut self, tool: NativeTool) {
        self.tools
            .retain(|t| t.definition.name != tool.definition.name);
        self.tools.push(tool);
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// The JSON Schema of a Rust type, as a tool's input schema.
///
/// Sub-schemas are inlined (no `$defs` / `$ref`) and the meta-schema and
/// title are left out: a small model reads the schema in its prompt, and a
/// flat one is what it copes with.
pub fn input_schema<A: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<A>().to_value();
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
    }
    schema
}

/// Reads the arguments into the tool's type. Within a set, validation
/// against the derived schema already ran; what is left is what a schema
/// cannot say (and, called directly, what the type cannot read).
fn read_args<A: DeserializeOwned>(args: Value) -> Result<A, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::new(ToolErrorCode::InvalidArguments, e.to_string()))
}

#[async_trait]
impl ToolHost for NativeTools {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        self.tools.iter().map(|t| t.definition.clone()).collect()
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        self.call_tool_with(name, arguments, &CallContext::new(), cancel)
            .await
    }

    /// The context reaches tools added with
    /// [`NativeTools::add_with_context`].
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        // The caller races the call against its token (the set, or the
        // loop when the tools are used alone); a function takes none.
        _cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let Some(tool) = self.tools.iter().find(|t| t.definition.name == name) else {
            return Err(ToolError::new(
                ToolErrorCode::UnknownTool,
                format!("no tool named \"{name}\""),
            ));
        };
        // Validation, the time limit and the panic guard are the set's
        // (see `ToolSet`): doing them here too would check and time the
        // same call twice.
        (tool.handler)(arguments, context.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> NativeTools {
        let mut tools = NativeTools::new();
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        tools.add_fn(
            ToolDefinition::new("double", "Double n.", schema.clone()),
            |a| Ok((a["n"].as_i64().unwrap_or(0) * 2).to_string()),
        );
        tools
    }

    /// The checks of a call (validation, time limit, panic guard) are the
    /// set's, tested in `tests/tool_path.rs`; alone, the tools find the
    /// function and run it.
    #[tokio::test]
    async fn calls_reach_their_function_by_name() {
        let t = tools();
        assert_eq!(
            t.call_tool("double", json!({"n": 4}), CancellationToken::new())
                .await
                .unwrap(),
            "8"
        );
        let err = t
            .call_tool("triple", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::UnknownTool);
    }

    #[derive(serde::Deserialize, JsonSchema)]
    struct Order {
        /// The product's id.
        product_id: String,
        /// How many; one when left out.
        #[serde(default)]
        quantity: Option<u32>,
        /// Delivery speed.
        speed: Speed,
    }

    #[derive(serde::Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    enum Speed {
        Standard,
        Express,
    }

    #[tokio::test]
    async fn typed_tools_derive_a_flat_schema_and_read_their_arguments() {
        let mut tools = NativeTools::new();
        tools.add_typed("order", "Order a product.", |o: Order| {
            let speed = match o.speed {
                Speed::Standard => "standard",
                Speed::Express => "express",
            };
            Ok(format!(
                "{} x {} ({speed})",
                o.quantity.unwrap_or(1),
                o.product_id
            ))
        });
        let schema = tools.list_tools().await[0].input_schema.clone();
        assert_eq!(schema["type"], "object");
        assert_eq!(
            schema["properties"]["product_id"]["description"],
            "The product's id."
        );
        assert_eq!(
            schema["properties"]["speed"]["enum"],
            json!(["standard", "express"]),
            "sub-schemas are inlined: {schema}"
        );
        assert!(schema.get("$defs").is_none() && schema.get("$schema").is_none());
        assert_eq!(schema["required"], json!(["product_id", "speed"]));
        let out = tools
            .call_tool(
                "order",
                json!({"product_id": "p-17", "speed": "express"}),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(out.unwrap(), "1 x p-17 (express)");
        let err = tools
            .call_tool(
                "order",
                json!({"product_id": "p-17", "speed": "teleport"}),
                CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ToolErrorCode::InvalidArguments);
    }

    #[test]
    fn a_later_tool_with_the_same_name_replaces_the_earlier() {
        let mut t = tools();
        t.add_fn(
            ToolDefinition::new("double", "again", json!({"type": "object"})),
            |_| Ok("x".into()),
        );
        assert_eq!(t.len(), 1);
    }
}
