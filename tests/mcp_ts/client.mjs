// Drives `airlock mcp` with the official MCP TypeScript SDK client (issue 31).
//
// Usage: node client.mjs SPEC.json where the file holds
//   {"command": "...", "args": [...], "env": {...}, "steps": [{"tool": "execute", "arguments": {...},
//     "timeoutMs": 10000, "abortAfterMs": 500, "progress": true, "raw": "<a line to send as is>"}]}
// Prints one JSON object: the server's tools, each step's outcome, transport errors, and
// whether the connection closed before the end.  Each step's outcome is
// {"result": {...}} or {"error": {"code", "message"}}, with its progress messages and time.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { readFileSync } from "node:fs";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
// The SDK passes a server only a few variables (HOME, PATH...); spec.env adds the test's own.
const transport = new StdioClientTransport({
  command: spec.command,
  args: spec.args,
  env: { ...getDefaultEnvironment(), ...(spec.env ?? {}) },
  stderr: "inherit",
});
const client = new Client({ name: "airlock-ts-test", version: "1.0.0" });
const transportErrors = [];
let closed = false;
client.onerror = (err) => transportErrors.push(String(err && err.message ? err.message : err));
client.onclose = () => {
  closed = true;
};
await client.connect(transport);
const out = { protocolVersion: transport._protocolVersion ?? null, tools: [], steps: [] };
out.tools = (await client.listTools()).tools;

for (const step of spec.steps) {
  const started = Date.now();
  const progress = [];
  const outcome = { progress };
  const controller = new AbortController();
  let timer = null;
  if (step.abortAfterMs !== undefined) timer = setTimeout(() => controller.abort("test gives up"), step.abortAfterMs);
  try {
    const options = {
      timeout: step.timeoutMs ?? 60000,
      signal: controller.signal,
      resetTimeoutOnProgress: true,
    };
    if (step.progress) options.onprogress = (p) => progress.push(p);
    if (step.tool === "ping") {
      outcome.result = await client.ping(options);
    } else {
      outcome.result = await client.callTool({ name: step.tool, arguments: step.arguments ?? {} }, undefined, options);
    }
  } catch (err) {
    outcome.error = { code: err.code ?? null, message: String(err.message ?? err) };
  } finally {
    if (timer) clearTimeout(timer);
  }
  outcome.elapsedMs = Date.now() - started;
  outcome.closedAfter = closed;
  out.steps.push(outcome);
}
out.transportErrors = transportErrors;
out.closed = closed;
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
