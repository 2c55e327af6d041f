-- The scheduler reads the head of the queue in its own order (priority, then
-- submission) with a LIMIT, so a deep queue costs a pass only the rows it
-- can act on.
CREATE INDEX jobs_state_prio_seq ON jobs(state, priority DESC, seq);
