-- Partition drop vs row delete of a day's history, on a scratch database:
--   createdb durable_scratch && psql -d durable_scratch -f proving/retention_partition_measure.sql
-- Loads 10M history rows (2.5M jobs x 4, 1M rows a day over 10 days) into a plain and a
-- day-partitioned table shaped like jobs_jobevent, then times one day's retention both ways.
\timing on
DROP TABLE IF EXISTS ev_part, ev_plain;
CREATE TABLE ev_plain (id bigint PRIMARY KEY, job_id bigint NOT NULL, kind varchar(40) NOT NULL, from_state varchar(20) NOT NULL, to_state varchar(20) NOT NULL, epoch int NOT NULL, worker_id varchar(200) NOT NULL, actor varchar(200) NOT NULL, reason text NOT NULL, detail jsonb NOT NULL, created_at timestamptz NOT NULL);
CREATE TABLE ev_part (LIKE ev_plain) PARTITION BY RANGE (created_at);
ALTER TABLE ev_part ADD PRIMARY KEY (id, created_at);
SELECT format('CREATE TABLE ev_part_d%s PARTITION OF ev_part FOR VALUES FROM (%L) TO (%L)', d, timestamptz '2026-01-01 00:00+00' + d * interval '1 day', timestamptz '2026-01-01 00:00+00' + (d + 1) * interval '1 day') FROM generate_series(0, 9) d \gexec
-- 10M history rows: 2.5M jobs × 4 events, 1M rows (250k jobs) a day over 10 days.
INSERT INTO ev_plain SELECT g, g / 4, (ARRAY['enqueue','claim','start','finish'])[g % 4 + 1], 'READY', 'DONE', 1, 'worker-host-17-1234', '', '', '{"duration_ms": 12}', timestamptz '2026-01-01 00:00+00' + (g / 1000000.0) * interval '1 day' FROM generate_series(0, 9999999) g;
CREATE INDEX ON ev_plain (job_id, id);
INSERT INTO ev_part SELECT * FROM ev_plain;
CREATE INDEX ON ev_part (job_id, id);
VACUUM ANALYZE ev_plain;
VACUUM ANALYZE ev_part;
SELECT pg_size_pretty(pg_total_relation_size('ev_plain')) AS plain_size, pg_total_relation_size('ev_plain') / 10000000 AS bytes_per_row;
CREATE TABLE IF NOT EXISTS jobs_sim (id bigint PRIMARY KEY);
TRUNCATE jobs_sim;
INSERT INTO jobs_sim SELECT g FROM generate_series(250000, 2499999) g;
VACUUM ANALYZE jobs_sim;
CREATE OR REPLACE PROCEDURE row_delete_day(first_job bigint, last_job bigint, batch int) LANGUAGE plpgsql AS $$
DECLARE lo bigint := first_job;
BEGIN
  WHILE lo <= last_job LOOP
    DELETE FROM ev_plain WHERE job_id = ANY(ARRAY(SELECT generate_series(lo, least(lo + batch - 1, last_job))));
    COMMIT;
    lo := lo + batch;
  END LOOP;
END $$;
\echo '--- the drop rule check on a 1M-row day partition (no remaining job there)'
SELECT count(*) FROM (SELECT DISTINCT e.job_id FROM ev_part_d0 e WHERE EXISTS (SELECT 1 FROM jobs_sim j WHERE j.id = e.job_id) LIMIT 100) r;
\echo '--- the same check on a partition whose jobs remain (stops at the first 100)'
SELECT count(*) FROM (SELECT DISTINCT e.job_id FROM ev_part_d5 e WHERE EXISTS (SELECT 1 FROM jobs_sim j WHERE j.id = e.job_id) LIMIT 100) r;
\echo '--- partition path: detach + drop one day (1M rows)'
ALTER TABLE ev_part DETACH PARTITION ev_part_d0;
DROP TABLE ev_part_d0;
\echo '--- row path: one day (250k jobs, 1M rows), batches of 500 jobs, one transaction each'
CALL row_delete_day(0, 249999, 500);
SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'ev_plain';
\echo '--- vacuum the plain table after it'
VACUUM ev_plain;
