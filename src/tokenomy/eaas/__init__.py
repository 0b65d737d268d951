"""Expert-as-a-Service: MoE experts as stateless servers behind an attention client.

Modules: ``config`` (MoEConfig, presets), ``moe`` (weights, gate, reference forward), ``protocol``
(binary frames), ``transport`` (Transport, ZmqTransport), ``server`` (ExpertHandler, process entry),
``launcher`` (start/stop server processes), ``registry`` (Registry, RoutingTable), ``balance``
(replication and placement), ``dispatch`` (ExpertDispatcher: grouping, bundles, failover),
``client`` (AttentionClient for our block, dual-batch overlap), ``layers`` (local stand-in and
reference stack), ``checkpoint`` (a model's experts in one file, keyed per layer), ``hf`` and
``hf_models`` (a ``transformers`` MoE model's routed experts on expert servers; tiny models),
``generation`` (generate with step hooks, lock-step pairs), ``plan`` (elastic vs fixed-unit cost
model), and the experiments behind the benchmarks: ``failover``, ``paired_failover``, ``overlap``,
``skew``, ``stream``, ``stats``.
Import from the modules; this package imports nothing heavy at import time.
"""
