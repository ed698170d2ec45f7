-- Catalog questions asked before and around the schema: about the namespace, the roles
-- and the server. These take the namespace and role names as parameters (never as text),
-- because they must work while the namespace does not exist yet.

-- name: namespace_info
-- The schema named namespace: its owner, whether it holds any object, and whether it has
-- a schema_version table. No row when the schema does not exist.
-- $1 namespace (text)
-- returns: row
-- column owner (text)
-- column has_objects (boolean)
-- column has_version_table (boolean)
SELECT r.rolname::text AS owner,
       EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid)
       OR EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = n.oid)
       OR EXISTS (SELECT 1 FROM pg_type t
                   WHERE t.typnamespace = n.oid AND t.typtype IN ('d', 'e', 'r', 'm'))
           AS has_objects,
       EXISTS (SELECT 1 FROM pg_class c
                WHERE c.relnamespace = n.oid AND c.relname = 'schema_version'
                  AND c.relkind = 'r') AS has_version_table
  FROM pg_namespace n
  JOIN pg_roles r ON r.oid = n.nspowner
 WHERE n.nspname = $1;

-- name: role_attributes
-- The role so named: the attributes the role checks look at. No row when absent.
-- $1 role (text)
-- returns: row
-- column rolsuper (boolean)
-- column rolbypassrls (boolean)
-- column rolcanlogin (boolean)
-- column rolinherit (boolean)
SELECT rolsuper, rolbypassrls, rolcanlogin, rolinherit
  FROM pg_roles
 WHERE rolname = $1;

-- name: role_is_member
-- Whether the role member is a member of the role role, directly or through other roles,
-- whatever the INHERIT and SET options say. Null (no row) when either role is missing.
-- $1 member (text)
-- $2 role (text)
-- returns: value (boolean, null)
SELECT pg_has_role(member.oid, target.oid, 'MEMBER') AS is_member
  FROM pg_roles member, pg_roles target
 WHERE member.rolname = $1 AND target.rolname = $2;

-- name: role_may_set
-- Whether the role member may SET ROLE to the role role. Null (no row) when either is
-- missing.
-- $1 member (text)
-- $2 role (text)
-- returns: value (boolean, null)
SELECT pg_has_role(member.oid, target.oid, 'SET') AS may_set
  FROM pg_roles member, pg_roles target
 WHERE member.rolname = $1 AND target.rolname = $2;

-- name: role_schema_rights
-- What the role may do to the schema namespace: own it, be a member of its owner (named),
-- create in it, or hold any privilege (its own or inherited, table- or column-level) on a
-- table, view or sequence in it. No row when the role or the schema is missing.
-- $1 role (text)
-- $2 namespace (text)
-- returns: row
-- column owns (boolean)
-- column owner (text)
-- column member_of_owner (boolean)
-- column can_create (boolean, null): null when the schema was dropped after the scan
-- column holds_table_privilege (boolean)
SELECT n.nspowner = r.oid AS owns,
       pg_get_userbyid(n.nspowner)::text AS owner,
       pg_has_role(r.oid, n.nspowner, 'MEMBER') AS member_of_owner,
       has_schema_privilege(r.oid, n.oid, 'CREATE') AS can_create,
       EXISTS (
           SELECT 1 FROM pg_class c
            WHERE c.relnamespace = n.oid
              AND ((c.relkind IN ('r', 'p', 'v', 'm', 'f')
                    AND (has_table_privilege(r.oid, c.oid,
                             'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
                         OR has_any_column_privilege(r.oid, c.oid,
                             'SELECT, INSERT, UPDATE, REFERENCES')))
                   OR (c.relkind = 'S'
                       AND has_sequence_privilege(r.oid, c.oid, 'USAGE, SELECT, UPDATE')))
       ) AS holds_table_privilege
  FROM pg_roles r, pg_namespace n
 WHERE r.rolname = $1 AND n.nspname = $2;

-- name: catalog_dump
-- Every object of schema namespace as (kind, name, definition) rows, in a stable order.
-- The drift check compares this dump of an installed namespace with the dump of a scratch
-- namespace built from schema.sql; grants are not part of it (apply sets them afresh).
-- $1 namespace (text)
-- returns: rows
-- column kind (text)
-- column name (text)
-- column definition (text, null): null when the object was dropped after the scan
WITH t AS (SELECT oid FROM pg_namespace WHERE nspname = $1)
SELECT kind, name, definition FROM (
    SELECT 'relation' AS kind, c.relname::text AS name,
           c.relkind::text || ' options=' || coalesce(array_to_string(c.reloptions, ','), '')
               AS definition
      FROM t, pg_class c
     WHERE c.relnamespace = t.oid
       AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S', 'c')
    UNION ALL
    SELECT 'column', c.relname || '.' || a.attname,
           format_type(a.atttypid, a.atttypmod)
           || ' notnull=' || a.attnotnull::text
           || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
           || ' identity=' || a.attidentity::text
           || ' generated=' || a.attgenerated::text
      FROM t, pg_attribute a
      JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relnamespace = t.oid
       AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
       AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'constraint', c.relname || '.' || con.conname, pg_get_constraintdef(con.oid)
      FROM t, pg_constraint con
      JOIN pg_class c ON c.oid = con.conrelid
     WHERE c.relnamespace = t.oid
    UNION ALL
    SELECT 'index', i.relname::text, pg_get_indexdef(i.oid)
      FROM t, pg_index x
      JOIN pg_class i ON i.oid = x.indexrelid
     WHERE i.relnamespace = t.oid
    UNION ALL
    SELECT 'function', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
           pg_get_functiondef(p.oid)
      FROM t, pg_proc p
     WHERE p.pronamespace = t.oid
    UNION ALL
    SELECT 'trigger', c.relname || '.' || tg.tgname, pg_get_triggerdef(tg.oid)
      FROM t, pg_trigger tg
      JOIN pg_class c ON c.oid = tg.tgrelid
     WHERE c.relnamespace = t.oid AND NOT tg.tgisinternal
    UNION ALL
    SELECT 'type', ty.typname::text, ty.typtype::text
      FROM t, pg_type ty
     WHERE ty.typnamespace = t.oid AND ty.typtype IN ('d', 'e', 'r', 'm')
) AS objects
ORDER BY kind, name;
