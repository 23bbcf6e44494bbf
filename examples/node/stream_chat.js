#!/usr/bin/env node
// Streams a chat completion from the ssd-serve gateway's ssd.v1.Generation API (gRPC), printing the text
// deltas as they arrive. The protos load unchanged from their one proto root (the repository's protos/), the
// API key travels as `authorization: Bearer KEY` metadata, exactly as for the Python stubs.
//
//   npm ci --ignore-scripts        (in this folder, once)
//   node stream_chat.js --address 127.0.0.1:50050 --api-key KEY "Write a haiku about the sea."
//
// stdout: the completion text only. stderr: one JSON line at the end (finish reason, usage, deltas), or the
// gRPC error; the exit status is 0 on success, 1 on a gRPC error, 2 on bad arguments.
"use strict";

const path = require("node:path");
const { parseArgs } = require("node:util");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const USAGE = "usage: stream_chat.js [--address HOST:PORT] [--api-key KEY] [--max-tokens N] [--temperature T]"
  + " [--mode ar|sd|ssd] [--system TEXT] [--proto-root DIR] PROMPT";

function options() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      address: { type: "string", default: process.env.SSD_GRPC_ADDRESS || "127.0.0.1:50050" },
      "api-key": { type: "string", default: process.env.SSD_API_KEY || "" },
      "max-tokens": { type: "string", default: "128" },
      temperature: { type: "string", default: "0" },
      mode: { type: "string" },
      system: { type: "string" },
      "proto-root": { type: "string", default: path.join(__dirname, "..", "..", "protos") },
    },
  });
  if (positionals.length !== 1) throw new Error(USAGE);
  if (values.mode !== undefined && !["ar", "sd", "ssd"].includes(values.mode)) throw new Error(USAGE);
  for (const name of ["max-tokens", "temperature"]) {
    if (!Number.isFinite(Number(values[name]))) throw new Error(`--${name} must be a number\n${USAGE}`);
  }
  return { ...values, prompt: positionals[0] };
}

// The Generation service from ssd/v1/gateway.proto, with the proto root as the only include path.
function generationClient(protoRoot, address) {
  const definition = protoLoader.loadSync("ssd/v1/gateway.proto", {
    includeDirs: [protoRoot], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  const ssd = grpc.loadPackageDefinition(definition).ssd.v1;
  return new ssd.Generation(address, grpc.credentials.createInsecure());
}

function request(opts) {
  const messages = [];
  if (opts.system) messages.push({ role: "system", content: opts.system });
  messages.push({ role: "user", content: opts.prompt });
  const req = {
    chat: { messages }, max_tokens: Number(opts["max-tokens"]), temperature: Number(opts.temperature),
  };
  if (opts.mode) req.mode = `SPECULATION_MODE_${opts.mode.toUpperCase()}`;
  return req;
}

function main() {
  let opts;
  try {
    opts = options();
  } catch (err) {
    process.stderr.write(`${err.message}\n`);
    process.exit(2);
  }
  const client = generationClient(opts["proto-root"], opts.address);
  const metadata = new grpc.Metadata();
  if (opts["api-key"]) metadata.set("authorization", `Bearer ${opts["api-key"]}`);
  const call = client.GenerateStream(request(opts), metadata);
  let numDeltas = 0;
  let last = null;
  call.on("data", (delta) => {
    numDeltas += 1;
    process.stdout.write(delta.text);
    last = delta;
  });
  let failed = false;
  call.on("error", (err) => {  // the call failed: grpc-js emits this before 'end'
    failed = true;
    process.stderr.write(`${JSON.stringify({ error: grpc.status[err.code], details: err.details })}\n`);
    process.exitCode = 1;
    client.close();
  });
  call.on("end", () => {  // after the last 'data'
    if (!failed) {
      const summary = { num_deltas: numDeltas, finish_reason: last && last.finish_reason,
        usage: last && last.usage };
      process.stderr.write(`${JSON.stringify(summary)}\n`);
    }
    client.close();
  });
}

main();
