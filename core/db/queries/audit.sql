-- The audit component's custody records: which audit key wrote which journal segment.

-- name: audit_segment_latest
-- The newest segment row (no row when none): its number and key fingerprint.
-- returns: row
-- column segment (integer)
-- column fingerprint (text)
SELECT segment, fingerprint FROM {{ns}}.audit_segment ORDER BY segment DESC LIMIT 1;

-- name: audit_segment_insert
-- Record a new segment (one already recorded is left as it is).
-- $1 segment (integer): the segment number
-- $2 fingerprint (text): the key fingerprint, hex
-- $3 first_seq (bigint): the journal seq of its first record
-- returns: status
INSERT INTO {{ns}}.audit_segment (segment, fingerprint, first_seq) VALUES ($1, $2, $3)
ON CONFLICT (segment) DO NOTHING;
