-- The requests table, the big one, partitioned by time: by ranges of batch_id, whose UUIDv7 ids
-- begin with their creation time in milliseconds, so a request's partition is found from its
-- batch id alone and every query by (batch_id, idx) reads one partition. When every batch of a
-- partition's time range has expired or was deleted, the purge drops the partition whole
-- (queue/retention.h) instead of deleting its rows.
--
-- The existing table becomes the first partition as it is, from the lowest id to now: no row is
-- copied, and a CHECK constraint, validated by one scan, spares ATTACH its own. The dispatcher
-- creates the next partitions, at its --partition-interval-s, from there and ahead of time
-- (request_partitions records them); the default partition catches a request whose partition is
-- not there yet, and its rows move into their partition when that is created. The migration runs in one transaction: a crash leaves the
-- table as it was, and the migration runs again from the start.

-- The smallest UUIDv7 of the millisecond `t`: a partition bound.
CREATE FUNCTION hr_uuid_v7_floor(t timestamptz) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
  SELECT (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-0000-0000-000000000000')::uuid
  FROM (SELECT lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') AS h) AS s
$$;
-- The creation time of a UUIDv7.
CREATE FUNCTION hr_uuid_v7_time(id uuid) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
  SELECT to_timestamp(('x' || lpad(substr(replace(id::text, '-', ''), 1, 12), 16, '0'))::bit(64)
                      ::bigint / 1000.0)
$$;

-- Every partition but the default: the batches created in [lo_at, hi_at) have their requests in
-- it. lo_at is -infinity for the first one.
CREATE TABLE request_partitions (
  name        text PRIMARY KEY,
  lo_at       timestamptz NOT NULL,
  hi_at       timestamptz NOT NULL UNIQUE,
  created_at  timestamptz NOT NULL DEFAULT now(),
  CHECK (lo_at < hi_at)
);

ALTER TABLE requests RENAME TO requests_legacy;
ALTER INDEX requests_pkey RENAME TO requests_legacy_pkey;
ALTER INDEX requests_lease_idx RENAME TO requests_legacy_lease_idx;
ALTER INDEX requests_push_pending RENAME TO requests_legacy_push_pending;

CREATE TABLE requests (
  LIKE requests_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
  PRIMARY KEY (batch_id, idx),
  CONSTRAINT requests_batch_fkey FOREIGN KEY (batch_id) REFERENCES batches (id) ON DELETE CASCADE
) PARTITION BY RANGE (batch_id);
-- The janitor's lease sweep, and the requests whose push to Redis is not known to have happened.
CREATE INDEX requests_lease_idx ON requests (lease_expires_at) WHERE status = 'running';
CREATE INDEX requests_push_pending ON requests (batch_id, idx) WHERE push_pending;

DO $$
DECLARE
  bound timestamptz := date_trunc('second', now()) + interval '1 second';
  newest timestamptz;
BEGIN
  -- Ids made by a clock ahead of this one stay in the first partition too.
  SELECT hr_uuid_v7_time(batch_id) INTO newest FROM requests_legacy
    ORDER BY batch_id DESC LIMIT 1;
  IF newest IS NOT NULL AND newest >= bound THEN
    bound := date_trunc('second', newest) + interval '1 second';
  END IF;
  EXECUTE format('ALTER TABLE requests_legacy ADD CONSTRAINT requests_legacy_range '
                 'CHECK (batch_id IS NOT NULL AND batch_id < %L::uuid)', hr_uuid_v7_floor(bound));
  EXECUTE format('ALTER TABLE requests ATTACH PARTITION requests_legacy '
                 'FOR VALUES FROM (MINVALUE) TO (%L)', hr_uuid_v7_floor(bound));
  INSERT INTO request_partitions (name, lo_at, hi_at) VALUES ('requests_legacy', '-infinity', bound);
END $$;

CREATE TABLE requests_default PARTITION OF requests DEFAULT WITH (fillfactor = 80);
