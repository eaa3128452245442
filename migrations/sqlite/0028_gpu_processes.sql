-- Every compute process on a node's devices as its agent last reported it, with whose it is: the allocation it runs
-- under, or why it is unallocated use (`stray`: no_allocation, other_tenant, ungoverned_pod). Replaced per node
-- on each report; `since_ms` is when the process was first seen on the device.

CREATE TABLE gpu_processes (
    node_id TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    gpu_id TEXT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    device TEXT NOT NULL,
    pid BIGINT NOT NULL,
    user_name TEXT,
    command TEXT,
    namespace TEXT,
    pod TEXT,
    container TEXT,
    allocation_id TEXT,
    stray TEXT CHECK (stray IN ('no_allocation', 'other_tenant', 'ungoverned_pod')),
    since_ms BIGINT NOT NULL,
    PRIMARY KEY (node_id, device, pid)
);
CREATE INDEX gpu_processes_by_allocation ON gpu_processes (allocation_id);
CREATE INDEX gpu_processes_strays ON gpu_processes (stray) WHERE stray IS NOT NULL;
