-- Running totals of what each tenant's live requests hold, kept in the same transactions that create and end
-- requests, so a quota check reads one row per resource instead of summing every live request.

CREATE TABLE tenant_usage (
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    held_milli BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, resource)
);

INSERT INTO tenant_usage (tenant_id, resource, held_milli)
SELECT r.tenant_id, c.resource, SUM(c.amount_milli)
FROM request_charges c JOIN slice_requests r ON r.id = c.request_id
WHERE r.state IN ('pending', 'approved', 'provisioning', 'active')
GROUP BY r.tenant_id, c.resource;

-- Request pages are read by tenant in id order.
CREATE INDEX slice_requests_by_tenant_id ON slice_requests (tenant_id, id);
