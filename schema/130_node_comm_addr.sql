-- The address a node's workers listen on for worker-to-worker traffic and the
-- interface holding it, as the agent advertises them at registration
-- (agent/commaddr.h): kept so that rank 0's address is known to a restarted
-- loomd before the agents register again. '' when the agent chose none.
ALTER TABLE nodes ADD COLUMN comm_addr TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN comm_iface TEXT NOT NULL DEFAULT '';
