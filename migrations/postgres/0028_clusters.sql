-- Kubernetes clusters Tessera governs: how each hands out GPUs (`dra` or `device_plugin`) and how the server reaches
-- it (`kubeconfig` NULL: the server's own in-cluster service account; otherwise the name of a kubeconfig in the
-- server's settings, never the file itself). Each governed namespace belongs to one tenant; a node is in at most one
-- cluster, set by a platform admin.

CREATE TABLE clusters (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    mode TEXT NOT NULL CHECK (mode IN ('dra', 'device_plugin')),
    kubeconfig TEXT,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE cluster_namespaces (
    cluster_id TEXT NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    namespace TEXT NOT NULL,
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (cluster_id, namespace)
);
CREATE INDEX cluster_namespaces_by_tenant ON cluster_namespaces (tenant_id);

ALTER TABLE nodes ADD COLUMN cluster_id TEXT REFERENCES clusters (id) ON DELETE SET NULL;
CREATE INDEX nodes_by_cluster ON nodes (cluster_id);
-- The active allocations of a cluster's GPUs (what its ResourceClaims are built from).
CREATE INDEX allocations_active_by_gpu ON allocations (gpu_id) WHERE state = 'active';
