-- Schema version 5 as harel_edge's schema step left a new database (prefix 'harel'),
-- dumped from sqlite_master after running harel_edge/schema.py of commit 8ee85fb854e1.
-- harel's execution-store tables are not in it: the tests add them where a worker would have.
CREATE TABLE harel_transport_messages ( seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL, event TEXT NOT NULL, locked_by TEXT, lock_expiry REAL);
CREATE TABLE harel_transport_groups ( group_id TEXT PRIMARY KEY, last_claimed_at REAL NOT NULL DEFAULT 0.0, priority INT NOT NULL DEFAULT 0, routing_key TEXT);
CREATE INDEX harel_transport_groups_by_last_claimed ON harel_transport_groups (last_claimed_at);
CREATE INDEX harel_transport_messages_by_group ON harel_transport_messages (group_id, seq);
CREATE INDEX harel_transport_groups_by_routing_key ON harel_transport_groups (routing_key, last_claimed_at);
CREATE VIEW harel_transport_publish AS SELECT m.group_id, m.event, g.priority, g.routing_key FROM harel_transport_messages m JOIN harel_transport_groups g ON g.group_id = m.group_id WHERE 0;
CREATE TRIGGER harel_transport_publish INSTEAD OF INSERT ON harel_transport_publish BEGIN INSERT OR IGNORE INTO harel_transport_groups (group_id, priority, routing_key) VALUES (NEW.group_id, COALESCE(NEW.priority, 0), NEW.routing_key); INSERT INTO harel_transport_messages (group_id, event) VALUES (NEW.group_id, NEW.event); END;
CREATE TRIGGER harel_transport_on_claim AFTER UPDATE OF locked_by ON harel_transport_messages WHEN NEW.locked_by IS NOT NULL BEGIN UPDATE harel_transport_groups SET last_claimed_at = NEW.lock_expiry WHERE group_id = NEW.group_id; END;
CREATE TRIGGER harel_transport_on_drain AFTER DELETE ON harel_transport_messages BEGIN DELETE FROM harel_transport_groups WHERE group_id = OLD.group_id AND NOT EXISTS (SELECT 1 FROM harel_transport_messages WHERE group_id = OLD.group_id); END;
CREATE TABLE workflow_checkpoint ( seq INTEGER PRIMARY KEY, workflow TEXT NOT NULL, step TEXT NOT NULL, value TEXT NOT NULL, written_at REAL NOT NULL DEFAULT ((round((julianday('now') - 2440587.5) * 86400000.0) / 1000.0)), UNIQUE (workflow, step));
CREATE TABLE workflow_claim ( workflow TEXT PRIMARY KEY, token INTEGER NOT NULL, held_until REAL NOT NULL, alive_until REAL NOT NULL, alive_for REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE workflow_queue ( namespace TEXT NOT NULL, workflow TEXT NOT NULL, visible_at REAL NOT NULL, PRIMARY KEY (namespace, workflow)) WITHOUT ROWID;
CREATE INDEX workflow_queue_visible_at ON workflow_queue (namespace, visible_at);
CREATE VIEW workflow_record (workflow, step, value, written_at, token, held, existed) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;
CREATE TRIGGER workflow_record_insert INSTEAD OF INSERT ON workflow_record WHEN NEW.held BEGIN INSERT INTO workflow_checkpoint (workflow, step, value, written_at) VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at) ON CONFLICT (workflow, step) DO NOTHING; UPDATE workflow_claim SET alive_until = MIN(NEW.written_at + alive_for, held_until) WHERE workflow = NEW.workflow AND token = NEW.token; END;
CREATE VIEW workflow_arrival (workflow, step, value, written_at, namespace, visible_at) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;
CREATE TRIGGER workflow_arrival_insert INSTEAD OF INSERT ON workflow_arrival BEGIN INSERT INTO workflow_checkpoint (workflow, step, value, written_at) VALUES (NEW.workflow, NEW.step, NEW.value, NEW.written_at) ON CONFLICT (workflow, step) DO NOTHING; INSERT INTO workflow_queue (namespace, workflow, visible_at) SELECT NEW.namespace, NEW.workflow, NEW.visible_at WHERE NEW.namespace IS NOT NULL ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = MIN(visible_at, excluded.visible_at); END;
CREATE VIEW workflow_discard (workflow, namespace, at, records) AS SELECT NULL, NULL, NULL, NULL WHERE 0;
CREATE TRIGGER workflow_discard_insert INSTEAD OF INSERT ON workflow_discard BEGIN DELETE FROM workflow_checkpoint WHERE workflow = NEW.workflow; INSERT INTO workflow_claim (workflow, token, held_until, alive_until, alive_for) VALUES (NEW.workflow, 1, NEW.at, NEW.at, 0) ON CONFLICT (workflow) DO UPDATE SET token = token + 1, held_until = MIN(held_until, excluded.held_until), alive_until = MIN(alive_until, excluded.alive_until); DELETE FROM workflow_queue WHERE namespace = NEW.namespace AND workflow = NEW.workflow; END;
PRAGMA user_version = 5;
