"""Many boxes read through Prometheus' HTTP API: the client with its bounds, the fleet's rows, the PromQL
they are built from and the Grafana dashboard generated from the same queries."""
