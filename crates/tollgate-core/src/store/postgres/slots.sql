-- Tollgate: the slots of one in-flight counter (schema version 7), in the database's
-- clock (microseconds). The counter is a row of tollgate_counters with shape 'i', so that
-- resets and the sweep treat it as any other: its state holds, per group of slots, when
-- they free themselves and how many, oldest first; its expires_us is an expire_after
-- after the last frees itself, so that a call then counts the slots never released. Idempotent, like schema.sql, after which it runs.
--
--   p_mode       'a' acquire p_n slots if all fit under p_max; 'r' release p_n slots,
--                the oldest first; 'k' check
--   p_expire     how long a slot lives unless released (microseconds)
--   p_deadline   microseconds; past it nothing changes and {-1, now} is returned (0: none)
--   p_debt       slots an instance admitted without the database (schema version 11):
--                taken first, even past p_max
-- Returns {admitted (1/0), now, slots this call found past their time and dropped, then
-- per group of live slots before this call and its debt: frees_at, count}.
CREATE OR REPLACE FUNCTION tollgate_slots(
    p_key text, p_mode text, p_n bigint, p_max bigint, p_expire bigint, p_deadline bigint,
    p_debt bigint)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    row_state bigint[];
    before bigint[] := '{}';
    after bigint[] := '{}';
    now_us bigint;
    held bigint := 0;
    expired bigint := 0;
    admitted boolean := true;
    left_n bigint := p_n;
    released bigint;
    frees bigint;
    cnt bigint;
BEGIN
    -- The row, locked while this call runs; a missing row is created empty first, so that
    -- concurrent first calls queue on one row lock instead of racing two inserts.
    LOOP
        SELECT c.state INTO row_state
        FROM tollgate_counters c WHERE c.key = p_key AND c.shape = 'i' FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO tollgate_counters (key, shape, state, expires_us)
        VALUES (p_key, 'i', '{}', 0)
        ON CONFLICT (key) DO UPDATE SET shape = 'i', state = '{}', expires_us = 0
        WHERE tollgate_counters.shape <> 'i';
    END LOOP;

    now_us := tollgate_now_us();
    IF p_deadline > 0 AND now_us > p_deadline THEN
        RETURN ARRAY[-1, now_us];
    END IF;

    FOR i IN 1 .. coalesce(cardinality(row_state), 0) / 2 LOOP
        frees := row_state[2 * i - 1];
        cnt := row_state[2 * i];
        IF frees > now_us THEN
            before := before || ARRAY[frees, cnt];
            held := held + cnt;
            IF p_mode = 'r' AND left_n > 0 THEN
                released := least(left_n, cnt);
                left_n := left_n - released;
                cnt := cnt - released;
            END IF;
            IF cnt > 0 THEN
                after := after || ARRAY[frees, cnt];
            END IF;
        ELSE
            expired := expired + cnt;
        END IF;
    END LOOP;

    IF p_debt > 0 THEN
        -- Slots admitted without the database hold theirs from now on, whatever is held.
        held := held + p_debt;
        IF cardinality(after) >= 2 AND after[cardinality(after) - 1] = now_us + p_expire THEN
            after[cardinality(after)] := after[cardinality(after)] + p_debt;
        ELSE
            after := after || ARRAY[now_us + p_expire, p_debt];
        END IF;
    END IF;

    IF p_mode = 'a' THEN
        IF held + p_n > p_max THEN
            admitted := false;
        ELSIF p_n > 0 THEN
            IF cardinality(after) >= 2 AND after[cardinality(after) - 1] = now_us + p_expire THEN
                after[cardinality(after)] := after[cardinality(after)] + p_n;
            ELSE
                after := after || ARRAY[now_us + p_expire, p_n];
            END IF;
        END IF;
    END IF;

    IF cardinality(after) = 0 THEN
        DELETE FROM tollgate_counters WHERE key = p_key;
    ELSE
        UPDATE tollgate_counters
        SET state = after, expires_us = after[cardinality(after) - 1] + p_expire
        WHERE key = p_key;
    END IF;
    RETURN ARRAY[CASE WHEN admitted THEN 1 ELSE 0 END, now_us, expired] || before;
END;
$$;

-- Version 10's signature, for instances of a rolling upgrade: no debt.
CREATE OR REPLACE FUNCTION tollgate_slots(
    p_key text, p_mode text, p_n bigint, p_max bigint, p_expire bigint, p_deadline bigint)
RETURNS bigint[]
LANGUAGE sql VOLATILE AS $$
    SELECT tollgate_slots(p_key, p_mode, p_n, p_max, p_expire, p_deadline, 0);
$$;
