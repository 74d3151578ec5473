-- A gpudash DB at schema v5 (before pool_samples), as `sqlite3 .dump` writes it: written by commit
-- 5aeb636 from tests/store/store_samples.full_snapshot (1 GPU), ticks 0-3 folded into the 1-minute tier
-- by retention.prune, ticks 4-7 raw. test_store_migration.py loads it to check the v6 migration.
BEGIN TRANSACTION;
CREATE TABLE "engine_path_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "path" TEXT,
   "gpu" INTEGER,
   "via" INTEGER,
   "direction" TEXT,
   "bytes_total" INTEGER,
   "chunks_total" INTEGER,
   "queue_depth" INTEGER,
   "gbps" REAL,
   "cpu_s" REAL,
   "server" TEXT
);
INSERT INTO "engine_path_samples" VALUES(1,4,1700000602.0,'direct:0',0,NULL,'h2d',4000000000,160,2,49.5,0.25,NULL);
INSERT INTO "engine_path_samples" VALUES(1,4,1700000602.0,'relay:3->0',0,3,'h2d',400000000,16,1,12.0,0.01,NULL);
INSERT INTO "engine_path_samples" VALUES(1,5,1700000602.5,'direct:0',0,NULL,'h2d',5000000000,200,2,49.5,0.25,NULL);
INSERT INTO "engine_path_samples" VALUES(1,5,1700000602.5,'relay:3->0',0,3,'h2d',500000000,20,1,12.0,0.01,NULL);
INSERT INTO "engine_path_samples" VALUES(1,6,1700000603.0,'direct:0',0,NULL,'h2d',6000000000,240,2,49.5,0.25,NULL);
INSERT INTO "engine_path_samples" VALUES(1,6,1700000603.0,'relay:3->0',0,3,'h2d',600000000,24,1,12.0,0.01,NULL);
INSERT INTO "engine_path_samples" VALUES(1,7,1700000603.5,'direct:0',0,NULL,'h2d',7000000000,280,2,49.5,0.25,NULL);
INSERT INTO "engine_path_samples" VALUES(1,7,1700000603.5,'relay:3->0',0,3,'h2d',700000000,28,1,12.0,0.01,NULL);
CREATE TABLE "engine_path_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "path" TEXT,
   "gpu" INTEGER,
   "via" INTEGER,
   "direction" TEXT,
   "server" TEXT,
   "bytes_total" REAL,
   "bytes_total_max" INTEGER,
   "chunks_total" REAL,
   "chunks_total_max" INTEGER,
   "queue_depth" REAL,
   "queue_depth_max" INTEGER,
   "gbps" REAL,
   "gbps_max" REAL,
   "cpu_s" REAL,
   "cpu_s_max" REAL
);
INSERT INTO "engine_path_samples_1m" VALUES(1,1699999980.0,4,'direct:0',0,NULL,'h2d',NULL,1500000000.0,3000000000,60.0,120,2.0,2,49.5,49.5,0.25,0.25);
INSERT INTO "engine_path_samples_1m" VALUES(1,1699999980.0,4,'relay:3->0',0,3,'h2d',NULL,150000000.0,300000000,6.0,12,1.0,1,12.0,12.0,0.01,0.01);
CREATE TABLE "events" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "actor" TEXT,
   "kind" TEXT,
   "target" TEXT,
   "old" TEXT,
   "new" TEXT,
   "ok" INTEGER,
   "reason" TEXT
);
INSERT INTO "events" VALUES(1,0,1700000000.0,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,0,1700000000.0,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,1,1700000000.5,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,1,1700000000.5,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,2,1700000001.0,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,2,1700000001.0,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,3,1700000001.5,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,3,1700000001.5,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,4,1700000602.0,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,4,1700000602.0,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,5,1700000602.5,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,5,1700000602.5,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,6,1700000603.0,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,6,1700000603.0,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
INSERT INTO "events" VALUES(1,7,1700000603.5,'keyboard','engine.knob','outstanding','2','4',1,NULL);
INSERT INTO "events" VALUES(1,7,1700000603.5,'cli','server.split','chat','[1, 1]','{"ratios": [2, 3]}',0,'GPU 1 too small');
CREATE TABLE "gpu_process_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "gpu_index" INTEGER,
   "pid" INTEGER,
   "used_bytes" INTEGER,
   "name" TEXT,
   "server" TEXT,
   "sm_pct" REAL
);
INSERT INTO "gpu_process_samples" VALUES(1,4,1700000602.0,0,4242,9663676416,'llama-server','chat',NULL);
INSERT INTO "gpu_process_samples" VALUES(1,4,1700000602.0,1,4243,NULL,'python',NULL,NULL);
INSERT INTO "gpu_process_samples" VALUES(1,5,1700000602.5,0,4242,9663676416,'llama-server','chat',NULL);
INSERT INTO "gpu_process_samples" VALUES(1,5,1700000602.5,1,4243,NULL,'python',NULL,NULL);
INSERT INTO "gpu_process_samples" VALUES(1,6,1700000603.0,0,4242,9663676416,'llama-server','chat',NULL);
INSERT INTO "gpu_process_samples" VALUES(1,6,1700000603.0,1,4243,NULL,'python',NULL,NULL);
INSERT INTO "gpu_process_samples" VALUES(1,7,1700000603.5,0,4242,9663676416,'llama-server','chat',NULL);
INSERT INTO "gpu_process_samples" VALUES(1,7,1700000603.5,1,4243,NULL,'python',NULL,NULL);
CREATE TABLE "gpu_process_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "gpu_index" INTEGER,
   "pid" INTEGER,
   "name" TEXT,
   "server" TEXT,
   "used_bytes" REAL,
   "used_bytes_max" INTEGER,
   "sm_pct" REAL,
   "sm_pct_max" REAL
);
INSERT INTO "gpu_process_samples_1m" VALUES(1,1699999980.0,4,0,4242,'llama-server','chat',9663676416.0,9663676416,NULL,NULL);
INSERT INTO "gpu_process_samples_1m" VALUES(1,1699999980.0,4,1,4243,'python',NULL,NULL,NULL,NULL,NULL);
CREATE TABLE "gpu_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "index" INTEGER,
   "uuid" TEXT,
   "name" TEXT,
   "util_pct" REAL,
   "mem_used" INTEGER,
   "mem_total" INTEGER,
   "power_w" REAL,
   "temp_c" REAL,
   "sm_clock_mhz" INTEGER,
   "pcie_tx_bps" REAL,
   "pcie_rx_bps" REAL,
   "link_gen" INTEGER,
   "link_width" INTEGER,
   "link_gen_max" INTEGER,
   "link_width_max" INTEGER,
   "bar1_total" INTEGER,
   "bar1_used" INTEGER,
   "throttle" TEXT,
   "ecc_uncorrected" INTEGER,
   "remapped_rows" INTEGER
);
INSERT INTO "gpu_samples" VALUES(1,4,1700000602.0,0,'GPU-0000','NVIDIA H20',12.5,10737418240,103079215104,250.5,41.0,1755,0.0,2500000000.0,5,16,5,16,137438953472,0,NULL,NULL,NULL);
INSERT INTO "gpu_samples" VALUES(1,5,1700000602.5,0,'GPU-0000','NVIDIA H20',12.5,10737418240,103079215104,250.5,41.0,1755,0.0,2500000000.0,5,16,5,16,137438953472,0,NULL,NULL,NULL);
INSERT INTO "gpu_samples" VALUES(1,6,1700000603.0,0,'GPU-0000','NVIDIA H20',12.5,10737418240,103079215104,250.5,41.0,1755,0.0,2500000000.0,5,16,5,16,137438953472,0,NULL,NULL,NULL);
INSERT INTO "gpu_samples" VALUES(1,7,1700000603.5,0,'GPU-0000','NVIDIA H20',12.5,10737418240,103079215104,250.5,41.0,1755,0.0,2500000000.0,5,16,5,16,137438953472,0,NULL,NULL,NULL);
CREATE TABLE "gpu_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "index" INTEGER,
   "uuid" TEXT,
   "name" TEXT,
   "throttle" TEXT,
   "util_pct" REAL,
   "util_pct_max" REAL,
   "mem_used" REAL,
   "mem_used_max" INTEGER,
   "mem_total" REAL,
   "mem_total_max" INTEGER,
   "power_w" REAL,
   "power_w_max" REAL,
   "temp_c" REAL,
   "temp_c_max" REAL,
   "sm_clock_mhz" REAL,
   "sm_clock_mhz_max" INTEGER,
   "pcie_tx_bps" REAL,
   "pcie_tx_bps_max" REAL,
   "pcie_rx_bps" REAL,
   "pcie_rx_bps_max" REAL,
   "link_gen" REAL,
   "link_gen_max" REAL,
   "link_width" REAL,
   "link_width_max" REAL,
   "link_gen_max_max" INTEGER,
   "link_width_max_max" INTEGER,
   "bar1_total" REAL,
   "bar1_total_max" INTEGER,
   "bar1_used" REAL,
   "bar1_used_max" INTEGER,
   "ecc_uncorrected" REAL,
   "ecc_uncorrected_max" INTEGER,
   "remapped_rows" REAL,
   "remapped_rows_max" INTEGER
);
INSERT INTO "gpu_samples_1m" VALUES(1,1699999980.0,4,0,'GPU-0000','NVIDIA H20',NULL,12.5,12.5,10737418240.0,10737418240,103079215104.0,103079215104,250.5,250.5,41.0,41.0,1755.0,1755,0.0,0.0,2500000000.0,2500000000.0,5.0,5.0,16.0,16.0,5,16,137438953472.0,137438953472,0.0,0,NULL,NULL,NULL,NULL);
CREATE TABLE "host_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "cpu_pct" REAL,
   "mem_used" INTEGER,
   "mem_total" INTEGER,
   "numa_nodes" INTEGER,
   "gpudash_cpu_pct" REAL,
   "gpudash_rss" INTEGER
);
INSERT INTO "host_samples" VALUES(1,4,1700000602.0,33.3,68719476736,549755813888,2,0.8,157286400);
INSERT INTO "host_samples" VALUES(1,5,1700000602.5,33.3,68719476736,549755813888,2,0.8,157286400);
INSERT INTO "host_samples" VALUES(1,6,1700000603.0,33.3,68719476736,549755813888,2,0.8,157286400);
INSERT INTO "host_samples" VALUES(1,7,1700000603.5,33.3,68719476736,549755813888,2,0.8,157286400);
CREATE TABLE "host_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "cpu_pct" REAL,
   "cpu_pct_max" REAL,
   "mem_used" REAL,
   "mem_used_max" INTEGER,
   "mem_total" REAL,
   "mem_total_max" INTEGER,
   "numa_nodes" REAL,
   "numa_nodes_max" INTEGER,
   "gpudash_cpu_pct" REAL,
   "gpudash_cpu_pct_max" REAL,
   "gpudash_rss" REAL,
   "gpudash_rss_max" INTEGER
);
INSERT INTO "host_samples_1m" VALUES(1,1699999980.0,4,33.3,33.3,68719476736.0,68719476736,549755813888.0,549755813888,2.0,2,0.8,0.8,157286400.0,157286400);
CREATE TABLE "pool_shard_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "pool" TEXT,
   "shard" TEXT,
   "capacity" INTEGER,
   "used" INTEGER,
   "free" INTEGER,
   "largest_free" INTEGER,
   "free_blocks" INTEGER,
   "fragmentation" REAL,
   "failures" INTEGER
);
INSERT INTO "pool_shard_samples" VALUES(1,4,1700000602.0,'pinned','numa0',1073741824,536870912,536870912,268435456,3,0.5,4);
INSERT INTO "pool_shard_samples" VALUES(1,5,1700000602.5,'pinned','numa0',1073741824,536870912,536870912,268435456,3,0.5,5);
INSERT INTO "pool_shard_samples" VALUES(1,6,1700000603.0,'pinned','numa0',1073741824,536870912,536870912,268435456,3,0.5,6);
INSERT INTO "pool_shard_samples" VALUES(1,7,1700000603.5,'pinned','numa0',1073741824,536870912,536870912,268435456,3,0.5,7);
CREATE TABLE "pool_shard_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "pool" TEXT,
   "shard" TEXT,
   "capacity" REAL,
   "capacity_max" INTEGER,
   "used" REAL,
   "used_max" INTEGER,
   "free" REAL,
   "free_max" INTEGER,
   "largest_free" REAL,
   "largest_free_max" INTEGER,
   "free_blocks" REAL,
   "free_blocks_max" INTEGER,
   "fragmentation" REAL,
   "fragmentation_max" REAL,
   "failures" REAL,
   "failures_max" INTEGER
);
INSERT INTO "pool_shard_samples_1m" VALUES(1,1699999980.0,4,'pinned','numa0',1073741824.0,1073741824,536870912.0,536870912,536870912.0,536870912,268435456.0,268435456,3.0,3,0.5,0.5,1.5,3);
CREATE TABLE "process_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "pid" INTEGER,
   "name" TEXT,
   "cpu_pct" REAL,
   "rss" INTEGER
);
INSERT INTO "process_samples" VALUES(1,4,1700000602.0,4242,'llama-server',180.0,2147483648);
INSERT INTO "process_samples" VALUES(1,5,1700000602.5,4242,'llama-server',180.0,2147483648);
INSERT INTO "process_samples" VALUES(1,6,1700000603.0,4242,'llama-server',180.0,2147483648);
INSERT INTO "process_samples" VALUES(1,7,1700000603.5,4242,'llama-server',180.0,2147483648);
CREATE TABLE "process_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "pid" INTEGER,
   "name" TEXT,
   "cpu_pct" REAL,
   "cpu_pct_max" REAL,
   "rss" REAL,
   "rss_max" INTEGER
);
INSERT INTO "process_samples_1m" VALUES(1,1699999980.0,4,4242,'llama-server',180.0,180.0,2147483648.0,2147483648);
CREATE TABLE "requests" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "server" TEXT,
   "ttft_s" REAL,
   "total_s" REAL,
   "prompt_tokens" INTEGER,
   "cached_tokens" INTEGER,
   "completion_tokens" INTEGER,
   "server_prompt_ms" REAL,
   "ok" INTEGER,
   "error" TEXT
);
INSERT INTO "requests" VALUES(1,0,1700000000.0,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,0,1700000000.0,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,1,1700000000.5,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,1,1700000000.5,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,2,1700000001.0,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,2,1700000001.0,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,3,1700000001.5,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,3,1700000001.5,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,4,1700000602.0,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,4,1700000602.0,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,5,1700000602.5,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,5,1700000602.5,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,6,1700000603.0,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,6,1700000603.0,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
INSERT INTO "requests" VALUES(1,7,1700000603.5,'chat',0.081,0.4,256,128,16,20.5,1,NULL);
INSERT INTO "requests" VALUES(1,7,1700000603.5,'chat',NULL,NULL,256,NULL,NULL,NULL,0,'HTTP 503');
CREATE TABLE "schema_version" (
   "version" INTEGER PRIMARY KEY,
   "applied" REAL
);
INSERT INTO "schema_version" VALUES(1,1.79614020036455345158e+09);
INSERT INTO "schema_version" VALUES(2,1.79614020036498975752e+09);
INSERT INTO "schema_version" VALUES(3,1.79614020036583018303e+09);
INSERT INTO "schema_version" VALUES(4,1.79614020036621618273e+09);
INSERT INTO "schema_version" VALUES(5,1.79614020036809444429e+09);
CREATE TABLE "server_samples" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "tick" INTEGER NOT NULL,
   "ts" REAL,
   "server" TEXT,
   "kind" TEXT,
   "state" TEXT,
   "pid" INTEGER,
   "port" INTEGER,
   "uptime_s" REAL,
   "restarts" INTEGER,
   "tokens_per_s" REAL,
   "prompt_tokens_per_s" REAL,
   "requests_running" REAL,
   "requests_waiting" REAL,
   "kv_cache_usage" REAL,
   "prefix_cache_queries" REAL,
   "prefix_cache_hits" REAL,
   "ttft_mean_s" REAL,
   "draft_acceptance" REAL,
   "relaunches" INTEGER
);
INSERT INTO "server_samples" VALUES(1,4,1700000602.0,'chat','llama.cpp','ready',4242,8080,12.0,1,55.5,900.0,1.0,0.0,0.42,100.0,60.0,0.08,0.7,0);
INSERT INTO "server_samples" VALUES(1,5,1700000602.5,'chat','llama.cpp','ready',4242,8080,12.0,1,55.5,900.0,1.0,0.0,0.42,100.0,60.0,0.08,0.7,0);
INSERT INTO "server_samples" VALUES(1,6,1700000603.0,'chat','llama.cpp','ready',4242,8080,12.0,1,55.5,900.0,1.0,0.0,0.42,100.0,60.0,0.08,0.7,0);
INSERT INTO "server_samples" VALUES(1,7,1700000603.5,'chat','llama.cpp','ready',4242,8080,12.0,1,55.5,900.0,1.0,0.0,0.42,100.0,60.0,0.08,0.7,0);
CREATE TABLE "server_samples_1m" (
   "session_id" INTEGER NOT NULL REFERENCES "sessions"("id"),
   "bucket" REAL NOT NULL,
   "n" INTEGER NOT NULL,
   "server" TEXT,
   "kind" TEXT,
   "state" TEXT,
   "pid" INTEGER,
   "port" INTEGER,
   "uptime_s" REAL,
   "uptime_s_max" REAL,
   "restarts" REAL,
   "restarts_max" INTEGER,
   "tokens_per_s" REAL,
   "tokens_per_s_max" REAL,
   "prompt_tokens_per_s" REAL,
   "prompt_tokens_per_s_max" REAL,
   "requests_running" REAL,
   "requests_running_max" REAL,
   "requests_waiting" REAL,
   "requests_waiting_max" REAL,
   "kv_cache_usage" REAL,
   "kv_cache_usage_max" REAL,
   "prefix_cache_queries" REAL,
   "prefix_cache_queries_max" REAL,
   "prefix_cache_hits" REAL,
   "prefix_cache_hits_max" REAL,
   "ttft_mean_s" REAL,
   "ttft_mean_s_max" REAL,
   "draft_acceptance" REAL,
   "draft_acceptance_max" REAL,
   "relaunches" REAL,
   "relaunches_max" INTEGER
);
INSERT INTO "server_samples_1m" VALUES(1,1699999980.0,4,'chat','llama.cpp','ready',4242,8080,12.0,12.0,1.0,1,55.5,55.5,900.0,900.0,1.0,1.0,0.0,0.0,0.42,0.42,100.0,100.0,60.0,60.0,0.08,0.08,0.7,0.7,0.0,0);
CREATE TABLE "sessions" (
   "id" INTEGER PRIMARY KEY,
   "started" REAL NOT NULL,
   "ended" REAL,
   "host" TEXT,
   "version" TEXT,
   "config" TEXT,
   "source" TEXT NOT NULL,
   "note" TEXT
, "pid" INTEGER, "pid_started" REAL);
INSERT INTO "sessions" VALUES(1,1700000000.0,1700000604.0,'box','0.1.0','servers = []

[sampling]
interval_s = 1.0
source_timeout_s = 0.5

[store]
flush_interval_s = 1.0
queue_max = 100000
raw_days = 1.0
retain_days = 90.0
prune_interval_s = 3600.0

[sim]
profile = "rtx5080+rtx3090"
load = "light"

[engine]
h2d_chunk_bytes = 2810000
d2h_chunk_bytes = 5370000
outstanding = 2
h2d_fallback_bytes = 11300000
d2h_fallback_bytes = 13000000
h2d_staging_bytes = 16777216
d2h_staging_bytes = 4194304
direct_first = true
staging_threads = 1
registration_cache_bytes = 8589934592

[probe]
enabled = true
interval_s = 2.0
timeout_s = 60.0
concurrency = 1
shared_prefix = 0.5
prompt_tokens = 256
max_tokens = 16

[prometheus]

[llama]
cuda_build = "auto"

[pools]
host_bytes = 67108864
device_bytes = 67108864

[pools.shards]
kv = 0.5
staging = 0.25

[keys]
','sim:8xh20','schema v5',NULL,NULL);
CREATE TABLE "ticks" (
   "session_id" INTEGER REFERENCES "sessions"("id"),
   "tick" INTEGER,
   "ts" REAL NOT NULL,
   "errors" TEXT,
   PRIMARY KEY ("session_id", "tick")
);
INSERT INTO "ticks" VALUES(1,0,1700000000.0,NULL);
INSERT INTO "ticks" VALUES(1,1,1700000000.5,'["host: timed out after 0.5 s"]');
INSERT INTO "ticks" VALUES(1,2,1700000001.0,NULL);
INSERT INTO "ticks" VALUES(1,3,1700000001.5,NULL);
INSERT INTO "ticks" VALUES(1,4,1700000602.0,'["host: timed out after 0.5 s"]');
INSERT INTO "ticks" VALUES(1,5,1700000602.5,NULL);
INSERT INTO "ticks" VALUES(1,6,1700000603.0,NULL);
INSERT INTO "ticks" VALUES(1,7,1700000603.5,'["host: timed out after 0.5 s"]');
CREATE INDEX "idx_gpu_samples_session_id_tick"
    ON "gpu_samples" ("session_id", "tick");
CREATE INDEX "idx_gpu_samples_session_id_ts"
    ON "gpu_samples" ("session_id", "ts");
CREATE INDEX "idx_gpu_process_samples_session_id_tick"
    ON "gpu_process_samples" ("session_id", "tick");
CREATE INDEX "idx_gpu_process_samples_session_id_ts"
    ON "gpu_process_samples" ("session_id", "ts");
CREATE INDEX "idx_host_samples_session_id_tick"
    ON "host_samples" ("session_id", "tick");
CREATE INDEX "idx_host_samples_session_id_ts"
    ON "host_samples" ("session_id", "ts");
CREATE INDEX "idx_process_samples_session_id_tick"
    ON "process_samples" ("session_id", "tick");
CREATE INDEX "idx_process_samples_session_id_ts"
    ON "process_samples" ("session_id", "ts");
CREATE INDEX "idx_engine_path_samples_session_id_tick"
    ON "engine_path_samples" ("session_id", "tick");
CREATE INDEX "idx_engine_path_samples_session_id_ts"
    ON "engine_path_samples" ("session_id", "ts");
CREATE INDEX "idx_pool_shard_samples_session_id_tick"
    ON "pool_shard_samples" ("session_id", "tick");
CREATE INDEX "idx_pool_shard_samples_session_id_ts"
    ON "pool_shard_samples" ("session_id", "ts");
CREATE INDEX "idx_server_samples_session_id_tick"
    ON "server_samples" ("session_id", "tick");
CREATE INDEX "idx_server_samples_session_id_ts"
    ON "server_samples" ("session_id", "ts");
CREATE INDEX "idx_requests_session_id_tick"
    ON "requests" ("session_id", "tick");
CREATE INDEX "idx_requests_session_id_ts"
    ON "requests" ("session_id", "ts");
CREATE INDEX "idx_events_session_id_tick"
    ON "events" ("session_id", "tick");
CREATE INDEX "idx_events_session_id_ts"
    ON "events" ("session_id", "ts");
CREATE INDEX "idx_gpu_samples_1m_session_id_bucket"
    ON "gpu_samples_1m" ("session_id", "bucket");
CREATE INDEX "idx_gpu_process_samples_1m_session_id_bucket"
    ON "gpu_process_samples_1m" ("session_id", "bucket");
CREATE INDEX "idx_host_samples_1m_session_id_bucket"
    ON "host_samples_1m" ("session_id", "bucket");
CREATE INDEX "idx_process_samples_1m_session_id_bucket"
    ON "process_samples_1m" ("session_id", "bucket");
CREATE INDEX "idx_engine_path_samples_1m_session_id_bucket"
    ON "engine_path_samples_1m" ("session_id", "bucket");
CREATE INDEX "idx_pool_shard_samples_1m_session_id_bucket"
    ON "pool_shard_samples_1m" ("session_id", "bucket");
CREATE INDEX "idx_server_samples_1m_session_id_bucket"
    ON "server_samples_1m" ("session_id", "bucket");
COMMIT;
