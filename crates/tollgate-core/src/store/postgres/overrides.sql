
-- Version 8: runtime overrides, one row per overridden descriptor of each key prefix,
-- the override's JSON as the API takes it. Always logged: overrides outlive a crash.
CREATE TABLE IF NOT EXISTS tollgate_overrides (
    prefix text NOT NULL,
    id text NOT NULL,
    spec text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prefix, id)
);
