//! A small outdoor shop as Rust-native tools: search, open a product, add to
//! cart, view the cart. The `wma` command runs its default request against it,
//! and tests read the cart back to see whether the agent really did the job.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use wma_agent::{ToolAnnotations, ToolDefinition, ToolError, ToolErrorCode};
use wma_tools::NativeTools;

/// One product of the catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct Product {
    /// Identifier the tools take (`p-17`).
    pub id: &'static str,
    /// Name shown to people.
    pub title: &'static str,
    /// Category for searching.
    pub category: &'static str,
    /// Price in dollars.
    pub price: f64,
    /// Units in stock.
    pub stock: u32,
    /// A sentence about it.
    pub description: &'static str,
}

/// The catalogue.
pub const CATALOGUE: &[Product] = &[
    Product {
        id: "p-17",
        title: "Summit 30L Waterproof Backpack",
        category: "backpacks",
        price: 109.0,
        stock: 12,
        description: "A 30 liter waterproof hiking backpack with a rain cover.",
    },
    Product {
        id: "p-21",
        title: "Daytrip 20L Backpack",
        category: "backpacks",
        price: 59.0,
        stock: 4,
        description: "A light 20 liter backpack for day hikes.",
    },
    Product {
        id: "p-33",
        title: "Trail Tent 2P",
        category: "tents",
        price: 189.0,
        stock: 3,
        description: "A two-person tent for three seasons.",
    },
    Product {
        id: "p-41",
        title: "Ridge Hiking Boots",
        category: "footwear",
        price: 139.0,
        stock: 0,
        description: "Waterproof leather hiking boots.",
    },
    Product {
        id: "p-52",
        title: "Storm Rain Jacket",
        category: "clothing",
        price: 99.0,
        stock: 8,
        description: "A breathable waterproof rain jacket.",
    },
    Product {
        id: "p-64",
        title: "Camp Stove",
        category: "accessories",
        price: 45.0,
        stock: 20,
        description: "A compact gas stove for camping.",
    },
];

/// A cart line.
#[derive(Debug, Clone, PartialEq)]
pub struct CartLine {
    /// The product's id.
    pub product_id: String,
    /// How many.
    pub quantity: u32,
}

/// The shop's state, shared by its tools; read it to check what an agent did.
#[derive(Debug, Clone, Default)]
pub struct Shop {
    cart: Arc<Mutex<Vec<CartLine>>>,
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 1)
        .map(|w| w.to_lowercase().trim_end_matches('s').to_string())
        .collect()
}

fn find(id: &str) -> Result<&'static Product, ToolError> {
    CATALOGUE.iter().find(|p| p.id == id.trim()).ok_or_else(|| {
        ToolError::new(
            ToolErrorCode::ToolFailed,
            format!("there is no product with id \"{id}\"; use search_products to find ids"),
        )
    })
}

impl Shop {
    /// A shop with an empty cart.
    pub fn new() -> Self {
        Self::default()
    }

    /// What is in the cart.
    pub fn cart(&self) -> Vec<CartLine> {
        self.cart.lock().clone()
    }

    /// The cart in a line, as the command and the evaluation report it:
    /// `2 x p-17, 1 x p-3`; empty when the cart is.
    pub fn cart_line(&self) -> String {
        self.cart()
            .iter()
            .map(|l| format!("{} x {}", l.quantity, l.product_id))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The shop's tools.
    pub fn tools(&self) -> NativeTools {
        let mut tools = NativeTools::new();
        let read_only = ToolAnnotations {
            read_only: true,
            ..ToolAnnotations::default()
        };
        tools.add_fn(
            ToolDefinition::new(
                "search_products",
                "Search the catalog by words. Returns products with id, title, price and stock.",
                json!({"type": "object", "properties": {
                    "query": {"type": "string", "description": "Words to look for."}},
                    "required": ["query"]}),
            )
            .with_annotations(read_only.clone()),
            |args| {
                let query = words(args["query"].as_str().unwrap_or(""));
                let mut hits: Vec<(usize, &Product)> = CATALOGUE
                    .iter()
                    .map(|p| {
                        let text = words(&format!("{} {} {}", p.title, p.category, p.description));
                        (query.iter().filter(|q| text.contains(q)).count(), p)
                    })
                    .filter(|(score, _)| *score > 0)
                    .collect();
                hits.sort_by_key(|h| std::cmp::Reverse(h.0));
                let list: Vec<Value> = hits
                    .iter()
                    .map(|(_, p)| json!({"id": p.id, "title": p.title, "price": p.price, "in_stock": p.stock > 0}))
                    .collect();
                Ok(Value::Array(list).to_string())
            },
        );
        tools.add_fn(
            ToolDefinition::new(
                "open_product",
                "Get the details of one product by its id.",
                json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
            )
            .with_annotations(read_only.clone()),
            |args| {
                let p = find(args["product_id"].as_str().unwrap_or(""))?;
                Ok(json!({"id": p.id, "title": p.title, "category": p.category, "price": p.price,
                          "stock": p.stock, "description": p.description}).to_string())
            },
        );
        let cart = self.cart.clone();
        tools.add_fn(
            ToolDefinition::new(
                "add_to_cart",
                "Add a product to the cart by its id.",
                json!({"type": "object", "properties": {
                    "product_id": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1}},
                    "required": ["product_id"]}),
            ),
            move |args| {
                let p = find(args["product_id"].as_str().unwrap_or(""))?;
                let quantity = args["quantity"].as_u64().unwrap_or(1) as u32;
                if p.stock < quantity {
                    return Err(ToolError::new(
                        ToolErrorCode::ToolFailed,
                        format!("{} has only {} in stock", p.title, p.stock),
                    ));
                }
                let mut cart = cart.lock();
                match cart.iter_mut().find(|l| l.product_id == p.id) {
                    Some(line) => line.quantity += quantity,
                    None => cart.push(CartLine { product_id: p.id.to_string(), quantity }),
                }
                Ok(json!({"ok": true, "message": format!("Added {quantity} x {} to the cart.", p.title)}).to_string())
            },
        );
        let cart = self.cart.clone();
        tools.add_fn(
            ToolDefinition::new(
                "view_cart",
                "Show the items in the cart and the total.",
                json!({"type": "object", "properties": {}}),
            )
            .with_annotations(read_only),
            move |_| {
                let cart = cart.lock();
                let mut total = 0.0;
                let items: Vec<Value> = cart
                    .iter()
                    .filter_map(|l| find(&l.product_id).ok().map(|p| (l, p)))
                    .map(|(l, p)| {
                        total += p.price * f64::from(l.quantity);
                        json!({"id": p.id, "title": p.title, "quantity": l.quantity, "price": p.price})
                    })
                    .collect();
                Ok(json!({"items": items, "total": total}).to_string())
            },
        );
        tools
    }
}

/// The request `wma run` makes when none is given.
pub const DEFAULT_REQUEST: &str = "Find a waterproof backpack and add it to my cart.";

/// Instructions for the shop's agent.
pub const INSTRUCTIONS: &str = "This is an outdoor shop. To buy something: search_products, then add_to_cart with the product's id. view_cart shows the cart.";

/// The config `wma chat` and `wma serve` host when given none: the shop's
/// agent, `shopper`, on the default model with the demo shop's tools and
/// [`INSTRUCTIONS`], as `wma run` asks it.
pub fn demo_config() -> String {
    let instructions = toml::Value::String(INSTRUCTIONS.to_string());
    format!(
        "[providers.default]\nkind = \"onnx\"\n\n\
         [tools.shop]\nkind = \"demo-shop\"\n\n\
         [agents.shopper]\n\
         description = \"Helps a person shop at the outdoor store.\"\n\
         instructions = {instructions}\n\
         tools = [\"shop\"]\n\
         max_steps = 6\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;
    use wma_agent::ToolHost;

    #[tokio::test]
    async fn search_add_and_view() {
        let shop = Shop::new();
        let tools = shop.tools();
        let found = tools
            .call_tool(
                "search_products",
                json!({"query": "waterproof backpack"}),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert!(found.starts_with(r#"[{"id":"p-17""#), "{found}");
        tools
            .call_tool(
                "add_to_cart",
                json!({"product_id": "p-17", "quantity": 2}),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(
            shop.cart(),
            vec![CartLine {
                product_id: "p-17".into(),
                quantity: 2
            }]
        );
        let err = tools
            .call_tool(
                "add_to_cart",
                json!({"product_id": "p-41"}),
                CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert!(err.message.contains("only 0 in stock"));
        let cart = tools
            .call_tool("view_cart", json!({}), CancellationToken::new())
            .await
            .unwrap();
        assert!(cart.contains("\"total\":218.0"), "{cart}");
    }
}
