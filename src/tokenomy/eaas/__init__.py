"""Expert-as-a-Service: MoE experts as stateless servers behind an attention client.

Modules: ``config`` (MoEConfig, presets), ``moe`` (weights, gate, reference forward), ``protocol``
(binary frames), ``transport`` (Transport, ZmqTransport), ``server`` (ExpertHandler, process entry),
``launcher`` (start/stop server processes), ``registry`` (Registry, RoutingTable), ``balance``
(replication and placement), ``client`` (AttentionClient, failover, dual-batch overlap), ``layers``
(local stand-in and reference stack), ``plan`` (elastic vs fixed-unit cost model), and the
experiments behind the benchmarks: ``failover``, ``overlap``, ``skew``, ``stream``.
Import from the modules; this package imports nothing heavy at import time.
"""
