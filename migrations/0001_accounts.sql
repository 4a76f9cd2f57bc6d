-- Accounts and their API keys. Keys are random 32-byte secrets; only their SHA-256 is stored
-- (high-entropy tokens need no salt), with a short prefix kept for display.
CREATE TABLE accounts (
  id          uuid PRIMARY KEY,
  name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 128),
  created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
  id          uuid PRIMARY KEY,
  account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  key_hash    bytea NOT NULL UNIQUE,
  prefix      text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  revoked_at  timestamptz
);
CREATE INDEX api_keys_account_idx ON api_keys (account_id);
