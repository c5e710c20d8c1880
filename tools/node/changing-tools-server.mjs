// An MCP server over streamable HTTP whose tool list changes on request,
// for testing that a client follows notifications/tools/list_changed.
//
// The reference server (server-everything) announces its one change right
// after initialize, before a client has opened its GET stream, so over
// HTTP that notification is dropped by the server. Here the change is made
// by a tool call, and the notification is sent on that call's own stream,
// so it reaches the client before the call's result does.
//
// Tools: add_tool {name} adds a tool `name` that answers "hello from
// <name>"; remove_tool {name} removes it again.
//
// Usage: node changing-tools-server.mjs  (PORT, default 3001; path /mcp)

import { createServer } from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

function newServer() {
  const server = new McpServer(
    { name: "changing-tools", version: "1.0.0" },
    { capabilities: { tools: { listChanged: true } } },
  );
  const added = new Map();
  const announce = (extra) =>
    extra.sendNotification({ method: "notifications/tools/list_changed" });
  server.registerTool(
    "add_tool",
    { description: "Add a tool with this name.", inputSchema: { name: z.string() } },
    async ({ name }, extra) => {
      if (!added.has(name)) {
        added.set(name, server.registerTool(
          name,
          { description: `Say hello from ${name}.`, inputSchema: {} },
          async () => ({ content: [{ type: "text", text: `hello from ${name}` }] }),
        ));
      }
      await announce(extra);
      return { content: [{ type: "text", text: `added ${name}` }] };
    },
  );
  server.registerTool(
    "remove_tool",
    { description: "Remove a tool added before.", inputSchema: { name: z.string() } },
    async ({ name }, extra) => {
      added.get(name)?.remove();
      added.delete(name);
      await announce(extra);
      return { content: [{ type: "text", text: `removed ${name}` }] };
    },
  );
  return server;
}

const sessions = new Map();

const http = createServer(async (req, res) => {
  if (!req.url.startsWith("/mcp")) {
    res.writeHead(404).end();
    return;
  }
  const id = req.headers["mcp-session-id"];
  let transport = id && sessions.get(id);
  if (!transport) {
    if (req.method !== "POST" || id) {
      res.writeHead(400, { "content-type": "application/json" })
        .end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "No valid session" }, id: null }));
      return;
    }
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (sessionId) => sessions.set(sessionId, transport),
    });
    transport.onclose = () => sessions.delete(transport.sessionId);
    await newServer().connect(transport);
  }
  await transport.handleRequest(req, res);
});

const port = Number(process.env.PORT || 3001);
http.listen(port, "127.0.0.1", () => console.log(`changing-tools server on http://127.0.0.1:${port}/mcp`));
