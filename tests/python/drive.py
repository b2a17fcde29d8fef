"""One lease's life and one task's life through Python clients generated from Leasehold's
OpenAPI documents by openapi-python-client, which no one here wrote: what a worker written in
another language would do, knowing only the documents.

Usage: drive.py LEASE_URL TASK_URL TOKEN (the generated packages `lease_client` and
`task_client` on PYTHONPATH). Exits 0 when every step answered as the documents say.
"""

import sys
import uuid

from lease_client import AuthenticatedClient as LeaseService
from lease_client.api.leases import acquire, get_by_id as get_lease, release, renew
from lease_client.models import AcquireLease, Lease, LeaseStatus, OneLease, ReleaseLease, RenewLease
from task_client import AuthenticatedClient as TaskService
from task_client.api.tasks import complete, create, get_by_id as get_task, heartbeat, next_
from task_client.models import (
    ClaimTasks,
    CompleteTask,
    CreateTask,
    JsonObject,
    Heartbeat,
    OneTask,
    Task,
    TaskStatus,
)


def expect(what, answer, status, kind):
    assert answer.status_code == status, f"{what}: {answer.status_code} {answer.content!r}"
    assert isinstance(answer.parsed, kind), f"{what}: {answer.parsed!r}"
    print(f"{what}: {answer.status_code}")
    return answer.parsed


def lease_life(leases):
    resource, holder = f"py-{uuid.uuid4()}", "python-worker"
    lease = expect(
        "acquire",
        acquire.sync_detailed(client=leases, body=AcquireLease(resource=resource, holder=holder, ttl_seconds=30)),
        201,
        Lease,
    )
    renewed = expect(
        "renew",
        renew.sync_detailed(
            client=leases,
            body=RenewLease(resource=resource, holder=holder, fence=lease.fence, secret=lease.secret),
        ),
        200,
        Lease,
    )
    assert renewed.fence == lease.fence, "a renewal keeps the fence"
    expect(
        "release",
        release.sync_detailed(
            client=leases,
            body=ReleaseLease(resource=resource, holder=holder, fence=lease.fence, secret=lease.secret),
        ),
        200,
        Lease,
    )
    read = expect("read the lease", get_lease.sync_detailed(lease.id, client=leases), 200, OneLease)
    assert read.lease.status == LeaseStatus.RELEASED, read.lease.status
    again = expect(
        "acquire again",
        acquire.sync_detailed(client=leases, body=AcquireLease(resource=resource, holder="another")),
        201,
        Lease,
    )
    assert again.fence > lease.fence, "a new acquisition gets a greater fence"


def task_life(tasks):
    data = JsonObject.from_dict({"sleep_duration_seconds": 0})
    queue = f"py-{uuid.uuid4().hex[:12]}"
    created = expect("create", create.sync_detailed(client=tasks, body=CreateTask(task_data=data, queue=queue)), 201, Task)
    claimed = expect(
        "claim",
        next_.sync_detailed(client=tasks, body=ClaimTasks(processor="python-worker", queue=queue)),
        202,
        Task,
    )
    assert claimed.id == created.id and claimed.status == TaskStatus.RUNNING, claimed
    expect(
        "heartbeat",
        heartbeat.sync_detailed(claimed.id, client=tasks, body=Heartbeat(processor="python-worker", fence=claimed.fence)),
        202,
        Task,
    )
    done = expect(
        "complete",
        complete.sync_detailed(
            claimed.id, client=tasks, body=CompleteTask(processor="python-worker", fence=claimed.fence)
        ),
        202,
        Task,
    )
    assert done.status == TaskStatus.SUCCEEDED, done.status
    read = expect("read the task", get_task.sync_detailed(created.id, client=tasks), 200, OneTask)
    assert read.task.status == TaskStatus.SUCCEEDED, read.task.status


if __name__ == "__main__":
    lease_url, task_url, token = sys.argv[1:4]
    lease_life(LeaseService(base_url=lease_url, token=token))
    task_life(TaskService(base_url=task_url, token=token))
    print("ok")
