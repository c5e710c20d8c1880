// Trailhead Outfitters: a small shop whose tools an agent uses through
// WebMCP (document.modelContext.registerTool). The tools mirror the Rust
// demo shop (crates/config/src/demo_shop.rs): search_products, open_product,
// add_to_cart and view_cart. add_to_cart exists only on a product's page,
// so an agent has to open the product first, as a person would.
//
// Addresses: /            the catalogue and search (?q=words)
//            /products/ID a product's page
//            /cart        the cart
// The server sends index.html for every address; this script draws the
// page that the address names. The cart lives in localStorage, so it
// survives navigation.
//
// ?latency_ms=N makes every tool wait N ms before it answers, as a tool
// backed by a slow network service would (tests use it to cancel a call
// that is still running).

const CATALOGUE = [
  { id: "p-17", title: "Summit 30L Waterproof Backpack", category: "backpacks", price: 109.0, stock: 12,
    description: "A 30 liter waterproof hiking backpack with a rain cover.",
    review: "Kept my gear dry through two days of rain." },
  { id: "p-21", title: "Daytrip 20L Backpack", category: "backpacks", price: 59.0, stock: 4,
    description: "A light 20 liter backpack for day hikes.",
    review: "Light and comfortable, but not waterproof." },
  { id: "p-33", title: "Trail Tent 2P", category: "tents", price: 189.0, stock: 3,
    description: "A two-person tent for three seasons.",
    review: "Pitches in five minutes." },
  { id: "p-41", title: "Ridge Hiking Boots", category: "footwear", price: 139.0, stock: 0,
    description: "Waterproof leather hiking boots.",
    review: "Worth the wait for the restock." },
  { id: "p-52", title: "Storm Rain Jacket", category: "clothing", price: 99.0, stock: 8,
    description: "A breathable waterproof rain jacket.",
    review: "Breathes well on steep climbs." },
  { id: "p-64", title: "Camp Stove", category: "accessories", price: 45.0, stock: 20,
    description: "A compact gas stove for camping.",
    review: "Boils water in three minutes." },
];

const SHOP = "Trailhead Outfitters";
const CART_KEY = "trailhead-cart";
const latencyMs = Number(new URLSearchParams(location.search).get("latency_ms") || 0);

// ---- the shop's logic, shared by the page and its tools -------------------

// Words as the Rust demo reads them: lower case, no plural "s".
function words(text) {
  return String(text)
    .split(/[^\p{L}\p{N}]+/u)
    .filter((w) => w.length > 1)
    .map((w) => w.toLowerCase().replace(/s+$/, ""));
}

function search(query) {
  const wanted = words(query);
  return CATALOGUE
    .map((p) => {
      const text = words(`${p.title} ${p.category} ${p.description}`);
      return { p, score: wanted.filter((w) => text.includes(w)).length };
    })
    .filter((hit) => hit.score > 0)
    .sort((a, b) => b.score - a.score)
    .map(({ p }) => p);
}

function find(id) {
  const product = CATALOGUE.find((p) => p.id === String(id ?? "").trim());
  if (!product) {
    throw new Error(`there is no product with id "${id}"; use search_products to find ids`);
  }
  return product;
}

function readCart() {
  try {
    return JSON.parse(localStorage.getItem(CART_KEY) || "[]");
  } catch {
    return [];
  }
}

function addToCart(product, quantity) {
  const cart = readCart();
  const line = cart.find((l) => l.product_id === product.id);
  const already = line ? line.quantity : 0;
  if (product.stock < already + quantity) {
    throw new Error(`${product.title} has only ${product.stock - already} in stock`);
  }
  if (line) line.quantity += quantity;
  else cart.push({ product_id: product.id, quantity });
  localStorage.setItem(CART_KEY, JSON.stringify(cart));
  drawCartLink();
  return `Added ${quantity} x ${product.title} to the cart.`;
}

function cartSummary() {
  let total = 0;
  const items = readCart().map((line) => {
    const p = find(line.product_id);
    total += p.price * line.quantity;
    return { id: p.id, title: p.title, quantity: line.quantity, price: p.price };
  });
  return { items, total };
}

// ---- the page ---------------------------------------------------------------

const main = document.getElementById("main");

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "onclick" || key === "onsubmit") node[key] = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function drawCartLink() {
  const count = readCart().reduce((n, l) => n + l.quantity, 0);
  document.getElementById("cart-link").textContent = `Cart (${count})`;
}

function productList(products) {
  return el("ul", { class: "products" }, ...products.map((p) =>
    el("li", {},
      el("a", { href: `/products/${p.id}` }, p.title), el("br"),
      el("span", { class: "price" }, `$${p.price.toFixed(2)}`), " ",
      p.stock > 0 ? "in stock" : el("span", { class: "out" }, "out of stock"))));
}

function drawHome() {
  const query = new URLSearchParams(location.search).get("q") || "";
  document.title = SHOP;
  const input = el("input", { name: "q", placeholder: "Search the shop", value: query });
  main.append(
    el("h1", {}, "Outdoor gear for every trail"),
    el("form", { class: "search", action: "/" }, input, el("button", { type: "submit" }, "Search")),
    query ? el("p", {}, `Results for “${query}”:`) : "",
    productList(query ? search(query) : CATALOGUE));
}

function drawProduct(product) {
  document.title = `${product.title} — ${SHOP}`;
  const notice = el("p", { class: "notice", hidden: "" });
  const button = el("button", {
    onclick: () => {
      try {
        notice.textContent = addToCart(product, 1);
      } catch (error) {
        notice.textContent = error.message;
      }
      notice.hidden = false;
    },
  }, "Add to cart");
  if (product.stock === 0) button.disabled = true;
  main.append(
    el("h1", {}, product.title),
    el("p", {}, product.description),
    el("p", {}, el("span", { class: "price" }, `$${product.price.toFixed(2)}`), " · ",
      product.stock > 0 ? `${product.stock} in stock` : el("span", { class: "out" }, "out of stock")),
    button, notice,
    el("h2", {}, "What hikers say"),
    el("p", { class: "review" }, product.review));
}

function drawCart() {
  document.title = `Your cart — ${SHOP}`;
  const { items, total } = cartSummary();
  main.append(el("h1", {}, "Your cart"));
  if (items.length === 0) {
    main.append(el("p", {}, "The cart is empty."));
    return;
  }
  main.append(el("table", {},
    el("tr", {}, el("th", {}, "Product"), el("th", {}, "Quantity"), el("th", {}, "Price")),
    ...items.map((i) => el("tr", {}, el("td", {}, i.title), el("td", {}, String(i.quantity)),
      el("td", {}, `$${(i.price * i.quantity).toFixed(2)}`))),
    el("tr", {}, el("th", {}, "Total"), el("td", {}), el("th", {}, `$${total.toFixed(2)}`))));
}

function drawNotFound() {
  document.title = `Not found — ${SHOP}`;
  main.append(el("h1", {}, "Not found"), el("p", {}, el("a", { href: "/" }, "Back to the shop")));
}

// ---- the tools ----------------------------------------------------------------

const pause = () => new Promise((resolve) => setTimeout(resolve, latencyMs));

function registerTools(productOnPage) {
  const context = document.modelContext;
  if (!context) {
    document.getElementById("webmcp-missing").hidden = false;
    return;
  }
  context.registerTool({
    name: "search_products",
    description: "Search the catalog by words. Returns products with id, title, price and stock.",
    inputSchema: {
      type: "object",
      properties: { query: { type: "string", description: "Words to look for." } },
      required: ["query"],
    },
    annotations: { readOnlyHint: true },
    execute: async ({ query }) => {
      await pause();
      return JSON.stringify(search(query).map((p) =>
        ({ id: p.id, title: p.title, price: p.price, in_stock: p.stock > 0 })));
    },
  });
  context.registerTool({
    name: "open_product",
    description: "Open a product's page by its id and get its details. add_to_cart is on that page.",
    inputSchema: {
      type: "object",
      properties: { product_id: { type: "string" } },
      required: ["product_id"],
    },
    // The details include a customer's review: text the shop did not write.
    annotations: { readOnlyHint: true, untrustedContentHint: true },
    execute: async ({ product_id }) => {
      await pause();
      const p = find(product_id);
      // The navigation starts before the result is returned, so a host
      // that waits for a navigation in progress sees the product page's
      // tools as soon as this call has answered.
      if (productOnPage?.id !== p.id) location.assign(`/products/${p.id}`);
      return JSON.stringify({ id: p.id, title: p.title, category: p.category, price: p.price,
        stock: p.stock, description: p.description, review: p.review });
    },
  });
  context.registerTool({
    name: "view_cart",
    description: "Show the items in the cart and the total.",
    inputSchema: { type: "object", properties: {} },
    annotations: { readOnlyHint: true },
    execute: async () => {
      await pause();
      return JSON.stringify(cartSummary());
    },
  });
  if (productOnPage) {
    const p = productOnPage;
    context.registerTool({
      name: "add_to_cart",
      description: `Add the product on this page (${p.title}, id ${p.id}) to the cart.`,
      inputSchema: {
        type: "object",
        properties: {
          product_id: { type: "string", description: `Optional; this page's product is ${p.id}.` },
          quantity: { type: "integer", minimum: 1 },
        },
      },
      execute: async ({ product_id, quantity }) => {
        await pause();
        if (product_id !== undefined && String(product_id).trim() !== p.id) {
          throw new Error(`this page shows ${p.id} (${p.title}); call open_product with "${product_id}" first`);
        }
        const message = addToCart(p, quantity ?? 1);
        return JSON.stringify({ ok: true, message });
      },
    });
  }
}

// ---- routing --------------------------------------------------------------------

const path = location.pathname;
let productOnPage = null;
if (path === "/" || path === "/index.html") {
  drawHome();
} else if (path === "/cart") {
  drawCart();
} else if (path.startsWith("/products/")) {
  productOnPage = CATALOGUE.find((p) => p.id === decodeURIComponent(path.slice("/products/".length)));
  if (productOnPage) drawProduct(productOnPage);
  else drawNotFound();
} else {
  drawNotFound();
}
drawCartLink();
registerTools(productOnPage);
