#!/bin/sh
# The sample's sleep task as a shell command, run by the bundled worker for each task:
#
#     worker --exec -- sh examples/exec/sleep.sh
#
# The task arrives on stdin as JSON (taskData.sleep_duration_seconds is the sample's field);
# what is printed on stdout is its output. Exit 65 (EX_DATAERR) fails the task for good; the
# worker sends SIGTERM to the whole process group when the task is cancelled or its lease is
# lost, and the sleep ends with it. The compose stack runs this in the project's image, which
# has no interpreter but sh.
set -eu
seconds=$(sed -n 's/.*"sleep_duration_seconds": *\([0-9.]*\).*/\1/p')
if [ -z "$seconds" ]; then
    echo "taskData.sleep_duration_seconds must be a number of seconds" >&2
    exit 65
fi
echo "task $LEASEHOLD_TASK_ID: sleeping $seconds s" >&2
sleep "$seconds"
printf '{"slept_seconds": %s, "by": "sh"}\n' "$seconds"
