#!/usr/bin/env node
// A Leasehold push endpoint in Node (node:http only): the bundled worker, run beside this
// application, POSTs each task it claims here.
//
//     PUSH_SECRET=whsec_... node examples/push/app.mjs 8000
//     WORKER_PUSH_URL=http://127.0.0.1:8000/tasks WORKER_PUSH_SECRET=whsec_... worker
//
// The body is the task as JSON; the answer is the outcome: 2xx succeeded (the body its output),
// 429 or 503 with Retry-After snoozed, another 4xx failed for good, 5xx failed and retried.
// Each request carries a Standard Webhooks signature, checked here so that only the worker is
// heard.
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";

const key = Buffer.from(process.env.PUSH_SECRET.replace(/^whsec_/, ""), "base64");

// Standard Webhooks: v1, the base64 HMAC-SHA256 of "{id}.{timestamp}.{body}".
function signedByTheWorker(headers, body) {
  const timestamp = headers["webhook-timestamp"] ?? "";
  if (!/^\d+$/.test(timestamp) || Math.abs(Date.now() / 1000 - Number(timestamp)) > 300) {
    return false; // unsigned, or too old to be this delivery
  }
  const expected = Buffer.from("v1," + createHmac("sha256", key)
    .update(`${headers["webhook-id"] ?? ""}.${timestamp}.`).update(body).digest("base64"));
  return (headers["webhook-signature"] ?? "").split(" ").map((s) => Buffer.from(s)).some(
    (offered) => offered.length === expected.length && timingSafeEqual(offered, expected));
}

function answer(response, status, value) {
  response.writeHead(status, { "Content-Type": "application/json" });
  response.end(JSON.stringify(value));
}

createServer(async (request, response) => {
  const chunks = [];
  for await (const chunk of request) chunks.push(chunk);
  const body = Buffer.concat(chunks);
  if (!signedByTheWorker(request.headers, body)) {
    return answer(response, 401, { error: "not signed by our worker" });
  }
  // Signed by the worker, so the body is a task.
  const n = JSON.parse(body).taskData.n;
  if (typeof n !== "number") {
    return answer(response, 422, { error: `taskData.n must be a number, not ${JSON.stringify(n)}` });
  }
  answer(response, 200, { square: n * n });
}).listen(Number(process.argv[2]), "127.0.0.1");
