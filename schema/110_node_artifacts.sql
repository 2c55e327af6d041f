-- Node-local artifacts (agent/artifacts.h): the URL of a node's artifact
-- server and the random token loomd presents to it, as the agent reported
-- them at its last registration ('' when the agent serves none: the job
-- directories are then on storage loomd reads itself).
ALTER TABLE nodes ADD COLUMN artifact_url TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN artifact_token TEXT NOT NULL DEFAULT '';
