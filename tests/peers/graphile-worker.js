// graphile-worker's side of the bench's `peers` section (tests/src/bench/peers.rs): the same
// backlog of no-op tasks as Leasehold's end-to-end runs, created in batches of 1,000, then
// drained by one worker process. Prints one JSON line: the drain's seconds (first task started
// → the last completion committed, i.e. the jobs table empty), the create's seconds, and the
// process's own CPU milliseconds over create and drain.
//
//   node graphile-worker.js migrate <url>
//   node graphile-worker.js single|batched <url> <tasks> <concurrency>
//   node graphile-worker.js pickup <url> <samples>
//
// `pickup` is its idle pickup, as the bench takes Leasehold's: one worker waiting (LISTEN),
// a job added only once the one before it has started, each from its creation to its start by
// the database's clock (the job row's `locked_at - created_at`, read while the job runs).
"use strict";
const { run, makeWorkerUtils, Logger } = require("graphile-worker");

// Errors and warnings only, as the Leasehold processes run at RUST_LOG=warn.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});

async function main() {
  const [mode, connectionString, count, concurrency] = process.argv.slice(2);
  const utils = await makeWorkerUtils({ connectionString, logger });
  try {
    if (mode === "migrate") {
      await utils.migrate();
      return;
    }
    if (mode === "pickup") {
      console.log(JSON.stringify({ pickupMs: await pickup(connectionString, Number(count), utils) }));
      return;
    }
    const total = Number(count);
    const cpuStart = process.cpuUsage();
    const createStart = process.hrtime.bigint();
    for (let i = 0; i < total; i += 1000) {
      const jobs = Array.from({ length: Math.min(1000, total - i) }, () => ({
        identifier: "noop",
        payload: { sleep_duration_seconds: 0 },
      }));
      await utils.addJobs(jobs);
    }
    const createSeconds = Number(process.hrtime.bigint() - createStart) / 1e9;

    let first = null;
    let done = 0;
    let allRan;
    const ran = new Promise((resolve) => (allRan = resolve));
    const jobs = Number(concurrency);
    const runner = await run({
      connectionString,
      concurrency: jobs,
      // graphile-worker's advice: at least concurrency + 2 connections.
      maxPoolSize: jobs + 2,
      noHandleSignals: true,
      logger,
      taskList: {
        noop: async () => {
          if (first === null) first = process.hrtime.bigint();
          done += 1;
          if (done === total) allRan();
        },
      },
      // Batched: jobs fetched 500 at a time into a local queue, completions sent together.
      preset:
        mode === "batched"
          ? { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
          : {},
    });
    await ran;
    for (;;) {
      const { rows } = await utils.withPgClient((client) =>
        client.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"),
      );
      if (rows[0].n === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const seconds = Number(process.hrtime.bigint() - first) / 1e9;
    const cpu = process.cpuUsage(cpuStart);
    await runner.stop();
    console.log(
      JSON.stringify({ tasks: total, seconds, createSeconds, cpuMs: (cpu.user + cpu.system) / 1000 }),
    );
  } finally {
    await utils.release();
  }
}

async function pickup(connectionString, samples, utils) {
  let started;
  const runner = await run({
    connectionString,
    concurrency: 1,
    noHandleSignals: true,
    logger,
    taskList: {
      noop: async (_payload, helpers) => {
        const { rows } = await helpers.withPgClient((client) =>
          client.query(
            "SELECT (EXTRACT(EPOCH FROM locked_at - created_at) * 1000)::float8 AS ms " +
              "FROM graphile_worker._private_jobs WHERE id = $1",
            [helpers.job.id],
          ),
        );
        started(rows[0].ms);
      },
    },
  });
  const pickups = [];
  for (let i = 0; i < samples; i += 1) {
    // Idle between samples, as the worker would be: waiting on its LISTEN again.
    await new Promise((resolve) => setTimeout(resolve, 20));
    const ran = new Promise((resolve) => (started = resolve));
    await utils.addJob("noop", { sleep_duration_seconds: 0 });
    pickups.push(await ran);
  }
  await runner.stop();
  return pickups;
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
