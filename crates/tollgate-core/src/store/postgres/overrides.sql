-- Version 8: runtime overrides, one row per overridden descriptor of each key prefix,
-- the override's JSON as the API takes it. Always logged: overrides outlive a crash.
CREATE TABLE IF NOT EXISTS tollgate_overrides (
    prefix text NOT NULL,
    id text NOT NULL,
    spec text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (prefix, id)
);

-- Version 12: a change log, so that instances read what changed, not the whole set.
-- Each row carries the version of its last change and its expiry (read from its JSON,
-- Unix seconds); a delete leaves a tombstone with its version, the newest
-- tollgate_override_log_keep() kept. Per prefix, tollgate_override_meta holds the log's
-- epoch (a new one means start over), its version, the newest version trimmed away, the
-- rows counted, and the channel instances listen on. Triggers keep all of it, so that a
-- change made by an older Tollgate, or by hand, is logged and announced too.
ALTER TABLE tollgate_overrides ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;
ALTER TABLE tollgate_overrides ADD COLUMN IF NOT EXISTS expires_at bigint;
CREATE INDEX IF NOT EXISTS tollgate_overrides_version ON tollgate_overrides (prefix, version);
CREATE INDEX IF NOT EXISTS tollgate_overrides_expiry ON tollgate_overrides (prefix, expires_at)
    WHERE expires_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS tollgate_override_tombstones (
    prefix text NOT NULL,
    version bigint NOT NULL,
    id text NOT NULL,
    PRIMARY KEY (prefix, version)
);

CREATE TABLE IF NOT EXISTS tollgate_override_meta (
    prefix text PRIMARY KEY,
    epoch text NOT NULL,
    version bigint NOT NULL,
    trimmed bigint NOT NULL,
    live bigint NOT NULL,
    tombstones bigint NOT NULL,
    channel text
);

CREATE OR REPLACE FUNCTION tollgate_override_log_keep() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 10000::bigint $$;

-- The expiry in an override's JSON; none when it has none or is not JSON.
CREATE OR REPLACE FUNCTION tollgate_override_expiry(p_spec text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (p_spec::jsonb ->> 'expires_at')::bigint;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- The next version of prefix p_prefix's log, `p_delta` rows fewer, announced on its
-- channel when one is known; the meta row is made (counting the rows there) when it is
-- missing, and stays locked until the transaction ends.
CREATE OR REPLACE FUNCTION tollgate_override_bump(p_prefix text, p_delta integer)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v bigint;
    ch text;
BEGIN
    INSERT INTO tollgate_override_meta AS m (prefix, epoch, version, trimmed, live, tombstones)
    VALUES (p_prefix, md5(random()::text || clock_timestamp()::text), 1, 0,
            (SELECT count(*) FROM tollgate_overrides WHERE prefix = p_prefix), 0)
    ON CONFLICT (prefix) DO UPDATE SET version = m.version + 1, live = m.live + p_delta
    RETURNING m.version, m.channel INTO v, ch;
    IF ch IS NOT NULL THEN
        PERFORM pg_notify(ch, 'overrides');
    END IF;
    RETURN v;
END $$;

-- Before a row is written (an INSERT … ON CONFLICT that updates runs both this insert's
-- and the update's): its expiry and version. Counted once inserted, below.
CREATE OR REPLACE FUNCTION tollgate_override_written() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.expires_at := tollgate_override_expiry(NEW.spec);
    NEW.version := tollgate_override_bump(NEW.prefix, 0);
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION tollgate_override_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tollgate_override_meta SET live = live + 1 WHERE prefix = NEW.prefix;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION tollgate_override_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v bigint;
    excess bigint;
    newest bigint;
BEGIN
    v := tollgate_override_bump(OLD.prefix, -1);
    INSERT INTO tollgate_override_tombstones (prefix, version, id) VALUES (OLD.prefix, v, OLD.id);
    UPDATE tollgate_override_meta SET tombstones = tombstones + 1 WHERE prefix = OLD.prefix
    RETURNING tombstones - tollgate_override_log_keep() INTO excess;
    IF excess > 0 THEN
        WITH gone AS (
            DELETE FROM tollgate_override_tombstones
            WHERE prefix = OLD.prefix AND version IN (
                SELECT version FROM tollgate_override_tombstones WHERE prefix = OLD.prefix
                ORDER BY version LIMIT excess)
            RETURNING version)
        SELECT max(version) INTO newest FROM gone;
        UPDATE tollgate_override_meta
        SET tombstones = tombstones - excess, trimmed = greatest(trimmed, coalesce(newest, 0))
        WHERE prefix = OLD.prefix;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS tollgate_override_written ON tollgate_overrides;
CREATE TRIGGER tollgate_override_written BEFORE INSERT OR UPDATE ON tollgate_overrides
    FOR EACH ROW EXECUTE FUNCTION tollgate_override_written();
DROP TRIGGER IF EXISTS tollgate_override_inserted ON tollgate_overrides;
CREATE TRIGGER tollgate_override_inserted AFTER INSERT ON tollgate_overrides
    FOR EACH ROW EXECUTE FUNCTION tollgate_override_inserted();
DROP TRIGGER IF EXISTS tollgate_override_deleted ON tollgate_overrides;
CREATE TRIGGER tollgate_override_deleted AFTER DELETE ON tollgate_overrides
    FOR EACH ROW EXECUTE FUNCTION tollgate_override_deleted();

-- Rows written before version 12: their expiry read, each logged once.
UPDATE tollgate_overrides SET spec = spec
WHERE version = 0;

-- Deletes up to `p_batch` overrides of p_prefix expired at `p_now` (Unix seconds).
CREATE OR REPLACE FUNCTION tollgate_override_purge(p_prefix text, p_now bigint, p_batch integer)
RETURNS void LANGUAGE sql AS $$
    DELETE FROM tollgate_overrides
    WHERE prefix = p_prefix AND id IN (
        SELECT id FROM tollgate_overrides
        WHERE prefix = p_prefix AND expires_at <= p_now
        LIMIT p_batch)
$$;

-- Makes the meta row of p_prefix if missing, sets its channel, and locks it until the
-- transaction ends: every change of p_prefix's overrides waits for the one before.
CREATE OR REPLACE FUNCTION tollgate_override_lock(p_prefix text, p_channel text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ch text;
BEGIN
    INSERT INTO tollgate_override_meta (prefix, epoch, version, trimmed, live, tombstones, channel)
    VALUES (p_prefix, md5(random()::text || clock_timestamp()::text), 0, 0,
            (SELECT count(*) FROM tollgate_overrides WHERE prefix = p_prefix), 0, p_channel)
    ON CONFLICT (prefix) DO NOTHING;
    SELECT m.channel INTO ch FROM tollgate_override_meta m WHERE m.prefix = p_prefix FOR UPDATE;
    IF p_channel IS NOT NULL AND ch IS DISTINCT FROM p_channel THEN
        UPDATE tollgate_override_meta SET channel = p_channel WHERE prefix = p_prefix;
    END IF;
END $$;

-- Sets (p_spec) or deletes (p_spec null) the override p_id of p_prefix, unless the
-- database's clock is past p_deadline (µs), or a new id would make more than p_max live
-- overrides. Returns {'late'}, {'full', live}, or {'set' or 'deleted', the live override
-- replaced or deleted (null: none)}.
CREATE OR REPLACE FUNCTION tollgate_override_change(
    p_prefix text, p_id text, p_spec text, p_max bigint, p_deadline bigint, p_channel text)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint;
    now_s bigint;
    previous text;
    live bigint;
BEGIN
    PERFORM tollgate_override_lock(p_prefix, p_channel);
    -- Read after the lock: a change that waited for another past its deadline is late,
    -- and once past it nothing else of this call runs.
    now_us := tollgate_now_us();
    IF now_us > p_deadline THEN
        RETURN ARRAY['late'];
    END IF;
    now_s := now_us / 1000000;
    PERFORM tollgate_override_purge(p_prefix, now_s, 1000);
    SELECT spec INTO previous FROM tollgate_overrides
    WHERE prefix = p_prefix AND id = p_id AND (expires_at IS NULL OR expires_at > now_s);
    IF p_spec IS NULL THEN
        DELETE FROM tollgate_overrides WHERE prefix = p_prefix AND id = p_id;
        RETURN ARRAY['deleted', previous];
    END IF;
    IF previous IS NULL THEN
        SELECT m2.live - (SELECT count(*) FROM tollgate_overrides
                          WHERE prefix = p_prefix AND expires_at <= now_s)
        INTO live FROM tollgate_override_meta m2 WHERE m2.prefix = p_prefix;
        IF live >= p_max THEN
            RETURN ARRAY['full', live::text];
        END IF;
    END IF;
    INSERT INTO tollgate_overrides (prefix, id, spec) VALUES (p_prefix, p_id, p_spec)
    ON CONFLICT (prefix, id) DO UPDATE SET spec = excluded.spec, updated_at = now();
    RETURN ARRAY['set', previous];
END $$;

-- The override p_id of p_prefix, once any change of p_prefix under way has ended.
CREATE OR REPLACE FUNCTION tollgate_override_of(p_prefix text, p_id text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    found text;
BEGIN
    PERFORM 1 FROM tollgate_override_meta WHERE prefix = p_prefix FOR SHARE;
    SELECT spec INTO found FROM tollgate_overrides WHERE prefix = p_prefix AND id = p_id;
    RETURN found;
END $$;

-- p_prefix's log after version p_since, overrides expired by now purged first: one row of
-- epoch, version, trimmed, and the changes (at most p_most) as arrays of their versions,
-- ids and JSON (null: deleted), oldest first.
CREATE OR REPLACE FUNCTION tollgate_override_log(p_prefix text, p_since bigint, p_most integer)
RETURNS TABLE (epoch text, version bigint, trimmed bigint,
               versions bigint[], ids text[], specs text[])
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tollgate_overrides o
               WHERE o.prefix = p_prefix AND o.expires_at <= tollgate_now_us() / 1000000) THEN
        PERFORM tollgate_override_lock(p_prefix, NULL);
        PERFORM tollgate_override_purge(p_prefix, tollgate_now_us() / 1000000, 1000);
    END IF;
    RETURN QUERY
    WITH m AS (
        SELECT m.epoch, m.version, m.trimmed FROM tollgate_override_meta m
        WHERE m.prefix = p_prefix
        UNION ALL
        SELECT '', 0, 0 WHERE NOT EXISTS (
            SELECT 1 FROM tollgate_override_meta m WHERE m.prefix = p_prefix)),
    c AS (
        SELECT * FROM (
            SELECT o.version AS v, o.id, o.spec FROM tollgate_overrides o
            WHERE o.prefix = p_prefix AND o.version > p_since
            UNION ALL
            SELECT t.version, t.id, NULL FROM tollgate_override_tombstones t
            WHERE t.prefix = p_prefix AND t.version > p_since) all_changes
        WHERE all_changes.v <= (SELECT m.version FROM m)
        ORDER BY all_changes.v
        LIMIT p_most)
    SELECT m.epoch, m.version, m.trimmed,
           coalesce((SELECT array_agg(c.v ORDER BY c.v) FROM c), '{}'),
           coalesce((SELECT array_agg(c.id ORDER BY c.v) FROM c), '{}'),
           coalesce((SELECT array_agg(c.spec ORDER BY c.v) FROM c), '{}')
    FROM m;
END $$;
