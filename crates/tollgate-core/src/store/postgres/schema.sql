-- Tollgate's PostgreSQL schema: one row per counter, checked and counted by one function
-- call in the database's clock (microseconds). Every statement is idempotent: a database at
-- any earlier version is brought to this one by running the whole file again (schema.rs).
-- Functions an earlier version defined under another signature are left in place, for
-- the instances of a rolling upgrade that still call them. The same integer formulas as
-- the Rust algorithms (crates/tollgate-core/src/algo) and the Redis script
-- (../redis/check_and_count.lua); products are taken in numeric, so they are exact at any
-- size.
--
-- A row's `state` holds, per limit in the order the rule lists them:
--   sliding window: newest sub-window, then the ring of precision + 1 packed counts
--                   (count * 256 + start, see algo/sliding.rs);
--   fixed window:   window index, count;
--   calendar window: the window's UTC start in microseconds, count;
--   token/leaky bucket (GCRA): theoretical arrival time;
-- then, per sliding window in order, the ring of its sub-windows' ends (where each one's
-- last hit landed, in 1/65536ths). A row written before version 6 has no ends: it is
-- read with every end at 65535.
-- `shape` names the kinds and sliding precisions that layout was written for; a row whose
-- shape differs (the rule changed) reads as empty. There is no index on `expires_us`:
-- counter updates then touch no index and stay heap-only (HOT); the sweeper finds expired
-- rows by a scan instead.

CREATE TABLE IF NOT EXISTS tollgate_counters (
    key text PRIMARY KEY,
    shape text NOT NULL,
    state bigint[] NOT NULL,
    expires_us bigint NOT NULL
) WITH (fillfactor = 70);

-- The database's clock, microseconds since the epoch: one clock for every instance.
CREATE OR REPLACE FUNCTION tollgate_now_us() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- Deletes up to `batch` expired counters, skipping rows a request holds; how many went.
CREATE OR REPLACE FUNCTION tollgate_sweep(batch integer) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    WITH gone AS (
        DELETE FROM tollgate_counters
        WHERE key IN (
            SELECT key FROM tollgate_counters
            WHERE expires_us < tollgate_now_us()
            LIMIT batch
            FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- Checks every limit of counter `p_key` and counts `p_hits` only if all admit.
--   p_mode      'c' consume; 'p' charge (counted even past the limit); 'k' check
--               (within the limits, at them included); 'r' refund; 'l' take a lease's
--               block: the most units up to p_hits, at least p_extra, that fit, counted
--               as consumed (the bisection of the Rust `take`, store/shared/protocol.rs);
--               'g' give back p_hits units of a block taken at p_extra (microseconds)
--               where they were counted, if that still counts
--   p_debt      units the caller admitted while the database did not answer: charged
--               first, as 'p'
--   p_deadline  microseconds; past it nothing changes and {-1, now} is returned (0: none)
--   p_now       microseconds; 0 reads the database's clock (tests replay histories)
--   p_kinds     one letter per limit: 's' sliding, 'f' fixed, 'c' calendar, 'g' GCRA
--   p_windows, p_params (precision or burst), p_rpus: per limit
--   p_bounds    three per limit: for a calendar, window boundaries (microseconds) the
--               caller computed around its own now; the window holding the database's
--               now is picked from them, so no time-zone database is consulted (and the
--               Redis script can do the same). Zeros for other limits.
--   p_extra     see p_mode ('l', 'g'); 0 otherwise
-- Returns {admitted (1/0; for 'l' the units taken, 0 for none; 1 for 'g'), now, then the state as it was before this call, before its
-- debt too}.
-- The check and the write each walk the limits in a loop of their own: a set-returning
-- function listing the limits once would run a query per walk, which made a call several
-- times slower (pgbench, 0.08-0.12 ms against 0.35-1.2 ms).
CREATE OR REPLACE FUNCTION tollgate_apply(
    p_key text, p_mode text, p_hits bigint, p_debt bigint, p_deadline bigint, p_now bigint,
    p_kinds text, p_windows bigint[], p_params bigint[], p_rpus bigint[], p_bounds bigint[],
    p_extra bigint)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer := length(p_kinds);
    want_shape text := '';
    width integer := 0;
    ends integer := 0;
    e integer;
    last bigint;
    row_shape text;
    row_state bigint[];
    placeholder boolean := false;
    before bigint[];
    after bigint[];
    now_us bigint;
    step_mode text;
    step_hits bigint;
    asked bigint;
    admitted boolean;
    wrote boolean := false;
    writes boolean;
    ttl bigint := 0;
    expires bigint;
    kind text;
    win bigint; param bigint; rpu bigint;
    o integer;
    ring bigint; sub bigint; newest bigint; slot bigint; into_sub bigint; fine bigint;
    full_count bigint; oldest bigint; denominator bigint; room_left bigint; room bigint;
    s bigint; v bigint; cnt bigint; start bigint; take bigint; left_hits bigint;
    stored bigint; w bigint; tat bigint; span bigint;
    -- What the check found per limit, for the write: the current sub-window (sliding)
    -- or window (fixed), and the fraction into it (sliding) or the count in it (fixed).
    at_slot bigint[] := '{}';
    at_aux bigint[] := '{}';
    -- A take's bisection: the units tried, the most known to fit and the least known not
    -- to, and the phase (0 trying all, 1 trying the need, 2 bisecting, 3 done).
    lo bigint; hi bigint; phase integer;
    taken bigint;
    -- The most a stored number holds, as in the Redis script (2^53 - 1, MAX_UNITS in
    -- algo/mod.rs): a count or arrival time charged past it is held there, which denies
    -- as the true one would, and no sum of two stored numbers leaves bigint.
    max_units constant bigint := 9007199254740991;
BEGIN
    FOR i IN 1 .. n LOOP
        kind := substr(p_kinds, i, 1);
        IF kind = 's' THEN
            want_shape := want_shape || 's' || p_params[i] || ',';
            width := width + p_params[i]::integer + 2;
            ends := ends + p_params[i]::integer + 1;
        ELSIF kind = 'f' OR kind = 'c' THEN
            want_shape := want_shape || kind || ',';
            width := width + 2;
        ELSE
            want_shape := want_shape || 'g,';
            width := width + 1;
        END IF;
    END LOOP;

    writes := p_mode <> 'k' OR p_debt > 0;

    -- The row, locked while this call runs; a missing row is created empty first, so that
    -- concurrent first requests queue on one row lock instead of racing two inserts.
    LOOP
        IF writes THEN
            SELECT c.shape, c.state INTO row_shape, row_state
            FROM tollgate_counters c WHERE c.key = p_key FOR UPDATE;
        ELSE
            SELECT c.shape, c.state INTO row_shape, row_state
            FROM tollgate_counters c WHERE c.key = p_key;
        END IF;
        EXIT WHEN FOUND OR NOT writes;
        INSERT INTO tollgate_counters (key, shape, state, expires_us)
        VALUES (p_key, want_shape, '{}', 0) ON CONFLICT (key) DO NOTHING;
        placeholder := true;
    END LOOP;

    -- The clock is read once the row is held, so a call that waited for the lock past
    -- its deadline changes nothing.
    now_us := p_now;
    IF now_us = 0 THEN
        now_us := tollgate_now_us();
    END IF;
    IF p_deadline > 0 AND now_us > p_deadline THEN
        IF placeholder THEN
            DELETE FROM tollgate_counters WHERE key = p_key AND expires_us = 0;
        END IF;
        RETURN ARRAY[-1, now_us];
    END IF;

    IF row_shape IS NOT DISTINCT FROM want_shape
       AND coalesce(cardinality(row_state), 0) IN (width, width + ends) THEN
        before := row_state;
    ELSE
        before := array_fill(0::bigint, ARRAY[width + ends]);
    END IF;
    after := before;
    IF cardinality(after) = width AND ends > 0 THEN
        after := after || array_fill(65535::bigint, ARRAY[ends]);
    END IF;

    -- One step per pass: the debt (a charge), then the call's own hits; the second step
    -- reads the state the first left.
    FOR pass IN 1 .. 2 LOOP
        IF pass = 1 THEN
            CONTINUE WHEN p_debt = 0;
            step_mode := 'p';
            step_hits := p_debt;
        ELSE
            step_mode := p_mode;
            step_hits := p_hits;
        END IF;
        asked := step_hits;
        IF step_mode = 'k' OR step_mode = 'r' OR step_mode = 'g' THEN
            asked := 0;
        END IF;
        phase := 0;

        -- Check `asked`; a take checks again until its bisection ends.
        LOOP
            admitted := true;
            o := 1;
            e := width + 1;
            FOR i IN 1 .. n LOOP
                kind := substr(p_kinds, i, 1);
                win := p_windows[i]; param := p_params[i]; rpu := p_rpus[i];
                IF kind = 's' THEN
                    ring := param + 1;
                    sub := win / param;
                    newest := after[o];
                    slot := now_us / sub;
                    into_sub := now_us - slot * sub;
                    IF slot < newest THEN
                        slot := newest;
                        into_sub := 0;
                    END IF;
                    fine := div(into_sub::numeric * 65536, sub)::bigint;
                    at_slot[i] := slot;
                    at_aux[i] := fine;
                    full_count := 0;
                    -- WHILE, not FOR: a FOR loop's counter is a 32-bit integer.
                    s := slot - param + 1;
                    WHILE s <= slot LOOP
                        IF s <= newest AND newest - s <= param THEN
                            full_count := full_count + after[o + 1 + ((s % ring) + ring) % ring] / 256;
                        END IF;
                        s := s + 1;
                    END LOOP;
                    s := slot - param;
                    oldest := 0;
                    last := 0;
                    IF s <= newest AND newest - s <= param THEN
                        oldest := after[o + 1 + ((s % ring) + ring) % ring];
                        last := least(after[e + ((s % ring) + ring) % ring], 65535);
                    END IF;
                    -- Read as the Rust u32 count.
                    cnt := least(oldest / 256, 4294967295);
                    start := (oldest % 256) * 256;
                    -- full + asked + count * inside / (last - start) <= rpu, where inside is
                    -- the part of [start, last] after fine; at last <= start, all of it
                    -- while fine < last.
                    room := rpu - full_count - asked;
                    IF room < 0 THEN
                        admitted := false;
                    ELSIF last <= start THEN
                        IF fine < last AND cnt > room THEN
                            admitted := false;
                        END IF;
                    ELSE
                        room_left := greatest(last - greatest(fine, start), 0);
                        denominator := last - start;
                        IF cnt::numeric * room_left > room::numeric * denominator THEN
                            admitted := false;
                        END IF;
                    END IF;
                    o := o + param::integer + 2;
                    e := e + param::integer + 1;
                ELSIF kind = 'f' OR kind = 'c' THEN
                    stored := after[o];
                    cnt := after[o + 1];
                    IF kind = 'f' THEN
                        w := now_us / win;
                    ELSIF now_us < p_bounds[3 * i - 1] THEN
                        -- Named by its start. A clock more than half a window off the
                        -- caller's falls outside the boundaries and counts in the nearest.
                        w := p_bounds[3 * i - 2];
                    ELSE
                        w := p_bounds[3 * i - 1];
                    END IF;
                    IF w <= stored THEN
                        w := stored;
                    ELSE
                        cnt := 0;
                    END IF;
                    at_slot[i] := w;
                    at_aux[i] := cnt;
                    IF cnt + asked > rpu THEN
                        admitted := false;
                    END IF;
                    o := o + 2;
                ELSE
                    tat := after[o];
                    -- More units than the burst, counted apart: their span can round to
                    -- the burst's.
                    IF rpu = 0 OR asked > param THEN
                        admitted := false;
                    ELSIF greatest(tat - now_us, 0) + div(asked::numeric * win, rpu)
                          > div(param::numeric * win, rpu) THEN
                        admitted := false;
                    END IF;
                    o := o + 1;
                END IF;
            END LOOP;
            EXIT WHEN step_mode <> 'l';
            IF phase = 0 THEN
                IF admitted THEN
                    taken := asked;
                    EXIT;
                END IF;
                IF p_extra = 0 THEN
                    taken := 0;
                    EXIT;
                END IF;
                lo := p_extra;
                hi := asked;
                asked := p_extra;
                phase := 1;
            ELSE
                IF phase = 1 AND NOT admitted THEN
                    taken := 0;
                    EXIT;
                END IF;
                IF phase = 2 THEN
                    IF admitted THEN
                        lo := asked;
                    ELSE
                        hi := asked;
                    END IF;
                END IF;
                phase := 2;
                IF hi - lo <= 1 THEN
                    taken := lo;
                    EXIT;
                END IF;
                asked := lo + (hi - lo) / 2;
            END IF;
        END LOOP;
        IF step_mode = 'l' THEN
            step_mode := 'c';
            step_hits := taken;
            admitted := taken > 0;
        END IF;

        -- Write: count admitted (or charged) hits, or give hits back.
        IF (admitted AND step_mode = 'c') OR step_mode = 'p' OR step_mode = 'r'
           OR step_mode = 'g' THEN
            ttl := 0;
            o := 1;
            e := width + 1;
            FOR i IN 1 .. n LOOP
                kind := substr(p_kinds, i, 1);
                win := p_windows[i]; param := p_params[i]; rpu := p_rpus[i];
                IF kind = 's' THEN
                    ring := param + 1;
                    sub := win / param;
                    newest := after[o];
                    slot := at_slot[i];
                    fine := at_aux[i];
                    IF slot > newest THEN
                        s := greatest(newest + 1, slot - param);
                        WHILE s <= slot LOOP
                            after[o + 1 + ((s % ring) + ring) % ring] := 0;
                            after[e + ((s % ring) + ring) % ring] := 0;
                            s := s + 1;
                        END LOOP;
                        after[o] := slot;
                        newest := slot;
                    END IF;
                    IF step_mode = 'g' THEN
                        s := p_extra / sub;
                        IF s <= slot AND slot - s <= param THEN
                            v := after[o + 1 + ((s % ring) + ring) % ring];
                            take := least(step_hits, v / 256);
                            after[o + 1 + ((s % ring) + ring) % ring] := v - take * 256;
                        END IF;
                    ELSIF step_mode <> 'r' THEN
                        v := after[o + 1 + ((slot % ring) + ring) % ring];
                        cnt := v / 256;
                        start := v % 256;
                        IF cnt < 2 AND param > 1 THEN
                            start := fine / 256;
                        END IF;
                        -- Held at the Rust u32 count's most, which denies as the true one would.
                        after[o + 1 + ((slot % ring) + ring) % ring] :=
                            least(cnt::numeric + step_hits, 4294967295)::bigint * 256 + start;
                        after[e + ((slot % ring) + ring) % ring] :=
                            greatest(after[e + ((slot % ring) + ring) % ring], fine);
                    ELSE
                        left_hits := step_hits;
                        s := slot;
                        WHILE s >= slot - param LOOP
                            v := after[o + 1 + ((s % ring) + ring) % ring];
                            take := least(left_hits, v / 256);
                            IF take > 0 THEN
                                after[o + 1 + ((s % ring) + ring) % ring] := v - take * 256;
                            END IF;
                            left_hits := left_hits - take;
                            s := s - 1;
                        END LOOP;
                    END IF;
                    expires := (newest + param + 1) * sub;
                    o := o + param::integer + 2;
                    e := e + param::integer + 1;
                ELSIF kind = 'f' OR kind = 'c' THEN
                    w := at_slot[i];
                    cnt := at_aux[i];
                    IF step_mode = 'g' THEN
                        IF kind = 'f' AND p_extra / win = w THEN
                            cnt := greatest(cnt - step_hits, 0);
                        END IF;
                    ELSIF step_mode <> 'r' THEN
                        cnt := least(cnt + step_hits, max_units);
                    ELSE
                        cnt := greatest(cnt - step_hits, 0);
                    END IF;
                    after[o] := w;
                    after[o + 1] := cnt;
                    IF kind = 'f' THEN
                        expires := (w + 1) * win;
                    ELSIF w < p_bounds[3 * i - 1] THEN
                        expires := p_bounds[3 * i - 1];
                    ELSIF w < p_bounds[3 * i] THEN
                        expires := p_bounds[3 * i];
                    ELSE
                        -- A later window than the caller knows (the clock stepped back):
                        -- no calendar window is longer than two.
                        expires := w + p_bounds[3 * i] - p_bounds[3 * i - 2];
                    END IF;
                    o := o + 2;
                ELSE
                    IF rpu > 0 THEN
                        tat := after[o];
                        span := least(div(step_hits::numeric * win, rpu), max_units);
                        -- A give-back leaves the arrival time alone (lease.rs says why).
                        IF step_mode = 'r' THEN
                            tat := greatest(tat - span, now_us);
                        ELSIF step_mode <> 'g' THEN
                            tat := least(greatest(tat, now_us) + span, max_units);
                        END IF;
                        after[o] := tat;
                        expires := tat;
                    ELSE
                        expires := now_us;
                    END IF;
                    o := o + 1;
                END IF;
                ttl := greatest(ttl, expires - now_us);
            END LOOP;
            wrote := true;
        END IF;
    END LOOP;

    IF wrote THEN
        IF ttl > 0 THEN
            UPDATE tollgate_counters
            SET shape = want_shape, state = after, expires_us = now_us + ttl
            WHERE key = p_key;
        ELSE
            DELETE FROM tollgate_counters WHERE key = p_key;
        END IF;
    ELSIF placeholder THEN
        DELETE FROM tollgate_counters WHERE key = p_key AND expires_us = 0;
    END IF;

    IF p_mode = 'l' THEN
        RETURN ARRAY[taken, now_us] || before;
    ELSIF p_mode = 'g' THEN
        RETURN ARRAY[1, now_us] || before;
    END IF;
    RETURN ARRAY[CASE WHEN admitted THEN 1 ELSE 0 END, now_us] || before;
END;
$$;

-- Many calls in one statement (version 9): call i is tollgate_apply of the i-th key, mode,
-- hits, debt, deadline, kinds and extra, its limits' numbers the next length(kinds[i]) of
-- p_windows, p_params and p_rpus (three per limit of p_bounds), all at p_now (0: the
-- database's clock, read by each call once it holds its row).
-- The calls run in the order of their keys (bytewise; one key's calls in their order),
-- so that concurrent statements take their row locks in one order and never deadlock;
-- each row holds its lock until the statement ends. One row per call: its number (from
-- 1) and its reply.
CREATE OR REPLACE FUNCTION tollgate_apply_many(
    p_keys text[], p_modes text[], p_hits bigint[], p_debts bigint[], p_deadlines bigint[],
    p_now bigint, p_kinds text[], p_windows bigint[], p_params bigint[], p_rpus bigint[],
    p_bounds bigint[], p_extras bigint[])
RETURNS TABLE (call_no integer, reply bigint[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    calls integer := coalesce(cardinality(p_keys), 0);
    firsts integer[] := '{}';
    next_limit integer := 1;
    c integer;
    f integer;
    l integer;
BEGIN
    FOR i IN 1 .. calls LOOP
        firsts[i] := next_limit;
        next_limit := next_limit + length(p_kinds[i]);
    END LOOP;
    FOR c IN
        SELECT k.n FROM unnest(p_keys) WITH ORDINALITY AS k(key, n)
        ORDER BY k.key COLLATE "C", k.n
    LOOP
        f := firsts[c];
        l := f + length(p_kinds[c]) - 1;
        call_no := c;
        reply := tollgate_apply(p_keys[c], p_modes[c], p_hits[c], p_debts[c], p_deadlines[c],
            p_now, p_kinds[c], p_windows[f:l], p_params[f:l], p_rpus[f:l],
            p_bounds[3 * f - 2 : 3 * l], p_extras[c]);
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Version 2's signature, for the instances of a rolling upgrade that still call it: no
-- calendar limits, so no boundaries.
CREATE OR REPLACE FUNCTION tollgate_apply(
    p_key text, p_mode text, p_hits bigint, p_debt bigint, p_deadline bigint, p_now bigint,
    p_kinds text, p_windows bigint[], p_params bigint[], p_rpus bigint[])
RETURNS bigint[]
LANGUAGE sql VOLATILE AS $$
    SELECT tollgate_apply(p_key, p_mode, p_hits, p_debt, p_deadline, p_now,
                          p_kinds, p_windows, p_params, p_rpus, '{}'::bigint[], 0::bigint)
$$;

-- Version 3's signature, for the instances of a rolling upgrade that still call it: no
-- lease calls, so no extra number.
CREATE OR REPLACE FUNCTION tollgate_apply(
    p_key text, p_mode text, p_hits bigint, p_debt bigint, p_deadline bigint, p_now bigint,
    p_kinds text, p_windows bigint[], p_params bigint[], p_rpus bigint[], p_bounds bigint[])
RETURNS bigint[]
LANGUAGE sql VOLATILE AS $$
    SELECT tollgate_apply(p_key, p_mode, p_hits, p_debt, p_deadline, p_now,
                          p_kinds, p_windows, p_params, p_rpus, p_bounds, 0::bigint)
$$;
