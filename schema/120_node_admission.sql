-- Node admission (daemon/nodes.h): a node that registers with the join token
-- is 'pending' until an admin approves it (POST /v1/nodes/{id}/approve), unless
-- loomd runs with --auto-approve. Each node has its own credential, issued at
-- registration and valid for the agent's calls once the node is approved; only
-- its SHA-256 (hex) is kept. Reject and DELETE (revoke) clear it. Nodes that
-- registered before this migration stay approved and receive a credential at
-- their next registration. Times are integer ms since the Unix epoch (UTC).
ALTER TABLE nodes ADD COLUMN admission TEXT NOT NULL DEFAULT 'approved'; -- pending | approved | rejected | revoked
ALTER TABLE nodes ADD COLUMN cred_hash TEXT;                             -- hex SHA-256 of the node credential
ALTER TABLE nodes ADD COLUMN admitted_at INTEGER;                        -- last approve/reject/revoke
ALTER TABLE nodes ADD COLUMN admitted_by TEXT;                           -- token id of that admin ("admin", "k-...")
