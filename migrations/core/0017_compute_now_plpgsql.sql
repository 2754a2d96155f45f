-- compute_now() in PL/pgSQL, same result (now() plus bc_clock's skew, read at each call). A SQL
-- function whose body has a subquery cannot be inlined, so every statement that calls it parsed
-- and planned the body again (about 28 us per statement on the bench machine, against 4 us here:
-- PL/pgSQL keeps its plan for the session), and the fleet's statements call it ~400 times per
-- machine (bench/README.md, "Where Postgres's CPU goes").
CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz
  LANGUAGE plpgsql STABLE
  AS $$
DECLARE
  skew interval;
BEGIN
  SELECT c.skew INTO skew FROM bc_clock c WHERE c.id;
  RETURN now() + coalesce(skew, interval '0'); -- bc:allow-now
END $$;
