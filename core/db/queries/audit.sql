-- The audit component's custody records: which audit key wrote which journal segment.

-- name: audit_segment_latest
-- The newest segment row (null when none): its number and key fingerprint.
SELECT segment, fingerprint FROM {{ns}}.audit_segment ORDER BY segment DESC LIMIT 1;

-- name: audit_segment_insert
-- Record a new segment: $1 segment number (integer), $2 key fingerprint (hex text),
-- $3 the journal seq of its first record (bigint).
INSERT INTO {{ns}}.audit_segment (segment, fingerprint, first_seq) VALUES ($1, $2, $3)
ON CONFLICT (segment) DO NOTHING;
