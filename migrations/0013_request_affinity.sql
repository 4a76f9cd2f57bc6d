-- Cache-aware dispatch (docs/cache-aware-dispatch.md).
--   requests.affinity  a 64-bit key of what the request's prompt starts with (its account, and the
--                      submit's x-session-affinity or its leading system messages and tools):
--                      the relay sends requests with one key to the same live worker, whose
--                      prefix cache then holds that start once (NULL: none, any worker)
ALTER TABLE requests ADD COLUMN affinity bigint;
