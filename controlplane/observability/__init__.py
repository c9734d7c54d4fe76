"""pdplane's own observability: Prometheus reads, /metrics exposition, service discovery."""
