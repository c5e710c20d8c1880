// Maps the older WebMCP API (navigator.modelContext: provideContext,
// registerTool, unregisterTool, clearContext), which many published pages
// were written for, onto the document.modelContext that Chromium offers and
// the host reads. It runs before the page's own scripts. Pages written for
// document.modelContext are not touched, and a page or polyfill that brings
// its own navigator.modelContext replaces this one.
(() => {
  const native = document.modelContext;
  if (!native || typeof native.registerTool !== "function") return;
  if ("modelContext" in navigator) return;

  // Aborting a tool's signal unregisters it from the native API.
  const registered = new Map();
  // Tools given by provideContext, which replaces them as a whole.
  let provided = [];

  const warn = (name, error) =>
    console.warn(`navigator.modelContext: the tool ${name} was not registered:`, error);

  const register = (tool) => {
    const name = tool && tool.name;
    if (registered.has(name)) {
      throw new DOMException(`a tool named ${name} is already registered`, "InvalidStateError");
    }
    const controller = new AbortController();
    const definition = { ...tool };
    if (typeof tool.execute === "function") {
      definition.execute = (input, client) => tool.execute.call(tool, input, client);
    }
    registered.set(name, controller);
    try {
      const done = native.registerTool(definition, { signal: controller.signal });
      if (done && typeof done.then === "function") {
        done.catch((error) => {
          if (registered.get(name) === controller) registered.delete(name);
          warn(name, error);
        });
      }
    } catch (error) {
      registered.delete(name);
      throw error;
    }
    return { unregister: () => unregister(name) };
  };

  const unregister = (name) => {
    const controller = registered.get(name);
    if (!controller) return;
    registered.delete(name);
    controller.abort();
  };

  const legacy = {
    registerTool: (tool) => register(tool),
    unregisterTool: (name) => unregister(name),
    provideContext: (context = {}) => {
      for (const name of provided) unregister(name);
      provided = [];
      for (const tool of context.tools || []) {
        try {
          register(tool);
          provided.push(tool.name);
        } catch (error) {
          warn(tool && tool.name, error);
        }
      }
    },
    clearContext: () => {
      for (const name of [...registered.keys()]) unregister(name);
      provided = [];
    },
  };

  Object.defineProperty(navigator, "modelContext", {
    value: legacy,
    configurable: true,
    enumerable: true,
    writable: true,
  });
})();
