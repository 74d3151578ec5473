"""The probe workload: streaming chat requests that measure TTFT and prefix-cache hits as a user feels
them (runner), read from a server without trusting it (client), and what they show: which cache served
each request (cache_kinds) and how TTFT moves with the hit fraction (correlation)."""
