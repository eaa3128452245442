-- GPU health, judged from what each node's agent reads from the driver (`tessera_core::health`): the state, the
-- findings that led to it (a JSON array), since when it holds, the newest XID judged (later reports' older XIDs do
-- not count again) and the latest report (JSON). An unhealthy GPU is cordoned and stays unhealthy until an admin
-- returns it to service (uncordons it).
ALTER TABLE gpus ADD COLUMN health TEXT NOT NULL DEFAULT 'healthy' CHECK (health IN ('healthy', 'degraded', 'unhealthy'));
ALTER TABLE gpus ADD COLUMN health_findings TEXT NOT NULL DEFAULT '[]';
ALTER TABLE gpus ADD COLUMN health_since_ms INTEGER;
ALTER TABLE gpus ADD COLUMN health_xid_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gpus ADD COLUMN health_report TEXT;

-- Drains: a GPU emptied for maintenance (cordoned; its holders' slices end at `deadline_ms` unless they end before).
-- `drained_at_ms` is set once it holds nothing. Uncordoning the GPU ends the drain (the row goes).
CREATE TABLE gpu_drains (
    gpu_id TEXT PRIMARY KEY REFERENCES gpus (id) ON DELETE CASCADE,
    deadline_ms INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,
    started_by TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    drained_at_ms INTEGER
);
