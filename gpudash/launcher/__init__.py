"""Running the inference servers: the supervisor (supervisor.py) with its guard, ports and health checks
(guard.py, health.py), command lines (argv.py, binary.py), logs (server_logs.py, logparse.py) and memory
shares (shares.py); the server kinds (kinds/), servers read but not run (attach.py, remote.py) or found on
the GPUs (discovery.py), scraping them (scrape_http.py, counters.py); the probe workload (probe/) and
building llama-server (llama/). What a run wires together from these is runtime/."""
