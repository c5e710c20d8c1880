// Riverside Library: a small library catalogue whose tools an agent uses
// through WebMCP (document.modelContext.registerTool). Searching, reading a
// book's details and listing loans and holds only read; borrowing,
// returning, renewing and placing a hold change the reader's account.
//
// The account lives in localStorage, so it survives a reload; a fresh
// browser profile (or another port) starts from the same account: one
// book on loan (b-7) and no holds. "Today" is fixed at 2026-03-10, so due
// dates are the same on every run.

const BOOKS = [
  { id: "b-1", title: "The Salt Road", author: "Mira Castell", year: 2019, copies: 2,
    subjects: ["novel", "travel", "sea"], summary: "A novel about a salt trader crossing the coast of Portugal." },
  { id: "b-2", title: "Night Trains of Europe", author: "Jonas Wert", year: 2021, copies: 1,
    subjects: ["travel", "trains", "europe"], summary: "A guide to the sleeper trains still running in Europe." },
  { id: "b-3", title: "A Field Guide to Mushrooms", author: "Ada Lind", year: 2015, copies: 0,
    subjects: ["nature", "mushrooms", "guide"], summary: "How to tell 300 mushrooms apart, with photographs." },
  { id: "b-4", title: "Learning Rust the Slow Way", author: "Pat Okafor", year: 2024, copies: 3,
    subjects: ["programming", "rust", "computers"], summary: "An unhurried introduction to the Rust programming language." },
  { id: "b-5", title: "The Quiet Orchard", author: "Mira Castell", year: 2022, copies: 1,
    subjects: ["novel", "family"], summary: "Three sisters inherit an apple orchard and a debt." },
  { id: "b-6", title: "Bread at Home", author: "Tomas Greer", year: 2018, copies: 2,
    subjects: ["cooking", "baking", "bread"], summary: "Sourdough and yeast breads for a home oven." },
  { id: "b-7", title: "Stars Over the Desert", author: "Lena Ruiz", year: 2020, copies: 1,
    subjects: ["astronomy", "science", "stars"], summary: "Stargazing from the Atacama, for beginners." },
  { id: "b-8", title: "Mountain Weather", author: "Hal Brent", year: 2017, copies: 0,
    subjects: ["weather", "mountains", "hiking"], summary: "Reading clouds and forecasts before a climb." },
];

const TODAY = "2026-03-10";
const LOAN_DAYS = 14;
const KEY = "riverside-library";

// ---- the account -------------------------------------------------------------

function load() {
  const saved = localStorage.getItem(KEY);
  if (saved) return JSON.parse(saved);
  return { loans: [{ book_id: "b-7", due: "2026-03-14" }], holds: [] };
}

function save(account) {
  localStorage.setItem(KEY, JSON.stringify(account));
  draw();
}

function addDays(date, days) {
  const d = new Date(`${date}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() + days);
  return d.toISOString().slice(0, 10);
}

function find(bookId) {
  const id = String(bookId ?? "").trim().toLowerCase();
  const book = BOOKS.find((b) => b.id === id);
  if (!book) throw new Error(`there is no book ${bookId}; search_books finds books and their ids`);
  return book;
}

// Copies on the shelf: the library's copies less the reader's own loan.
function available(book, account) {
  const lent = account.loans.some((l) => l.book_id === book.id) ? 1 : 0;
  return Math.max(0, book.copies - lent);
}

function words(text) {
  return String(text).toLowerCase().split(/[^\p{L}\p{N}]+/u).filter((w) => w.length > 1)
    .map((w) => w.replace(/s$/, ""));
}

function search(query) {
  const wanted = words(query);
  return BOOKS.map((b) => {
    const text = words(`${b.title} ${b.author} ${b.subjects.join(" ")}`);
    return { b, score: wanted.filter((w) => text.includes(w)).length };
  }).filter((hit) => hit.score > 0).sort((x, y) => y.score - x.score).map((hit) => hit.b);
}

function brief(book, account) {
  return { id: book.id, title: book.title, author: book.author, year: book.year,
    available: available(book, account) > 0 };
}

function loansOf(account) {
  return account.loans.map((l) => ({ book_id: l.book_id, title: find(l.book_id).title, due: l.due }));
}

// ---- the page -----------------------------------------------------------------

const main = document.getElementById("main");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, attrs);
  node.append(...children);
  return node;
}

function draw() {
  const account = load();
  main.replaceChildren(
    el("h2", {}, "Catalogue"),
    el("ul", {}, ...BOOKS.map((b) => el("li", {},
      `${b.title} by ${b.author} (${b.year}) `,
      available(b, account) > 0 ? "on the shelf" : el("span", { className: "out" }, "all copies out")))),
    el("h2", {}, "Your loans"),
    el("ul", {}, ...loansOf(account).map((l) => el("li", {}, `${l.title}, due ${l.due}`))),
    el("h2", {}, "Your holds"),
    el("ul", {}, ...account.holds.map((id) => el("li", {}, find(id).title))),
  );
}

// ---- the tools ------------------------------------------------------------------

function registerTools() {
  const context = document.modelContext ?? navigator.modelContext;
  if (!context) {
    document.getElementById("webmcp-missing").hidden = false;
    return;
  }
  const bookId = { type: "string", description: "The book's id, like b-4." };
  context.registerTool({
    name: "search_books",
    description: "Search the library catalogue by title, author or subject. Returns books with id, title, author, year and whether a copy is on the shelf.",
    inputSchema: { type: "object", properties: { query: { type: "string", description: "Words to look for." } }, required: ["query"] },
    annotations: { readOnlyHint: true },
    execute: async ({ query }) => JSON.stringify(search(query).map((b) => brief(b, load()))),
  });
  context.registerTool({
    name: "get_book",
    description: "Get a book's details by its id: author, year, subjects, summary and copies on the shelf.",
    inputSchema: { type: "object", properties: { book_id: bookId }, required: ["book_id"] },
    annotations: { readOnlyHint: true },
    execute: async ({ book_id }) => {
      const account = load();
      const b = find(book_id);
      return JSON.stringify({ ...brief(b, account), subjects: b.subjects, summary: b.summary,
        copies_on_shelf: available(b, account) });
    },
  });
  context.registerTool({
    name: "list_loans",
    description: "List the books the reader has borrowed, with their due dates.",
    inputSchema: { type: "object", properties: {} },
    annotations: { readOnlyHint: true },
    execute: async () => JSON.stringify(loansOf(load())),
  });
  context.registerTool({
    name: "list_holds",
    description: "List the books the reader is waiting for (holds).",
    inputSchema: { type: "object", properties: {} },
    annotations: { readOnlyHint: true },
    execute: async () => JSON.stringify(load().holds.map((id) => ({ book_id: id, title: find(id).title }))),
  });
  context.registerTool({
    name: "borrow_book",
    description: `Borrow a book that is on the shelf, by its id. Loans last ${LOAN_DAYS} days.`,
    inputSchema: { type: "object", properties: { book_id: bookId }, required: ["book_id"] },
    execute: async ({ book_id }) => {
      const account = load();
      const b = find(book_id);
      if (account.loans.some((l) => l.book_id === b.id)) throw new Error(`you already have ${b.title}`);
      if (available(b, account) === 0) throw new Error(`all copies of ${b.title} are out; place_hold reserves the next one`);
      const due = addDays(TODAY, LOAN_DAYS);
      account.loans.push({ book_id: b.id, due });
      save(account);
      return JSON.stringify({ ok: true, borrowed: b.title, due });
    },
  });
  context.registerTool({
    name: "return_book",
    description: "Return a borrowed book, by its id.",
    inputSchema: { type: "object", properties: { book_id: bookId }, required: ["book_id"] },
    execute: async ({ book_id }) => {
      const account = load();
      const b = find(book_id);
      if (!account.loans.some((l) => l.book_id === b.id)) throw new Error(`${b.title} is not on loan to you`);
      account.loans = account.loans.filter((l) => l.book_id !== b.id);
      save(account);
      return JSON.stringify({ ok: true, returned: b.title });
    },
  });
  context.registerTool({
    name: "renew_loan",
    description: `Renew a borrowed book for another ${LOAN_DAYS} days, by its id.`,
    inputSchema: { type: "object", properties: { book_id: bookId }, required: ["book_id"] },
    execute: async ({ book_id }) => {
      const account = load();
      const b = find(book_id);
      const loan = account.loans.find((l) => l.book_id === b.id);
      if (!loan) throw new Error(`${b.title} is not on loan to you`);
      loan.due = addDays(loan.due, LOAN_DAYS);
      save(account);
      return JSON.stringify({ ok: true, renewed: b.title, due: loan.due });
    },
  });
  context.registerTool({
    name: "place_hold",
    description: "Reserve the next copy of a book whose copies are all out, by its id.",
    inputSchema: { type: "object", properties: { book_id: bookId }, required: ["book_id"] },
    execute: async ({ book_id }) => {
      const account = load();
      const b = find(book_id);
      if (available(b, account) > 0) throw new Error(`${b.title} is on the shelf; borrow_book borrows it`);
      if (!account.holds.includes(b.id)) account.holds.push(b.id);
      save(account);
      return JSON.stringify({ ok: true, on_hold: b.title });
    },
  });
}

draw();
registerTools();
