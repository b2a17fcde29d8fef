#!/usr/bin/env python3
"""A Leasehold task handler in Python, run by the bundled worker for each task:

    worker --exec -- python3 examples/exec/square.py

The task arrives on stdin as JSON; what is printed on stdout is its output. The exit code is
the outcome: 0 succeeded, 65 (EX_DATAERR) failed for good, 75 (EX_TEMPFAIL) snoozed, any
other failed and retried. stderr goes to the worker's log, and its end becomes the failure
message. The worker stops the command with SIGTERM (then SIGKILL) when the task is
cancelled or its lease is lost, and never completes the task after that.
"""

import json
import os
import sys

task = json.load(sys.stdin)
n = task["taskData"].get("n")
if not isinstance(n, (int, float)):
    print(f"taskData.n must be a number, not {n!r}", file=sys.stderr)
    sys.exit(65)  # no attempt will do better
print(f"task {os.environ['LEASEHOLD_TASK_ID']}, attempt {os.environ['LEASEHOLD_ATTEMPT']}",
      file=sys.stderr)
json.dump({"square": n * n}, sys.stdout)
