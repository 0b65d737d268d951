"""What a request used: token classes and cost, the ledger, the usage API, the gateway's Prometheus metrics."""
