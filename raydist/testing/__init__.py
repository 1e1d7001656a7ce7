"""raydist's test harness, for testing only (as ``ray.cluster_utils`` is Ray's).

``FakeCluster`` (``raydist.testing.fake``) is the cluster seam
(``raydist.pool.cluster.seam.Cluster``) in memory: deterministic, in virtual
time, with ``Fault``s (``raydist.testing.faults``) at any call of any worker
and a ledger of what is left. The engine (``RunController``, ``WorkerGroup``)
runs on it unchanged, so its own logic (which order things happen in, what
is left after a fault) is tested in milliseconds::

    from raydist.config import RunConfig
    from raydist.pool.driver.group import WorkerGroup
    from raydist.testing.fake import FakeCluster, Fault
    from raydist.testing.workers import current_rank

    cluster = FakeCluster({"node-a": {"CPU": 4}}, [Fault("execute", "die", who=1)])
    group = WorkerGroup(config=RunConfig(num_workers=4, max_restarts=1), cluster=cluster)

Nothing outside this package imports it, and it imports no Ray.
"""
