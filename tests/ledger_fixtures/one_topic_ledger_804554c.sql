BEGIN TRANSACTION;
CREATE TABLE exactly_batches (
	app_id VARCHAR(255) NOT NULL, 
	batch_id BIGINT NOT NULL, 
	pipeline VARCHAR(255) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	attempt INTEGER NOT NULL, 
	token VARCHAR(32) NOT NULL, 
	owner VARCHAR(255) NOT NULL, 
	heartbeat_at DATETIME NOT NULL, 
	created_at DATETIME NOT NULL, 
	updated_at DATETIME NOT NULL, 
	prepared_at DATETIME, 
	committed_at DATETIME, 
	table_version BIGINT, 
	error TEXT, 
	schemas JSON, 
	metrics JSON, 
	params JSON, 
	decisions JSON, 
	PRIMARY KEY (app_id, batch_id)
);
INSERT INTO "exactly_batches" VALUES('pageviews',1,'pageviews','live','ACKED',1,'a10f27ed3780440cabed01c36f302dbc','vm:20780@1267153/23b8f6a4-91da-438a-986a-2b2c372bf0f4','2026-11-26 14:36:12.024000','2026-11-26 14:36:12.008000','2026-11-26 14:36:12.025000','2026-11-26 14:36:12.017000','2026-11-26 14:36:12.020000',0,NULL,'{"table": "struct<value:binary>"}','{"records_read": 9, "table_records": 9, "quarantine_records": 0, "files": 2, "stage_detail_s": {}, "files_staged": 2, "files_committed": 2, "files_already_committed": 0, "files_missing": 0, "acked_to_batch": 1, "phase_s": {"plan": 0.008356467000339762, "stage": 0.0029430970007524593, "prepare": 0.0034132390010199742, "commit": 0.0029736830001638737, "ack": 0.003553787000782904}}','{}','[]');
INSERT INTO "exactly_batches" VALUES('pageviews',2,'pageviews','live','ACKED',1,'6fee3b4b0c9a415993f248eecbcc5923','vm:20780@1267153/23b8f6a4-91da-438a-986a-2b2c372bf0f4','2026-11-26 14:36:12.035000','2026-11-26 14:36:12.027000','2026-11-26 14:36:12.036000','2026-11-26 14:36:12.030000','2026-11-26 14:36:12.033000',1,NULL,'{"table": "struct<value:binary>"}','{"records_read": 5, "table_records": 5, "quarantine_records": 0, "files": 1, "stage_detail_s": {}, "files_staged": 1, "files_committed": 1, "files_already_committed": 0, "files_missing": 0, "acked_to_batch": 2, "phase_s": {"plan": 0.0022455769994849106, "stage": 0.0017373899991071085, "prepare": 0.001303674000155297, "commit": 0.002347079000173835, "ack": 0.0022164340007293504}}','{}','[]');
INSERT INTO "exactly_batches" VALUES('pageviews',3,'pageviews','live','ACKED',1,'7e41eb68b3f54cb6bb3e653adbed2e4f','vm:20780@1267153/23b8f6a4-91da-438a-986a-2b2c372bf0f4','2026-11-26 14:36:12.053000','2026-11-26 14:36:12.038000','2026-11-26 14:36:12.055000','2026-11-26 14:36:12.045000','2026-11-26 14:36:12.050000',2,NULL,'{"table": "struct<value:binary>"}','{"records_read": 3, "table_records": 3, "quarantine_records": 0, "files": 1, "stage_detail_s": {}, "files_staged": 1, "files_committed": 1, "files_already_committed": 0, "files_missing": 0, "acked_to_batch": 3, "phase_s": {"plan": 0.0036550040003930917, "stage": 0.003819017998466734, "prepare": 0.002029094999670633, "commit": 0.005462854000143125, "ack": 0.00281704899862234}}','{}','[]');
INSERT INTO "exactly_batches" VALUES('pageviews',4,'pageviews','live','ABORTED',1,'f54c1e10488446c9a4cddb9cccc6a2bb','vm:20780@1267153/23b8f6a4-91da-438a-986a-2b2c372bf0f4','2026-11-26 14:36:12.062000','2026-11-26 14:36:12.058000','2026-11-26 14:36:12.062000',NULL,NULL,NULL,'test: abandoned before the vote','{}','{}','{}','[]');
CREATE TABLE exactly_decisions (
	seq INTEGER NOT NULL, 
	id VARCHAR(32) NOT NULL, 
	pipeline VARCHAR(255) NOT NULL, 
	app_id VARCHAR(255) NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	topic VARCHAR(255) NOT NULL, 
	topic_id VARCHAR(64), 
	previous_topic_id VARCHAR(64), 
	after_batch_id BIGINT NOT NULL, 
	reason TEXT NOT NULL, 
	decided_by VARCHAR(255) NOT NULL, 
	decided_at DATETIME NOT NULL, 
	forced BOOLEAN NOT NULL, 
	body JSON NOT NULL, 
	PRIMARY KEY (seq), 
	UNIQUE (id)
);
CREATE TABLE exactly_files (
	app_id VARCHAR(255) NOT NULL, 
	batch_id BIGINT NOT NULL, 
	target VARCHAR(255) NOT NULL, 
	path VARCHAR(1024) NOT NULL, 
	size BIGINT NOT NULL, 
	records BIGINT NOT NULL, 
	modification_time BIGINT NOT NULL, 
	stats TEXT NOT NULL, 
	PRIMARY KEY (app_id, batch_id, target, path), 
	FOREIGN KEY(app_id, batch_id) REFERENCES exactly_batches (app_id, batch_id)
);
INSERT INTO "exactly_files" VALUES('pageviews',1,'table','staging/batch=1/attempt=1/part-0.parquet',105,5,1700000000000,'{}');
INSERT INTO "exactly_files" VALUES('pageviews',1,'table','staging/batch=1/attempt=1/part-1.parquet',104,4,1700000000000,'{}');
INSERT INTO "exactly_files" VALUES('pageviews',2,'table','staging/batch=2/attempt=1/part-0.parquet',105,5,1700000000000,'{}');
INSERT INTO "exactly_files" VALUES('pageviews',3,'table','staging/batch=3/attempt=1/part-1.parquet',103,3,1700000000000,'{}');
CREATE TABLE exactly_meta (
	"key" VARCHAR(64) NOT NULL, 
	value VARCHAR(256) NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "exactly_meta" VALUES('schema_version','3');
CREATE TABLE exactly_ranges (
	app_id VARCHAR(255) NOT NULL, 
	batch_id BIGINT NOT NULL, 
	topic VARCHAR(255) NOT NULL, 
	partition INTEGER NOT NULL, 
	start_offset BIGINT NOT NULL, 
	end_offset BIGINT NOT NULL, 
	topic_id VARCHAR(64), 
	PRIMARY KEY (app_id, batch_id, topic, partition), 
	FOREIGN KEY(app_id, batch_id) REFERENCES exactly_batches (app_id, batch_id)
);
INSERT INTO "exactly_ranges" VALUES('pageviews',1,'pageviews',0,0,5,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',1,'pageviews',1,0,4,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',2,'pageviews',0,5,10,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',2,'pageviews',1,4,4,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',3,'pageviews',0,10,10,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',3,'pageviews',1,4,7,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',4,'pageviews',0,10,12,'topic-id-1');
INSERT INTO "exactly_ranges" VALUES('pageviews',4,'pageviews',1,7,7,'topic-id-1');
CREATE INDEX ix_exactly_batches_pipeline ON exactly_batches (pipeline);
CREATE INDEX ix_exactly_decisions_app_id ON exactly_decisions (app_id);
COMMIT;
