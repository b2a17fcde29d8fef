#!/usr/bin/env node
// A Leasehold task handler in Node, run by the bundled worker for each task:
//
//     worker --exec -- node examples/exec/square.mjs
//
// The task arrives on stdin as JSON; what is printed on stdout is its output. The exit code is
// the outcome: 0 succeeded, 65 (EX_DATAERR) failed for good, 75 (EX_TEMPFAIL) snoozed, any
// other failed and retried. stderr goes to the worker's log, and its end becomes the failure
// message. The worker stops the command with SIGTERM (then SIGKILL) when the task is cancelled
// or its lease is lost, and never completes the task after that.

let input = "";
for await (const chunk of process.stdin) input += chunk;
const task = JSON.parse(input);
const n = task.taskData.n;
if (typeof n !== "number") {
  console.error(`taskData.n must be a number, not ${JSON.stringify(n)}`);
  process.exit(65); // no attempt will do better
}
console.error(`task ${process.env.LEASEHOLD_TASK_ID}, attempt ${process.env.LEASEHOLD_ATTEMPT}`);
process.stdout.write(JSON.stringify({ square: n * n }));
